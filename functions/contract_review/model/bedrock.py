"""The Bedrock side of the model port (`domain/model.py`).

- `BedrockConverseModel`: Amazon Bedrock Converse via boto3 `bedrock-runtime` (the real one).
- `BedrockMessagesModel`: InvokeModel with the Anthropic Messages body, for the models the catalogue
  (`config/catalogue.py`, `api`) sends that way; `bedrock_model` picks one per model id. Both build each body by
  the model's catalogue row: its tool choice, its sampling parameters, its `anthropic_version`.
- `ModelIdCheck`: asks the Bedrock control plane whether the configured model id is why a call
  failed (unknown, retired, or not invocable by that id), so a bad id fails the job at once.
- The port itself (`ModelClient`, `ModelRequest`, `ModelResponse`) and the model-id helpers are
  `domain/model.py`; the offline stand-in and the fault doubles are in `doubles/`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from botocore.exceptions import BotoCoreError, ClientError

from contract_review.config.catalogue import ModelRow
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import (
    ModelRequest,
    ModelResponse,
    base_model_id,
    caches,
    is_inference_profile,
    model_api,
    traits_for,
)

log = logging.getLogger(__name__)


# --- is the model id the problem? (Bedrock control plane) -------------------------------------------------

# Converse errors whose cause may be the model id itself: Bedrock answers an unknown or retired id
# with ValidationException (400), the same shape as any other bad request, and an id it does not
# serve to this account with ResourceNotFoundException / AccessDeniedException. The text is never
# read: the control plane is asked instead.
ID_SUSPECT_CODES = frozenset({"ValidationException", "ResourceNotFoundException", "AccessDeniedException"})
_ID_UNKNOWN_CODES = frozenset({"ResourceNotFoundException", "ValidationException"})  # control plane: no such id


@dataclass(frozen=True)
class ModelFacts:
    """What the Bedrock control plane says about one model id, in this account and region."""

    model_id: str
    base_model_id: str  # the foundation model (behind the profile, for a profile id)
    rejection: str | None  # why Bedrock will not serve this id; None: the id names a current model
    display_name: str = ""  # provider + model name, e.g. "Anthropic Claude Sonnet 4.6"
    lifecycle: str = ""  # GetFoundationModel's modelLifecycle.status: ACTIVE | LEGACY (EOL: not found)


def _error_response(exc: ClientError) -> dict[str, Any]:
    return cast(dict[str, Any], exc.response)


def _error_code(exc: ClientError) -> str:
    return str((_error_response(exc).get("Error") or {}).get("Code", ""))


def describe_model(bedrock: Any, model_id: str) -> ModelFacts:
    """Ask the Bedrock control plane (`bedrock` client) about `model_id`: a foundation-model id or a
    cross-region inference profile id. Decides from structured fields only: a not-found answer, the
    profile's `status`, the model's `modelLifecycle.status` and `inferenceTypesSupported`.

    Raises `ClientError` / `BotoCoreError` when the control plane cannot answer (no permission,
    throttled, unreachable): then nothing is known about the id.
    """
    profile = is_inference_profile(model_id)
    base = base_model_id(model_id)
    if profile:
        try:
            answer = bedrock.get_inference_profile(inferenceProfileIdentifier=model_id)
        except ClientError as exc:
            if _error_code(exc) not in _ID_UNKNOWN_CODES:
                raise
            return ModelFacts(model_id, base, f"there is no inference profile {model_id!r} in this region "
                                              f"(GetInferenceProfile: {_error_code(exc)})")
        if answer.get("status") != "ACTIVE":
            return ModelFacts(model_id, base, f"inference profile {model_id!r} is {answer.get('status')}, not ACTIVE")
    try:
        details = bedrock.get_foundation_model(modelIdentifier=base)["modelDetails"]
    except ClientError as exc:
        if _error_code(exc) not in _ID_UNKNOWN_CODES:
            raise
        if profile:  # the profile is active; its model may just not be listed in this (source) region
            return ModelFacts(model_id, base, None)
        return ModelFacts(model_id, base, f"there is no foundation model {base!r} in this region "
                                          f"(GetFoundationModel: {_error_code(exc)})")
    lifecycle = str((details.get("modelLifecycle") or {}).get("status", ""))
    name = " ".join(str(details[k]) for k in ("providerName", "modelName") if details.get(k))
    rejection: str | None = None
    if lifecycle != "ACTIVE":
        rejection = f"model {base!r} is {lifecycle or 'not ACTIVE'} on Bedrock (being retired or retired)"
    elif not profile and "ON_DEMAND" not in details.get("inferenceTypesSupported", ["ON_DEMAND"]):
        rejection = (f"model {base!r} cannot be invoked on demand by its own id; use a cross-region inference "
                     f"profile id such as 'us.{base}' or 'global.{base}'")
    return ModelFacts(model_id, base, rejection, name, lifecycle)


class ModelIdCheck:
    """Whether the configured model id is why a Converse call failed, from the Bedrock control plane.

    `connect` builds the `bedrock` (control plane) client on first use: most processes never need
    it. A definite answer is cached per model id for the life of the process; when the control
    plane cannot answer, nothing is cached and the original error stands.
    """

    def __init__(self, connect: Callable[[], Any]):
        self._connect = connect
        self._client: Any = None
        self._answers: dict[str, ModelFacts] = {}
        self._lock = threading.Lock()

    def facts(self, model_id: str) -> ModelFacts | None:
        with self._lock:
            if model_id not in self._answers:
                try:
                    if self._client is None:
                        self._client = self._connect()
                    self._answers[model_id] = describe_model(self._client, model_id)
                except (ClientError, BotoCoreError) as exc:
                    log.warning("cannot ask Bedrock about model id %s: %s", model_id, type(exc).__name__)
                    return None
            return self._answers[model_id]

    def rejection(self, model_id: str) -> str | None:
        facts = self.facts(model_id)
        return facts.rejection if facts is not None else None


def id_rejected(model_id: str, reason: str, exc: ClientError) -> ReviewError:
    status = (_error_response(exc).get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return ReviewError.of(
        "model.id_rejected",
        f"Bedrock will not serve model id {model_id!r}: {reason}. Pick a current model or inference profile "
        f"id (`review preflight --model-id ID` checks one), redeploy with `cdk deploy -c model_id=ID`, and "
        f"enable access to it in the Bedrock console.",
        http_status=int(status) if status is not None else None, provider_code=_error_code(exc) or None,
    )


# --- bedrock-runtime: Converse, and InvokeModel with the Anthropic Messages body ------------------------------

TOOL_NAME = "record_answer"  # the one tool every structured answer is given through
TOOL_DESCRIPTION = "Record the structured answer."
ASK_FOR_THE_TOOL = "Answer only by calling the record_answer tool."  # to a model that rejects a forced tool choice


class _BedrockRuntimeModel:
    """What both clients share: the model id, the id check on a failed call, the tool the answer comes through.

    The client passed in must be configured so botocore does not multiply our retries:
    `Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=...)`; see
    `bedrock_client_config`. With an `id_check`, a call that fails in a way the model id may cause
    (ID_SUSPECT_CODES) raises `model.id_rejected` (job-fatal) when the control plane confirms the
    id is the problem; otherwise the provider's error escapes unchanged.
    """

    TOOL_NAME = TOOL_NAME
    TOOL_DESCRIPTION = TOOL_DESCRIPTION
    API = ""  # what `review preflight` says the calls go through

    def __init__(self, client: Any, model_id: str, id_check: ModelIdCheck | None = None, invoke_id: str = ""):
        self.client = client
        self.model_id = model_id  # the configured id: its API, traits and prices; what the id check asks about
        self.invoke_id = invoke_id or model_id  # what is sent as `modelId`: the stack's application profile's ARN
        self.id_check = id_check

    def _send(self, operation: str, **params: Any) -> Any:
        try:
            return getattr(self.client, operation)(modelId=self.invoke_id, **params)
        except ClientError as exc:
            if self.id_check is not None and _error_code(exc) in ID_SUSPECT_CODES:
                reason = self.id_check.rejection(self.model_id)
                if reason is not None:
                    raise id_rejected(self.model_id, reason, exc) from exc
            raise


def sampling(row: ModelRow, temperature: float) -> dict[str, float]:
    """The sampling parameters a body carries: the analyst's temperature, or none for a model that rejects them
    (its catalogue row's `sampling`)."""
    return {"temperature": temperature} if row.sampling else {}


def tool_instruction(system: str, row: ModelRow) -> str:
    """The system prompt: as it is for a model that takes a forced tool choice; with an instruction to answer
    through the tool for one that rejects it (its catalogue row's `forced_tool_choice`)."""
    return system if row.forced_tool_choice else f"{system}\n\n{ASK_FOR_THE_TOOL}"


def converse_body(request: ModelRequest, row: ModelRow, *, cache_point: bool) -> dict[str, Any]:
    """The Converse request body (without `modelId`) for the model of catalogue row `row`: what
    `BedrockConverseModel.invoke` sends, and the `modelInput` of a batch inference record of invocation type Converse
    (docs/batch-inference.md), which reads no prompt cache.

    The user message: the shared context (the excerpt), the cache point, then the analyst's part. Prompt caching:
    everything before the cache point (the tool definition and choice, the system prompt, the context: the same for
    every call about one chunk) is a prefix Bedrock caches; `usage` then reports cacheWrite/cacheReadInputTokens. A
    prefix under the model's minimum is not cached (its catalogue row): no cache point is sent then. The tool is
    forced where the model takes a forced tool choice, else offered (`auto`) and asked for; no sampling parameter
    is sent to a model that rejects them."""
    content: list[dict[str, Any]] = [{"text": request.context}] if request.context else []
    if cache_point:
        content.append({"cachePoint": {"type": "default"}})
    return {
        "system": [{"text": tool_instruction(request.system, row)}],
        "messages": [{"role": "user", "content": [*content, {"text": request.prompt}]}],
        "inferenceConfig": {"maxTokens": request.max_tokens, **sampling(row, request.temperature)},
        "toolConfig": {
            "tools": [{"toolSpec": {
                "name": TOOL_NAME,
                "description": TOOL_DESCRIPTION,
                "inputSchema": {"json": request.output_schema},
            }}],
            "toolChoice": {"tool": {"name": TOOL_NAME}} if row.forced_tool_choice else {"auto": {}},
        },
    }


def converse_response(resp: Any, started: float | None = None, *, tool_expected: bool = True) -> ModelResponse:
    """A Converse response body as the port's answer (on demand, or a batch record's `modelOutput`). Prose where
    the tool was asked for (a model that is offered the tool, not forced to it) is `malformed_model_output`: asked
    again once, as any invalid answer."""
    stop = resp.get("stopReason", "end_turn")
    text, used_tool = "", False
    for block in resp.get("output", {}).get("message", {}).get("content", []):
        if "toolUse" in block:
            text, used_tool = json.dumps(block["toolUse"].get("input", {})), True
            break
        if "text" in block:
            text += block["text"]
    if tool_expected and not used_tool and stop in ("end_turn", "tool_use"):
        stop = "malformed_model_output"
    usage = resp.get("usage", {})
    return ModelResponse(
        text=text,
        stop_reason=stop,
        input_tokens=int(usage.get("inputTokens", 0)),
        output_tokens=int(usage.get("outputTokens", 0)),
        latency_ms=(time.monotonic() - started) * 1000 if started is not None else 0.0,
        cache_read_tokens=int(usage.get("cacheReadInputTokens", 0)),
        cache_write_tokens=int(usage.get("cacheWriteInputTokens", 0)),
    )


class BedrockConverseModel(_BedrockRuntimeModel):
    """Bedrock Converse with a tool-forced JSON answer."""

    API = "Converse"

    def invoke(self, request: ModelRequest) -> ModelResponse:
        started = time.monotonic()
        resp = self._send("converse", **self.converse_request(request))
        return converse_response(resp, started)

    def converse_request(self, request: ModelRequest) -> dict[str, Any]:
        """The Converse request body (without modelId) `invoke` sends."""
        return converse_body(request, traits_for(self.model_id), cache_point=caches(self.model_id, request))

    def ping(self) -> ModelResponse:
        """One tiny call (no tools, at most 8 output tokens): does the model answer this account?"""
        started = time.monotonic()
        resp = self._send("converse", messages=[{"role": "user", "content": [{"text": "Reply with the single word OK."}]}],
                          inferenceConfig={"maxTokens": 8, **sampling(traits_for(self.model_id), 0.0)})
        return converse_response(resp, started, tool_expected=False)


# The Messages API's stop reasons as the port names them (Converse's): a tool answer ends the turn; a refusal
# is a policy stop like Converse's content_filtered.
_STOP_REASONS = {"tool_use": "end_turn", "end_turn": "end_turn", "stop_sequence": "end_turn",
                 "max_tokens": "max_tokens", "refusal": "content_filtered"}


class BedrockMessagesModel(_BedrockRuntimeModel):
    """InvokeModel with the Anthropic Messages body (https://docs.aws.amazon.com/bedrock/latest/userguide/
    model-parameters-anthropic-claude-messages-request-response.html): the same prompt layout as Converse (the
    tool, the system prompt and the excerpt, then `cache_control` on the last block of the shared prefix, then
    the analyst's part) and the same answer through one tool. A model that rejects a forced tool choice
    (its catalogue row's `forced_tool_choice` False) gets `auto` and an instruction to use the tool; an answer in
    prose is then `malformed_model_output` (asked again once, as any invalid answer). The body's `anthropic_version`
    and its sampling parameters are the row's."""

    API = "Messages API (InvokeModel)"

    def invoke(self, request: ModelRequest) -> ModelResponse:
        started = time.monotonic()
        row = traits_for(self.model_id)
        forced = row.forced_tool_choice
        system_block: dict[str, Any] = {"type": "text", "text": tool_instruction(request.system, row)}
        content: list[dict[str, Any]] = [{"type": "text", "text": request.context}] if request.context else []
        if caches(self.model_id, request):  # the cache breakpoint: on the last block of the shared prefix
            (content[-1] if content else system_block)["cache_control"] = {"type": "ephemeral"}
        body = {
            "anthropic_version": row.anthropic_version,
            "max_tokens": request.max_tokens,
            **sampling(row, request.temperature),
            "system": [system_block],
            "messages": [{"role": "user", "content": [*content, {"type": "text", "text": request.prompt}]}],
            "tools": [{"name": self.TOOL_NAME, "description": self.TOOL_DESCRIPTION,
                       "input_schema": request.output_schema}],
            "tool_choice": {"type": "tool", "name": self.TOOL_NAME} if forced else {"type": "auto"},
        }
        return self._response(self._invoke(body), started, tool_expected=True)

    def ping(self) -> ModelResponse:
        """One tiny call (no tools, at most 8 output tokens): does the model answer this account?"""
        started = time.monotonic()
        row = traits_for(self.model_id)
        body = {"anthropic_version": row.anthropic_version, "max_tokens": 8, **sampling(row, 0.0),
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Reply with the single word OK."}]}]}
        return self._response(self._invoke(body), started, tool_expected=False)

    def _invoke(self, body: dict[str, Any]) -> Any:
        resp = self._send("invoke_model", body=json.dumps(body), contentType="application/json",
                          accept="application/json")
        return json.loads(resp["body"].read())

    @staticmethod
    def _response(answer: Any, started: float, *, tool_expected: bool) -> ModelResponse:
        stop = _STOP_REASONS.get(str(answer.get("stop_reason", "end_turn")), str(answer.get("stop_reason")))
        text, used_tool = "", False
        for block in answer.get("content", []):
            if block.get("type") == "tool_use":
                text, used_tool = json.dumps(block.get("input", {})), True
                break
            if block.get("type") == "text":
                text += block.get("text", "")
        if tool_expected and not used_tool and stop == "end_turn":
            stop = "malformed_model_output"  # prose where the tool was asked for
        usage = answer.get("usage", {})
        return ModelResponse(
            text=text,
            stop_reason=stop,
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            latency_ms=(time.monotonic() - started) * 1000,
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
        )


BedrockModel = BedrockConverseModel | BedrockMessagesModel


def bedrock_model(client: Any, model_id: str, id_check: ModelIdCheck | None = None,
                  invoke_id: str = "") -> BedrockModel:
    """The client for `model_id`'s API (its catalogue row's `api`), sending `invoke_id` (the stack's application inference
    profile: infra/inference.py) as the `modelId` when given, else `model_id`."""
    cls = BedrockMessagesModel if model_api(model_id) == "messages" else BedrockConverseModel
    return cls(client, model_id, id_check=id_check, invoke_id=invoke_id)


POOL_MARGIN = 2  # connections beyond the calls made at once (a probe, a control-plane look-up)


def bedrock_client_config(read_timeout_s: int, calls_at_once: int = 10) -> Any:
    """`calls_at_once`: the most calls one process makes at a time (its analysts at once): the connection pool
    holds that many plus a margin, so no call waits for a connection (botocore's default pool holds 10)."""
    from botocore.config import Config

    # total_max_attempts=1: botocore sends each call exactly once ("max_attempts" would mean one
    # *retry*); tier 1 (ours) owns retries, so the two tiers never multiply.
    return Config(read_timeout=read_timeout_s, connect_timeout=10, max_pool_connections=calls_at_once + POOL_MARGIN,
                  retries={"mode": "standard", "total_max_attempts": 1})
