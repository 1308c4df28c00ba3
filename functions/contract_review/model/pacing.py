"""Adaptive concurrency: each worker process paces its model calls so that all workers together ride
the account's model quota without throttling storms.

The mechanism (docs/runbook.md "Riding the model quota"): per-worker limits derived from a global target,
adjusted by AIMD. Bedrock's quotas are per model and per account, counted in requests per minute (RPM)
and tokens per minute (TPM, a call reserving its input + `maxTokens` when it starts). Each worker
process starts at its share of each quota, `quota / worker_max_concurrency` (the most workers the
stack runs at once), and keeps two pacers, one in requests per second and one in tokens per second:
- a call waits until both pacers have room for it (requests: 1; tokens: its reservation); when it answers,
  what it reserved but does not count (cache reads, unused maxTokens) is given back, as Bedrock settles it;
- until its first throttle a pacer grows multiplicatively (x1.1 per second of successes: TCP's slow
  start, so a few busy workers find the whole quota in tens of seconds); after it, a success adds to the
  rate additively (a tenth of the worker's share per second: N busy workers together climb back by a
  tenth of the quota per second), never above the whole quota (so a lone worker can use all of it).
  Measured side by side (bench/quota.py `after`, 10 calls/s, 20 workers): x1.25 and a fifth throttled
  17 % of calls (goodput 0.83); x1.1 and a tenth 5-6 % (goodput 0.94), at the same makespan;
- a throttle multiplies the rate of the pacer whose quota was hit by 0.8 (at most once per call latency,
  how long a cut takes to show, and at most twice a second, since one burst throttles several calls at
  once) and empties its bucket. The sawtooth between 0.8 and 1 x the quota averages 0.9 of it. Bedrock says which quota only in the
  message ("Too many requests" / "Too many tokens"); the error code (`model.throttled`) is still derived
  from structured fields: the text only picks which pacer slows down (both, when it says neither).

Each worker also learns how far its token estimate (about 4 characters a token) is from the counts the model returns
for its own calls (`TokenCalibration`): a running ratio real / estimated input per model, starting at 1 and bounded,
by which it scales the input part of every reservation, so its reservations converge on what Bedrock really holds.
In process only (lost with the process; a new one starts again at 1). With an exact estimate the ratio stays 1 and
nothing changes.

Nothing is shared at run time: no lock, no table, no request per call. Workers that share a quota find
their fair shares the way TCP flows do (AIMD converges to equal rates). Locally the simulated Bedrock's
quota is a file-locked bucket (faults.py); that is the stand-in for the account's quota, never the
mechanism. The alternative considered, a DynamoDB token bucket every worker takes leases from, holds the
quota exactly but costs a conditional write per lease and a hot partition; see the runbook.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contract_review.config.profile import Profile
from contract_review.domain.errors import classify
from contract_review.domain.model import (
    ModelRequest,
    ModelResponse,
    prefix_tokens,
    quota_tokens,
    reserved_output,
    text_tokens,
)
from contract_review.domain.policy import slows_model_quota
from contract_review.domain.records import Usage

TOKENS_MESSAGE = "too many tokens"
REQUESTS_MESSAGE = "too many requests"


@dataclass
class AimdPacer:
    """A token bucket whose rate (units per second) AIMD adjusts. Thread-safe."""

    rate: float  # current units per second
    floor: float
    ceiling: float
    increase_per_s: float  # additive increase: about this much rate per second of successes
    decrease: float = 0.5  # multiplicative decrease on a throttle
    cooldown_s: float = 1.0  # at most one decrease per this long (one burst throttles many calls); the
    # limiter keeps it at about one call latency, how long a cut takes to show
    burst_s: float = 0.25  # the bucket holds this many seconds of the rate
    slow_start: bool = True  # grow multiplicatively until the first throttle (TCP's slow start)
    slow_start_gain: float = 0.1  # rate added per unit succeeded: rate x 1.1 per second of successes
    clock: Callable[[], float] = time.monotonic
    tokens: float = 0.0
    _at: float | None = None
    _last_decrease: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _capacity(self) -> float:
        return max(self.rate * self.burst_s, 1.0)

    def _refill(self, now: float) -> None:
        if self._at is None:  # a new pacer starts with a full bucket
            self.tokens = self._capacity()
        else:
            self.tokens = min(self._capacity(), self.tokens + (now - self._at) * self.rate)
        self._at = now

    def try_take(self, cost: float) -> float:
        """Take `cost` now (0.0), or say how long until it could be taken (nothing taken)."""
        with self._lock:
            now = self.clock()
            self._refill(now)
            need = min(cost, self._capacity())  # a call bigger than the bucket waits for a full bucket,
            if self.tokens >= need:
                self.tokens -= cost  # then takes it into debt: the next calls wait for it
                return 0.0
            return (need - self.tokens) / self.rate

    def give_back(self, units: float) -> None:
        """Return units taken but not used (a call settled below its reservation), up to a full bucket."""
        with self._lock:
            self._refill(self.clock())
            self.tokens = min(self._capacity(), self.tokens + units)

    def on_success(self, cost: float = 1.0) -> None:
        with self._lock:
            if self.slow_start:  # until the first throttle: about x1.1 per second
                step = self.slow_start_gain * cost
            else:  # then additive: about increase_per_s per second
                step = self.increase_per_s * cost / max(self.rate, 1e-9)
            self.rate = min(self.ceiling, self.rate + step)

    def on_throttle(self) -> bool:
        """Slow down (once per cooldown); True when this throttle did."""
        with self._lock:
            now = self.clock()
            if now - self._last_decrease < self.cooldown_s:
                return False
            self._last_decrease = now
            self.slow_start = False
            self.rate = max(self.floor, self.rate * self.decrease)
            self._refill(now)
            self.tokens = min(self.tokens, 0.0)
            return True


@dataclass
class TokenCalibration:
    """What this worker has learned of the model's real token counts: per model, a running ratio of the input tokens
    the model reported to those estimated for the same calls (decayed sums: each call's weight falls by `decay` with
    every later call, so the ratio follows recent calls), starting at 1 and held within [`floor`, `ceiling`] (one odd
    answer cannot make the pacer reserve nothing or everything). Thread-safe; in process only."""

    floor: float = 0.5
    ceiling: float = 2.0
    decay: float = 0.9
    _sums: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> (real, estimated), decayed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ratio(self, model_id: str) -> float:
        with self._lock:
            real, estimated = self._sums.get(model_id, (0.0, 0.0))
        if estimated <= 0:
            return 1.0
        return min(self.ceiling, max(self.floor, real / estimated))

    def learn(self, model_id: str, estimated: int, real: int) -> None:
        """One finished call: `estimated` input tokens (the pacer's estimate), `real` (what the model reported, cache
        reads and writes included). A call that reported no usage teaches nothing."""
        if estimated <= 0 or real <= 0:
            return
        with self._lock:
            r, e = self._sums.get(model_id, (0.0, 0.0))
            self._sums[model_id] = (r * self.decay + real, e * self.decay + estimated)


def estimated_input(request: ModelRequest) -> int:
    """The input part of `estimated_reservation`: every input token, cache reads included, at about 4 characters a
    token."""
    return prefix_tokens("", request) + text_tokens(request.prompt)


def estimated_reservation(request: ModelRequest, model_id: str = "") -> int:
    """What a call to `model_id` holds against a tokens-per-minute quota when it starts, as Bedrock counts it: all
    its input, cache reads included (the tool-use prompt, the tool definition, the system prompt, the shared context,
    its own part; about 4 characters a token) plus `maxTokens` (x the burndown where the model's catalogue row says
    so; "": the strictest known). The same estimate the simulated Bedrock admits with."""
    return estimated_input(request) + reserved_output(model_id, request.max_tokens)


def unanswered_usage(request: ModelRequest) -> Usage:
    """What a call that got no answer (a client read timeout) may have cost at most, as tokens: its input as
    `estimated_reservation` estimates it (cache reads included, priced as input: the upper bound) and its whole
    `maxTokens` of output. Estimated spend (docs/cost.md): no usage came back to measure."""
    return Usage(input_tokens=prefix_tokens("", request) + text_tokens(request.prompt), output_tokens=request.max_tokens)


def settled_tokens(model_id: str, response: ModelResponse) -> int:
    """What a finished call counts against the model's token quotas, as Bedrock settles it: input + cache writes +
    output x the model's burndown (cache reads count nothing). The tokens pacer gives back the rest of what the call
    reserved; the daily token ledger (model/daily_quota.py) adds this."""
    return quota_tokens(model_id, response.input_tokens, response.cache_write_tokens, response.output_tokens)


def throttle_kind(exc: BaseException) -> str | None:
    """requests | tokens | both for an error whose code slows the model quota (domain/policy.py), None
    otherwise. Which quota it was, Bedrock says only in the message (see the module's note)."""
    if not slows_model_quota(classify(exc, model_call=True).error_code):
        return None
    response = getattr(exc, "response", None)
    error = (response.get("Error") if isinstance(response, dict) else None) or {}
    message = str(error.get("Message", "")).lower()
    if TOKENS_MESSAGE in message:
        return "tokens"
    if REQUESTS_MESSAGE in message:
        return "requests"
    return "both"


@dataclass
class QuotaLimiter:
    """One per worker process: the requests pacer and, when a TPM quota is known, the tokens pacer.

    `wait(request, ready)` blocks until the call may start (calling `ready()` again after any wait, so a
    cancel or a lost lease seen meanwhile stops it before the call); `done(request, response)` and
    `failed(exc)` tell the pacers how it went."""

    requests: AimdPacer | None
    tokens: AimdPacer | None = None
    model_id: str = ""  # whose output burndown settles a call (domain/model.py MODEL_TRAITS; "": the strictest)
    sleep: Callable[[float], None] = time.sleep
    max_wait_step_s: float = 0.05
    latency_s: float | None = None  # moving average of the calls' latency
    min_cooldown_s: float = 0.5
    stats: dict[str, float] = field(default_factory=lambda: {"waits": 0, "waited_s": 0.0, "decreases": 0})
    # the model's real token counts as learned from this worker's calls (a new limiter for a new quota keeps them)
    calibration: TokenCalibration = field(default_factory=TokenCalibration)
    _taken: threading.local = field(default_factory=threading.local)  # what this thread's call reserved in `wait`

    def reservation(self, request: ModelRequest) -> int:
        """What the tokens pacer takes for a call: `estimated_reservation` with its input scaled by the learned ratio
        (1 until calls have answered: the estimate as it is)."""
        ratio = self.calibration.ratio(self.model_id)
        return round(estimated_input(request) * ratio) + reserved_output(self.model_id, request.max_tokens)

    @classmethod
    def for_quota(cls, requests_per_minute: float | None, tokens_per_minute: float | None, workers: int,
                  increase_share: float = 0.1, decrease: float = 0.8, model_id: str = "") -> QuotaLimiter | None:
        """Per-worker pacers from the global quotas (None: no quota known, calls are not paced)."""
        if not requests_per_minute and not tokens_per_minute:
            return None
        n = max(1, workers)

        def pacer(per_minute: float | None) -> AimdPacer | None:
            if not per_minute:
                return None
            total = per_minute / 60
            share = total / n
            return AimdPacer(rate=share, floor=share / 20, ceiling=total, increase_per_s=share * increase_share,
                             decrease=decrease)
        return cls(requests=pacer(requests_per_minute), tokens=pacer(tokens_per_minute), model_id=model_id)

    @classmethod
    def for_profile(cls, profile: Profile, tokens_per_minute: float | None, model_id: str) -> QuotaLimiter | None:
        """This process's pacers for the quota: by tokens (a requests-per-minute quota only when the profile sets
        one: Bedrock no longer enforces it). The workers expected busy: at most the event source's concurrency,
        and one job keeps at most its fan-out window busy (more jobs at once: AIMD brings each one to its share)."""
        busy = min(profile.functions.worker_max_concurrency, profile.fanout.fanout_window)
        return cls.for_quota(profile.quota.model_requests_per_minute, tokens_per_minute, busy, model_id=model_id)

    def wait(self, request: ModelRequest, ready: Callable[[], None]) -> None:
        waited = 0.0
        reserved = float(self.reservation(request))
        self._taken.call = (id(request), reserved)
        for pacer, cost in ((self.requests, 1.0), (self.tokens, reserved)):
            if pacer is None:
                continue
            while (delay := pacer.try_take(cost)) > 0:
                step = min(delay, self.max_wait_step_s)
                self.sleep(step)
                waited += step
        if waited:
            self.stats["waits"] += 1
            self.stats["waited_s"] += waited
            ready()  # the stop conditions again: time passed since the caller checked them

    def done(self, request: ModelRequest, response: ModelResponse) -> None:
        # a cut shows its effect after about one call latency: that is how long a pacer waits between cuts
        if response.latency_ms > 0:
            sample = response.latency_ms / 1000
            self.latency_s = sample if self.latency_s is None else self.latency_s + 0.1 * (sample - self.latency_s)
        cooldown = self.min_cooldown_s if self.latency_s is None else min(max(self.latency_s, self.min_cooldown_s), 5.0)
        if self.requests is not None:
            self.requests.cooldown_s = cooldown
            self.requests.on_success()
        if self.tokens is not None:
            self.tokens.cooldown_s = cooldown
            taken = getattr(self._taken, "call", None)
            reserved = taken[1] if taken is not None and taken[0] == id(request) else float(self.reservation(request))
            self.tokens.on_success(reserved)
            # settled as Bedrock settles it: what the call counts (input, cache writes, output x burndown) replaces
            # what it reserved; the difference is free again (cache reads and unused maxTokens)
            used = settled_tokens(self.model_id, response)
            self.tokens.give_back(max(0.0, reserved - used))
        self.calibration.learn(self.model_id, estimated_input(request),
                               response.input_tokens + response.cache_read_tokens + response.cache_write_tokens)

    def failed(self, exc: BaseException) -> None:
        kind = throttle_kind(exc)
        if kind is None:
            return
        if (kind == "tokens" and self.tokens is None) or (kind == "requests" and self.requests is None):
            kind = "both"  # the quota hit has no pacer of its own: slow down what is paced
        for pacer, hit in ((self.requests, kind in ("requests", "both")), (self.tokens, kind in ("tokens", "both"))):
            if pacer is not None and hit and pacer.on_throttle():
                self.stats["decreases"] += 1
