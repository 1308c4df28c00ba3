"""A strict stand-in for bedrock-runtime (a simulation, not Bedrock): Converse and InvokeModel with the Anthropic
Messages body, as the real clients (model/bedrock.py) call them.

Each request is checked against the model's catalogue row (config/catalogue.py) before it is answered: a request the
real model rejects fails here as it does there, with HTTP 400 `ValidationException`:
- a forced tool choice (`toolChoice.tool`/`any`; `tool_choice` `tool`/`any`) to a model that rejects one;
- a sampling parameter (`temperature`, `topP`/`top_p`, `top_k`) to a model that rejects them;
- a manual thinking budget to a model that takes only adaptive thinking; disabled thinking to one that always thinks;
- a Messages body whose `anthropic_version` is not the model's; a Converse call to a model the catalogue sends
  through the Messages body only;
- an uncatalogued model id (`STRICTEST`: nothing is known that would let it through).
A model made unavailable (`revoked`: its access revoked, suspended, retired) answers every request with HTTP 403
`AccessDeniedException`, as Bedrock answers a model this account may no longer invoke.
The others are answered by the offline rule model (doubles/offline_model.py), which reads the port's request: the
client this module hands out (`StrictBedrock.client`) passes it alongside the body it built, so every body the
real client builds is checked, and the answer goes back through the real client's response parsing.
"""

from __future__ import annotations

import json
import threading
from io import BytesIO
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from contract_review.config.catalogue import ModelRow, row_for
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse
from contract_review.model.bedrock import TOOL_NAME, BedrockModel, bedrock_model

_FORCED = ("tool", "any")


class RevokedFile:
    """The model ids revoked, as listed in a file (one a line), read at each call: every process of a local stack sees
    a model revoked from the moment it is written there (FaultSpec.revoked_file)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def __contains__(self, model_id: object) -> bool:
        try:
            return model_id in self.path.read_text().split()
        except FileNotFoundError:
            return False

    def add(self, model_id: str) -> None:
        with self.path.open("a") as f:
            f.write(model_id + "\n")
Body = dict[str, Any]  # a request or response body, as boto3 passes it


def rejection(row: ModelRow, api: str, body: Body) -> str | None:
    """Why the model of `row` answers this request body with a 400 (None: it takes it). `api`: converse | messages."""
    if not row.model_id:
        return "the model id is not one this stand-in knows (no catalogue row)"
    if api == "converse":
        if row.api == "messages" and "api" in row.unverified:
            return f"{row.name} is served through the Messages API here (Converse support unconfirmed)"
        choice = (body.get("toolConfig") or {}).get("toolChoice") or {}
        sampling = set(body.get("inferenceConfig") or {}) & {"temperature", "topP"}
        extra = body.get("additionalModelRequestFields") or {}
        thinking = extra.get("thinking") or {}
        sampling |= set(extra) & {"top_k"}
        forced = any(k in choice for k in _FORCED)
    else:
        if body.get("anthropic_version") != row.anthropic_version:
            return f"anthropic_version {body.get('anthropic_version')!r}: {row.name} takes {row.anthropic_version!r}"
        sampling = set(body) & {"temperature", "top_p", "top_k"}
        thinking = body.get("thinking") or {}
        forced = (body.get("tool_choice") or {}).get("type") in _FORCED
    if forced and not row.forced_tool_choice:
        return f"{row.name} does not support a forced tool choice: use auto"
    if sampling and not row.sampling:
        return f"{row.name} does not support {', '.join(sorted(sampling))}"
    if thinking.get("type") == "enabled" and row.thinking != "manual":
        return f"{row.name} takes adaptive thinking only (no thinking budget)"
    if thinking.get("type") == "disabled" and row.thinking == "always":
        return f"{row.name} always thinks: thinking cannot be disabled"
    return None


def _refused(operation: str, reason: str, code: str = "ValidationException", status: int = 400) -> ClientError:
    """Bedrock's answer to a request the model rejects: HTTP 400, ValidationException (or `code`, `status`)."""
    return ClientError({"Error": {"Code": code, "Message": reason},
                        "ResponseMetadata": {"RequestId": "strict-stand-in", "HostId": "", "HTTPStatusCode": status,
                                             "HTTPHeaders": {}, "RetryAttempts": 0}}, operation)


class StrictBedrock:
    """bedrock-runtime's two operations, strict about each model's request rules, answering with `answer` (the offline
    rule model). `refused` counts the requests refused (by reason), `answered` those answered (`answered_by`: per
    model id). A model id in `revoked` is one this account may no longer invoke (HTTP 403)."""

    def __init__(self, answer: ModelClient, revoked: set[str] | RevokedFile | None = None):
        self.answer = answer
        self.refused: list[str] = []
        self.answered = 0
        self.answered_by: dict[str, int] = {}
        self.revoked: set[str] | RevokedFile = revoked if revoked is not None else set()
        self._request = threading.local()

    def client(self, model_id: str) -> ModelClient:
        """The real Bedrock client for `model_id` (its catalogue row's API) on this stand-in."""
        return _Passing(self, bedrock_model(self, model_id))

    # --- the boto3 bedrock-runtime client's shape -------------------------------------------------------------
    def converse(self, *, modelId: str, **body: Any) -> Body:  # noqa: N803 (boto3's parameter name)
        response = self._answered(modelId, "converse", "Converse", body)
        block = {"toolUse": {"toolUseId": "t1", "name": TOOL_NAME, "input": json.loads(response.text)}}
        return {"output": {"message": {"role": "assistant", "content": [block]}}, "stopReason": "tool_use",
                "usage": {"inputTokens": response.input_tokens, "outputTokens": response.output_tokens,
                          "cacheReadInputTokens": response.cache_read_tokens,
                          "cacheWriteInputTokens": response.cache_write_tokens}}

    def invoke_model(self, *, modelId: str, body: str, **_: Any) -> Body:  # noqa: N803
        response = self._answered(modelId, "messages", "InvokeModel", json.loads(body))
        raw = json.dumps({"type": "message", "role": "assistant", "stop_reason": "tool_use",
                          "content": [{"type": "tool_use", "id": "t1", "name": TOOL_NAME,
                                       "input": json.loads(response.text)}],
                          "usage": {"input_tokens": response.input_tokens, "output_tokens": response.output_tokens,
                                    "cache_read_input_tokens": response.cache_read_tokens,
                                    "cache_creation_input_tokens": response.cache_write_tokens}}).encode()
        return {"body": StreamingBody(BytesIO(raw), len(raw)), "contentType": "application/json"}

    def _answered(self, model_id: str, api: str, operation: str, body: Body) -> ModelResponse:
        if model_id in self.revoked:
            self.refused.append(f"{model_id}: access revoked")
            raise _refused(operation, "You don't have access to the model with the specified model ID.",
                           "AccessDeniedException", 403)
        reason = rejection(row_for(model_id), api, body)
        if reason is not None:
            self.refused.append(reason)
            raise _refused(operation, reason)
        request: ModelRequest = self._request.current
        self.answered += 1
        self.answered_by[model_id] = self.answered_by.get(model_id, 0) + 1
        return self.answer.invoke(request)


class _Passing:
    """The real client, with the port's request passed to the stand-in beside the body it builds from it."""

    def __init__(self, runtime: StrictBedrock, real: BedrockModel):
        self.runtime, self.real = runtime, real

    @property
    def model_id(self) -> str:
        return self.real.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.runtime._request.current = request
        try:
            return self.real.invoke(request)
        finally:
            self.runtime._request.current = None
