"""Local fault doubles: seeded fault injection, the shared quota, the call ledger."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.config import FaultSpec
from contract_review.errors import classify
from contract_review.faults import CallLedger, FaultInjectingModel
from contract_review.model_clients import ModelRequest

from .model_doubles import EchoModel, outcome, request

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
