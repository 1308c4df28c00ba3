"""The simulated Bedrock's physics, each a FaultSpec option off by default: a latency that follows the call's tokens
(with a heavy tail), capacity throttles below the quota that come in bursts, and a token count of its own."""

from __future__ import annotations

import json
import random
import statistics
import tempfile

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.domain.errors import classify
from contract_review.domain.model import ModelRequest, text_tokens
from contract_review.doubles.bedrock_sim import (
    SimulatedPromptCache,
    call_latency_s,
    counted_input_tokens,
    counted_tokens,
    in_capacity_throttle,
    input_tokens,
    latency_tail,
    reserved_tokens,
)
from contract_review.doubles.faults import FaultInjectingModel
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.doubles.spec import FaultSpec
from contract_review.review.analysts import ANALYSTS, SCHEMA, build_request
from contract_review.review.chunking import split_into_chunks

from ...texts import LONG_TEXT

PROSE = ("The parties agree that this deal will last for two years and that each side may end it on notice. "
         "Each party will keep the other's data safe and will not sell it.")
FIGURES = json.dumps([{"clause": f"{i}.{j}", "amount_usd": 1_250_000 + 37 * i * j, "rate": 0.0425}
                      for i in range(1, 6) for j in range(1, 4)])


def requests() -> list[ModelRequest]:
    """The analysts' real requests (locate, then assess a located clause) over a contract's chunks."""
    chunks = split_into_chunks(LONG_TEXT)
    return [build_request(spec, "locate", chunk, None, None) for chunk in chunks for spec in ANALYSTS]


class Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    def __call__(self, s: float) -> None:
        self.slept.append(s)


# --- the double's own tokenizer -------------------------------------------------------------------------------

def test_the_doubles_tokenizer_differs_from_four_characters_a_token_in_both_directions_by_content():
    # GIVEN plain prose of short words, and JSON full of figures and punctuation
    # WHEN the double counts them and the pacer estimates them (4 characters a token)
    prose_ratio = counted_tokens(PROSE) / text_tokens(PROSE)
    figures_ratio = counted_tokens(FIGURES) / text_tokens(FIGURES)
    # THEN prose counts fewer tokens than estimated, figures more, each by a realistic amount (less than x3 either way)
    assert 0.5 < prose_ratio < 0.95
    assert 1.3 < figures_ratio < 3.0
    # AND the analysts' own tool definition (JSON) counts more than its estimate
    assert counted_tokens(json.dumps(SCHEMA)) > 1.2 * text_tokens(json.dumps(SCHEMA))
    # AND the count is deterministic, and depends on the content, not the length alone
    assert counted_tokens(PROSE) == counted_tokens(PROSE)
    assert counted_tokens("a" * 40) != counted_tokens("a " * 20)
    # AND a real request differs from its estimate too (neither equal by construction)
    req = requests()[0]
    assert counted_input_tokens("offline-rules-v1", req) != input_tokens("offline-rules-v1", req)


def test_with_the_tokenizer_on_the_doubles_usage_and_quota_are_its_counts_and_off_they_are_the_estimate(tmp_path):
    req = requests()[0]
    model_id = OfflineRuleModel.model_id
    # GIVEN the simulated Bedrock with its own tokenizer, and one without (the default)
    counted = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)),
                                  FaultSpec(simulated_tokenizer=True))
    estimated = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), FaultSpec())
    # WHEN each answers the same request
    a, b = counted.invoke(req), estimated.invoke(req)
    # THEN the usage is the tokenizer's counts with it on, the 4-characters-a-token estimate without it
    assert a.input_tokens == counted_input_tokens(model_id, req)
    assert a.output_tokens == counted_tokens(a.text)
    assert b.input_tokens == input_tokens(model_id, req) and b.output_tokens == text_tokens(b.text)
    assert (a.input_tokens, a.output_tokens) != (b.input_tokens, b.output_tokens)
    # AND its quota reserves the counted input (+ maxTokens) while the call runs
    spec = FaultSpec(simulated_tokenizer=True, throttle_state_dir=str(tmp_path), throttle_tokens_per_s=1.0,
                     throttle_window_s=1e6)

    class Peek:  # the answering model reads what the quota holds while the call runs
        def __init__(self) -> None:
            self.model_id, self.held = model_id, 0.0

        def invoke(self, request: ModelRequest):
            self.held = 1e6 - _tokens(tmp_path)
            return OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)).invoke(request)

    peek = Peek()
    FaultInjectingModel(peek, spec).invoke(req)
    held = reserved_tokens(model_id, req) - input_tokens(model_id, req) + counted_input_tokens(model_id, req)
    assert peek.held == pytest.approx(held, abs=1.0)


def _tokens(state_dir) -> float:
    return json.loads((state_dir / "model-tokens.json").read_text())["tokens"]


# --- latency from the call's tokens ---------------------------------------------------------------------------

def test_latency_is_time_to_first_token_growing_with_input_plus_output_at_the_output_speed():
    # GIVEN no tail: the formula itself
    first, whole = call_latency_s(2000, 300, ttft_ms=500, ttft_ms_per_1k_input=20, output_tokens_per_s=60)
    assert first == pytest.approx(0.5 + 0.04)
    assert whole == pytest.approx(first + 300 / 60)
    more_input, _ = call_latency_s(20000, 300, ttft_ms=500, ttft_ms_per_1k_input=20, output_tokens_per_s=60)
    assert more_input > first
    # AND through the double: a longer answer takes longer, by its tokens at the output speed
    spec = FaultSpec(ttft_ms=400, latency_tail_p99=1.0, output_tokens_per_s=50, seed=3)
    short, long = Sleeps(), Sleeps()
    req = requests()[0]
    r1 = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), spec, sleep=short).invoke(req)
    longer = spec.model_copy(update={"answer_tokens_median": 600.0})
    r2 = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), longer, sleep=long).invoke(req)
    assert r2.output_tokens > r1.output_tokens
    assert long.slept[0] - short.slept[0] == pytest.approx((r2.output_tokens - r1.output_tokens) / 50)
    assert r1.latency_ms == pytest.approx(short.slept[0] * 1000)


def test_latency_has_a_seeded_heavy_tail():
    # GIVEN a tail whose 99th percentile is 3 x the median
    rng = random.Random(5)
    tails = sorted(latency_tail(rng, 3.0) for _ in range(20000))
    median, p99 = statistics.median(tails), tails[int(0.99 * len(tails))]
    # THEN the draws have median 1 and a 99th percentile near 3 (slow calls exist), and are seeded
    assert median == pytest.approx(1.0, rel=0.05)
    assert p99 == pytest.approx(3.0, rel=0.1)
    assert max(tails) > 4 * median
    assert [latency_tail(random.Random(5), 3.0) for _ in range(3)] == [latency_tail(random.Random(5), 3.0)] * 3
    # AND through the double, the same seed gives the same latencies, another seed others
    spec = FaultSpec(ttft_ms=500, latency_tail_p99=3.0, seed=9)
    reqs = requests()[:12]

    def run(s: FaultSpec) -> list[float]:
        sleeps = Sleeps()
        model = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), s, sleep=sleeps)
        for r in reqs:
            model.invoke(r)
        return sleeps.slept

    assert run(spec) == run(spec)
    assert run(spec) != run(spec.model_copy(update={"seed": 10}))
    assert max(run(spec)) / min(run(spec)) > 1.5


def test_a_call_slower_than_the_read_timeout_ends_in_a_read_timeout_and_keeps_its_reservation(tmp_path):
    spec = FaultSpec(ttft_ms=3000, latency_tail_p99=1.0, throttle_state_dir=str(tmp_path), throttle_tokens_per_s=1.0,
                     throttle_window_s=1e6)
    sleeps = Sleeps()
    model = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), spec, read_timeout_s=1.0,
                                sleep=sleeps)
    req = requests()[0]
    with pytest.raises(ReadTimeoutError):
        model.invoke(req)
    assert sleeps.slept == [1.0]  # the client waited its read timeout
    held = 1e6 - _tokens(tmp_path)
    assert held == pytest.approx(reserved_tokens(model.model_id, req), abs=1.0)  # Bedrock went on: still held


def test_the_token_latency_option_is_off_by_default_and_exclusive_with_the_fixed_latency():
    assert FaultSpec().ttft_ms == 0 and FaultSpec().capacity_throttle_rate == 0 and not FaultSpec().simulated_tokenizer
    with pytest.raises(ValueError):
        FaultSpec(ttft_ms=500, latency_median_ms=800)


# --- capacity throttles below the quota ----------------------------------------------------------------------

def test_capacity_throttles_come_at_the_configured_rate_in_bursts():
    rate, slot = 0.05, 2.0
    # GIVEN calls every 0.1 s over a long run
    times = [t * 0.1 for t in range(200_000)]
    busy = [in_capacity_throttle(7, rate, slot, t) for t in times]
    # THEN about `rate` of them are throttled
    assert sum(busy) / len(busy) == pytest.approx(rate, rel=0.2)
    # AND throttles are correlated in time: right after a throttle, the next call is throttled far more often
    after = [b for a, b in zip(busy, busy[1:], strict=False) if a]
    assert sum(after) / len(after) > 0.8
    # AND the pattern is the seed's (every process sees the same busy slots); rate 0 never throttles
    assert busy[:5000] == [in_capacity_throttle(7, rate, slot, t) for t in times[:5000]]
    assert busy != [in_capacity_throttle(8, rate, slot, t) for t in times]
    assert not any(in_capacity_throttle(7, 0.0, slot, t) for t in times[:5000])


def test_a_call_in_a_busy_slot_is_throttled_below_the_quota_and_gives_its_reservation_back():
    # a slot far longer than the test, so "now" stays in one slot; seeds picked for a busy and a quiet one
    slot, rate = 1e9, 0.5
    import time
    now = time.time()
    busy_seed = next(s for s in range(100) if in_capacity_throttle(s, rate, slot, now))
    quiet_seed = next(s for s in range(100) if not in_capacity_throttle(s, rate, slot, now))
    req = requests()[0]
    with tempfile.TemporaryDirectory() as d:
        spec = FaultSpec(seed=busy_seed, capacity_throttle_rate=rate, capacity_slot_s=slot, throttle_state_dir=d,
                         throttle_tokens_per_s=1e9, throttle_window_s=1.0)  # a quota it is far below
        model = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), spec)
        with pytest.raises(ClientError) as err:
            model.invoke(req)
        assert err.value.response["Error"]["Code"] == "ThrottlingException"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert classify(err.value, model_call=True).error_code == "model.throttled"
        bucket = json.loads(open(f"{d}/model-tokens.json").read())["tokens"]
        assert bucket == pytest.approx(1e9, rel=1e-9)  # nothing stays reserved
    quiet = FaultSpec(seed=quiet_seed, capacity_throttle_rate=rate, capacity_slot_s=slot)
    assert FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)), quiet).invoke(req).text
