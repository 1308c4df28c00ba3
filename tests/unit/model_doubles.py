"""Shared model-side test doubles: a request factory, an echoing model, and an outcome label."""

from __future__ import annotations

import threading

from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.domain.errors import classify
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.doubles.spec import FaultSpec

MODEL_ID = "global.anthropic.claude-sonnet-4-6"  # the prod profile's default (a cross-region inference profile)
SCHEMA = {
    "type": "object",
    "properties": {"findings": {"type": "array", "items": {"type": "object"}}},
    "required": ["findings"],
}


def request(i: int = 0, chunk_index: int = 0, analyst: str = "liability", step: str = "locate") -> ModelRequest:
    return ModelRequest(
        analyst=analyst, step=step, system="You are a contract analyst.",
        prompt=f"Find liability caps in chunk {chunk_index}, item {i}.",
        payload={"chunk_index": chunk_index}, output_schema=SCHEMA,
        chunk_id=f"job-1#{chunk_index:04d}", max_tokens=1024,
    )


class EchoModel:
    model_id = "echo-model"

    def __init__(self):
        self.calls = 0
        self._lock = threading.Lock()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            self.calls += 1
        return ModelResponse(text='{"findings": []}', stop_reason="end_turn", input_tokens=10, output_tokens=3)


def outcome(model, req: ModelRequest) -> str:
    """One call, reduced to a label: ok / malformed / refused / the classified error code."""
    try:
        resp = model.invoke(req)
    except (ClientError, ReadTimeoutError) as exc:
        return classify(exc, model_call=True).error_code
    if resp.stop_reason == "malformed_model_output":
        return "malformed"
    if resp.stop_reason == "content_filtered":
        return "refused"
    return "ok"


def tokens_quota(state_dir: object, room: float, **faults: object) -> FaultSpec:
    """A simulated tokens-per-minute quota shared through `state_dir` that holds `room` tokens and refills next
    to nothing (1e-9 a second): what a test's calls reserve and settle is read off what is left of it."""
    return FaultSpec(throttle_tokens_per_s=1e-9, throttle_window_s=room / 1e-9, throttle_state_dir=str(state_dir),
                     **faults)
