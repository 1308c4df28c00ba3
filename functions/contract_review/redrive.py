"""Redrive: re-inject DLQ messages with a fresh attempt budget, reopening ended jobs, leaving an
audit event. Works on moto (no StartMessageMoveTask): receive, re-send, delete. A permanent input
error is not resent without `force` (it would fail the same way)."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from .chunks import analysis_message
from .errors import ErrorClass
from .messages import AnalysisMessage, ResultMessage
from .ports import Deps, Queue, QueueMessage
from .records import ChunkRecord, ChunkStatus, JobState

REOPENABLE = (JobState.FAILED, JobState.DEAD_LETTERED)


class Redriven(BaseModel):
    message_id: str
    queue: str
    action: str
    job_id: str | None = None
    chunk_id: str | None = None
    skipped: bool = False  # left in the DLQ (see `action` for why)


def reopen(deps: Deps, job_id: str, chunk_id: str) -> str:
    """Give a dead-lettered or failed chunk a fresh attempt budget and put its job back to work.

    A job that had ended (`dead_lettered` / `failed`) is reconciled as a whole: every failed or
    dead-lettered chunk is reset, every chunk that is not done gets a fresh message (also chunks a
    job-fatal error left unstarted), and the settled set is rebuilt from the chunk records."""
    job = deps.jobs.get(job_id)
    if job is None:
        return "dropped (no such job)"
    if job.state is not JobState.RUNNING and job.state not in REOPENABLE:
        return f"dropped (job is {job.state.value})"
    running = job.state is JobState.RUNNING
    current = deps.claims.get(job_id, chunk_id)
    targets = [current] if running and current else [] if running else deps.claims.for_job(job_id)
    for c in targets:
        if c.status in (ChunkStatus.FAILED, ChunkStatus.DEAD_LETTERED):
            deps.claims.reset_for_redrive(job_id, c.chunk_id)
    todo: list[ChunkRecord]
    if running:
        current = deps.claims.get(job_id, chunk_id)
        if current is None or current.status is not ChunkStatus.PENDING:
            return f"dropped (chunk is {current.status.value if current else None})"
        deps.jobs.unsettle_chunks(job_id, [chunk_id])
        todo = [current]
    else:
        records = deps.claims.for_job(job_id)
        done = {c.chunk_id for c in records if c.status is ChunkStatus.DONE}
        todo = [c for c in records if c.status is not ChunkStatus.DONE]
        if deps.jobs.transition(job_id, (job.state,), JobState.RUNNING, reopen_settled=done) is None:
            return "dropped (job changed meanwhile)"
        deps.jobs.record_event(job_id, "job.reopened", from_state=job.state.value, chunks_resent=len(todo))
    text = deps.artifacts.get_text(job.document_key)
    deps.queues.send_analysis([analysis_message(deps, job, c, "redrive", text) for c in todo])
    return f"redriven ({len(todo)} chunk(s) sent)"


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
