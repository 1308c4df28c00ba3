"""The onion around a worker's model call (model/onion.py), as wiring builds it: its layers in order, a layer with
nothing to do left out, and each layer's part of a call (a pause makes no call; a call that reaches the model is
counted)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.handlers.tracing import TracedModel
from contract_review.model.breaker import BreakerModel
from contract_review.model.onion import (
    CallScope,
    CountedModel,
    DailyQuotaModel,
    PacedModel,
    PausableModel,
    calls_for,
    layers,
)
from contract_review.model.pacing import QuotaLimiter
from contract_review.reliability.retry import RetryStats
from contract_review.wiring import build_chunk_worker, build_model, worker_model

from ..fakes import FakeWorld
from ..model_doubles import request


class Recording:
    """The model: records each request it receives, answers with fixed usage."""

    model_id = "offline-rule-model"

    def __init__(self) -> None:
        self.received: list[ModelRequest] = []

    def invoke(self, req: ModelRequest) -> ModelResponse:
        self.received.append(req)
        return ModelResponse(text="{}", stop_reason="end_turn", input_tokens=100, output_tokens=20,
                             cache_read_tokens=7, cache_write_tokens=3)


def test_the_worker_built_by_wiring_calls_one_client_whose_layers_go_pause_daily_pacing_counting_then_the_model():
    # GIVEN a worker process as the handlers build it: the model (its breaker inside its trace), a runtime control,
    # a token ledger and the deploy's quotas
    world = FakeWorld()
    model = TracedModel(build_model(world.settings, session=None))
    # WHEN wiring builds its worker
    worker = build_chunk_worker(world.settings, world.deps, model)
    # THEN its one client is the onion, outermost first, around the model as it was given
    kinds = [type(c) for c in layers(worker.model)]
    assert kinds[:6] == [PausableModel, DailyQuotaModel, PacedModel, CountedModel, TracedModel, BreakerModel]
    assert list(layers(worker.model))[4] is model


def test_a_layer_with_nothing_to_do_is_not_in_the_onion():
    # GIVEN a process with no runtime control, no token ledger and no quotas to follow
    world = FakeWorld()
    deps = replace(world.deps, model_control=None, token_ledger=None)
    inner = Recording()
    # THEN only the counting stands between the worker and the model
    assert [type(c) for c in layers(worker_model(deps, inner))] == [CountedModel, Recording]
    # AND pacers given at deploy bring the pacing layer, without a control to follow
    deploy = QuotaLimiter.for_profile(world.settings.profile, 1_000_000, world.settings.effective_model_id)
    assert [type(c) for c in layers(worker_model(deps, inner, limiter=deploy))] == [PacedModel, CountedModel,
                                                                                     Recording]


def test_a_paused_model_receives_no_call_through_the_built_client_and_none_is_counted():
    # GIVEN the worker's client as wiring builds it, and an operator's pause in the runtime control
    world = FakeWorld()
    inner = Recording()
    client = worker_model(world.deps, inner)
    world.model_control.put(ModelControl(paused=True, by="ops"))
    tally = RetryStats()
    # WHEN an analyst calls the model
    with calls_for(CallScope(tally, ready=lambda: None)), pytest.raises(ReviewError) as held:
        client.invoke(request(analyst="liability"))
    # THEN the call is held as `model.paused`, named for the analyst: the model received nothing, nothing is counted
    assert held.value.envelope.error_code == "model.paused" and held.value.envelope.step == "liability"
    assert inner.received == [] and tally.calls == 0 and tally.tokens.input_tokens == 0
    # AND once resumed, the call reaches the model and is counted on the analyst's tally, with its tokens
    world.model_control.put(ModelControl(paused=False, by="ops"))
    with calls_for(CallScope(tally, ready=lambda: None)):
        client.invoke(request(analyst="liability"))
    assert len(inner.received) == 1 and tally.calls == 1
    assert (tally.tokens.input_tokens, tally.tokens.output_tokens, tally.tokens.cache_read_tokens,
            tally.tokens.cache_write_tokens) == (100, 20, 7, 3)
