"""Interactive before bulk, on embedded AWS with real worker processes (the local profile; issue 19 item 5).

    .venv/bin/python bench/priority.py [--bulk 10] [--bulk-bytes 40000] [--out bench/results/priority.json]

1. Alone: one interactive contract (`--interactive-bytes`, default 60 KB of CUAD or samples text; 0:
   samples/mutual-nda.txt), submit to completed, after a warm-up job.
2. Behind bulk: a bulk batch of `--bulk` contracts (`priority: bulk`, as `POST /batches` and `review submit --batch`
   send them) submitted first; once their windows fill the analysis queue and chunks are settling, the same
   contract is submitted (interactive, another key). Its submit-to-completed time, and the ratio to its time alone
   (target: <= 2.0). Then every bulk job must end too (not starved): the time the batch took, and the most times a
   bulk chunk gave way (`chunk deferrals`, at most `bulk_max_deferrals`).

Prints the ratio and PASS/FAIL; writes JSON (with the machine). Absolute times are local (moto's CPU is the
bottleneck on 2 cores); the ratio is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from bench.large import _until  # noqa: E402
from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.domain.records import Priority  # noqa: E402
from contract_review.operate import ops  # noqa: E402
from contract_review.pipeline.priority import starvation_bound_s  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402
from tests.large_docs import large_contract  # noqa: E402

LOCAL = get_profile("local")
SMALL = ROOT / "samples" / "mutual-nda.txt"
TARGET = 2.0


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    small = SMALL.read_text() if not args.interactive_bytes else \
        large_contract(args.interactive_bytes, variant=7, samples_only=args.samples)
    bulk_texts = [large_contract(args.bulk_bytes, variant=40 + n, samples_only=args.samples) for n in range(args.bulk)]
    stack = LocalStack(template=synth("local"), state_dir=work).start()
    try:
        deps = stack.deps()
        # a warm-up job first (the worker processes' first imports and clients), so "alone" is not a cold start
        warm = ops.submit(deps, small + "\n\nWarm-up.", document_id="warm-up", idempotency_key="warm-up")
        _until(deps, warm, lambda j: j.terminal, 300)
        t0 = time.monotonic()  # 1. alone
        solo_id = ops.submit(deps, small, document_id="alone", idempotency_key="alone")
        solo, t_solo = _until(deps, solo_id, lambda j: j.terminal, 300)
        solo_s = t_solo - t0
        t1 = time.monotonic()  # 2. behind a bulk batch
        bulk_ids = [ops.submit(deps, text, document_id=f"bulk-{n}", priority=Priority.BULK)
                    for n, text in enumerate(bulk_texts)]
        # the batch under way: every bulk job running (its window queued), and chunks settling
        for b in bulk_ids:
            _until(deps, b, lambda j: j.state.value != "queued", 300, 0.05)
        _until(deps, bulk_ids[0], lambda j: j.n_settled >= 1 or j.terminal, 300, 0.05)
        t2, wall2 = time.monotonic(), time.time()
        behind_id = ops.submit(deps, small, document_id="behind", idempotency_key="behind")
        behind, t_behind = _until(deps, behind_id, lambda j: j.terminal, 1800)
        behind_s = t_behind - t2
        wall_end = wall2 + behind_s
        settles = [e.at - wall2 for e in deps.jobs.events(behind_id) if e.type == "chunk.settled"]
        # where the time went: bulk chunks analysed while the interactive job waited (the ones in hand, and any not
        # given way), its intake, its chunks settling
        bulk_during = sum(1 for b in bulk_ids for e in deps.jobs.events(b)
                          if e.type == "chunk.settled" and wall2 <= e.at <= wall_end)
        settled_then = sum(j.n_settled for j in (deps.jobs.get(b) for b in bulk_ids) if j is not None)
        ends = [_until(deps, b, lambda j: j.terminal, 3600) for b in bulk_ids]
        deferred = [e.detail for b in bulk_ids for e in deps.jobs.events(b) if e.type == "chunk.deferred"]
        bulk_chunks = sum(j.chunk_count for j, _ in ends)
        return {
            "interactive": {"bytes": len(small.encode()), "chunks": len(chunk_document(small, LOCAL.review)),
                            "alone_s": round(solo_s, 2), "behind_bulk_s": round(behind_s, 2),
                            "state_alone": solo.state.value, "state_behind": behind.state.value,
                            "behind_running_after_s": round(behind.started_at - wall2, 2) if behind.started_at else None,
                            "behind_first_settled_s": round(min(settles), 2) if settles else None,
                            "behind_last_settled_s": round(max(settles), 2) if settles else None,
                            "bulk_chunks_settled_meanwhile": bulk_during},
            "bulk": {"jobs": len(bulk_ids), "bytes_each": args.bulk_bytes, "chunks": bulk_chunks,
                     "settled_when_interactive_completed": settled_then,
                     "states": sorted({j.state.value for j, _ in ends}),
                     "batch_s": round(max(t for _, t in ends) - t1, 2),
                     "chunks_deferred": sum(1 for d in deferred if d.get("deferrals") == 1),
                     "chunks_that_spent_their_deferrals": sum(1 for d in deferred if d.get("spent")),
                     "bound_deferrals": LOCAL.fanout.bulk_max_deferrals,
                     "bound_s": starvation_bound_s(LOCAL.fanout.bulk_defer_s, LOCAL.fanout.bulk_max_deferrals)},
            "ratio_behind_vs_alone": round(behind_s / solo_s, 2),
        }
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interactive-bytes", type=int, default=60_000,
                    help="size of the interactive contract (0: samples/mutual-nda.txt, 11 KB, 3 chunks: its time alone, "
                         "~1.3 s, is mostly the fixed latency of a busy stack)")
    ap.add_argument("--bulk", type=int, default=10, help="bulk jobs in the batch")
    ap.add_argument("--bulk-bytes", type=int, default=20_000, help="size of each bulk contract")
    ap.add_argument("--samples", action="store_true", help="contracts from samples/ only (no CUAD)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "priority.json"))
    args = ap.parse_args()
    work = ROOT / ".review" / "bench-priority"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"priority: an interactive contract alone, then behind a bulk batch of {args.bulk} x "
          f"{args.bulk_bytes / 1e3:.0f} KB")
    r = run(args, work)
    ratio = r["ratio_behind_vs_alone"]
    verdict = "PASS" if ratio <= TARGET and r["bulk"]["states"] == ["completed"] else "FAIL"
    print(f"   alone {r['interactive']['alone_s']} s; behind bulk {r['interactive']['behind_bulk_s']} s "
          f"(x{ratio}, target <= {TARGET}): {verdict}")
    print(f"   bulk: {r['bulk']['chunks']} chunks, ended {r['bulk']['states']} after {r['bulk']['batch_s']} s; "
          f"{r['bulk']['chunks_deferred']} chunks gave way, {r['bulk']['chunks_that_spent_their_deferrals']} of them "
          f"the most times (bound {r['bulk']['bound_deferrals']} x, {r['bulk']['bound_s']} s)")
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
               "profile": {"name": "local", "fanout_window": LOCAL.fanout.fanout_window,
                           "workers": LOCAL.functions.worker_max_concurrency,
                           "bulk_defer_s": LOCAL.fanout.bulk_defer_s, "bulk_max_deferrals": LOCAL.fanout.bulk_max_deferrals},
               "reproduce": ".venv/bin/python bench/priority.py", "target_ratio": TARGET, "verdict": verdict, **r}
    out = Path(args.out)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
