"""What a contract costs on demand and in batch, side by side in one run on embedded AWS.

    .venv/bin/python bench/batch.py [--bytes 100000] [--out bench/results/batch.json]    (make bench-batch)

The same contract (`--bytes` of CUAD or samples text, default 100 KB) is sent twice to one local stack (real worker
processes, the sweeper on its schedule, the local profile): once `inference: on_demand`, once `inference: batch`,
answered by Bedrock batch inference's HTTP stand-in (review_local/batch_service.py: the same offline model, a status
every 0.5 s, at least 10 records per batch job as the local profile says). Each job's recorded cost is priced by the
dated price table (config/prices.py): on demand with the prompt cache the strict Bedrock double simulates, in batch
at the batch price without one (a batch record carries no cache point). Prints the model cost per 100 KB in both
modes and their ratio, the calls each made (the batch job's on-demand calls must be 0), its batch jobs and rounds;
writes JSON. Both reports are checked against a fault-free run (tests/oracle.py).

Times are local and say nothing of Bedrock's: a real batch job takes minutes to hours (its timeout is 24 h by
default). The figure is the cost ratio.
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
from contract_review.domain.cost import batch_cost_usd, format_usd, micro_usd, model_price  # noqa: E402
from contract_review.domain.records import Inference, Job, Usage  # noqa: E402
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402
from tests.large_docs import large_contract  # noqa: E402
from tests.oracle import check_job  # noqa: E402

LOCAL = get_profile("local")


def _summary(deps: Any, job: Job, kb: float, seconds: float) -> dict[str, Any]:
    events = deps.jobs.events(job.job_id)
    records = deps.claims.for_job(job.job_id)
    return {"state": job.state.value, "seconds": round(seconds, 1), "chunks": job.chunk_count,
            "model_calls": sum(c.n_calls for c in records),
            "input_tokens": job.input_tokens, "output_tokens": job.output_tokens,
            "cache_read_tokens": job.cache_read_tokens, "cache_write_tokens": job.cache_write_tokens,
            "model_micro_usd": job.model_micro_usd, "total_micro_usd": job.total_micro_usd,
            "model_usd_per_100kb": round(job.model_micro_usd / 1e6 / kb * 100, 4),
            "total_usd_per_100kb": round(job.total_micro_usd / 1e6 / kb * 100, 4),
            "batch_jobs": len({e.detail.get("batch") for e in events if e.type == "batch.submitted"}),
            "batch_rounds": sum(1 for e in events if e.type == "chunk.awaiting_batch"),
            "chunks_on_demand": sum(1 for c in records if c.batch_on_demand),
            "report_problems": check_job(deps, job.job_id, deps.artifacts.get_text(job.document_key)).problems}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    text = large_contract(args.bytes, variant=11, samples_only=args.samples)
    kb = len(text.encode("utf-8")) / 1024
    stack = LocalStack(template=synth("local"), state_dir=work).start()
    try:
        deps = stack.deps()
        out: dict[str, Any] = {"bytes": len(text.encode("utf-8"))}
        for mode in (Inference.ON_DEMAND, Inference.BATCH):
            t0 = time.monotonic()
            job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"bench-{mode.value}", idempotency_key=f"bench-{mode.value}", inference=mode)).job_id
            job, t1 = _until(deps, job_id, lambda j: j.terminal, 1800)
            out[mode.value] = _summary(deps, job, kb, t1 - t0)
        od, b = out["on_demand"], out["batch"]
        out["batch_vs_on_demand_model_cost"] = round(b["model_micro_usd"] / od["model_micro_usd"], 3)
        out["batch_vs_on_demand_total_cost"] = round(b["total_micro_usd"] / od["total_micro_usd"], 3)
        # the bound: the on-demand job's own tokens (its cached prefix as plain input) at the batch price: what batch
        # costs with no overhead (no repeated or lost call)
        s = deps.settings
        bound = batch_cost_usd(model_price(s.profile.prices, s.effective_model_id), Usage(
            input_tokens=od["input_tokens"] + od["cache_read_tokens"] + od["cache_write_tokens"],
            output_tokens=od["output_tokens"]))
        out["bound_model_micro_usd"] = micro_usd(bound) if bound is not None else None
        out["batch_vs_bound"] = round(b["model_micro_usd"] / out["bound_model_micro_usd"], 3) if bound else None
        return out
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=100_000, help="size of the contract (default 100 KB)")
    ap.add_argument("--samples", action="store_true", help="contract text from samples/ only (no CUAD)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "batch.json"))
    args = ap.parse_args()
    work = ROOT / ".review" / "bench-batch"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load = os.getloadavg()[0]
    print(f"batch: one {args.bytes / 1e3:.0f} KB contract on demand, then in batch (load {load:.2f})")
    r = run(args, work)
    for mode in ("on_demand", "batch"):
        m = r[mode]
        print(f"   {mode:9}: {m['state']}, model {format_usd(m['model_micro_usd'])} "
              f"(${m['model_usd_per_100kb']:.4f} per 100 KB), {m['model_calls']} calls, "
              f"{m['input_tokens']:,} in + {m['cache_read_tokens']:,} cache-read + {m['output_tokens']:,} out tokens; "
              f"{m['batch_jobs']} batch jobs, {m['chunks_on_demand']} chunks on demand; {m['seconds']} s locally; "
              f"report {'= fault-free' if not m['report_problems'] else m['report_problems']}")
    print(f"   batch / on demand: model cost x{r['batch_vs_on_demand_model_cost']}, "
          f"total x{r['batch_vs_on_demand_total_cost']}; batch / its bound (the on-demand tokens at the batch price): "
          f"x{r['batch_vs_bound']}")
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                           "load_1min_at_start": round(load, 2)},
               "profile": {"name": "local", "batch_min_records": LOCAL.batch.batch_min_records,
                           "model_id": LOCAL.review.model_id},
               "reproduce": ".venv/bin/python bench/batch.py (make bench-batch)", **r}
    out = Path(args.out)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
