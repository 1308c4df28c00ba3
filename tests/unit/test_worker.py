"""The analysis worker's decisions against in-memory repositories (no AWS): what one delivery
does to the chunk record, the queues, the job and the model-call count on every path."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from botocore.exceptions import ClientError

from contract_review.analysts import ChunkFindings, analysts_for
from contract_review.errors import ErrorEnvelope, Tier2
from contract_review.intake import handle_intake
from contract_review.messages import AnalysisMessage
from contract_review.model_clients import ModelRequest, ModelResponse
from contract_review.offline_model import OfflineRuleModel
from contract_review.ports import Queue
from contract_review.records import AttemptStats, ChunkStatus, JobState
from contract_review.worker import ChunkWorker, Delivery

from ..texts import TEXT
from .fakes import FakeWorld

ANALYSTS = len(analysts_for(11))


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


@pytest.fixture
def world() -> FakeWorld:
    return FakeWorld()


def _job(world: FakeWorld) -> tuple[str, AnalysisMessage]:
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    (msg,) = world.queues.analysis()
    world.queues.drain(Queue.ANALYSIS)
    assert result.job_id
    return result.job_id, msg


def _delivery(receive_count: int = 1, remaining_ms: int = 10**9) -> Delivery:
    return Delivery(message_id="mid-1", receipt_handle="rh-1", receive_count=receive_count, visibility_s=120,
                    remaining_ms=lambda: remaining_ms)


def _worker(world: FakeWorld, model: ScriptedModel) -> ChunkWorker:
    return ChunkWorker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None, call_safety_s=0.5)


# ------------------------------------------------------------------------------ success
def test_a_chunk_is_analysed_checkpointed_settled_and_announced(world):
    # GIVEN a running job with one chunk
    job_id, msg = _job(world)
    model = ScriptedModel()
    # WHEN a worker handles its message
    outcome = _worker(world, model).handle(msg, _delivery())
    # THEN every analyst ran once per step it needed, was checkpointed under the claim's fence,
    assert outcome.action == "done"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.DONE and record.fence == 1
    assert set(record.checkpoints) == {s.name for s in analysts_for(11)} and set(record.checkpoints.values()) == {1}
    assert record.n_calls == model.total == outcome.stats.calls and record.receives == 1 and record.claimed_by is None
    # the findings went to the artifact the record names, and exactly one result was announced
    findings = ChunkFindings.model_validate_json(world.artifacts.get_text(record.findings_key or ""))
    assert record.n_findings == len(findings.findings) > 0
    (result,) = world.queues.results()
    assert (result.chunk_id, result.status, result.fence, result.findings_key) == \
        (msg.chunk_id, ChunkStatus.DONE, 1, record.findings_key)


def test_a_redelivery_of_a_finished_chunk_resends_its_result_without_model_calls(world):
    # GIVEN a chunk finished once, whose results message was lost
    job_id, msg = _job(world)
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
    # GIVEN a job that has ended
    job_id, msg = _job(world)
    world.jobs.transition(job_id, (JobState.RUNNING,), JobState.CANCELLED)
    model = ScriptedModel()
    # WHEN its chunk message arrives THEN it is skipped: no claim, no model call
    assert _worker(world, model).handle(msg, _delivery()).action == "skipped"
    assert model.total == 0 and world.claims.get(job_id, msg.chunk_id).fence == 0


def test_checkpointed_analysts_are_loaded_not_rerun(world):
    # GIVEN an earlier attempt that checkpointed the liability analyst, then lost its lease
    job_id, msg = _job(world)
    earlier = world.claims.claim(job_id, msg.chunk_id, "earlier", 3, 1)
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 2}
    assert world.claims.put_checkpoint(job_id, msg.chunk_id, "liability", earlier.fence,
                                       world.settings.analysis_config_hash(), "ok", json.dumps(out))
    world.clock.advance(10)
    # WHEN the message is redelivered to another worker
    model = ScriptedModel()
    assert _worker(world, model).handle(msg, _delivery(receive_count=2)).action == "done"
    # THEN the liability analyst made no call; the others ran
    assert model.calls[("liability", "locate")] == 0 and model.calls[("disputes", "locate")] == 1
    assert world.claims.get(job_id, msg.chunk_id).redeliveries == 1


def test_a_checkpoint_made_with_another_config_is_rerun_and_recorded_as_stale(world):
    job_id, msg = _job(world)
    earlier = world.claims.claim(job_id, msg.chunk_id, "earlier", 3, 1)
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 2}
    world.claims.put_checkpoint(job_id, msg.chunk_id, "liability", earlier.fence, "old-hash", "ok", json.dumps(out))
    world.clock.advance(10)
    model = ScriptedModel()
    _worker(world, model).handle(msg, _delivery())
    assert model.calls[("liability", "locate")] == 1
    assert "checkpoint.stale" in world.jobs.types(job_id)


# ------------------------------------------------------------------------------ backpressure
def test_sustained_throttling_requeues_without_counting_a_failure(world):
    # GIVEN a model that throttles every call
    job_id, msg = _job(world)
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
    assert 0 < float(requeued.detail["delay_s"]) <= world.settings.profile.throttle_max_delay_s
    assert sent.delay_s == round(float(requeued.detail["delay_s"]))  # whole seconds on SQS
    assert world.queues.results() == [] and world.queues.sent[Queue.ANALYSIS_DLQ] == []


def test_running_out_of_lambda_time_hands_back_at_once_without_a_model_call(world):
    job_id, msg = _job(world)
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery(remaining_ms=300))
    assert outcome.action == "requeued" and outcome.detail["reason"] == "runtime.time_exhausted"
    assert model.total == 0
    (fresh,) = world.queues.analysis()
    assert (fresh.reason, fresh.requeues) == ("runtime.time_exhausted", 1)
    assert world.queues.sent[Queue.ANALYSIS][0].delay_s == 0
    assert world.claims.get(job_id, msg.chunk_id).failures == 0


# ------------------------------------------------------------------------------ tier 2 and the poison budget
def test_a_transient_failure_goes_to_tier_2_with_a_short_backoff(world):
    # GIVEN a model failing with 5xx on every call
    job_id, msg = _job(world)
    model = ScriptedModel(always=_error("ServiceUnavailableException", 503))
    # WHEN the worker handles the chunk THEN it hands the record back to the queue (Tier2)
    with pytest.raises(Tier2) as info:
        _worker(world, model).handle(msg, _delivery())
    assert info.value.envelope.error_code == "model.unavailable"
    # after the policy's tier-1 attempts on the first analyst, and no more
    assert model.total == world.settings.profile.model_retry.max_attempts
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 1
    assert record.last_error is not None and record.last_error.error_code == "model.unavailable"
    # the visibility was shortened to the tier-2 backoff instead of the full timeout
    assert world.queues.visibility[-1] == (Queue.ANALYSIS, "rh-1", int(world.settings.profile.tier2_backoff_base_s))
    assert "chunk.retry" in world.jobs.types(job_id) and world.queues.results() == []


def test_the_last_allowed_failure_dead_letters_the_chunk_with_its_envelope(world):
    # GIVEN a chunk that already failed budget-1 times
    job_id, msg = _job(world)
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
    job_id, msg = _job(world)
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
    job_id, msg = _job(world)
    model = ScriptedModel(always=_error("ValidationException", 400))
    outcome = _worker(world, model).handle(msg, _delivery())
    assert outcome.action == "failed" and model.total == 1  # never retried
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.FAILED
    assert world.jobs.get(job_id).state is JobState.RUNNING
    (result,) = world.queues.results()
    assert result.status is ChunkStatus.FAILED and result.error.error_code == "model.request_invalid"


def test_a_job_fatal_error_fails_the_job_at_once(world):
    job_id, msg = _job(world)
    outcome = _worker(world, ScriptedModel(always=_error("AccessDeniedException", 403))).handle(msg, _delivery())
    assert outcome.action == "job_failed"
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.access_denied"
    assert job.ended_at == world.clock()
    assert world.jobs.types(job_id)[-2:] == ["chunk.failed", "job.failed"]
    assert [r.status for r in world.queues.results()] == [ChunkStatus.FAILED]


def test_a_refusal_is_a_recorded_gap_not_a_retry(world):
    job_id, msg = _job(world)
    model = ScriptedModel({("licensing", "locate"): [ModelResponse(text="", stop_reason="content_filtered")]})
    assert _worker(world, model).handle(msg, _delivery()).action == "done"
    assert model.calls[("licensing", "locate")] == 1
    assert world.claims.get(job_id, msg.chunk_id).coverage["licensing"] == "refused"


# ------------------------------------------------------------------------------ fencing
def test_a_worker_whose_lease_was_taken_over_commits_nothing(world):
    # GIVEN a worker whose lease another worker takes over between two analysts
    job_id, msg = _job(world)
    real_put = world.claims.put_checkpoint
    taken = {}

    def put_then_lose_lease(*args: object, **kw: object) -> bool:
        ok = real_put(*args, **kw)
        if not taken:
            world.clock.advance(world.settings.claim_lease_s + 1)  # this worker stalls past its lease...
            taken["claim"] = world.claims.claim(job_id, msg.chunk_id, "newcomer", 30, 2)  # ...and is replaced
        return ok

    world.claims.put_checkpoint = put_then_lose_lease
    # WHEN the first worker carries on
    outcome = _worker(world, ScriptedModel()).handle(msg, _delivery())
    # THEN its next checkpoint is rejected by the fence: it stops, and the chunk stays with the newcomer
    assert outcome.action == "lease_lost"
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.CLAIMED and record.claimed_by == "newcomer"
    assert record.fence == taken["claim"].fence == 2 and list(record.checkpoints) == [analysts_for(11)[0].name]
    assert world.queues.results() == [] and "chunk.lease_lost" in world.jobs.types(job_id)


def test_a_message_whose_chunk_is_held_by_a_live_lease_is_a_duplicate(world):
    job_id, msg = _job(world)
    world.claims.claim(job_id, msg.chunk_id, "owner", 30, 1)
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery(receive_count=2))
    assert outcome.action == "duplicate" and outcome.detail["claimed_by"] == "owner" and model.total == 0
