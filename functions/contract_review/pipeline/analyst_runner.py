"""The analysts of one chunk attempt: `AnalystRunner` runs them (checkpointed, fenced, `analyst_concurrency` at once)
and `Heartbeat` keeps the attempt's claim and message alive meanwhile. The chunk worker (worker.py) claims the chunk,
builds these under its claim and settles what they come to.

A model call leaves here once: `retrier.call_with_repair` calls the worker's onion (model/onion.py: the pause, the
daily quota, the pacers, the counting, then the model), under the analyst's `CallScope` (its counts, its stop checks).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from contract_review.domain import lifecycle
from contract_review.domain.batch_inference import BatchRecord
from contract_review.domain.chunk_records import Checkpoint, CheckpointWrite, ChunkRecord
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, LeaseLost, ReviewError
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse, caches
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, Job
from contract_review.model.onion import CallScope, calls_for
from contract_review.pipeline import batch_inference
from contract_review.pipeline.analyst_pool import AnalystPool, GroupCommit, WarmUp
from contract_review.reliability.retry import Retrier, RetryStats
from contract_review.review.analysts import (
    AnalystOutput,
    AnalystSpec,
    ParsedItems,
    analysis_identities,
    analysts_for,
    refused_output,
    run_analyst,
)
from contract_review.review.chunking import Chunk

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    """What the queue told us about this receipt of the message."""

    message_id: str
    receipt_handle: str
    receive_count: int
    visibility_s: int
    remaining_ms: Callable[[], int] | None = None  # the invocation's remaining time; None: no function timeout


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


class AnalystRunner:
    """Runs one chunk's analysts for one attempt: loads committed checkpoints, runs the rest with
    tier-1 retries, `profile.review.analyst_concurrency` at once (analyst_pool.py), and commits each output
    under the attempt's fencing token as soon as it is ready. An analyst starts only when the time
    left fits all its calls (`analyst_extra_s` more than one call needs); `committed` lists what this
    attempt checkpointed (its progress)."""

    def __init__(self, deps: Deps, model: ModelClient, retrier: Retrier, hb: Heartbeat,
                 has_time: Callable[[float], bool], analyst_extra_s: float = 0.0,
                 watch: lifecycle.CancelWatch | None = None, answers: batch_inference.Answers | None = None):
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
        # per analyst: what its checkpoint must match, under the model it runs on (the job's), or under a model the
        # job ran on before it fell back (pipeline/fallback.py: what those analysts finished is kept)
        identities = analysis_identities(self.deps.settings, specs, self.model.model_id)
        earlier = [analysis_identities(self.deps.settings, specs, m) for m in job.earlier_models]
        outputs: dict[str, AnalystOutput] = {}
        todo: list[AnalystSpec] = []
        for spec in specs:
            loaded = self._load(msg, job, spec, saved, identities[spec.name], {e[spec.name] for e in earlier})
            if loaded is not None:
                outputs[spec.name] = loaded
            else:
                todo.append(spec)
        return chunk, specs, identities, outputs, todo

    def run_batch(self, msg: AnalysisMessage, job: Job, fence: int, record: ChunkRecord,
                  answers: batch_inference.Answers) -> tuple[dict[str, AnalystOutput], list[BatchRecord]]:
        """A batch-mode chunk (batch_inference.py): each analyst runs on its batch answers; the ones that end are
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
            except batch_inference.AwaitBatch as wait:
                waiting.append(wait.record)
                continue
            except ReviewError as exc:
                ended_by = analyst_ended(spec, chunk, exc.envelope, 0)
                if ended_by is None:
                    raise
                out = ended_by
            ended.append((spec.name, self._answered(out)))
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
            out = self._answered(self._run_one(spec, chunk, retrier))
        finally:
            self._add_stats(retrier.stats)
        if not commits.commit((spec.name, out)):
            raise LeaseLost("checkpoint write rejected by fencing token")
        return out

    def _answered(self, out: AnalystOutput) -> AnalystOutput:
        """The output as checkpointed: with the model that answered it (the report names each analyst's)."""
        return out.model_copy(update={"model_id": self.model.model_id})

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
              identity: str, earlier: set[str]) -> AnalystOutput | None:
        """This analyst's committed checkpoint, if it was made under its current identity (analysts.py: its
        requests, categories and schemas, the model) or its identity under a model the job ran on before (`earlier`);
        else `checkpoint.stale` names the analyst, which re-runs."""
        cp = saved.get(spec.name)
        if cp is None:
            return None
        if cp.config_hash != identity and cp.config_hash not in earlier:
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
            except batch_inference.AwaitBatch:
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
