"""Calibrate bench/burst_sim.py on the local stack: a burst of small contracts on one worker.

    .venv/bin/python bench/burst_calibrate.py [--contracts 30] [--workers 1]     # ~3 minutes on 2 cores

The flood once measured (30 small contracts at once, one worker, the local profile: stall period 15 s,
sweep every second), replayed on embedded AWS with real worker processes and the sweeper as a process:
the makespan (submit to the last job ended), each chunk's time on the worker (its record's `claimed_at` to
`settled_at`), how long chunks waited in the queue (fan-out to claim), how many times each chunk was claimed
(one message each: no duplicate), and how many chunk messages the sweeper sent again (its `job.reconciled`
events and its `sweep` log lines). Results: bench/results/burst_calibration.json (with the machine and commit).
The contracts are our samples' first clauses under a numbered heading (about 3 chunks each, as the issue's
95 chunks for 30 contracts), so the run needs nothing outside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402

LOCAL = get_profile("local")
OUT = ROOT / "bench" / "results" / "burst_calibration.json"


def small_contracts(n: int) -> list[str]:
    """`n` distinct small contracts of about 3 chunks each (local chunking), from samples/."""
    texts = [p.read_text() for p in sorted((ROOT / "samples").glob("*.txt"))]
    base = next(lead for t in texts for k in range(2, 120)
                if len(chunk_document(lead := "\n\n".join(t.split("\n\n")[:k]), LOCAL.review)) == 3)
    return [f"Contract {i}.\n\n{base}" for i in range(n)]


def sweeps(log_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in sorted(log_dir.glob("sweeper-*.log"))
             for line in f.read_text(errors="replace").splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("message") == "sweep"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def run(n: int, workers: int) -> dict[str, Any]:
    docs = small_contracts(n)
    with tempfile.TemporaryDirectory() as tmp:
        stack = LocalStack(concurrency={"worker": workers}, template=synth("local"), state_dir=Path(tmp))
        stack.start(api=False)
        try:
            deps = stack.deps()
            t0 = time.time()
            jobs = [submission.submit(deps, None, SubmitRequest.inline(t, document_id=f"burst-{i}")).job_id for i, t in enumerate(docs)]
            ended: dict[str, Any] = {}
            while len(ended) < len(jobs) and time.time() - t0 < 900:
                for j in jobs:
                    if j not in ended and (job := deps.jobs.get(j)) is not None and job.terminal:
                        ended[j] = job
                time.sleep(0.5)
            makespan = max(j.updated_at for j in ended.values()) - t0
            records = [c for j in jobs for c in deps.claims.for_job(j)]
            reconciled = [e.detail for j in jobs for e in deps.jobs.events(j) if e.type == "job.reconciled"]
            logged = sweeps(Path(tmp) / "logs")
        finally:
            stack.stop()
    work = [c.settled_at - c.claimed_at for c in records if c.settled_at and c.claimed_at]
    waited = [c.claimed_at - c.message_sent_at for c in records if c.claimed_at and c.message_sent_at]
    return {
        "contracts": n, "workers": workers, "chunks": len(records),
        "states": sorted({j.state.value for j in ended.values()}), "ended": len(ended),
        "makespan_s": round(makespan, 1),
        "chunk_s": {"mean": round(statistics.mean(work), 3), "p50": pct(work, 0.5), "p95": pct(work, 0.95)},
        "queue_wait_s": {"max": round(max(waited), 1), "p50": pct(waited, 0.5)},
        "claims_per_chunk": {str(k): sum(1 for c in records if c.receives == k) for k in sorted({c.receives for c in records})},
        "chunks_resent": {"events": sum(d.get("chunks_requeued", 0) for d in reconciled),
                          "sweep_logs": sum(s.get("chunks_resent", 0) for s in logged)},
        "sweeps": len(logged), "stalled_job_sightings": sum(s.get("stalled_jobs", 0) for s in logged),
        "stall_after_s": LOCAL.recovery.stall_after_s, "sweep_interval_s": LOCAL.recovery.sweep_interval_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contracts", type=int, default=30)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    result = run(a.contracts, a.workers)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    result["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    result["git"] = head.strip()
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
