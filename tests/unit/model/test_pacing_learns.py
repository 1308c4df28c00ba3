"""The pacer learns the model's real token counts from its own calls: the simulated Bedrock counts with a tokenizer of
its own (not the pacer's four characters a token), and a worker's reservations converge on its counts."""

from __future__ import annotations

import statistics

import pytest

from contract_review.domain.model import ModelRequest, ModelResponse, reserved_output
from contract_review.doubles.bedrock_sim import SimulatedPromptCache, counted_input_tokens, reserved_tokens
from contract_review.doubles.faults import FaultInjectingModel
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.doubles.spec import FaultSpec
from contract_review.model.pacing import AimdPacer, QuotaLimiter, TokenCalibration, estimated_reservation
from contract_review.review.analysts import ANALYSTS, build_request
from contract_review.review.chunking import split_into_chunks

from ...texts import LONG_TEXT, RISKY

MODEL = OfflineRuleModel.model_id


def requests(text: str) -> list[ModelRequest]:
    return [build_request(spec, "locate", chunk, None, None) for chunk in split_into_chunks(text) for spec in ANALYSTS]


def limiter() -> QuotaLimiter:
    # a bucket far larger than the calls, on a clock that stands still (what it holds changes only by the calls)
    tokens = AimdPacer(rate=1e5, floor=1.0, ceiling=1e5, increase_per_s=0.0, burst_s=1000.0, slow_start=False,
                       clock=lambda: 0.0)
    return QuotaLimiter(requests=None, tokens=tokens, model_id=MODEL, sleep=lambda s: None)


def held(request: ModelRequest, tokenizer: bool) -> int:
    """What the simulated Bedrock holds for the call while it runs: its input as it counts it, + maxTokens."""
    if not tokenizer:
        return reserved_tokens(MODEL, request)
    return counted_input_tokens(MODEL, request) + reserved_output(MODEL, request.max_tokens)


def input_error(pacer: QuotaLimiter, calls: list[ModelRequest]) -> float:
    """The mean relative error of the pacer's reservation's input part against the double's count."""
    return statistics.mean(abs((pacer.reservation(r) - r.max_tokens) - counted_input_tokens(MODEL, r))
                           / counted_input_tokens(MODEL, r) for r in calls)


def run(pacer: QuotaLimiter, model: FaultInjectingModel, calls: list[ModelRequest]) -> None:
    for r in calls:
        pacer.wait(r, lambda: None)
        pacer.done(r, model.invoke(r))


def test_the_unlearned_pacer_misreserves_the_doubles_counts_and_the_learned_one_converges():
    # GIVEN the simulated Bedrock counting with its own tokenizer, and a worker's pacer that has not called it yet
    double = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache()), FaultSpec(simulated_tokenizer=True))
    pacer = limiter()
    train, held_out = requests(LONG_TEXT), requests(RISKY)  # learned on one contract, measured on another
    before = input_error(pacer, held_out)
    under = sum(pacer.reservation(r) < held(r, True) for r in held_out)
    # THEN before learning it reserves by its estimate, off the double's counts (under, for these requests)
    assert all(pacer.reservation(r) == estimated_reservation(r, MODEL) for r in held_out)
    assert before > 0.08 and under == len(held_out)
    # WHEN it has seen the usage of its own calls
    run(pacer, double, train)
    after = input_error(pacer, held_out)
    # THEN its reservations are close to what the double holds, on a contract it has not seen
    assert after < before / 4 and after < 0.05
    print(f"input reservation error: before {before:.3f}, after {after:.3f} (ratio {pacer.calibration.ratio(MODEL):.3f})")


def test_with_an_exact_estimate_the_learned_pacer_reserves_exactly_as_before():
    # GIVEN the double counting as the pacer estimates (its default)
    double = FaultInjectingModel(OfflineRuleModel(SimulatedPromptCache()), FaultSpec())
    pacer = limiter()
    calls = requests(LONG_TEXT)
    run(pacer, double, calls)
    # THEN the ratio stays 1 and every reservation is the estimate, unchanged
    assert pacer.calibration.ratio(MODEL) == 1.0
    assert all(pacer.reservation(r) == estimated_reservation(r, MODEL) == held(r, False) for r in calls)


def test_the_learned_ratio_is_bounded_per_model_and_starts_at_one():
    calibration = TokenCalibration()
    assert calibration.ratio("m") == 1.0
    for _ in range(50):
        calibration.learn("m", estimated=100, real=1000)  # a model that reports ten times the estimate
        calibration.learn("n", estimated=100, real=1)
    assert calibration.ratio("m") == calibration.ceiling == 2.0
    assert calibration.ratio("n") == calibration.floor == 0.5
    assert calibration.ratio("other") == 1.0
    calibration.learn("m", estimated=100, real=0)  # no usage reported: nothing learned
    assert calibration.ratio("m") == 2.0


def test_a_call_settles_against_what_it_reserved_even_when_the_ratio_moved_meanwhile():
    pacer = limiter()
    call = requests(LONG_TEXT)[0]
    full = pacer.tokens._capacity()
    pacer.wait(call, lambda: None)
    reserved = pacer.reservation(call)
    pacer.calibration.learn(MODEL, estimated=100, real=150)  # another thread's call answered meanwhile
    answer = ModelResponse(text="{}", stop_reason="end_turn", input_tokens=2000, output_tokens=20)
    pacer.done(call, answer)
    used = 2000 + 5 * 20
    assert reserved > used
    assert pacer.tokens.tokens == pytest.approx(full - used, abs=0.5)  # only what the call counts stays taken
