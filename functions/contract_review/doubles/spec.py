"""What the local doubles do, as configuration (`FAULT_SPEC`; demo, tests and bench only, never prod)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from contract_review.domain.model import ModelClient


class FaultSpec(BaseModel):
    """Seeded fault injection for the offline model (demo and tests only; never in prod).

    Faults arrive in Bedrock's exact shapes (faults.py). Throttles are HTTP 429 ThrottlingException
    with no Retry-After header (Bedrock sends none), "Too many requests, ..." when a requests-per-minute
    quota is hit and "Too many tokens, ..." when a tokens-per-minute one is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 7
    transient_rate: float = 0.0  # split between throttle / 5xx / timeout
    token_throttle_share: float = 0.5  # of the injected throttles, the share that are tokens-per-minute ones
    malformed_rate: float = 0.0
    refusal_rate: float = 0.0
    permanent_code: str | None = None  # e.g. "AccessDeniedException": every call fails so
    # The share of calls answered with a permanent error (HTTP 400 ValidationException, "Malformed input
    # request": `model.request_invalid`, never retried): the chunk fails and its job ends `failed`.
    permanent_rate: float = 0.0
    always_fail_chunk: str | None = None  # chunk index (as str) or chunk id whose calls always 5xx
    # Quotas shared by every worker process (token buckets in throttle_state_dir, via a file lock):
    throttle_quota_per_s: float | None = None  # requests per second ("Too many requests")
    throttle_tokens_per_s: float | None = None  # tokens per second; a call reserves its input + maxTokens
    # The quotas' window: up to rate x window may be used in a burst (Bedrock's are per minute: 60 s;
    # tests scale time down). Without a Retry-After, a burst-free quota would starve every 2-call analyst.
    throttle_window_s: float = 1.0
    throttle_state_dir: str | None = None
    # Latency of every answered call (throttles are answered at once): a constant `latency_ms`, or a
    # seeded lognormal from its median and 99th percentile (p99 unset: constant at the median).
    latency_ms: int = 0
    latency_median_ms: float = 0.0
    latency_p99_ms: float | None = None
    # 5xx bursts: every process's calls fail with 503/500 for `burst_duration_s` out of every
    # `burst_every_s` seconds (wall clock, at a phase drawn from the seed), like a provider incident.
    burst_every_s: float = 0.0
    burst_duration_s: float = 0.0
    # Daily token quotas (Bedrock: per model, and one across models per account and region), counted in
    # throttle_state_dir per window of `daily_window_s` (a day; tests scale it down). None: not simulated.
    daily_tokens_per_model: float | None = None
    daily_tokens_account: float | None = None
    daily_window_s: float = 86400.0
    # The prompt cache's TTL; its minimum prefix is the model's (domain/model.py MODEL_TRAITS), the one the
    # adapter and the warm-up gate decide by. Shared by every process through throttle_state_dir when it is set.
    cache_ttl_s: float = 300.0
    # LLM-like answer lengths: a call's output tokens are at least a seeded lognormal draw from this median and
    # 99th percentile (capped at its maxTokens), so cost and quota figures are not flattered by the rule
    # model's short answers. Unset: the rule model's own answer length.
    answer_tokens_median: float | None = None
    answer_tokens_p99: float | None = None
    # The bench's own model wrapper, "module:function" (a ModelClient -> ModelClient importable where the processes
    # run, e.g. "bench.legacy_layout:old_layout": every request rewritten into the prompt layout before 2026-11-25),
    # applied around the fault-injecting model: the simulated Bedrock counts and caches what it sends. None: none.
    model_wrapper: str | None = None
    # --- Bedrock's physics, each off by default (doubles/bedrock_sim.py says where each rule comes from) ---------
    # Latency as a call takes it: time to first token (`ttft_ms` + `ttft_ms_per_1k_input` for each 1,000 input
    # tokens) + output tokens / `output_tokens_per_s`, times a seeded lognormal tail factor (median 1, 99th percentile
    # `latency_tail_p99`). `ttft_ms` 0: off (the latency fields above apply). AWS publishes no output speed or time to
    # first token per model: the three defaults below are ASSUMPTIONS, not measurements; a bench states the values it ran.
    ttft_ms: float = 0.0
    ttft_ms_per_1k_input: float = 20.0  # assumption: prefill time grows with the input
    output_tokens_per_s: float = 60.0  # assumption: a Claude Sonnet-class model's decode speed on demand
    latency_tail_p99: float = 3.0  # assumption: 1 call in 100 takes 3 x its typical time or more
    # Capacity throttles below the quota (Bedrock on demand throttles when the service is busy, whatever the account's
    # quota): wall time is cut into slots of `capacity_slot_s`; a slot is busy with probability `capacity_throttle_rate`
    # (seeded, the same in every process), and every call starting in a busy slot is answered 429 ThrottlingException
    # at once. Busy slots cluster as runs (bursts); 0: off. 5xx bursts and timeouts: `burst_*` and `transient_rate`.
    capacity_throttle_rate: float = 0.0
    capacity_slot_s: float = 2.0
    # The double's own tokenizer (bedrock_sim.counted_tokens) for every usage number it reports and every token it
    # takes from its quotas, instead of the pacer's four characters a token: False, the two agree by construction.
    simulated_tokenizer: bool = False
    switch_file: str | None = None  # faults apply only while this file exists (when set)
    # the strict simulated Bedrock (model provider `simulated`): the model ids listed in this file (one a line) are
    # revoked (access withdrawn, suspended): every call to them is answered 403 AccessDeniedException
    revoked_file: str | None = None
    call_log: str | None = None  # append one JSON line per model call (tests count calls)

    def wrap(self, model: ModelClient) -> ModelClient:
        """`model` inside the bench's wrapper (`model_wrapper`), or as it is when there is none."""
        if not self.model_wrapper:
            return model
        module, _, name = self.model_wrapper.partition(":")
        wrapper: Callable[[ModelClient], ModelClient] = getattr(importlib.import_module(module), name)
        return wrapper(model)

    @classmethod
    def simulated_bedrock(cls, state_dir: str, *, tokens_per_minute: float | None = None,
                          requests_per_minute: float | None = None, median_ms: float = 500.0,
                          p99_ms: float | None = None, window_s: float = 60.0, **faults: Any) -> FaultSpec:
        """The simulated Bedrock (a stand-in, not Bedrock; doubles/bedrock_sim.py): a tokens-per-minute quota
        shared by every process in `state_dir` (a requests-per-minute one only when asked: Bedrock no longer
        enforces one on bedrock-runtime), the account-wide prompt cache, a lognormal latency, and any other
        fault field (`transient_rate`, bursts, daily quotas, answer lengths, seed)."""
        return cls(throttle_state_dir=state_dir,
                   throttle_quota_per_s=requests_per_minute / 60 if requests_per_minute else None,
                   throttle_tokens_per_s=tokens_per_minute / 60 if tokens_per_minute else None,
                   throttle_window_s=window_s, latency_median_ms=median_ms, latency_p99_ms=p99_ms, **faults)

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        for name in ("transient_rate", "token_throttle_share", "malformed_rate", "refusal_rate", "permanent_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within 0..1")
        if self.transient_rate + self.malformed_rate + self.refusal_rate + self.permanent_rate > 1.0:
            raise ValueError("transient, malformed, refusal and permanent rates share one roll: their sum must be <= 1")
        if self.ttft_ms and (self.latency_ms or self.latency_median_ms):
            raise ValueError("give ttft_ms (latency from the call's tokens) or latency_ms / latency_median_ms, not both")
        if self.ttft_ms < 0 or self.ttft_ms_per_1k_input < 0 or self.output_tokens_per_s <= 0 or self.latency_tail_p99 < 1:
            raise ValueError("ttft_ms >= 0, ttft_ms_per_1k_input >= 0, output_tokens_per_s > 0, latency_tail_p99 >= 1")
        if not 0.0 <= self.capacity_throttle_rate < 1.0 or self.capacity_slot_s <= 0:
            raise ValueError("capacity_throttle_rate must be within 0..1 (exclusive of 1), capacity_slot_s > 0")
        if self.latency_ms and self.latency_median_ms:
            raise ValueError("give latency_ms (constant) or latency_median_ms (+ latency_p99_ms), not both")
        if self.latency_p99_ms is not None and not 0 < self.latency_median_ms <= self.latency_p99_ms:
            raise ValueError("latency_p99_ms needs 0 < latency_median_ms <= latency_p99_ms")
        if self.burst_duration_s and not 0 < self.burst_duration_s < self.burst_every_s:
            raise ValueError("5xx bursts need 0 < burst_duration_s < burst_every_s")
        if (self.throttle_quota_per_s or self.throttle_tokens_per_s or self.daily_tokens_per_model
                or self.daily_tokens_account) and not self.throttle_state_dir:
            raise ValueError("a shared throttle quota needs throttle_state_dir (where the workers share it)")
        if self.answer_tokens_p99 is not None and not 0 < (self.answer_tokens_median or 0) <= self.answer_tokens_p99:
            raise ValueError("answer_tokens_p99 needs 0 < answer_tokens_median <= answer_tokens_p99")
        return self

    def to_env(self) -> str:
        return self.model_dump_json(exclude_defaults=True)
