"""`make demo`: the whole pipeline on embedded AWS with our sample contracts and 5 % model faults."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from contract_review.domain.ports import DLQS, Deps
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import actions
from contract_review.operate.submission import SubmitRequest, submit

from .embedded import ROOT, STATE_DIR
from .progress import watch_jobs
from .stack import LocalStack

# Where the demo keeps each sample's report: the embedded AWS (and its S3) is gone when the demo exits, these stay
REPORTS_DIR = STATE_DIR / "reports"


def _dlq_depths(deps: Deps) -> dict[str, int]:
    return {queue.value: deps.queues.depth(dlq) for queue, dlq in DLQS.items()}


def run_demo(console: Console, fault_rate: float, samples_dir: Path | None = None, timeout: float = 150.0,
             document: dict[str, Any] | None = None) -> int:
    """Deploy, submit the samples, watch them, print the results (to `console`); with `document`, the results are
    also put in it (`review demo --json`: jobs, reliability, completed, seconds, ok)."""
    samples = sorted((samples_dir or ROOT / "samples").glob("*.txt"))
    if not samples:
        console.print("[red]no samples/*.txt found[/]")
        return 2
    started = time.monotonic()
    stack = LocalStack(faults=FaultSpec(seed=2026, transient_rate=fault_rate))
    console.print("[bold]1/4[/] synthesizing the CDK app and deploying it into embedded AWS (moto)...")
    stack.start()
    stack.write_local_json()
    try:
        deps = stack.deps()
        sandboxes = len(stack.runtime.sandboxes) if stack.runtime else 0
        console.print(f"    endpoint {stack.aws.endpoint}; {sandboxes} sandboxes "
                      f"(worker processes); model faults {fault_rate:.0%} (seeded)")
        console.print(f"[bold]2/4[/] submitting {len(samples)} sample contracts to the intake queue")
        jobs = {}
        for f in samples:
            text = f.read_text(encoding="utf-8")
            jobs[submit(deps, None, SubmitRequest.inline(text, document_id=f.name)).job_id] = f
            console.print(f"    {f.name} ({len(text) // 1024} KiB)")
        console.print("[bold]3/4[/] reviewing (live progress; chunks settled / total)")
        states = watch_jobs(console, deps.jobs, list(jobs), timeout)
        console.print("[bold]4/4[/] results: per category, the clauses found that answer its question (0: none "
                      "found; `review report JOB` states each question); findings from the offline rule model, "
                      "not an LLM")
        retries: Counter[str] = Counter()
        calls = redeliveries = repairs = 0
        records: list[dict[str, Any]] = []
        for job_id, f in jobs.items():
            job = deps.jobs.get(job_id)
            console.print(f"\n[bold]{f.name}[/]  job {job_id}  state [bold]{states.get(job_id)}[/]")
            record: dict[str, Any] = {"job_id": job_id, "sample": f.name, "state": states.get(job_id),
                                      "error_code": job.error_code if job else None}
            records.append(record)
            rep = actions.report_of(deps, job) if job is not None else None
            if job is None or rep is None:
                console.print(f"    no report: {job.error_code if job else 'no job record'}")
                continue
            by_cat = Counter(x.category for x in rep.findings)
            t = Table("category", "findings", "max risk", box=None, pad_edge=False)
            for key in actions.category_keys():
                scores = [x.score for x in rep.findings if x.category == key]
                t.add_row(actions.category_title(key), str(by_cat.get(key, 0)), f"{max(scores, default=0):.2f}")
            console.print(t)
            top = max(rep.findings, key=lambda x: x.score, default=None)
            if top:
                console.print(f"    highest risk ({top.score:.2f}, {actions.category_title(top.category)}): "
                              f"\"{top.quote[:160]}\"")
            rel = rep.reliability
            calls += rel.model_calls
            redeliveries += rel.redeliveries
            repairs += rel.repairs
            retries.update(rel.retries_by_code)
            gaps = rep.coverage
            if rep.cost is not None:
                label = "estimated cost at Bedrock's list prices (simulated; nothing was charged)" if rep.cost.estimate \
                    else "cost"
                timed_out = (f", estimated ${rep.cost.estimated_usd} for {rep.cost.timed_out_calls} timed-out call(s) "
                             "Bedrock may bill") if rep.cost.timed_out_calls else ""
                console.print(f"    {label}: ${rep.cost.total_usd} (model ${rep.cost.model_usd}, orchestration "
                              f"${rep.cost.orchestration_usd}{timed_out})", markup=False, highlight=False)
            kept = _keep_reports(deps, job.report_json_key, job.report_md_key, f.stem)
            record.update(
                report_json=str(kept[0]), report_md=str(kept[1]), findings=len(rep.findings),
                findings_by_category=dict(by_cat), highest_risk=top.score if top else None,
                cost_usd=str(rep.cost.total_usd) if rep.cost is not None else None,
                cost_estimate=rep.cost.estimate if rep.cost is not None else None,
                coverage={"missing_chunks": len(gaps.missing_chunks), "mandatory_gaps": len(gaps.mandatory_gaps),
                          "optional_gaps": len(gaps.optional_gaps)})
            console.print(f"    coverage: {len(gaps.missing_chunks)} missing chunks, "
                          f"{len(gaps.mandatory_gaps)} mandatory / {len(gaps.optional_gaps)} optional gaps; "
                          f"report {_shown(kept[1])} (kept after the demo stops)")
        console.print("\n[bold]Reliability summary[/]")
        console.print(f"    model calls: {calls}   tier-1 retries by error code: {dict(retries) or 'none'}")
        console.print(f"    semantic repairs: {repairs}   queue redeliveries: {redeliveries}   "
                      f"DLQ depth: {_dlq_depths(deps)}")
        ok = all(states.get(j) == "completed" for j in jobs)
        seconds = round(time.monotonic() - started, 1)
        completed = sum(s == "completed" for s in states.values())
        console.print(f"    {completed}/{len(jobs)} jobs completed in {seconds:.1f} s")
        if document is not None:
            document.update(ok=ok, jobs=records, completed=completed, total=len(jobs), seconds=seconds,
                            fault_rate=fault_rate, reliability={
                                "model_calls": calls, "retries_by_code": dict(retries), "repairs": repairs,
                                "redeliveries": redeliveries, "dlq_depth": _dlq_depths(deps)})
        return 0 if ok else 1
    finally:
        stack.stop()


def _keep_reports(deps: Deps, json_key: str | None, md_key: str | None, name: str) -> tuple[Path, Path]:
    """The job's report.json and report.md copied out of the embedded S3 into REPORTS_DIR (`name`.json, `name`.md)."""
    REPORTS_DIR.mkdir(parents=True, exist_ok=True)
    paths = (REPORTS_DIR / f"{name}.json", REPORTS_DIR / f"{name}.md")
    for key, path in zip((json_key, md_key), paths, strict=True):
        path.write_text(deps.artifacts.get_text(key or ""), encoding="utf-8")
    return paths


def _shown(path: Path) -> str:
    """A path as the user can open it from the checkout (relative when it is under it)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
