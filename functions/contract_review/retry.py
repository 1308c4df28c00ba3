"""Tier 1: classified retries inside the worker.

`sleep = random(0, min(cap, base * 2**attempt))` (full jitter), Retry-After honoured (never
sleep less than the provider asked), a per-chunk budget of seconds spent sleeping, permanent
errors never retried. Tier 2 (the queue) takes over when tier 1 gives up; the caller decides
how, from the envelope.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .config import RetryPolicy
from .errors import ErrorClass, ErrorEnvelope, ReviewError, classify

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
    calls: int = 0
    retries: Counter[str] = field(default_factory=Counter)  # tier-1 retries by error code
    repairs: int = 0  # semantic repair attempts (counted apart from transient retries)


class RetryGiveUp(ReviewError):
    """Tier 1 gave up; `envelope` is the last error (the caller hands the chunk to tier 2)."""


@dataclass
class Retrier:
    policy: RetryPolicy
    budget: RetryBudget
    stats: RetryStats
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], None] = time.sleep
    # Returns False when there is no time left for another attempt of `seconds` (Lambda clock).
    has_time: Callable[[float], bool] = lambda _s: True
    check: Callable[[], None] = lambda: None  # raises to stop (lease lost, job cancelled)

    def call(self, fn: Callable[[], T], *, step: str, model_call: bool = True) -> T:
        attempt = 0
        while True:
            self.check()
            try:
                if model_call:
                    self.stats.calls += 1
                return fn()
            except Exception as exc:  # classified below; nothing is swallowed
                env = classify(exc, step=step, attempt=attempt + 1, model_call=model_call)
                if env.error_class is not ErrorClass.TRANSIENT:
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
                                                       step=step, attempt=attempt + 1)) from exc
                self.budget.spend(delay)
                self.stats.retries[env.error_code] += 1
                self.sleep(delay)
                attempt += 1

    def call_with_repair(self, build: Callable[[str | None], Req], invoke: Callable[[Req], Resp],
                         parse: Callable[[Resp], T], *, step: str) -> tuple[T, int]:
        """One model step: transient retries, plus one semantic repair with the error fed back."""
        calls_before = self.stats.calls
        hint: str | None = None
        for repair in (False, True):
            request = build(hint)
            response = self.call(functools.partial(invoke, request), step=step)
            try:
                return parse(response), self.stats.calls - calls_before
            except ReviewError as exc:
                if exc.envelope.error_class is not ErrorClass.SEMANTIC or repair:
                    raise
                self.stats.repairs += 1
                hint = exc.envelope.message
        raise AssertionError("unreachable")
