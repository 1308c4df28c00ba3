"""Model clients: Bedrock Converse (botocore Stubber)."""

from __future__ import annotations

import json

import boto3
import botocore.endpoint
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import ANY, Stubber

from contract_review.errors import classify
from contract_review.model_clients import BedrockConverseModel, ModelRequest, bedrock_client_config

from .model_doubles import MODEL_ID, SCHEMA, request


@pytest.fixture
def bedrock():
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120))
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


# --- BedrockConverseModel ----------------------------------------------------------------------------------

def expected_converse_params(req: ModelRequest) -> dict:
    return {
        "modelId": MODEL_ID,
        "system": [{"text": req.system}],
        "messages": [{"role": "user", "content": [{"text": req.prompt}]}],
        "inferenceConfig": {"maxTokens": req.max_tokens, "temperature": 0.0},
        "toolConfig": {
            "tools": [{"toolSpec": {"name": BedrockConverseModel.TOOL_NAME, "description": ANY,
                                    "inputSchema": {"json": req.output_schema}}}],
            "toolChoice": {"tool": {"name": BedrockConverseModel.TOOL_NAME}},
        },
    }


def test_converse_tool_use_answer_is_returned_as_json(bedrock):
    client, stubber = bedrock
    req = request()
    answer = {"findings": [{"category": "liability_cap", "quote": "In no event shall either party be liable"}]}
    # GIVEN Bedrock answers with a text preamble and a toolUse block
    stubber.add_response(
        "converse",
        {
            "output": {"message": {"role": "assistant", "content": [
                {"text": "Recording the answer."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": BedrockConverseModel.TOOL_NAME, "input": answer}},
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 812, "outputTokens": 64, "totalTokens": 876},
            "metrics": {"latencyMs": 950},
        },
        expected_params=expected_converse_params(req),
    )
    # WHEN the model is invoked
    resp = BedrockConverseModel(client, MODEL_ID).invoke(req)
    # THEN the text is the tool input as JSON and the stop reason and usage are mapped
    assert json.loads(resp.text) == answer
    assert resp.stop_reason == "tool_use"
    assert (resp.input_tokens, resp.output_tokens) == (812, 64)
    assert resp.latency_ms >= 0


def test_converse_request_forces_the_one_tool_with_the_output_schema():
    # GIVEN a real client whose outgoing parameters are captured
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120))
    seen: dict = {}

    def capture(params, **_):
        seen.update(params)

    client.meta.events.register("provide-client-params.bedrock-runtime.Converse", capture)
    with Stubber(client) as stubber:
        stubber.add_response("converse", {
            "output": {"message": {"role": "assistant", "content": [{"text": "{}"}]}},
            "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
            "metrics": {"latencyMs": 1}})
        BedrockConverseModel(client, MODEL_ID, temperature=0.2).invoke(request())
    # THEN the tool choice names the only declared tool, whose input schema is the request's schema
    tools = seen["toolConfig"]["tools"]
    assert len(tools) == 1
    assert seen["toolConfig"]["toolChoice"] == {"tool": {"name": tools[0]["toolSpec"]["name"]}}
    assert tools[0]["toolSpec"]["inputSchema"] == {"json": SCHEMA}
    assert seen["modelId"] == MODEL_ID
    assert seen["inferenceConfig"] == {"maxTokens": 1024, "temperature": 0.2}


def test_converse_truncated_text_answer_keeps_its_stop_reason(bedrock):
    client, stubber = bedrock
    stubber.add_response("converse", {
        "output": {"message": {"role": "assistant", "content": [{"text": '{"findings": ['}, {"text": '{"cat'}]}},
        "stopReason": "max_tokens", "usage": {"inputTokens": 5, "outputTokens": 1024, "totalTokens": 1029},
        "metrics": {"latencyMs": 10}})
    resp = BedrockConverseModel(client, MODEL_ID).invoke(request())
    # THEN the caller can see the truncation (a 200 with max_tokens is a failure to the analyst)
    assert resp.stop_reason == "max_tokens"
    assert resp.text == '{"findings": [{"cat'


def test_converse_throttling_surfaces_as_client_error_classified_throttled(bedrock):
    client, stubber = bedrock
    # GIVEN Bedrock throttles the call
    stubber.add_client_error("converse", service_error_code="ThrottlingException",
                             service_message="Too many requests, please wait before trying again.",
                             http_status_code=429)
    # WHEN invoked THEN a botocore ClientError escapes unchanged ...
    with pytest.raises(ClientError) as info:
        BedrockConverseModel(client, MODEL_ID).invoke(request())
    assert info.value.response["Error"]["Code"] == "ThrottlingException"
    # ... and classification maps it to the transient model.throttled
    env = classify(info.value, step="liability.locate", model_call=True)
    assert env.error_code == "model.throttled" and env.retryable and env.http_status == 429


@pytest.mark.parametrize(("code", "status", "expected"), [
    ("AccessDeniedException", 403, "model.access_denied"),
    ("ValidationException", 400, "model.request_invalid"),
    ("ModelTimeoutException", 408, "model.timeout"),
])
def test_converse_other_errors_classify_from_stubbed_shape(bedrock, code, status, expected):
    client, stubber = bedrock
    stubber.add_client_error("converse", service_error_code=code, service_message="throttled? no.",
                             http_status_code=status)
    with pytest.raises(ClientError) as info:
        BedrockConverseModel(client, MODEL_ID).invoke(request())
    assert classify(info.value, model_call=True).error_code == expected


def test_bedrock_client_config_raises_read_timeout_and_uses_standard_retry_mode():
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120))
    cfg = client.meta.config
    # botocore's default read timeout is 60 s, after which it silently re-sends a long generation
    assert cfg.read_timeout == 120 and cfg.read_timeout > 60
    assert cfg.retries["mode"] == "standard"


def _throttle_response(request) -> AWSResponse:
    class _Raw:
        def stream(self):
            yield b'{"message": "Too many requests, please wait before trying again."}'

    return AWSResponse(request.url, 429, {"x-amzn-ErrorType": "ThrottlingException",
                                          "Content-Type": "application/json"}, _Raw())


@pytest.mark.parametrize("failure", ["throttle_429", "read_timeout"])
def test_botocore_sends_each_converse_call_exactly_once(monkeypatch, failure):
    # GIVEN a real client (dummy credentials, nothing leaves the process) whose HTTP send is replaced
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120),
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    sends: list[str] = []

    def fake_send(request, **_):
        sends.append(request.url)
        if failure == "read_timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        return _throttle_response(request)

    client.meta.events.register("before-send.bedrock-runtime.Converse", fake_send)
    monkeypatch.setattr(botocore.endpoint.time, "sleep", lambda _s: None)  # botocore's own backoff
    # WHEN one Converse call fails with a retryable error
    with pytest.raises((ClientError, ReadTimeoutError)):
        BedrockConverseModel(client, MODEL_ID).invoke(request())
    # THEN botocore sent it once: tier 1 (ours) owns every retry
    assert len(sends) == 1, f"botocore sent the request {len(sends)} times; config={client.meta.config.retries}"


