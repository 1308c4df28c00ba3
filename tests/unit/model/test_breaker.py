"""The circuit breaker per model (breaker.py): it opens after failed calls in a row, refuses calls while
open, lets one probe through when half-open, and a chunk meeting an open breaker is released as
backpressure (no attempt spent, checkpoints kept) with a delay of at least the time it stays open."""

from __future__ import annotations

import json
import random

import pytest

from contract_review.domain.errors import ReviewError, classify
from contract_review.domain.policy import is_backpressure
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus
from contract_review.doubles.faults import bedrock_error
from contract_review.model.breaker import BreakerModel, BreakerState, CircuitBreaker
from contract_review.operate import job_view
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker

from ...texts import TEXT
from ..fakes import FakeWorld
from ..model_doubles import EchoModel, request


class Flaky(EchoModel):
    """Echo, except while `failing`: then every call raises `error`."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error, self.failing = error, True

    def invoke(self, req):
        if self.failing:
            with self._lock:
                self.calls += 1
            raise self.error
        return super().invoke(req)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


CALLS = iter(range(10**6))


def _outcome(model: BreakerModel, chunk_index: int | None = None) -> str:
    """One call (of a new chunk each time unless `chunk_index` is given), reduced to ok or its error code."""
    try:
        model.invoke(request(chunk_index=next(CALLS) if chunk_index is None else chunk_index))
        return "ok"
    except Exception as exc:  # classified, as the worker does
        return classify(exc, model_call=True).error_code


def test_it_opens_after_failed_calls_in_a_row_and_then_sends_nothing():
    clock = Clock()
    inner = Flaky(bedrock_error("ServiceUnavailableException"))
    model = BreakerModel(inner, CircuitBreaker("m", failure_threshold=3, open_s=30, clock=clock))
    # GIVEN 3 calls failing with 503 in a row THEN the breaker is open
    assert [_outcome(model) for _ in range(3)] == ["model.unavailable"] * 3
    assert model.breaker.state is BreakerState.OPEN and model.breaker.opened == 1
    # WHEN more calls come while it is open THEN none is sent; each is refused with the time left
    with pytest.raises(ReviewError) as info:
        model.invoke(request())
    env = info.value.envelope
    assert (env.error_code, env.error_class.value, env.retryable, env.retry_after_s) == \
        ("model.circuit_open", "state", False, 30.0)
    assert is_backpressure(env)
    assert inner.calls == 3


def test_half_open_lets_one_probe_through_whose_success_closes_it():
    clock = Clock()
    inner = Flaky(bedrock_error("InternalServerException"))
    breaker = CircuitBreaker("m", failure_threshold=2, open_s=10, clock=clock)
    model = BreakerModel(inner, breaker)
    for _ in range(2):
        _outcome(model)
    # WHEN the open time has passed and the provider has recovered
    clock.now += 10
    inner.failing = False
    breaker.before_call()  # the probe takes the one half-open slot...
    assert breaker.state is BreakerState.HALF_OPEN
    assert _outcome(model) == "model.circuit_open"  # ...so a second call meanwhile is refused
    breaker.on_success()  # the probe succeeded
    # THEN it is closed and calls go through
    assert breaker.state is BreakerState.CLOSED and _outcome(model) == "ok"


def test_a_failed_probe_opens_it_again_for_another_open_time():
    clock = Clock()
    inner = Flaky(bedrock_error("ServiceUnavailableException"))
    model = BreakerModel(inner, CircuitBreaker("m", failure_threshold=2, open_s=10, clock=clock))
    for _ in range(2):
        _outcome(model)
    clock.now += 10
    assert _outcome(model) == "model.unavailable"  # the probe was sent and failed
    assert model.breaker.state is BreakerState.OPEN and model.breaker.opened_at == clock.now
    assert _outcome(model) == "model.circuit_open" and inner.calls == 3


@pytest.mark.parametrize("error", [bedrock_error("ThrottlingException", "Too many requests, please wait."),
                                   bedrock_error("ValidationException", "Malformed input request")])
def test_throttles_and_permanent_errors_never_open_it(error):
    model = BreakerModel(Flaky(error), CircuitBreaker("m", failure_threshold=2, open_s=10, clock=Clock()))
    for _ in range(10):
        _outcome(model)
    assert model.breaker.state is BreakerState.CLOSED


def test_one_chunk_whose_every_call_fails_does_not_open_it():
    # a chunk-specific failure is that chunk's (tier 2, then its DLQ), not the provider's
    model = BreakerModel(Flaky(bedrock_error("ServiceUnavailableException")),
                         CircuitBreaker("m", failure_threshold=3, open_s=10, clock=Clock()))
    assert [_outcome(model, chunk_index=7) for _ in range(10)] == ["model.unavailable"] * 10
    assert model.breaker.state is BreakerState.CLOSED
    assert _outcome(model, chunk_index=8) == "model.unavailable"  # another chunk failing too: the provider
    assert model.breaker.state is BreakerState.OPEN


def test_a_success_between_failures_resets_the_count():
    inner = Flaky(bedrock_error("ServiceUnavailableException"))
    model = BreakerModel(inner, CircuitBreaker("m", failure_threshold=3, open_s=10, clock=Clock()))
    for _ in range(5):
        inner.failing = True
        _outcome(model)
        _outcome(model)
        inner.failing = False
        assert _outcome(model) == "ok"
    assert model.breaker.state is BreakerState.CLOSED


def test_a_chunk_meeting_an_open_breaker_is_released_as_backpressure_without_spending_an_attempt():
    # GIVEN a worker whose model's breaker is open (the provider failed 5 calls in a row)
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    (msg,) = world.queues.analysis()
    world.queues.drain(Queue.ANALYSIS)
    inner = Flaky(bedrock_error("ServiceUnavailableException"))
    breaker = CircuitBreaker("m", failure_threshold=5, open_s=2.0, clock=world.clock)
    for _ in range(5):
        _outcome(BreakerModel(inner, breaker))
    calls_before = inner.calls
    worker = chunk_worker(world.deps, BreakerModel(inner, breaker), rng=random.Random(1), sleep=lambda _s: None)
    # WHEN it handles a chunk
    outcome = worker.handle(msg, Delivery("mid", "rh", 1, 120))
    # THEN no call was sent, the chunk was requeued with a delay of at least the breaker's time left,
    assert inner.calls == calls_before
    assert outcome.action == "requeued" and outcome.detail["reason"] == "model.circuit_open"
    assert int(outcome.detail["delay_s"] or 0) >= 2
    # and no attempt was spent
    record = world.claims.get(msg.job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 0
    (again,) = world.queues.analysis()
    assert again.reason == "model.circuit_open"
    # AND `review status` says the breaker is open for this job, then closed again once its open time is over
    view = job_view.job_view(world.deps, msg.job_id)
    assert view is not None and view.model_circuit.startswith("open (1 chunk requeues waited for it")
    world.clock.advance(world.settings.profile.quota.breaker_open_s + 1)
    view = job_view.job_view(world.deps, msg.job_id)
    assert view is not None and view.model_circuit.startswith("closed again")


def test_status_of_a_job_that_never_met_the_breaker_says_closed():
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    (msg,) = world.queues.analysis()
    view = job_view.job_view(world.deps, msg.job_id)
    assert view is not None and view.model_circuit == "closed"
