"""Model clients: Bedrock Converse (botocore Stubber), fault injection, the call ledger."""

from __future__ import annotations

import json
import threading
from collections import Counter

import boto3
import botocore.endpoint
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import ANY, Stubber

from contract_review.config import FaultSpec
from contract_review.errors import classify
from contract_review.models import (
    BedrockConverseModel,
    CallLedger,
    FaultInjectingModel,
    ModelRequest,
    ModelResponse,
    bedrock_client_config,
)

MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"
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


# --- FaultInjectingModel ------------------------------------------------------------------------------------

def workload(n: int) -> list[ModelRequest]:
    # several chunks and analysts, and repeated identical requests (a retry of the same prompt)
    reqs = []
    for i in range(n):
        reqs.append(request(i=i % 7, chunk_index=i % 5, analyst=("a", "b", "c")[i % 3]))
    return reqs


def test_fault_injection_is_deterministic_for_a_seed():
    spec = FaultSpec(seed=11, transient_rate=0.3, malformed_rate=0.1, refusal_rate=0.1)
    reqs = workload(300)
    # GIVEN two fresh instances with the same seed WHEN they see the same requests
    first = [outcome(FaultInjectingModel(EchoModel(), spec), r) for r in [reqs[0]]]  # warm-up on its own instance
    a = FaultInjectingModel(EchoModel(), spec)
    b = FaultInjectingModel(EchoModel(), spec)
    seq_a = [outcome(a, r) for r in reqs]
    seq_b = [outcome(b, r) for r in reqs]
    # THEN they produce the same sequence of outcomes, and it is a real mixture
    assert seq_a == seq_b
    assert first[0] == seq_a[0]
    assert {"ok", "malformed", "refused", "model.throttled"} <= set(seq_a)
    # AND another seed gives another sequence
    c = FaultInjectingModel(EchoModel(), spec.model_copy(update={"seed": 12}))
    assert [outcome(c, r) for r in reqs] != seq_a


def test_repeated_identical_requests_do_not_repeat_the_same_fault_forever():
    # a retry of the same prompt must get a fresh roll, or a tier-1 retry could never succeed
    model = FaultInjectingModel(EchoModel(), FaultSpec(seed=3, transient_rate=0.5))
    outcomes = {outcome(model, request(i=0)) for _ in range(40)}
    assert "ok" in outcomes and len(outcomes) > 1


def test_fault_rates_match_the_spec_over_2000_calls():
    spec = FaultSpec(seed=5, transient_rate=0.2, malformed_rate=0.1, refusal_rate=0.05)
    inner = EchoModel()
    model = FaultInjectingModel(inner, spec)
    n = 2000
    counts = Counter(outcome(model, request(i=i, chunk_index=i % 9)) for i in range(n))
    transient = counts["model.throttled"] + counts["model.unavailable"] + counts["model.timeout"]

    # binomial tolerance: 5 standard deviations (a false failure is ~1 in 10^6)
    def within(observed: int, p: float) -> bool:
        return abs(observed - n * p) <= 5 * (n * p * (1 - p)) ** 0.5

    assert within(transient, 0.2), counts
    assert within(counts["malformed"], 0.1), counts
    assert within(counts["refused"], 0.05), counts
    # the transient faults are split between throttle, 5xx and timeout
    for code in ("model.throttled", "model.unavailable", "model.timeout"):
        assert within(counts[code], 0.2 / 3), counts
    # only the calls that were not faulted reached the inner model
    assert inner.calls == counts["ok"]


def test_injected_throttle_carries_retry_after():
    model = FaultInjectingModel(EchoModel(), FaultSpec(seed=1, transient_rate=1.0, retry_after_s=0.75))
    envs = []
    for i in range(60):
        try:
            model.invoke(request(i=i))
        except (ClientError, ReadTimeoutError) as exc:
            envs.append(classify(exc, model_call=True))
    throttles = [e for e in envs if e.error_code == "model.throttled"]
    assert len(envs) == 60 and throttles
    assert all(e.retry_after_s == 0.75 and e.http_status == 429 for e in throttles)


def test_permanent_code_fails_every_call_with_access_denied_403():
    inner = EchoModel()
    model = FaultInjectingModel(inner, FaultSpec(permanent_code="AccessDeniedException"))
    for i in range(20):
        with pytest.raises(ClientError) as info:
            model.invoke(request(i=i, chunk_index=i))
        assert info.value.response["Error"]["Code"] == "AccessDeniedException"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        env = classify(info.value, model_call=True)
        assert env.error_code == "model.access_denied" and env.job_fatal
    assert inner.calls == 0


def test_always_fail_chunk_affects_only_that_chunk():
    inner = EchoModel()
    model = FaultInjectingModel(inner, FaultSpec(always_fail_chunk="2"))
    results = {idx: [outcome(model, request(i=i, chunk_index=idx)) for i in range(10)] for idx in range(5)}
    assert results[2] == ["model.unavailable"] * 10
    for idx in (0, 1, 3, 4):
        assert results[idx] == ["ok"] * 10
    # the chunk may also be named by its id
    by_id = FaultInjectingModel(EchoModel(), FaultSpec(always_fail_chunk="job-1#0003"))
    assert outcome(by_id, request(chunk_index=3)) == "model.unavailable"
    assert outcome(by_id, request(chunk_index=4)) == "ok"


def test_switch_file_turns_faults_on_and_off(tmp_path):
    switch = tmp_path / "faults-on"
    model = FaultInjectingModel(EchoModel(), FaultSpec(transient_rate=1.0, switch_file=str(switch)))
    # GIVEN the switch file is absent THEN no faults, even at rate 1.0
    assert {outcome(model, request(i=i)) for i in range(20)} == {"ok"}
    # WHEN it is created THEN every call faults
    switch.touch()
    assert "ok" not in {outcome(model, request(i=i)) for i in range(20)}
    # AND removing it turns them off again
    switch.unlink()
    assert outcome(model, request(i=99)) == "ok"


def test_shared_throttle_quota_throttles_across_instances_with_retry_after(tmp_path):
    spec = FaultSpec(throttle_quota_per_s=0.5, throttle_state_dir=str(tmp_path))
    worker_a = FaultInjectingModel(EchoModel(), spec)
    worker_b = FaultInjectingModel(EchoModel(), spec)  # another process's view of the same quota
    # GIVEN the quota's one token is taken by worker A
    assert outcome(worker_a, request(i=0)) == "ok"
    # WHEN worker B calls at once THEN it is throttled with a Retry-After within the refill time
    with pytest.raises(ClientError) as info:
        worker_b.invoke(request(i=1))
    assert info.value.response["Error"]["Code"] == "ThrottlingException"
    env = classify(info.value, model_call=True)
    assert env.error_code == "model.throttled" and env.http_status == 429
    assert env.retry_after_s is not None and 0 < env.retry_after_s <= 2.0
    # AND a model with its own quota directory is not affected
    other = FaultInjectingModel(EchoModel(), spec.model_copy(update={"throttle_state_dir": str(tmp_path / "x")}))
    assert outcome(other, request(i=2)) == "ok"


# --- CallLedger -----------------------------------------------------------------------------------------------

def test_call_ledger_writes_one_line_per_call_including_failures(tmp_path):
    path = tmp_path / "calls.jsonl"
    ledger = CallLedger(FaultInjectingModel(EchoModel(), FaultSpec(always_fail_chunk="1")), str(path))
    assert ledger.model_id == "echo-model"
    ledger.invoke(request(chunk_index=0, analyst="a", step="locate"))
    with pytest.raises(ClientError) as info:
        ledger.invoke(request(chunk_index=1, analyst="b", step="score"))
    assert info.value.response["Error"]["Code"] == "ServiceUnavailableException"  # re-raised unchanged
    ledger.invoke(request(chunk_index=2, analyst="c", step="locate"))

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["chunk_id"], x["analyst"], x["step"], x["outcome"]) for x in lines] == [
        ("job-1#0000", "a", "locate", "ok"),
        ("job-1#0001", "b", "score", "ClientError"),
        ("job-1#0002", "c", "locate", "ok"),
    ]
    assert all(isinstance(x["pid"], int) and x["at"] > 0 for x in lines)


def test_call_ledger_is_safe_under_concurrent_calls(tmp_path):
    path = tmp_path / "calls.jsonl"
    ledger = CallLedger(EchoModel(), str(path))
    threads = [threading.Thread(target=lambda k=k: [ledger.invoke(request(i=i, chunk_index=k)) for i in range(25)])
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["outcome"] == "ok" for line in lines)
