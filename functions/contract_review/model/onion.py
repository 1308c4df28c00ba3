"""The onion around a worker's model call: `ModelClient` decorators, each calling its `inner` client, built once per
process by wiring.py (`worker_model`) around the model as `build_model` and the handlers make it (its faults, its
circuit breaker, its trace). A call goes in from the outside:

    PausableModel    an operator's pause (`review quota pause`), or the stack's spend-cap hold of today
                     (domain/spend_cap.py): the call is held (`model.paused`, `model.spend_capped`)
    DailyQuotaModel  a full daily token ledger holds it (`model.daily_quota_exhausted`), or lets it through as the
                     hour's probe; an answered call's tokens go to the ledger (model/daily_quota.py)
    PacedModel       it waits for this worker's share of the per-minute quota (model/pacing.py), then the stop
                     checks again; the pacers are told how it went
    CountedModel     it reaches the model: counted (a call, its tokens; one that timed out on the client may be
                     billed all the same: counted as such, with its estimated cost, docs/cost.md "Estimated spend")
    the model        (BreakerModel, TracedModel, FaultInjectingModel, ... the provider's client)

So a job's call count is the calls the model received: a call held by a pause, the daily quota, the pacer or a stop
check after its wait is none. The shape is the interceptors of Temporal's SDK: each layer does its part and calls
`inner`; a layer that is not configured is not in the onion (no layer checks for a missing collaborator).

What a layer needs of a call beyond its request is the call's `CallScope`: where its counts go (the analyst's
`RetryStats`) and the stop checks to run after a wait for quota (a cancel, a lost lease, no time left). The worker sets
it around each analyst (`calls_for`); it is a context variable, and each analyst's thread runs in a copy of the
worker's context (pipeline/analyst_pool.py).

Two layers follow what the operator and the sweeper say (the runtime control, the published quotas): the worker calls
`begin_attempt` of the onion before each chunk attempt (they read them again) and `end_attempt` after it (the daily
quota's count goes to the shared ledger, one write).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from contract_review.config.profile import Profile
from contract_review.domain import spend_cap
from contract_review.domain.cost import PricedModel, micro_usd, model_cost_usd
from contract_review.domain.errors import ReviewError, may_be_billed
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse
from contract_review.domain.ports import Clock, Deps, ModelControls, TokenLedger
from contract_review.model.daily_quota import DailyQuota
from contract_review.model.pacing import QuotaLimiter, unanswered_usage
from contract_review.model.quota_targets import QuotaTargets

log = logging.getLogger(__name__)


class Tally(Protocol):
    """Where a call's counts go (reliability/retry.py `RetryStats`: the analyst's)."""

    calls: int

    def add_tokens(self, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
                   cache_write_tokens: int = 0) -> None: ...

    def timed_out(self, estimated_micro_usd: int) -> None: ...


@dataclass(frozen=True)
class CallScope:
    """Who the calls made now are for: `tally` counts them; `ready` runs the stop checks again after a wait for quota
    (raises to stop the call)."""

    tally: Tally
    ready: Callable[[], None]


_SCOPE: ContextVar[CallScope] = ContextVar("model_call_scope")


@contextmanager
def calls_for(scope: CallScope) -> Iterator[None]:
    """The calls made inside, in this context, are `scope`'s."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> CallScope:
    """The scope of the call being made (LookupError outside any: a call the worker did not scope)."""
    return _SCOPE.get()


class Layer(ABC):
    """A decorator of a `ModelClient`: its model id is its inner client's; a chunk attempt's begin and end go inward
    through the onion (`on_begin` innermost first, `on_end` outermost first)."""

    inner: ModelClient

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @abstractmethod
    def invoke(self, request: ModelRequest) -> ModelResponse:
        """The layer's part of the call, around `inner.invoke`."""

    def begin_attempt(self) -> None:
        if isinstance(self.inner, Layer):
            self.inner.begin_attempt()
        self.on_begin()

    def end_attempt(self) -> None:
        self.on_end()
        if isinstance(self.inner, Layer):
            self.inner.end_attempt()

    def on_begin(self) -> None:  # noqa: B027  # most layers follow nothing: no hook to override
        """Before a chunk attempt: what the layer follows is read again."""

    def on_end(self) -> None:  # noqa: B027  # most layers keep nothing to write after an attempt
        """After a chunk attempt."""


def layers(client: ModelClient) -> Iterator[ModelClient]:
    """The client, then each client inside it (`inner`), outermost first, down to the model."""
    inner: ModelClient | None = client
    while inner is not None:
        yield inner
        inner = getattr(inner, "inner", None)


L = TypeVar("L")


def layer(client: ModelClient, kind: type[L]) -> L | None:
    """The onion's layer of type `kind`, or None when it is not in the onion."""
    return next((c for c in layers(client) if isinstance(c, kind)), None)


@dataclass
class CountedModel(Layer):
    """The innermost layer: the call reaches the model, counted on the scope's tally (a call; an answer's tokens, paid
    for whether valid or not, before anything else can fail; a timed-out call's estimated cost)."""

    inner: ModelClient
    price: PricedModel

    def invoke(self, request: ModelRequest) -> ModelResponse:
        tally = current_scope().tally
        tally.calls += 1
        try:
            response = self.inner.invoke(request)
        except Exception as exc:  # counted, then re-raised unchanged
            if may_be_billed(exc):
                tally.timed_out(micro_usd(model_cost_usd(self.price, unanswered_usage(request))))
            raise
        tally.add_tokens(response.input_tokens, response.output_tokens, response.cache_read_tokens,
                         response.cache_write_tokens)
        return response


@dataclass
class PacedModel(Layer):
    """Paces the calls to this worker's share of the per-minute quota (model/pacing.py). The quota it paces to is, at
    each chunk attempt (`begin_attempt`): an operator's (`review quota set N`, read from the runtime `control`), else the
    deploy's (`quotas`: given, published by the sweeper, or the fallback); with neither, the pacers given (`deploy`),
    which a cleared control (`review quota set --clear`) gives back. No quota known now: calls go unpaced."""

    inner: ModelClient
    profile: Profile
    pacing_model_id: str  # the model the pacers settle calls for (the stack's effective model id)
    control: ModelControls | None = None
    quotas: QuotaTargets | None = None
    deploy: QuotaLimiter | None = None
    limiter: QuotaLimiter | None = field(init=False, default=None)
    _tpm: float | None = field(init=False, default=None)  # the quota applied (None: the deploy's pacers)

    def __post_init__(self) -> None:
        self.limiter = self.deploy

    def on_begin(self) -> None:
        """The quota as the control and `quotas` say now: new pacers when it changed (within model_control_max_age_s
        of the change). Lambda and the Fargate poller both come here."""
        control = self.control.get() if self.control is not None else None
        tpm = (control.tokens_per_minute if control is not None else None) or None
        source = "the runtime control (review quota set)"
        if tpm is None and self.quotas is not None:  # the deploy's: given, published by the sweeper, or the fallback
            tpm, source = self.quotas.tokens_per_minute()
        if tpm != self._tpm:
            learned = self.limiter.calibration if self.limiter is not None else None
            self.limiter = self.deploy if tpm is None else \
                QuotaLimiter.for_profile(self.profile, tpm, self.pacing_model_id)
            if self.limiter is not None and learned is not None:  # the model's token counts, as learned, stay
                self.limiter.calibration = learned
            self._tpm = tpm
            if self.quotas is not None:
                log.info("model quota", extra={"tokens_per_minute": tpm, "source": source,
                                               "model_id": self.quotas.model_id})

    def invoke(self, request: ModelRequest) -> ModelResponse:
        limiter = self.limiter  # one read: a new attempt's pacers replace these in one assignment
        if limiter is None:
            return self.inner.invoke(request)
        limiter.wait(request, current_scope().ready)
        try:
            response = self.inner.invoke(request)
        except Exception as exc:  # told to the pacers, then re-raised unchanged
            limiter.failed(exc)
            raise
        limiter.done(request, response)
        return response


@dataclass
class DailyQuotaModel(Layer):
    """Holds calls while the daily token ledger is full, lets one through an hour as the probe, and counts what each
    answered call counted against the quota (model/daily_quota.py). The hold (`quota`) follows `quotas` at each chunk
    attempt: built when a daily quota is first known, its quota changed in place when the published one changes (the
    ledger's counts and the hold's state kept), dropped when none is known any more. Without `quotas`, the hold given
    (`quota`) stays as it is."""

    inner: ModelClient
    profile: Profile
    ledger_model_id: str
    clock: Clock
    ledger: TokenLedger | None = None
    quotas: QuotaTargets | None = None
    quota: DailyQuota | None = None

    def on_begin(self) -> None:
        if self.quotas is not None and self.ledger is not None:
            self._follow(self.quotas, self.ledger)

    def _follow(self, quotas: QuotaTargets, ledger: TokenLedger) -> None:
        tpd, source = quotas.tokens_per_day()
        daily = self.quota
        if daily is not None and (daily.tokens_per_day, daily.source) == (tpd, source):
            return
        log.info("model daily quota", extra={"tokens_per_day": tpd, "source": source, "model_id": quotas.model_id})
        if not tpd:
            if daily is not None:
                daily.flush()
            self.quota = None
        elif daily is None:
            self.quota = DailyQuota.for_profile(ledger, self.ledger_model_id, tpd, self.profile, source=source,
                                                clock=self.clock)
        else:  # `admit` sees the old quota or the new one (one assignment)
            daily.tokens_per_day, daily.source = tpd, source

    def on_end(self) -> None:
        """What this attempt's calls counted, to the shared ledger (one write)."""
        if self.quota is not None:
            self.quota.flush()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        daily = self.quota
        if daily is None:
            return self.inner.invoke(request)
        probe = daily.admit(request.analyst)  # holds the chunk (raises), or lets this call through as the probe
        try:
            response = self.inner.invoke(request)
        except Exception:
            daily.failed(probe)
            raise
        daily.settled(response, probe)  # never raises for the ledger (a failed write is retried)
        return response


@dataclass
class PausableModel(Layer):
    """The outermost layer: no call starts while an operator paused the model (`review quota pause`) or the stack's
    spend-cap hold of today is on (domain/spend_cap.py); the chunk is held as backpressure."""

    inner: ModelClient
    deps: Deps
    control: ModelControls

    def invoke(self, request: ModelRequest) -> ModelResponse:
        paused = self.control.get()
        if paused.paused:
            raise ReviewError.of("model.paused", f"the model was paused by {paused.by or 'an operator'}: "
                                 "`review quota resume` lets it go on", step=request.analyst)
        spend_cap.not_held(self.deps, request.analyst)  # the stack's spend-cap hold of today: model.spend_capped
        return self.inner.invoke(request)
