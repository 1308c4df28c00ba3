"""The model port: what a use case sends a model and gets back (`ModelClient`), and what a model id
says about itself (a cross-region inference profile or a foundation model).

Implementations: `model/bedrock.py` (Amazon Bedrock Converse, the real one) and, offline,
`doubles/offline_model.py` (a rule-based stand-in, not an LLM) wrapped by `doubles/faults.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# Cross-region inference profile ids carry a geography prefix (us.anthropic..., eu.amazon...);
# `global.` profiles route to every commercial region.
INFERENCE_PROFILE_PREFIXES = ("us.", "eu.", "apac.", "us-gov.", "jp.", "au.", "ca.", "global.")


GLOBAL_PROFILE_PREFIX = "global."


def is_inference_profile(model_id: str) -> bool:
    return model_id.startswith(INFERENCE_PROFILE_PREFIXES)


def base_model_id(model_id: str) -> str:
    """The foundation model behind a cross-region inference profile id (the id itself otherwise)."""
    return model_id.split(".", 1)[1] if is_inference_profile(model_id) else model_id


@dataclass(frozen=True)
class ModelRequest:
    analyst: str
    step: str
    system: str  # the fixed instructions (the same for every chunk): sent as a cached prompt prefix
    prompt: str  # the rest of the rendered prompt (the excerpt): what a real model reads after the prefix
    payload: dict[str, Any]  # the same inputs, structured: what the offline rule model reads
    output_schema: dict[str, Any]
    chunk_id: str = ""
    max_tokens: int = 2048
    temperature: float = 0.0  # sampling: chosen by the analyst with max_tokens, part of its identity (analysts.py)


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
