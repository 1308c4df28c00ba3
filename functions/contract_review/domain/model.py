"""The model port: what a use case sends a model and gets back (`ModelClient`), and what a model id
says about itself (a cross-region inference profile or a foundation model).

Implementations: `model/bedrock.py` (Amazon Bedrock Converse, the real one) and, offline,
`doubles/offline_model.py` (a rule-based stand-in, not an LLM) wrapped by `doubles/faults.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from contract_review.config.catalogue import GLOBAL_PROFILE_PREFIX as GLOBAL_PROFILE_PREFIX
from contract_review.config.catalogue import INFERENCE_PROFILE_PREFIXES as INFERENCE_PROFILE_PREFIXES
from contract_review.config.catalogue import ModelRow, row_for
from contract_review.config.catalogue import base_model_id as base_model_id
from contract_review.config.catalogue import is_inference_profile as is_inference_profile

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


# --- what Bedrock does with a request, per model (the model catalogue: config/catalogue.py) ---------------------
CHARS_PER_TOKEN = 4  # the estimate used where no tokenizer is at hand (Claude's tokenizer is not public)


def traits_for(model_id: str) -> ModelRow:
    """The catalogue row of a model id (an inference profile is its model; the offline model is simulated as the
    model it is priced as; an uncatalogued id gets the strictest known values)."""
    return row_for(model_id)


def text_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def prefix_tokens(model_id: str, request: ModelRequest) -> int:
    """The estimated tokens before the cache point: Bedrock's tool-use system prompt, the tool definition, the
    system instructions and the shared context."""
    return (traits_for(model_id).tool_prompt_tokens + text_tokens(json.dumps(request.output_schema))
            + text_tokens(request.system) + text_tokens(request.context))


def reserved_output(model_id: str, max_tokens: int) -> int:
    """What a call's `maxTokens` holds against tokens per minute while it runs: x 1, or x the model's burndown where
    its catalogue row says Bedrock reserves it so (`reserve_at_burndown`; the strictest known where unverified)."""
    row = traits_for(model_id)
    return max_tokens * (row.output_burndown if row.reserve_at_burndown else 1)


def quota_tokens(model_id: str, input_tokens: int, cache_write_tokens: int, output_tokens: int) -> int:
    """What a finished call counts against tokens per minute: input + cache writes + output x the model's burndown
    (cache reads are released)."""
    return input_tokens + cache_write_tokens + traits_for(model_id).output_burndown * output_tokens


def model_api(model_id: str) -> str:
    """converse | messages: which bedrock-runtime API the workers call `model_id` through (its catalogue row)."""
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
