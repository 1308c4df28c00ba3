"""Local doubles of the model provider's failure modes. Demo, tests and bench only; never in prod.

- `FaultInjectingModel`: wraps any `ModelClient` and injects seeded faults shaped exactly like
  Bedrock's: the exception a boto3 `bedrock-runtime` client raises, built by botocore's own error
  parser from the HTTP response Bedrock sends (modeled exception class, error code, HTTP status,
  headers; no Retry-After, because Bedrock sends none), so the retry and classification code cannot
  tell the difference. Latency is constant or a seeded lognormal; a call slower than the client's
  read timeout ends in botocore's `ReadTimeoutError`, as a real one would.
- `SharedTokenBucket`: a model quota shared by every worker process, like an account quota
  (requests per minute, or tokens per minute). Local only: a file lock cannot span Lambda instances.
- The simulated Bedrock (a stand-in, not Bedrock): `FaultInjectingModel` over the offline rule model
  with `FaultSpec.simulated_bedrock(...)`, counting as `bedrock_sim.py` says: a tokens-per-minute quota
  shared by every process (a call reserves all its input, cache reads included, + `maxTokens` when it
  starts and is settled to input + cache writes + 5 x output when it ends), daily token quotas, a
  requests-per-minute quota only when asked, a lognormal latency (median + p99), LLM-like answer lengths
  (cut at `maxTokens`), 429 `ThrottlingException`s with no Retry-After, 5xx bursts (every process fails
  together for `burst_duration_s` out of every `burst_every_s`, at a seeded phase) and seeded transient
  faults; when asked (each off by default): a latency from the call's tokens (time to first token + output
  at the model's speed, heavy-tailed; a read timeout keeps its reservation), capacity throttles below the
  quota in seeded busy slots, and the double's own tokenizer for every count.
- `CallLedger`: an append-only record of every model call (the offline stand-in for a provider's
  usage log); tests count model calls from it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.domain.model import CHARS_PER_TOKEN, ModelClient, ModelRequest, ModelResponse, quota_tokens
from contract_review.doubles.bedrock_sim import (
    DailyTokenLedger,
    answered_in,
    call_latency_s,
    counted_input_tokens,
    counted_prefix_tokens,
    counted_tokens,
    in_capacity_throttle,
    input_tokens,
    latency_tail,
    reserved_tokens,
)
from contract_review.doubles.spec import FaultSpec

# What Bedrock says when a quota is hit (HTTP 429 ThrottlingException, no Retry-After header).
REQUESTS_THROTTLE_MESSAGE = "Too many requests, please wait before trying again."  # requests-per-minute quota
TOKENS_THROTTLE_MESSAGE = "Too many tokens, please wait before trying again."  # tokens-per-minute quota
_STATUS = {"ThrottlingException": 429, "ModelNotReadyException": 429, "ServiceUnavailableException": 503,
           "InternalServerException": 500, "ModelTimeoutException": 408, "ValidationException": 400,
           "AccessDeniedException": 403, "ResourceNotFoundException": 404}
_MESSAGES = {"ServiceUnavailableException": "Bedrock is unable to process your request.",
             "InternalServerException": "The server encountered an internal error.",
             "ValidationException": "The provided model identifier is invalid.",
             "AccessDeniedException": "You don't have access to the model with the specified model ID.",
             "ResourceNotFoundException": "The specified model could not be found."}
# What Bedrock says when it rejects a request it cannot take (HTTP 400 ValidationException).
INVALID_REQUEST_MESSAGE = "Malformed input request, please reformat your input and try again."
_Z99 = NormalDist().inv_cdf(0.99)


@functools.cache
def _bedrock_runtime_errors() -> tuple[Any, Any, Any]:
    """bedrock-runtime's service model, its modeled exception classes and its response parser (once)."""
    import botocore.session
    from botocore.errorfactory import ClientExceptionsFactory
    from botocore.parsers import create_parser

    service = botocore.session.get_session().get_service_model("bedrock-runtime")
    return service, ClientExceptionsFactory().create_client_exceptions(service), create_parser(service.protocol)


def bedrock_error(code: str, message: str | None = None, status: int | None = None,
                  operation: str = "Converse") -> ClientError:
    """The exception a boto3 `bedrock-runtime` client raises when Bedrock answers `operation` with this
    error: the HTTP response Bedrock sends (JSON body `{"message": ...}`, `x-amzn-errortype`, no
    Retry-After) run through botocore's own parser, raised as the modeled class
    (`client.exceptions.ThrottlingException`, ...)."""
    service, exceptions, parser = _bedrock_runtime_errors()
    body = json.dumps({"message": message or _MESSAGES.get(code, code)}).encode()
    request_id = str(uuid.uuid4())
    http = {
        "status_code": status or _STATUS.get(code, 400),
        "headers": {"date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
                    "content-type": "application/json", "content-length": str(len(body)),
                    "connection": "keep-alive", "x-amzn-requestid": request_id,
                    "x-amzn-errortype": f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        "body": body,
    }
    parsed = parser.parse(http, service.operation_model(operation).output_shape)
    parsed["ResponseMetadata"]["RetryAttempts"] = 0
    error: ClientError = exceptions.from_code(code)(parsed, operation)
    return error


class SharedTokenBucket:
    """A model quota shared by every worker process (file + flock), like a real account quota.

    `rate_per_s` units (requests or tokens) refill per second, up to `capacity`: a per-minute quota
    can be used in a burst within its window, so capacity = rate x window (at least the cost of the
    call being made, so a single large call can always pass an idle quota)."""

    def __init__(self, state_dir: str, rate_per_s: float, name: str = "model-quota", capacity: float = 1.0):
        self.path = Path(state_dir) / f"{name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rate = rate_per_s
        self.capacity = capacity

    def take(self, cost: float = 1.0) -> bool:
        """Take `cost` units if the quota has them; False: over quota (Bedrock says when, never how long)."""
        return self._update(cost, force=False)

    def settle(self, refund: float) -> None:
        """Give back `refund` units (negative: take more, even into debt), e.g. a reservation settled to
        what the call really used."""
        self._update(-refund, force=True)

    def _update(self, cost: float, *, force: bool) -> bool:
        capacity = max(self.capacity, cost)
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            raw = fh.read()
            now = time.time()
            state = json.loads(raw) if raw else {"tokens": capacity, "at": now}
            tokens = min(capacity, state["tokens"] + (now - state["at"]) * self.rate)
            ok = force or tokens >= cost
            tokens = min(capacity, tokens - cost) if ok else tokens
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"tokens": tokens, "at": now}))
            return ok


def used_tokens(model_id: str, request: ModelRequest, response: ModelResponse) -> int:
    """What a finished call finally counts against a tokens-per-minute quota (bedrock_sim.quota_tokens): its
    uncached input + cache writes + output x the model's burndown; cache reads are released. A model that
    reports no usage is counted from the request (all input uncached)."""
    output = response.output_tokens or len(response.text) // CHARS_PER_TOKEN
    if response.input_tokens or response.cache_read_tokens or response.cache_write_tokens:
        return quota_tokens(model_id, response.input_tokens, response.cache_write_tokens, output)
    return quota_tokens(model_id, input_tokens(model_id, request), 0, output)


def in_burst(spec: FaultSpec, now: float) -> bool:
    """Whether `now` falls in one of the spec's 5xx bursts: `burst_duration_s` out of every
    `burst_every_s`, at a phase drawn from the seed, the same in every process (wall clock)."""
    if not (spec.burst_every_s and spec.burst_duration_s):
        return False
    phase = random.Random(spec.seed).uniform(0, spec.burst_every_s)
    return (now + phase) % spec.burst_every_s < spec.burst_duration_s


@dataclass
class FaultInjectingModel:
    """Seeded faults in Bedrock's shapes. Deterministic for a given seed and call sequence.

    `read_timeout_s` is the real client's read timeout (`Settings.model_call_timeout_s`): an injected
    latency beyond it ends, after that long, in `ReadTimeoutError`. `sleep` is injectable for tests.
    """

    inner: ModelClient
    spec: FaultSpec
    read_timeout_s: float | None = None
    sleep: Callable[[float], None] = time.sleep
    _seen: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def _active(self) -> bool:
        return self.spec.switch_file is None or os.path.exists(self.spec.switch_file)

    def _rngs(self, request: ModelRequest) -> tuple[random.Random, random.Random]:
        """Two independent streams per call: the fault roll, and the latency draw."""
        key = f"{request.chunk_id}|{request.analyst}|{request.step}|{request.prompt[-64:]}"
        with self._lock:
            n = self._seen.get(key, 0)
            self._seen[key] = n + 1
        digest = hashlib.sha256(f"{self.spec.seed}|{key}|{n}|{os.getpid()}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big")), random.Random(int.from_bytes(digest[8:16], "big"))

    def latency_s(self, rng: random.Random) -> float:
        spec = self.spec
        if spec.latency_median_ms:
            sigma = math.log(spec.latency_p99_ms / spec.latency_median_ms) / _Z99 if spec.latency_p99_ms else 0.0
            return spec.latency_median_ms * math.exp(sigma * rng.gauss(0.0, 1.0)) / 1000
        return spec.latency_ms / 1000

    def _input_tokens(self, request: ModelRequest) -> int:
        """All the call's input, as this double counts it (its tokenizer, when the spec asks for it)."""
        if self.spec.simulated_tokenizer:
            return counted_input_tokens(self.model_id, request)
        return input_tokens(self.model_id, request)

    def _reserved(self, request: ModelRequest) -> int:
        """What the call holds against the token quotas while it runs (bedrock_sim.reserved_tokens), counted."""
        if self.spec.simulated_tokenizer:
            return reserved_tokens(self.model_id, request) - input_tokens(self.model_id, request) \
                + counted_input_tokens(self.model_id, request)
        return reserved_tokens(self.model_id, request)

    def _counted(self, request: ModelRequest, response: ModelResponse) -> ModelResponse:
        """The answer's usage as the double's tokenizer counts it (when the spec asks): the same split between cache
        reads, cache writes and uncached input as the answer's, each part recounted, and the answer's text."""
        if not self.spec.simulated_tokenizer:
            return response
        prefix, rest = counted_prefix_tokens(self.model_id, request), counted_tokens(request.prompt)
        read = prefix if response.cache_read_tokens else 0
        written = prefix if response.cache_write_tokens and not read else 0
        uncached = rest if read or written else prefix + rest
        output = counted_tokens(response.text) if response.text else response.output_tokens
        return dataclasses.replace(response, input_tokens=uncached, cache_read_tokens=read, cache_write_tokens=written,
                                   output_tokens=output)

    def invoke(self, request: ModelRequest) -> ModelResponse:
        fault_rng, latency_rng = self._rngs(request)
        answer: ModelResponse | None = None
        tokens, daily = self._tokens_bucket(), self._daily_ledger()
        if self._active():
            roll = fault_rng.random()  # one roll: transient | malformed | refused | ok | permanent, at the spec's rates
            self._raise_injected(request, fault_rng, roll)
            answer = self._injected_answer(roll - self.spec.transient_rate)
        reserved = self._reserved(request) if self._active() else 0
        response: ModelResponse | None = None
        try:
            if self.spec.ttft_ms:
                response = self._timed_by_tokens(request, answer, latency_rng)
                return response
            delay = self.latency_s(latency_rng)
            if self.read_timeout_s is not None and delay > self.read_timeout_s:
                self.sleep(self.read_timeout_s)
                raise ReadTimeoutError(endpoint_url=f"https://bedrock-runtime.amazonaws.com/model/{self.model_id}/converse")
            with answered_in(delay):  # the prompt cache is looked up as the call starts, written as it answers
                answered = answer or self.inner.invoke(request)
            if delay > 0:
                self.sleep(delay)
            response = self._answer_length(request, self._counted(request, answered))
            return dataclasses.replace(response, latency_ms=response.latency_ms + delay * 1000)
        finally:  # settled: what the call used replaces what it reserved (cache reads released)
            used = self._used(request, response) if response else reserved
            if reserved and tokens is not None:
                tokens.settle(reserved - used)
            if reserved and daily is not None:
                daily.settle(self.model_id, reserved - used)

    def _timed_by_tokens(self, request: ModelRequest, answer: ModelResponse | None,
                         rng: random.Random) -> ModelResponse:
        """A call whose latency follows its tokens (`FaultSpec.ttft_ms`): its first token after a time growing with
        its input (all of it, cache reads included: stricter than Bedrock, where a cache read speeds the first
        token), then its answer's tokens at the output speed, both times one heavy-tailed factor. The prompt cache
        entry it writes is readable from its first token. A call slower than the client's read timeout ends, after
        that long, in `ReadTimeoutError`: Bedrock went on with it, so its reservation stays taken."""
        spec = self.spec
        tail = latency_tail(rng, spec.latency_tail_p99)
        timing = {"ttft_ms": spec.ttft_ms, "ttft_ms_per_1k_input": spec.ttft_ms_per_1k_input,
                  "output_tokens_per_s": spec.output_tokens_per_s, "tail": tail}
        n_in = self._input_tokens(request)
        first, _ = call_latency_s(n_in, 0, **timing)
        with answered_in(first):
            answered = answer or self.inner.invoke(request)
        counted = self._answer_length(request, self._counted(request, answered))
        _, delay = call_latency_s(n_in, counted.output_tokens, **timing)
        if self.read_timeout_s is not None and delay > self.read_timeout_s:
            self.sleep(self.read_timeout_s)
            raise ReadTimeoutError(endpoint_url=f"https://bedrock-runtime.amazonaws.com/model/{self.model_id}/converse")
        self.sleep(delay)
        return dataclasses.replace(counted, latency_ms=counted.latency_ms + delay * 1000)

    def _used(self, request: ModelRequest, response: ModelResponse) -> int:
        """What the finished call counts against the token quotas (`used_tokens`); an answer with no usage (an
        injected malformed one) is counted from the request, by this double's tokenizer when it has one."""
        if self.spec.simulated_tokenizer and not (response.input_tokens or response.cache_read_tokens
                                                  or response.cache_write_tokens):
            output = response.output_tokens or counted_tokens(response.text)
            return quota_tokens(self.model_id, counted_input_tokens(self.model_id, request), 0, output)
        return used_tokens(self.model_id, request, response)

    def _answer_length(self, request: ModelRequest, response: ModelResponse) -> ModelResponse:
        """An LLM-like answer length (the spec's lognormal): counted, not generated; one longer than `maxTokens` is
        cut there and stops on max_tokens, as Bedrock's would. Drawn per question (the seed, the chunk, the
        analyst, the step), not per process or attempt: the same question gets an answer of the same length
        however it is laid out or retried, so two runs side by side pay for the same answers."""
        spec = self.spec
        question = f"{spec.seed}|{request.chunk_id}|{request.analyst}|{request.step}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(question).digest()[:8], "big"))
        if not spec.answer_tokens_median or response.stop_reason != "end_turn":
            return response
        sigma = math.log(spec.answer_tokens_p99 / spec.answer_tokens_median) / _Z99 if spec.answer_tokens_p99 else 0.0
        drawn = max(response.output_tokens, int(spec.answer_tokens_median * math.exp(sigma * rng.gauss(0.0, 1.0))))
        if drawn > request.max_tokens:  # as Bedrock does: the answer is cut at maxTokens (and paid for)
            return dataclasses.replace(response, output_tokens=request.max_tokens, stop_reason="max_tokens")
        return dataclasses.replace(response, output_tokens=drawn)

    def _daily_ledger(self) -> DailyTokenLedger | None:
        spec = self.spec
        if not (spec.throttle_state_dir and (spec.daily_tokens_per_model or spec.daily_tokens_account)):
            return None
        return DailyTokenLedger(spec.throttle_state_dir, model_per_day=spec.daily_tokens_per_model,
                                account_per_day=spec.daily_tokens_account, day_s=spec.daily_window_s)

    def _requests_bucket(self) -> SharedTokenBucket | None:
        spec = self.spec
        if not (spec.throttle_state_dir and spec.throttle_quota_per_s):
            return None
        return SharedTokenBucket(spec.throttle_state_dir, spec.throttle_quota_per_s,
                                 capacity=spec.throttle_quota_per_s * spec.throttle_window_s)

    def _tokens_bucket(self) -> SharedTokenBucket | None:
        spec = self.spec
        if not (spec.throttle_state_dir and spec.throttle_tokens_per_s):
            return None
        return SharedTokenBucket(spec.throttle_state_dir, spec.throttle_tokens_per_s, name="model-tokens",
                                 capacity=spec.throttle_tokens_per_s * spec.throttle_window_s)

    def _raise_injected(self, request: ModelRequest, rng: random.Random, roll: float) -> None:
        """Errors, all raised at once (Bedrock rejects before generating): permanent, always-failing
        chunk, the shared quotas, then the seeded roll (transient at its bottom, permanent at its top,
        so a spec without `permanent_rate` rolls as before)."""
        spec = self.spec
        if spec.permanent_code:
            raise bedrock_error(spec.permanent_code)
        if spec.permanent_rate and roll >= 1.0 - spec.permanent_rate:
            raise bedrock_error("ValidationException", INVALID_REQUEST_MESSAGE)
        if spec.always_fail_chunk and spec.always_fail_chunk in (request.chunk_id, str(request.payload.get("chunk_index"))):
            raise bedrock_error("ServiceUnavailableException")
        self._take_quotas(request)
        try:
            self._raise_transient(rng, roll)
        except ReadTimeoutError:  # the client gave up; Bedrock went on with the call: its reservation stays taken
            raise
        except Exception:  # an error answered at once: the tokens it reserved are given back
            reserved = self._reserved(request)
            tokens, daily = self._tokens_bucket(), self._daily_ledger()
            if tokens is not None:
                tokens.settle(reserved)
            if daily is not None:
                daily.settle(self.model_id, reserved)
            raise

    def _raise_transient(self, rng: random.Random, roll: float) -> None:
        """A 5xx burst under way, or the seeded roll's transient faults."""
        spec = self.spec
        if in_capacity_throttle(spec.seed, spec.capacity_throttle_rate, spec.capacity_slot_s, time.time()):
            # the service is busy (below the quota); Bedrock's message for this is not documented: the requests one
            # names no token quota, so a pacer slows what it paces
            raise bedrock_error("ThrottlingException", REQUESTS_THROTTLE_MESSAGE)
        if in_burst(spec, time.time()):
            raise bedrock_error(rng.choice(("ServiceUnavailableException", "InternalServerException")))
        if roll < spec.transient_rate:
            kind = rng.randrange(3)
            if kind == 0:
                tokens = rng.random() < spec.token_throttle_share
                raise bedrock_error("ThrottlingException", TOKENS_THROTTLE_MESSAGE if tokens else REQUESTS_THROTTLE_MESSAGE)
            if kind == 1:
                raise bedrock_error("ServiceUnavailableException")
            if self.read_timeout_s is not None:  # a read timeout takes the client's read timeout to happen
                self.sleep(self.read_timeout_s)
            raise ReadTimeoutError(endpoint_url=f"https://bedrock-runtime.amazonaws.com/model/{self.model_id}/converse")

    def _take_quotas(self, request: ModelRequest) -> None:
        """The shared quotas at admission (requests, when simulated; tokens per minute; tokens per day): a call
        reserves all its input, cache reads included, plus maxTokens. Refused by one, it gives back what it took
        from the others. A daily quota's throttle looks like any other (Bedrock says neither which nor when)."""
        requests, tokens, daily = self._requests_bucket(), self._tokens_bucket(), self._daily_ledger()
        reserved = self._reserved(request)
        if requests is not None and not requests.take():
            raise bedrock_error("ThrottlingException", REQUESTS_THROTTLE_MESSAGE)
        if tokens is not None and not tokens.take(reserved):
            if requests is not None:
                requests.settle(1)
            raise bedrock_error("ThrottlingException", TOKENS_THROTTLE_MESSAGE)
        if daily is not None and not daily.take(self.model_id, reserved):
            if requests is not None:
                requests.settle(1)
            if tokens is not None:
                tokens.settle(reserved)
            raise bedrock_error("ThrottlingException", TOKENS_THROTTLE_MESSAGE)

    def _injected_answer(self, roll: float) -> ModelResponse | None:
        """A 200 that is still a failure to the analyst (malformed output, a refusal), or None."""
        if roll < 0:
            return None
        if roll < self.spec.malformed_rate:
            return ModelResponse(text='{"findings": [', stop_reason="malformed_model_output")
        if roll < self.spec.malformed_rate + self.spec.refusal_rate:
            return ModelResponse(text="", stop_reason="content_filtered")
        return None


class CallLedger:
    """Append-only record of every model call a process made (one JSON line each).

    The offline stand-in for a provider's usage log: tests count model calls, and the tokens of their answers
    (what a bill would charge), from it. A call under way when its process is killed is not in it.
    """

    def __init__(self, inner: ModelClient, path: str):
        self.inner = inner
        self.path = path

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        outcome = "ok"
        started_at = time.time()
        tokens: dict[str, int] = {}
        try:
            response = self.inner.invoke(request)
            tokens = {"input_tokens": response.input_tokens, "output_tokens": response.output_tokens,
                      "cache_read_tokens": response.cache_read_tokens, "cache_write_tokens": response.cache_write_tokens}
            return response
        except Exception as exc:  # recorded, then re-raised unchanged
            outcome = type(exc).__name__
            raise
        finally:
            line = json.dumps({"chunk_id": request.chunk_id, "analyst": request.analyst, "step": request.step,
                               "model_id": self.model_id,
                               "outcome": outcome, "pid": os.getpid(), "started_at": started_at, "at": time.time(),
                               **tokens})
            with open(self.path, "a") as fh:
                fh.write(line + "\n")
