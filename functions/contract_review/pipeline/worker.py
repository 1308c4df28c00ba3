"""Analysis worker core: claim a chunk, run its analysts with checkpoints, settle it.

The outcome of one delivery is always one of:
- an `Outcome` (ack): the message is done with (chunk finished, settled, requeued fresh, or not ours);
- raise `Tier2`: the record is reported as a batch-item failure and the queue redelivers it.

Time: in a Lambda invocation no model call starts unless it can finish (its timeout plus a margin
to save and hand off), and no analyst starts unless both its calls can. Out of time, the chunk is
handed back through its checkpoints (requeued fresh) without counting a failure; the claim records
the invocation's deadline so the sweeper can tell a function timeout from a crash.

Backpressure (throttling of the model or of AWS, time handoffs) requeues the chunk with a growing
delay and counts no failure, but it is bounded: a chunk that goes `backpressure_deadline_s` without
progress is dead-lettered as `runtime.backpressure_exhausted`. A hold (an operator's pause, a full daily
token ledger: model/daily_quota.py) is backpressure the deadline does not bound; a daily-quota hold names
the job's waiting condition (`Job.waiting`) until one of its chunks makes progress again.

What a failed attempt does next is the recovery policy's decision (domain/policy.py `decide`), carried out here. The
attempt's analysts run in analyst_runner.py (with its heartbeat); its model calls go through the one client wiring
builds (model/onion.py).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from contract_review.config.settings import Settings
from contract_review.domain import lifecycle, log_fields
from contract_review.domain.batch_inference import BatchRecord
from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord, ReleaseReason
from contract_review.domain.cost import AttemptMeter, RequestCounter, metered, model_price
from contract_review.domain.errors import ErrorEnvelope, LeaseLost, ReviewError, classify
from contract_review.domain.keys import findings_key
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.policy import Next, decide, is_backpressure
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Inference, Job, JobFailure, JobState
from contract_review.model.daily_quota import DAILY_QUOTA_CODE
from contract_review.model.onion import DailyQuotaModel, Layer, layer
from contract_review.pipeline import batch_inference, fallback
from contract_review.pipeline.analyst_runner import AnalystRunner, Delivery, Heartbeat, attempt_stats
from contract_review.pipeline.priority import PriorityGate
from contract_review.reliability.chunks import announce, dead_letter, requeue
from contract_review.reliability.retry import Retrier, RetryBudget, RetryStats, requeue_delay_s, tier2_backoff_s
from contract_review.review.analysts import (
    STEPS,
    AnalystOutput,
    ChunkFindings,
)

log = logging.getLogger(__name__)
MAX_FUNCTION_TIMEOUT_S = 900  # Lambda's longest timeout: a longer remaining time means "no deadline" (Fargate)


class Action(StrEnum):
    """What one delivery of a chunk message came to (the message is done with, except after `Tier2`)."""

    DONE = "done"  # the chunk finished: its findings written, the aggregator told
    SKIPPED = "skipped"  # its job has ended (or is gone)
    DEFERRED = "deferred"  # a bulk chunk gave way to open interactive work (priority.py)
    AWAITING_BATCH = "awaiting_batch"  # parked until its batch answers come (batch_inference.py)
    REQUEUED = "requeued"  # backpressure or a handoff: sent again, no failure counted
    FAILED = "failed"  # the chunk failed for good
    JOB_FAILED = "job_failed"  # the chunk failed with a job-fatal code: the job failed too
    DEAD_LETTERED = "dead_lettered"  # out of attempts or of backpressure time
    CANCELLED = "cancelled"  # its job is being cancelled: settled where it stopped
    DUPLICATE = "duplicate"  # another worker holds or settled the chunk
    LEASE_LOST = "lease_lost"  # fenced out: another worker took the chunk over


@dataclass
class Outcome:
    action: Action
    detail: dict[str, str | int | None] = field(default_factory=dict)
    stats: RetryStats = field(default_factory=RetryStats)  # model calls and tier-1 retries of this attempt


class Tier2(Exception):
    """Hand the record back to the queue (a batch-item failure): the queue's redelivery is the
    second retry tier. Carries the envelope and what the attempt spent."""

    def __init__(self, envelope: ErrorEnvelope, stats: RetryStats):
        super().__init__(f"{envelope.error_code}: {envelope.message}")
        self.envelope = envelope
        self.stats = stats


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def attempt_meter(settings: Settings, counter: RequestCounter, model_id: str) -> AttemptMeter:
    """What a chunk attempt spends besides its tokens: its requests (`counter`) and, in a Lambda worker, one
    invocation and its duration at the function's memory; priced at the profile's table, its tokens at `model_id`'s
    price (the job's model)."""
    p = settings.profile
    return AttemptMeter(p.prices, model_price(p.prices, model_id), counter,
                        lambda_memory_mb=p.functions.worker_memory_mb if settings.worker_kind == "lambda" else None)


def before_each_call(hb: Heartbeat, watch: lifecycle.CancelWatch) -> Callable[[], None]:
    def check() -> None:
        hb.check()  # the lease first: a fenced-out worker stops whatever its job's state
        watch.check()
    return check


def retry_recorder(deps: Deps, msg: AnalysisMessage,
                   watch: lifecycle.CancelWatch) -> Callable[[ErrorEnvelope, int, float], None]:
    """Each tier-1 retry as a progress event ("model.throttled, attempt 2, waiting 1.8 s")."""
    def record(env: ErrorEnvelope, attempt: int, delay_s: float) -> None:
        deps.jobs.record_event(msg.job_id, "model.retry", chunk_id=msg.chunk_id, chunk_index=msg.chunk_index,
                               analyst=watch.stage, error_code=env.error_code, attempt=attempt + 1,
                               delay_s=round(delay_s, 2))
    return record


def settle_cancelled(deps: Deps, msg: AnalysisMessage, fence: int, stats: RetryStats, stage: str,
                     ended: bool = False) -> Outcome:
    """The job is being cancelled: the chunk settles `cancelled` where it stopped (its committed analysts
    stay checkpointed), and the aggregator counts it. `ended`: the job is already `cancelled` (the aggregator
    ignores an ended job's results): the chunk is counted here, once (the conditional settle)."""
    done = deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.CANCELLED, attempt_stats(stats),
                              error=lifecycle.cancel_envelope(stage))
    if done is None:
        return Outcome(Action.LEASE_LOST)
    if ended:
        lifecycle.count_settled(deps, done)
    deps.jobs.record_event(msg.job_id, "chunk.cancelled", chunk_id=msg.chunk_id, cancelled_at_stage=stage,
                           calls=stats.calls)
    announce(deps, done)
    return Outcome(Action.CANCELLED, {"cancelled_at_stage": stage})


class ChunkWorker:
    """One per process. `model` is the process's onion (model/onion.py, built by wiring.worker_model): its pause, its
    daily quota, its pacers and its counting are layers of the one client every analyst calls."""

    def __init__(self, deps: Deps, model: Layer, *, models: Callable[[str], Layer] | None = None,
                 rng: random.Random | None = None, sleep: Callable[[float], None] = time.sleep,
                 call_safety_s: float | None = None):
        self.deps, self.s, self.model, self.sleep = deps, deps.settings, model, sleep
        # A job runs on the model it recorded at intake, not the deploy's: `models(model_id)` is the onion of another
        # model (wiring builds one per model, once); None: this worker calls only its own model
        self.models = models
        self.priority = PriorityGate(deps)  # one per process: interactive chunks before bulk ones
        self.rng = rng or random.Random()
        # time left that one more model call needs: its timeout plus a margin to save and hand off
        self.call_safety_s = call_safety_s if call_safety_s is not None else \
            self.s.model_call_timeout_s + self.s.profile.tier1.handoff_margin_s
        # an analyst needs room for its other calls too (locate + assess: one more call timeout)
        self.analyst_extra_s = self.s.model_call_timeout_s * (len(STEPS) - 1)

    # ------------------------------------------------------------------ entry
    def handle(self, msg: AnalysisMessage, delivery: Delivery) -> Outcome:
        """One delivery of a chunk message. Its AWS requests, while it runs, are the attempt's (cost.py); the onion's
        layers read what they follow before it (the quotas) and write what they counted after it (the daily ledger)."""
        with metered(self.deps.meter) as counter:
            self.model.begin_attempt()
            try:
                return self._handle(msg, delivery, counter)
            finally:
                self.model.end_attempt()

    def _handle(self, msg: AnalysisMessage, delivery: Delivery, counter: RequestCounter) -> Outcome:
        try:
            job = self.deps.jobs.get(msg.job_id)
            # a chunk of a cancelled job is claimed to be settled `cancelled` (a cancel that finished while its
            # message was on its way, from a fan-out or a redrive, must not leave it pending under the ended job)
            if job is None or (job.terminal and job.state is not JobState.CANCELLED):
                return Outcome(Action.SKIPPED, {"job_state": job.state.value if job else None})
            delay = self.priority.defer(msg, job)  # a bulk chunk gives way to open interactive work
            if delay is not None:
                return Outcome(Action.DEFERRED, {"reason": "priority.deferred", "delay_s": delay,
                                            "deferrals": msg.deferrals + 1})
            claim = self.deps.claims.claim(msg.job_id, msg.chunk_id, worker_identity(), self.s.claim_lease_s,
                                           delivery.receive_count, deadline_at=self._deadline_at(delivery))
        except Exception as exc:  # DynamoDB throttling before the claim: backpressure, come back later
            env = classify(exc, step="worker.claim")
            if not is_backpressure(env):
                raise
            return self._requeue_unclaimed(msg, env)
        if not claim.won or claim.record is None:
            return self._not_claimed(claim.record)
        fence, record = claim.fence, claim.record
        job = fallback.follow_operator(self.deps, job)  # `review model use`: the job's calls move with the stack's
        log_fields.bind(log_fields.of_job(job))  # what this attempt's log lines know from here on
        log_fields.bind(log_fields.job_fields(lease_deadline=record.claim_expires_at, checkpoint_version=fence))
        stats = RetryStats(meter=attempt_meter(self.s, counter, self.model_for(job).model_id))
        outcome = self._claimed(msg, delivery, job, fence, record, stats)
        if outcome.action is Action.LEASE_LOST:  # fenced out, none of its fenced writes went through: what it spent
            self.deps.jobs.add_fenced_out(msg.job_id, msg.chunk_id, fence, attempt_stats(stats))  # is its job's still
        return outcome

    def model_for(self, job: Job) -> Layer:
        """The model a job's chunks are analysed with: the one it recorded at intake (its analysis identities, its
        report and its price are that model's), whatever this deploy's default is now."""
        if not job.model_id or job.model_id == self.model.model_id or self.models is None:
            return self.model
        return self.models(job.model_id)

    def _claimed(self, msg: AnalysisMessage, delivery: Delivery, job: Job, fence: int, record: ChunkRecord,
                 stats: RetryStats) -> Outcome:
        """The attempt under the claim it won (`fence`): its analysts, on the job's model, then what their outcome
        makes of the chunk."""
        model = self.model_for(job)
        if model is self.model:  # its attempt began with the delivery (`handle`)
            return self._attempt(msg, delivery, job, fence, record, stats, model)
        model.begin_attempt()
        try:
            return self._attempt(msg, delivery, job, fence, record, stats, model)
        finally:
            model.end_attempt()

    def _attempt(self, msg: AnalysisMessage, delivery: Delivery, job: Job, fence: int, record: ChunkRecord,
                 stats: RetryStats, model: Layer) -> Outcome:
        if job.state in (JobState.CANCELLING, JobState.CANCELLED):  # no work for a job being (or) cancelled
            return settle_cancelled(self.deps, msg, fence, stats, "claim", ended=job.state is JobState.CANCELLED)
        if record.failures >= msg.max_attempts:
            env = record.last_error or ErrorEnvelope.of("runtime.worker_lost", "poison budget used by earlier attempts")
            return self._dead_lettered(msg, fence, env, attempt_stats(stats))
        error: ErrorEnvelope | None = None
        outputs: dict[str, AnalystOutput] = {}
        waiting: list[BatchRecord] = []  # a batch-mode chunk's requests still to be answered (batch_inference.py)
        answers = batch_inference.Answers.load(self.deps, record, model.model_id) if record.batch_answer_keys else None
        batch_lane = batch_inference.in_batch_lane(self.deps, job, record)  # its calls go to batch inference: none from the pacers
        if job.inference is Inference.BATCH and not batch_lane and job.on_demand_since is None:
            self.deps.jobs.mark_on_demand(job.job_id)  # from now on its chunks wait on the workers (priority.py)
        has_time = self._has_time(delivery)
        watch = lifecycle.CancelWatch(self.deps, msg.job_id)
        with Heartbeat(self.deps, msg, fence, delivery, self.s.claim_lease_s) as hb:
            retrier = Retrier(policy=self.s.profile.tier1.model_retry, budget=RetryBudget(self.s.profile.tier1.chunk_retry_budget_s),
                              stats=stats, rng=self.rng, sleep=self.sleep, has_time=has_time,
                              check=before_each_call(hb, watch), on_retry=retry_recorder(self.deps, msg, watch))
            runner = AnalystRunner(self.deps, model, retrier, hb, has_time, self.analyst_extra_s, watch, answers)
            try:
                if batch_lane:
                    outputs, waiting = runner.run_batch(msg, job, fence, record,
                                                        answers or batch_inference.Answers(msg.job_id, msg.chunk_id,
                                                                                         model.model_id))
                else:
                    outputs = runner.run(msg, job, fence, record)
            except lifecycle.JobCancelled as exc:
                return settle_cancelled(self.deps, msg, fence, stats, exc.stage)
            except LeaseLost:
                self.deps.jobs.record_event(msg.job_id, "chunk.lease_lost", chunk_id=msg.chunk_id, fence=fence)
                return Outcome(Action.LEASE_LOST, {"error": "runtime.lease_lost"}, stats)
            except ReviewError as exc:
                error = exc.envelope
            except Exception as exc:  # an AWS call failed (e.g. DynamoDB throttling): classified, not lost
                log.warning("chunk attempt failed", exc_info=True, extra={"job_id": msg.job_id, "chunk_id": msg.chunk_id})
                error = classify(exc, step="worker")
        # the heartbeat has stopped: it can no longer overwrite the tier-2 backoff visibility
        if error is not None:
            log_fields.bind(log_fields.job_fields(error_code=error.error_code))
            to = fallback.after_error(self.deps, job.model_copy(update={"model_id": model.model_id}), error)
            if to is not None:  # its model is unavailable: on with the next of the chain, its checkpoints kept
                outcome = self._switched(msg, fence, stats, error, to)
                outcome.stats = stats
                return outcome
        outcome = self._on_error(msg, fence, delivery, stats, error, progressed=bool(runner.committed)) if error \
            else self._await_batch(msg, fence, stats, waiting) if waiting else self._complete(msg, fence, stats, outputs)
        self._waiting(job, error, layer(model, DailyQuotaModel), progressed=bool(runner.committed))
        outcome.stats = stats
        return outcome

    # ------------------------------------------------------------------ pieces
    def _waiting(self, job: Job, error: ErrorEnvelope | None, daily: DailyQuotaModel | None, *,
                 progressed: bool) -> None:
        """The job's named waiting condition: set by the first hold of one of its chunks for the daily token quota
        of its model (`daily`: that layer of its onion) (`job.waiting_quota`), ended by the first progress after it
        (`job.waiting_ended`)."""
        quota = daily.quota if daily is not None else None  # the daily hold, when one is known now
        if error is not None and error.error_code == DAILY_QUOTA_CODE and quota is not None:
            if job.waiting is None:
                waiting = quota.waiting(self.deps.clock())
                if self.deps.jobs.set_waiting(job.job_id, waiting):
                    self.deps.jobs.record_event(job.job_id, "job.waiting_quota", **waiting.model_dump(mode="json"))
        elif job.waiting is not None and progressed and self.deps.jobs.set_waiting(job.job_id, None):
            self.deps.jobs.record_event(job.job_id, "job.waiting_ended", condition=job.waiting.condition)

    def _not_claimed(self, record: ChunkRecord | None) -> Outcome:
        if record is not None and record.settled:
            # The results message may not have been sent before a crash: send it again.
            announce(self.deps, record)
            return Outcome(Action.DUPLICATE, {"status": record.status.value})
        return Outcome(Action.DUPLICATE, {"status": record.status.value if record else None,
                                     "claimed_by": record.claimed_by if record else None})

    def _deadline_at(self, delivery: Delivery) -> float | None:
        """When this invocation's time runs out (epoch s), kept on the claim for the sweeper; None
        without a function timeout (no remaining time, or more than any Lambda may have)."""
        if delivery.remaining_ms is None:
            return None
        remaining_s = delivery.remaining_ms() / 1000
        return self.deps.clock() + remaining_s if remaining_s <= MAX_FUNCTION_TIMEOUT_S else None

    def _has_time(self, delivery: Delivery) -> Callable[[float], bool]:
        remaining_ms = delivery.remaining_ms
        if remaining_ms is None:
            return lambda _extra_s: True
        return lambda extra_s: remaining_ms() / 1000 - extra_s > self.call_safety_s

    def _complete(self, msg: AnalysisMessage, fence: int, stats: RetryStats,
                  outputs: dict[str, AnalystOutput]) -> Outcome:
        findings = [f for o in outputs.values() for f in o.findings]
        key = findings_key(msg.job_id, msg.chunk_index, msg.chunk_id, fence)
        self.deps.artifacts.put_text(key, ChunkFindings(chunk_id=msg.chunk_id, chunk_index=msg.chunk_index,
                                                        findings=findings).model_dump_json())
        outcome = ChunkOutcome(findings_key=key, coverage={name: o.status for name, o in outputs.items()},
                               n_findings=len(findings),
                               models={name: o.model_id for name, o in outputs.items() if o.model_id})
        done = self.deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.DONE, attempt_stats(stats),
                                       outcome=outcome)
        if done is None:
            self.deps.jobs.record_event(msg.job_id, "chunk.lease_lost", chunk_id=msg.chunk_id, fence=fence,
                                        at_step="complete")
            return Outcome(Action.LEASE_LOST)
        announce(self.deps, done)
        return Outcome(Action.DONE, {"findings": len(findings), "calls": stats.calls})

    def _await_batch(self, msg: AnalysisMessage, fence: int, stats: RetryStats, waiting: list[BatchRecord]) -> Outcome:
        """Park the chunk `awaiting_batch` with its missing requests; its message is done with (batch_inference.py)."""
        if batch_inference.park(self.deps, msg.job_id, msg.chunk_id, fence, attempt_stats(stats), waiting) is None:
            return Outcome(Action.LEASE_LOST)
        self.deps.jobs.record_event(msg.job_id, "chunk.awaiting_batch", chunk_id=msg.chunk_id,
                                    chunk_index=msg.chunk_index, records=len(waiting))
        return Outcome(Action.AWAITING_BATCH, {"records": len(waiting)})

    def _dead_lettered(self, msg: AnalysisMessage, fence: int, env: ErrorEnvelope, stats: AttemptStats) -> Outcome:
        if dead_letter(self.deps, msg, fence, env, stats, by="worker") is None:
            return Outcome(Action.LEASE_LOST)
        return Outcome(Action.DEAD_LETTERED, {"error": env.error_code})

    def _on_error(self, msg: AnalysisMessage, fence: int, delivery: Delivery, stats: RetryStats,
                  env: ErrorEnvelope, *, progressed: bool) -> Outcome:
        """What a failed attempt becomes, as the recovery policy decides (domain/policy.py `decide`): requeued as
        backpressure or a handoff (at once after a clean handoff), a failed attempt (tier 2), a failed chunk, or a
        stop."""
        decision = decide(env, progressed=progressed, retried=stats.retries)
        record = self.deps.claims.get(msg.job_id, msg.chunk_id)
        checkpointed = sorted(record.checkpoints) if record else []
        if decision.next is Next.STOP:  # not ours to finish: whoever owns the chunk settles it
            return Outcome(Action.LEASE_LOST, {"error": env.error_code})
        if decision.next is Next.FAIL:
            return self._fail(msg, fence, stats, env)
        if decision.next is Next.RETRY:
            if decision.cause_code is not None:
                env = env.model_copy(update={"cause_code": decision.cause_code})
            return self._tier2(msg, fence, delivery, stats, env, (record.failures if record else 0) + 1, checkpointed)
        return self._requeue(msg, fence, stats, env, record, checkpointed, clean=decision.next is Next.REQUEUE_AT_ONCE)

    def _switched(self, msg: AnalysisMessage, fence: int, stats: RetryStats, error: ErrorEnvelope,
                  to: str) -> Outcome:
        """The job moved to model `to` (pipeline/fallback.py): the chunk requeued at once to go on with it."""
        env = ErrorEnvelope.of(fallback.SWITCHED, f"{error.error_code}: the job goes on with {to}",
                               cause_code=error.error_code, step="worker")
        record = self.deps.claims.get(msg.job_id, msg.chunk_id)
        return self._requeue(msg, fence, stats, env, record, sorted(record.checkpoints) if record else [], clean=True)

    def _requeue(self, msg: AnalysisMessage, fence: int, stats: RetryStats, env: ErrorEnvelope,
                 record: ChunkRecord | None, checkpointed: list[str], *, clean: bool) -> Outcome:
        """Backpressure: release without a failure and send a fresh message (delayed unless `clean`),
        or dead-letter the chunk once its backpressure has lasted the deadline without progress."""
        sent = requeue(self.deps, msg, record, fence, env, by="worker", stats=attempt_stats(stats), rng=self.rng,
                       clean=clean, resume_from=checkpointed, checkpointed=len(checkpointed), tier=1)
        if isinstance(sent, ErrorEnvelope):  # its backpressure lasted the deadline without progress
            return self._dead_lettered(msg, fence, sent, attempt_stats(stats))
        if sent is None:
            return Outcome(Action.LEASE_LOST)
        return Outcome(Action.REQUEUED, {"reason": sent.reason, "delay_s": sent.delay_s})

    def _requeue_unclaimed(self, msg: AnalysisMessage, env: ErrorEnvelope) -> Outcome:
        """AWS throttled us before the chunk was claimed (nothing to release, and the tables are the
        throttled thing): only a fresh delayed message, growing with the message's requeues."""
        delay = requeue_delay_s(self.s.profile, msg.requeues, self.rng, env.retry_after_s)
        self.deps.queues.send_analysis([msg.requeued(env.error_code, 0)], delay_s=delay)
        log.warning("throttled before the claim; requeued", extra={"job_id": msg.job_id, "chunk_id": msg.chunk_id,
                                                                  "error_code": env.error_code, "delay_s": delay})
        return Outcome(Action.REQUEUED, {"reason": env.error_code, "delay_s": delay, "claimed": 0})

    def _tier2(self, msg: AnalysisMessage, fence: int, delivery: Delivery, stats: RetryStats, env: ErrorEnvelope,
               failures: int, checkpointed: list[str]) -> Outcome:
        if failures >= msg.max_attempts:
            return self._dead_lettered(msg, fence, env.model_copy(update={"attempt": failures}), attempt_stats(stats))
        if self.deps.claims.release(msg.job_id, msg.chunk_id, fence, attempt_stats(stats), env, failure=True,
                                    reason=ReleaseReason.RETRY) is None:
            return Outcome(Action.LEASE_LOST)
        # Tier 2 backoff: the record comes back after a jittered delay growing to minutes (an outage of
        # a few minutes must not use the poison budget), instead of the full visibility timeout.
        back = tier2_backoff_s(self.s.profile, failures, self.rng)
        self.deps.jobs.record_event(msg.job_id, "chunk.retry", chunk_id=msg.chunk_id, chunk_index=msg.chunk_index,
                                    error_code=env.error_code, failures=failures, tier=2,
                                    checkpointed=len(checkpointed), backoff_s=back)
        if delivery.receipt_handle:
            self.deps.queues.extend_visibility(Queue.ANALYSIS, delivery.receipt_handle, back)
        raise Tier2(env, stats)

    def _fail(self, msg: AnalysisMessage, fence: int, stats: RetryStats, env: ErrorEnvelope) -> Outcome:
        """Permanent: the chunk fails; a job-fatal code fails the whole job now."""
        failed = self.deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.FAILED, attempt_stats(stats),
                                         error=env)
        if failed is None:
            return Outcome(Action.LEASE_LOST)
        self.deps.jobs.record_event(msg.job_id, "chunk.failed", chunk_id=msg.chunk_id, error_code=env.error_code)
        if env.job_fatal:  # fail the job first, so the result below cannot finalize it with another code
            failure = JobFailure(error=env, error_code=env.error_code, ended_at=self.deps.clock())
            lifecycle.move(self.deps, msg.job_id, (JobState.QUEUED, JobState.RUNNING), JobState.FAILED, outcome=failure,
                           detail={"error_code": env.error_code, "chunk_id": msg.chunk_id})
        announce(self.deps, failed)
        return Outcome(Action.JOB_FAILED if env.job_fatal else Action.FAILED, {"error": env.error_code})
