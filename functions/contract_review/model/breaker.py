"""A circuit breaker per model, in each worker process (`BreakerModel` wraps the process's `ModelClient`).

- closed: calls go through; `failure_threshold` failed calls in a row (provider 5xx or timeouts; never
  throttles, which are the quota's backpressure and model/pacing.py's business, nor permanent errors, which
  are the request's fault), for at least two chunks, open it: one chunk whose every call fails is that
  chunk's problem (tier 2 and its DLQ), failures across chunks are the provider's;
- open: no call is sent for `open_s`; each refused call raises `model.circuit_open` (class state: tier 1
  does not retry it), and the worker releases the chunk as backpressure, with a delay of at least the time
  the breaker stays open, keeping its checkpoints and spending none of its attempts (worker.py);
- half-open (after `open_s`): one probe call goes through; its success closes the breaker, its failure
  opens it again for another `open_s`.
Its state is in the worker's log and metrics (`CircuitOpen`), in the job's events (`chunk.requeued`,
reason `model.circuit_open`) and so in `review status`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from contract_review.domain.errors import ErrorEnvelope, ReviewError, classify
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse
from contract_review.domain.policy import trips_breaker

log = logging.getLogger(__name__)


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class CircuitBreaker:
    model_id: str
    failure_threshold: int = 5
    open_s: float = 30.0
    clock: Callable[[], float] = time.time
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # in a row
    failed_chunks: set[str] = field(default_factory=set)  # the chunks of the calls that failed in a row
    opened_at: float = 0.0
    opened: int = 0  # times it opened (metrics)
    _probing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def before_call(self) -> None:
        """Raises `model.circuit_open` when no call may be sent now."""
        with self._lock:
            if self.state is BreakerState.CLOSED:
                return
            now = self.clock()
            if self.state is BreakerState.OPEN and now - self.opened_at >= self.open_s:
                self.state, self._probing = BreakerState.HALF_OPEN, False
            if self.state is BreakerState.HALF_OPEN and not self._probing:
                self._probing = True  # this call is the probe
                return
            wait = max(self.open_s - (now - self.opened_at), 1.0)
        raise ReviewError(ErrorEnvelope.of(
            "model.circuit_open", f"the circuit breaker of model {self.model_id} is {self.state.value} after "
            f"{self.failure_threshold} failed calls in a row; no call is sent for {wait:.0f} s",
            retry_after_s=wait))

    def on_success(self) -> None:
        with self._lock:
            if self.state is not BreakerState.CLOSED:
                log.warning("circuit breaker closed", extra={"model_id": self.model_id})
            self.state, self.failures, self._probing = BreakerState.CLOSED, 0, False
            self.failed_chunks.clear()

    def on_failure(self, exc: BaseException, chunk_id: str = "") -> None:
        code = classify(exc, model_call=True).error_code
        with self._lock:
            if not trips_breaker(code):
                if self.state is BreakerState.HALF_OPEN:
                    self._probing = False  # the probe told nothing about the provider's health: probe again
                return
            self.failures += 1
            self.failed_chunks.add(chunk_id)
            tripped = self.failures >= self.failure_threshold and len(self.failed_chunks) >= 2
            if self.state is BreakerState.HALF_OPEN or tripped:
                if self.state is not BreakerState.OPEN:
                    self.opened += 1
                    log.warning("circuit breaker open", extra={"model_id": self.model_id, "failures": self.failures,
                                                                "error_code": code})
                self.state, self.opened_at, self._probing = BreakerState.OPEN, self.clock(), False


@dataclass
class BreakerModel:
    """A `ModelClient` behind a circuit breaker."""

    inner: ModelClient
    breaker: CircuitBreaker

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.breaker.before_call()
        try:
            response = self.inner.invoke(request)
        except Exception as exc:  # told to the breaker, then re-raised unchanged
            self.breaker.on_failure(exc, request.chunk_id)
            raise
        self.breaker.on_success()
        return response
