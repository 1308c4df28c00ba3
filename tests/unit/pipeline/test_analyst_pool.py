"""A chunk's analysts run concurrently (Profile.analyst_concurrency), each still checkpointed and fenced,
and a cancel, a lost lease or an error still stops them as the one-by-one worker did. In-flight calls are
measured with a model whose calls take real (short) time; no test here asserts a duration."""

from __future__ import annotations

import random
import threading
import time

import pytest
from botocore.exceptions import ClientError

from contract_review.domain import lifecycle
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.analyst_pool import GroupCommit
from contract_review.pipeline.worker import Delivery
from contract_review.review.analysts import ChunkFindings, analysts_for
from contract_review.wiring import chunk_worker

from ..fakes import SETTINGS, FakeWorld
from ..scenarios import one_chunk_job

ANALYSTS = [a.name for a in analysts_for(SETTINGS.profile.review.analyst_count)]
CALL_S = 0.02  # each call takes this long, so the calls of analysts run at once overlap
CHECK_TO_CALL_S = 0.01  # a call that passed its check just before another analyst's stop was raised


class OverlapModel:
    """The offline rule model, each call taking CALL_S; records the most calls in flight at once, the
    start time of every call, and runs `during(request)` inside the call named by `at`."""

    model_id = "offline-rules-v1"

    def __init__(self, at: int | None = None, during=None, fail: set[str] | None = None, meet: int = 1):
        self.inner = OfflineRuleModel()
        self.lock = threading.Condition()
        self.meet = meet  # a call waits (up to 1 s) until this many are in flight: overlap is not left to timing
        self.in_flight = self.max_in_flight = self.calls = 0
        self.started: list[tuple[float, str, str]] = []
        self.ended: list[float] = []
        self.at, self.during, self.fail = at, during, fail or set()
        self.during_done = threading.Event()  # no other call ends (so no analyst calls again) before `during` ran

    def invoke(self, request: ModelRequest) -> ModelResponse:
        with self.lock:
            self.calls += 1
            n = self.calls
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.started.append((time.monotonic(), request.analyst, request.step))
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.in_flight >= self.meet, timeout=1.0)
        try:
            if n == self.at and self.during is not None:
                try:
                    self.during(request)
                finally:
                    self.during_done.set()
            time.sleep(CALL_S)
            if self.at is not None and n != self.at:
                self.during_done.wait(timeout=2.0)
            if request.analyst in self.fail:
                raise ClientError({"Error": {"Code": "ValidationException", "Message": "scripted"},
                                   "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}, "Converse")
            return self.inner.invoke(request)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.ended.append(time.monotonic())


def _world(concurrency: int) -> FakeWorld:
    profile = SETTINGS.profile.with_overrides(**{"analyst_concurrency": concurrency})
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": profile}))


def _handle(world: FakeWorld, msg: AnalysisMessage, model: OverlapModel):
    worker = chunk_worker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None, call_safety_s=0.5)
    return worker.handle(msg, Delivery("mid-1", "rh-1", 1, 120, remaining_ms=lambda: 10**9))


def _findings(world: FakeWorld, job_id: str, chunk_id: str) -> list[dict]:
    record = world.claims.get(job_id, chunk_id)
    assert record is not None and record.findings_key
    return [f.model_dump() for f in ChunkFindings.model_validate_json(world.artifacts.get_text(record.findings_key)).findings]


@pytest.mark.parametrize("concurrency, expected", [(1, 1), (4, 4), (11, 11)])
def test_a_chunks_analysts_overlap_up_to_the_configured_concurrency(concurrency, expected):
    # GIVEN a one-chunk job and a worker whose profile runs `concurrency` analysts at once
    world = _world(concurrency)
    job_id, msg = one_chunk_job(world)
    model = OverlapModel(meet=expected)
    # WHEN it handles the chunk
    outcome = _handle(world, msg, model)
    # THEN exactly that many calls were in flight at once (measured), never more
    assert outcome.action == "done"
    assert model.max_in_flight == expected
    # AND every analyst was checkpointed once under the claim's fence, and every call counted
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DONE
    assert set(record.checkpoints) == set(ANALYSTS) and set(record.checkpoints.values()) == {1}
    assert record.n_calls == model.calls == outcome.stats.calls
    done = [a["analyst"] for e in world.jobs.events(job_id) if e.type == "analyst.done" for a in e.detail["analysts"]]
    assert sorted(done) == sorted(ANALYSTS)
    numbers = [e.number for e in world.jobs.events(job_id)]
    assert numbers == list(range(1, len(numbers) + 1))  # events numbered one by one, none lost or doubled


def test_concurrent_analysts_find_exactly_what_one_by_one_analysts_find_in_the_same_order():
    found = {}
    for concurrency in (1, 11):
        world = _world(concurrency)
        job_id, msg = one_chunk_job(world)
        assert _handle(world, msg, OverlapModel()).action == "done"
        found[concurrency] = _findings(world, job_id, msg.chunk_id)
    assert found[11] == found[1] and found[1]


def test_a_chunk_takes_about_two_rounds_of_calls_not_one_per_call():
    # a chunk's critical path: each analyst's locate, then its assess. With all analysts at once, every
    # locate starts before any assess, so the calls form two rounds (measured by start order, not time;
    # the first calls meet, so that a slow thread start on a busy machine cannot reorder them)
    world = _world(11)
    _job_id, msg = one_chunk_job(world)
    model = OverlapModel(meet=len(ANALYSTS))
    assert _handle(world, msg, model).action == "done"
    steps = [step for _t, _analyst, step in sorted(model.started)]
    first_assess = steps.index("assess") if "assess" in steps else len(steps)
    assert steps[:first_assess] == ["locate"] * len(ANALYSTS)


class CachingModel(OverlapModel):
    """Claude Sonnet 4.5 (minimum cacheable prefix 1,024 tokens): this chunk's shared prefix reaches it."""

    model_id = "global.anthropic.claude-sonnet-4-5-20250929-v1:0"


def test_the_chunks_first_call_warms_the_prompt_cache_before_the_other_analysts_call():
    # GIVEN all analysts at once and a model whose cache keeps this chunk's shared prefix
    world = _world(11)
    _job_id, msg = one_chunk_job(world)
    model = CachingModel()
    assert _handle(world, msg, model).action == "done"
    # THEN the first call (it writes the prefix) ended before any other started: the others read it, none
    # paid the write price in parallel; after it, the analysts still ran at once
    starts = sorted(t for t, _a, _s in model.started)
    assert min(model.ended) <= starts[1]
    assert model.max_in_flight > 1


def test_a_prefix_under_the_models_minimum_warms_nothing_and_nobody_waits():
    world = _world(11)
    _job_id, msg = one_chunk_job(world)
    model = OverlapModel(meet=len(ANALYSTS))  # offline-rules-v1 is simulated as Sonnet 4.6: minimum 2,048
    assert _handle(world, msg, model).action == "done"
    assert model.max_in_flight == len(ANALYSTS)  # the first calls all met: none waited for another


def test_a_cancel_seen_by_one_analyst_stops_every_analyst_before_its_next_call():
    # GIVEN all 11 analysts' locate calls in flight; during the last of them to start, the job is cancelled
    world = _world(11)
    job_id, msg = one_chunk_job(world)
    cancelled_at: list[float] = []

    def cancel(_request: ModelRequest) -> None:
        assert lifecycle.request_cancel(world.deps, job_id, by="alice").changed
        cancelled_at.append(time.monotonic())
        world.clock.advance(lifecycle.CANCEL_CHECK_MAX_AGE_S)  # the calls last as long as a read is kept
    model = OverlapModel(at=len(ANALYSTS), during=cancel, meet=len(ANALYSTS))  # the 11th call: the last first one
    # WHEN the worker handles the chunk
    outcome = _handle(world, msg, model)
    # THEN the calls under way finished, and not one call started after the cancel (measured)
    assert outcome.action == "cancelled"
    assert model.calls == len(ANALYSTS)
    assert all(t < cancelled_at[0] for t, _a, _s in model.started)
    # AND the chunk settled cancelled once, keeping no checkpoint written after the cancel was seen
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.CANCELLED
    assert [e.type for e in world.jobs.events(job_id)].count("chunk.cancelled") == 1
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.CANCELLING


def test_a_lost_lease_stops_every_analyst_and_no_checkpoint_is_committed_after_it():
    # GIVEN a worker whose claim is taken over (fence 2) during the first call
    world = _world(11)
    job_id, msg = one_chunk_job(world)

    def steal(_request: ModelRequest) -> None:
        world.clock.advance(SETTINGS.profile.recovery.claim_lease_s + 1)  # the lease lapses; another worker claims
        won = world.claims.claim(job_id, msg.chunk_id, "other", SETTINGS.profile.recovery.claim_lease_s, 2)
        assert won.won and won.fence == 2
    model = OverlapModel(at=1, during=steal)
    refused: list[float] = []
    real_put = world.claims.put_checkpoints

    def put(*args, **kwargs) -> bool:
        ok = real_put(*args, **kwargs)
        if not ok:
            refused.append(time.monotonic())
        return ok
    world.claims.put_checkpoints = put  # type: ignore[method-assign]  # the fake's method, observed
    # WHEN the worker handles the chunk
    outcome = _handle(world, msg, model)
    # THEN it stopped as lease lost: every checkpoint write it tried was refused by the fence
    assert outcome.action == "lease_lost" and refused
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.fence == 2 and record.checkpoints == {}
    # AND no call started after the first refused checkpoint write (the hard stop reached every analyst),
    # but for one that had passed its check in the moment between the refusal and the stop being raised
    assert all(t < refused[0] + CHECK_TO_CALL_S for t, _a, _s in model.started)


def test_a_permanent_error_in_one_analyst_lets_the_others_finish_and_checkpoint_then_fails_the_chunk():
    # GIVEN one analyst whose calls fail with a permanent error
    world = _world(11)
    job_id, msg = one_chunk_job(world)
    bad = ANALYSTS[3]
    model = OverlapModel(fail={bad}, meet=len(ANALYSTS))  # it fails once every analyst has started (not left to timing)
    # WHEN the worker handles the chunk
    outcome = _handle(world, msg, model)
    # THEN the chunk failed with the permanent error's code
    assert outcome.action == "failed" and outcome.detail["error"] == "model.request_invalid"
    # AND the analysts already under way finished and stayed checkpointed: a retry would not redo them
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and bad not in record.checkpoints and len(record.checkpoints) == len(ANALYSTS) - 1


# ------------------------------------------------------------------------------ group commit
def test_group_commit_writes_what_arrived_during_a_write_in_one_write_and_each_caller_waits_for_its_own():
    # GIVEN a group commit whose first write is held until three more items are waiting
    writes: list[list[str]] = []
    waiting = threading.Semaphore(0)

    def write(batch: list[str]) -> int:
        if not writes:
            for _ in range(3):
                assert waiting.acquire(timeout=5)
            time.sleep(0.05)  # the three are inside commit(), queued behind this write
        writes.append(list(batch))
        return len(writes)

    commits: GroupCommit[str, int] = GroupCommit(write)
    results: dict[str, int] = {}

    def commit(item: str) -> None:
        if item != "a":
            waiting.release()
        results[item] = commits.commit(item)

    first = threading.Thread(target=commit, args=("a",))
    first.start()
    time.sleep(0.05)  # "a" is being written
    others = [threading.Thread(target=commit, args=(x,)) for x in "bcd"]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(timeout=10)
    # THEN the three that arrived during the first write were written together, in a second write, and
    # each caller returned the result of the write that carried its item
    assert writes[0] == ["a"] and sorted(writes[1]) == ["b", "c", "d"] and len(writes) == 2
    assert results == {"a": 1, "b": 2, "c": 2, "d": 2}


def test_group_commit_raises_a_failed_write_in_every_caller_whose_item_it_carried():
    commits: GroupCommit[str, None] = GroupCommit(lambda batch: (_ for _ in ()).throw(RuntimeError("down")))
    with pytest.raises(RuntimeError, match="down"):
        commits.commit("a")
    ok: GroupCommit[str, str] = GroupCommit(lambda batch: ",".join(batch))
    assert ok.commit("b") == "b"  # alone, an item is written by itself at once


def test_analysts_that_finish_together_are_committed_together_each_exactly_once():
    # GIVEN 11 analysts at once whose checkpoint writes take time
    world = _world(11)
    real_put = world.claims.put_checkpoints
    writes: list[list[str]] = []

    def slow_put(job_id, chunk_id, fence, batch, **kw) -> bool:
        writes.append([w.analyst for w in batch])
        time.sleep(0.03)
        return real_put(job_id, chunk_id, fence, batch, **kw)
    world.claims.put_checkpoints = slow_put  # type: ignore[method-assign]  # the fake's method, slowed down
    job_id, msg = one_chunk_job(world)
    # WHEN the worker handles the chunk
    outcome = _handle(world, msg, OverlapModel(meet=11))
    # THEN every analyst was committed exactly once, in fewer writes than analysts
    assert outcome.action == "done"
    committed = [a for batch in writes for a in batch]
    assert sorted(committed) == sorted(ANALYSTS)
    assert len(writes) < len(ANALYSTS), writes
    # AND one `analyst.done` event per write, naming that write's analysts
    events = [e for e in world.jobs.events(job_id) if e.type == "analyst.done"]
    assert [[a["analyst"] for a in e.detail["analysts"]] for e in events] == writes
    # AND the chunk record holds every analyst's commit under the claim's fence
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and set(record.checkpoints) == set(ANALYSTS)


class FirstCallFails(CachingModel):
    """The chunk's first call fails for good (a 400): the leader's step fails, and the next caller must lead."""

    def invoke(self, request: ModelRequest) -> ModelResponse:
        with self.lock:
            first = self.calls == 0
        if first:
            with self.lock:
                self.calls += 1
                self.started.append((time.monotonic(), request.analyst, request.step))
            time.sleep(CALL_S)
            with self.lock:
                self.ended.append(time.monotonic())
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "scripted"},
                               "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}, "Converse")
        return super().invoke(request)


def test_a_leader_whose_step_fails_hands_the_warm_up_to_the_next_call():
    # GIVEN the chunk's first call fails (its analyst's step fails: nothing was cached)
    world = _world(11)
    _job_id, msg = one_chunk_job(world)
    model = FirstCallFails()
    _handle(world, msg, model)
    # THEN the second call also ran alone (it leads the warm-up now): the third started after it ended
    starts = sorted(t for t, _a, _s in model.started)
    ends = sorted(model.ended)
    assert len(starts) >= 3 and ends[0] <= starts[1] and ends[1] <= starts[2]


def test_waiting_for_the_warm_up_reads_nothing_until_the_leader_is_done():
    """A waiter does not poll the job (the cancel check is a strongly consistent read): it waits on the leader,
    then checks once. The reads of a chunk are one per call, not one per waiter per tick."""
    world = _world(11)
    _job_id, msg = one_chunk_job(world)
    reads = {"n": 0}
    real_get = world.jobs.get

    def counted(job_id: str):
        reads["n"] += 1
        return real_get(job_id)
    world.jobs.get = counted  # type: ignore[method-assign]  # count the job reads
    model = CachingModel(at=1, during=lambda _r: time.sleep(0.5))  # the leader's call takes half a second
    assert _handle(world, msg, model).action == "done"
    assert reads["n"] <= 3 * model.calls + 5  # per call: the cancel check, after a wait: one more; plus the attempt's
