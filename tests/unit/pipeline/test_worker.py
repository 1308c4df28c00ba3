"""The analysis worker's decisions against in-memory repositories (no AWS): what one delivery
does to the chunk record, the queues, the job and the model-call count on every path."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter

import pytest
from botocore.exceptions import ClientError

from contract_review.config.profile import PROFILES
from contract_review.domain.chunk_records import CheckpointWrite, ChunkRecord, ReleaseReason
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.worker import ChunkWorker, Delivery, Heartbeat, Tier2
from contract_review.review.analysts import ChunkFindings, analysis_identities, analysts_for
from contract_review.wiring import chunk_worker
from tests.oracle import counted

from ..fakes import SETTINGS, FakeWorld
from ..scenarios import one_chunk_job

RUN = analysts_for(SETTINGS.profile.review.analyst_count)  # the analysts a job runs (every one)
ANALYSTS = len(RUN)


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "scripted"},
                        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}}}, "Converse")


class ScriptedModel:
    """The offline rule model, except that the calls listed in `fail` raise; counts calls."""

    model_id = "offline-rules-v1"

    def __init__(self, fail: dict[tuple[str, str], list[Exception | ModelResponse]] | None = None,
                 always: Exception | None = None):
        self.inner = OfflineRuleModel()
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.always = always
        self.calls: Counter[tuple[str, str]] = Counter()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        key = (request.analyst, request.step)
        self.calls[key] += 1
        if self.always is not None:
            raise self.always
        queue = self.fail.get(key)
        if queue:
            item = queue.pop(0)
            if isinstance(item, Exception):
                raise item
            return item
        return self.inner.invoke(request)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class PeekAtClaim(ScriptedModel):
    """The scripted model, which also keeps the chunk record as it was at the first model call (the claim)."""

    def __init__(self, world: FakeWorld, job_id: str, chunk_id: str):
        super().__init__()
        self.world, self.job_id, self.chunk_id = world, job_id, chunk_id
        self.record: ChunkRecord | None = None

    def invoke(self, request: ModelRequest) -> ModelResponse:
        if self.record is None:
            self.record = self.world.claims.get(self.job_id, self.chunk_id)
        return super().invoke(request)


def _delivery(receive_count: int = 1, remaining_ms: int = 10**9) -> Delivery:
    return Delivery(message_id="mid-1", receipt_handle="rh-1", receive_count=receive_count, visibility_s=120,
                    remaining_ms=lambda: remaining_ms)


def _worker(world: FakeWorld, model: ScriptedModel) -> ChunkWorker:
    return chunk_worker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None, call_safety_s=0.5)


# ------------------------------------------------------------------------------ success
def test_a_chunk_is_analysed_checkpointed_settled_and_announced(world):
    # GIVEN a running job with one chunk
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel()
    # WHEN a worker handles its message
    outcome = _worker(world, model).handle(msg, _delivery())
    # THEN every analyst ran once per step it needed, was checkpointed under the claim's fence,
    assert outcome.action == "done"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DONE and record.fence == 1
    assert set(record.checkpoints) == {s.name for s in RUN} and set(record.checkpoints.values()) == {1}
    assert record.n_calls == model.total == outcome.stats.calls and record.receives == 1 and record.claimed_by is None
    # the findings went to the artifact the record names, and exactly one result was announced
    findings = ChunkFindings.model_validate_json(world.artifacts.get_text(record.findings_key or ""))
    assert record.n_findings == len(findings.findings) > 0
    (result,) = world.queues.results()
    assert (result.chunk_id, result.status, result.fence, result.findings_key) == \
        (msg.chunk_id, ChunkStatus.DONE, 1, record.findings_key)


def test_a_redelivery_of_a_finished_chunk_resends_its_result_without_model_calls(world):
    # GIVEN a chunk finished once, whose results message was lost
    job_id, msg = one_chunk_job(world)
    _worker(world, ScriptedModel()).handle(msg, _delivery())
    world.queues.drain(Queue.RESULTS)
    # WHEN the same message is delivered again
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery(receive_count=2))
    # THEN nothing is analysed again and the result is announced again (same dedup id as before)
    assert outcome.action == "duplicate" and model.total == 0
    (result,) = world.queues.results()
    assert result.status is ChunkStatus.DONE


def test_a_message_for_an_ended_job_is_acknowledged_without_work(world):
    # GIVEN a job that has ended (failed: a retry may run its chunks later)
    job_id, msg = one_chunk_job(world)
    world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED)
    model = ScriptedModel()
    # WHEN its chunk message arrives THEN it is skipped: no claim, no model call
    assert _worker(world, model).handle(msg, _delivery()).action == "skipped"
    assert model.total == 0 and world.claims.get(job_id, msg.chunk_id).fence == 0


def test_a_message_for_a_cancelled_job_settles_its_chunk_cancelled_without_a_model_call(world):
    # GIVEN a job cancelled while its chunk's message was on its way
    job_id, msg = one_chunk_job(world)
    world.jobs.transition(job_id, (JobState.RUNNING,), JobState.CANCELLED)
    model = ScriptedModel()
    # WHEN the message arrives THEN the chunk is settled `cancelled` (fenced), counted on the job, no model call
    assert _worker(world, model).handle(msg, _delivery()).action == "cancelled"
    record = world.claims.get(job_id, msg.chunk_id)
    assert model.total == 0 and record.status is ChunkStatus.CANCELLED and record.fence == 1
    assert msg.chunk_id in counted(world.claims, world.jobs.get(job_id))


def test_checkpointed_analysts_are_loaded_not_rerun(world):
    # GIVEN an earlier attempt that checkpointed the liability analyst, then lost its lease
    job_id, msg = one_chunk_job(world)
    earlier = world.claims.claim(job_id, msg.chunk_id, "earlier", 3, 1)
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 2}
    identity = analysis_identities(world.settings, RUN)["liability"]
    assert world.claims.put_checkpoints(job_id, msg.chunk_id, earlier.fence,
                                        [CheckpointWrite(analyst="liability", config_hash=identity,
                                                         status="ok", output_json=json.dumps(out))])
    world.clock.advance(10)
    # WHEN the message is redelivered to another worker
    model = ScriptedModel()
    assert _worker(world, model).handle(msg, _delivery(receive_count=2)).action == "done"
    # THEN the liability analyst made no call; the others ran
    assert model.calls[("liability", "locate")] == 0 and model.calls[("disputes", "locate")] == 1
    assert world.claims.get(job_id, msg.chunk_id).redeliveries == 1


def test_a_checkpoint_made_with_another_config_is_rerun_and_recorded_as_stale(world):
    # GIVEN an earlier attempt that checkpointed the liability analyst under another identity (an older prompt)
    job_id, msg = one_chunk_job(world)
    earlier = world.claims.claim(job_id, msg.chunk_id, "earlier", 3, 1)
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 2}
    world.claims.put_checkpoints(job_id, msg.chunk_id, earlier.fence,
                                 [CheckpointWrite(analyst="liability", config_hash="old-hash",
                                                  status="ok", output_json=json.dumps(out))])
    world.clock.advance(10)
    # WHEN the message is delivered again
    model = ScriptedModel()
    _worker(world, model).handle(msg, _delivery())
    # THEN the analyst ran again, a checkpoint.stale event names it with both identities, and its new
    # checkpoint carries its current identity
    assert model.calls[("liability", "locate")] == 1
    identity = analysis_identities(world.settings, RUN)["liability"]
    job = world.jobs.get(job_id)
    assert job is not None
    stale = [e.detail for e in world.jobs.events(job_id) if e.type == "checkpoint.stale"]
    assert stale == [{"chunk_id": msg.chunk_id, "analyst": "liability", "checkpoint_hash": "old-hash",
                      "current_hash": identity, "job_hash": job.config_hash}]
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and world.claims.checkpoints(record)["liability"].config_hash == identity


# ------------------------------------------------------------------------------ backpressure
def test_sustained_throttling_requeues_without_counting_a_failure(world):
    # GIVEN a model that throttles every call
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel(always=_error("ThrottlingException", 429))
    # WHEN the worker handles the chunk
    outcome = _worker(world, model).handle(msg, _delivery())
    # THEN tier 1 retried, then the chunk was released (no failure) and requeued fresh with a delay
    assert outcome.action == "requeued" and outcome.detail["reason"] == "model.throttled"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 0
    assert record.retries.get("model.throttled", 0) >= 1 and record.last_error is not None
    (sent,) = world.queues.sent[Queue.ANALYSIS]
    fresh = AnalysisMessage.model_validate_json(sent.body)
    assert (fresh.requeues, fresh.reason, fresh.attempt) == (1, "model.throttled", msg.attempt)
    (requeued,) = [e for e in world.jobs.events(job_id) if e.type == "chunk.requeued"]
    assert 0 < float(requeued.detail["delay_s"]) <= world.settings.profile.recovery.throttle_max_delay_s
    assert sent.delay_s == round(float(requeued.detail["delay_s"]))  # whole seconds on SQS
    assert world.queues.results() == [] and world.queues.sent[Queue.ANALYSIS_DLQ] == []


def test_running_out_of_lambda_time_hands_back_at_once_without_a_model_call(world):
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery(remaining_ms=300))
    assert outcome.action == "requeued" and outcome.detail["reason"] == "runtime.time_exhausted"
    assert model.total == 0
    (fresh,) = world.queues.analysis()
    assert (fresh.reason, fresh.requeues) == ("runtime.time_exhausted", 1)
    # nothing was saved: not a failure, but it comes back after a delay (a handoff without progress
    # must not spin) and starts the chunk's backpressure streak
    assert world.queues.sent[Queue.ANALYSIS][0].delay_s >= 1
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.failures == 0
    assert (record.release_reason, record.backpressure_since, record.backpressure_requeues) == \
        (ReleaseReason.BACKPRESSURE, world.clock(), 1)
    assert world.jobs.get(job_id).requeues == 1


# ------------------------------------------------------------------------------ tier 2 and the poison budget
def test_a_transient_failure_goes_to_tier_2_with_a_short_backoff(world):
    # GIVEN a model failing with 5xx on every call
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel(always=_error("ServiceUnavailableException", 503))
    # WHEN the worker handles the chunk THEN it hands the record back to the queue (Tier2)
    with pytest.raises(Tier2) as info:
        _worker(world, model).handle(msg, _delivery())
    assert info.value.envelope.error_code == "model.unavailable"
    # after the policy's tier-1 attempts on the first analyst, and no more
    assert model.total == world.settings.profile.tier1.model_retry.max_attempts
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 1
    assert record.last_error is not None and record.last_error.error_code == "model.unavailable"
    # the visibility was shortened to the first tier-2 backoff instead of the full timeout
    base = world.settings.profile.recovery.tier2_backoff_base_s
    ((queue, handle, seconds),) = world.queues.visibility
    assert (queue, handle) == (Queue.ANALYSIS, "rh-1") and base / 2 <= seconds <= base
    assert "chunk.retry" in world.jobs.types(job_id) and world.queues.results() == []
    assert record.release_reason is ReleaseReason.RETRY and world.jobs.get(job_id).requeues == 0


def test_the_last_allowed_failure_dead_letters_the_chunk_with_its_envelope(world):
    # GIVEN a chunk that already failed budget-1 times
    job_id, msg = one_chunk_job(world)
    budget = msg.max_attempts
    for i in range(budget - 1):
        claim = world.claims.claim(job_id, msg.chunk_id, f"w{i}", 3, 1)
        world.claims.release(job_id, msg.chunk_id, claim.fence, AttemptStats(),
                             ErrorEnvelope.of("model.unavailable"), failure=True)
    # WHEN it fails once more
    outcome = _worker(world, ScriptedModel(always=_error("InternalServerException", 500))).handle(msg, _delivery())
    # THEN it is dead-lettered: settled, its message in the DLQ with the envelope, and announced
    assert outcome.action == "dead_lettered"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DEAD_LETTERED and record.failures == budget
    (dead,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    assert AnalysisMessage.model_validate_json(dead.body).chunk_id == msg.chunk_id
    assert dead.attributes["error_code"] == "model.unavailable"
    assert ErrorEnvelope.model_validate_json(dead.attributes["envelope"]).attempt == budget
    (result,) = world.queues.results()
    assert result.status is ChunkStatus.DEAD_LETTERED and result.error is not None


def test_a_chunk_whose_budget_is_already_spent_is_dead_lettered_without_model_calls(world):
    job_id, msg = one_chunk_job(world)
    for i in range(msg.max_attempts):
        claim = world.claims.claim(job_id, msg.chunk_id, f"w{i}", 3, 1)
        world.claims.release(job_id, msg.chunk_id, claim.fence, AttemptStats(),
                             ErrorEnvelope.of("runtime.worker_lost"), failure=True)
    model = ScriptedModel()
    assert _worker(world, model).handle(msg, _delivery()).action == "dead_lettered"
    assert model.total == 0
    (dead,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    assert dead.attributes["error_code"] == "runtime.worker_lost"


# ------------------------------------------------------------------------------ permanent and job-fatal
def test_a_permanent_error_fails_the_chunk_once_and_the_job_goes_on(world):
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel(always=_error("ValidationException", 400))
    outcome = _worker(world, model).handle(msg, _delivery())
    assert outcome.action == "failed" and model.total == 1  # never retried
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.FAILED
    assert world.jobs.get(job_id).state is JobState.RUNNING
    (result,) = world.queues.results()
    assert result.status is ChunkStatus.FAILED and result.error.error_code == "model.request_invalid"


def test_a_job_fatal_error_fails_the_job_at_once(world):
    job_id, msg = one_chunk_job(world)
    outcome = _worker(world, ScriptedModel(always=_error("AccessDeniedException", 403))).handle(msg, _delivery())
    assert outcome.action == "job_failed"
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.access_denied"
    assert job.ended_at == world.clock()
    assert world.jobs.types(job_id)[-2:] == ["chunk.failed", "job.failed"]
    assert [r.status for r in world.queues.results()] == [ChunkStatus.FAILED]


def test_a_refusal_is_a_recorded_gap_not_a_retry(world):
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel({("licensing", "locate"): [ModelResponse(text="", stop_reason="content_filtered")]})
    assert _worker(world, model).handle(msg, _delivery()).action == "done"
    assert model.calls[("licensing", "locate")] == 1
    assert world.claims.get(job_id, msg.chunk_id).coverage["licensing"] == "refused"


# ------------------------------------------------------------------------------ fencing
def test_a_worker_whose_lease_was_taken_over_commits_nothing(world):
    # GIVEN a worker whose lease another worker takes over between two analysts
    job_id, msg = one_chunk_job(world)
    real_put = world.claims.put_checkpoints
    taken = {}

    def put_then_lose_lease(*args: object, **kw: object) -> bool:
        ok = real_put(*args, **kw)
        if not taken:
            world.clock.advance(world.settings.claim_lease_s + 1)  # this worker stalls past its lease...
            taken["claim"] = world.claims.claim(job_id, msg.chunk_id, "newcomer", 30, 2)  # ...and is replaced
        return ok

    world.claims.put_checkpoints = put_then_lose_lease
    # WHEN the first worker carries on
    outcome = _worker(world, ScriptedModel()).handle(msg, _delivery())
    # THEN its next checkpoint is rejected by the fence: it stops, and the chunk stays with the newcomer
    assert outcome.action == "lease_lost"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.CLAIMED and record.claimed_by == "newcomer"
    assert record.fence == taken["claim"].fence == 2 and list(record.checkpoints) == [RUN[0].name]
    assert world.queues.results() == [] and "chunk.lease_lost" in world.jobs.types(job_id)


def test_a_message_whose_chunk_is_held_by_a_live_lease_is_a_duplicate(world):
    job_id, msg = one_chunk_job(world)
    world.claims.claim(job_id, msg.chunk_id, "owner", 30, 1)
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery(receive_count=2))
    assert outcome.action == "duplicate" and outcome.detail["claimed_by"] == "owner" and model.total == 0


# ------------------------------------------------------------------------------ time, outages, backpressure
# Several deliveries of one chunk in fake time: the queue is the fakes' lists, the clock is the world's.

class MinRandom(random.Random):
    """Every jittered delay at its shortest: the worst case for outages (retries come back soonest)."""

    def uniform(self, a: float, b: float) -> float:
        return a


def _world(**profile: object) -> FakeWorld:
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": SETTINGS.profile.with_overrides(**profile)}))


def _timed_worker(world: FakeWorld, model: ScriptedModel, rng: random.Random | None = None) -> ChunkWorker:
    """A worker whose tier-1 sleeps pass fake time, with the profile's own time margins."""
    return chunk_worker(world.deps, model, rng=rng or random.Random(3), sleep=world.clock.advance)


def drive(world: FakeWorld, worker: ChunkWorker, msg: AnalysisMessage, *, timeout_s: float | None = None,
          limit: int = 500) -> list[str]:
    """Deliver `msg`, then every message the worker sends for the chunk, until none is left; return
    each delivery's action (`tier2` for a batch-item failure). A fresh message arrives after its
    delay, a tier-2 record after its backoff; each delivery gets `timeout_s` of Lambda time."""
    actions: list[str] = []
    receive = 1
    for _ in range(limit):
        deadline = world.clock() + timeout_s if timeout_s is not None else None
        delivery = Delivery(message_id="mid", receipt_handle="rh", receive_count=receive,
                            visibility_s=world.settings.profile.queues.analysis_visibility_s,
                            remaining_ms=None if deadline is None else
                            (lambda d=deadline: int((d - world.clock()) * 1000)))
        try:
            actions.append(worker.handle(msg, delivery).action)
        except Tier2:
            actions.append("tier2")
            world.clock.advance(world.queues.visibility[-1][2])  # the same message, after its backoff
            receive += 1
            continue
        sent = world.queues.drain(Queue.ANALYSIS)
        if not sent:
            return actions
        (fresh,) = sent
        world.clock.advance(fresh.delay_s)
        msg, receive = AnalysisMessage.model_validate_json(fresh.body), 1
    raise AssertionError(f"the chunk was still going after {limit} deliveries: {Counter(actions)}")


class SlowModel(ScriptedModel):
    """Every call takes `seconds` of fake time; records whether a call outlived its invocation."""

    def __init__(self, world: FakeWorld, seconds: float, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]  # ScriptedModel's own keywords
        self.world, self.seconds = world, seconds
        self.deadlines: list[float] = []  # set by the test: the current invocation's deadline

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.world.clock.advance(self.seconds)
        assert not self.deadlines or self.world.clock() <= self.deadlines[-1], "a call outlived its invocation"
        return super().invoke(request)


def test_a_chunk_whose_every_call_takes_over_a_third_of_the_invocation_completes_across_invocations():
    # GIVEN a 20 s Lambda and model calls that each take 6.8 s (more than a third of it), within
    # their 7 s timeout
    world = _world(worker_timeout_s=20, model_call_timeout_s=7)
    job_id, msg = one_chunk_job(world)
    model = SlowModel(world, 6.8)
    # WHEN every message the worker sends for the chunk is delivered, each with 20 s of Lambda time
    actions = drive(world, _timed_worker(world, model), msg, timeout_s=20)
    # THEN the chunk finished done without a single failure
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DONE and record.failures == 0
    # across several invocations (one analyst each: no second analyst fits 20 - 2 x 6.8 s), each handing
    # back through its checkpoints at once
    analysts = len(RUN)
    assert actions == ["requeued"] * (analysts - 1) + ["done"]
    assert {s.delay_s for s in world.queues.sent[Queue.ANALYSIS]} == set()  # drained; delays checked below
    requeued = [e.detail for e in world.jobs.events(job_id) if e.type == "chunk.requeued"]
    assert [(d["reason"], d["delay_s"]) for d in requeued] == [("runtime.time_exhausted", 0)] * (analysts - 1)
    # AND every analyst's model calls were made exactly once: nothing was lost and redone
    assert set(model.calls.values()) == {1} and record.n_calls == model.total
    assert {a for a, _ in model.calls} == {s.name for s in RUN}
    assert world.jobs.get(job_id).requeues == analysts - 1
    assert [r.status for r in world.queues.results()] == [ChunkStatus.DONE]


def test_no_model_call_outlives_its_invocation():
    # GIVEN calls that take their whole 7 s timeout, in a 20 s Lambda
    world = _world(worker_timeout_s=20, model_call_timeout_s=7)
    job_id, msg = one_chunk_job(world)
    model = SlowModel(world, 7.0)
    start = world.clock()
    model.deadlines.append(start + 20)
    # WHEN one invocation works on the chunk
    outcome = _timed_worker(world, model).handle(
        msg, Delivery("mid", "rh", 1, 120, remaining_ms=lambda: int((start + 20 - world.clock()) * 1000)))
    # THEN it made the calls that fit (SlowModel asserts none ended past the deadline) and handed back
    assert outcome.action == "requeued" and model.total in (1, 2)
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and len(record.checkpoints) == 1 and record.failures == 0
    assert record.deadline_at is None  # released: no invocation holds it


def test_the_claim_records_the_invocations_deadline(world):
    job_id, msg = one_chunk_job(world)
    peek = PeekAtClaim(world, job_id, msg.chunk_id)
    _worker(world, peek).handle(msg, _delivery(remaining_ms=20_000))
    assert peek.record is not None and peek.record.deadline_at == world.clock() + 20.0



@pytest.mark.parametrize("remaining_ms", [None, 10**9], ids=["none", "unbounded"])
def test_a_worker_without_a_function_timeout_records_no_deadline(remaining_ms):
    # GIVEN the Fargate poller's delivery: no remaining time, or an unbounded one before SIGTERM
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    peek = PeekAtClaim(world, job_id, msg.chunk_id)

    delivery = Delivery("m", "rh", 1, 30) if remaining_ms is None else \
        Delivery("m", "rh", 1, 30, remaining_ms=lambda: remaining_ms)
    # WHEN it works on a chunk THEN the claim carries no deadline and nothing stops the work
    assert _worker(world, peek).handle(msg, delivery).action == "done"
    assert peek.record is not None and peek.record.deadline_at is None


def test_time_running_out_after_transient_errors_with_nothing_saved_is_a_failed_attempt():
    # GIVEN a 20 s Lambda whose first analyst's locate call fails with 5xx twice (the retries eat the time)
    world = _world(worker_timeout_s=20, model_call_timeout_s=7)
    job_id, msg = one_chunk_job(world)
    first = RUN[0].name
    model = SlowModel(world, 6.8, fail={(first, "locate"): [_error("ServiceUnavailableException", 503)] * 2})
    start = world.clock()
    delivery = Delivery("mid", "rh", 1, 120, remaining_ms=lambda: int((start + 20 - world.clock()) * 1000))
    # WHEN the invocation runs out of time before the analyst's assess call
    with pytest.raises(Tier2) as info:
        _timed_worker(world, model).handle(msg, delivery)
    # THEN it counts as a failed attempt (tier 2), naming the error behind the lost time
    env = info.value.envelope
    assert (env.error_code, env.cause_code) == ("runtime.time_exhausted", "model.unavailable")
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.failures == 1 and record.checkpoints == {}
    assert record.release_reason is ReleaseReason.RETRY and world.queues.analysis() == []
    assert model.calls[(first, "assess")] == 0


def test_time_running_out_after_errors_once_something_was_saved_is_a_handoff():
    # GIVEN a 20 s Lambda, 2 s calls, and a 5xx (retried in tier 1) on the second analyst's locate
    world = _world(worker_timeout_s=20, model_call_timeout_s=7)
    job_id, msg = one_chunk_job(world)
    second = RUN[1].name
    model = SlowModel(world, 2.0, fail={(second, "locate"): [_error("ServiceUnavailableException", 503)]})
    start = world.clock()
    delivery = Delivery("mid", "rh", 1, 120, remaining_ms=lambda: int((start + 20 - world.clock()) * 1000))
    # WHEN the invocation runs out of time after checkpointing the first analyst
    outcome = _timed_worker(world, model).handle(msg, delivery)
    # THEN it is a handoff: requeued, no failure, the checkpoint kept
    assert outcome.action == "requeued" and outcome.detail["reason"] == "runtime.time_exhausted"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.failures == 0 and set(record.checkpoints) == {RUN[0].name, second}
    assert outcome.stats.retries == Counter({"model.unavailable": 1}) and outcome.detail["delay_s"] == 0


def test_a_two_minute_5xx_outage_dead_letters_nothing_with_the_prod_backoffs():
    # GIVEN the prod profile, every jittered delay at its shortest, and a model failing with 5xx for
    # the first two minutes
    world = FakeWorld(settings=SETTINGS.model_copy(update={"profile": PROFILES["prod"]}))
    job_id, msg = one_chunk_job(world)
    until = world.clock() + 120

    class Outage(ScriptedModel):
        def invoke(self, request: ModelRequest) -> ModelResponse:
            self.calls[(request.analyst, request.step)] += 1
            if world.clock() < until:
                raise _error("ServiceUnavailableException", 503)
            return self.inner.invoke(request)

    model = Outage()
    # WHEN the chunk's message is delivered again after each tier-2 backoff
    actions = drive(world, _timed_worker(world, model, MinRandom()), msg)
    # THEN the outage cost four failed attempts, all within the poison budget, and the chunk finished
    assert actions == ["tier2"] * 4 + ["done"]
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DONE
    assert record.failures == 4 < PROFILES["prod"].recovery.poison_budget
    assert [v[2] for v in world.queues.visibility] == [15, 30, 60, 120]
    assert [e.detail["backoff_s"] for e in world.jobs.events(job_id) if e.type == "chunk.retry"] == [15, 30, 60, 120]
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []
    assert [r.status for r in world.queues.results()] == [ChunkStatus.DONE]


def test_the_same_outage_lasting_past_the_budget_dead_letters_the_chunk():
    # GIVEN the prod profile and a model failing with 5xx for ten minutes
    world = FakeWorld(settings=SETTINGS.model_copy(update={"profile": PROFILES["prod"]}))
    job_id, msg = one_chunk_job(world)
    model = ScriptedModel(always=_error("ServiceUnavailableException", 503))
    # WHEN it is delivered until it settles THEN the fifth failed attempt dead-letters it (poison budget)
    actions = drive(world, _timed_worker(world, model, MinRandom()), msg)
    assert actions == ["tier2"] * 4 + ["dead_lettered"]
    (dead,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    assert dead.attributes["error_code"] == "model.unavailable"


def test_throttling_past_the_backpressure_deadline_dead_letters_with_its_own_code_after_a_bounded_number_of_requeues():
    # GIVEN the local profile (backpressure deadline 20 s, requeue delays 1-2 s) and a model that
    # throttles every call, without a Retry-After hint
    world = FakeWorld()
    p = world.settings.profile
    job_id, msg = one_chunk_job(world)
    started = world.clock()
    model = ScriptedModel(always=_error("ThrottlingException", 429))
    # WHEN every requeued message is delivered after its delay
    actions = drive(world, _timed_worker(world, model), msg)
    # THEN the chunk was requeued (no failure) until its backpressure lasted the deadline, then
    # dead-lettered once: a bounded number of requeues, at least a second apart
    requeues = actions.count("requeued")
    assert actions == ["requeued"] * requeues + ["dead_lettered"]
    assert p.recovery.backpressure_deadline_s / p.recovery.throttle_max_delay_s <= requeues <= p.recovery.backpressure_deadline_s + 1
    assert world.clock() - started >= p.recovery.backpressure_deadline_s
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DEAD_LETTERED
    assert record.backpressure_requeues == requeues and record.failures == 1  # the dead-lettering itself
    (dead,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    env = ErrorEnvelope.model_validate_json(dead.attributes["envelope"])
    assert (env.error_code, env.error_class.value, env.cause_code) == \
        ("runtime.backpressure_exhausted", "permanent", "model.throttled")
    assert f"{requeues} requeue(s)" in env.message and f"(deadline {p.recovery.backpressure_deadline_s:.0f} s)" in env.message
    lasted = re.search(r"no progress for (\d+) s", env.message)
    assert lasted is not None and int(lasted.group(1)) >= p.recovery.backpressure_deadline_s
    assert (env.first_seen_at, env.last_seen_at) == (record.backpressure_since, world.clock())
    # AND the job counted every requeue, and the aggregator hears the chunk is dead-lettered
    assert world.jobs.get(job_id).requeues == requeues
    assert [(r.status, r.error.error_code) for r in world.queues.results()] == \
        [(ChunkStatus.DEAD_LETTERED, "runtime.backpressure_exhausted")]


def test_prod_throttling_for_hours_keeps_requeueing_and_stops_at_six():
    # GIVEN the prod profile and a model that throttles every call (analysts one by one: every tier-1 backoff
    # advances the fake clock, and 11 analysts sleeping at once would move it 11 times as fast)
    prod = PROFILES["prod"].with_overrides(**{"analyst_concurrency": 1})
    world = FakeWorld(settings=SETTINGS.model_copy(update={"profile": prod}))
    job_id, msg = one_chunk_job(world)
    started = world.clock()
    model = ScriptedModel(always=_error("ThrottlingException", 429))
    # WHEN it is throttled for as long as it takes to settle
    actions = drive(world, _timed_worker(world, model), msg)
    # THEN nothing failed for the first six hours: requeues with delays growing to 15 minutes
    dead_at = world.queues.sent[Queue.ANALYSIS_DLQ][0].sent_at
    assert dead_at - started >= 6 * 3600
    delays = [e.detail["delay_s"] for e in world.jobs.events(job_id) if e.type == "chunk.requeued"]
    assert delays[0] <= 30 and max(delays) == 900 and len(delays) == actions.count("requeued") < 40
    assert world.claims.get(job_id, msg.chunk_id).last_error.error_code == "runtime.backpressure_exhausted"


def test_progress_restarts_the_backpressure_deadline():
    # GIVEN a chunk that was throttled (its streak started), then an attempt that checkpoints one analyst
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    throttle = _error("ThrottlingException", 429)
    assert _timed_worker(world, ScriptedModel(always=throttle)).handle(msg, _delivery()).action == "requeued"
    first = world.claims.get(job_id, msg.chunk_id)
    assert first is not None and first.backpressure_since == world.clock()
    world.clock.advance(world.settings.profile.recovery.backpressure_deadline_s - 1)
    second = RUN[1].name
    model = ScriptedModel({(second, "locate"): [throttle] * 10})
    assert _timed_worker(world, model).handle(msg, _delivery()).action == "requeued"
    # THEN the streak restarted at this requeue, so throttling goes on being backpressure
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and len(record.checkpoints) == 1
    assert (record.backpressure_since, record.backpressure_requeues) == (world.clock(), 1)
    world.clock.advance(5)
    assert _timed_worker(world, ScriptedModel(always=throttle)).handle(msg, _delivery()).action == "requeued"


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException", "SlowDown"])
def test_aws_throttling_during_an_attempt_is_backpressure_not_failure(world, code):
    # GIVEN DynamoDB/S3 throttling that outlasted botocore's retries on the second checkpoint write
    job_id, msg = one_chunk_job(world)
    real_put = world.claims.put_checkpoints
    writes = {"n": 0}

    def throttled_put(*args: object, **kw: object) -> bool:
        writes["n"] += 1
        if writes["n"] == 2:
            raise ClientError({"Error": {"Code": code, "Message": "slow down"},
                               "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}, "PutItem")
        return real_put(*args, **kw)  # type: ignore[arg-type]

    world.claims.put_checkpoints = throttled_put  # type: ignore[method-assign]
    # WHEN the worker handles the chunk
    outcome = _worker(world, ScriptedModel()).handle(msg, _delivery())
    # THEN the chunk is requeued with a delay like model throttling: no failure, the first checkpoint kept
    assert outcome.action == "requeued" and outcome.detail["reason"] == "aws.throttled"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.failures == 0 and len(record.checkpoints) == 1
    (sent,) = world.queues.sent[Queue.ANALYSIS]
    assert sent.delay_s >= 1 and record.last_error.error_code == "aws.throttled"


def test_aws_throttling_before_the_claim_requeues_the_message_without_touching_the_chunk(world):
    # GIVEN DynamoDB throttling the claim itself
    job_id, msg = one_chunk_job(world)

    def throttled_claim(*args: object, **kw: object) -> object:
        raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"},
                           "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}, "UpdateItem")

    world.claims.claim = throttled_claim  # type: ignore[method-assign, assignment]
    model = ScriptedModel()
    # WHEN the message is delivered
    outcome = _worker(world, model).handle(msg, _delivery())
    # THEN it is acknowledged and sent again after a delay; the chunk record is untouched
    assert outcome.action == "requeued" and outcome.detail["reason"] == "aws.throttled" and model.total == 0
    (sent,) = world.queues.sent[Queue.ANALYSIS]
    fresh = AnalysisMessage.model_validate_json(sent.body)
    assert sent.delay_s >= 1 and (fresh.requeues, fresh.attempt) == (1, msg.attempt)
    assert world.claims.get(job_id, msg.chunk_id).fence == 0


# ------------------------------------------------------------------------------ heartbeats and commits
def test_a_checkpoint_commit_extends_the_lease_and_spares_the_next_heartbeat_its_write(world):
    # GIVEN a claimed chunk and its heartbeat (a short real lease: beats every 0.1 s)
    job_id, msg = one_chunk_job(world)
    claim = world.claims.claim(job_id, msg.chunk_id, "w", 0.3, 1)
    beats: list[float] = []
    real_beat = world.claims.heartbeat

    def beat(*args, **kw) -> bool:
        beats.append(world.clock())
        return real_beat(*args, **kw)
    world.claims.heartbeat = beat  # type: ignore[method-assign]  # the fake's method, observed
    write = [CheckpointWrite(analyst="liability", config_hash="h", status="ok", output_json="{}")]
    with Heartbeat(world.deps, msg, claim.fence, _delivery(), lease_s=0.3, clock=world.clock) as hb:
        # WHEN analysts commit more often than every lease/3, each commit extending the lease
        for _ in range(8):
            world.clock.advance(0.05)
            until = world.claims.put_checkpoints(job_id, msg.chunk_id, claim.fence, write, lease_s=0.3)
            record = world.claims.get(job_id, msg.chunk_id)
            assert record is not None and record.claim_expires_at == until == world.clock() + 0.3
            hb.extended(until)
            time.sleep(0.05)
        # THEN the heartbeat wrote nothing meanwhile (the commits kept the lease)
        assert beats == []
        # AND once the commits stop, it beats again
        world.clock.advance(0.3)
        deadline = time.monotonic() + 5
        while not beats and time.monotonic() < deadline:
            time.sleep(0.02)
    assert beats and not hb.lost.is_set()


def test_a_commit_slower_than_a_third_of_the_lease_does_not_let_the_lease_lapse_between_beats():
    """A commit extends the lease from its start; the heartbeat used to skip its next beat
    counting from the commit's end, so a commit slower than lease/3 let the lease lapse before the beat after.
    Now the beat counts from the expiry the commit wrote."""
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    claim = world.claims.claim(job_id, msg.chunk_id, "w1", 3.0, 1)
    lease = 3.0
    write = [CheckpointWrite(analyst="liability", config_hash="h", status="ok", output_json="{}")]
    hb = Heartbeat(world.deps, msg, claim.fence, _delivery(), lease_s=lease)  # not started: beats by tick()
    # GIVEN a commit that starts at t and takes 2.5 s (5/6 of the lease) to write the outputs
    put_text = world.artifacts.put_text
    world.claims.inline_max_bytes = 0  # the output goes to S3 first: the slow part

    def slow_put(*a: object, **kw: object) -> None:
        world.clock.advance(2.5)
        put_text(*a, **kw)  # type: ignore[arg-type]  # the fake's own signature
    world.artifacts.put_text = slow_put  # type: ignore[method-assign]  # one call made slow
    started = world.clock()
    until = world.claims.put_checkpoints(job_id, msg.chunk_id, claim.fence, write, lease_s=lease)
    assert until == started + lease  # counted from the start, on the fake as on the adapter
    hb.extended(until)
    # WHEN the next beat comes 0.1 s after the commit ended (0.5 s of the lease left)
    world.clock.advance(0.1)
    hb.tick()
    # THEN it writes (it does not skip), and the lease runs a whole lease from now
    record = world.claims.get(job_id, msg.chunk_id)
    assert record.claim_expires_at == world.clock() + lease and not hb.lost.is_set()
    # AND a beat right after a fresh extension skips its write
    before = record.claim_expires_at
    world.clock.advance(0.5)
    hb.tick()
    assert world.claims.get(job_id, msg.chunk_id).claim_expires_at == before
