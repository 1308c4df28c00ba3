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

Token counts are estimated at four characters a token (the offline model has no tokenizer), as the pacer estimates
them, unless the spec asks for the double's own tokenizer (`FaultSpec.simulated_tokenizer`, `counted_tokens`): then
every usage number the double reports, and every token its quotas take, is counted by that tokenizer, which differs
from the estimate by an amount that depends on the text, in both directions, as a real tokenizer's count does.

Bedrock's physics beyond counting, each a `FaultSpec` option off by default (faults.py applies them):
- latency: time to first token, growing with the input, plus the answer's tokens at the model's output speed, with a
  seeded heavy tail (`call_latency_s`). AWS publishes neither figure per model: the spec's defaults are assumptions.
  A prefix written to the prompt cache is readable from the writing call's first token (Anthropic, "Prompt
  caching": a cache entry becomes available after the first response begins), not from its last.
- capacity throttles below the quota (`in_capacity_throttle`): Bedrock on demand answers 429 ThrottlingException
  when the service is busy, whatever the account's quota ("Quotas for Amazon Bedrock", on-demand throughput is
  not guaranteed); simulated as seeded busy time slots, shared by every process, so throttles come in bursts.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import random
import re
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


_PIECES = re.compile(r"(?P<word> ?[A-Za-z]+)|(?P<number>[0-9]+)|(?P<space>\s+)|(?P<other>[^\sA-Za-z0-9]{1,2})")
_SHORT_WORD = 7  # letters a word may have and still be one token


@functools.lru_cache(maxsize=512)
def counted_tokens(text: str) -> int:
    """The simulated Bedrock's own token count of `text`: deterministic, and not the pacer's four characters a token.

    A heuristic of how byte-pair tokenizers split text (Claude's tokenizer is not public; no figure here is Claude's):
    a word of up to seven letters, with the space before it, is one token, a longer one a token more for every four
    letters beyond; a number a token for every three digits; a run of whitespace not before a word one token; any
    other characters (punctuation, quotes, braces, non-ASCII) a token for each one or two in a row. So prose of short words counts fewer tokens
    than the estimate, and JSON, figures and punctuation more (tests/unit/doubles/test_bedrock_physics.py)."""
    n = 0
    for m in _PIECES.finditer(text):
        kind = m.lastgroup
        if kind == "word":
            letters = len(m.group().lstrip())
            n += 1 + max(0, math.ceil((letters - _SHORT_WORD) / 4))
        elif kind == "number":
            n += math.ceil(len(m.group()) / 3)
        else:
            n += 1
    return n


def counted_prefix_tokens(model_id: str, request: ModelRequest) -> int:
    """`prefix_tokens`, counted by the double's tokenizer: the tool-use prompt Bedrock adds (the catalogue's count),
    then the tool definition, the system prompt and the context."""
    return (traits_for(model_id).tool_prompt_tokens + counted_tokens(json.dumps(request.output_schema))
            + counted_tokens(request.system) + counted_tokens(request.context))


def counted_input_tokens(model_id: str, request: ModelRequest) -> int:
    """Every input token of a call, counted by the double's tokenizer (`input_tokens`, not estimated)."""
    return counted_prefix_tokens(model_id, request) + counted_tokens(request.prompt)


_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def latency_tail(rng: random.Random, p99: float) -> float:
    """A call's seeded slowness factor: lognormal, median 1, 99th percentile `p99` (1: none)."""
    return math.exp(math.log(p99) / _Z99 * rng.gauss(0.0, 1.0))


def call_latency_s(input_tokens: int, output_tokens: int, *, ttft_ms: float, ttft_ms_per_1k_input: float,
                   output_tokens_per_s: float, tail: float = 1.0) -> tuple[float, float]:
    """(time to first token, whole call) in seconds: `ttft_ms` + `ttft_ms_per_1k_input` per 1,000 input tokens, then
    the output at `output_tokens_per_s`; both times the call's `tail` factor (`latency_tail`): a slow call is slow
    throughout, as on a busy host."""
    first = (ttft_ms + ttft_ms_per_1k_input * input_tokens / 1000) / 1000 * tail
    return first, first + output_tokens / output_tokens_per_s * tail


def in_capacity_throttle(seed: int, rate: float, slot_s: float, now: float) -> bool:
    """Whether the service is busy at `now`: the time slot of `slot_s` seconds holding it is busy with probability
    `rate`, drawn from the seed and the slot's number (the same in every process). Every call that starts in a busy
    slot is throttled, so throttles come in bursts of at least `slot_s` (neighbouring busy slots join into longer
    ones), and over a long run about `rate` of the calls that start are throttled."""
    if rate <= 0:
        return False
    slot = math.floor(now / slot_s)
    digest = hashlib.sha256(f"capacity|{seed}|{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


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
