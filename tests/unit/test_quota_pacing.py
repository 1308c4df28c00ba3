"""Pacing is on in every deploy: the quota comes from `-c model_tpm` (MODEL_TPM) or, when not given, from Service
Quotas at a worker's cold start (the same names `review preflight` prints), matched by name. Stubbed with botocore's
Stubber: the calls and their parameters are the real clients'."""

from __future__ import annotations

from typing import Any

import pytest

from contract_review.config.settings import Settings
from contract_review.wiring import build_limiter, model_tokens_per_minute

from . import bedrock_stubs as bs
from .test_config import full_env
from .test_preflight import PAGE_1, PAGE_2, SONNET_46, quota


class StubbedSession:
    """A boto3 session whose clients are stubbed; any other client is a test failure."""

    def __init__(self) -> None:
        self.bedrock, self.bedrock_stub = bs.stubbed("bedrock")
        self.quotas, self.quotas_stub = bs.stubbed("service-quotas")
        self.bedrock_stub.activate()
        self.quotas_stub.activate()

    def client(self, service: str, **_: Any) -> Any:
        return {"bedrock": self.bedrock, "service-quotas": self.quotas}[service]

    def verify(self) -> None:
        self.bedrock_stub.assert_no_pending_responses()
        self.quotas_stub.assert_no_pending_responses()


class NoClients:
    def client(self, service: str, **_: Any) -> Any:
        raise AssertionError(f"no {service} call expected")


def bedrock_settings(**env: str) -> Settings:
    return Settings.from_env(full_env(REVIEW_PROFILE="prod", MODEL_PROVIDER="bedrock", MODEL_ID=bs.CURRENT, **env))


def test_a_quota_given_at_deploy_is_used_without_asking_service_quotas():
    tpm, source = model_tokens_per_minute(bedrock_settings(MODEL_TPM="600000"), NoClients())
    assert (tpm, source) == (600_000, "MODEL_TPM (cdk deploy -c model_tpm)")


def test_with_no_quota_given_the_worker_reads_its_models_quota_from_service_quotas_at_cold_start():
    session = StubbedSession()
    bs.expect_current(session.bedrock_stub)
    for i, page in enumerate((PAGE_1, PAGE_2)):
        session.quotas_stub.add_response("list_service_quotas", {"Quotas": page, **({"NextToken": "t1"} if not i else {})},
                                         expected_params={"ServiceCode": "bedrock", **({"NextToken": "t1"} if i else {})})
    limiter = build_limiter(bedrock_settings(), session)
    session.verify()
    # THEN it paces by tokens to the model's global cross-region quota, and not by requests (not enforced)
    assert limiter is not None and limiter.requests is None and limiter.tokens is not None
    assert limiter.tokens.ceiling == pytest.approx(2_000_000 / 60)


def test_a_quota_without_an_applied_value_is_read_from_aws_defaults():
    session = StubbedSession()
    bs.expect_current(session.bedrock_stub)
    session.quotas_stub.add_response("list_service_quotas", {"Quotas": []}, expected_params={"ServiceCode": "bedrock"})
    session.quotas_stub.add_response("list_aws_default_service_quotas", {"Quotas": [
        quota(f"Global cross-Region InvokeModel tokens per minute for {SONNET_46} V1", 500_000, "L-DEFAULT")]},
        expected_params={"ServiceCode": "bedrock"})
    tpm, source = model_tokens_per_minute(bedrock_settings(), session)
    session.verify()
    assert tpm == 500_000 and "AWS default" in source


class DeniedQuotas(StubbedSession):
    """Service Quotas refuses (the role lacks servicequotas:ListServiceQuotas)."""

    def __init__(self) -> None:
        super().__init__()
        bs.expect_current(self.bedrock_stub)
        self.quotas_stub.add_client_error("list_service_quotas", service_error_code="AccessDeniedException",
                                          http_status_code=403)


def test_an_unreadable_quota_leaves_the_calls_unpaced_and_says_why():
    tpm, source = model_tokens_per_minute(bedrock_settings(), DeniedQuotas())
    assert tpm is None and "aws.access_denied" in source
    assert build_limiter(bedrock_settings(), DeniedQuotas()) is None


def test_the_offline_model_is_not_paced():
    s = Settings.from_env(full_env(REVIEW_PROFILE="local", MODEL_PROVIDER="offline"))
    assert model_tokens_per_minute(s, NoClients()) == (None, "the offline model has no quota")


def test_a_quota_set_at_runtime_replaces_the_pacers_target_at_the_next_chunk():
    """`review quota set N` (the model control): each worker paces to N from its next chunk, no redeploy."""
    import random

    from contract_review.domain.records import ModelControl
    from contract_review.pipeline.worker import ChunkWorker, Delivery

    from .fakes import FakeWorld
    from .inprocess import FaultyModel
    from .scenarios import one_chunk_job

    world = FakeWorld()
    _job, msg = one_chunk_job(world)
    worker = ChunkWorker(world.deps, FaultyModel(), rng=random.Random(1), sleep=lambda _s: None)
    assert worker.limiter is None  # the offline model: no quota known
    world.model_control.put(ModelControl(tokens_per_minute=600_000, by="ops"))
    assert worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9)).action == "done"
    assert worker.limiter is not None and worker.limiter.tokens is not None
    assert worker.limiter.tokens.ceiling == pytest.approx(600_000 / 60)


def test_a_cleared_quota_gives_a_warm_worker_the_deploys_pacing_back_within_the_controls_cache_age():
    """Issue 25 finding 12: `review quota set --clear` was ignored by a warm worker (a cleared control read as "no
    change"), which paced to the operator's old quota until its process was recycled: hours for a Lambda container,
    days for a Fargate task (the poller runs this same `ChunkWorker.handle`)."""
    import random
    from dataclasses import replace

    from contract_review.model.pacing import QuotaLimiter
    from contract_review.operate import ops
    from contract_review.pipeline.worker import ChunkWorker, Delivery

    from .fakes import FakeWorld
    from .inprocess import FaultyModel
    from .scenarios import one_chunk_job

    world = FakeWorld()
    max_age = world.settings.profile.quota.model_control_max_age_s
    world.model_control.max_age_s = max_age  # the worker reads the control through its cache, as the adapter does
    operator = replace(world.deps, model_control=world.model_control.another())  # `review quota`, another process
    _job, msg = one_chunk_job(world)
    model_id = world.settings.effective_model_id
    deploy = QuotaLimiter.for_profile(world.settings.profile, 1_000_000, model_id)  # the deploy's: -c model_tpm
    worker = ChunkWorker(world.deps, FaultyModel(), limiter=deploy, rng=random.Random(1), sleep=lambda _s: None)

    def next_chunk() -> QuotaLimiter | None:
        worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9))
        return worker.limiter

    # GIVEN a warm worker pacing to the quota an operator set
    ops.quota_change(operator, "ops", tokens_per_minute=600_000)
    paced = next_chunk()
    assert paced is not None and paced is not deploy and paced.tokens is not None
    assert paced.tokens.ceiling == pytest.approx(600_000 / 60)
    # WHEN the operator clears it
    ops.quota_change(operator, "ops", clear_quota=True)
    # THEN once the worker's cached control has aged (model_control_max_age_s), its next chunk paces to the deploy's
    world.clock.advance(max_age)
    assert next_chunk() is deploy
    # AND a quota set again is taken again
    ops.quota_change(operator, "ops", tokens_per_minute=300_000)
    world.clock.advance(max_age)
    again = next_chunk()
    assert again is not None and again.tokens is not None and again.tokens.ceiling == pytest.approx(300_000 / 60)
