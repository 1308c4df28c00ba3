"""Model clients: Bedrock Converse and the model-id check against the control plane (botocore Stubber)."""

from __future__ import annotations

import dataclasses
import json

import boto3
import botocore.endpoint
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import ANY, Stubber

from contract_review.domain.errors import ReviewError, classify
from contract_review.domain.model import ModelRequest, base_model_id, caches, is_inference_profile
from contract_review.model.bedrock import (
    BedrockConverseModel,
    ModelFacts,
    ModelIdCheck,
    bedrock_client_config,
    describe_model,
)

from .. import bedrock_stubs as bs
from ..model_doubles import MODEL_ID, SCHEMA, request


@pytest.fixture
def bedrock():
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120))
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


# --- BedrockConverseModel ----------------------------------------------------------------------------------

def expected_converse_params(req: ModelRequest) -> dict:
    """The layout for the prompt cache: the system, then the shared context, a cache point when the prefix reaches
    the model's minimum, the analyst's part (model_doubles.request(): short, under the minimum: no cache point)."""
    context = [{"text": req.context}] if req.context else []
    cache_point = [{"cachePoint": {"type": "default"}}] if caches(MODEL_ID, req) else []
    return {
        "modelId": MODEL_ID,
        "system": [{"text": req.system}],
        "messages": [{"role": "user", "content": [*context, *cache_point, {"text": req.prompt}]}],
        "inferenceConfig": {"maxTokens": req.max_tokens, "temperature": req.temperature},
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


APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"


def test_the_stacks_application_profile_is_what_is_sent_and_the_configured_id_what_is_checked():
    # GIVEN a worker deployed with its application inference profile (infra/inference.py: MODEL_INVOKE_ID)
    model, runtime_stub, control_stub, _ = _adapter(bs.RETIRED)
    model = BedrockConverseModel(model.client, bs.RETIRED, id_check=model.id_check, invoke_id=APP_PROFILE)
    req = request()
    # WHEN the model is invoked THEN Converse is called with the profile's ARN as the modelId
    runtime_stub.add_client_error("converse", service_error_code="ValidationException", service_message=bs.EOL_MESSAGE,
                                  http_status_code=400, expected_params={**model.converse_request(req),
                                                                         "modelId": APP_PROFILE})
    # AND a failure the id may cause asks the control plane about the configured id (its traits, its lifecycle)
    bs.expect_model(control_stub, bs.RETIRED, lifecycle="LEGACY", name="Claude 3.5 Sonnet",
                    inference_types=("ON_DEMAND",))
    with pytest.raises(ReviewError) as info:
        model.invoke(req)
    assert classify(info.value, model_call=True).error_code == "model.id_rejected" and bs.RETIRED in str(info.value)
    runtime_stub.assert_no_pending_responses()
    control_stub.assert_no_pending_responses()


@pytest.mark.parametrize("context_chars, cache_point", [(0, False), (400, False), (12_000, True)])
def test_the_cache_point_follows_the_shared_context_only_when_the_prefix_reaches_the_models_minimum(
        bedrock, context_chars, cache_point):
    client, stubber = bedrock
    req = dataclasses.replace(request(), context="c" * context_chars)
    assert caches(MODEL_ID, req) is cache_point  # 2,048 tokens for Claude Sonnet 4.6 (domain/model.py)
    stubber.add_response("converse", {
        "output": {"message": {"role": "assistant", "content": [{"text": "{}"}]}},
        "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
        "metrics": {"latencyMs": 1}}, expected_params=expected_converse_params(req))
    BedrockConverseModel(client, MODEL_ID).invoke(req)
    content = expected_converse_params(req)["messages"][0]["content"]
    assert ({"cachePoint": {"type": "default"}} in content) is cache_point
    assert content[-1] == {"text": req.prompt}  # the analyst's part always after it


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
        BedrockConverseModel(client, MODEL_ID).invoke(dataclasses.replace(request(), temperature=0.2))
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


# --- a model id Bedrock will not serve: asked of the control plane, never read from the text -------------

def _failing_converse(stub: Stubber, code: str, status: int, message: str = bs.EOL_MESSAGE) -> None:
    stub.add_client_error("converse", service_error_code=code, service_message=message, http_status_code=status)


def _adapter(model_id: str) -> tuple[BedrockConverseModel, Stubber, Stubber, list[int]]:
    runtime, runtime_stub = bs.stubbed("bedrock-runtime")
    control, control_stub = bs.stubbed("bedrock")
    connects: list[int] = []

    def connect():
        connects.append(1)
        return control

    runtime_stub.activate()
    control_stub.activate()
    return BedrockConverseModel(runtime, model_id, id_check=ModelIdCheck(connect)), runtime_stub, control_stub, connects


def test_a_retired_model_id_fails_at_once_with_the_job_fatal_code_naming_the_id():
    # GIVEN the configured model id has been retired: Converse answers ValidationException (400), and
    # the control plane lists the model as LEGACY
    model, runtime_stub, control_stub, _ = _adapter(bs.RETIRED)
    _failing_converse(runtime_stub, "ValidationException", 400)
    bs.expect_model(control_stub, bs.RETIRED, lifecycle="LEGACY", name="Claude 3.5 Sonnet",
                    inference_types=("ON_DEMAND",))
    # WHEN the model is invoked
    with pytest.raises(ReviewError) as info:
        model.invoke(request())
    # THEN the error is the job-fatal model.id_rejected, naming the id and what to do
    env = classify(info.value, model_call=True)
    assert env.error_code == "model.id_rejected" and env.job_fatal and not env.retryable
    assert bs.RETIRED in env.message and "LEGACY" in env.message and "-c model_id=" in env.message
    assert (env.http_status, env.provider_code) == (400, "ValidationException")
    runtime_stub.assert_no_pending_responses()
    control_stub.assert_no_pending_responses()


@pytest.mark.parametrize(("converse_code", "status"), [
    ("ValidationException", 400), ("ResourceNotFoundException", 404), ("AccessDeniedException", 403)])
def test_an_unknown_inference_profile_is_rejected_whatever_converse_answered(converse_code, status):
    model, runtime_stub, control_stub, _ = _adapter("us.anthropic.claude-sonnet-9-9")
    _failing_converse(runtime_stub, converse_code, status, "The provided model identifier is invalid.")
    control_stub.add_client_error("get_inference_profile", service_error_code="ResourceNotFoundException",
                                  service_message="Inference profile not found", http_status_code=404,
                                  expected_params={"inferenceProfileIdentifier": "us.anthropic.claude-sonnet-9-9"})
    with pytest.raises(ReviewError) as info:
        model.invoke(request())
    env = info.value.envelope
    assert env.error_code == "model.id_rejected" and "us.anthropic.claude-sonnet-9-9" in env.message
    assert env.provider_code == converse_code
    control_stub.assert_no_pending_responses()


def test_an_active_profile_whose_model_is_legacy_is_rejected():
    model, runtime_stub, control_stub, _ = _adapter(bs.CURRENT)
    _failing_converse(runtime_stub, "ValidationException", 400)
    bs.expect_profile(control_stub, bs.CURRENT)
    bs.expect_model(control_stub, "anthropic.claude-sonnet-4-6", lifecycle="LEGACY")
    with pytest.raises(ReviewError) as info:
        model.invoke(request())
    assert info.value.envelope.error_code == "model.id_rejected"


def test_a_model_served_only_through_inference_profiles_is_rejected_by_its_plain_id_with_the_fix():
    model, runtime_stub, control_stub, _ = _adapter("anthropic.claude-sonnet-4-6")
    _failing_converse(runtime_stub, "ValidationException", 400, "Invocation with on-demand throughput isn't supported.")
    bs.expect_model(control_stub, "anthropic.claude-sonnet-4-6", inference_types=("INFERENCE_PROFILE",))
    with pytest.raises(ReviewError) as info:
        model.invoke(request())
    env = info.value.envelope
    assert env.error_code == "model.id_rejected"
    assert "global.anthropic.claude-sonnet-4-6" in env.message and "us.anthropic.claude-sonnet-4-6" in env.message


def test_a_bad_request_to_a_current_model_stays_request_invalid_and_the_answer_is_cached():
    # GIVEN a current model, and two requests Bedrock rejects for another reason (same code and status)
    model, runtime_stub, control_stub, connects = _adapter(bs.CURRENT)
    _failing_converse(runtime_stub, "ValidationException", 400, "Input is too long for requested model.")
    _failing_converse(runtime_stub, "ValidationException", 400, "Input is too long for requested model.")
    bs.expect_current(control_stub)  # queued once: a second question would find no stubbed answer
    # WHEN both fail THEN each escapes unchanged and classifies as model.request_invalid (the chunk's error)
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            model.invoke(request())
        assert classify(info.value, model_call=True).error_code == "model.request_invalid"
    # AND the control plane was built once and asked once
    assert connects == [1]
    control_stub.assert_no_pending_responses()


def test_when_the_control_plane_cannot_answer_the_original_error_stands_and_nothing_is_cached():
    model, runtime_stub, control_stub, _ = _adapter(bs.CURRENT)
    for _ in range(2):
        _failing_converse(runtime_stub, "AccessDeniedException", 403, "You don't have access to the model.")
        control_stub.add_client_error("get_inference_profile", service_error_code="AccessDeniedException",
                                      http_status_code=403)
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            model.invoke(request())
        env = classify(info.value, model_call=True)
        assert env.error_code == "model.access_denied" and env.job_fatal
    control_stub.assert_no_pending_responses()  # asked again the second time: an unknown is not an answer


def test_a_successful_or_throttled_call_never_touches_the_control_plane():
    model, runtime_stub, _, connects = _adapter(bs.CURRENT)
    runtime_stub.add_response("converse", bs.converse_ok())
    _failing_converse(runtime_stub, "ThrottlingException", 429, "Too many tokens, please wait before trying again.")
    model.invoke(request())
    with pytest.raises(ClientError):
        model.invoke(request())
    assert connects == []  # the control-plane client is not even built


def test_describe_model_reads_name_and_lifecycle_of_the_model_behind_a_global_profile():
    control, stub = bs.stubbed("bedrock")
    bs.expect_current(stub)
    with stub:
        facts = describe_model(control, bs.CURRENT)
    assert facts == ModelFacts(bs.CURRENT, "anthropic.claude-sonnet-4-6", None, "Anthropic Claude Sonnet 4.6", "ACTIVE")


def test_ping_is_one_tiny_call_without_tools():
    runtime, stub = bs.stubbed("bedrock-runtime")
    stub.add_response("converse", bs.converse_ok(), expected_params={
        "modelId": bs.CURRENT, "messages": [{"role": "user", "content": [{"text": ANY}]}],
        "inferenceConfig": {"maxTokens": 8, "temperature": 0.0}})
    with stub:
        resp = BedrockConverseModel(runtime, bs.CURRENT).ping()
    assert (resp.text, resp.stop_reason, resp.input_tokens, resp.output_tokens) == ("OK", "end_turn", 14, 2)


@pytest.mark.parametrize(("model_id", "expected"), [
    ("global.anthropic.claude-sonnet-4-6", (True, "anthropic.claude-sonnet-4-6")),
    ("us.anthropic.claude-sonnet-4-6", (True, "anthropic.claude-sonnet-4-6")),
    ("us-gov.anthropic.claude-3-haiku-20240307-v1:0", (True, "anthropic.claude-3-haiku-20240307-v1:0")),
    ("anthropic.claude-sonnet-4-6", (False, "anthropic.claude-sonnet-4-6")),
    ("amazon.nova-pro-v1:0", (False, "amazon.nova-pro-v1:0")),
])
def test_inference_profile_ids_and_the_model_behind_them(model_id, expected):
    assert (is_inference_profile(model_id), base_model_id(model_id)) == expected


def test_the_runtime_clients_pool_holds_every_analyst_at_once():
    """11 analysts at once share one client: its pool holds a connection for each, plus a margin (botocore's
    default pool is 10: the 11th call would wait for a connection)."""
    from contract_review.config.profile import get_profile
    from contract_review.wiring import bedrock_runtime_client

    at_once = get_profile("prod").review.analyst_concurrency
    client = bedrock_runtime_client(boto3.Session(region_name="us-east-1"), 60, at_once)
    assert client.meta.config.max_pool_connections == at_once + 2 > 10


# --- BedrockMessagesModel: InvokeModel with the Anthropic Messages body --------------------------------------

MESSAGES_MODEL = "global.anthropic.claude-opus-4-6-v1"  # its catalogue row sends it through the Messages body


INVOKE_PARAMS = {"modelId": MESSAGES_MODEL, "body": ANY, "contentType": "application/json", "accept": "application/json"}


def messages_answer(content: list[dict], stop: str = "tool_use", **usage: int) -> dict:
    from io import BytesIO

    from botocore.response import StreamingBody

    raw = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "content": content,
                      "stop_reason": stop, "usage": {"input_tokens": 0, "output_tokens": 0, **usage}}).encode()
    return {"body": StreamingBody(BytesIO(raw), len(raw)), "contentType": "application/json"}


def test_the_traits_table_picks_the_api_per_model_and_the_wiring_builds_that_client():
    from contract_review.domain.model import model_api
    from contract_review.model.bedrock import BedrockMessagesModel, bedrock_model

    assert model_api(MESSAGES_MODEL) == "messages" and model_api(MODEL_ID) == "converse"
    assert isinstance(bedrock_model(None, MESSAGES_MODEL), BedrockMessagesModel)
    assert isinstance(bedrock_model(None, MODEL_ID), BedrockConverseModel)


def test_the_messages_body_has_the_cached_layout_and_the_forced_tool_and_the_answer_is_mapped(bedrock):
    from contract_review.config.catalogue import MESSAGES_VERSION
    from contract_review.model.bedrock import BedrockMessagesModel

    client, stubber = bedrock
    req = dataclasses.replace(request(), context="c" * 20_000)  # a prefix over Opus 4.6's minimum: cached
    assert caches(MESSAGES_MODEL, req)
    answer = {"clauses": [{"category": "liability_cap", "quote": "In no event"}]}
    sent: list[dict] = []
    stubber.add_response("invoke_model", messages_answer(
        [{"type": "text", "text": "Recording."}, {"type": "tool_use", "id": "t1", "name": "record_answer", "input": answer}],
        input_tokens=40, output_tokens=30, cache_read_input_tokens=5_300, cache_creation_input_tokens=0),
        expected_params=INVOKE_PARAMS)
    client.meta.events.register("before-parameter-build.bedrock-runtime.InvokeModel",
                                lambda params, **kw: sent.append(json.loads(params["body"])))
    resp = BedrockMessagesModel(client, MESSAGES_MODEL).invoke(req)
    (body,) = sent
    assert body["anthropic_version"] == MESSAGES_VERSION and body["max_tokens"] == req.max_tokens
    assert body["tool_choice"] == {"type": "tool", "name": "record_answer"}
    assert body["tools"] == [{"name": "record_answer", "description": ANY, "input_schema": req.output_schema}]
    assert body["system"] == [{"type": "text", "text": req.system}]
    assert body["messages"][0]["content"] == [  # the excerpt ends the cached prefix; the analyst's part follows
        {"type": "text", "text": req.context, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": req.prompt}]
    assert json.loads(resp.text) == answer and resp.stop_reason == "end_turn"
    assert (resp.input_tokens, resp.output_tokens, resp.cache_read_tokens, resp.cache_write_tokens) == (40, 30, 5_300, 0)


@pytest.mark.parametrize("content, stop, expected", [
    ([{"type": "tool_use", "id": "t", "name": "record_answer", "input": {"clauses": []}}], "max_tokens", "max_tokens"),
    ([{"type": "text", "text": "I cannot help with that."}], "refusal", "content_filtered"),
    ([{"type": "text", "text": "Here are the clauses: ..."}], "end_turn", "malformed_model_output"),
])
def test_messages_stop_reasons_map_to_the_ports(bedrock, content, stop, expected):
    from contract_review.model.bedrock import BedrockMessagesModel

    client, stubber = bedrock
    stubber.add_response("invoke_model", messages_answer(content, stop), expected_params=INVOKE_PARAMS)
    assert BedrockMessagesModel(client, MESSAGES_MODEL).invoke(request()).stop_reason == expected


def test_a_model_that_rejects_a_forced_tool_choice_is_asked_for_the_tool_instead(bedrock, monkeypatch):
    from contract_review.config import catalogue
    from contract_review.model.bedrock import ASK_FOR_THE_TOOL, BedrockMessagesModel

    base = catalogue.base_model_id(MESSAGES_MODEL)
    monkeypatch.setitem(catalogue.CATALOGUE, base, catalogue.CATALOGUE[base].model_copy(update={"forced_tool_choice": False}))
    client, stubber = bedrock
    sent: list[dict] = []
    client.meta.events.register("before-parameter-build.bedrock-runtime.InvokeModel",
                                lambda params, **kw: sent.append(json.loads(params["body"])))
    stubber.add_response("invoke_model", messages_answer(
        [{"type": "tool_use", "id": "t", "name": "record_answer", "input": {"clauses": []}}]), expected_params=INVOKE_PARAMS)
    BedrockMessagesModel(client, MESSAGES_MODEL).invoke(request())
    assert sent[0]["tool_choice"] == {"type": "auto"} and sent[0]["system"][0]["text"].endswith(ASK_FOR_THE_TOOL)


def test_messages_errors_are_classified_as_converses_are(bedrock):
    from contract_review.model.bedrock import BedrockMessagesModel

    client, stubber = bedrock
    stubber.add_client_error("invoke_model", service_error_code="ThrottlingException", http_status_code=429,
                             service_message="Too many tokens, please wait before trying again.")
    with pytest.raises(ClientError) as caught:
        BedrockMessagesModel(client, MESSAGES_MODEL).invoke(request())
    assert classify(caught.value, model_call=True).error_code == "model.throttled"


def test_a_chunk_reviewed_through_the_messages_body_finds_what_the_rule_model_finds_directly(bedrock):
    """End to end through the client: every analyst of a chunk, each call sent as a Messages body and answered
    (Stubber) with what the offline rule model answers that request, parses back to the same findings as the
    rule model gives without the client."""
    from contract_review.config.profile import get_profile
    from contract_review.doubles.offline_model import OfflineRuleModel
    from contract_review.model.bedrock import BedrockMessagesModel
    from contract_review.review.analysts import analysts_for, run_analyst
    from contract_review.review.chunking import chunk_document

    from ...large_docs import large_contract

    client, stubber = bedrock
    rules = OfflineRuleModel()
    messages = BedrockMessagesModel(client, MESSAGES_MODEL)
    chunk = chunk_document(large_contract(12_000), get_profile("prod").review)[0]

    def direct(build, parse):
        return parse(rules.invoke(build(None))), 1

    def through_messages(build, parse):
        req = build(None)
        answer = rules.invoke(req)
        stubber.add_response("invoke_model", messages_answer(
            [{"type": "tool_use", "id": "t", "name": "record_answer", "input": json.loads(answer.text)}],
            input_tokens=answer.input_tokens, output_tokens=answer.output_tokens), expected_params=INVOKE_PARAMS)
        return parse(messages.invoke(req)), 1

    found = [run_analyst(spec, chunk, through_messages).findings for spec in analysts_for(11)]
    assert found == [run_analyst(spec, chunk, direct).findings for spec in analysts_for(11)]
    assert any(found)  # the chunk has findings to compare
