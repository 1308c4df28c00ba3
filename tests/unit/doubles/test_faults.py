"""Local fault doubles: seeded fault injection, the shared quota, the call ledger."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from pydantic import ValidationError

from contract_review.domain.errors import classify
from contract_review.domain.model import ModelRequest
from contract_review.doubles.bedrock_sim import reserved_tokens
from contract_review.doubles.faults import (
    REQUESTS_THROTTLE_MESSAGE,
    TOKENS_THROTTLE_MESSAGE,
    CallLedger,
    FaultInjectingModel,
    bedrock_error,
    in_burst,
    used_tokens,
)
from contract_review.doubles.spec import FaultSpec
from contract_review.model.bedrock import BedrockConverseModel, bedrock_client_config

from ..model_doubles import EchoModel, outcome, request, tokens_quota

ECHO = EchoModel().model_id  # the model the simulated Bedrock counts for (unknown: the strictest facts)

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


def _throttles(model: FaultInjectingModel, n: int) -> list[ClientError]:
    out = []
    for i in range(n):
        try:
            model.invoke(request(i=i))
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ThrottlingException":
                out.append(exc)
        except ReadTimeoutError:
            pass
    return out


def test_injected_throttles_are_bedrock_429s_without_a_retry_after_of_both_kinds():
    # GIVEN every call faults, half the throttles on the tokens quota
    model = FaultInjectingModel(EchoModel(), FaultSpec(seed=1, transient_rate=1.0))
    # WHEN 300 calls are made
    throttles = _throttles(model, 300)
    # THEN both of Bedrock's throttle messages occur, and every throttle has Bedrock's exact shape:
    # the modeled exception class, HTTP 429, the x-amzn-errortype header, and no Retry-After
    messages = Counter(t.response["Error"]["Message"] for t in throttles)
    assert set(messages) == {REQUESTS_THROTTLE_MESSAGE, TOKENS_THROTTLE_MESSAGE}, messages
    assert min(messages.values()) > 15, messages
    for t in throttles:
        headers = t.response["ResponseMetadata"]["HTTPHeaders"]
        assert type(t).__name__ == "ThrottlingException" and isinstance(t, ClientError)
        assert t.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert headers["x-amzn-errortype"].startswith("ThrottlingException:")
        assert not {"retry-after", "x-amz-retry-after"} & {h.lower() for h in headers}
        # AND classification reads the code and status only: model.throttled, with no hint
        env = classify(t, model_call=True)
        assert (env.error_code, env.retry_after_s, env.http_status) == ("model.throttled", None, 429)


@pytest.mark.parametrize(("share", "message"), [(0.0, REQUESTS_THROTTLE_MESSAGE), (1.0, TOKENS_THROTTLE_MESSAGE)])
def test_the_token_throttle_share_picks_the_quota_that_throttles(share, message):
    model = FaultInjectingModel(EchoModel(), FaultSpec(seed=2, transient_rate=1.0, token_throttle_share=share))
    throttles = _throttles(model, 90)
    assert throttles and {t.response["Error"]["Message"] for t in throttles} == {message}


def test_an_injected_throttle_is_what_a_real_client_raises_for_bedrocks_429(monkeypatch):
    # GIVEN a real bedrock-runtime client whose HTTP answer is Bedrock's throttle (no Retry-After)
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(60),
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    body = json.dumps({"message": TOKENS_THROTTLE_MESSAGE}).encode()

    class _Raw:
        def stream(self):
            yield body

    def bedrock_answers(request, **_):
        return AWSResponse(request.url, 429, {
            "x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            "Content-Type": "application/json", "x-amzn-RequestId": "r-1", "Content-Length": str(len(body))}, _Raw())

    client.meta.events.register("before-send.bedrock-runtime.Converse", bedrock_answers)
    with pytest.raises(ClientError) as real:
        BedrockConverseModel(client, "global.anthropic.claude-sonnet-4-6").invoke(request())
    # WHEN the injector throttles on the tokens quota
    injected = bedrock_error("ThrottlingException", TOKENS_THROTTLE_MESSAGE)
    # THEN the two cannot be told apart by anything the pipeline reads
    assert type(injected).__name__ == type(real.value).__name__ == "ThrottlingException"
    assert injected.response["Error"] == real.value.response["Error"]
    assert injected.operation_name == real.value.operation_name == "Converse"
    for meta in ("HTTPStatusCode", "RetryAttempts"):
        assert injected.response["ResponseMetadata"][meta] == real.value.response["ResponseMetadata"][meta]
    assert set(real.value.response["ResponseMetadata"]["HTTPHeaders"]) <= set(
        injected.response["ResponseMetadata"]["HTTPHeaders"])
    assert classify(injected, model_call=True).model_dump(exclude={"message", "first_seen_at", "last_seen_at"}) == \
        classify(real.value, model_call=True).model_dump(exclude={"message", "first_seen_at", "last_seen_at"})


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


def test_permanent_rate_answers_that_share_of_calls_with_a_bedrock_400_and_leaves_the_other_rates_alone():
    # GIVEN 1 % permanent faults on top of transient and malformed ones
    n = 4000
    base = FaultSpec(seed=5, transient_rate=0.05, malformed_rate=0.02)
    model = FaultInjectingModel(EchoModel(), base.model_copy(update={"permanent_rate": 0.01}))
    # WHEN it answers many calls
    counts = Counter(outcome(model, request(i=i, chunk_index=i % 9)) for i in range(n))
    # THEN about 1 % are HTTP 400 ValidationException, classified permanent, not job-fatal, never retried
    assert abs(counts["model.request_invalid"] - n * 0.01) <= 5 * (n * 0.01 * 0.99) ** 0.5, counts
    with pytest.raises(ClientError) as info:
        FaultInjectingModel(EchoModel(), FaultSpec(permanent_rate=1.0)).invoke(request())
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    env = classify(info.value, model_call=True)
    assert (env.error_code, env.error_class.value, env.retryable, env.job_fatal) == \
        ("model.request_invalid", "permanent", False, False)
    # AND the permanent share sits at the top of the roll: every other outcome is the one the spec
    # without it gives (seeded runs keep their faults)
    plain = FaultInjectingModel(EchoModel(), base)
    again = FaultInjectingModel(EchoModel(), base.model_copy(update={"permanent_rate": 0.01}))
    pairs = [(outcome(plain, r), outcome(again, r)) for r in (request(i=i, chunk_index=i % 9) for i in range(n))]
    assert all(a == b for a, b in pairs if b != "model.request_invalid")
    assert {a for a, b in pairs if b == "model.request_invalid"} == {"ok"}


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


def test_shared_requests_quota_throttles_across_instances_without_a_hint(tmp_path):
    spec = FaultSpec(throttle_quota_per_s=0.5, throttle_state_dir=str(tmp_path))
    worker_a = FaultInjectingModel(EchoModel(), spec)
    worker_b = FaultInjectingModel(EchoModel(), spec)  # another process's view of the same quota
    # GIVEN the quota's one request is taken by worker A
    assert outcome(worker_a, request(i=0)) == "ok"
    # WHEN worker B calls at once THEN it is throttled on the requests quota, with no Retry-After
    with pytest.raises(ClientError) as info:
        worker_b.invoke(request(i=1))
    assert info.value.response["Error"] == {"Code": "ThrottlingException", "Message": REQUESTS_THROTTLE_MESSAGE}
    env = classify(info.value, model_call=True)
    assert (env.error_code, env.http_status, env.retry_after_s) == ("model.throttled", 429, None)
    # AND a model with its own quota directory is not affected
    other = FaultInjectingModel(EchoModel(), spec.model_copy(update={"throttle_state_dir": str(tmp_path / "x")}))
    assert outcome(other, request(i=2)) == "ok"


def test_shared_tokens_quota_reserves_input_plus_max_tokens_and_throttles_with_too_many_tokens(tmp_path):
    # GIVEN a tokens quota of about two requests' reservation per second (request(): 1024 maxTokens)
    per_call = reserved_tokens(ECHO, request())
    assert per_call > 1024
    spec = FaultSpec(throttle_tokens_per_s=2.5 * per_call, throttle_state_dir=str(tmp_path))
    # WHEN three calls start at once (the 2nd starts while the 1st is in flight, the 3rd while both are)
    outcomes: list[str] = []

    def start(i: int) -> None:
        nxt = (lambda _s: start(i + 1)) if i < 2 else (lambda _s: None)
        model = FaultInjectingModel(EchoModel(), spec.model_copy(update={"latency_ms": 1}), sleep=nxt)
        try:
            model.invoke(request(i=i))
            outcomes.insert(0, "ok")
        except ClientError as exc:
            outcomes.insert(0, exc.response["Error"]["Message"])
    start(0)
    # THEN two fit the quota and the third is throttled on tokens (outcomes listed in start order)
    assert outcomes == ["ok", "ok", TOKENS_THROTTLE_MESSAGE]


def test_a_shared_quota_needs_a_state_dir():
    with pytest.raises(ValidationError, match="throttle_state_dir"):
        FaultSpec(throttle_tokens_per_s=1000)


# --- latency --------------------------------------------------------------------------------------------------

def _sleeps(spec: FaultSpec, n: int, read_timeout_s: float | None = None) -> tuple[list[float], list[str]]:
    slept: list[float] = []
    model = FaultInjectingModel(EchoModel(), spec, read_timeout_s=read_timeout_s, sleep=slept.append)
    outcomes = [outcome(model, request(i=i, chunk_index=i % 7)) for i in range(n)]
    return slept, outcomes


def test_constant_latency_ms_still_sleeps_the_same_for_every_answered_call():
    slept, outcomes = _sleeps(FaultSpec(latency_ms=250), 20)
    assert slept == [0.25] * 20 and set(outcomes) == {"ok"}


def test_lognormal_latency_has_the_configured_median_and_p99_and_is_seeded():
    spec = FaultSpec(seed=4, latency_median_ms=5000, latency_p99_ms=20000)
    slept, _ = _sleeps(spec, 4000)
    ordered = sorted(slept)
    # 4000 draws: the sample median and p99 land within a few percent of the configured ones
    assert 4.6 <= ordered[len(ordered) // 2] <= 5.4
    assert 17.0 <= ordered[int(len(ordered) * 0.99)] <= 23.5
    assert len(set(slept)) > 3900  # a distribution, not a constant
    # AND it is deterministic for a seed, and another seed draws other latencies
    assert _sleeps(spec, 50)[0] == slept[:50]
    assert _sleeps(spec.model_copy(update={"seed": 5}), 50)[0] != slept[:50]


def test_a_latency_beyond_the_read_timeout_ends_in_a_read_timeout_after_that_long():
    slept, outcomes = _sleeps(FaultSpec(seed=4, latency_median_ms=5000, latency_p99_ms=20000), 400,
                              read_timeout_s=12.0)
    timeouts = [s for s, o in zip(slept, outcomes) if o == "model.timeout"]
    assert timeouts and set(timeouts) == {12.0}  # the client gave up at its read timeout
    assert all(s < 12.0 for s, o in zip(slept, outcomes) if o == "ok")


def test_throttles_are_answered_at_once_without_latency():
    slept, outcomes = _sleeps(FaultSpec(seed=3, transient_rate=1.0, token_throttle_share=0.5, latency_ms=900), 60)
    throttled = outcomes.count("model.throttled") + outcomes.count("model.unavailable") + outcomes.count("model.timeout")
    assert throttled == 60 and slept == []


@pytest.mark.parametrize("fields", [
    {"latency_ms": 100, "latency_median_ms": 200},
    {"latency_median_ms": 300, "latency_p99_ms": 200},
    {"latency_p99_ms": 200},
    {"transient_rate": 1.5},
    {"permanent_rate": -0.1},
    {"transient_rate": 0.6, "malformed_rate": 0.3, "permanent_rate": 0.2},  # one roll: the rates sum past 1
])
def test_inconsistent_fault_specs_are_rejected(fields):
    with pytest.raises(ValidationError):
        FaultSpec(**fields)


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
        ("job-1#0001", "b", "score", "ServiceUnavailableException"),  # the modeled class, as boto3 raises
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


# --- the simulated Bedrock (a stand-in): tokens settled, 5xx bursts, per-minute quotas -------------------------

def _bucket_tokens(state_dir) -> float:
    return json.loads((state_dir / "model-tokens.json").read_text())["tokens"]


def test_a_finished_call_is_settled_to_input_plus_the_burndown_times_its_output(tmp_path):
    # GIVEN a tokens quota with room for exactly one reservation (input + 1024 maxTokens), no refill to speak of
    req = request()
    reserved = reserved_tokens(ECHO, req)
    spec = tokens_quota(tmp_path, reserved)
    model = FaultInjectingModel(EchoModel(), spec)
    # WHEN one call answers with 3 output tokens
    assert outcome(model, req) == "ok"
    # THEN the quota holds the answer's input (10, as its usage reports it) + 15 x 3 output (an uncatalogued model
    # burns down at the strictest known rate), not the input and the maxTokens reserved: the reservation was settled
    used = reserved - _bucket_tokens(tmp_path)
    assert used == pytest.approx(used_tokens(ECHO, req, EchoModel().invoke(req)), abs=1)
    assert used == pytest.approx(10 + 15 * 3, abs=1)


def test_a_call_in_flight_holds_its_whole_reservation(tmp_path):
    # GIVEN room for one reservation; WHEN a second call starts while the first is in flight (in its latency)
    req = request()
    spec = tokens_quota(tmp_path, reserved_tokens(ECHO, req), latency_ms=1)
    seen: list[str] = []
    other = FaultInjectingModel(EchoModel(), spec.model_copy(update={"latency_ms": 0}))
    holding = FaultInjectingModel(EchoModel(), spec, sleep=lambda _s: seen.append(outcome(other, request(i=9))))
    assert outcome(holding, req) == "ok"
    # THEN it is throttled on tokens, though the first call will use far less than it reserved
    assert seen == ["model.throttled"]


def test_an_error_answered_at_once_gives_its_reserved_tokens_back(tmp_path):
    req = request()
    reserved = reserved_tokens(ECHO, req)
    spec = tokens_quota(tmp_path, 2 * reserved, transient_rate=1.0)
    model = FaultInjectingModel(EchoModel(), spec, sleep=lambda _s: None)
    # 6 faults against room for 2 reservations: those answered at once (429, 5xx) give their tokens back; a read
    # timeout does not (the client gave up, Bedrock went on with the call: test_bedrock_sim.py)
    outcomes = [outcome(model, request(i=i)) for i in range(6)]
    assert set(outcomes) <= {"model.throttled", "model.unavailable", "model.timeout"}
    held = min(2, outcomes.count("model.timeout"))
    assert _bucket_tokens(tmp_path) == pytest.approx((2 - held) * reserved, abs=1)


def test_a_request_throttled_on_tokens_gives_its_request_back(tmp_path):
    # GIVEN a requests quota of 5 and a tokens quota with room for one reservation, barely refilling
    req = request()
    spec = FaultSpec(throttle_quota_per_s=5e-9, throttle_tokens_per_s=reserved_tokens(ECHO, req) * 1e-9,
                     throttle_window_s=1e9, throttle_state_dir=str(tmp_path))
    model = FaultInjectingModel(EchoModel(), spec)
    assert outcome(model, req) == "ok"
    requests_left = json.loads((tmp_path / "model-quota.json").read_text())["tokens"]
    # WHEN a call asking for far more tokens than are left is throttled on tokens
    with pytest.raises(ClientError) as info:
        model.invoke(dataclasses.replace(request(i=1), max_tokens=10 ** 6))
    assert info.value.response["Error"]["Message"] == TOKENS_THROTTLE_MESSAGE
    # THEN the requests quota did not count it
    assert json.loads((tmp_path / "model-quota.json").read_text())["tokens"] == pytest.approx(requests_left, abs=0.01)


def test_5xx_bursts_fail_every_call_inside_the_window_and_none_outside(monkeypatch):
    spec = FaultSpec(seed=3, burst_every_s=10.0, burst_duration_s=2.0)
    model = FaultInjectingModel(EchoModel(), spec)
    inside = [t / 10 for t in range(0, 1000) if in_burst(spec, t / 10)]
    # 2 s of every 10 s, wherever the seeded phase puts them
    assert len(inside) == pytest.approx(200, abs=2)
    clock = {"now": inside[0]}
    monkeypatch.setattr("contract_review.doubles.faults.time.time", lambda: clock["now"])
    burst = {outcome(model, request(i=i)) for i in range(20)}
    assert burst == {"model.unavailable"}  # 503 ServiceUnavailable or 500 InternalServer: both transient
    clock["now"] = next(t / 10 for t in range(0, 1000) if not in_burst(spec, t / 10))
    assert {outcome(model, request(i=i)) for i in range(20)} == {"ok"}
    # AND another seed puts the bursts elsewhere
    other = spec.model_copy(update={"seed": 5})
    assert [in_burst(other, t / 10) for t in range(100)] != [in_burst(spec, t / 10) for t in range(100)]


def test_the_simulated_bedrock_has_no_requests_quota_unless_asked(tmp_path):
    spec = FaultSpec.simulated_bedrock(str(tmp_path), tokens_per_minute=600_000)
    assert spec.throttle_quota_per_s is None and spec.throttle_tokens_per_s == 10_000


def test_the_simulated_bedrock_spec_is_per_minute_quotas_and_a_latency_tail(tmp_path):
    spec = FaultSpec.simulated_bedrock(str(tmp_path), requests_per_minute=600, tokens_per_minute=120_000,
                                       median_ms=500, p99_ms=2000, transient_rate=0.05, seed=9)
    assert (spec.throttle_quota_per_s, spec.throttle_tokens_per_s, spec.throttle_window_s) == (10, 2000, 60)
    assert (spec.latency_median_ms, spec.latency_p99_ms, spec.transient_rate, spec.seed) == (500, 2000, 0.05, 9)
    with pytest.raises(ValidationError, match="burst"):
        FaultSpec(burst_every_s=1.0, burst_duration_s=2.0)
