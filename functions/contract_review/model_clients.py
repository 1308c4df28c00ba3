"""Model clients behind one interface (`ModelClient`).

- `BedrockConverseModel`: Amazon Bedrock Converse via boto3 `bedrock-runtime` (the real one).
- `OfflineRuleModel` (in `offline_model.py`): a deterministic, rule-based stand-in that runs
  offline. It is not an LLM and says so in its name.
- Local doubles that wrap any client (fault injection, the call ledger) live in `faults.py`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRequest:
    analyst: str
    step: str
    system: str
    prompt: str  # the full rendered prompt: what a real model reads
    payload: dict[str, Any]  # the same inputs, structured: what the offline rule model reads
    output_schema: dict[str, Any]
    chunk_id: str = ""
    max_tokens: int = 2048


@dataclass(frozen=True)
class ModelResponse:
    text: str
    stop_reason: str  # end_turn | max_tokens | malformed_model_output | content_filtered | guardrail_intervened
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0


class ModelClient(Protocol):
    @property
    def model_id(self) -> str: ...

    def invoke(self, request: ModelRequest) -> ModelResponse: ...


class BedrockConverseModel:
    """Bedrock Converse with a tool-forced JSON answer.

    The client passed in must be configured so botocore does not multiply our retries:
    `Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=...)`; see
    `bedrock_client_config`.
    """

    TOOL_NAME = "record_answer"

    def __init__(self, client: Any, model_id: str, temperature: float = 0.0):
        self.client = client
        self.model_id = model_id
        self.temperature = temperature

    def invoke(self, request: ModelRequest) -> ModelResponse:
        started = time.monotonic()
        resp = self.client.converse(
            modelId=self.model_id,
            system=[{"text": request.system}],
            messages=[{"role": "user", "content": [{"text": request.prompt}]}],
            inferenceConfig={"maxTokens": request.max_tokens, "temperature": self.temperature},
            toolConfig={
                "tools": [{"toolSpec": {
                    "name": self.TOOL_NAME,
                    "description": "Record the structured answer.",
                    "inputSchema": {"json": request.output_schema},
                }}],
                "toolChoice": {"tool": {"name": self.TOOL_NAME}},
            },
        )
        stop = resp.get("stopReason", "end_turn")
        text = ""
        for block in resp.get("output", {}).get("message", {}).get("content", []):
            if "toolUse" in block:
                text = json.dumps(block["toolUse"].get("input", {}))
                break
            if "text" in block:
                text += block["text"]
        usage = resp.get("usage", {})
        return ModelResponse(
            text=text,
            stop_reason=stop,
            input_tokens=int(usage.get("inputTokens", 0)),
            output_tokens=int(usage.get("outputTokens", 0)),
            latency_ms=(time.monotonic() - started) * 1000,
        )


def bedrock_client_config(read_timeout_s: int) -> Any:
    from botocore.config import Config

    # total_max_attempts=1: botocore sends each call exactly once ("max_attempts" would mean one
    # *retry*); tier 1 (ours) owns retries, so the two tiers never multiply.
    return Config(read_timeout=read_timeout_s, connect_timeout=10,
                  retries={"mode": "standard", "total_max_attempts": 1})
