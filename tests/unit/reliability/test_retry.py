"""Tier-1 retry (DESIGN rule 3): full-jitter backoff, Retry-After floor, budget, classified retries."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract_review.config.profile import PROFILES, RetryPolicy
from contract_review.domain.errors import LeaseLost, ReviewError
from contract_review.domain.policy import is_backpressure
from contract_review.reliability.retry import (
    Retrier,
    RetryBudget,
    RetryGiveUp,
    RetryStats,
    backoff_delay,
    requeue_delay_s,
    tier2_backoff_s,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- helpers ----------------------------------------------------------------------------------------

def throttle(retry_after: float | None = None) -> ClientError:
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"},
                        "ResponseMetadata": {"HTTPStatusCode": 429, "HTTPHeaders": headers}}, "Converse")


def unavailable() -> ClientError:
    return ClientError({"Error": {"Code": "ServiceUnavailableException", "Message": "x"},
                        "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": {}}}, "Converse")


def validation() -> ClientError:
    return ClientError({"Error": {"Code": "ValidationException", "Message": "too many tokens, throttled"},
                        "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}, "Converse")


TRANSIENT_FACTORIES = {
    "model.throttled": lambda: throttle(),
    "model.unavailable": unavailable,
    "model.timeout": lambda: ReadTimeoutError(endpoint_url="https://bedrock"),
}


class MaxRandom(random.Random):
    """uniform() always returns its upper bound: exposes the jitter ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


class MinRandom(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


class Script:
    """A callable that raises the scripted exceptions in order, then returns `result`."""

    def __init__(self, outcomes: list[BaseException | object]):
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        item = self.outcomes[min(self.calls, len(self.outcomes)) - 1]
        if isinstance(item, BaseException):
            raise item
        return item


def make_retrier(policy: RetryPolicy, budget_s: float = 1e9, seed: int = 0, rng: random.Random | None = None,
                 **kw) -> tuple[Retrier, list[float]]:
    slept: list[float] = []
    retrier = Retrier(policy=policy, budget=RetryBudget(budget_s), stats=RetryStats(),
                      rng=rng or random.Random(seed), sleep=slept.append, **kw)
    return retrier, slept


policies = st.builds(
    RetryPolicy,
    base_s=st.floats(0.001, 5.0),
    cap_s=st.floats(0.001, 60.0),
    max_attempts=st.integers(1, 8),
)


# --- backoff_delay ----------------------------------------------------------------------------------

@FAST
@given(policy=policies, attempt=st.integers(0, 60), seed=st.integers(0, 2**32))
def test_backoff_without_retry_after_stays_within_full_jitter_window(policy, attempt, seed):
    delay = backoff_delay(policy, attempt, random.Random(seed))
    assert 0.0 <= delay <= min(policy.cap_s, policy.base_s * 2 ** attempt)


@FAST
@given(policy=policies, attempt=st.integers(0, 60), seed=st.integers(0, 2**32),
       retry_after=st.floats(0.0, 120.0))
def test_backoff_never_sleeps_less_than_retry_after(policy, attempt, seed, retry_after):
    delay = backoff_delay(policy, attempt, random.Random(seed), retry_after_s=retry_after)
    assert delay >= retry_after
    # the hint is a floor, not a multiplier: never more than the larger of hint and jitter ceiling
    assert delay <= max(retry_after, min(policy.cap_s, policy.base_s * 2 ** attempt))


@FAST
@given(policy=policies, attempts=st.integers(1, 40))
def test_backoff_ceiling_is_monotone_and_saturates_at_cap(policy, attempts):
    ceilings = [backoff_delay(policy, a, MaxRandom()) for a in range(attempts)]
    assert all(x <= y for x, y in zip(ceilings, ceilings[1:]))
    assert max(ceilings) <= policy.cap_s
    assert ceilings[0] == pytest.approx(min(policy.cap_s, policy.base_s))
    # the floor of full jitter is zero at every attempt
    assert all(backoff_delay(policy, a, MinRandom()) == 0.0 for a in range(attempts))


def test_backoff_is_full_jitter_not_fixed_or_equal_jitter():
    # GIVEN the prod model policy at attempt 2 (ceiling min(30, 1 * 4) = 4 s)
    policy = PROFILES["prod"].tier1.model_retry
    rng = random.Random(1234)
    samples = [backoff_delay(policy, 2, rng) for _ in range(4000)]
    # THEN delays spread over the whole [0, 4] window (mean ~2, some below 1 s, none above 4 s)
    assert statistics.fmean(samples) == pytest.approx(2.0, abs=0.15)
    assert min(samples) < 0.1 and max(samples) > 3.9 and max(samples) <= 4.0
    assert sum(s < 1.0 for s in samples) > 800


def test_backoff_large_attempt_is_capped_not_overflowing():
    policy = RetryPolicy(base_s=1.0, cap_s=30.0, max_attempts=2000)
    assert backoff_delay(policy, 1100, MaxRandom()) == 30.0


# --- Retrier.call: what is never retried -------------------------------------------------------------

NON_RETRYABLE = {
    "permanent (ValidationException)": (validation, "model.request_invalid"),
    "permanent (runtime bug)": (lambda: KeyError("x"), "runtime.internal"),
    "semantic": (lambda: ReviewError.of("model.output_invalid", "bad json"), "model.output_invalid"),
    "policy": (lambda: ReviewError.of("model.refused", "content_filtered"), "model.refused"),
    "state": (LeaseLost, "runtime.lease_lost"),
}


@pytest.mark.parametrize("kind", list(NON_RETRYABLE))
def test_non_transient_errors_are_never_retried(kind):
    factory, code = NON_RETRYABLE[kind]
    # GIVEN a call that fails with a non-transient error
    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry)
    fn = Script([factory()])
    # WHEN called through the retrier
    with pytest.raises(ReviewError) as info:
        retrier.call(fn, step="analyst.score")
    # THEN it ran exactly once, nothing slept, nothing counted as a retry, and the code is stable
    assert fn.calls == 1
    assert slept == [] and retrier.budget.spent == 0
    assert sum(retrier.stats.retries.values()) == 0
    assert info.value.envelope.error_code == code
    assert not isinstance(info.value, RetryGiveUp)


@FAST
@given(policy=policies, kind=st.sampled_from(list(NON_RETRYABLE)))
def test_property_non_transient_called_exactly_once(policy, kind):
    factory, code = NON_RETRYABLE[kind]
    retrier, slept = make_retrier(policy)
    fn = Script([factory(), "never reached"])
    with pytest.raises(ReviewError) as info:
        retrier.call(fn, step="s")
    assert fn.calls == 1 and slept == [] and info.value.envelope.error_code == code


# --- Retrier.call: transient retries, give-up, budget ------------------------------------------------

@FAST
@given(policy=policies, codes=st.lists(st.sampled_from(list(TRANSIENT_FACTORIES)), min_size=8, max_size=8),
       seed=st.integers(0, 2**32))
def test_transient_retried_up_to_max_attempts_then_gives_up_with_last_envelope(policy, codes, seed):
    # GIVEN a call that fails transiently every time (the failures vary, so "last" is observable)
    retrier, slept = make_retrier(policy, seed=seed)
    fn = Script([TRANSIENT_FACTORIES[c]() for c in codes])
    # WHEN called
    with pytest.raises(RetryGiveUp) as info:
        retrier.call(fn, step="analyst.locate")
    # THEN it ran max_attempts times, slept between attempts only, and reports the last error
    assert fn.calls == policy.max_attempts
    assert len(slept) == policy.max_attempts - 1
    env = info.value.envelope
    assert env.error_code == codes[policy.max_attempts - 1]
    assert env.attempt == policy.max_attempts and env.retryable
    assert env.step == "analyst.locate"
    assert retrier.stats.retries == Counter(codes[: policy.max_attempts - 1])
    assert retrier.stats.calls == 0  # the caller counts the calls that reach the model (the worker: test_worker.py)


@FAST
@given(policy=policies, failures=st.integers(0, 7), seed=st.integers(0, 2**32))
def test_transient_then_success_returns_the_value(policy, failures, seed):
    retrier, slept = make_retrier(policy, seed=seed)
    fn = Script([unavailable()] * failures + ["answer"])
    if failures < policy.max_attempts:
        assert retrier.call(fn, step="s") == "answer"
        assert fn.calls == failures + 1 and len(slept) == failures
        assert retrier.stats.retries["model.unavailable"] == failures
    else:
        with pytest.raises(RetryGiveUp):
            retrier.call(fn, step="s")
        assert fn.calls == policy.max_attempts


@FAST
@given(policy=policies, budget_s=st.floats(0.0, 20.0), seed=st.integers(0, 2**32),
       hints=st.lists(st.one_of(st.none(), st.floats(0.0, 10.0)), min_size=1, max_size=12),
       calls=st.integers(1, 6))
def test_total_sleep_never_exceeds_the_shared_budget(policy, budget_s, seed, hints, calls):
    # GIVEN one budget shared by several calls of one chunk, failing with and without Retry-After
    slept: list[float] = []
    budget = RetryBudget(budget_s)
    retrier = Retrier(policy=policy, budget=budget, stats=RetryStats(), rng=random.Random(seed), sleep=slept.append)
    for _ in range(calls):
        fn = Script([throttle(h) for h in hints] + ["ok"])
        try:
            retrier.call(fn, step="s")
        except RetryGiveUp:
            pass
    # THEN the recorded sleep is what the budget says was spent, and never more than the budget
    assert sum(slept) <= budget_s + 1e-9
    assert budget.spent == pytest.approx(sum(slept))


def test_budget_exhausted_gives_up_without_sleeping():
    # GIVEN a budget smaller than the provider's Retry-After
    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry, budget_s=1.0)
    fn = Script([throttle(5.0), "ok"])
    with pytest.raises(RetryGiveUp) as info:
        retrier.call(fn, step="s")
    # THEN tier 1 hands over to tier 2 at once, with a stable code and the throttle as its cause
    assert fn.calls == 1 and slept == []
    assert info.value.envelope.error_code == "runtime.retry_budget_exhausted"
    assert info.value.envelope.cause_code == "model.throttled"
    assert is_backpressure(info.value.envelope)


@FAST
@given(policy=policies, hints=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=7), seed=st.integers(0, 2**32))
def test_retry_after_is_honoured(policy, hints, seed):
    retrier, slept = make_retrier(policy, seed=seed)
    fn = Script([throttle(h) for h in hints] + ["ok"])
    try:
        retrier.call(fn, step="s")
    except RetryGiveUp:
        pass
    assert len(slept) == min(len(hints), policy.max_attempts - 1)
    for delay, hint in zip(slept, hints):
        assert delay >= float(f"{hint:g}")


def test_retries_are_counted_per_error_code():
    retrier, _ = make_retrier(RetryPolicy(base_s=0.01, cap_s=0.1, max_attempts=5))
    fn = Script([throttle(), unavailable(), throttle(), ReadTimeoutError(endpoint_url="x"), "ok"])
    assert retrier.call(fn, step="s") == "ok"
    assert retrier.stats.retries == Counter({"model.throttled": 2, "model.unavailable": 1, "model.timeout": 1})
    assert fn.calls == 5


def test_no_time_left_raises_time_exhausted_without_sleeping():
    # GIVEN a Lambda clock that fits one more call, but not a 2 s sleep before another
    asked: list[float] = []

    def has_time(seconds: float) -> bool:
        asked.append(seconds)
        return seconds < 1.0

    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry, has_time=has_time)
    fn = Script([throttle(2.0), "ok"])
    # WHEN a transient failure would be retried
    with pytest.raises(ReviewError) as info:
        retrier.call(fn, step="analyst.score")
    # THEN the chunk is handed back as runtime.time_exhausted, naming the error that ate the time;
    # no sleep, no budget spent
    env = info.value.envelope
    assert (env.error_code, env.cause_code, env.http_status) == ("runtime.time_exhausted", "model.throttled", 429)
    assert env.retryable
    assert fn.calls == 1 and slept == [] and retrier.budget.spent == 0
    assert asked == [0, 2.0]  # before the call; then about the delay it was about to sleep


def test_time_is_checked_before_every_model_call():
    # GIVEN a Lambda clock with room for exactly two calls
    left = {"calls": 2}

    def has_time(seconds: float) -> bool:
        return left["calls"] > 0 and seconds == 0

    def call() -> str:
        left["calls"] -= 1
        return "ok"

    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry, has_time=has_time)
    # WHEN three calls are made THEN the first two run and the third is never started
    assert retrier.call(call, step="liability.locate") == "ok"
    assert retrier.call(call, step="liability.assess") == "ok"
    with pytest.raises(ReviewError) as info:
        retrier.call(call, step="disputes.locate")
    env = info.value.envelope
    assert (env.error_code, env.cause_code, env.step) == ("runtime.time_exhausted", None, "disputes.locate")
    assert left["calls"] == 0 and slept == []


def test_check_stops_before_the_next_attempt():
    stop = {"now": False}

    def check():
        if stop["now"]:
            raise LeaseLost()

    def fn():
        stop["now"] = True
        raise unavailable()

    retrier, slept = make_retrier(PROFILES["local"].tier1.model_retry, check=check)
    with pytest.raises(LeaseLost):
        retrier.call(fn, step="s")
    assert len(slept) == 1


# --- the prod policy, pinned -------------------------------------------------------------------------

def test_prod_model_policy_spec():
    policy = PROFILES["prod"].tier1.model_retry
    assert (policy.base_s, policy.cap_s, policy.max_attempts) == (1.0, 30.0, 3)
    # GIVEN a model that always throttles, WHEN called with the largest possible jitter
    retrier, slept = make_retrier(policy, rng=MaxRandom())
    fn = Script([throttle()])
    with pytest.raises(RetryGiveUp):
        retrier.call(fn, step="s")
    # THEN 3 attempts with at most 1 s then 2 s between them
    assert fn.calls == 3
    assert slept == [1.0, 2.0]


# --- call_with_repair ----------------------------------------------------------------------------------

class Step:
    """build/invoke/parse for one analyst step; parse fails semantically `bad` times."""

    def __init__(self, bad: int, invoke_failures: list[BaseException] | None = None, parse_error: str = "model.output_invalid",
                 stats: RetryStats | None = None):
        self.stats = stats  # counts each call it makes, as the worker counts the calls that reach the model
        self.hints: list[str | None] = []
        self.bad = bad
        self.parse_error = parse_error
        self.invoke = Script(list(invoke_failures or []) + ["response"])
        self.parsed = 0

    def build(self, invalid):
        hint = invalid.message if invalid is not None else None  # the repair gets the invalid answer's envelope
        self.hints.append(hint)
        return {"prompt": "p", "hint": hint}

    def call_invoke(self, request):
        if self.stats is not None:
            self.stats.calls += 1
        return self.invoke()

    def parse(self, response):
        self.parsed += 1
        if self.parsed <= self.bad:
            raise ReviewError.of(self.parse_error, f"findings[0].quote: field required (try {self.parsed})")
        return {"findings": []}


def test_repair_feeds_the_validation_message_back_once():
    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry)
    step = Step(bad=1, stats=retrier.stats)
    # WHEN the first answer fails validation and the repaired one passes
    result, calls = retrier.call_with_repair(step.build, step.call_invoke, step.parse, step="analyst.score")
    # THEN the second request carries the validation error, and it counts as a repair, not a retry
    assert result == {"findings": []}
    assert calls == 2
    assert step.hints == [None, "findings[0].quote: field required (try 1)"]
    assert retrier.stats.repairs == 1
    assert sum(retrier.stats.retries.values()) == 0 and slept == []


def test_second_semantic_failure_raises_output_invalid():
    retrier, slept = make_retrier(PROFILES["prod"].tier1.model_retry)
    step = Step(bad=2)
    with pytest.raises(ReviewError) as info:
        retrier.call_with_repair(step.build, step.call_invoke, step.parse, step="analyst.score")
    assert info.value.envelope.error_code == "model.output_invalid"
    assert not info.value.envelope.retryable
    assert len(step.hints) == 2 and step.invoke.calls == 2
    assert retrier.stats.repairs == 1 and slept == []


def test_policy_failure_is_not_repaired():
    retrier, _ = make_retrier(PROFILES["prod"].tier1.model_retry)
    step = Step(bad=1, parse_error="model.refused")
    with pytest.raises(ReviewError) as info:
        retrier.call_with_repair(step.build, step.call_invoke, step.parse, step="s")
    assert info.value.envelope.error_code == "model.refused"
    assert step.hints == [None] and retrier.stats.repairs == 0


def test_repair_and_transient_retries_are_counted_apart():
    retrier, slept = make_retrier(PROFILES["local"].tier1.model_retry)
    step = Step(bad=1, invoke_failures=[throttle()], stats=retrier.stats)
    result, calls = retrier.call_with_repair(step.build, step.call_invoke, step.parse, step="s")
    assert result == {"findings": []}
    assert calls == 3  # throttled, answered badly, repaired
    assert retrier.stats.retries == Counter({"model.throttled": 1})
    assert retrier.stats.repairs == 1
    assert len(slept) == 1


@FAST
@given(bad=st.integers(0, 3))
def test_property_at_most_one_repair(bad):
    retrier, _ = make_retrier(PROFILES["local"].tier1.model_retry)
    step = Step(bad=bad)
    try:
        retrier.call_with_repair(step.build, step.call_invoke, step.parse, step="s")
        assert bad <= 1
    except ReviewError as exc:
        assert bad >= 2 and exc.envelope.error_code == "model.output_invalid"
    assert len(step.hints) == min(bad, 1) + 1
    assert retrier.stats.repairs == min(bad, 1)


# --- after tier 1: the tier-2 backoff and the backpressure requeue delay ------------------------------

@pytest.mark.parametrize("rng", [MinRandom(), MaxRandom()], ids=["shortest", "longest"])
def test_prod_tier2_backoffs_span_minutes_so_a_two_minute_outage_uses_no_poison_budget(rng):
    prod = PROFILES["prod"]
    # GIVEN the backoffs before each retry the poison budget allows (failures 1 .. budget-1)
    backoffs = [tier2_backoff_s(prod, f, rng) for f in range(1, prod.recovery.poison_budget)]
    # THEN they double from half a minute to a few minutes, and even the shortest draw keeps the
    # budget's last attempt more than two minutes after its first
    assert backoffs == ([15, 30, 60, 120] if isinstance(rng, MinRandom) else [30, 60, 120, 240])
    assert sum(backoffs) > 120
    assert max(backoffs) <= min(prod.recovery.tier2_backoff_max_s, prod.queues.analysis_visibility_s)


@FAST
@given(failures=st.integers(1, 200), seed=st.integers(0, 2**32), name=st.sampled_from(sorted(PROFILES)))
def test_tier2_backoff_is_whole_seconds_within_the_queue_limits(failures, seed, name):
    p = PROFILES[name]
    back = tier2_backoff_s(p, failures, random.Random(seed))
    ceiling = min(p.recovery.tier2_backoff_max_s, p.recovery.tier2_backoff_base_s * 2 ** (failures - 1))
    assert isinstance(back, int) and 1 <= back <= min(p.queues.analysis_visibility_s, 43200)
    assert ceiling / 2 <= back <= max(1, ceiling) + 1  # rounded up to whole seconds


@FAST
@given(streak=st.integers(0, 60), seed=st.integers(0, 2**32), name=st.sampled_from(sorted(PROFILES)),
       retry_after=st.one_of(st.none(), st.floats(0.0, 2000.0)))
def test_a_backpressure_requeue_is_never_immediate_and_never_longer_than_sqs_allows(streak, seed, name, retry_after):
    p = PROFILES[name]
    delay = requeue_delay_s(p, streak, random.Random(seed), retry_after)
    assert isinstance(delay, int) and 1 <= delay <= p.recovery.throttle_max_delay_s <= 900
    if retry_after is not None and retry_after <= p.recovery.throttle_max_delay_s:
        assert delay >= retry_after  # the provider's hint is a floor


def test_the_local_requeue_delay_rounds_up_not_to_zero():
    # GIVEN the local profile, whose first ceiling is a fraction of a second (model cap 0.2 s)
    local = PROFILES["local"]
    # THEN the delay is whole seconds, at least one, growing to the local ceiling
    assert [requeue_delay_s(local, n, MinRandom()) for n in range(6)] == [1, 1, 1, 1, 1, 1]
    assert [requeue_delay_s(local, n, MaxRandom()) for n in range(6)] == [1, 1, 1, 2, 2, 2]
    assert [requeue_delay_s(PROFILES["prod"], n, MaxRandom()) for n in range(7)] == [30, 60, 120, 240, 480, 900, 900]
