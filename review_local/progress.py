"""Live progress of jobs (shared by `review submit --wait`, `review watch` and `review demo`).

A job id without a record is not known yet right after a submission: intake creates the record
when it takes the message. So a missing record is "waiting for intake" while the intake queue
still holds a message that could create it, and for a short grace period after the watch starts
(SQS's counts are approximate); after that it is `unknown`, and the watch stops waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from contract_review.domain.ports import JobsRepo
from contract_review.domain.records import Job, JobEvent, JobState
from contract_review.operate.narration import event_label

UNKNOWN = "unknown"  # no job record, and nothing in the intake queue could still create it
WAITING = "waiting for intake"
POLL_S = 0.3

# Seams for tests (a fake clock whose sleep advances it); looked up at call time.
_now: Callable[[], float] = time.monotonic
_sleep: Callable[[float], None] = time.sleep


def now() -> float:
    """The clock the watch runs on (monotonic; tests replace `_now`)."""
    return _now()


def ended(state: str) -> bool:
    """Whether a state `watch_jobs` returned is final (a terminal job state)."""
    return state not in (UNKNOWN, WAITING) and JobState(state).terminal


def stops_watching(state: str) -> bool:
    """Final, or waiting for a person's decision (nothing will change until someone decides)."""
    return state == UNKNOWN or ended(state) or state == JobState.WAITING_APPROVAL.value


def watch_jobs(console: Console, jobs: JobsRepo, job_ids: list[str], timeout: float = 600.0, *,
               intake_busy: Callable[[], bool] | None = None, grace_s: float = 5.0,
               events: Callable[[str, int], list[JobEvent]] | None = None, since: int = 0,
               label: Callable[[Job], str] | None = None) -> dict[str, str]:
    """Live progress bars until every job ends, waits for a person's decision, is `unknown`, or `timeout`
    passes. Returns the last
    state seen of each job id (each id once): a JobState value, `unknown`, or `waiting for intake`.

    `intake_busy` tells whether the intake queue still holds messages; without it a missing record
    is waited for until the timeout (never `unknown`). With `events` (job id, after number -> the
    events after it, all or a page: `lifecycle.read_events`; read until it answers none), each job's events are
    printed as they come, one line
    each ("chunk 7/22: indemnification done"), the same events the Job API serves; `since`: only the events
    after that number. `label` (a job -> its latest event in words) adds it to the job's one progress line.
    The count is the one number progress has everywhere: chunks settled of the job's chunks."""
    ids = list(dict.fromkeys(job_ids))
    states: dict[str, str] = {j: WAITING for j in ids}
    seen: dict[str, int] = dict.fromkeys(ids, since)
    started = _now()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), TextColumn("{task.fields[label]}"), console=console,
                  transient=False) as progress:
        tasks = {j: progress.add_task(j, total=None, state=WAITING, label="") for j in ids}
        while True:
            busy: bool | None = None  # asked at most once per round, only when a record is missing
            for j in ids:
                if stops_watching(states[j]):
                    continue
                job = jobs.get(j)
                if job is None:
                    if busy is None:
                        busy = intake_busy() if intake_busy is not None else True
                    if _now() - started >= grace_s and not busy:
                        states[j] = UNKNOWN
                        progress.update(tasks[j], total=1, completed=0, state=UNKNOWN)
                    continue
                states[j] = job.state.value
                # every event written before the job was read, however many pages: a job that has ended stops
                # the watch after this round, so what it wrote last (its ending) is printed before the watch ends
                while events is not None and (page := events(j, seen[j])):
                    for e in page:
                        progress.console.print(f"[dim]{j} #{e.number}[/] {event_label(e)}", highlight=False)
                        seen[j] = e.number
                # a job that ended with no chunks (failed on its input) shows 0/0, not a chunk it never had
                total: int | None = job.chunk_count or (0 if job.terminal else None)
                done = total if job.state is JobState.COMPLETED else job.n_settled
                progress.update(tasks[j], total=total, completed=done, state=states[j],
                                label=label(job) if label is not None else "")
            if all(stops_watching(s) for s in states.values()):
                break
            if _now() - started >= timeout:
                break
            _sleep(POLL_S)
    return states
