"""Large documents and fairness, on embedded AWS with real worker processes (the local profile).

    make bench-large      # or: .venv/bin/python bench/large.py [--only large|fairness] [--big-bytes N]

1. Large documents: a 5 MB and a 1.2 MB contract (`tests/large_docs.py`: CUAD contracts, or the
   samples, repeated) submitted by `s3_uri`: seconds from submit to `running` (leaving `queued`), to
   the first chunk settled, and to the end; chunk count, pages, and whether the report holds exactly
   the findings of a fault-free run (`tests/oracle.py`, when present).
2. Fairness: a 12 KB contract alone, then the same contract submitted right after a 2 MB one started:
   its submit-to-completed time, the ratio to its time alone, and how far the 2 MB one had got.

Results: bench/results/large.json (with the machine). The local profile's window is 8 chunks and its
page 2, with 4 workers; absolute times are local (moto's CPU is the bottleneck on 2 cores).
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

from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.domain.ports import Deps  # noqa: E402
from contract_review.domain.records import Job, JobState  # noqa: E402
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402
from tests.large_docs import large_contract, source_name  # noqa: E402

LOCAL = get_profile("local")
SMALL = ROOT / "samples" / "mutual-nda.txt"


def _until(deps: Deps, job_id: str, done: Any, timeout: float, poll: float = 0.1) -> tuple[Job, float]:
    """Poll the job until `done(job)`; the job and the monotonic time it was seen so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = deps.jobs.get(job_id)
        if job is not None and done(job):
            return job, time.monotonic()
        time.sleep(poll)
    raise TimeoutError(f"{job_id} after {timeout} s")


def _oracle_check(deps: Deps, job: Job, text: str) -> Any:
    """What differs from a fault-free run of the text (tests/oracle.py): [] when nothing does."""
    try:
        from tests.oracle import check_job
    except ImportError:
        return "tests/oracle.py absent"
    check = check_job(deps, job.job_id, text)
    return {"problems": check.problems, "findings": check.findings, "expected": check.expected}


def large(template: dict[str, Any], n_bytes: int, variant: int, state_dir: Path, timeout: float,
          samples_only: bool) -> dict[str, Any]:
    text = large_contract(n_bytes, variant, samples_only=samples_only)
    n = len(chunk_document(text, LOCAL.review))
    stack = LocalStack(template=template, state_dir=state_dir).start()
    try:
        deps = stack.deps()
        t0 = time.monotonic()
        job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"large-{n_bytes}")).job_id  # > 200,000 bytes: through uploads/
        _, t_running = _until(deps, job_id, lambda j: j.state is not JobState.QUEUED, 120, 0.05)
        _, t_first = _until(deps, job_id, lambda j: j.n_settled >= 1 or j.terminal, 120, 0.1)
        ended, t_end = _until(deps, job_id, lambda j: j.terminal, timeout, 1.0)
        pages = [e for e in deps.jobs.events(job_id) if e.type == "job.fanned_out"]
        return {
            "bytes": len(text.encode("utf-8")), "chars": len(text), "chunks": n,
            "source": source_name(samples_only),
            "state": ended.state.value, "error_code": ended.error_code,
            "queued_to_running_s": round(t_running - t0, 2), "first_chunk_settled_s": round(t_first - t0, 2),
            "completed_s": round(t_end - t0, 1), "chunks_per_s": round(n / (t_end - t0), 2),
            "first_page": pages[0].detail["first"] if pages else n, "refill_pages": len(pages),
            "settled": ended.n_settled, "findings": ended.n_findings,
            "oracle": _oracle_check(deps, ended, text) if ended.state is JobState.COMPLETED else None,
        }
    finally:
        stack.stop()


def fairness(template: dict[str, Any], big_bytes: int, state_dir: Path, samples_only: bool) -> dict[str, Any]:
    small = SMALL.read_text()
    big = large_contract(big_bytes, variant=20, samples_only=samples_only)
    n_big = len(chunk_document(big, LOCAL.review))
    n_small = len(chunk_document(small, LOCAL.review))
    stack = LocalStack(template=template, state_dir=state_dir).start()
    try:
        deps = stack.deps()
        t0 = time.monotonic()  # 1. alone
        solo_id = submission.submit(deps, None, SubmitRequest.inline(small, document_id="small-alone", idempotency_key="small-alone")).job_id
        solo, t_solo = _until(deps, solo_id, lambda j: j.terminal, 120)
        solo_s = t_solo - t0
        t1 = time.monotonic()  # 2. behind the big one (submitted right after it started)
        big_id = submission.submit(deps, None, SubmitRequest.inline(big, document_id="big")).job_id
        _, t_big_running = _until(deps, big_id, lambda j: j.state is not JobState.QUEUED, 120, 0.05)
        t2 = time.monotonic()
        behind_id = submission.submit(deps, None, SubmitRequest.inline(small, document_id="small-behind", idempotency_key="small-behind")).job_id
        behind, t_behind = _until(deps, behind_id, lambda j: j.terminal, 1800)
        big_then = deps.jobs.get(big_id)
        behind_s = t_behind - t2
        settled = big_then.n_settled if big_then else 0
        return {
            "small": {"bytes": len(small.encode()), "chunks": n_small, "alone_s": round(solo_s, 2),
                      "behind_big_s": round(behind_s, 2), "state_alone": solo.state.value,
                      "state_behind": behind.state.value},
            "big": {"bytes": len(big.encode()), "chunks": n_big, "source": source_name(samples_only),
                    "queued_to_running_s": round(t_big_running - t1, 2),
                    "settled_when_small_completed": settled,
                    "share_done_when_small_completed": round(settled / n_big, 3)},
            "ratio_behind_vs_alone": round(behind_s / solo_s, 2),
        }
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["large", "fairness"])
    ap.add_argument("--big-bytes", type=int, default=2_000_000, help="size of the large document in the fairness run")
    ap.add_argument("--sizes", default="5000000,1200000", help="sizes of the large-document runs (bytes)")
    ap.add_argument("--samples", action="store_true", help="large documents from samples/ only (no CUAD)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "large.json"))
    args = ap.parse_args()
    template = synth("local")
    work = ROOT / ".review" / "bench-large"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        # (getattr: the script also measures the code from before fan-out in pages, as a baseline)
        "profile": {"name": "local", "fanout_window": getattr(LOCAL, "fanout_window", None),
                    "fanout_page": getattr(LOCAL, "fanout_page", None),
                    "workers": LOCAL.functions.worker_max_concurrency, "chunk_target_chars": LOCAL.review.chunk_target_chars},
        "reproduce": "make bench-large  (or .venv/bin/python bench/large.py)",
    }
    if args.only in (None, "fairness"):
        print(f"fairness: a 12 KB contract alone, then behind a {args.big_bytes / 1e6:.1f} MB one")
        f = fairness(template, args.big_bytes, work / "fairness", args.samples)
        results["fairness"] = f
        print(f"   alone {f['small']['alone_s']} s; behind {f['small']['behind_big_s']} s "
              f"(x{f['ratio_behind_vs_alone']}); the large one was {f['big']['share_done_when_small_completed']:.0%} "
              f"done ({f['big']['settled_when_small_completed']}/{f['big']['chunks']} chunks)")
    if args.only in (None, "large"):
        results["large"] = []
        for i, size in enumerate(int(s) for s in args.sizes.split(",")):
            print(f"large: a {size / 1e6:.1f} MB contract by s3_uri")
            r = large(template, size, 30 + i, work / f"large-{size}", timeout=3600, samples_only=args.samples)
            results["large"].append(r)
            print(f"   {r['chunks']} chunks: running after {r['queued_to_running_s']} s, first chunk settled after "
                  f"{r['first_chunk_settled_s']} s, {r['state']} after {r['completed_s']} s "
                  f"({r['chunks_per_s']} chunks/s); oracle: {r['oracle']}")
    out = Path(args.out)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
