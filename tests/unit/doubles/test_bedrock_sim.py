"""The simulated Bedrock is as strict as Bedrock (doubles/bedrock_sim.py): each rule pinned by a test."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import threading

import pytest

from contract_review.config.catalogue import CATALOGUE, STRICTEST
from contract_review.domain.model import (
    ModelRequest,
    ModelResponse,
    prefix_tokens,
    text_tokens,
)
from contract_review.domain.model import traits_for as facts_for
from contract_review.doubles.bedrock_sim import DailyTokenLedger, SimulatedPromptCache, input_tokens, reserved_tokens
from contract_review.doubles.faults import FaultInjectingModel
from contract_review.doubles.spec import FaultSpec

from ..model_doubles import outcome, request, tokens_quota

SONNET = "global.anthropic.claude-sonnet-4-6"


def big_request(system_chars: int = 12_000, schema: dict | None = None, max_tokens: int = 1024) -> ModelRequest:
    return dataclasses.replace(request(), system="s" * system_chars, output_schema=schema or {"type": "object"},
                               max_tokens=max_tokens)


class CachedAnswer:
    """An inner model whose answer reports a prefix read from the cache, as Bedrock's usage does."""

    model_id = SONNET

    def invoke(self, req: ModelRequest) -> ModelResponse:
        return ModelResponse(text="{}", stop_reason="end_turn", input_tokens=100, output_tokens=10,
                             cache_read_tokens=3000)


def test_the_model_facts_are_bedrocks_and_unknown_models_get_the_strictest():
    assert facts_for(SONNET) == facts_for("anthropic.claude-sonnet-4-6") == CATALOGUE["anthropic.claude-sonnet-4-6"]
    assert facts_for(SONNET).min_cache_tokens == 2048 and facts_for(SONNET).output_burndown == 5
    assert facts_for("offline-rules-v1") == facts_for(SONNET)  # simulated as the model it is priced as
    assert facts_for("some.new-model") == STRICTEST and STRICTEST.min_cache_tokens >= 2048


def test_every_call_with_tools_carries_bedrocks_tool_use_system_prompt():
    req = request()
    assert prefix_tokens(SONNET, req) == 313 + text_tokens(req.system) + text_tokens(json.dumps(req.output_schema))
    assert input_tokens(SONNET, req) == prefix_tokens(SONNET, req) + text_tokens(req.prompt)


def test_the_cache_has_no_zero_minimum_and_keeps_nothing_under_the_models_minimum():
    cache = SimulatedPromptCache(clock=lambda: 0.0)
    assert cache.minimum(SONNET) == 2048 and cache.minimum("offline-rules-v1") == 2048
    short = big_request(system_chars=4 * 1000)  # ~1,300 prefix tokens with the tool prompt: under 2,048
    assert prefix_tokens(SONNET, short) < 2048
    first, again = cache.use(SONNET, short), cache.use(SONNET, short)
    assert (first.read, first.written) == (again.read, again.written) == (0, 0)
    assert first.uncached == input_tokens(SONNET, short)


def test_a_prefix_over_the_minimum_is_written_once_then_read_and_each_read_refreshes_its_ttl():
    now = [0.0]
    cache = SimulatedPromptCache(clock=lambda: now[0])
    req = big_request()
    prefix = prefix_tokens(SONNET, req)
    assert prefix >= 2048
    assert cache.use(SONNET, req).written == prefix
    for t in (299.0, 598.0, 897.0):  # each read within 5 minutes of the last use keeps it warm
        now[0] = t
        use = cache.use(SONNET, req)
        assert (use.read, use.written, use.uncached) == (prefix, 0, text_tokens(req.prompt))
    now[0] = 897.0 + 301.0  # idle for more than the TTL: gone, written again
    assert cache.use(SONNET, req).written == prefix


def test_a_changed_tool_definition_is_another_prefix():
    cache = SimulatedPromptCache(clock=lambda: 0.0)
    cache.use(SONNET, big_request())
    assert cache.use(SONNET, big_request(schema={"type": "object", "title": "other"})).written > 0


def _use_in_another_process(state_dir: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(dataclasses.astuple(SimulatedPromptCache(state_dir).use(SONNET, big_request())))


def test_the_cache_is_shared_by_every_process_of_the_account(tmp_path):
    SimulatedPromptCache(str(tmp_path)).use(SONNET, big_request())  # this process writes it
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    child = multiprocessing.get_context("fork").Process(target=_use_in_another_process, args=(str(tmp_path), queue))
    child.start()
    child.join(10)
    read, written, _ = queue.get(timeout=5)
    assert (read, written) == (prefix_tokens(SONNET, big_request()), 0)  # another worker process reads it


def test_admission_reserves_cache_reads_too_and_settlement_releases_them(tmp_path):
    # GIVEN room for exactly one reservation: all the input (cached or not) + maxTokens
    req = big_request()
    reserved = reserved_tokens(SONNET, req)
    spec = tokens_quota(tmp_path, reserved)
    model = FaultInjectingModel(CachedAnswer(), spec)
    assert outcome(model, req) == "ok"
    # THEN the call counted input + 5 x output (100 + 50): its 3,000 cache reads were released
    left = json.loads((tmp_path / "model-tokens.json").read_text())["tokens"]
    assert reserved - left == pytest.approx(100 + 5 * 10, abs=1)
    # AND a call whose prefix would be read from the cache is still refused when its whole input + maxTokens
    # does not fit (what is left is less than a reservation)
    assert outcome(model, req) == "model.throttled"


def test_the_daily_token_quotas_refuse_past_their_count_until_the_next_day(tmp_path):
    now = [0.0]
    ledger = DailyTokenLedger(str(tmp_path), model_per_day=1000, account_per_day=1500, day_s=100, clock=lambda: now[0])
    assert ledger.take(SONNET, 900) and not ledger.take(SONNET, 200)  # the model's day is spent
    assert ledger.take("anthropic.claude-haiku-4-5-20251001-v1:0", 500)  # another model, within the account's
    assert not ledger.take("anthropic.claude-haiku-4-5-20251001-v1:0", 200)  # the account's day is spent
    ledger.settle(SONNET, 400)  # a call settled to less than it reserved gives the rest back
    assert ledger.take(SONNET, 300)
    now[0] = 100.0  # the next day
    assert ledger.take(SONNET, 1000)


def test_a_spent_daily_quota_throttles_like_any_quota(tmp_path):
    req = request()
    # room for 1.5 reservations a day: calls settled far below their reservation (150 tokens each) keep passing
    spec = FaultSpec(daily_tokens_per_model=1.5 * reserved_tokens(SONNET, req), throttle_state_dir=str(tmp_path))
    model = FaultInjectingModel(CachedAnswer(), spec)
    assert [outcome(model, request(i=i)) for i in range(3)] == ["ok", "ok", "ok"]
    spent = FaultInjectingModel(CachedAnswer(), spec.model_copy(update={"daily_tokens_per_model": 10}))
    assert outcome(spent, req) == "model.throttled"


def test_llm_like_answer_lengths_are_counted_and_one_over_max_tokens_is_cut():
    spec = FaultSpec(answer_tokens_median=300, answer_tokens_p99=1200, seed=4)
    model = FaultInjectingModel(CachedAnswer(), spec)
    outputs = [model.invoke(request(i=i, chunk_index=i)).output_tokens for i in range(200)]
    assert 200 < sorted(outputs)[100] < 450  # about the median asked for
    assert max(outputs) <= request().max_tokens
    # one question, one answer length: asked again, or worded otherwise (another layout), in another process
    again = FaultInjectingModel(CachedAnswer(), spec)
    reworded = dataclasses.replace(request(i=7, chunk_index=7), prompt="the same question, laid out otherwise")
    assert again.invoke(request(i=7, chunk_index=7)).output_tokens == again.invoke(reworded).output_tokens \
        == outputs[7]
    capped = FaultInjectingModel(CachedAnswer(), spec.model_copy(update={"answer_tokens_median": 10_000,
                                                                          "answer_tokens_p99": None}))
    cut = capped.invoke(request())
    assert (cut.output_tokens, cut.stop_reason) == (request().max_tokens, "max_tokens")  # cut, as Bedrock cuts it


def test_a_read_timeout_keeps_its_reservation_and_takes_the_read_timeout(tmp_path):
    """The client gave up, Bedrock did not: the call's reservation stays taken (an error answered at once is given
    back), and the timeout is felt after the client's read timeout, not at once."""
    req = request()
    reserved = reserved_tokens(CachedAnswer.model_id, req)
    spec = tokens_quota(tmp_path, 100 * reserved, transient_rate=1.0, seed=3)
    slept: list[float] = []
    model = FaultInjectingModel(CachedAnswer(), spec, read_timeout_s=7.0, sleep=slept.append)
    outcomes = [outcome(model, request(i=i)) for i in range(30)]
    assert "model.timeout" in outcomes and slept.count(7.0) == outcomes.count("model.timeout")
    left = json.loads((tmp_path / "model-tokens.json").read_text())["tokens"]
    held = 100 * reserved - left
    assert held == pytest.approx(outcomes.count("model.timeout") * reserved, rel=0.01)


def test_the_pacer_estimates_a_reservation_as_the_simulated_bedrock_admits_it():
    """The worker's pacer (model/pacing.py) takes from its token bucket what Bedrock will reserve: all the input,
    the shared context and Bedrock's tool-use prompt included, plus maxTokens."""
    from contract_review.model.pacing import estimated_reservation

    req = dataclasses.replace(big_request(), context="c" * 8_000, prompt="task")
    assert estimated_reservation(req) == reserved_tokens("some.unknown-model", req)  # the strictest traits
    assert estimated_reservation(req) >= text_tokens(req.context) + 313 + req.max_tokens


def _calls_at_once(model: FaultInjectingModel, req: ModelRequest, n: int) -> list[ModelResponse]:
    barrier = threading.Barrier(n)
    out: list[ModelResponse] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        answer = model.invoke(req)
        with lock:
            out.append(answer)
    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_a_prefix_is_readable_only_once_its_writer_has_answered_so_calls_at_once_all_write():
    """Eleven calls that start together all miss and each pays the write (1.25 x input), as on Bedrock: the
    first writer's prefix is readable only once it has answered. A call after that reads it. (The worker's
    warm-up runs one call first for this reason: tests/unit/pipeline/test_analyst_pool.py.)"""
    from contract_review.doubles.offline_model import OfflineRuleModel
    from contract_review.review.analysts import ANALYSTS, build_request
    from contract_review.review.chunking import Chunk

    text = "The Supplier shall indemnify the Customer against third-party claims. " * 40
    req = build_request(ANALYSTS[1], "locate", Chunk(index=0, chunk_id="c0", start=0, end=len(text), text=text), None,
                        None)
    model = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=1)), FaultSpec(latency_ms=200))
    together = _calls_at_once(model, req, 11)
    assert len(together) == 11 and all(a.cache_write_tokens > 0 and a.cache_read_tokens == 0 for a in together)
    later = model.invoke(req)
    assert later.cache_read_tokens > 0 and later.cache_write_tokens == 0
