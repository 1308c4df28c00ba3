"""Lambda handlers: glue only (Powertools, parse, one call into the core)."""

from __future__ import annotations

import functools
import os

import boto3

from ..config import Settings
from ..runtime import Deps, build_deps


@functools.cache
def deps() -> Deps:
    """Built on the first invocation of a warm sandbox, reused after. The only os.environ read."""
    return build_deps(Settings.from_env(os.environ), boto3.Session())
