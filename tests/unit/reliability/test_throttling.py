"""Bedrock's two throttles, exactly as it sends them (HTTP 429 ThrottlingException, no Retry-After,
"Too many requests" or "Too many tokens"), through tier 1 and the worker: classified from code and
status only, retried with full-jitter backoff (no hint to honour), then backpressure (a requeue),
never a failure."""

from __future__ import annotations

import json
import random

import pytest

from contract_review.config.profile import RetryPolicy
from contract_review.domain.errors import classify
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.policy import is_backpressure
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus
from contract_review.doubles.faults import REQUESTS_THROTTLE_MESSAGE, TOKENS_THROTTLE_MESSAGE, bedrock_error
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.reliability.retry import Retrier, RetryBudget, RetryGiveUp, RetryStats, backoff_delay
from contract_review.wiring import chunk_worker

from ...texts import TEXT
from ..fakes import FakeWorld
from ..model_doubles import request

KINDS = pytest.mark.parametrize("message", [REQUESTS_THROTTLE_MESSAGE, TOKENS_THROTTLE_MESSAGE],
                                ids=["requests-per-minute", "tokens-per-minute"])


class ThrottledModel:
    """Bedrock with its quota used up: every call is the throttle Bedrock sends."""

    model_id = "global.anthropic.claude-sonnet-4-6"

    def __init__(self, message: str):
        self.message = message
        self.calls = 0

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        raise bedrock_error("ThrottlingException", self.message)


@KINDS
def test_both_throttles_classify_as_model_throttled_without_a_retry_after(message):
    env = classify(bedrock_error("ThrottlingException", message), step="liability", model_call=True)
    assert (env.error_code, env.http_status, env.provider_code) == ("model.throttled", 429, "ThrottlingException")
    assert env.retry_after_s is None and env.retryable and is_backpressure(env)


@KINDS
def test_tier_1_retries_a_throttle_with_full_jitter_backoff_and_no_floor(message):
    # GIVEN a retrier whose every call is throttled
    policy = RetryPolicy(base_s=1.0, cap_s=30.0, max_attempts=4)
    slept: list[float] = []
    retrier = Retrier(policy=policy, budget=RetryBudget(1000.0), stats=RetryStats(), rng=random.Random(7),
                      sleep=slept.append)
    model = ThrottledModel(message)
    # WHEN it calls until it gives up
    with pytest.raises(RetryGiveUp) as info:
        retrier.call(lambda: model.invoke(request()), step="liability")
    # THEN it slept exactly the full-jitter delays of the policy: nothing to honour, so no floor
    expected_rng = random.Random(7)
    assert slept == [backoff_delay(policy, attempt, expected_rng) for attempt in range(policy.max_attempts - 1)]
    assert all(0 <= s <= min(policy.cap_s, policy.base_s * 2 ** i) for i, s in enumerate(slept))
    assert model.calls == policy.max_attempts and retrier.stats.retries["model.throttled"] == policy.max_attempts - 1
    assert info.value.envelope.error_code == "model.throttled" and info.value.envelope.retry_after_s is None


@KINDS
def test_the_worker_requeues_a_throttled_chunk_as_backpressure_never_a_failure(message):
    # GIVEN a running job and a model whose quota is used up
    world = FakeWorld()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    (msg,) = world.queues.analysis()
    world.queues.drain(Queue.ANALYSIS)
    assert result.job_id is not None
    slept: list[float] = []
    model = ThrottledModel(message)
    worker = chunk_worker(world.deps, model, rng=random.Random(1), sleep=slept.append, call_safety_s=0.5)
    # WHEN the worker handles the chunk
    outcome = worker.handle(msg, Delivery(message_id="mid-1", receipt_handle="rh-1", receive_count=1,
                                          visibility_s=120, remaining_ms=lambda: 10**9))
    # THEN tier 1 backed off within the policy's full-jitter window (no Retry-After floor) ...
    policy = world.settings.profile.tier1.model_retry
    assert model.calls == policy.max_attempts and len(slept) == policy.max_attempts - 1
    assert all(0 <= s <= min(policy.cap_s, policy.base_s * 2 ** i) for i, s in enumerate(slept))
    # ... then the chunk was released without a failure and requeued with a delay (backpressure)
    assert outcome.action == "requeued" and outcome.detail["reason"] == "model.throttled"
    record = world.claims.get(result.job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 0
    assert record.last_error is not None and record.last_error.error_code == "model.throttled"
    assert record.last_error.retry_after_s is None and record.retries["model.throttled"] == policy.max_attempts - 1
    (sent,) = world.queues.sent[Queue.ANALYSIS]
    fresh = AnalysisMessage.model_validate_json(sent.body)
    assert (fresh.chunk_id, fresh.requeues, fresh.reason) == (msg.chunk_id, 1, "model.throttled")
    assert sent.delay_s > 0  # after an error, never at once
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == [] and world.queues.results() == []
