"""The simulated Bedrock's physics (a stand-in, not Bedrock): how a call is counted against the model's
quotas, what its prompt cache keeps, and what Bedrock adds to every call with tools. Local runs, tests
and the bench only; every figure measured against it is simulated.

What it follows, and where each rule comes from:
- Quotas (AWS, "Quotas for Amazon Bedrock" and "How tokens are counted" in the Bedrock user guide,
  https://docs.aws.amazon.com/bedrock/latest/userguide/quotas-token-burndown.html): a request is admitted
  against the tokens-per-minute quota by reserving all its input tokens (cache reads included) plus its
  `maxTokens`; when it ends, the reservation is settled to input + cache writes + output x the model's
  burndown rate (5 for current Claude models), and the cache reads are released (they count nothing).
  Bedrock no longer enforces a requests-per-minute quota on bedrock-runtime: the simulated one is optional
  and off by default. Daily token quotas exist per model ("Model invocation max tokens per day") and one
  across models per account and region ("Cross-Model Max Tokens Per Day").
- The prompt cache (AWS, "Prompt caching for faster model inference",
  https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html; Anthropic, "Prompt caching"):
  a prefix under the model's minimum is silently not cached (the minimum is always the model's, the one the
  adapter decides its cache point by: no test may make the cache kinder than that); a cached prefix lives 5 minutes, each read
  refreshing it; it is shared by every caller in the account (not per process); a changed tool definition
  or tool choice is a different prefix. Writes are priced 1.25 x input, reads 0.1 x (config/prices.py).
- Tools (Anthropic, "Tool use: pricing and tokens"): with tools, a tool-use system prompt is added to the
  input of every call (313 tokens for Claude 4 models with a forced tool choice).
The per-model numbers are the model catalogue's (config/catalogue.py), which the real client reads too.

Token counts are estimated at four characters a token (the offline model has no tokenizer).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from contract_review.domain.model import (
    ModelRequest,
    base_model_id,
    prefix_tokens,
    reserved_output,
    text_tokens,
    traits_for,
)

CACHE_TTL_S = 300.0  # Bedrock's default cache TTL: 5 minutes from the last use
# The model's facts (minimum cacheable prefix, output burndown, reservation, tool-use prompt) are its catalogue
# row's (config/catalogue.py): the same row the Bedrock client decides its cache point with.


def input_tokens(model_id: str, request: ModelRequest) -> int:
    """Every input token of a call, cached or not: what admission reserves (with `maxTokens`)."""
    return prefix_tokens(model_id, request) + text_tokens(request.prompt)


def reserved_tokens(model_id: str, request: ModelRequest) -> int:
    """What a call holds against a tokens-per-minute quota while it runs: all its input, cache reads
    included, plus `maxTokens` (x the burndown for a model whose row says Bedrock reserves it so)."""
    return input_tokens(model_id, request) + reserved_output(model_id, request.max_tokens)


@dataclass(frozen=True)
class CacheUse:
    read: int  # prefix tokens read from the cache
    written: int  # prefix tokens written to it
    uncached: int  # input tokens neither read nor written


_CALL = threading.local()


@contextlib.contextmanager
def answered_in(latency_s: float) -> Iterator[None]:
    """The call made inside takes `latency_s` to answer (the fault double's latency): a prefix it writes to the
    cache is readable only once it has answered, as on Bedrock; calls that start meanwhile miss it too."""
    _CALL.latency_s = latency_s
    try:
        yield
    finally:
        _CALL.latency_s = 0.0


class SimulatedPromptCache:
    """Bedrock's prompt cache, simulated: a prefix at or over the model's minimum is written by a call that misses
    it, readable once that call has answered (`answered_in`), and read by the calls that start within `ttl_s` of
    its last use (each read refreshes it); a call that starts before the write is readable misses and writes too
    (eleven calls at once: eleven writes). Under the minimum nothing is cached. The key is the model, the tool
    definition (and so the tool choice), the system prompt and the context.

    `state_dir`: shared by every process that names it (a file and a lock), as Bedrock's cache is shared by the
    account; None: one cache in this process. `min_tokens` overrides the model's minimum (tests)."""

    def __init__(self, state_dir: str | None = None, ttl_s: float = CACHE_TTL_S, min_tokens: int | None = None,
                 clock: Callable[[], float] = time.time):
        self.path = Path(state_dir) / "prompt-cache.json" if state_dir else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s, self.min_tokens, self.clock = ttl_s, min_tokens, clock
        self._memory: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def minimum(self, model_id: str) -> int:
        return self.min_tokens if self.min_tokens is not None else traits_for(model_id).min_cache_tokens

    def use(self, model_id: str, request: ModelRequest) -> CacheUse:
        """What one call reads, writes and leaves uncached, decided when it starts. The prefix is everything before
        the cache point (the tool-use prompt, the tool definition, the system prompt, the context)."""
        prefix = prefix_tokens(model_id, request)
        rest = text_tokens(request.prompt)
        if prefix < self.minimum(model_id):
            return CacheUse(0, 0, prefix + rest)
        key = hashlib.sha256(f"{base_model_id(model_id)}\0{json.dumps(request.output_schema, sort_keys=True)}\0"
                             f"{request.system}\0{request.context}".encode()).hexdigest()
        warm = self._touch(key, self.clock(), getattr(_CALL, "latency_s", 0.0))
        return CacheUse(prefix, 0, rest) if warm else CacheUse(0, prefix, rest)

    def _visit(self, state: dict[str, list[float]], key: str, now: float, latency_s: float) -> bool:
        """Whether the prefix is readable now ([last use, readable from]); records this call's use or write."""
        entry = state.get(key)
        warm = entry is not None and entry[1] <= now and now - entry[0] <= self.ttl_s
        if warm and entry is not None:
            entry[0] = now
        else:  # a miss writes: readable once this call has answered (or sooner, by a write already under way)
            pending = entry[1] if entry is not None and entry[1] > now else float("inf")
            state[key] = [now, min(pending, now + latency_s)]
        return warm

    def _touch(self, key: str, now: float, latency_s: float) -> bool:
        if self.path is None:
            with self._lock:
                return self._visit(self._memory, key, now, latency_s)
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            raw = fh.read()
            state: dict[str, list[float]] = json.loads(raw) if raw else {}
            state = {k: v for k, v in state.items() if now - v[0] <= self.ttl_s}  # expired prefixes are gone
            warm = self._visit(state, key, now, latency_s)
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(state))
            return warm


class DailyTokenLedger:
    """The daily token quotas, simulated: per model and one across models, counted in a file shared by every
    process (`state_dir`), per window of `day_s` seconds (a UTC day; tests scale it down). A call is refused
    when what it reserves would take either count over its quota."""

    def __init__(self, state_dir: str, *, model_per_day: float | None, account_per_day: float | None,
                 day_s: float = 86400.0, clock: Callable[[], float] = time.time):
        self.path = Path(state_dir) / "daily-tokens.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.model_per_day, self.account_per_day, self.day_s, self.clock = model_per_day, account_per_day, day_s, clock

    def take(self, model_id: str, tokens: int) -> bool:
        return self._update(model_id, tokens, force=False)

    def settle(self, model_id: str, refund: int) -> None:
        self._update(model_id, -refund, force=True)

    def _update(self, model_id: str, tokens: int, *, force: bool) -> bool:
        day = str(int(self.clock() // self.day_s))
        model = base_model_id(model_id)
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            raw = fh.read()
            state = json.loads(raw) if raw else {}
            counts: dict[str, int] = state.get(day, {})
            used_model, used_all = counts.get(model, 0) + tokens, counts.get("*", 0) + tokens
            ok = force or ((self.model_per_day is None or used_model <= self.model_per_day)
                           and (self.account_per_day is None or used_all <= self.account_per_day))
            if ok:
                counts[model], counts["*"] = used_model, used_all
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({day: counts}))
            return ok
