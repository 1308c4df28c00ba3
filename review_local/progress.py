"""Live progress of jobs (shared by `review submit --wait`, `review watch` and `review demo`)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from contract_review.ports import JobsRepo
from contract_review.records import JobState


def watch_jobs(console: Console, jobs: JobsRepo, job_ids: list[str], timeout: float = 600.0) -> dict[str, str]:
    """Live progress bars until every job ends (or `timeout`). Returns the last state seen of each."""
    states: dict[str, str] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        tasks = {j: progress.add_task(j, total=None, state="submitted") for j in job_ids}
        deadline = time.time() + timeout
        while time.time() < deadline:
            ended = 0
            for j in job_ids:
                job = jobs.get(j)
                if job is None:
                    continue
                states[j] = job.state.value
                total: int | None = job.chunk_count or None
                done = len(job.settled)
                if job.terminal:
                    ended += 1
                    if total is None or job.state is JobState.COMPLETED:
                        total = done = total or 1
                progress.update(tasks[j], total=total, completed=done, state=states[j])
            if ended == len(job_ids):
                break
            time.sleep(0.3)
    return states
