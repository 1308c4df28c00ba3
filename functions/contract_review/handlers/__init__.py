"""Lambda handlers and the Fargate poller: glue only (Powertools, parse, one call into the core)."""

from __future__ import annotations

import functools
import os

import boto3

from ..config import Settings
from ..model_clients import ModelClient
from ..ports import Deps
from ..wiring import build_deps, build_model


@functools.cache
def settings() -> Settings:
    """The only os.environ read: once per process."""
    return Settings.from_env(os.environ)


@functools.cache
def session() -> boto3.Session:
    return boto3.Session()


@functools.cache
def deps() -> Deps:
    """Built on the first invocation of a warm sandbox, reused after."""
    return build_deps(settings(), session())


@functools.cache
def model() -> ModelClient:
    return build_model(settings(), session())


def reset() -> None:
    """Forget everything built from the environment (tests change the environment between cases)."""
    for cached in (settings, session, deps, model):
        cached.cache_clear()
