"""Benchmarks, measured side by side in one run on embedded AWS with real worker processes.

    make bench            # or: .venv/bin/python bench/run.py [--quick]

1. Throughput under faults: the four samples with 0 % and 5 % transient model faults:
   wall time and model calls, as ratios to the fault-free run (the ideal).
2. Recovery from `kill -9` mid-chunk: ours (short heartbeated lease + sweeper) against the
   baseline a plain Lambda+SQS design gets (sweeper off: the message comes back only after the
   queue's visibility timeout), and against the ideal bound lease + sweep interval.
3. Work lost to the crash: model calls spent on the killed chunk against the calls a clean run
   of that chunk needs (checkpoints make the ratio close to 1).
Results go to bench/results/latest.json. `--quick` skips the slow baseline (it waits out the
visibility timeout, 120 s in the local profile).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from contract_review.config.profile import get_profile
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.ports import Deps  # noqa: E402
from contract_review.domain.records import ChunkStatus, Job
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402

LOCAL = get_profile("local")
SAMPLES = sorted((ROOT / "samples").glob("*.txt"))


def _wait(deps: Deps, job_ids: list[str], timeout: float = 600.0) -> list[Job]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [deps.jobs.get(j) for j in job_ids]
        ended = [j for j in jobs if j is not None and j.terminal]
        if len(ended) == len(jobs):
            return ended
        time.sleep(0.2)
    raise TimeoutError(job_ids)


def throughput(template: dict[str, Any], rate: float, state_dir: Path) -> dict[str, Any]:
    stack = LocalStack(faults=FaultSpec(seed=5, transient_rate=rate), template=template, state_dir=state_dir)
    stack.start()
    try:
        deps = stack.deps()
        t0 = time.monotonic()
        ids = [submission.submit(deps, None, SubmitRequest.inline(p.read_text(), document_id=p.name)).job_id for p in SAMPLES]
        jobs = _wait(deps, ids)
        wall = time.monotonic() - t0
        reliability = [j.reliability for j in jobs if j.reliability is not None]
        assert len(reliability) == len(jobs), "every ended job carries its reliability counters"
        calls = sum(r.model_calls for r in reliability)
        retries: dict[str, int] = {}
        for r in reliability:
            for k, v in r.retries_by_code.items():
                retries[k] = retries.get(k, 0) + v
        return {"fault_rate": rate, "wall_s": round(wall, 2), "model_calls": calls, "retries_by_code": retries,
                "completed": sum(j.state == "completed" for j in jobs), "jobs": len(jobs)}
    finally:
        stack.stop()


def recovery(template: dict[str, Any], with_sweeper: bool, state_dir: Path) -> dict[str, Any]:
    log = state_dir / "calls.jsonl"
    stack = LocalStack(faults=FaultSpec(latency_ms=120, call_log=str(log)), template=template, state_dir=state_dir,
                       concurrency={"worker": 2, **({} if with_sweeper else {"sweeper": 0})})
    stack.start()
    try:
        deps = stack.deps()
        text = (ROOT / "samples" / "supply-agreement.txt").read_text()
        job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="bench-kill")).job_id
        victim: ChunkRecord | None = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline:
            for c in deps.claims.for_job(job_id):
                if c.status is ChunkStatus.CLAIMED and len(c.checkpoints) >= 4:
                    victim = c
                    break
            time.sleep(0.05)
        assert victim is not None and victim.claimed_by is not None, "no chunk got half-way"
        pid = int(victim.claimed_by.split(":")[1])
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        done_before = set(victim.checkpoints)
        (job,) = _wait(deps, [job_id], timeout=LOCAL.queues.analysis_visibility_s * 3)
        rec = deps.claims.get(job_id, victim.chunk_id)
        assert rec is not None and rec.claimed_at is not None
        entries = [json.loads(x) for x in log.read_text().splitlines()]
        chunk_calls = [e for e in entries if e["chunk_id"] == victim.chunk_id]
        by_analyst: dict[str, int] = {}
        for e in chunk_calls:
            if e["pid"] != pid:
                by_analyst[e["analyst"]] = by_analyst.get(e["analyst"], 0) + 1
        clean = clean_chunk_calls(text, victim.chunk_id)
        return {"sweeper": with_sweeper, "state": job.state.value, "chunk_calls_clean_run": clean,
                "chunk_calls_ratio": round(len(chunk_calls) / clean, 2) if clean else None,
                "recovery_s": round(rec.claimed_at - killed_at, 2),
                "chunk_calls_total": len(chunk_calls),
                "analysts_checkpointed_before_kill": len(done_before),
                "analysts_rerun_after_kill": sorted(set(by_analyst) & done_before)}
    finally:
        stack.stop()


def clean_chunk_calls(text: str, chunk_id: str) -> int:
    from contract_review.doubles.offline_model import OfflineRuleModel
    from contract_review.review.analysts import analysts_for, run_analyst
    from contract_review.review.chunking import chunk_document

    model = OfflineRuleModel()
    (chunk,) = [c for c in chunk_document(text, LOCAL.review)
                if c.chunk_id == chunk_id] or [None]
    if chunk is None:
        return 0
    return sum(run_analyst(s, chunk, lambda b, p: (p(model.invoke(b(None))), 1)).model_calls
               for s in analysts_for(LOCAL.review.analyst_count))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the visibility-timeout baseline (~2 min)")
    ap.add_argument("--reps", type=int, default=2, help="throughput runs per fault rate (the best is kept)")
    args = ap.parse_args()
    template = synth("local")
    work = ROOT / ".review" / "bench"
    shutil.rmtree(work, ignore_errors=True)  # call ledgers append: start empty
    work.mkdir(parents=True)
    print(f"1/3 throughput: samples with 0 % and 5 % transient model faults (alternating, best of {args.reps})")
    runs: dict[float, list[dict[str, Any]]] = {0.0: [], 0.05: []}
    for rep in range(args.reps):
        for rate in (0.0, 0.05):
            runs[rate].append(throughput(template, rate, work / f"t{rate}-{rep}"))
    ideal, faulty = (min(runs[r], key=lambda x: x["wall_s"]) for r in (0.0, 0.05))
    print("2/3 recovery from kill -9: lease + sweeper" + ("" if args.quick else ", then the visibility-timeout baseline"))
    ours = recovery(template, True, work / "r1")
    baseline = None if args.quick else recovery(template, False, work / "r2")
    bound = LOCAL.recovery.claim_lease_s + LOCAL.recovery.sweep_interval_s
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "profile": "local",
        "throughput": {"ideal": ideal, "faults_5pct": faulty,
                       "wall_ratio": round(faulty["wall_s"] / ideal["wall_s"], 2),
                       "calls_ratio": round(faulty["model_calls"] / ideal["model_calls"], 3)},
        "recovery": {"ours": ours, "baseline_visibility_timeout": baseline,
                     "ideal_bound_s": bound, "visibility_timeout_s": LOCAL.queues.analysis_visibility_s,
                     "ours_vs_bound": round(ours["recovery_s"] / bound, 2),
                     "baseline_vs_ours": round(baseline["recovery_s"] / ours["recovery_s"], 1) if baseline else None},
        "reproduce": "make bench  (or .venv/bin/python bench/run.py [--quick])",
    }
    out = ROOT / "bench" / "results" / "latest.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    t = results["throughput"]
    print(f"   0 %: {ideal['wall_s']} s, {ideal['model_calls']} calls; 5 %: {faulty['wall_s']} s, "
          f"{faulty['model_calls']} calls (wall x{t['wall_ratio']}, calls x{t['calls_ratio']}), "
          f"retries {faulty['retries_by_code']}, completed {faulty['completed']}/{faulty['jobs']}")
    r = results["recovery"]
    print(f"   recovery ours {ours['recovery_s']} s vs ideal bound {bound} s (x{r['ours_vs_bound']})"
          + (f"; baseline {baseline['recovery_s']} s (x{r['baseline_vs_ours']} slower)" if baseline else ""))
    print(f"3/3 work lost: analysts checkpointed before the kill {ours['analysts_checkpointed_before_kill']}, "
          f"re-run after it {ours['analysts_rerun_after_kill'] or 'none'}; calls on the killed chunk "
          f"{ours['chunk_calls_total']} vs {ours['chunk_calls_clean_run']} for a clean run (x{ours['chunk_calls_ratio']})")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
