"""What several use cases do to a chunk, written once: rebuild its analysis message from the
stored document, announce that it settled (the results message and its dedup id), dead-letter
it, and decide when its backpressure has lasted too long."""

from __future__ import annotations

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, ChunkRecord, ChunkStatus, Job


def settled_result(record: ChunkRecord) -> ResultMessage:
    """The results message of a settled chunk record."""
    done = record.status is ChunkStatus.DONE
    return ResultMessage(job_id=record.job_id, chunk_id=record.chunk_id, chunk_index=record.chunk_index,
                         status=record.status, fence=record.fence,
                         findings_key=record.findings_key if done else None,
                         error=None if done else record.last_error)


def announce(deps: Deps, record: ChunkRecord, nonce: str = "") -> None:
    """(Re-)send the results message of a settled chunk. The dedup id is stable and the aggregator
    settles idempotently, so a second copy is harmless; a nonce forces a resend past FIFO dedup."""
    msg = settled_result(record)
    deps.queues.send_result(msg, msg.dedup_id(nonce))


def analysis_message(deps: Deps, job: Job, chunk: ChunkRecord, reason: str, text: str | None = None) -> AnalysisMessage:
    """A fresh analysis message for a chunk, rebuilt from the stored document."""
    text = deps.artifacts.get_text(job.document_key) if text is None else text
    return AnalysisMessage(job_id=job.job_id, chunk_id=chunk.chunk_id, chunk_index=chunk.chunk_index,
                           chunk_count=job.chunk_count, start=chunk.start, end=chunk.end,
                           text=text[chunk.start:chunk.end], attempt=chunk.failures + 1,
                           max_attempts=deps.settings.profile.poison_budget, checkpoint_version=job.config_hash,
                           reason=reason)


def backpressure_exhausted(deps: Deps, chunk: ChunkRecord, cause: ErrorEnvelope, now: float) -> ErrorEnvelope | None:
    """The `runtime.backpressure_exhausted` envelope when the chunk's backpressure streak (no progress
    since `backpressure_since`) has lasted the profile's deadline; None while it may be requeued again."""
    deadline = deps.settings.profile.backpressure_deadline_s
    since = chunk.backpressure_since
    if since is None or now - since < deadline:
        return None
    return ErrorEnvelope.of(
        "runtime.backpressure_exhausted",
        f"no progress for {_duration(now - since)} under backpressure (deadline {_duration(deadline)}): "
        f"{chunk.backpressure_requeues} requeue(s) since the last checkpoint; last {cause.error_code}"
        + (f" ({cause.cause_code})" if cause.cause_code else ""),
        cause_code=cause.cause_code or cause.error_code, http_status=cause.http_status,
        provider_code=cause.provider_code, step=cause.step, first_seen_at=since, last_seen_at=now)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def dead_letter(deps: Deps, msg: AnalysisMessage, fence: int, envelope: ErrorEnvelope, stats: AttemptStats, *,
                by: str, lapsed_before: float | None = None) -> ChunkRecord | None:
    """Put the chunk's message on the analysis DLQ with the envelope (and the fence it was decided
    under), then settle the chunk `dead_lettered` (fenced) and announce it. None when the fence moved
    on (someone else owns the chunk).

    The DLQ copy goes first: a crash between the two steps leaves a DLQ message whose chunk is not
    settled, which the sweeper settles (`sweeper._explain_dlq`, same fence only), so a dead-lettered
    chunk always has a DLQ message to redrive. The other order could leave a dead-lettered chunk with
    none. A copy sent by an owner that then lost the chunk names a fence that is no longer current
    and is never acted on."""
    if deps.queues.has(Queue.ANALYSIS_DLQ):
        deps.queues.dead_letter(Queue.ANALYSIS, msg.model_dump_json(), envelope, job_id=msg.job_id,
                                chunk_id=msg.chunk_id, fence=str(fence))
    settled = deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.DEAD_LETTERED, stats,
                                 error=envelope, lapsed_before=lapsed_before)
    if settled is None:
        return None
    deps.jobs.record_event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id,
                           error_code=envelope.error_code, by=by)
    announce(deps, settled)
    return settled
