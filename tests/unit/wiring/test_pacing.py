"""Pacing is on in every deploy, and no worker reads Service Quotas (twenty cold starts at once could
be throttled, and a worker whose read failed ran unpaced, without a daily-token hold). The quota comes from
`-c model_tpm` (MODEL_TPM) or the profile, else from what the sweeper reads from Service Quotas (the same names
`review preflight` prints, matched by name) and publishes (adapters/published_quotas.py; tests/integration/
test_published_quotas.py runs the store on moto), else from a documented fallback: never unpaced. Service Quotas
stubbed with botocore's Stubber: the calls and their parameters are the real clients'."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from contract_review.config.settings import Settings
from contract_review.domain.control_records import PublishedQuotas
from contract_review.domain.messages import AnalysisMessage
from contract_review.model.daily_quota import DailyQuota
from contract_review.model.onion import DailyQuotaModel, PacedModel, layer
from contract_review.model.pacing import QuotaLimiter
from contract_review.model.quota_targets import MINUTES_PER_DAY, QuotaTargets
from contract_review.pipeline.worker import ChunkWorker, Delivery
from contract_review.wiring import build_chunk_worker, chunk_worker, quota_reader

from .. import bedrock_stubs as bs
from ..config.test_settings import full_env
from ..fakes import FakeWorld
from ..inprocess import FaultyModel
from ..local.test_preflight import PAGE_1, PAGE_2, SONNET_46, quota
from ..scenarios import one_chunk_job


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


class Store:
    """A `QuotaStore` as a worker sees it: what was last published (None: nothing yet); counts the reads."""

    def __init__(self, published: PublishedQuotas | None = None) -> None:
        self.published, self.reads = published, 0

    def get(self) -> PublishedQuotas | None:
        self.reads += 1
        return self.published

    def publish(self, quotas: PublishedQuotas) -> bool:
        raise AssertionError("a worker never publishes")



def _paced(worker: ChunkWorker) -> PacedModel:
    """The worker onion's pacing layer (model/onion.py)."""
    paced = layer(worker.model, PacedModel)
    assert paced is not None
    return paced


def _pacers(worker: ChunkWorker) -> QuotaLimiter | None:
    return _paced(worker).limiter


def _daily(worker: ChunkWorker) -> DailyQuota | None:
    """The daily-quota layer's hold, when a daily quota is known."""
    daily = layer(worker.model, DailyQuotaModel)
    return daily.quota if daily is not None else None

def bedrock_settings(**env: str) -> Settings:
    return Settings.from_env(full_env(REVIEW_PROFILE="prod", MODEL_PROVIDER="bedrock", MODEL_ID=bs.CURRENT, **env))


def published(tpm: float | None, tpd: float | None = None) -> PublishedQuotas:
    return PublishedQuotas(model_id=bs.CURRENT, tokens_per_minute=tpm, tokens_per_minute_quota=f"row {tpm}",
                           tokens_per_day=tpd, tokens_per_day_quota=f"day {tpd}" if tpd else "no daily row")


# ------------------------------------------------------------------ the sweeper's read of Service Quotas
def test_the_sweeper_reads_its_models_quotas_from_service_quotas_by_name():
    session = StubbedSession()
    bs.expect_current(session.bedrock_stub)
    for i, page in enumerate((PAGE_1, PAGE_2)):
        session.quotas_stub.add_response("list_service_quotas", {"Quotas": page, **({"NextToken": "t1"} if not i else {})},
                                         expected_params={"ServiceCode": "bedrock", **({"NextToken": "t1"} if i else {})})
    read = quota_reader(bedrock_settings(), session, clock=lambda: 1234.0)
    assert read is not None
    got = read()
    session.verify()
    # THEN the model's global cross-region tokens-per-minute row and its daily row, each named, read now
    assert (got.model_id, got.tokens_per_minute, got.tokens_per_day, got.read_at) == (bs.CURRENT, 2_000_000, 1e9, 1234.0)
    assert "L-GLOBALTPM" not in got.tokens_per_minute_quota and "tokens per minute" in got.tokens_per_minute_quota
    assert "(applied)" in got.tokens_per_minute_quota


def test_a_quota_without_an_applied_value_is_read_from_aws_defaults():
    session = StubbedSession()
    bs.expect_current(session.bedrock_stub)
    session.quotas_stub.add_response("list_service_quotas", {"Quotas": []}, expected_params={"ServiceCode": "bedrock"})
    session.quotas_stub.add_response("list_aws_default_service_quotas", {"Quotas": [
        quota(f"Global cross-Region InvokeModel tokens per minute for {SONNET_46} V1", 500_000, "L-DEFAULT")]},
        expected_params={"ServiceCode": "bedrock"})
    read = quota_reader(bedrock_settings(), session)
    assert read is not None
    got = read()
    session.verify()
    assert got.tokens_per_minute == 500_000 and "AWS default" in got.tokens_per_minute_quota
    assert got.tokens_per_day is None and "no global cross-region daily tokens quota" in got.tokens_per_day_quota


def test_an_unreadable_quota_raises_for_the_sweep_to_count():
    """The sweep counts it as an item failure (pipeline/sweeper.py publish_quotas); what was published stays."""
    session = StubbedSession()
    bs.expect_current(session.bedrock_stub)
    session.quotas_stub.add_client_error("list_service_quotas", service_error_code="AccessDeniedException",
                                         http_status_code=403)
    read = quota_reader(bedrock_settings(), session)
    assert read is not None
    with pytest.raises(ClientError):
        read()


def test_the_offline_model_has_no_quota_to_read_and_is_not_paced():
    s = Settings.from_env(full_env(REVIEW_PROFILE="local", MODEL_PROVIDER="offline"))
    assert quota_reader(s, NoClients()) is None
    targets = QuotaTargets.for_settings(s, Store(published(600_000)))
    assert targets.tokens_per_minute() == (None, "the offline model has no quota")
    assert targets.tokens_per_day() == (None, "the offline model has no quota")


# ------------------------------------------------------------------ what a worker paces to
def test_a_quota_given_at_deploy_comes_first_and_nothing_is_read():
    store = Store(published(2_000_000, 1e9))
    targets = QuotaTargets.for_settings(bedrock_settings(MODEL_TPM="600000"), store)
    assert targets.tokens_per_minute() == (600_000, "MODEL_TPM (cdk deploy -c model_tpm)")
    assert store.reads == 0


def test_a_bedrock_worker_paces_to_the_published_quota_else_a_documented_fallback_never_unpaced():
    s = bedrock_settings()
    fallback = s.profile.quota.quota_fallback_tokens_per_minute
    store = Store()
    targets = QuotaTargets.for_settings(s, store)
    # GIVEN nothing published yet (the first sweep has not run): the fallback, and a day of it for the daily hold
    tpm, source = targets.tokens_per_minute()
    assert tpm == fallback and "quota_fallback_tokens_per_minute" in source
    assert targets.tokens_per_day()[0] == fallback * MINUTES_PER_DAY
    # WHEN the sweeper publishes: its values
    store.published = published(2_000_000, 1e9)
    assert targets.tokens_per_minute() == (2_000_000, "published by the sweeper: row 2000000")
    assert targets.tokens_per_day()[0] == 1e9
    # AND a record whose model has no tokens-per-minute row: the fallback (still paced); no daily row: no hold
    store.published = published(None)
    assert targets.tokens_per_minute()[0] == fallback and targets.tokens_per_day() == (None, "no daily row")


def _deliver(worker: ChunkWorker, msg: AnalysisMessage) -> str:
    """One delivery of the chunk message (the quotas are applied at the start of each, whatever it does)."""
    return worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9)).action


def test_a_worker_paces_and_holds_to_the_published_quotas_and_follows_a_change_without_a_cold_start():
    world = FakeWorld()
    store = Store()
    targets = QuotaTargets(world.settings.effective_model_id, store=store, fallback_tokens_per_minute=100_000)
    worker = chunk_worker(world.deps, FaultyModel(), quotas=targets, rng=random.Random(1), sleep=lambda _s: None)
    _job, msg = one_chunk_job(world)
    # GIVEN nothing published: the first chunk paces to the fallback, and holds to a day of it
    assert _deliver(worker, msg) == "done"
    assert _pacers(worker) is not None and _pacers(worker).tokens is not None
    assert _pacers(worker).tokens.ceiling == pytest.approx(100_000 / 60)
    assert _daily(worker) is not None and _daily(worker).tokens_per_day == 100_000 * MINUTES_PER_DAY
    # WHEN the sweeper publishes the model's quotas: the next chunk paces and holds to them
    store.published = published(2_000_000, 1e9)
    _deliver(worker, msg)
    assert _pacers(worker).tokens.ceiling == pytest.approx(2_000_000 / 60)
    daily = _daily(worker)
    assert daily is not None and daily.tokens_per_day == 1e9 and "day 1000000000" in daily.source
    # AND a raised quota is followed in place (the daily hold's ledger state kept: the same hold)
    store.published = published(4_000_000, 2e9)
    _deliver(worker, msg)
    assert _pacers(worker).tokens.ceiling == pytest.approx(4_000_000 / 60)
    assert _daily(worker) is daily and daily.tokens_per_day == 2e9


def test_a_bedrock_worker_is_built_without_reading_service_quotas():
    """The worker's cold start: no Service Quotas client, no control-plane call; the quotas come with the control."""
    world = FakeWorld()
    store = Store(published(2_000_000, 1e9))
    deps = replace(world.deps, published_quotas=store)
    worker = build_chunk_worker(bedrock_settings(), deps, FaultyModel())
    assert _paced(worker).quotas is not None and _paced(worker).quotas.store is store and store.reads == 0
    assert _paced(worker).quotas.tokens_per_minute()[0] == 2_000_000


def test_a_quota_set_at_runtime_replaces_the_pacers_target_at_the_next_chunk():
    """`review quota set N` (the model control): each worker paces to N from its next chunk, no redeploy."""
    from contract_review.domain.control_records import ModelControl

    world = FakeWorld()
    _job, msg = one_chunk_job(world)
    worker = chunk_worker(world.deps, FaultyModel(), rng=random.Random(1), sleep=lambda _s: None)
    assert _pacers(worker) is None  # the offline model: no quota known
    world.model_control.put(ModelControl(tokens_per_minute=600_000, by="ops"))
    assert worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9)).action == "done"
    assert _pacers(worker) is not None and _pacers(worker).tokens is not None
    assert _pacers(worker).tokens.ceiling == pytest.approx(600_000 / 60)


def test_a_cleared_quota_gives_a_warm_worker_the_deploys_pacing_back_within_the_controls_cache_age():
    """`review quota set --clear` was ignored by a warm worker (a cleared control read as "no
    change"), which paced to the operator's old quota until its process was recycled: hours for a Lambda container,
    days for a Fargate task (the poller runs this same `ChunkWorker.handle`)."""
    from contract_review.model.pacing import QuotaLimiter
    from contract_review.operate import model_control

    world = FakeWorld()
    max_age = world.settings.profile.quota.model_control_max_age_s
    world.model_control.max_age_s = max_age  # the worker reads the control through its cache, as the adapter does
    operator = replace(world.deps, model_control=world.model_control.another())  # `review quota`, another process
    _job, msg = one_chunk_job(world)
    model_id = world.settings.effective_model_id
    deploy = QuotaLimiter.for_profile(world.settings.profile, 1_000_000, model_id)  # the deploy's: -c model_tpm
    worker = chunk_worker(world.deps, FaultyModel(), limiter=deploy, rng=random.Random(1), sleep=lambda _s: None)

    def next_chunk() -> QuotaLimiter | None:
        worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9))
        return _pacers(worker)

    # GIVEN a warm worker pacing to the quota an operator set
    model_control.quota_change(operator, "ops", tokens_per_minute=600_000)
    paced = next_chunk()
    assert paced is not None and paced is not deploy and paced.tokens is not None
    assert paced.tokens.ceiling == pytest.approx(600_000 / 60)
    # WHEN the operator clears it
    model_control.quota_change(operator, "ops", clear_quota=True)
    # THEN once the worker's cached control has aged (model_control_max_age_s), its next chunk paces to the deploy's
    world.clock.advance(max_age)
    assert next_chunk() is deploy
    # AND a quota set again is taken again
    model_control.quota_change(operator, "ops", tokens_per_minute=300_000)
    world.clock.advance(max_age)
    again = next_chunk()
    assert again is not None and again.tokens is not None and again.tokens.ceiling == pytest.approx(300_000 / 60)
