"""Local doubles of the model provider's failure modes. Demo, tests and bench only; never in prod.

- `FaultInjectingModel`: wraps any `ModelClient` and injects seeded faults shaped exactly like
  Bedrock's (botocore `ClientError` with the real error codes and HTTP statuses), so the retry
  and classification code cannot tell the difference.
- `SharedTokenBucket`: a model quota shared by every worker process, like an account quota.
- `CallLedger`: an append-only record of every model call (the offline stand-in for a provider's
  usage log); tests count model calls from it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from .config import FaultSpec
from .model_clients import ModelClient, ModelRequest, ModelResponse


def _client_error(code: str, status: int, message: str, retry_after: float | None = None) -> ClientError:
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    response: Any = {"Error": {"Code": code, "Message": message},
                     "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}
    return ClientError(response, "Converse")


class SharedTokenBucket:
    """A model quota shared by every worker process (file + flock), like a real account quota."""

    def __init__(self, state_dir: str, rate_per_s: float):
        self.path = Path(state_dir) / "model-quota.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rate = rate_per_s

    def take(self) -> float | None:
        """Take a token; return None on success, else seconds until one is available."""
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            raw = fh.read()
            now = time.time()
            state = json.loads(raw) if raw else {"tokens": 1.0, "at": now}
            tokens = min(1.0, state["tokens"] + (now - state["at"]) * self.rate)
            ok = tokens >= 1.0
            tokens = tokens - 1.0 if ok else tokens
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"tokens": tokens, "at": now}))
            return None if ok else (1.0 - tokens) / self.rate


@dataclass
class FaultInjectingModel:
    """Seeded faults in Bedrock's shapes. Deterministic for a given seed and call sequence."""

    inner: ModelClient
    spec: FaultSpec
    _seen: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def _active(self) -> bool:
        return self.spec.switch_file is None or os.path.exists(self.spec.switch_file)

    def _rng(self, request: ModelRequest) -> random.Random:
        key = f"{request.chunk_id}|{request.analyst}|{request.step}|{request.prompt[-64:]}"
        with self._lock:
            n = self._seen.get(key, 0)
            self._seen[key] = n + 1
        digest = hashlib.sha256(f"{self.spec.seed}|{key}|{n}|{os.getpid()}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def invoke(self, request: ModelRequest) -> ModelResponse:
        spec = self.spec
        if spec.latency_ms:
            time.sleep(spec.latency_ms / 1000)
        if not self._active():
            return self.inner.invoke(request)
        if spec.permanent_code:
            status = {"AccessDeniedException": 403, "ResourceNotFoundException": 404}.get(spec.permanent_code, 400)
            raise _client_error(spec.permanent_code, status, "injected permanent fault")
        if spec.always_fail_chunk and spec.always_fail_chunk in (request.chunk_id, str(request.payload.get("chunk_index"))):
            raise _client_error("ServiceUnavailableException", 503, "injected: this chunk always fails")
        if spec.throttle_quota_per_s and spec.throttle_state_dir:
            wait = SharedTokenBucket(spec.throttle_state_dir, spec.throttle_quota_per_s).take()
            if wait is not None:
                raise _client_error("ThrottlingException", 429, "injected: quota exceeded", retry_after=round(wait, 3))
        rng = self._rng(request)
        roll = rng.random()
        if roll < spec.transient_rate:
            kind = rng.randrange(3)
            if kind == 0:
                raise _client_error("ThrottlingException", 429, "injected throttle", retry_after=spec.retry_after_s)
            if kind == 1:
                raise _client_error("ServiceUnavailableException", 503, "injected 5xx")
            raise ReadTimeoutError(endpoint_url="offline://model")
        roll -= spec.transient_rate
        if roll < spec.malformed_rate:
            return ModelResponse(text='{"findings": [', stop_reason="malformed_model_output")
        roll -= spec.malformed_rate
        if roll < spec.refusal_rate:
            return ModelResponse(text="", stop_reason="content_filtered")
        return self.inner.invoke(request)


class CallLedger:
    """Append-only record of every model call a process made (one JSON line each).

    The offline stand-in for a provider's usage log: tests count model calls from it.
    """

    def __init__(self, inner: ModelClient, path: str):
        self.inner = inner
        self.path = path

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        outcome = "ok"
        try:
            return self.inner.invoke(request)
        except Exception as exc:  # recorded, then re-raised unchanged
            outcome = type(exc).__name__
            raise
        finally:
            line = json.dumps({"chunk_id": request.chunk_id, "analyst": request.analyst, "step": request.step,
                               "outcome": outcome, "pid": os.getpid(), "at": time.time()})
            with open(self.path, "a") as fh:
                fh.write(line + "\n")
