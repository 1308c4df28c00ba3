"""One job or several: watch them to their end (and the exit status that says how they ended), look at them
(`status`, `explain`, `watch`, `report`, `jobs`), and act on them (`retry`, `cancel`, `approve`, `reject`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from contract_review.domain import lifecycle
from contract_review.domain.ports import Queue
from contract_review.domain.records import Job, JobState, StepStatus
from contract_review.operate import actions, ids, narration
from contract_review.operate import job_view as job_views

from .. import progress
from ..progress import UNKNOWN, WAITING, ended, watch_jobs
from .context import Ctx, job_view, whole_job_id
from .render import STDERR, console, print_status, say

WATCH_GRACE_S = 3.0


def wait_for_jobs(obj: Ctx, job_ids: list[str], timeout: float, grace_s: float, show_events: bool = False,
          documents: dict[str, str] | None = None, since: int = 0, label: Callable[[Job], str] | None = None,
          out: Console = console) -> None:
    """Watch the jobs; exit 1, with one line per job that did not complete, unless all completed. `documents`:
    the SHA-256 each job must have been made from (a key another document took first, while this one's
    message was on its way, is intake's input.key_conflict: that job's end is not this document's)."""
    deps = obj.deps
    started = progress.now()
    states = watch_jobs(out, deps.jobs, job_ids, timeout, grace_s=grace_s,
                        intake_busy=lambda: deps.queues.depth(Queue.INTAKE) > 0,
                        events=(lambda j, after: lifecycle.read_events(deps, j, after)) if show_events else None,
                        since=since, label=label)
    problems, waiting = [], []
    for j, state in states.items():
        if state == JobState.WAITING_APPROVAL.value:
            waiting.append(_waiting_line(deps.jobs.get(j), j))
        elif state == UNKNOWN:
            problems.append(f"no job {j}: no record after {progress.now() - started:.0f} s and the intake queue is "
                            "empty, so "
                            "nothing will create it (a mistyped id? or see `review jobs` and `review dlq list`)")
        elif state == WAITING or not ended(state):
            problems.append(f"{j} is still {state} after {timeout:.0f} s (`review watch {j}` to go on watching)")
        elif (documents or {}).get(j) and (job := deps.jobs.get(j)) is not None \
                and job.document_sha256 and job.document_sha256 != (documents or {})[j]:
            problems.append(f"input.key_conflict: {j} was made from another document under the same key; this one "
                            "is in the intake dead-letter queue (`review dlq list`): send it with its own key")
        elif state != "completed":
            code = (job.error_code if (job := deps.jobs.get(j)) is not None else None)
            problems.append(f"{j} ended {state}" + (f" with {code}" if code else "") + f": see `review status {j}`")
    if problems:
        raise click.ClickException("\n".join(problems + waiting))
    if waiting:  # not completed, not failed: a person decides. Its own exit status, so scripts can tell
        for line in waiting:
            out.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(EXIT_WAITING_APPROVAL)


EXIT_WAITING_APPROVAL = 3  # `--wait`: a job waits for a person's decision (0: all completed; 1: one did not)


def _waiting_line(job: Job | None, job_id: str) -> str:
    a = job.approval if job is not None else None
    about = f" at step {a.step} ({a.reason}), until {narration.human_time(a.expires_at)}" if a is not None else ""
    return (f"{job_id} waits for a person's decision{about}: `review approve {job_id}` or `review reject {job_id}` "
            f"(`review status {job_id}` shows the evidence)")


# ------------------------------------------------------------------------------------ status & co
@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Show a job in sentences and tables: state, progress, errors, cost, and what would happen next (`--json`: every
    field). Also accepts a unique prefix of the job id."""
    view = job_view(obj, job_id)
    if as_json:
        click.echo(view.model_dump_json(indent=2))
        return
    print_status(view)


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="The six answers as JSON (keys: what_happened, where_it_is, "
              "what_it_cost, what_failed, what_next, if_it_fails_again).")
@click.pass_obj
def explain(obj: Ctx, job_id: str, as_json: bool) -> None:
    """A job's story in six short paragraphs: what happened, where it is, what it cost, what failed and why,
    what to do next, and what happens if it fails again."""
    story = job_views.explain(job_view(obj, job_id))
    if as_json:
        keys = ("what_happened", "where_it_is", "what_it_cost", "what_failed", "what_next", "if_it_fails_again")
        click.echo(json.dumps({k: p.split(": ", 1)[1] for k, p in zip(keys, story, strict=True)}, indent=2))
        return
    for paragraph in story:
        say(paragraph)
        say("")


@click.command()
@click.argument("job_id")
@click.option("--timeout", type=float, default=600.0)
@click.option("--progress", "progress_only", is_flag=True,
              help="One live line (chunks settled of all, state, the latest event) instead of every event.")
@click.option("--since", type=click.IntRange(min=0), default=0, metavar="N",
              help="Only the events after number N (the `#N` printed before each).")
@click.pass_obj
def watch(obj: Ctx, job_id: str, timeout: float, progress_only: bool, since: int) -> None:
    """Live progress of a job until it ends: its events as they come, and a progress bar; exit 0 only
    if it completed.

    A job id without a record is waited for only while the intake queue still holds messages
    (it may be one just sent) and a few seconds more; then it is unknown."""
    deps = obj.deps
    whole = whole_job_id(obj, job_id)
    if not ids.is_job_id(whole) and deps.jobs.get(whole) is None:  # nothing could ever be recorded under it
        raise click.ClickException(f"no job {job_id}: not a job id (`job-` and 20 hex digits) and no job's id starts "
                                   "with it (`review jobs` lists them)")
    wait_for_jobs(obj, [whole], timeout, WATCH_GRACE_S, show_events=not progress_only, since=since,
          label=(lambda job: job_views.job_progress(deps, job).label) if progress_only else None)


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of Markdown.")
@click.pass_obj
def report(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Print a job's report."""
    job_id = whole_job_id(obj, job_id)
    job = obj.deps.jobs.get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    key = job.report_json_key if as_json else job.report_md_key
    if not key:
        raise click.ClickException(job_views.no_report(job))
    click.echo(obj.deps.artifacts.get_text(key))


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--document-id", default=None, help="Only the jobs of this document id (e.g. after `aws sqs send-message`).")
@click.option("--state", "states", multiple=True, type=click.Choice([s.value for s in JobState]),
              help="Only the jobs in this state (repeat for several).")
@click.pass_obj
def jobs(obj: Ctx, as_json: bool, document_id: str | None, states: tuple[str, ...]) -> None:
    """List jobs (oldest first)."""
    items = [j for j in obj.deps.jobs.all() if (document_id is None or j.document_id == document_id)
             and (not states or j.state.value in states)]
    if as_json:
        click.echo(json.dumps([j.model_dump(mode="json", exclude_defaults=True) for j in items], indent=2))
        return
    t = Table("job", "state", "chunks", "document", "error")  # (the listing leaves the settled set out)
    t.columns[0].no_wrap = True
    t.columns[0].min_width = max((len(j.job_id) for j in items), default=0)  # whole: other columns fold instead
    for c in t.columns[1:]:
        c.overflow = "fold"
    for j in items:
        t.add_row(j.job_id, j.state.value, str(j.chunk_count), j.document_id, j.error_code or "")
    console.print(t)
    if document_id is not None and not items:
        raise click.ClickException(f"no job with document id {document_id!r} (intake may not have taken it yet)")


# ------------------------------------------------------------------------------------ retry
@click.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--wait", is_flag=True, help="Wait for the retried jobs to end, showing progress.")
@click.option("--timeout", type=float, default=600.0)
@click.option("--budget-usd", type=float, default=None,
              help="The jobs' budget from now on (above what each has cost): continues a job its budget stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON (one object per job: job_id, retried, action, state).")
@click.pass_obj
def retry(obj: Ctx, job_ids: tuple[str, ...], wait: bool, timeout: float, budget_usd: float | None,
          as_json: bool) -> None:
    """Put failed, dead-lettered or cancelled jobs back to work, keeping finished chunks and checkpoints.

    Works from the job's records, with or without DLQ messages (the job's DLQ copies are removed):
    failed and dead-lettered chunks get a fresh attempt budget, analysts with a mandatory gap run
    again, chunks never started are sent. A job that failed in intake (runtime.intake_exhausted) is
    queued again with its intake message. Exits 1 when a job was not retried (the error line says why)."""
    retried: list[str] = []
    refused: list[str] = []
    outcomes: list[Any] = []
    for job_id in [whole_job_id(obj, j) for j in job_ids]:
        r = actions.retry(obj.deps, job_id, budget_usd=budget_usd)
        outcomes.append(r.model_dump(mode="json"))
        if r.retried:
            retried.append(job_id)
            if not as_json:
                console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.action}", markup=False,
                              highlight=False, soft_wrap=True)
        else:  # said once, in the error line
            refused.append(f"{job_id} ({r.state.value if r.state else 'no record'}): {r.action}")
    if as_json:
        click.echo(json.dumps(outcomes, indent=2))
    if wait and retried:
        wait_for_jobs(obj, retried, timeout, WATCH_GRACE_S)
    if refused:
        raise click.ClickException(f"not retried: {'; '.join(refused)}")


# ------------------------------------------------------------------------------------ cancel
@click.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--wait", is_flag=True, help="Wait until the jobs are cancelled.")
@click.option("--timeout", type=float, default=120.0)
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON (one object per job: job_id, state, changed, message).")
@click.pass_obj
def cancel(obj: Ctx, job_ids: tuple[str, ...], wait: bool, timeout: float, as_json: bool) -> None:
    """Cancel jobs: no new work starts, chunks in flight stop within one model call, side effects
    already done are compensated, and each job ends `cancelled`. Cancelling twice is cancelling once;
    a job that already ended is left as it is (exit 1, the error line says so)."""
    refused: list[str] = []
    reasons: list[str] = []
    job_ids = tuple(whole_job_id(obj, j) for j in job_ids)
    outcomes: list[Any] = []
    for job_id in job_ids:
        r = lifecycle.request_cancel(obj.deps, job_id, by="cli")
        ok = r.changed or r.state in (JobState.CANCELLING, JobState.CANCELLED)
        outcomes.append(r.model_dump(mode="json"))
        if not ok:  # said once, in the error line
            refused.append(job_id)
            reasons.append(f"{job_id}: {r.message}")
        elif not as_json:
            console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.message}", markup=False,
                          highlight=False, soft_wrap=True)
    if as_json:
        click.echo(json.dumps(outcomes, indent=2))
    pending = [j for j in job_ids if j not in refused]
    if wait and pending:
        states = watch_jobs(console, obj.deps.jobs, pending, timeout)
        late = [j for j, s in states.items() if s != JobState.CANCELLED.value]
        if late:
            raise click.ClickException(f"not cancelled within {timeout:.0f} s: {', '.join(late)}")
    if refused:
        raise click.ClickException(f"not cancelled: {'; '.join(reasons)}")


# ------------------------------------------------------------------------------------ approve / reject
UNDO_POLL_S = 1.0  # `review reject`: how often the job is read while its side effects are undone


def _decide(obj: Ctx, job_id: str, decision: str, as_json: bool = False) -> actions.ApprovalOutcome:
    job_id = whole_job_id(obj, job_id)
    r = actions.decide(obj.deps, job_id, decision, by="cli")
    if not r.changed:  # refused: said once, as the error line (with --json, the outcome on stdout too)
        if as_json:
            click.echo(r.model_dump_json(indent=2))
        raise click.ClickException(f"{job_id}: {r.message}")
    if not as_json:
        console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.message}", markup=False, highlight=False,
                      soft_wrap=True)
    return r


def _undo_words(job: Job) -> str:
    """Each step the job did outside, and what became of it: "ticket.open compensated (TCK-00001 closed)"."""
    words = []
    for e in job.side_effects:
        ticket = e.compensation_result.get("ticket_id") or e.result.get("ticket_id")
        what = f" ({ticket} {e.compensation_result.get('status') or 'open'})" if e.step == "ticket.open" and ticket else ""
        words.append(f"{e.step} {e.status.value.replace('_', ' ')}{what}")
    return "; ".join(words) or "nothing was done outside, nothing to undo"


def _await_undo(obj: Ctx, job_id: str, timeout: float, out: Console) -> tuple[Job | None, list[str]]:
    """Wait (up to `timeout`) for a rejected job to leave `compensating`: a line each time what is undone changes.
    The job as it ended (or as it still is), and the steps whose undo failed."""
    deadline = time.monotonic() + timeout
    said = ""
    out.print(f"undoing what {job_id} did (up to {timeout:.0f} s; `review status {job_id}` shows it too)...",
              markup=False, highlight=False, soft_wrap=True)
    while True:
        job = obj.deps.jobs.get(job_id)
        if job is None:
            return None, []
        now = f"  {job.state.value}: {_undo_words(job)}"
        if now != said:
            out.print(now, markup=False, highlight=False, soft_wrap=True)
            said = now
        if job.state is not JobState.COMPENSATING or time.monotonic() >= deadline:
            failed = [e.step for e in job.side_effects if e.status is StepStatus.COMPENSATION_FAILED]
            return job, failed
        time.sleep(UNDO_POLL_S)


def _undo_failed_line(job: Job, failed: list[str]) -> str:
    causes = []
    for e in job.side_effects:
        if e.step in failed:
            cause = e.error.cause_code if e.error and e.error.cause_code else "unknown cause"
            http = f", HTTP {e.error.http_status}" if e.error and e.error.http_status else ""
            causes.append(f"{e.step} ({cause}{http})")
    return (f"{job.job_id} is {job.state.value} ({job.error_code}), but undoing {', '.join(causes)} failed on every "
            "attempt (sideeffect.compensation_failed; what it did stays: a ticket open): fix the cause, then "
            "`review compensations --redrive --wait`")


_DECISION_JSON = click.option("--json", "as_json", is_flag=True,
                              help="Print the outcome as JSON (job_id, state, changed, message).")


@click.command()
@click.argument("job_id")
@_DECISION_JSON
@click.pass_obj
def approve(obj: Ctx, job_id: str, as_json: bool) -> None:
    """A job waiting for approval (a side effect whose outcome stayed unknown; `review status` shows the
    step, its key and the evidence): retry the step with the same key (the external system dedups it)
    and go on. Exit 1 when the job is not waiting."""
    r = _decide(obj, job_id, "approve", as_json)
    if as_json:
        click.echo(r.model_dump_json(indent=2))


@click.command()
@click.argument("job_id")
@click.option("--no-wait", is_flag=True, help="Do not wait for the undo: exit once the decision is recorded.")
@click.option("--timeout", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="How long to wait for the undo.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the outcome as JSON (job_id, state, changed, message; and, once waited, ended, "
                   "undo_failed: the steps whose undo failed).")
@click.pass_obj
def reject(obj: Ctx, job_id: str, no_wait: bool, timeout: float, as_json: bool) -> None:
    """A job waiting for approval: fail it (job.approval_rejected): `compensating` while the side effects it did
    are undone (a ticket closed, a withdrawal published), then `failed`. Waits for the undo and says how it went:
    exit 1 when an undo failed (with what to run next) or the job is still compensating after --timeout. Again on
    a job still compensating: the compensation is sent again. Exit 1 when the job is neither waiting nor
    compensating."""
    r = _decide(obj, job_id, "reject", as_json)
    record: dict[str, Any] = r.model_dump(mode="json")
    problem = None
    if not no_wait:
        job, failed = _await_undo(obj, r.job_id, timeout, STDERR if as_json else console)
        record.update(ended=job.state.value if job else None, undo_failed=failed)
        if job is None:
            problem = f"{r.job_id}: the job is gone"
        elif failed:
            problem = _undo_failed_line(job, failed)
        elif job.state is JobState.COMPENSATING:
            problem = (f"{r.job_id} is still compensating after {timeout:.0f} s: `review status {r.job_id}` says "
                       f"what is left; `review reject {r.job_id}` sends the undo again")
        elif not as_json:
            say(f"{r.job_id} {job.state.value} ({job.error_code}); undone: {_undo_words(job)}")
    if as_json:
        click.echo(json.dumps(record, indent=2))
    if problem:
        raise click.ClickException(problem)


COMMANDS = (status, explain, watch, report, jobs, retry, cancel, approve, reject)
