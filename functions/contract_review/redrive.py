"""Redrive: re-inject DLQ messages with a fresh attempt budget, reopening ended jobs, leaving an
audit event. Works on moto (no StartMessageMoveTask): receive, re-send, delete."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from .chunks import analysis_message
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


def _redrive_one(deps: Deps, queue: Queue, m: QueueMessage, chunk_seen: set[tuple[str, str]]) -> Redriven | None:
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
        deps.queues.send_intake(m.body)
    else:
        try:
            rm = ResultMessage.model_validate_json(m.body)
        except ValidationError:
            return None  # not ours: left in the DLQ for a person
        deps.queues.send_result(rm, rm.dedup_id(f":redrive:{m.message_id}"))
        entry.job_id = rm.job_id
    return entry


def dlq_redrive(deps: Deps, message_ids: set[str] | None = None) -> list[Redriven]:
    """Re-inject DLQ messages (all when message_ids is None) with a fresh attempt budget."""
    done: list[Redriven] = []
    chunk_seen: set[tuple[str, str]] = set()
    for queue, dlq in ((Queue.ANALYSIS, Queue.ANALYSIS_DLQ), (Queue.INTAKE, Queue.INTAKE_DLQ),
                       (Queue.RESULTS, Queue.RESULTS_DLQ)):
        if not deps.queues.has(dlq):
            continue
        for m in deps.queues.take_all(dlq, visibility_s=30):
            if message_ids is not None and m.message_id not in message_ids:
                continue
            entry = _redrive_one(deps, queue, m, chunk_seen)
            if entry is None:
                continue
            deps.queues.delete(dlq, m.receipt_handle)
            done.append(entry)
    return done
