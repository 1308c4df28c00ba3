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
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from contract_review.config.settings import Settings
from contract_review.domain import lifecycle, log_fields
from contract_review.domain.batch import BatchRecord
from contract_review.domain.cost import AttemptMeter, RequestCounter, metered, model_price
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, LeaseLost, ReviewError, classify
from contract_review.domain.keys import findings_key
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse, caches
from contract_review.domain.policy import Next, decide, is_backpressure
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import (
    AttemptStats,
    Checkpoint,
    CheckpointWrite,
    ChunkOutcome,
    ChunkRecord,
    ChunkStatus,
    Inference,
    Job,
    JobFailure,
    JobState,
    ReleaseReason,
)
from contract_review.model.daily_quota import DAILY_QUOTA_CODE
from contract_review.model.onion import CallScope, DailyQuotaModel, Layer, calls_for, layer
from contract_review.pipeline import batch
from contract_review.pipeline.analyst_pool import AnalystPool, GroupCommit, WarmUp
from contract_review.pipeline.priority import PriorityGate
from contract_review.reliability.chunks import announce, dead_letter, requeue
from contract_review.reliability.retry import Retrier, RetryBudget, RetryStats, requeue_delay_s, tier2_backoff_s
from contract_review.review.analysts import (
    STEPS,
    AnalystOutput,
    AnalystSpec,
    ChunkFindings,
    ParsedItems,
    analysis_identities,
    analysts_for,
    refused_output,
    run_analyst,
)
from contract_review.review.chunking import Chunk

log = logging.getLogger(__name__)
MAX_FUNCTION_TIMEOUT_S = 900  # Lambda's longest timeout: a longer remaining time means "no deadline" (Fargate)


@dataclass
class Delivery:
    """What the queue told us about this receipt of the message."""

    message_id: str
    receipt_handle: str
    receive_count: int
    visibility_s: int
    remaining_ms: Callable[[], int] | None = None  # the invocation's remaining time; None: no function timeout


class Action(StrEnum):
    """What one delivery of a chunk message came to (the message is done with, except after `Tier2`)."""

    DONE = "done"  # the chunk finished: its findings written, the aggregator told
    SKIPPED = "skipped"  # its job has ended (or is gone)
    DEFERRED = "deferred"  # a bulk chunk gave way to open interactive work (priority.py)
    AWAITING_BATCH = "awaiting_batch"  # parked until its batch answers come (pipeline/batch.py)
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


def attempt_stats(stats: RetryStats) -> AttemptStats:
    """What the attempt spent, for the write that records it: its calls and retries, and its usage (tokens,
    AWS requests, cost: priced by its meter; without one, its tokens only), with its timed-out calls and their
    estimated cost."""
    usage = stats.meter.usage(stats.tokens) if stats.meter is not None else stats.tokens
    return AttemptStats(calls=stats.calls, repairs=stats.repairs, retries=dict(stats.retries), **{
        **usage.model_dump(), "timed_out_calls": stats.timed_out_calls,
        "estimated_micro_usd": stats.estimated_micro_usd})


class Heartbeat:
    """Extends the claim lease and the message visibility every lease/3 while a chunk is worked. A
    checkpoint commit extends the lease too (`extended`): a beat skips its DynamoDB write while the lease
    actually written (by a commit, counted from the commit's start, or by the last beat) still has more than
    2/3 of the lease to run, so the beat after it comes with more than 1/3 left, however long the commit
    took; it extends the message visibility all the same. `lease_lock` orders the lease's writes in this
    process (a beat and a commit): each computes its expiry inside it, so a later write never shortens the
    lease an earlier one wrote. Each write also sets the attempt's running spend (`spent`, read inside the lock, so
    a later write never records less), what survives of it if the process dies (ChunkRecord.spend)."""

    def __init__(self, deps: Deps, msg: AnalysisMessage, fence: int, delivery: Delivery, lease_s: float,
                 clock: Callable[[], float] | None = None):
        self.deps, self.msg, self.fence, self.delivery, self.lease_s = deps, msg, fence, delivery, lease_s
        self.clock = clock or deps.clock  # the repositories' clock: the expiries they write are in it
        self.lease_until = float("-inf")  # the latest expiry this process wrote (commit or beat)
        self.spent: Callable[[], AttemptStats] = AttemptStats  # the attempt's spend so far (set by its runner)
        self.lease_lock = threading.Lock()
        self.lost = threading.Event()
        self._stop = threading.Event()
        # in a copy of this context: its log lines carry the chunk's fields, its calls join the chunk's trace
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), daemon=True,
                                        name="heartbeat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost()

    def extended(self, until: float) -> None:
        """A fenced write (a checkpoint commit) wrote the lease's expiry `until`."""
        self.lease_until = max(self.lease_until, until)

    def due(self) -> bool:
        """Whether this beat must write: the lease written has 2/3 of its length or less to run."""
        return self.lease_until - self.clock() <= 2 * self.lease_s / 3

    def tick(self) -> None:
        """One beat: extend the lease when it is due (a lost fence stops the chunk), and the visibility."""
        try:
            if self.due():
                with self.lease_lock:
                    until = self.deps.claims.heartbeat(self.msg.job_id, self.msg.chunk_id, self.fence, self.lease_s,
                                                       spent=self.spent())
                if until is None:
                    self.lost.set()
                    return
                self.extended(until)
            if self.delivery.receipt_handle:
                self.deps.queues.extend_visibility(Queue.ANALYSIS, self.delivery.receipt_handle,
                                                   self.delivery.visibility_s)
        except Exception:  # a missed beat is survivable; the next one retries. Logged, not hidden.
            log.warning("heartbeat failed", exc_info=True, extra={"job_id": self.msg.job_id,
                                                                 "chunk_id": self.msg.chunk_id})

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3) and not self.lost.is_set():
            self.tick()


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class AnalystRunner:
    """Runs one chunk's analysts for one attempt: loads committed checkpoints, runs the rest with
    tier-1 retries, `profile.review.analyst_concurrency` at once (analyst_pool.py), and commits each output
    under the attempt's fencing token as soon as it is ready. An analyst starts only when the time
    left fits all its calls (`analyst_extra_s` more than one call needs); `committed` lists what this
    attempt checkpointed (its progress)."""

    def __init__(self, deps: Deps, model: ModelClient, retrier: Retrier, hb: Heartbeat,
                 has_time: Callable[[float], bool], analyst_extra_s: float = 0.0,
                 watch: lifecycle.CancelWatch | None = None, answers: batch.Answers | None = None):
        self.deps, self.retrier, self.hb, self.has_time = deps, retrier, hb, has_time
        self.model = model  # the worker's onion (model/onion.py): every call goes through it, counted where it reaches
        self.answers = answers  # the chunk's batch answers (a batch-mode job): replayed before any call is made
        self.analyst_extra_s = analyst_extra_s
        self.watch = watch
        self.committed: list[str] = []
        self._stats_lock = threading.Lock()
        self._in_flight: list[RetryStats] = []  # the analysts under way's own counts (added to the total when each ends)
        hb.spent = self.spent
        self.warm = WarmUp(active=False)  # set per run: the chunk's first call warms the prompt cache

    def _prepare(self, msg: AnalysisMessage, job: Job, record: ChunkRecord
                 ) -> tuple[Chunk, tuple[AnalystSpec, ...], dict[str, str], dict[str, AnalystOutput], list[AnalystSpec]]:
        """The chunk, its analysts and their identities, the outputs checkpointed already, the analysts to run."""
        chunk = Chunk(index=msg.chunk_index, chunk_id=msg.chunk_id, start=msg.start, end=msg.end, text=msg.text)
        saved = self.deps.claims.checkpoints(record)
        specs = analysts_for(job.analyst_count or self.deps.settings.profile.review.analyst_count)
        identities = analysis_identities(self.deps.settings, specs)  # per analyst: what its checkpoint must match
        outputs: dict[str, AnalystOutput] = {}
        todo: list[AnalystSpec] = []
        for spec in specs:
            loaded = self._load(msg, job, spec, saved, identities[spec.name])
            if loaded is not None:
                outputs[spec.name] = loaded
            else:
                todo.append(spec)
        return chunk, specs, identities, outputs, todo

    def run_batch(self, msg: AnalysisMessage, job: Job, fence: int, record: ChunkRecord,
                  answers: batch.Answers) -> tuple[dict[str, AnalystOutput], list[BatchRecord]]:
        """A batch-mode chunk (pipeline/batch.py): each analyst runs on its batch answers; the ones that end are
        checkpointed (one commit), the others name their next request, which goes into a batch job. No model call
        is made here. Returns the outputs so far and the requests still to be answered."""
        chunk, specs, identities, outputs, todo = self._prepare(msg, job, record)
        waiting: list[BatchRecord] = []
        ended: list[tuple[str, AnalystOutput]] = []
        for spec in todo:
            self.retrier.check()  # the lease, then the job's cancellation
            if self.watch is not None:
                self.watch.stage = spec.name
            try:
                out = run_analyst(spec, chunk, answers.step)
            except batch.AwaitBatch as wait:
                waiting.append(wait.record)
                continue
            except ReviewError as exc:
                ended_by = analyst_ended(spec, chunk, exc.envelope, 0)
                if ended_by is None:
                    raise
                out = ended_by
            ended.append((spec.name, out))
        if ended and not self._commit(msg, fence, identities, ended):
            raise LeaseLost("checkpoint write rejected by fencing token")
        outputs.update(ended)
        return {s.name: outputs[s.name] for s in specs if s.name in outputs}, waiting

    def run(self, msg: AnalysisMessage, job: Job, fence: int, record: ChunkRecord) -> dict[str, AnalystOutput]:
        chunk, specs, identities, outputs, todo = self._prepare(msg, job, record)
        concurrency = self.deps.settings.profile.review.analyst_concurrency
        pool: AnalystPool[AnalystSpec, AnalystOutput] = AnalystPool(concurrency)
        self.warm = WarmUp(active=concurrency > 1 and len(todo) > 1)
        commits: GroupCommit[tuple[str, AnalystOutput], bool] = GroupCommit(
            lambda batch: self._commit(msg, fence, identities, batch))

        def one(spec: AnalystSpec) -> AnalystOutput:
            return self._run_and_commit(spec, chunk, pool, commits)
        for spec, out in zip(todo, pool.run(todo, one)):
            if out is not None:
                outputs[spec.name] = out
        return {s.name: outputs[s.name] for s in specs}  # in the analysts' order, whatever order they ended in

    def _run_and_commit(self, spec: AnalystSpec, chunk: Chunk, pool: AnalystPool[AnalystSpec, AnalystOutput],
                        commits: GroupCommit[tuple[str, AnalystOutput], bool]) -> AnalystOutput:
        """One analyst: its calls (tier-1 retries through its own view of the retrier: the chunk's budget,
        its own call counts, added to the chunk's), then its checkpoint under the fencing token, committed
        together with those of the analysts that finished at the same time (`_commit`)."""
        pool.check()
        self.hb.check()
        if self.watch is not None:
            self.watch.stage = spec.name
        if not self.has_time(self.analyst_extra_s):  # both its calls must fit, or none is made
            raise ReviewError.of("runtime.time_exhausted", "no time for all calls of analyst " + spec.name,
                                 step=spec.name)
        base_check = self.retrier.check

        def check() -> None:
            pool.check()
            base_check()
        retrier = dataclasses.replace(self.retrier, stats=RetryStats(), check=check)
        with self._stats_lock:
            self._in_flight.append(retrier.stats)
        try:
            out = self._run_one(spec, chunk, retrier)
        finally:
            self._add_stats(retrier.stats)
        if not commits.commit((spec.name, out)):
            raise LeaseLost("checkpoint write rejected by fencing token")
        return out

    def _commit(self, msg: AnalysisMessage, fence: int, identities: dict[str, str],
                batch: list[tuple[str, AnalystOutput]]) -> bool:
        """Checkpoint the analysts' outputs under the fencing token, then one `analyst.done` event naming
        them all: four writes however many analysts finished together. False when the fence moved on
        (nothing committed)."""
        writes = [CheckpointWrite(analyst=name, config_hash=identities[name], status=out.status,
                                  output_json=out.model_dump_json()) for name, out in batch]
        with self.hb.lease_lock:  # ordered with the beats: the later write has the later expiry (and spend)
            until = self.deps.claims.put_checkpoints(msg.job_id, msg.chunk_id, fence, writes, lease_s=self.hb.lease_s,
                                                     spent=self.spent())
        if until is None:
            return False
        self.hb.extended(until)
        self.committed.extend(name for name, _ in batch)
        self.deps.jobs.record_event(msg.job_id, "analyst.done", chunk_id=msg.chunk_id, chunk_index=msg.chunk_index,
                                    chunk_count=msg.chunk_count, analysts=[
                                        {"analyst": name, "status": out.status, "findings": len(out.findings)}
                                        for name, out in batch])
        return True

    def _ready(self, retrier: Retrier) -> None:
        """After waiting for the quota: the stop conditions and the time left, again, before the call."""
        retrier.check()
        if not self.has_time(0):
            raise ReviewError.of("runtime.time_exhausted", "no time for the next model call after waiting for the quota")

    def _add_stats(self, stats: RetryStats) -> None:
        """An analyst ended: its counts join the attempt's total (and leave the ones under way), together."""
        with self._stats_lock:
            self.retrier.stats.add(stats)
            self._in_flight = [s for s in self._in_flight if s is not stats]  # by identity: equal counts are not it

    def spent(self) -> AttemptStats:
        """What the attempt has spent so far: the ended analysts' counts and those of the analysts under way (read
        from their threads without stopping them: a count a call is adding this instant may be in the next one)."""
        with self._stats_lock:
            total = self.retrier.stats
            now = RetryStats(meter=total.meter)
            for stats in (total, *self._in_flight):
                now.add(stats)
        return attempt_stats(now)

    def _load(self, msg: AnalysisMessage, job: Job, spec: AnalystSpec, saved: dict[str, Checkpoint],
              identity: str) -> AnalystOutput | None:
        """This analyst's committed checkpoint, if it was made under its current identity (analysts.py: its
        requests, categories and schemas, the model); else `checkpoint.stale` names the analyst, which re-runs."""
        cp = saved.get(spec.name)
        if cp is None:
            return None
        if cp.config_hash != identity:
            self.deps.jobs.record_event(msg.job_id, "checkpoint.stale", chunk_id=msg.chunk_id, analyst=spec.name,
                                        checkpoint_hash=cp.config_hash, current_hash=identity,
                                        job_hash=job.config_hash)
            return None
        try:
            return AnalystOutput.model_validate_json(self.deps.claims.checkpoint_output(cp))
        except Exception as exc:  # recorded as an event; the analyst is re-run
            self.deps.jobs.record_event(msg.job_id, "checkpoint.missing", chunk_id=msg.chunk_id, analyst=spec.name,
                                        error_code="runtime.checkpoint_missing", detail=type(exc).__name__)
            return None

    def _run_one(self, spec: AnalystSpec, chunk: Chunk, retrier: Retrier) -> AnalystOutput:
        """One analyst's steps; its calls are its own (`CallScope`: counted on its retrier's stats, the stop checks
        run again after a wait for quota)."""
        calls_before = retrier.stats.calls
        try:
            with calls_for(CallScope(retrier.stats, functools.partial(self._ready, retrier))):
                return run_analyst(spec, chunk, functools.partial(self._call_step, retrier, spec.name))
        except ReviewError as exc:
            out = analyst_ended(spec, chunk, exc.envelope, retrier.stats.calls - calls_before)
            if out is None:
                raise
            return out

    def _call_step(self, retrier: Retrier, analyst: str, build: Callable[[ErrorEnvelope | None], ModelRequest],
                   parse: Callable[[ModelResponse], ParsedItems]) -> tuple[ParsedItems, int]:
        """One step of an analyst: its batch answer when the chunk left the batch lane with one, else its calls with
        tier-1 retries through the onion. The chunk's first step warms the prompt cache alone; outside the retrier, so
        a stop seen after the wait (a cancel, a lost lease, no time left) keeps its type."""
        if self.answers is not None:  # a chunk that left the batch lane: its batch answers first
            try:
                return self.answers.step(build, parse)
            except batch.AwaitBatch:
                pass  # no answer for this step: it is called on demand, from its first request
        leads = self.warm.enter(caches(self.model.model_id, build(None)), functools.partial(self._ready, retrier))
        succeeded = False
        try:
            result = retrier.call_with_repair(build, self.model.invoke, parse, step=analyst)
            succeeded = True
            return result
        finally:
            if leads:
                self.warm.leave(succeeded)


def analyst_ended(spec: AnalystSpec, chunk: Chunk, env: ErrorEnvelope, calls: int) -> AnalystOutput | None:
    """The output of an analyst an error ended, rather than the attempt: refused (a policy stop), or failed (its
    answer was invalid after the repair: permanent for this analyst). None: the error is the attempt's."""
    if env.error_class is ErrorClass.POLICY:
        return refused_output(spec, chunk, calls)
    if env.error_class is ErrorClass.SEMANTIC:
        return AnalystOutput(analyst=spec.name, status="failed", findings=[], model_calls=calls,
                             error_code=env.error_code)
    return None


def attempt_meter(settings: Settings, counter: RequestCounter) -> AttemptMeter:
    """What a chunk attempt spends besides its tokens: its requests (`counter`) and, in a Lambda worker, one
    invocation and its duration at the function's memory; priced at the profile's table."""
    p = settings.profile
    return AttemptMeter(p.prices, model_price(p.prices, settings.effective_model_id), counter,
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

    def __init__(self, deps: Deps, model: Layer, *, rng: random.Random | None = None,
                 sleep: Callable[[float], None] = time.sleep, call_safety_s: float | None = None):
        self.deps, self.s, self.model, self.sleep = deps, deps.settings, model, sleep
        self.daily = layer(model, DailyQuotaModel)  # its hold names the job's waiting condition (`_waiting`)
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
        log_fields.bind(log_fields.of_job(job))  # what this attempt's log lines know from here on
        log_fields.bind(log_fields.job_fields(lease_deadline=record.claim_expires_at, checkpoint_version=fence))
        stats = RetryStats(meter=attempt_meter(self.s, counter))
        outcome = self._claimed(msg, delivery, job, fence, record, stats)
        if outcome.action is Action.LEASE_LOST:  # fenced out, none of its fenced writes went through: what it spent
            self.deps.jobs.add_fenced_out(msg.job_id, msg.chunk_id, fence, attempt_stats(stats))  # is its job's still
        return outcome

    def _claimed(self, msg: AnalysisMessage, delivery: Delivery, job: Job, fence: int, record: ChunkRecord,
                 stats: RetryStats) -> Outcome:
        """The attempt under the claim it won (`fence`): its analysts, then what their outcome makes of the chunk."""
        if job.state in (JobState.CANCELLING, JobState.CANCELLED):  # no work for a job being (or) cancelled
            return settle_cancelled(self.deps, msg, fence, stats, "claim", ended=job.state is JobState.CANCELLED)
        if record.failures >= msg.max_attempts:
            env = record.last_error or ErrorEnvelope.of("runtime.worker_lost", "poison budget used by earlier attempts")
            return self._dead_lettered(msg, fence, env, attempt_stats(stats))
        error: ErrorEnvelope | None = None
        outputs: dict[str, AnalystOutput] = {}
        waiting: list[BatchRecord] = []  # a batch-mode chunk's requests still to be answered (pipeline/batch.py)
        answers = batch.Answers.load(self.deps, record) if record.batch_answer_keys else None
        batch_lane = batch.in_batch_lane(self.deps, job, record)  # its calls go to batch inference: none from the pacers
        if job.inference is Inference.BATCH and not batch_lane and job.on_demand_since is None:
            self.deps.jobs.mark_on_demand(job.job_id)  # from now on its chunks wait on the workers (priority.py)
        has_time = self._has_time(delivery)
        watch = lifecycle.CancelWatch(self.deps, msg.job_id)
        with Heartbeat(self.deps, msg, fence, delivery, self.s.claim_lease_s) as hb:
            retrier = Retrier(policy=self.s.profile.tier1.model_retry, budget=RetryBudget(self.s.profile.tier1.chunk_retry_budget_s),
                              stats=stats, rng=self.rng, sleep=self.sleep, has_time=has_time,
                              check=before_each_call(hb, watch), on_retry=retry_recorder(self.deps, msg, watch))
            runner = AnalystRunner(self.deps, self.model, retrier, hb, has_time, self.analyst_extra_s, watch, answers)
            try:
                if batch_lane:
                    outputs, waiting = runner.run_batch(msg, job, fence, record,
                                                        answers or batch.Answers(msg.job_id, msg.chunk_id))
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
        outcome = self._on_error(msg, fence, delivery, stats, error, progressed=bool(runner.committed)) if error \
            else self._await_batch(msg, fence, stats, waiting) if waiting else self._complete(msg, fence, stats, outputs)
        self._waiting(job, error, progressed=bool(runner.committed))
        outcome.stats = stats
        return outcome

    # ------------------------------------------------------------------ pieces
    def _waiting(self, job: Job, error: ErrorEnvelope | None, *, progressed: bool) -> None:
        """The job's named waiting condition: set by the first hold of one of its chunks for the daily token quota
        (`job.waiting_quota`), ended by the first progress after it (`job.waiting_ended`)."""
        quota = self.daily.quota if self.daily is not None else None  # the daily hold, when one is known now
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
                               n_findings=len(findings))
        done = self.deps.claims.finish(msg.job_id, msg.chunk_id, fence, ChunkStatus.DONE, attempt_stats(stats),
                                       outcome=outcome)
        if done is None:
            self.deps.jobs.record_event(msg.job_id, "chunk.lease_lost", chunk_id=msg.chunk_id, fence=fence,
                                        at_step="complete")
            return Outcome(Action.LEASE_LOST)
        announce(self.deps, done)
        return Outcome(Action.DONE, {"findings": len(findings), "calls": stats.calls})

    def _await_batch(self, msg: AnalysisMessage, fence: int, stats: RetryStats, waiting: list[BatchRecord]) -> Outcome:
        """Park the chunk `awaiting_batch` with its missing requests; its message is done with (pipeline/batch.py)."""
        if batch.park(self.deps, msg.job_id, msg.chunk_id, fence, attempt_stats(stats), waiting) is None:
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
