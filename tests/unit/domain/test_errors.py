"""Error registry and classification (DESIGN rule 6: errors are data, from structured fields only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from contract_review.config.profile import get_profile
from contract_review.domain import errors
from contract_review.domain.errors import REGISTRY, ErrorClass, ErrorEnvelope, ReviewError, classify
from contract_review.domain.policy import POLICY, Handling, Tier1, is_backpressure, render_markdown, tier1_policy

ROOT = Path(__file__).resolve().parents[3]
ERROR_DOC = ROOT / "docs" / "error-codes.md"
REGENERATE = "make docs"


def client_error(code: str, status: int | None, message: str = "boom", headers: dict | None = None,
                 op: str = "Converse") -> ClientError:
    meta: dict = {"HTTPHeaders": headers or {}}
    if status is not None:
        meta["HTTPStatusCode"] = status
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": meta}, op)


# --- the registry and its generated document ---------------------------------------------------

def test_error_codes_doc_is_generated_from_registry():
    # GIVEN the committed docs/error-codes.md
    assert ERROR_DOC.exists(), f"docs/error-codes.md is missing; regenerate with: {REGENERATE}"
    # WHEN it is compared with what the registry renders now
    # THEN they are identical (the doc is never edited by hand)
    assert ERROR_DOC.read_text(encoding="utf-8") == render_markdown(get_profile("prod"), REGISTRY), (
        f"docs/error-codes.md is stale; regenerate with: {REGENERATE}"
    )


def test_error_codes_doc_lists_every_code_once():
    rows = [line for line in render_markdown(get_profile("prod"), REGISTRY).splitlines() if line.startswith("| `")]
    listed = [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]
    assert sorted(listed) == sorted(REGISTRY)
    assert len(listed) == len(set(listed))


def test_the_recovery_policy_has_one_row_per_registered_code():
    assert list(POLICY) == list(REGISTRY)  # same codes, same order (the doc follows the registry)


@pytest.mark.parametrize("code", list(REGISTRY))
def test_each_policy_row_agrees_with_its_code(code):
    spec, row = REGISTRY[code], POLICY[code]
    # only transient codes are retried in tier 1, and only transient ones trip the breaker or slow a quota
    assert row.tier1 is None or spec.cls is ErrorClass.TRANSIENT
    assert not row.trips_breaker or spec.cls is ErrorClass.TRANSIENT
    assert row.slows is None or row.handling is Handling.BACKPRESSURE
    # a job-fatal code fails its chunk at once; a backpressure code is never job-fatal
    assert not spec.job_fatal or row.handling is Handling.PERMANENT


def test_the_tier1_numbers_are_the_profiles():
    prod = get_profile("prod")
    assert tier1_policy(prod, Tier1.MODEL) == prod.tier1.model_retry
    assert tier1_policy(prod, Tier1.SIDE_EFFECT).max_attempts == prod.side_effects.side_effect_attempts
    assert tier1_policy(prod, Tier1.COMPENSATION).max_attempts == prod.side_effects.compensation_attempts


@pytest.mark.parametrize(("code", "cause", "backpressure"), [
    ("model.throttled", None, True), ("aws.throttled", None, True), ("model.circuit_open", None, True),
    ("runtime.time_exhausted", "model.unavailable", True), ("runtime.retry_budget_exhausted", "model.throttled", True),
    ("runtime.retry_budget_exhausted", "model.unavailable", False), ("model.unavailable", None, False),
    ("model.request_invalid", None, False)])
def test_backpressure_is_read_from_the_policy(code, cause, backpressure):
    assert is_backpressure(ErrorEnvelope.of(code, cause_code=cause)) is backpressure


def test_every_code_is_dotted_lowercase_and_unique():
    codes = [c.code for c in errors._CODES]
    # GIVEN the declared codes WHEN indexed THEN no code silently shadows another in REGISTRY
    assert len(codes) == len(set(codes)) == len(REGISTRY), "duplicate error code in errors._CODES"
    for code in codes:
        assert re.fullmatch(r"[a-z]+(\.[a-z_]+)+", code), f"{code!r} is not a dotted lower-case code"


@pytest.mark.parametrize("spec", list(REGISTRY.values()), ids=list(REGISTRY))
def test_registry_entries_are_complete_and_consistent(spec):
    assert spec.cause.strip() and spec.recovery.strip()
    # only transient failures are retried; semantic gets a repair, policy a fallback, never a retry
    assert spec.retryable == (spec.cls is ErrorClass.TRANSIENT)
    # a job-fatal error can never be one that a retry could fix
    assert not (spec.job_fatal and spec.retryable)


def test_envelope_of_takes_class_and_retryable_from_registry_and_truncates_message():
    env = ErrorEnvelope.of("model.throttled", "x" * 2000, http_status=429)
    assert env.error_class is ErrorClass.TRANSIENT and env.retryable is True
    assert len(env.message) == 500
    assert env.first_seen_at > 0 and env.first_seen_at == env.last_seen_at
    with pytest.raises(KeyError):
        ErrorEnvelope.of("no.such_code")


# --- classification of Bedrock (model) errors ---------------------------------------------------

BEDROCK_CASES = [
    # provider code,                 status, expected code,            class,                 retryable
    ("ThrottlingException",           429, "model.throttled",         ErrorClass.TRANSIENT, True),
    ("ModelNotReadyException",        429, "model.throttled",         ErrorClass.TRANSIENT, True),
    ("ServiceUnavailableException",   503, "model.unavailable",       ErrorClass.TRANSIENT, True),
    ("InternalServerException",       500, "model.unavailable",       ErrorClass.TRANSIENT, True),
    ("ModelTimeoutException",         408, "model.timeout",           ErrorClass.TRANSIENT, True),
    ("ValidationException",           400, "model.request_invalid",   ErrorClass.PERMANENT, False),
    ("AccessDeniedException",         403, "model.access_denied",     ErrorClass.PERMANENT, False),
    ("ResourceNotFoundException",     404, "model.not_found",         ErrorClass.PERMANENT, False),
]


@pytest.mark.parametrize(("provider_code", "status", "code", "cls", "retryable"), BEDROCK_CASES,
                         ids=[c[0] for c in BEDROCK_CASES])
def test_bedrock_client_error_is_classified_from_code_and_status(provider_code, status, code, cls, retryable):
    # GIVEN a botocore ClientError shaped like Bedrock Converse's
    exc = client_error(provider_code, status, message="opaque provider text")
    # WHEN classified as a model call
    env = classify(exc, step="analyst.locate", attempt=2, model_call=True)
    # THEN the envelope carries the stable code, class and the structured fields
    assert (env.error_code, env.error_class, env.retryable) == (code, cls, retryable)
    assert env.http_status == status
    assert env.provider_code == provider_code
    assert env.step == "analyst.locate" and env.attempt == 2


@pytest.mark.parametrize("provider_code", ["AccessDeniedException", "ResourceNotFoundException"])
def test_access_denied_and_not_found_are_job_fatal(provider_code):
    status = 403 if provider_code == "AccessDeniedException" else 404
    env = classify(client_error(provider_code, status), model_call=True)
    assert env.job_fatal is True


@pytest.mark.parametrize("provider_code,status", [("ThrottlingException", 429), ("ValidationException", 400),
                                                  ("ServiceUnavailableException", 503)])
def test_recoverable_or_local_model_errors_are_not_job_fatal(provider_code, status):
    assert classify(client_error(provider_code, status), model_call=True).job_fatal is False


def test_unknown_model_error_code_falls_back_to_http_status():
    # GIVEN codes the table does not know, WHEN classified, THEN the HTTP status decides
    assert classify(client_error("BrandNewQuotaException", 429), model_call=True).error_code == "model.throttled"
    assert classify(client_error("SomethingBroke", 502), model_call=True).error_code == "model.unavailable"
    assert classify(client_error("WeirdRequest", 422), model_call=True).error_code == "model.request_invalid"


@pytest.mark.parametrize("text", [
    "Too many requests, please wait before trying again. You have been throttled.",
    "Rate exceeded: throttling",
    "ThrottlingException: slow down",
])
def test_message_text_never_drives_classification(text):
    # GIVEN a ValidationException whose *message* talks about throttling
    exc = client_error("ValidationException", 400, message=text)
    # WHEN classified (model call and AWS call)
    model_env = classify(exc, model_call=True)
    aws_env = classify(exc, model_call=False)
    # THEN only the structured code counts: permanent, not throttled
    assert model_env.error_code == "model.request_invalid" and model_env.retryable is False
    assert aws_env.error_code == "aws.client_error" and aws_env.retryable is False


def test_same_code_different_text_gives_same_classification():
    a = classify(client_error("ThrottlingException", 429, message="a"), model_call=True)
    b = classify(client_error("ThrottlingException", 429, message="validation failed; bad input"), model_call=True)
    assert (a.error_code, a.error_class) == (b.error_code, b.error_class) == ("model.throttled", ErrorClass.TRANSIENT)


@pytest.mark.parametrize(("headers", "expected"), [
    ({"retry-after": "3"}, 3.0),
    ({"Retry-After": "0.25"}, 0.25),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # HTTP-date: ignored, backoff applies
    ({}, None),
])
def test_retry_after_header_is_parsed(headers, expected):
    env = classify(client_error("ThrottlingException", 429, headers=headers), model_call=True)
    assert env.retry_after_s == expected


def test_read_timeout_is_model_timeout():
    exc = ReadTimeoutError(endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com")
    env = classify(exc, model_call=True)
    assert env.error_code == "model.timeout" and env.retryable
    assert env.provider_code == "ReadTimeoutError"


def test_connect_failures_are_transient():
    timeout = ConnectTimeoutError(endpoint_url="https://x")
    refused = EndpointConnectionError(endpoint_url="https://x")
    assert classify(timeout, model_call=True).error_code == "model.timeout"
    assert classify(refused, model_call=True).error_code == "model.unavailable"
    assert classify(timeout, model_call=False).error_code == "aws.unavailable"
    assert classify(refused, model_call=False).error_code == "aws.unavailable"


# --- classification of AWS-side (non-model) errors -----------------------------------------------

@pytest.mark.parametrize(("provider_code", "status", "code"), [
    ("ProvisionedThroughputExceededException", 400, "aws.throttled"),
    ("ThrottlingException", 400, "aws.throttled"),
    ("RequestLimitExceeded", 503, "aws.throttled"),
    ("SomeNewThrottle", 429, "aws.throttled"),
    ("AccessDenied", 403, "aws.access_denied"),
    ("AccessDeniedException", 400, "aws.access_denied"),
    ("InternalError", 500, "aws.unavailable"),
    ("ServiceUnavailable", 503, "aws.unavailable"),
    ("ConditionalCheckFailedException", 400, "aws.client_error"),
    ("NoSuchKey", 404, "aws.client_error"),
])
def test_aws_side_client_errors(provider_code, status, code):
    env = classify(client_error(provider_code, status, op="PutItem"), step="jobs.put", model_call=False)
    assert env.error_code == code
    assert env.error_class is REGISTRY[code].cls and env.retryable is REGISTRY[code].retryable
    assert env.provider_code == provider_code and env.http_status == status


def test_aws_access_denied_is_job_fatal_and_throttle_is_not():
    assert classify(client_error("AccessDenied", 403, op="GetObject")).job_fatal is True
    assert classify(client_error("ProvisionedThroughputExceededException", 400, op="PutItem")).job_fatal is False


def test_model_code_is_not_used_for_aws_calls():
    # GIVEN Bedrock's not-found code on a non-model call WHEN classified THEN it is an AWS client error
    env = classify(client_error("ResourceNotFoundException", 400, op="GetItem"), model_call=False)
    assert env.error_code == "aws.client_error"


# --- anything else ---------------------------------------------------------------------------------

class _Boom(Exception):
    pass


@pytest.mark.parametrize("exc", [KeyError("k"), ValueError("throttled, please retry"), _Boom()])
def test_unknown_exception_is_runtime_internal_with_type_name(exc):
    env = classify(exc, step="worker.run", model_call=True)
    assert env.error_code == "runtime.internal"
    assert env.error_class is ErrorClass.PERMANENT and env.retryable is False
    assert env.provider_code == type(exc).__name__
    assert env.step == "worker.run"


def test_review_error_keeps_its_envelope_and_takes_attempt_and_default_step():
    exc = ReviewError.of("model.output_invalid", "missing field 'findings'")
    env = classify(exc, step="analyst.score", attempt=3, model_call=True)
    assert env.error_code == "model.output_invalid" and env.message == "missing field 'findings'"
    assert env.step == "analyst.score" and env.attempt == 3
    # an envelope that already names its step keeps it
    own = ReviewError.of("input.invalid", "bad", step="intake.parse")
    assert classify(own, step="other").step == "intake.parse"


def test_changing_one_codes_behaviour_is_changing_its_row(monkeypatch):
    """GIVEN model.request_invalid (permanent: never retried, never trips the breaker) WHEN its row alone says
    tier-1 retry, backpressure and a breaker trip THEN the retrier, the worker's decision and the breaker follow."""
    import random
    from dataclasses import replace

    from contract_review.domain import policy
    from contract_review.model.breaker import CircuitBreaker
    from contract_review.reliability.retry import Retrier, RetryBudget, RetryStats

    err = client_error("ValidationException", 400)
    calls = []

    def call() -> str:
        calls.append(1)
        raise err

    def retrier() -> Retrier:
        return Retrier(policy=get_profile("local").tier1.model_retry, budget=RetryBudget(60), stats=RetryStats(),
                       rng=random.Random(1), sleep=lambda _s: None)

    with pytest.raises(ReviewError):
        retrier().call(call, step="locate")
    assert len(calls) == 1 and not is_backpressure(ErrorEnvelope.of("model.request_invalid"))
    breaker = CircuitBreaker("m", failure_threshold=1, open_s=30)
    breaker.on_failure(err, "c1")
    breaker.on_failure(err, "c2")
    assert breaker.state.value == "closed"

    row = policy.POLICY["model.request_invalid"]
    monkeypatch.setitem(policy.POLICY, "model.request_invalid",
                        replace(row, tier1=Tier1.MODEL, handling=Handling.BACKPRESSURE, trips_breaker=True))
    calls.clear()
    with pytest.raises(ReviewError):
        retrier().call(call, step="locate")
    assert len(calls) == get_profile("local").tier1.model_retry.max_attempts
    assert is_backpressure(ErrorEnvelope.of("model.request_invalid"))
    breaker.on_failure(err, "c1")
    breaker.on_failure(err, "c2")
    assert breaker.state.value == "open"


@pytest.mark.parametrize(("code", "cause", "retried", "progressed", "expected"), [
    ("model.unavailable", None, (), False, ("retry", None)),  # FAILURE: tier 2
    ("model.request_invalid", None, (), False, ("fail", None)),  # PERMANENT
    ("runtime.lease_lost", None, (), False, ("stop", None)),  # STOP: not ours to finish
    ("model.throttled", None, (), True, ("requeue", None)),  # backpressure
    ("runtime.retry_budget_exhausted", "model.throttled", (), False, ("requeue", None)),  # its cause's backpressure
    ("runtime.time_exhausted", None, (), True, ("requeue_at_once", None)),  # a clean handoff
    ("runtime.time_exhausted", None, ("model.throttled",), False, ("requeue", None)),  # throttles ate the time
    ("runtime.time_exhausted", None, ("model.unavailable",), False, ("retry", "model.unavailable")),  # errors did
    ("runtime.time_exhausted", None, ("model.unavailable",), True, ("requeue_at_once", None)),  # ...it progressed
    ("batch.record_failed", None, (), False, ("retry", None)),  # not a chunk outcome: its row's retryability
    ("input.invalid", None, (), False, ("fail", None)),
])
def test_what_an_attempt_does_next_is_decided_from_the_policy_rows(code, cause, retried, progressed, expected):
    from contract_review.domain.policy import decide

    d = decide(ErrorEnvelope.of(code, cause_code=cause), progressed=progressed, retried=retried)
    assert (d.next.value, d.cause_code) == expected


def test_a_codes_retryability_is_its_policy_rows():
    from dataclasses import replace

    from contract_review.domain import policy

    assert all(REGISTRY[c].retryable is POLICY[c].retryable for c in REGISTRY)
    # a row that stops being retried anywhere makes its envelopes say so on the wire
    row = POLICY["model.unavailable"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(policy.POLICY, "model.unavailable", replace(row, tier1=None, handling=Handling.PERMANENT))
        assert ErrorEnvelope.of("model.unavailable").retryable is False
