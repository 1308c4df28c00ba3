"""The model port: what a use case sends a model and gets back (`ModelClient`), and what a model id
says about itself (a cross-region inference profile or a foundation model).

Implementations: `model/bedrock.py` (Amazon Bedrock Converse, the real one) and, offline,
`doubles/offline_model.py` (a rule-based stand-in, not an LLM) wrapped by `doubles/faults.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from contract_review.config.prices import PRICES

# Cross-region inference profile ids carry a geography prefix (us.anthropic..., eu.amazon...);
# `global.` profiles route to every commercial region.
INFERENCE_PROFILE_PREFIXES = ("us.", "eu.", "apac.", "us-gov.", "jp.", "au.", "ca.", "global.")


GLOBAL_PROFILE_PREFIX = "global."


def is_inference_profile(model_id: str) -> bool:
    return model_id.startswith(INFERENCE_PROFILE_PREFIXES)


def base_model_id(model_id: str) -> str:
    """The foundation model behind a cross-region inference profile id (the id itself otherwise)."""
    return model_id.split(".", 1)[1] if is_inference_profile(model_id) else model_id


JsonSchema = dict[str, Any]  # a tool's input schema, as Converse sends it


@dataclass(frozen=True)
class ModelRequest:
    """One call. Its prompt is laid out for Bedrock's prompt cache: the tool definition (`output_schema`), the
    `system` instructions and the `context` (the excerpt) are the same for every call about one chunk, and
    come first, up to the cache point; the analyst's own `prompt` (its task, the located clauses) follows."""

    analyst: str
    step: str
    system: str  # the shared instructions (the same for every analyst and step of every chunk)
    prompt: str  # what follows the cache point: the analyst's task (and, to assess, the located clauses)
    payload: dict[str, Any]  # the same inputs, structured: what the offline rule model reads
    output_schema: JsonSchema  # the tool's input schema: one for every step, so one prefix per chunk
    chunk_id: str = ""
    max_tokens: int = 2048
    temperature: float = 0.0  # sampling: chosen by the analyst with max_tokens, part of its identity (analysts.py)
    context: str = ""  # the shared part of the user message, before the cache point (the excerpt)


# --- what Bedrock does with a request, per model --------------------------------------------------------------
CHARS_PER_TOKEN = 4  # the estimate used where no tokenizer is at hand (Claude's tokenizer is not public)


@dataclass(frozen=True)
class ModelTraits:
    """What Bedrock does with one model's requests (Anthropic and AWS documentation; docs/first-deploy.md says how
    to check them on an account)."""

    min_cache_tokens: int  # the shortest prefix the prompt cache keeps (a shorter one is silently not cached)
    output_burndown: int  # one output token counts this many against tokens per minute
    tool_prompt_tokens: int  # the tool-use system prompt Bedrock adds to a call with a forced tool choice
    # How the workers call it on bedrock-runtime: "converse" (Converse) or "messages" (InvokeModel with the
    # Anthropic Messages body: every Claude model answers it; Anthropic calls Converse its legacy Bedrock path
    # for newer models). model/bedrock.py has one client for each.
    api: str = "converse"
    forced_tool_choice: bool = True  # False: the model rejects a forced tool choice; it is asked to use the tool


# Claude Sonnet 4.6's minimum: Anthropic's table says 1,024, users observe 2,048 on Bedrock; until verified on the
# Bedrock prompt-caching page the strict value is used (a cache point on a shorter prefix costs nothing, it is
# only not cached).
MODEL_TRAITS: dict[str, ModelTraits] = {
    "anthropic.claude-sonnet-4-6": ModelTraits(min_cache_tokens=2048, output_burndown=5, tool_prompt_tokens=313),
    "anthropic.claude-sonnet-4-5-20250929-v1:0": ModelTraits(1024, 5, 313),
    "anthropic.claude-haiku-4-5-20251001-v1:0": ModelTraits(4096, 5, 313),
    # Claude Opus 4.6 through the Messages body (its minimum cacheable prefix not verified: the strictest known)
    "anthropic.claude-opus-4-6-v1": ModelTraits(4096, 5, 313, api="messages"),
}
# An unknown model gets the strictest traits of the table: never a cache or a quota kinder than a real one.
STRICTEST = ModelTraits(max(t.min_cache_tokens for t in MODEL_TRAITS.values()),
                        max(t.output_burndown for t in MODEL_TRAITS.values()),
                        max(t.tool_prompt_tokens for t in MODEL_TRAITS.values()))


def traits_for(model_id: str) -> ModelTraits:
    """The traits of a model id (an inference profile is its model; the offline model is simulated as the model
    it is priced as)."""
    base = base_model_id(model_id)
    return MODEL_TRAITS.get(PRICES.priced_as.get(base, base), STRICTEST)


def text_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def prefix_tokens(model_id: str, request: ModelRequest) -> int:
    """The estimated tokens before the cache point: Bedrock's tool-use system prompt, the tool definition, the
    system instructions and the shared context."""
    return (traits_for(model_id).tool_prompt_tokens + text_tokens(json.dumps(request.output_schema))
            + text_tokens(request.system) + text_tokens(request.context))


def quota_tokens(model_id: str, input_tokens: int, cache_write_tokens: int, output_tokens: int) -> int:
    """What a finished call counts against tokens per minute: input + cache writes + output x the model's burndown
    (cache reads are released)."""
    return input_tokens + cache_write_tokens + traits_for(model_id).output_burndown * output_tokens


def model_api(model_id: str) -> str:
    """converse | messages: which bedrock-runtime API the workers call `model_id` through (MODEL_TRAITS)."""
    return traits_for(model_id).api


def caches(model_id: str, request: ModelRequest) -> bool:
    """Whether a cache point is worth sending: the prefix reaches the model's minimum (estimated)."""
    return prefix_tokens(model_id, request) >= traits_for(model_id).min_cache_tokens


@dataclass(frozen=True)
class ModelResponse:
    text: str
    stop_reason: str  # end_turn | max_tokens | malformed_model_output | content_filtered | guardrail_intervened
    input_tokens: int = 0  # Converse usage.inputTokens: the input not read from or written to the prompt cache
    output_tokens: int = 0
    latency_ms: float = 0.0
    cache_read_tokens: int = 0  # usage.cacheReadInputTokens: the prefix read from the prompt cache
    cache_write_tokens: int = 0  # usage.cacheWriteInputTokens: the prefix written to it (the first call)


class ModelClient(Protocol):
    @property
    def model_id(self) -> str: ...

    def invoke(self, request: ModelRequest) -> ModelResponse: ...
