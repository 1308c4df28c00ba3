"""Sweeper: recover chunks whose worker died, explain messages that reached the DLQ, and
reconcile jobs that stopped making progress.

1. Lapsed claims (lease expired, not settled): re-enqueue a fresh message, counting a
   `runtime.worker_lost` failure; once the poison budget is used, dead-letter the chunk. A lease
   that lapsed after the claiming invocation's deadline (`deadline_at`) belongs to a Lambda that
   reached its function timeout, not to a crash: it is released as backpressure
   (`runtime.time_exhausted`, no failure), bounded by the backpressure deadline.
2. Analysis DLQ messages whose chunk is not settled (the queue moved them after maxReceiveCount,
   e.g. the worker was killed on every receive): mark the chunk dead-lettered and settle it.
3. Stalled jobs (`running`, no progress for `stall_after_s`): re-send the results of settled
   chunks the job has not counted, and a fresh message for pending chunks nobody holds, except
   those released within the stall period (a backpressure requeue's delayed message or a tier-2
   retry is on its way: re-sending would multiply calls on a throttled model).
Every chunk write is conditional on the fencing token the sweeper observed *and* on the lease
still being lapsed, so a heartbeat or a new claim since the sweeper's read wins harmlessly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pydantic import ValidationError

from .chunks import analysis_message, announce, backpressure_exhausted, dead_letter
from .errors import ErrorEnvelope
from .messages import AnalysisMessage
from .ports import Deps, Queue, QueueMessage
from .records import AttemptStats, ChunkRecord, ChunkStatus, Job, ReleaseReason
from .retry import requeue_delay_s


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)  # lost workers' chunks (a failure counted)
    timed_out: list[str] = field(default_factory=list)  # function timeouts' chunks, requeued without a failure
    dead_lettered: list[str] = field(default_factory=list)
    dlq_seen: int = 0
    reconciled: list[str] = field(default_factory=list)  # job ids
    stalled_jobs: int = 0  # running jobs without progress for stall_after_s that this sweep found

    @property
    def backpressure_requeues(self) -> int:
        """Requeues this sweep made that count as backpressure (metric `BackpressureRequeues`)."""
        return len(self.timed_out)


class _JobCache:
    """Jobs read once per sweep."""

    def __init__(self, deps: Deps):
        self.deps = deps
        self._jobs: dict[str, Job | None] = {}

    def open(self, job_id: str) -> Job | None:
        """The job, unless it is gone or has ended."""
        if job_id not in self._jobs:
            self._jobs[job_id] = self.deps.jobs.get(job_id)
        job = self._jobs[job_id]
        return job if job is not None and not job.terminal else None


def sweep(deps: Deps, now: float | None = None) -> SweepReport:
    now = deps.clock() if now is None else now
    report = SweepReport()
    jobs = _JobCache(deps)
    for claim in list(deps.claims.lapsed(now)):
        _recover_lapsed(deps, jobs.open(claim.job_id), claim, now, report)
    _explain_dlq(deps, report, jobs)
    _reconcile_stalled(deps, now, report)
    return report


def timed_out(claim: ChunkRecord, lease_s: float) -> bool:
    """The lease lapsed because its Lambda invocation reached its timeout, not because it crashed.

    A live worker heartbeats every lease/3, so the lease of one killed at its deadline D expires
    after D + 2/3 lease; a crash at time c leaves at most c + lease. Half a lease past D tells them
    apart (a crash in the last half lease before D counts as a timeout)."""
    return claim.deadline_at is not None and (claim.claim_expires_at or 0.0) >= claim.deadline_at + lease_s / 2


def _recover_lapsed(deps: Deps, job: Job | None, claim: ChunkRecord, now: float, report: SweepReport) -> None:
    none = AttemptStats()
    if job is None:  # the job ended: just free the lease
        deps.claims.release(claim.job_id, claim.chunk_id, claim.fence, none, None, failure=False, lapsed_before=now,
                            reason=ReleaseReason.JOB_ENDED)
        return
    msg = analysis_message(deps, job, claim, "sweeper")  # built before any write: a failed read changes nothing
    if timed_out(claim, deps.settings.profile.claim_lease_s):
        _requeue_timed_out(deps, claim, msg, now, report)
        return
    env = ErrorEnvelope.of("runtime.worker_lost", f"lease held by {claim.claimed_by} lapsed",
                           step="sweeper", attempt=claim.failures + 1)
    if claim.failures + 1 >= deps.settings.profile.poison_budget:
        if dead_letter(deps, msg, claim.fence, claim.last_error or env, none, by="sweeper",
                       lapsed_before=now) is not None:
            report.dead_lettered.append(claim.chunk_id)
        return
    if deps.claims.release(claim.job_id, claim.chunk_id, claim.fence, none, env, failure=True,
                           lapsed_before=now, reason=ReleaseReason.WORKER_LOST) is not None:
        deps.queues.send_analysis([msg.model_copy(update={"attempt": msg.attempt + 1})])  # the lost one counted
        deps.jobs.record_event(claim.job_id, "chunk.requeued", chunk_id=claim.chunk_id, reason="runtime.worker_lost",
                               by="sweeper", lapsed_for_s=round(now - (claim.claim_expires_at or now), 3))
        report.requeued.append(claim.chunk_id)


def _requeue_timed_out(deps: Deps, claim: ChunkRecord, msg: AnalysisMessage, now: float, report: SweepReport) -> None:
    """A function timeout is backpressure, not a failure: release and requeue with a delay, unless
    the chunk's backpressure has lasted the deadline without progress (then dead-letter it)."""
    env = ErrorEnvelope.of("runtime.time_exhausted",
                           f"the invocation of {claim.claimed_by} reached its function timeout holding the chunk",
                           step="sweeper", attempt=claim.failures + 1)
    exhausted = backpressure_exhausted(deps, claim, env, now)
    if exhausted is not None:
        if dead_letter(deps, msg, claim.fence, exhausted, AttemptStats(), by="sweeper", lapsed_before=now) is not None:
            report.dead_lettered.append(claim.chunk_id)
        return
    released = deps.claims.release(claim.job_id, claim.chunk_id, claim.fence, AttemptStats(), env, failure=False,
                                   lapsed_before=now, reason=ReleaseReason.BACKPRESSURE)
    if released is None:
        return
    delay = requeue_delay_s(deps.settings.profile, claim.backpressure_requeues, random.Random())
    deps.queues.send_analysis([msg.model_copy(update={"requeues": released.backpressure_requeues,
                                                      "reason": "runtime.time_exhausted"})], delay_s=delay)
    deps.jobs.count_requeue(claim.job_id)
    deps.jobs.record_event(claim.job_id, "chunk.requeued", chunk_id=claim.chunk_id, reason="runtime.time_exhausted",
                           by="sweeper", delay_s=delay, deadline_at=claim.deadline_at,
                           streak_requeues=released.backpressure_requeues)
    report.timed_out.append(claim.chunk_id)


def _explain_dlq(deps: Deps, report: SweepReport, jobs: _JobCache) -> None:
    if not deps.queues.has(Queue.ANALYSIS_DLQ):
        return
    for m in deps.queues.peek(Queue.ANALYSIS_DLQ):
        report.dlq_seen += 1
        chunk_id = _settle_dead_lettered(deps, m, jobs)
        if chunk_id:
            report.dead_lettered.append(chunk_id)


def _settle_dead_lettered(deps: Deps, m: QueueMessage, jobs: _JobCache) -> str | None:
    """A chunk message in the DLQ whose chunk is not settled: settle it `dead_lettered`."""
    try:
        msg = AnalysisMessage.model_validate_json(m.body)
    except ValidationError:
        return None  # not a chunk message; `review dlq list` shows it as such
    chunk = deps.claims.get(msg.job_id, msg.chunk_id)
    if chunk is None or chunk.settled:
        return None
    if chunk.redriven_at >= m.sent_at:
        return None  # an operator redrove this chunk after the message was dead-lettered
    if jobs.open(msg.job_id) is None:
        return None
    now = deps.clock()
    if chunk.lease_live(now):
        return None  # someone is working on it right now
    env = chunk.last_error or ErrorEnvelope.of("runtime.worker_lost", "message reached the DLQ with no error recorded",
                                               step="sweeper")
    settled = deps.claims.finish(msg.job_id, msg.chunk_id, chunk.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(),
                                 error=env, states=(ChunkStatus.PENDING, ChunkStatus.CLAIMED), lapsed_before=now)
    if settled is None:
        return None
    deps.jobs.record_event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id, error_code=env.error_code,
                           by="sweeper", dlq_message_id=m.message_id)
    announce(deps, settled)
    return msg.chunk_id


def _reconcile_stalled(deps: Deps, now: float, report: SweepReport) -> None:
    stall_s = deps.settings.profile.stall_after_s
    for job in deps.jobs.stalled(now - stall_s):
        report.stalled_jobs += 1
        resent = requeued = 0
        text: str | None = None
        for c in deps.claims.for_job(job.job_id):
            if c.settled:
                if c.chunk_id not in job.settled:
                    announce(deps, c, nonce=f":reconcile:{int(now)}")  # new dedup id
                    resent += 1
            elif c.status is ChunkStatus.PENDING and not c.message_on_its_way(now, stall_s):
                # nobody holds it, and no requeue or retry of it is on its way: its message may be lost
                text = deps.artifacts.get_text(job.document_key) if text is None else text
                deps.queues.send_analysis([analysis_message(deps, job, c, "reconcile", text)])
                requeued += 1
        deps.jobs.touch(job.job_id)  # the next reconcile waits another stall period
        if resent or requeued:
            deps.jobs.record_event(job.job_id, "job.reconciled", results_resent=resent, chunks_requeued=requeued,
                                   by="sweeper")
            report.reconciled.append(job.job_id)
