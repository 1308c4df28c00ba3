"""Tier 1: classified retries inside the worker, and the delays of what comes after it.

`sleep = random(0, min(cap, base * 2**attempt))` (full jitter), Retry-After honoured (never
sleep less than the provider asked), a per-chunk budget of seconds spent sleeping, permanent
errors never retried, and no call started without the time to finish it (`has_time`). Tier 2
(the queue) takes over when tier 1 gives up; the caller decides how, from the envelope, with
`tier2_backoff_s` (a failed attempt) or `requeue_delay_s` (backpressure).
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from contract_review.config.constants import SQS_MAX_VISIBILITY_S
from contract_review.config.profile import Profile, RetryPolicy
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, ReviewError, classify
from contract_review.domain.policy import retried_in_tier1
from contract_review.domain.records import Usage

if TYPE_CHECKING:
    from contract_review.domain.cost import AttemptMeter

T = TypeVar("T")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random,
                  retry_after_s: float | None = None) -> float:
    """Delay before retry number `attempt` (0-based). Retry-After is a floor, not a suggestion."""
    ceiling = min(policy.cap_s, policy.base_s * (2 ** min(attempt, 63)))  # no float overflow
    delay = rng.uniform(0, ceiling)
    if retry_after_s is not None and retry_after_s > delay:
        delay = retry_after_s
    return delay


@dataclass
class RetryBudget:
    """Seconds of tier-1 sleeping one chunk attempt may spend, shared by all its calls."""

    seconds: float
    spent: float = 0.0

    def can_spend(self, delay: float) -> bool:
        return self.spent + delay <= self.seconds

    def spend(self, delay: float) -> None:
        self.spent += delay


@dataclass
class RetryStats:
    # model calls that reached the model, counted by the caller where it makes one (the worker: a call held by a
    # pause, the daily quota, the pacer or a stop check before it is made is none); the retrier counts none itself
    calls: int = 0
    retries: Counter[str] = field(default_factory=Counter)  # tier-1 retries by error code
    repairs: int = 0  # semantic repair attempts (counted apart from transient retries)
    tokens: Usage = field(default_factory=Usage)  # the model tokens of the answered calls (cost.py)
    meter: AttemptMeter | None = None  # the attempt's AWS requests and duration (worker), when metered
    # calls that timed out on the client and may still be billed (the worker counts them), and their estimated cost
    # (input as the pacer estimates it, output at the request's maxTokens: docs/cost.md "Estimated spend")
    timed_out_calls: int = 0
    estimated_micro_usd: int = 0

    def add_tokens(self, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
                   cache_write_tokens: int = 0) -> None:
        t = self.tokens
        self.tokens = Usage(input_tokens=t.input_tokens + input_tokens, output_tokens=t.output_tokens + output_tokens,
                            cache_read_tokens=t.cache_read_tokens + cache_read_tokens,
                            cache_write_tokens=t.cache_write_tokens + cache_write_tokens)

    def timed_out(self, estimated_micro_usd: int) -> None:
        """A call that timed out on the client and may still be billed, with its estimated cost."""
        self.timed_out_calls += 1
        self.estimated_micro_usd += estimated_micro_usd

    def add(self, other: RetryStats) -> None:
        """Add `other`'s counts (an analyst's, to its chunk attempt's); the meter stays this one's."""
        self.calls += other.calls
        self.repairs += other.repairs
        self.retries.update(dict(other.retries))  # copied first (atomically): another thread may be adding to it
        t = other.tokens
        self.add_tokens(t.input_tokens, t.output_tokens, t.cache_read_tokens, t.cache_write_tokens)
        self.timed_out_calls += other.timed_out_calls
        self.estimated_micro_usd += other.estimated_micro_usd


class RetryGiveUp(ReviewError):
    """Tier 1 gave up; `envelope` is the last error (the caller hands the chunk to tier 2)."""


@dataclass
class Retrier:
    policy: RetryPolicy
    budget: RetryBudget
    stats: RetryStats
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], None] = time.sleep
    # False when the invocation cannot fit another model call after `seconds` more (Lambda clock).
    has_time: Callable[[float], bool] = lambda _s: True
    check: Callable[[], None] = lambda: None  # raises to stop (lease lost, job cancelled)
    # told of each tier-1 retry before its wait: (the error, the attempt that failed, the delay in s)
    on_retry: Callable[[ErrorEnvelope, int, float], None] = lambda _env, _attempt, _delay: None

    def call(self, fn: Callable[[], T], *, step: str) -> T:
        """One model call with tier-1 retries: what its code's row in the recovery policy retries (a model call's
        transient failure), at this retrier's policy. AWS calls are retried by botocore, not here."""
        attempt = 0
        while True:
            self.check()
            if not self.has_time(0):  # before every call, not only every analyst
                raise ReviewError(ErrorEnvelope.of("runtime.time_exhausted", "no time for the next model call",
                                                   step=step, attempt=attempt + 1))
            try:
                return fn()
            except Exception as exc:  # classified below; nothing is swallowed
                env = classify(exc, step=step, attempt=attempt + 1, model_call=True)
                if not retried_in_tier1(env):
                    raise ReviewError(env) from exc
                if attempt + 1 >= self.policy.max_attempts:
                    raise RetryGiveUp(env) from exc
                delay = backoff_delay(self.policy, attempt, self.rng, env.retry_after_s)
                if not self.budget.can_spend(delay):
                    raise RetryGiveUp(ErrorEnvelope.of(
                        "runtime.retry_budget_exhausted", f"{self.budget.spent:.2f}s of {self.budget.seconds:.2f}s used",
                        cause_code=env.error_code, http_status=env.http_status, provider_code=env.provider_code,
                        retry_after_s=env.retry_after_s, step=step, attempt=attempt + 1)) from exc
                if not self.has_time(delay):
                    raise ReviewError(ErrorEnvelope.of("runtime.time_exhausted", f"after {env.error_code}",
                                                       cause_code=env.error_code, http_status=env.http_status,
                                                       provider_code=env.provider_code, step=step,
                                                       attempt=attempt + 1)) from exc
                self.budget.spend(delay)
                self.stats.retries[env.error_code] += 1
                self.on_retry(env, attempt + 1, delay)
                self.sleep(delay)
                attempt += 1

    def call_with_repair(self, build: Callable[[ErrorEnvelope | None], Req], invoke: Callable[[Req], Resp],
                         parse: Callable[[Resp], T], *, step: str) -> tuple[T, int]:
        """One model step: transient retries, plus one semantic repair: `build` gets the invalid answer's envelope
        (None the first time) and decides the repair (the error fed back, or more room for a cut answer). With
        the result, the calls `invoke` counted in `stats.calls` meanwhile (the ones that reached the model)."""
        calls_before = self.stats.calls
        invalid: ErrorEnvelope | None = None
        for repair in (False, True):
            request = build(invalid)
            response = self.call(functools.partial(invoke, request), step=step)
            try:
                return parse(response), self.stats.calls - calls_before
            except ReviewError as exc:
                if exc.envelope.error_class is not ErrorClass.SEMANTIC or repair:
                    raise
                self.stats.repairs += 1
                invalid = exc.envelope
        raise AssertionError("unreachable")


def tier2_backoff_s(profile: Profile, failures: int, rng: random.Random) -> int:
    """Seconds until a failed record comes back (its new visibility): equal jitter in
    [ceiling/2, ceiling], ceiling = min(max, base * 2**(failures-1)); whole seconds, at least 1, at
    most the queue's visibility and SQS's 12 h."""
    ceiling = min(profile.recovery.tier2_backoff_max_s, profile.recovery.tier2_backoff_base_s * 2 ** min(max(failures - 1, 0), 30))
    seconds = math.ceil(rng.uniform(ceiling / 2, ceiling))
    return max(1, min(seconds, profile.queues.analysis_visibility_s, SQS_MAX_VISIBILITY_S))


def requeue_delay_s(profile: Profile, streak_requeues: int, rng: random.Random,
                    retry_after_s: float | None = None) -> int:
    """Delay of a backpressure requeue (SQS DelaySeconds): equal jitter under a ceiling that doubles
    with the requeues of the current streak, never shorter than Retry-After, in whole seconds,
    never zero (after an error a chunk never comes straight back), at most `throttle_max_delay_s`."""
    ceiling = min(profile.recovery.throttle_max_delay_s, profile.tier1.model_retry.cap_s * 2 ** min(streak_requeues, 10))
    delay = max(retry_after_s or 0.0, rng.uniform(ceiling / 2, ceiling))
    return max(1, min(math.ceil(delay), profile.recovery.throttle_max_delay_s))
