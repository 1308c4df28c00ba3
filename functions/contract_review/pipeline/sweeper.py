"""Sweeper: recover chunks whose worker died, explain messages that reached the DLQ, and
reconcile jobs that stopped making progress.

1. Lapsed claims (lease expired, not settled): re-enqueue a fresh message, counting a
   `runtime.worker_lost` failure; once the poison budget is used, dead-letter the chunk. A lease
   that lapsed after the claiming invocation's deadline (`deadline_at`) belongs to a Lambda that
   reached its function timeout, not to a crash: it is released as backpressure
   (`runtime.time_exhausted`, no failure), bounded by the backpressure deadline.
2. Analysis DLQ messages whose chunk is not settled (nobody holds it):
   - a copy the pipeline dead-lettered (it carries an envelope) whose settling never happened (a
     crash between `chunks.dead_letter`'s two steps): the chunk is settled `dead_lettered` as
     decided, if the copy's fence is still the chunk's and nobody released the chunk since;
   - a message the queue moved after maxReceiveCount while the chunk still has attempt budget
     (receives burned without failed attempts: Lambda throttling, errors before the claim): not a
     dead letter. It is sent again as backpressure (`runtime.receives_exhausted`, delayed, no
     failure counted, bounded by the backpressure deadline) and removed from the DLQ. With the
     budget used up the chunk is dead-lettered.
   A DLQ copy nothing will act on any more (its chunk finished or was redriven since; a pipeline
   copy whose decision lost to the chunk's owner) is removed, so the DLQ holds only what needs a person.
3. Queued jobs whose intake message the queue moved to the intake DLQ (intake never finished it):
   failed with `runtime.intake_exhausted`, the DLQ copy replaced by one naming the job and the
   error, so `review retry JOB` or `review dlq redrive` can put it back to `queued` and resend it.
4. Stalled jobs (`running`, no progress for `stall_after_s`): re-send the results of settled
   chunks the job has not counted, and a fresh message for pending chunks nobody holds whose
   message can really be lost (`message_lost`). A backlog is not a loss: a message waiting behind
   other jobs' chunks stays in the queue until its retention ends, so re-sending it only doubles
   the backlog. SQS loses a chunk's message in three ways: a crash between writing the chunk record
   and sending (the record says when its message was sent, written before the send); the retention
   period running out; a move to the DLQ after maxReceiveCount receives (step 2). So a pending
   chunk is re-sent only when its message was sent (or released for a tier-2 retry) more than a
   stall period ago and either its retention ends before the next look, or the analysis queue held
   no message at all when this sweep began (visible, in flight or delayed: read first, before the
   sweep sends anything or reads a chunk record). A job whose chunks are all settled and counted but that still runs (its finalize
   failed) is finalized again; a running job whose fan-out stalled (whoever was to send its next page died first)
   gets that page.
5. The stack's daily spend cap (domain/spend_cap.py): today's spend read (the handler publishes it), the spend-cap
   hold set in the runtime control once the day's recorded spend reached the cap, and the jobs intake held
   `queued` for the cap started once they are admitted (`intake.start_held`: a new UTC day, an operator's override).
6. The model's Bedrock quotas (`publish_quotas`): read from Service Quotas each sweep and published for the workers
   (adapters/published_quotas.py) when they changed; the workers pace to them and never read Service Quotas.
Every chunk write is conditional on the fencing token the sweeper observed *and* on the lease
still being lapsed, so a heartbeat or a new claim since the sweeper's read wins harmlessly.

A sweep ends in time to say what it found: the scheduled Lambda's sweep has a `Deadline` (the invocation's remaining
time, less `functions.sweeper_reserve_s`); past it, the sweep starts no further item (the next sweep takes them up:
every step is safe to repeat), but the stalled jobs are still counted (one query), so `StuckJobs` is published with
what this sweep found even when it could not act on all of it. Without the deadline a sweep the function's timeout cut
short would publish nothing, and the stuck-jobs alarm reads silence as "the sweeper is not running" (`stopped_at` in
the report and the sweeper's log says where it stopped).

One item never blocks the others: an item whose handling raises (a missing document object, a
throttled write) is logged, counted in `item_failures` (metric `SweepItemFailures`, alarmed), and the sweep goes on.

The batch lane is not the sweeper's: the batch collector is its own scheduled function (pipeline/collector.py), so
a run holding a large batch job never delays these recovery steps. It touches each job whose chunks wait in batch jobs
every run, so the stall reconciler does not take such a job for stalled while the collector runs; a job it has not
touched for `stall_after_s` (the collector down) is counted stuck (`StuckJobs`), its parked chunks left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from pydantic import ValidationError

from contract_review.domain import lifecycle, spend_cap
from contract_review.domain.chunk_records import ChunkRecord, ReleaseReason
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.policy import is_backpressure
from contract_review.domain.ports import Deps, Queue, QueueMessage
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobFailure, JobState, job_id_for
from contract_review.pipeline import fanout
from contract_review.pipeline.aggregator import finalize
from contract_review.pipeline.intake import failure_key, start_held
from contract_review.pipeline.isolation import isolated
from contract_review.reliability.chunks import analysis_message, announce, dead_letter, requeue
from contract_review.sideeffects import saga


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)  # lost workers' chunks (a failure counted)
    timed_out: list[str] = field(default_factory=list)  # function timeouts' chunks, requeued without a failure
    dead_lettered: list[str] = field(default_factory=list)
    dlq_seen: int = 0
    dlq_removed: int = 0  # DLQ copies nothing would act on any more (chunk done, redriven, decision superseded)
    reconciled: list[str] = field(default_factory=list)  # job ids
    stalled_jobs: int = 0  # running jobs without progress for stall_after_s that this sweep found
    # chunks whose message the queue moved to the DLQ with attempt budget left: sent again (backpressure)
    dlq_requeued: list[str] = field(default_factory=list)
    finalized: list[str] = field(default_factory=list)  # stalled jobs, every chunk settled and counted, ended now
    intake_failed: list[str] = field(default_factory=list)  # queued jobs whose intake message reached the DLQ
    item_failures: list[str] = field(default_factory=list)  # "step:item" that raised (logged; the sweep went on)
    # jobs waiting for approval past their expires_at: failed (job.approval_expired), side effects compensated
    approvals_expired: list[str] = field(default_factory=list)
    chunks_resent: int = 0  # stalled jobs' pending chunks whose message was lost (`message_lost`): sent again
    # the stack's daily spend cap (domain/spend_cap.py): today's admitted and recorded spend (None: no cap, or not
    # read), whether the model is held for it, and the jobs held at admission that this sweep started
    spend_admitted_micro_usd: int | None = None
    spend_recorded_micro_usd: int | None = None
    spend_held: bool = False
    spend_cap_started: list[str] = field(default_factory=list)
    stopped_at: str | None = None  # the step where the sweep reached its deadline: the rest is the next sweep's
    quotas_published: bool = False  # the model's quotas changed in Service Quotas and were published (step 6)

    @property
    def backpressure_requeues(self) -> int:
        """Requeues this sweep made that count as backpressure (metric `BackpressureRequeues`)."""
        return len(self.timed_out)


@dataclass
class Deadline:
    """When a sweep stops starting items: once `time_left_s()` (the Lambda invocation's remaining time) is under
    `reserve_s`, the time kept for counting the stalled jobs and publishing the metrics. Without `time_left_s`
    (the CLI, a Fargate poller's sweep of claims) never. Once reached it stays reached, and says at which step."""

    time_left_s: Callable[[], float] | None = None
    reserve_s: float = 0.0
    stopped_at: str | None = None

    def reached(self, step: str) -> bool:
        if self.stopped_at is None and self.time_left_s is not None and self.time_left_s() < self.reserve_s:
            self.stopped_at = step
        return self.stopped_at is not None


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


def _isolated(report: SweepReport, step: str, item: str) -> AbstractContextManager[None]:
    """Run one item of a sweep: an exception is logged ("sweep item failed") and counted, never stops the sweep."""
    return isolated(report.item_failures, "sweep", step, item)


def sweep(deps: Deps, now: float | None = None, deadline: Deadline | None = None) -> SweepReport:
    """The scheduled sweeper Lambda's sweep: all of the above (the recovery steps only; no batch work), then the
    model's quotas published (`publish_quotas`), starting no item past `deadline` but counting the stalled jobs
    whatever the time."""
    now = deps.clock() if now is None else now
    deadline = deadline or Deadline()
    report = SweepReport()
    jobs = _JobCache(deps)
    queued: int | None = None  # the analysis queue's depth before this sweep sends anything (`message_lost`)
    with _isolated(report, "reconcile", "depth"):
        queued = deps.queues.depth(Queue.ANALYSIS)
    _recover_lapsed_claims(deps, now, report, jobs, deadline)
    _explain_dlq(deps, report, jobs, deadline)
    _explain_intake_dlq(deps, now, report, deadline)
    _reconcile_stalled(deps, now, report, queued, deadline)
    _spend_cap(deps, now, report, deadline)
    if deps.side_effects is not None and not deadline.reached("approvals"):
        with _isolated(report, "approvals", "expire"):
            report.approvals_expired = saga.expire_approvals(deps, now)
    if not deadline.reached("quotas"):
        publish_quotas(deps, report)
    report.stopped_at = deadline.stopped_at
    return report


def publish_quotas(deps: Deps, report: SweepReport) -> None:
    """Step 6: read the model's Bedrock quotas (Service Quotas, through `deps.read_quotas`) and publish them for the
    workers when they changed (`QuotaStore.publish`: nothing written when unchanged; two sweepers at once write once). Last, so
    the recovery steps never wait for it (and not past the sweep's deadline: the next sweep reads them). The only reader of Service Quotas in the pipeline: the workers pace to what
    is published (model/quota_targets.py). A read that fails is an item failure (logged, `SweepItemFailures`): the
    published quotas stay as they were, and the workers keep pacing to them."""
    if deps.read_quotas is None or deps.published_quotas is None:  # the offline model has no quota
        return
    with _isolated(report, "quotas", deps.settings.effective_model_id):
        report.quotas_published = deps.published_quotas.publish(deps.read_quotas())


def sweep_claims(deps: Deps, now: float | None = None) -> SweepReport:
    """Step 1 only (lapsed claims), what a Fargate poller sweeps in-process: a query of the sparse lease index,
    whose size is the claims held at this moment, not the jobs kept. Jobs (the DLQs, stalled, cancelling,
    compensating, waiting and queued jobs) are the scheduled sweeper Lambda's alone."""
    now = deps.clock() if now is None else now
    report = SweepReport()
    _recover_lapsed_claims(deps, now, report, _JobCache(deps), Deadline())
    return report


def _recover_lapsed_claims(deps: Deps, now: float, report: SweepReport, jobs: _JobCache, deadline: Deadline) -> None:
    lapsed: list[ChunkRecord] = []
    with _isolated(report, "lapsed", "query"):
        lapsed = list(deps.claims.lapsed(now))
    for claim in lapsed:
        if deadline.reached("lapsed"):
            return
        with _isolated(report, "lapsed", f"{claim.job_id}/{claim.chunk_id}"):
            _recover_lapsed(deps, jobs.open(claim.job_id), claim, now, report)


def timed_out(claim: ChunkRecord, lease_s: float) -> bool:
    """The lease lapsed because its Lambda invocation reached its timeout, not because it crashed.

    A live worker heartbeats every lease/3, so the lease of one killed at its deadline D expires
    after D + 2/3 lease; a crash at time c leaves at most c + lease. Half a lease past D tells them
    apart (a crash in the last half lease before D counts as a timeout)."""
    return claim.deadline_at is not None and (claim.claim_expires_at or 0.0) >= claim.deadline_at + lease_s / 2


def _recover_lapsed(deps: Deps, job: Job | None, claim: ChunkRecord, now: float, report: SweepReport) -> None:
    """Every write here ends the lapsed fence for an attempt that died: it folds in the attempt's running spend as
    last written (`fold`), once."""
    none, fold = AttemptStats(), claim.spend
    if job is None:  # the job ended: just free the lease
        deps.claims.release(claim.job_id, claim.chunk_id, claim.fence, none, None, failure=False, lapsed_before=now,
                            reason=ReleaseReason.JOB_ENDED, fold=fold)
        return
    msg = analysis_message(deps, job, claim, "sweeper")  # built before any write: a failed read changes nothing
    if timed_out(claim, deps.settings.profile.recovery.claim_lease_s):
        env = ErrorEnvelope.of("runtime.time_exhausted",
                               f"the invocation of {claim.claimed_by} reached its function timeout holding the chunk",
                               step="sweeper", attempt=claim.failures + 1)
    else:
        env = ErrorEnvelope.of("runtime.worker_lost", f"lease held by {claim.claimed_by} lapsed",
                               step="sweeper", attempt=claim.failures + 1)
    if is_backpressure(env):  # the code's row in the recovery policy: a function timeout is (a handoff)
        _requeue_backpressure(deps, claim, msg, env, now, report)
        return
    if claim.failures + 1 >= deps.settings.profile.recovery.poison_budget:
        if dead_letter(deps, msg, claim.fence, claim.last_error or env, none, by="sweeper",
                       lapsed_before=now, fold=fold) is not None:
            report.dead_lettered.append(claim.chunk_id)
        return
    if deps.claims.release(claim.job_id, claim.chunk_id, claim.fence, none, env, failure=True,
                           lapsed_before=now, reason=ReleaseReason.WORKER_LOST, fold=fold) is not None:
        deps.queues.send_analysis([msg.after_failure()])  # the lost one counted
        deps.jobs.record_event(claim.job_id, "chunk.requeued", chunk_id=claim.chunk_id, reason=env.error_code,
                               by="sweeper", lapsed_for_s=round(now - (claim.claim_expires_at or now), 3))
        report.requeued.append(claim.chunk_id)


def _requeue_backpressure(deps: Deps, claim: ChunkRecord, msg: AnalysisMessage, env: ErrorEnvelope, now: float,
                          report: SweepReport) -> None:
    """A lapsed claim whose cause is backpressure (a function timeout): release and requeue with a delay, unless
    the chunk's backpressure has lasted the deadline without progress (then dead-letter it)."""
    sent = requeue(deps, msg, claim, claim.fence, env, by="sweeper", lapsed_before=now, deadline_at=claim.deadline_at,
                   fold=claim.spend)
    if isinstance(sent, ErrorEnvelope):  # its backpressure lasted the deadline without progress
        if dead_letter(deps, msg, claim.fence, sent, AttemptStats(), by="sweeper", lapsed_before=now,
                       fold=claim.spend) is not None:
            report.dead_lettered.append(claim.chunk_id)
    elif sent is not None:
        report.timed_out.append(claim.chunk_id)


def _explain_dlq(deps: Deps, report: SweepReport, jobs: _JobCache, deadline: Deadline) -> None:
    if not deps.queues.has(Queue.ANALYSIS_DLQ) or deadline.reached("dlq"):
        return
    messages: list[QueueMessage] = []
    with _isolated(report, "dlq", "peek"):
        messages = deps.queues.peek(Queue.ANALYSIS_DLQ)
    for m in messages:
        if deadline.reached("dlq"):
            return
        report.dlq_seen += 1
        with _isolated(report, "dlq", m.message_id):
            _explain_one(deps, m, jobs, report)


def _explain_one(deps: Deps, m: QueueMessage, jobs: _JobCache, report: SweepReport) -> None:
    """A chunk message in the DLQ whose chunk is not settled and not held: settle it `dead_lettered`,
    or, when the queue moved it with attempt budget left, send it again (see the module docstring)."""
    try:
        msg = AnalysisMessage.model_validate_json(m.body)
    except ValidationError:
        return  # not a chunk message; `review dlq list` shows it as such
    chunk = deps.claims.get(msg.job_id, msg.chunk_id)
    if chunk is None:
        return
    if _superseded(chunk, m):
        deps.queues.delete(Queue.ANALYSIS_DLQ, m.receipt_handle)
        report.dlq_removed += 1
        return
    if chunk.settled:
        return  # dead-lettered or failed: the message stays for `review dlq redrive`
    job = jobs.open(msg.job_id)
    if job is None:
        return
    now = deps.clock()
    if chunk.lease_live(now):
        return  # someone is working on it right now
    if m.attributes.get("error_code"):  # a copy the pipeline dead-lettered, then stopped: settle it as decided
        envelope = m.attributes.get("envelope")
        env = ErrorEnvelope.model_validate_json(envelope) if envelope else _dlq_error(chunk)
        _settle_dead_lettered(deps, msg, chunk, env, m, now, report)
    elif chunk.failures >= deps.settings.profile.recovery.poison_budget:
        _settle_dead_lettered(deps, msg, chunk, _dlq_error(chunk), m, now, report)
    else:
        _requeue_from_dlq(deps, job, chunk, m, report)


def _superseded(chunk: ChunkRecord, m: QueueMessage) -> bool:
    """A DLQ copy nothing will ever act on: its chunk finished, was redriven since, or (a copy the
    pipeline dead-lettered) was claimed or released since the decision, so the decision is not current
    (a dead-letter that lost to the chunk's owner leaves such a copy: `chunks.dead_letter` sends it first)."""
    if chunk.status is ChunkStatus.DONE or chunk.redriven_at >= m.sent_at:
        return True
    fence = m.attributes.get("fence")
    if not m.attributes.get("error_code") or fence is None or chunk.settled:
        return False
    return int(fence) < chunk.fence or (chunk.released_at is not None and chunk.released_at > m.sent_at)


def _dlq_error(chunk: ChunkRecord) -> ErrorEnvelope:
    return chunk.last_error or ErrorEnvelope.of("runtime.worker_lost", "message reached the DLQ with no error recorded",
                                                step="sweeper")


def _settle_dead_lettered(deps: Deps, msg: AnalysisMessage, chunk: ChunkRecord, env: ErrorEnvelope,
                          m: QueueMessage, lapsed_before: float | None, report: SweepReport) -> None:
    """Settle the chunk `dead_lettered` under the fence read (its DLQ message is already there) and announce
    it; `lapsed_before`: only while nobody holds a lease (None: under the sweeper's own claim). What an attempt that
    died holding it had spent is folded in (`chunk.spend`)."""
    settled = deps.claims.finish(msg.job_id, msg.chunk_id, chunk.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(),
                                 error=env, states=(ChunkStatus.PENDING, ChunkStatus.CLAIMED),
                                 lapsed_before=lapsed_before, fold=chunk.spend)
    if settled is None:
        return
    deps.jobs.record_event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id, error_code=env.error_code,
                           by="sweeper", dlq_message_id=m.message_id)
    announce(deps, settled)
    report.dead_lettered.append(msg.chunk_id)


def _requeue_from_dlq(deps: Deps, job: Job, chunk: ChunkRecord, m: QueueMessage, report: SweepReport) -> None:
    """The queue moved the chunk's message to the DLQ after maxReceiveCount receives, but the chunk has
    attempt budget left: the receives were not failed attempts (Lambda throttling, errors before the
    claim). Backpressure, not a dead letter: the sweeper takes the lease for an instant (so a worker
    that claims meanwhile wins), releases it as backpressure (no failure; the chunk's backpressure
    streak grows, and its deadline dead-letters a chunk that keeps coming back), sends a fresh delayed
    message and removes the DLQ copy."""
    p = deps.settings.profile
    env = ErrorEnvelope.of(
        "runtime.receives_exhausted",
        f"the queue moved the chunk's message to the DLQ after {p.queues.max_receive_count} receives with "
        f"{chunk.failures} of {p.recovery.poison_budget} failed attempts counted", step="sweeper", attempt=chunk.failures)
    fresh = analysis_message(deps, job, chunk, env.error_code)  # built before any write: a failed read changes nothing
    if not is_backpressure(env):  # the code's row in the recovery policy says these receives were failures
        _settle_dead_lettered(deps, fresh, chunk, env, m, deps.clock(), report)
        return
    won = deps.claims.claim(chunk.job_id, chunk.chunk_id, "sweeper", deps.settings.claim_lease_s, 0)
    if not won.won or won.record is None:
        return  # a worker claimed it since the read (or it settled): its holder decides
    record = won.record
    sent = requeue(deps, fresh, record, record.fence, env, by="sweeper", dlq_message_id=m.message_id,
                   failures=chunk.failures,
                   on_sent=lambda: deps.queues.delete(Queue.ANALYSIS_DLQ, m.receipt_handle))  # the copy is redundant
    if isinstance(sent, ErrorEnvelope):  # its backpressure lasted the deadline without progress
        _settle_dead_lettered(deps, fresh, record, sent, m, None, report)
    elif sent is not None:
        report.dlq_requeued.append(chunk.chunk_id)


def _explain_intake_dlq(deps: Deps, now: float, report: SweepReport, deadline: Deadline) -> None:
    """Queued jobs idle for the stall period whose intake message the queue moved to the intake DLQ."""
    if not deps.queues.has(Queue.INTAKE_DLQ) or deadline.reached("intake_dlq"):
        return
    queued: list[Job] = []
    moved: list[QueueMessage] = []
    with _isolated(report, "intake_dlq", "query"):
        if not deps.queues.depth(Queue.INTAKE_DLQ):
            return  # one cheap call; the scan for queued jobs only when the intake DLQ holds something
        queued = list(deps.jobs.stalled(now - deps.settings.profile.recovery.stall_after_s, JobState.QUEUED))
        if queued:  # moved by the queue: no envelope (intake's own dead letters carry one)
            moved = [m for m in deps.queues.peek(Queue.INTAKE_DLQ) if not m.attributes.get("error_code")]
    by_message = {m.message_id: m for m in moved}  # SQS keeps the MessageId when it moves a message
    by_job: dict[str, QueueMessage] = {}
    for m in moved:
        key, _ = failure_key(m.body)  # the job id a valid message names (key, or the inline text's hash)
        if key:
            by_job.setdefault(job_id_for(key), m)
    for job in queued:
        found = by_message.get(job.source_message_id) or by_job.get(job.job_id)
        if found is not None and not deadline.reached("intake_dlq"):
            with _isolated(report, "intake_dlq", job.job_id):
                _fail_queued(deps, job, found, report)


def _fail_queued(deps: Deps, job: Job, m: QueueMessage, report: SweepReport) -> None:
    p = deps.settings.profile
    env = ErrorEnvelope.of(
        "runtime.intake_exhausted",
        f"intake did not finish intake message {m.message_id} in {p.queues.max_receive_count} deliveries (a crash, a "
        "function timeout or a transient error each time) and the queue moved it to the intake DLQ",
        step="intake", attempt=p.queues.max_receive_count)
    failure = JobFailure(error=env, error_code=env.error_code, ended_at=deps.clock())
    if lifecycle.transition(deps, job, JobState.FAILED, outcome=failure, detail={
            "error_code": env.error_code, "by": "sweeper", "dlq_message_id": m.message_id}) is None:
        return  # intake moved it on meanwhile (or a cancel)
    # the DLQ copy, replaced by one that names the job and the error (the new copy first: never none)
    deps.queues.dead_letter(Queue.INTAKE, m.body, env, source_message_id=m.message_id, job_id=job.job_id)
    deps.queues.delete(Queue.INTAKE_DLQ, m.receipt_handle)
    report.intake_failed.append(job.job_id)


def _reconcile_stalled(deps: Deps, now: float, report: SweepReport, queued: int | None, deadline: Deadline) -> None:
    """`queued`: the analysis queue's depth read before the sweep sent anything and before any chunk record was
    read (a message counted there was in the queue when the records were read; the sweep's own requeues are
    not counted, and their chunks' records say they were just sent). Past the deadline the stalled jobs are
    still queried and counted (`StuckJobs`), not reconciled."""
    stall_s = deps.settings.profile.recovery.stall_after_s
    stalled: list[Job] = []
    with _isolated(report, "reconcile", "query"):
        stalled = list(deps.jobs.stalled(now - stall_s))
    report.stalled_jobs = len(stalled)
    for job in stalled:
        if deadline.reached("reconcile"):
            return
        with _isolated(report, "reconcile", job.job_id):
            _reconcile(deps, job, now, stall_s, report, queued)
    # Finished here, once idle a claim lease: a cancelling job whose chunks are all settled or free but whose
    # control message was lost (or whose last worker died holding a chunk); a failing job whose compensation was
    # never finished (its control message lost; the aggregator or an earlier sweep died half-way). An aggregator
    # still compensating it is not raced: each compensation holds its outcome record in progress (Powertools),
    # so a second one is refused and the job is tried again at the next sweep.
    for state, finish, ended in ((JobState.CANCELLING, lifecycle.finish_cancel, JobState.CANCELLED),
                                 (JobState.COMPENSATING, lifecycle.finish_compensation, JobState.FAILED)):
        if deadline.reached(state.value):
            return
        unfinished: list[Job] = []
        with _isolated(report, "reconcile", state.value):
            unfinished = list(deps.jobs.stalled(now - deps.settings.claim_lease_s, state=state))
        for job in unfinished:
            if deadline.reached(state.value):
                return
            with _isolated(report, "reconcile", job.job_id):
                if finish(deps, job) is ended:
                    report.finalized.append(job.job_id)


def _spend_cap(deps: Deps, now: float, report: SweepReport, deadline: Deadline) -> None:
    """The stack's daily spend cap: today's spend read (published by the handler), the spend-cap hold set when the
    recorded spend reached the cap, and the jobs intake held for it tried again (`intake.start_held`)."""
    if deadline.reached("spend_cap"):
        return
    with _isolated(report, "spend_cap", "hold"):  # (a cap turned off by a redeploy: its hold of today is lifted)
        admitted, recorded = spend_cap.today(deps)
        if spend_cap.cap_micro_usd(deps) is not None:
            report.spend_admitted_micro_usd, report.spend_recorded_micro_usd = admitted, recorded
        report.spend_held = spend_cap.hold_if_reached(deps, recorded) is not None
    # the jobs held at admission, oldest first (the index's order), also once the cap is off (each is then admitted);
    # the first one the cap still refuses ends the step: the rest wait behind it (no refused write per job a minute)
    held: list[Job] = []
    with _isolated(report, "spend_cap", "query"):
        held = [j for j in deps.jobs.stalled(now, state=JobState.QUEUED)
                if j.waiting is not None and j.waiting.condition == spend_cap.CONDITION]
    for job in held:
        if deadline.reached("spend_cap"):
            return
        outcome = "failed"
        with _isolated(report, "spend_cap", job.job_id):
            outcome = start_held(deps, job)
        if outcome == "started":
            report.spend_cap_started.append(job.job_id)
        elif outcome == "refused":
            return


def message_lost(chunk: ChunkRecord, now: float, stall_s: float, retention_s: float, queued: int | None) -> str | None:
    """Why the message of a pending chunk nobody holds is lost (or is about to be), or None: it is in the queue
    or on its way, and re-sending it would only double a backlog. `queued`: the analysis queue's messages
    (visible + in flight + delayed) read before the chunk record; None when unknown.

    Nothing is judged within a stall period of a release that sends or returns a message (a backpressure
    requeue's delayed message, a tier-2 retry's backoff), nor of the message's send (which also covers SQS's
    approximate counts, a minute behind a send). Then:
    - `retention`: the message was sent longer ago than the queue's retention less one stall period: SQS
      deletes it before the next reconcile could look again (a tier-2 retry keeps its first send time);
    - `queue_empty`: the queue held no message at all, so none of this chunk's (a crash between the record
      write and the send; a message deleted by hand). A DLQ move is step 2's (`_explain_dlq`);
    - `unknown_send`: a record from before `message_sent_at`: the old rule (anything not released within
      the stall period)."""
    if chunk.message_on_its_way(now, stall_s):
        return None
    sent = chunk.message_sent_at
    if sent is None:
        return "unknown_send"
    if now - sent < stall_s:
        return None
    if now - sent >= retention_s - stall_s:
        return "retention"
    if queued == 0:
        return "queue_empty"
    return None


def _reconcile(deps: Deps, job: Job, now: float, stall_s: float, report: SweepReport,
               queued: int | None = None) -> None:
    """`job` was read before its chunk records (finalize's conditional transition relies on that order);
    `queued`: the analysis queue's depth read before them (`message_lost`)."""
    resent = requeued = 0
    why: dict[str, int] = {}
    text: str | None = None
    retention_s = deps.settings.profile.queues.queue_retention_days * 86400
    chunks = deps.claims.for_job(job.job_id)
    if job.fanned_out is not None and job.fanned_out < job.chunk_count:
        # a fan-out that stalled: whoever was to send its next page died first (an aggregator between a count and its
        # refill; the sweeper that made a job held for the spend cap running, before its first page): sent now, if
        # the job's window has room (what intake's redelivery does, without the message)
        sent = fanout.refill(deps, job)
        if sent:
            deps.jobs.record_event(job.job_id, "job.reconciled", chunks_requeued=sent, by="sweeper",
                                   detail="its fan-out had stalled: the next page sent")
            report.reconciled.append(job.job_id)
            return
    for c in chunks:
        if c.settled:
            if not job.counts(c):
                announce(deps, c, nonce=f":reconcile:{int(now)}")  # new dedup id
                resent += 1
        elif c.status is ChunkStatus.PENDING and (lost := message_lost(c, now, stall_s, retention_s, queued)):
            text = deps.artifacts.get_text(job.document_key) if text is None else text
            msg = analysis_message(deps, job, c, "reconcile", text)  # built before any write
            if deps.claims.message_sent(job.job_id, c.chunk_id, c.fence) is None:
                continue  # claimed or redriven since the read: its holder has it
            deps.queues.send_analysis([msg])
            requeued += 1
            why[lost] = why.get(lost, 0) + 1
    deps.jobs.touch(job.job_id)  # the next reconcile waits another stall period
    if resent or requeued:
        deps.jobs.record_event(job.job_id, "job.reconciled", results_resent=resent, chunks_requeued=requeued,
                               by="sweeper", **({"lost": why} if why else {}))
        report.reconciled.append(job.job_id)
        report.chunks_resent += requeued
    elif len(chunks) >= job.chunk_count and all(c.settled and job.counts(c) for c in chunks):
        # Every chunk settled and counted, yet the job runs: its finalize failed after the last count
        # (the job update or the report write was rejected) and no result will come to run it again.
        state = finalize(deps, job)
        if state is not JobState.RUNNING:
            deps.jobs.record_event(job.job_id, "job.reconciled", finalized=state.value, by="sweeper")
            report.finalized.append(job.job_id)
