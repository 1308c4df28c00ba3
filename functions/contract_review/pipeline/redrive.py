"""Redrive and retry: put dead-lettered, failed or stranded work back to work with a fresh attempt
budget, leaving an audit event.

- `reopen(job, chunk)`: what redriving one chunk's DLQ message does. A chunk of a running job is
  reset alone; an ended job (`dead_lettered` / `failed`) is reopened as a whole.
- `retry(job)`: `review retry JOB`. Works from the job and chunk records alone, with or without DLQ
  messages: a failed or dead-lettered job is reopened keeping its finished chunks and checkpoints; a
  job that failed in intake (`runtime.intake_exhausted`) is queued again with its intake message.
- `dlq_redrive`: re-inject DLQ messages. Works on moto (no StartMessageMoveTask): receive, re-send,
  delete. A permanent input error is not resent without `force` (it would fail the same way).

Redrive racing finalize: resetting a chunk and uncounting it (`JobsRepo.unsettle_chunks`) bumps the
job's `settled_version`, on which finalize's transition is conditional; and when that update finds
the job already ended (finalize won the race), the job is reopened as a whole. Either way the reset
chunk is never left `pending` under an ended job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from decimal import Decimal

from pydantic import BaseModel, ValidationError

from contract_review.domain import cost, lifecycle
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorClass
from contract_review.domain.keys import plan_key
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Deps, Queue, QueueMessage
from contract_review.domain.records import ChunkStatus, Job, JobState, Rebudgeted, Usage
from contract_review.pipeline import fanout
from contract_review.pipeline.aggregator import BUDGET_EXCEEDED
from contract_review.reliability.chunks import analysis_message, announce
from contract_review.review.report import coverage_of

REOPENABLE = (JobState.FAILED, JobState.DEAD_LETTERED)  # a redrive of one chunk reopens these jobs
RESETTABLE = (ChunkStatus.FAILED, ChunkStatus.DEAD_LETTERED)
# `review retry` (and the same document again) also resumes a cancelled job from its checkpoints: its cancelled
# chunks run again (a redrive of one chunk never resurrects it)
RETRYABLE = (*REOPENABLE, JobState.CANCELLED)
INTAKE_EXHAUSTED = "runtime.intake_exhausted"  # failed before fan-out: retried by resending its intake message


class Redriven(BaseModel):
    message_id: str
    queue: str
    action: str
    job_id: str | None = None
    chunk_id: str | None = None
    skipped: bool = False  # left in the DLQ (see `action` for why)


class Retried(BaseModel):
    """What `review retry JOB` did."""

    job_id: str
    retried: bool  # False: nothing was done (see `action` for why, and what to do instead)
    action: str
    state: JobState | None = None  # the job's state afterwards


_Result = Callable[[bool, str], Retried]  # (retried, action) -> the answer, with the job's state afterwards


# ------------------------------------------------------------------------------ reopening
def reopen(deps: Deps, job_id: str, chunk_id: str) -> str:
    """Give a dead-lettered or failed chunk a fresh attempt budget and put its job back to work.

    A job that had ended (`dead_lettered` / `failed`) is reconciled as a whole (`_reopen_job`)."""
    job = deps.jobs.get(job_id)
    if job is None:
        return "dropped (no such job)"
    if job.state in REOPENABLE:
        if job.error_code == INTAKE_EXHAUSTED:
            return f"dropped (the job failed in intake with {INTAKE_EXHAUSTED}: `review retry {job_id}`)"
        return _reopen_job(deps, job, "redrive")
    if job.state is not JobState.RUNNING:
        return f"dropped (job is {job.state.value})"
    return _reopen_chunk(deps, job, chunk_id)


def _reopen_chunk(deps: Deps, job: Job, chunk_id: str) -> str:
    """One failed or dead-lettered chunk of a running job: reset, unsettled, sent again."""
    current = deps.claims.get(job.job_id, chunk_id)
    if current is None or current.status not in RESETTABLE:
        return f"dropped (chunk is {current.status.value if current else None})"
    reset = deps.claims.reset_for_redrive(job.job_id, chunk_id)
    if reset is None:
        now = deps.claims.get(job.job_id, chunk_id)
        return f"dropped (chunk is {now.status.value if now else None})"
    # uncounted, with the usage counted when it settled (it adds all its attempts again when it
    # settles again); bumps settled_version: a finalize in flight loses
    after = deps.jobs.unsettle_chunks(job.job_id, {chunk_id: current.usage()})
    if after is not None and after.state in REOPENABLE:
        # Finalize read the chunk records before the reset and ended the job before this update: reopen
        # the job as a whole, or the chunk just reset would stay pending under an ended job for good.
        return _reopen_job(deps, after, "redrive")
    if after is not None and after.state in (JobState.CANCELLING, JobState.CANCELLED):
        return _cancelled_meanwhile(deps, after, chunk_id)
    if after is None or after.state is not JobState.RUNNING:
        return f"dropped (job is {after.state.value if after else None})"
    deps.queues.send_analysis([analysis_message(deps, job, reset, "redrive")])
    return "redriven (1 chunk(s) sent)"


def _cancelled_meanwhile(deps: Deps, job: Job, chunk_id: str) -> str:
    """A cancel landed between the redrive's check and its reset: the chunk just reset must not stay pending
    under the ended job. It is settled `cancelled` (fenced, nobody holds it), counted again (the unsettle took
    its usage off), and a cancel under way is finished."""
    record = deps.claims.get(job.job_id, chunk_id)
    if record is not None and not record.settled:
        record = lifecycle.cancel_chunk(deps, record, "redrive", deps.clock()) or deps.claims.get(job.job_id, chunk_id)
    if record is not None and record.settled:
        deps.jobs.settle_chunk(job.job_id, chunk_id, usage=record.usage(), fence=record.fence, status=record.status)
    now = deps.jobs.get(job.job_id)
    if now is not None and now.state is JobState.CANCELLING:
        lifecycle.finish_cancel(deps, now)
    return f"dropped (job is {job.state.value}: the chunk is settled cancelled)"


def _gap_analysts(job: Job, records: list[ChunkRecord]) -> dict[str, set[str]]:
    """Done chunks with a mandatory coverage gap (an analyst refused, failed or missing): chunk id ->
    those analysts, whose checkpoints a reopen forgets so they run again."""
    done = [c for c in records if c.status is ChunkStatus.DONE]
    gaps: dict[str, set[str]] = defaultdict(set)
    for g in coverage_of(job.analyst_count, done).mandatory_gaps if done else []:
        gaps[g.chunk_id].add(g.analyst)
    return dict(gaps)


def _reopen_job(deps: Deps, job: Job, via: str, resettable: Collection[ChunkStatus] = RESETTABLE,
                budget_micro_usd: int | None = None) -> str:
    """An ended job back to `running`: every failed or dead-lettered chunk is reset, the analysts with a
    mandatory gap on a done chunk are forgotten (they run again), every chunk that is not done is sent
    (also chunks a job-fatal error left unstarted), and what is counted settled is rebuilt from the chunk
    records. Finished chunks and the other checkpoints are kept."""
    records = deps.claims.for_job(job.job_id)
    if not records and not deps.artifacts.list_keys(plan_key(job.job_id)):
        # cancelled before intake stored its document (intake then dropped its message: the job had ended)
        return ("not retried: the job was cancelled before intake took its document in, so nothing of it was "
                "stored to run again. Send the document again under another idempotency key (this one names the "
                "cancelled job)")
    rerun = _gap_analysts(job, records)
    for c in records:
        if c.status in resettable:
            deps.claims.reset_for_redrive(job.job_id, c.chunk_id)
        elif c.chunk_id in rerun:
            deps.claims.reset_for_redrive(job.job_id, c.chunk_id, forget=sorted(rerun[c.chunk_id]))
    records = deps.claims.for_job(job.job_id)
    done = {c.chunk_id for c in records if c.status is ChunkStatus.DONE}
    todo = [c for c in records if c.status is not ChunkStatus.DONE]
    detail: dict[str, object] = {"chunks_resent": len(todo), "via": via}
    if rerun:
        detail["analysts_rerun"] = sum(len(a) for a in rerun.values())
    # the job's running cost starts again from the chunks that stay settled; each chunk run again adds all its
    # attempts (earlier ones included) when it settles again (docs/cost.md)
    kept = Usage.of(c.usage() for c in records if c.status is ChunkStatus.DONE)
    outcome = kept if budget_micro_usd is None else Rebudgeted(**kept.model_dump(), budget_micro_usd=budget_micro_usd)
    if budget_micro_usd is not None:
        detail["budget_micro_usd"] = budget_micro_usd
    reopened = lifecycle.transition(deps, job, JobState.RUNNING, event="job.reopened", detail=detail, settled=done,
                                    outcome=outcome)
    if reopened is None:
        return "dropped (job changed meanwhile)"
    if not records:
        # cancelled after intake stored its document and plan but before its fan-out recorded a chunk (the cancel
        # won intake's move to running): no chunk message, no result, so nothing else would ever fan it out. The
        # first page goes now; the rest follows as its chunks settle, as for a job intake fanned out.
        return f"redriven ({fanout.refill(deps, reopened)} chunk(s) sent: its fan-out starts)"
    if not todo:
        # every chunk is done (the job failed in its side effects, or in finalizing): nothing to run, so a done
        # chunk's result goes to the aggregator again, which finalizes at once (report, then the side effects,
        # with its own adapters), instead of the job waiting for the stall reconciler
        announce(deps, max(records, key=lambda c: c.chunk_index), nonce=f"reopen-{job.version}")
        return "redriven (every chunk done: finalizing)"
    text = deps.artifacts.get_text(job.document_key)
    deps.queues.send_analysis([analysis_message(deps, job, c, via, text) for c in todo])
    unsent = max(0, job.chunk_count - len(records))  # never fanned out yet: the fan-out sends them as chunks settle
    left = (f"; its other {unsent} never sent follow as its fan-out goes on: {len(todo) + unsent} of its "
            f"{job.chunk_count} left to run") if unsent else ""
    return f"redriven ({len(todo)} chunk(s) sent{left})"


def requeue_failed_intake(deps: Deps, job_id: str) -> bool:
    """A job that failed in intake (`runtime.intake_exhausted`) back to `queued`, its ending cleared, so
    intake takes its message again. False when the job is not such a job (nothing changes)."""
    job = deps.jobs.get(job_id)
    if job is None or job.state is not JobState.FAILED or job.error_code != INTAKE_EXHAUSTED:
        return False
    return lifecycle.transition(deps, job, JobState.QUEUED, event="job.reopened", settled=set(),
                                detail={"to_state": JobState.QUEUED.value, "via": "intake"}) is not None


# ------------------------------------------------------------------------------ review retry
def retryable(job: Job) -> bool:
    """Whether `review retry` (`POST /jobs/{id}/retry`, the same document again) puts the job back to work: it
    ended failed, dead-lettered or cancelled, not on its input (a corrected document replaces it) and not by its
    budget (it would stop again at once)."""
    return (job.state in RETRYABLE and not job.replaceable
            and not (job.state is JobState.CANCELLED and job.error_code == BUDGET_EXCEEDED))


def retry(deps: Deps, job_id: str, budget_usd: float | None = None) -> Retried:
    """`review retry JOB`: put a failed, dead-lettered or cancelled job back to work from its records, keeping its
    finished chunks and checkpoints, whether or not its chunks' messages are in a DLQ (their DLQ
    copies, now handled, are removed). For a running job: reset its dead-lettered or failed chunks."""
    started = deps.clock()
    job = deps.jobs.get(job_id)
    if job is None:
        return Retried(job_id=job_id, retried=False, action="no such job")

    def result(retried: bool, action: str) -> Retried:
        now = deps.jobs.get(job_id)
        return Retried(job_id=job_id, retried=retried, action=action, state=now.state if now else None)

    if job.state is JobState.COMPLETED:
        return result(False, "nothing to retry: the job is completed")
    # `--budget-usd N`: the job's budget from now on (above what it has cost, or it would stop again at once)
    new_budget = cost.micro_usd(Decimal(str(budget_usd))) if budget_usd is not None else None
    spent = cost.format_usd(job.total_micro_usd)
    if job.state is JobState.CANCELLED and job.error_code == BUDGET_EXCEEDED and new_budget is None:
        return result(False, f"not retried: the job was stopped by its budget (job.budget_exceeded) after spending "
                             f"{spent}; `review retry {job_id} --budget-usd N`, N above that, continues it from its "
                             "checkpoints")
    if new_budget is not None and new_budget <= job.total_micro_usd:
        return result(False, f"not retried: the budget {cost.format_usd(new_budget)} is not above what the job has "
                             f"cost ({spent}): it would stop again at once")
    if job.state is JobState.QUEUED:
        return result(False, "nothing to retry yet: intake has not fanned the job out. If its intake message reached "
                             f"the intake DLQ, the sweeper fails the job with {INTAKE_EXHAUSTED} after "
                             f"{deps.settings.profile.recovery.stall_after_s:.0f} s without progress; retry it then")
    if job.state is JobState.RUNNING:
        return _retry_running(deps, job, started, result)
    if job.state is JobState.COMPENSATING:
        return result(False, f"not yet: the job is failing ({job.error_code}) and what it did is being undone; "
                             f"retry it once it is failed (`review watch {job_id}`)")
    if job.state is JobState.CANCELLING:
        return result(False, f"not yet: the job is cancelling; retry it once it is cancelled (`review watch {job_id}`)")
    if job.state is JobState.WAITING_APPROVAL:  # reopening it would skip the decision on its ambiguous side effect
        return result(False, f"nothing to retry: the job is waiting_approval: decide it (`review approve {job_id}` or "
                             f"`review reject {job_id}`, POST /jobs/{job_id}/approval)")
    if job.replaceable:
        return result(False, f"nothing to retry: {job.error_code} refused the document before anything was analysed. "
                             "Send it again (corrected, or with a budget of at least its estimate) with the same "
                             "idempotency key: it replaces this job")
    if job.error_code == INTAKE_EXHAUSTED:
        return _retry_intake(deps, job, result)
    resettable = (*RESETTABLE, ChunkStatus.CANCELLED) if job.state is JobState.CANCELLED else RESETTABLE
    action = _reopen_job(deps, job, "retry", resettable, budget_micro_usd=new_budget)
    if not action.startswith("redriven"):
        return result(False, action)
    removed = _discard_dlq_copies(deps, job_id, None, started)
    return result(True, f"reopened from {job.state.value}{f' ({job.error_code})' if job.error_code else ''}: "
                        f"{action.removeprefix('redriven (').removesuffix(')')}, finished chunks and checkpoints kept"
                        + (f"; {removed} DLQ message(s) of the job removed" if removed else ""))


def _retry_running(deps: Deps, job: Job, started: float, result: _Result) -> Retried:
    stuck = [c.chunk_id for c in deps.claims.for_job(job.job_id) if c.status in RESETTABLE]
    if not stuck:
        return result(False, f"nothing to retry: the job is running ({job.n_settled} of {job.chunk_count} chunks "
                             "settled) with no dead-lettered or failed chunk; a job without progress is reconciled "
                             "by the sweeper")
    actions = [reopen(deps, job.job_id, chunk_id) for chunk_id in stuck]
    sent = [c for c, a in zip(stuck, actions, strict=True) if a.startswith("redriven")]
    removed = _discard_dlq_copies(deps, job.job_id, set(sent), started)
    return result(bool(sent), f"reset and resent {len(sent)} of {len(stuck)} dead-lettered or failed chunk(s)"
                              + (f"; {removed} DLQ message(s) removed" if removed else ""))


def _retry_intake(deps: Deps, job: Job, result: _Result) -> Retried:
    """A job failed in intake: queue it again and resend its intake message from the intake DLQ."""
    found: QueueMessage | None = None
    if deps.queues.has(Queue.INTAKE_DLQ):
        for m in deps.queues.take_all(Queue.INTAKE_DLQ, visibility_s=30):
            ids = {m.attributes.get("job_id"), m.message_id, m.attributes.get("source_message_id")}
            if found is None and (job.job_id in ids or (job.source_message_id and job.source_message_id in ids)):
                found = m
            else:
                deps.queues.extend_visibility(Queue.INTAKE_DLQ, m.receipt_handle, 0)  # not ours: visible again
    if found is None:
        return result(False, "its intake message is no longer in the intake DLQ: submit the document again "
                             "(`review submit FILE` puts the job back to `queued` and sends it)")
    if not requeue_failed_intake(deps, job.job_id):
        deps.queues.extend_visibility(Queue.INTAKE_DLQ, found.receipt_handle, 0)
        return result(False, "dropped (job changed meanwhile)")
    deps.queues.send_intake(found.body)
    deps.queues.delete(Queue.INTAKE_DLQ, found.receipt_handle)
    return result(True, f"queued again: intake message {found.message_id} resent from the intake DLQ")


def _discard_dlq_copies(deps: Deps, job_id: str, chunk_ids: Collection[str] | None, sent_before: float) -> int:
    """Remove the job's (or those chunks') analysis DLQ messages sent before `sent_before`: the retry
    handled them. Every other message is made visible again at once."""
    if not deps.queues.has(Queue.ANALYSIS_DLQ):
        return 0
    removed = 0
    for m in deps.queues.take_all(Queue.ANALYSIS_DLQ, visibility_s=30):
        try:
            am = AnalysisMessage.model_validate_json(m.body)
            ours = am.job_id == job_id and (chunk_ids is None or am.chunk_id in chunk_ids) and m.sent_at <= sent_before
        except ValidationError:
            ours = False
        if ours:
            deps.queues.delete(Queue.ANALYSIS_DLQ, m.receipt_handle)
            removed += 1
        else:
            deps.queues.extend_visibility(Queue.ANALYSIS_DLQ, m.receipt_handle, 0)
    return removed


# ------------------------------------------------------------------------------ dlq redrive
def _permanent_intake_error(m: QueueMessage) -> str | None:
    """The code of a permanent input error recorded on an intake DLQ message, if it is one."""
    code = m.attributes.get("error_code")
    if code and m.attributes.get("error_class") == ErrorClass.PERMANENT.value:
        return code
    return None


def _redrive_one(deps: Deps, queue: Queue, m: QueueMessage, chunk_seen: set[tuple[str, str]],
                 force: bool) -> Redriven | None:
    entry = Redriven(message_id=m.message_id, queue=queue.value, action="resent")
    if queue is Queue.ANALYSIS:
        try:
            am = AnalysisMessage.model_validate_json(m.body)
        except ValidationError:
            return None  # not ours: left in the DLQ for a person
        key = (am.job_id, am.chunk_id)
        action = reopen(deps, *key) if key not in chunk_seen else "dropped (chunk already redriven)"
        chunk_seen.add(key)
        deps.jobs.record_event(am.job_id, "dlq.redriven", chunk_id=am.chunk_id, dlq_message_id=m.message_id,
                               action=action)
        entry.job_id, entry.chunk_id, entry.action = am.job_id, am.chunk_id, action
    elif queue is Queue.INTAKE:
        code = _permanent_intake_error(m)
        if code and not force:
            entry.action = (f"skipped: {code} is a permanent input error, so the same message fails the same way "
                            "unless what it points at changed (e.g. the document is now uploaded). Fix the message "
                            "and send it again, or redrive it with --force")
            entry.skipped = True
            return entry
        job_id = m.attributes.get("job_id")
        if job_id and requeue_failed_intake(deps, job_id):  # failed by the sweeper: intake takes it again
            entry.job_id = job_id
        deps.queues.send_intake(m.body)
        entry.action = f"resent (--force: it failed with {code} before)" if code else "resent"
    else:
        try:
            rm = ResultMessage.model_validate_json(m.body)
        except ValidationError:
            return None  # not ours: left in the DLQ for a person
        deps.queues.send_result(rm, rm.dedup_id(f":redrive:{m.message_id}"))
        entry.job_id = rm.job_id
    return entry


def dlq_redrive(deps: Deps, message_ids: set[str] | None = None, force: bool = False) -> list[Redriven]:
    """Re-inject DLQ messages (all when message_ids is None) with a fresh attempt budget.

    Intake messages that failed with a permanent input error are skipped (returned with
    `skipped=True` and the reason) unless `force`. Every message left in a DLQ is made visible
    again at once (taking them all hid them)."""
    done: list[Redriven] = []
    chunk_seen: set[tuple[str, str]] = set()
    for queue, dlq in ((Queue.ANALYSIS, Queue.ANALYSIS_DLQ), (Queue.INTAKE, Queue.INTAKE_DLQ),
                       (Queue.RESULTS, Queue.RESULTS_DLQ)):
        if not deps.queues.has(dlq):
            continue
        for m in deps.queues.take_all(dlq, visibility_s=30):
            entry = None
            if message_ids is None or m.message_id in message_ids:
                entry = _redrive_one(deps, queue, m, chunk_seen, force)
            if entry is not None:
                done.append(entry)
            if entry is None or entry.skipped:
                deps.queues.extend_visibility(dlq, m.receipt_handle, 0)  # left for a person: visible again
            else:
                deps.queues.delete(dlq, m.receipt_handle)
    return done
