"""Tracing, behind this one module: the handlers and the Fargate poller use nothing else (the core knows
nothing of it: what it traces are the AWS calls botocore makes and the model calls, wrapped here).

Today: Powertools Tracer on the AWS X-Ray SDK. `Tracer(service=...)` patches botocore, so every Bedrock,
DynamoDB, SQS and S3 call is a subsegment of the invocation's trace (namespace `aws`); `span` adds our own
(one per model call, `model`: `TracedModel`, which `handlers.build_traced_model` puts around the model).
Every subsegment opened while a job's log fields are bound (`domain/log_fields.py`) is annotated with its `job_id` and `chunk_id` (searchable in X-Ray:
`annotation.job_id = "job-..."`).

Why the X-Ray SDK and not OpenTelemetry (ADOT) now: the Powertools layer the functions run on already
carries it, Lambda's active tracing needs nothing else, and it is one daemon sidecar on Fargate. It is in
maintenance mode (support ends 2027-02-25): moving to OpenTelemetry means replacing this module (an
OTel tracer provider, `opentelemetry-instrumentation-botocore`, the ADOT collector instead of the daemon
sidecar in infra/fargate.py, the ADOT layer on the functions) and nothing that calls it.

Where it goes:
- Lambda: on, unless POWERTOOLS_TRACE_DISABLED=true (Powertools decides: outside Lambda, e.g. `review up`
  and the tests, it is off and the SDK is disabled: nothing is sent, nothing fails).
- Fargate poller: on when `AWS_XRAY_DAEMON_ADDRESS` is set (the task definition sets it: the daemon sidecar);
  one segment per chunk message (`poller_segment`).

Threads: the SDK keeps the current segment per thread. `InheritedContext` keeps it in a context variable
instead, so a thread running in a copy of its starter's context (`contextvars.copy_context().run`: the
analyst pool, the heartbeat, the findings readers) traces its calls under the starter's segment.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from aws_lambda_powertools import Tracer
from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core import xray_recorder
from aws_xray_sdk.core.context import Context
from aws_xray_sdk.core.lambda_launcher import LambdaContext

from contract_review.domain import log_fields
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse

F = TypeVar("F", bound=Callable[..., Any])
ANNOTATED = ("job_id", "chunk_id")


class _InheritedLocal:
    """A `threading.local` that a thread started in a copy of another's context inherits (a copy of the
    entity stack: each thread pushes and pops its own subsegments)."""

    __slots__ = ("_var",)

    def __init__(self) -> None:
        object.__setattr__(self, "_var", contextvars.ContextVar(f"xray_entities_{id(self)}"))

    def _slot(self) -> dict[str, object]:
        owner, values = self._var.get((None, {}))
        me = threading.get_ident()
        if owner != me:
            values = {k: list(v) if isinstance(v, list) else v for k, v in values.items()}
            self._var.set((me, values))
        return values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._slot()[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._slot()[name] = value

    def clear(self) -> None:
        self._slot().clear()


def _annotate(subsegment: Any) -> None:
    fields = log_fields.current()
    for key in ANNOTATED:
        if key in fields and hasattr(subsegment, "put_annotation"):
            subsegment.put_annotation(key, str(fields[key]))


class _Inheriting:
    """What both contexts below add to the SDK's: trace entities in thread-local storage that started threads
    inherit (`_local`, set by their `__init__`), every subsegment annotated with the bound job and chunk."""

    _local: _InheritedLocal

    def put_subsegment(self, subsegment: Any) -> None:
        _annotate(subsegment)
        super().put_subsegment(subsegment)  # type: ignore[misc]  # the SDK context this is mixed into

    def clear_trace_entities(self) -> None:
        self._local.clear()


class InheritedContext(_Inheriting, Context):
    """The SDK's context outside Lambda (the Fargate poller)."""

    def __init__(self, context_missing: str = "LOG_ERROR") -> None:
        super().__init__(context_missing)
        self._local = _InheritedLocal()


class InheritedLambdaContext(_Inheriting, LambdaContext):
    """The same, in Lambda (whose segment is the invocation's, from `_X_AMZN_TRACE_ID`)."""

    def __init__(self) -> None:
        super().__init__()
        self._local = _InheritedLocal()


def _install_context() -> None:
    current = xray_recorder.context
    if isinstance(current, InheritedContext | InheritedLambdaContext):
        return
    xray_recorder.configure(context=InheritedLambdaContext() if isinstance(current, LambdaContext)
                            else InheritedContext(context_missing="IGNORE_ERROR"))


def tracer(service: str, *, enabled: bool | None = None) -> Tracer:
    """The process's tracer. `enabled` None: Powertools decides (Lambda: on unless POWERTOOLS_TRACE_DISABLED);
    the poller passes it (on where a daemon listens)."""
    _install_context()
    return Tracer(service=service, disabled=None if enabled is None else not enabled)


def enabled() -> bool:
    return bool(global_sdk_config.sdk_enabled())


def capture_handler(t: Tracer) -> Callable[[F], F]:
    """A Lambda handler's `## handler` subsegment (cold start, service; neither the response nor an error's
    message is captured: they may quote a document)."""
    return t.capture_lambda_handler(capture_response=False, capture_error=False)


@contextmanager
def span(name: str) -> Iterator[None]:
    """A subsegment of ours (annotated with the bound job and chunk); nothing when tracing is off. A failure
    is recorded by its type and error code only: an exception's message may quote the document."""
    if not enabled():
        yield
        return
    subsegment = xray_recorder.begin_subsegment(name)
    try:
        yield
    except BaseException as exc:
        if subsegment is not None:
            subsegment.add_error_flag()
            subsegment.put_annotation("error_type", type(exc).__name__)
            envelope = getattr(exc, "envelope", None)
            if envelope is not None:
                subsegment.put_annotation("error_code", str(envelope.error_code))
        raise
    finally:
        xray_recorder.end_subsegment()


@contextmanager
def poller_segment(name: str) -> Iterator[None]:
    """Outside Lambda there is no invocation segment: the poller opens one per message."""
    if not enabled():
        yield
        return
    segment = xray_recorder.begin_segment(name)
    _annotate(segment)
    try:
        yield
    finally:
        xray_recorder.end_segment()


@contextmanager
def untraced() -> Iterator[None]:
    """Outside Lambda, AWS calls made outside any segment (the poller's receives and deletes) belong to no
    trace: an unsampled segment around them keeps them out (the SDK would warn "No segment found" on each)."""
    if not enabled():
        yield
        return
    xray_recorder.begin_segment("untraced", sampling=0)
    try:
        yield
    finally:
        xray_recorder.end_segment()


class TracedModel:
    """Each model call a `model` subsegment (the Bedrock call, where there is one, nests inside it)."""

    def __init__(self, inner: ModelClient):
        self.inner = inner
        self.model_id = inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        with span("model"):
            return self.inner.invoke(request)

    def __getattr__(self, name: str) -> Any:  # the inner client's other attributes (breaker state, ...)
        return getattr(self.inner, name)
