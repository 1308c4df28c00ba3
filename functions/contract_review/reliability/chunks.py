"""What several use cases do to a chunk, written once: build its analysis message (the one place an
`AnalysisMessage` is made: at fan-out and when it is rebuilt from the stored document), announce that
it settled (the results message and its dedup id), dead-letter it, requeue it under backpressure, and
decide when its backpressure has lasted too long."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from contract_review.domain.chunk_records import ChunkRecord, ReleaseReason, Spent
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.policy import bounded_by_deadline, is_backpressure
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Job
from contract_review.reliability.retry import requeue_delay_s


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


def chunk_message(deps: Deps, job: Job, chunk: ChunkRecord, chunk_text: str, reason: str) -> AnalysisMessage:
    """The analysis message of a chunk, its text given (`chunk_text`: the chunk's own slice)."""
    return AnalysisMessage(job_id=job.job_id, chunk_id=chunk.chunk_id, chunk_index=chunk.chunk_index,
                           chunk_count=job.chunk_count, start=chunk.start, end=chunk.end, text=chunk_text,
                           attempt=chunk.failures + 1, max_attempts=deps.settings.profile.recovery.poison_budget,
                           checkpoint_version=job.config_hash, reason=reason)


def analysis_message(deps: Deps, job: Job, chunk: ChunkRecord, reason: str, text: str | None = None) -> AnalysisMessage:
    """A fresh analysis message for a chunk, rebuilt from the stored document (`text`: the whole document,
    when the caller has it already)."""
    text = deps.artifacts.get_text(job.document_key) if text is None else text
    return chunk_message(deps, job, chunk, text[chunk.start:chunk.end], reason)


def requeue_reason(env: ErrorEnvelope) -> str:
    """A requeue's reason: the backpressure error itself, or the throttle behind a spent budget."""
    if env.error_code == "runtime.retry_budget_exhausted" and env.cause_code:
        return env.cause_code
    return env.error_code


@dataclass(frozen=True)
class Requeued:
    delay_s: int
    reason: str
    streak: int  # the chunk's backpressure requeues since its last progress


def requeue(deps: Deps, msg: AnalysisMessage, record: ChunkRecord | None, fence: int, env: ErrorEnvelope, *,
            by: str, stats: AttemptStats | None = None, rng: random.Random | None = None, clean: bool = False,
            resume_from: list[str] | None = None, lapsed_before: float | None = None,
            on_sent: Callable[[], None] | None = None, fold: Mapping[str, Spent] | None = None,
            **detail: object) -> Requeued | ErrorEnvelope | None:
    """The one backpressure requeue (worker and sweeper): release the chunk without a failure and send a
    fresh copy of its message, delayed by the streak's backoff (at once when `clean`: the attempt made
    progress and no error drove it; never before the envelope's retry_after_s, up to the longest delay), with a
    `chunk.requeued` event. A cause the deadline does not bound (a hold) is released `held`: it ends the streak.

    Returns the `runtime.backpressure_exhausted` envelope, having written nothing, when the chunk's
    backpressure has lasted its deadline without progress (the caller dead-letters it); None when the
    fence moved on (the chunk is someone else's); else what was sent. `on_sent` runs right after the send (the
    sweeper removes the DLQ copy the new message replaces). `fold`: the record's running spend as read, when the
    caller ends a fence that is not its own (`ClaimsRepo.release`)."""
    if not is_backpressure(env):
        raise ValueError(f"{env.error_code} is not backpressure (domain/policy.py): not requeued without a failure")
    if record is not None:
        exhausted = backpressure_exhausted(deps, record, env, deps.clock())
        if exhausted is not None:
            return exhausted
    held = not bounded_by_deadline(env)  # a hold (a pause, the daily quota): outside the backpressure streak
    released = deps.claims.release(msg.job_id, msg.chunk_id, fence, stats or AttemptStats(), env, failure=False,
                                   lapsed_before=lapsed_before,
                                   reason=ReleaseReason.HELD if held else ReleaseReason.BACKPRESSURE, fold=fold)
    if released is None:
        return None
    streak = record.backpressure_requeues if record else 0
    delay = 0 if clean else requeue_delay_s(deps.settings.profile, streak, rng or random.Random(), env.retry_after_s)
    reason = requeue_reason(env)
    deps.queues.send_analysis([msg.requeued(reason, released.backpressure_requeues, resume_from)], delay_s=delay)
    if on_sent is not None:
        on_sent()
    deps.jobs.count_requeue(msg.job_id)
    deps.jobs.record_event(msg.job_id, "chunk.requeued", chunk_id=msg.chunk_id, reason=reason, by=by, delay_s=delay,
                           streak_requeues=released.backpressure_requeues, **detail)
    return Requeued(delay, reason, released.backpressure_requeues)


def backpressure_exhausted(deps: Deps, chunk: ChunkRecord, cause: ErrorEnvelope, now: float) -> ErrorEnvelope | None:
    """The `runtime.backpressure_exhausted` envelope when the chunk's backpressure streak (no progress
    since `backpressure_since`) has lasted the profile's deadline; None while it may be requeued again, and
    always for a cause the recovery policy does not bound (an operator's pause)."""
    deadline = deps.settings.profile.recovery.backpressure_deadline_s
    since = chunk.backpressure_since
    if since is None or now - since < deadline or not bounded_by_deadline(cause):
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
                by: str, lapsed_before: float | None = None, fold: Mapping[str, Spent] | None = None
                ) -> ChunkRecord | None:
    """Put the chunk's message on the analysis DLQ with the envelope (and the fence it was decided
    under), then settle the chunk `dead_lettered` (fenced) and announce it. None when the fence moved
    on (someone else owns the chunk).

    The DLQ copy goes first: a crash between the two steps leaves a DLQ message whose chunk is not
    settled, which the sweeper settles (`sweeper._explain_dlq`, same fence only), so a dead-lettered
    chunk always has a DLQ message to redrive. The other order could leave a dead-lettered chunk with
    none. A copy sent by an owner that then lost the chunk names a fence that is no longer current
    and is never acted on. `fold`: as for `requeue`."""
    if deps.queues.has(Queue.ANALYSIS_DLQ):
        deps.queues.dead_letter(Queue.ANALYSIS, msg.model_dump_json(), envelope, job_id=msg.job_id,
                                chunk_id=msg.chunk_id, fence=str(fence))
    settled = deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.DEAD_LETTERED, stats,
                                 error=envelope, lapsed_before=lapsed_before, fold=fold)
    if settled is None:
        return None
    deps.jobs.record_event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id,
                           error_code=envelope.error_code, by=by)
    announce(deps, settled)
    return settled
