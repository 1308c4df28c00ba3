"""Lambda handlers and the Fargate poller: glue only (Powertools, parse, one call into the core)."""

from __future__ import annotations

import functools
import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from contract_review.config.settings import Settings
from contract_review.domain.log_fields import LogFieldsFilter
from contract_review.domain.model import ModelClient
from contract_review.domain.ports import Deps

from ..wiring import build_deps, build_model
from .tracing import TracedModel


@functools.cache
def settings() -> Settings:
    """The Lambda handlers' environment, read once per process (the Fargate poller reads its own: poller.py)."""
    return Settings.from_env(os.environ)


@functools.cache
def session() -> boto3.Session:
    return boto3.Session()


class InvocationClock:
    """The running Lambda invocation's remaining time, for the side effects' outcome store: Powertools frees
    a step's in-progress record when the invocation's time runs out (saga.py). A handler that may run the
    saga (aggregator, sweeper) sets `context` at each invocation; without one: the function's timeout."""

    def __init__(self) -> None:
        self.context: Any = None

    def __call__(self) -> int:
        if self.context is not None:
            return int(self.context.get_remaining_time_in_millis())
        return settings().profile.functions.aggregator_timeout_s * 1000


invocation = InvocationClock()


@functools.cache
def deps() -> Deps:
    """Built on the first invocation of a warm sandbox, reused after."""
    return build_deps(settings(), session(), remaining_ms=invocation)


def build_traced_model(s: Settings, boto_session: Any) -> ModelClient:
    """The model (wiring.build_model), each call a `model` trace subsegment (a no-op where tracing is off)."""
    return TracedModel(build_model(s, boto_session))


@functools.cache
def model() -> ModelClient:
    return build_traced_model(settings(), session())


def reset() -> None:
    """Forget everything built from the environment (tests change the environment between cases)."""
    for cached in (settings, session, deps, model):
        cached.cache_clear()


def receive_count(record: SQSRecord) -> int | None:
    """The delivery's attempt number for the log fields (Lambda always sends it; never a reason to fail)."""
    value = (record.raw_event.get("attributes") or {}).get("ApproximateReceiveCount")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def observe(logger: Logger) -> Logger:
    """One logging setup for every handler and the poller: the core's loggers (`contract_review.*`) write
    through `logger`'s structured handler, and every line carries the job's bound fields
    (`domain/log_fields.py`: hashes a raw idempotency key, adds job, chunk, step, ... where known). At cold start,
    one line says which SDK the code runs on (`runtime`): the stack's SDK layer carries the boto3/botocore
    requirements.txt pins and the tests ran with (infra/sdk_layer.py), ahead of the Lambda runtime's own, older one
    (batch inference and prompt caching need a recent botocore); this line shows which one was imported."""
    handler = logger.registered_handler
    if not any(isinstance(f, LogFieldsFilter) for f in handler.filters):
        handler.addFilter(LogFieldsFilter())
    copy_config_to_registered_loggers(source_logger=logger, include={"contract_review"})
    logger.info("runtime", extra=runtime_versions())
    return logger


@functools.cache
def runtime_versions() -> dict[str, str]:
    """The versions this process runs on: Python, boto3, botocore, Powertools."""
    import platform

    import botocore
    from aws_lambda_powertools.shared.version import VERSION as POWERTOOLS

    return {"python": platform.python_version(), "boto3": boto3.__version__, "botocore": botocore.__version__,
            "powertools": POWERTOOLS}
