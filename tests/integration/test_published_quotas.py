"""The model's quotas read once, by the sweeper, and published for the workers, on the local
stack's control table in moto (adapters/published_quotas.py; pipeline/sweeper.py `publish_quotas`):
- a sweep that reads changed quotas writes them once; one that reads the same quotas writes nothing;
- two sweepers that read the same change at once write it once (the second's conditional update fails);
- a read that fails is a sweep item failure, and what was published stays;
- a worker paces to what was published, keeps the last value it read when the item cannot be read, and its cold
  start makes no Service Quotas call (nor any Bedrock control-plane call)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from contract_review.adapters.published_quotas import DynamoPublishedQuotas, quotas_key
from contract_review.domain.control_records import PublishedQuotas
from contract_review.domain.ports import Deps
from contract_review.model.daily_quota import DailyQuota
from contract_review.model.onion import DailyQuotaModel, PacedModel, layer
from contract_review.model.pacing import QuotaLimiter
from contract_review.model.quota_targets import QuotaTargets
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.sweeper import SweepReport, sweep
from contract_review.pipeline.worker import ChunkWorker, Delivery
from contract_review.reliability.chunks import analysis_message
from contract_review.wiring import aws_client_config, build_chunk_worker, build_deps
from review_local.connect import local_session
from review_local.embedded import EmbeddedAws

from ..texts import TEXT
from ..unit.fakes import FakeClock
from ..unit.inprocess import FaultyModel
from .conftest import emptied

MODEL = "global.anthropic.claude-sonnet-4-6"
_n = iter(range(10**6))



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

def quotas(tpm: float | None, tpd: float | None = 1e9, at: float = 1.0) -> PublishedQuotas:
    return PublishedQuotas(model_id=MODEL, tokens_per_minute=tpm, tokens_per_minute_quota=f"tpm row ({tpm})",
                           tokens_per_day=tpd, tokens_per_day_quota="day row" if tpd else "no daily row",
                           read_at=at, by="sweeper")


def sweeper_deps(aws: EmbeddedAws, model_id: str) -> tuple[Deps, list[dict[str, Any]]]:
    """The stack's deps for a Bedrock model of its own (a fresh quotas item per case), and the UpdateItems its
    client sends for that item (the publishing writes)."""
    deps = emptied(aws)
    settings = deps.settings.model_copy(update={"model_provider": "bedrock", "model_id": model_id})
    deps = build_deps(settings, local_session(aws.region), aws.endpoint)
    assert isinstance(deps.published_quotas, DynamoPublishedQuotas)
    writes: list[dict[str, Any]] = []

    def seen(params: dict[str, Any], **_: Any) -> None:
        body = json.loads(params["body"])
        if body.get("Key", {}).get("control", {}).get("S") == quotas_key(model_id):
            writes.append(body)
    deps.published_quotas.table.client.meta.events.register("before-call.dynamodb.UpdateItem", seen)
    return deps, writes


def swept(deps: Deps, read: Callable[[], PublishedQuotas]) -> SweepReport:
    """A sweep whose Service Quotas read answers `read()` (the sweeper's `Deps.read_quotas`)."""
    return sweep(replace(deps, read_quotas=read))


def store(aws: EmbeddedAws, settings_table: str, model_id: str, clock: Callable[[], float] = FakeClock(),
          max_age_s: float = 60.0) -> DynamoPublishedQuotas:
    """Another process's store (its own client and cache)."""
    ddb = local_session(aws.region).client("dynamodb", config=aws_client_config(), endpoint_url=aws.endpoint)
    return DynamoPublishedQuotas(ddb, settings_table, model_id, max_age_s, clock)


def fresh_model() -> str:
    return f"{MODEL}-{next(_n)}"


def test_a_changed_quota_is_written_once_and_an_unchanged_one_not_at_all(embedded: EmbeddedAws):
    model_id = fresh_model()
    deps, writes = sweeper_deps(embedded, model_id)
    reader = store(embedded, deps.settings.control_table, model_id, max_age_s=0.0)
    # GIVEN nothing published yet, WHEN a sweep reads the quotas: one write, version 1
    first = quotas(2_000_000, at=100.0).model_copy(update={"model_id": model_id})
    assert swept(deps, lambda: first).quotas_published
    assert len(writes) == 1
    assert reader.get() == first.model_copy(update={"version": 1})
    # WHEN the next sweeps read the same values (read later): nothing written, the item as it was
    for at in (160.0, 220.0):
        report = swept(deps, lambda at=at: first.model_copy(update={"read_at": at}))
        assert not report.quotas_published and report.item_failures == []
    assert len(writes) == 1 and reader.get() == first.model_copy(update={"version": 1})
    # WHEN the quota is raised, and the daily row goes away: one more write, the daily quota removed
    raised = first.model_copy(update={"tokens_per_minute": 4_000_000.0, "tokens_per_day": None,
                                      "tokens_per_day_quota": "no daily row", "read_at": 280.0})
    assert swept(deps, lambda: raised).quotas_published
    assert len(writes) == 2 and reader.get() == raised.model_copy(update={"version": 2})


def test_two_sweepers_reading_the_same_change_at_once_write_it_once(embedded: EmbeddedAws):
    model_id = fresh_model()
    deps_a, writes = sweeper_deps(embedded, model_id)
    a = deps_a.published_quotas
    assert isinstance(a, DynamoPublishedQuotas)
    b = store(embedded, deps_a.settings.control_table, model_id)
    change = quotas(2_000_000).model_copy(update={"model_id": model_id})
    b_wrote: list[bool] = []

    def b_first(params: dict[str, Any], **_: Any) -> None:  # B publishes between A's read and A's write
        if not b_wrote:
            b_wrote.append(b.publish(change.model_copy(update={"by": "sweeper-b"})))
    a.table.client.meta.events.register("before-call.dynamodb.UpdateItem", b_first)
    # WHEN both read "no item" and both write: B's write lands, A's conditional write fails and A leaves it
    assert a.publish(change) is False
    assert b_wrote == [True]
    stored = store(embedded, deps_a.settings.control_table, model_id).get()
    assert stored is not None and stored.by == "sweeper-b" and stored.version == 1
    # AND A's next sweep finds the values published: nothing to write
    assert a.publish(change.model_copy(update={"read_at": 99.0})) is False
    assert len(writes) == 1  # A's one attempt, refused (B wrote through a client of its own), then none


def test_an_unreadable_quota_is_a_sweep_item_failure_and_the_published_quotas_stay(embedded: EmbeddedAws):
    model_id = fresh_model()
    deps, writes = sweeper_deps(embedded, model_id)
    published = quotas(2_000_000).model_copy(update={"model_id": model_id})
    assert swept(deps, lambda: published).quotas_published

    def denied() -> PublishedQuotas:
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "ListServiceQuotas")
    report = swept(deps, denied)
    assert report.item_failures == [f"quotas:{model_id}"] and not report.quotas_published
    assert len(writes) == 1
    assert store(embedded, deps.settings.control_table, model_id).get() == published.model_copy(update={"version": 1})


def _fail_reads(reader: DynamoPublishedQuotas) -> None:
    """Every GetItem of this reader's client is throttled from now on."""
    def throttled(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("", 400, {}, None), {
            "Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"},
            "ResponseMetadata": {"HTTPStatusCode": 400}}
    reader.table.client.meta.events.register("before-call.dynamodb.GetItem", throttled)


def test_a_worker_keeps_the_last_published_quota_when_the_item_cannot_be_read(embedded: EmbeddedAws):
    model_id = fresh_model()
    deps, _ = sweeper_deps(embedded, model_id)
    clock = FakeClock()
    worker_store = store(embedded, deps.settings.control_table, model_id, clock, max_age_s=60.0)
    targets = QuotaTargets(model_id, store=worker_store, fallback_tokens_per_minute=100_000)
    # GIVEN nothing published: the fallback (never unpaced)
    assert targets.tokens_per_minute()[0] == 100_000
    # WHEN the sweeper publishes, the worker reads it once its cached read has aged
    assert swept(deps, lambda: quotas(2_000_000).model_copy(update={"model_id": model_id})).quotas_published
    clock.advance(60)
    assert targets.tokens_per_minute()[0] == 2_000_000
    # WHEN the item can no longer be read (throttled): the last value read holds, not the fallback, not unpaced
    _fail_reads(worker_store)
    clock.advance(60)
    assert targets.tokens_per_minute()[0] == 2_000_000 and targets.tokens_per_day()[0] == 1e9
    # AND a worker started while the item is unreadable paces to the fallback until it reads one
    cold = store(embedded, deps.settings.control_table, model_id, clock)
    _fail_reads(cold)
    assert QuotaTargets(model_id, store=cold, fallback_tokens_per_minute=100_000).tokens_per_minute()[0] == 100_000


def test_a_bedrock_workers_cold_start_calls_no_service_quotas_and_paces_to_the_published_quota(embedded: EmbeddedAws):
    """The worker read Service Quotas (and Bedrock's control plane, for the model's name) at every
    cold start. Every AWS call of the worker's session is recorded: none to service-quotas or bedrock."""
    model_id = MODEL  # a model the price table knows: a job is admitted for it (the only case publishing for it)
    deps, _ = sweeper_deps(embedded, model_id)
    assert swept(deps, lambda: quotas(2_000_000).model_copy(update={"model_id": model_id})).quotas_published
    session = local_session(embedded.region)
    calls: list[str] = []
    session.events.register("before-call", lambda event_name, **_: calls.append(event_name))
    worker_deps = build_deps(deps.settings, session, embedded.endpoint)
    worker = build_chunk_worker(deps.settings, worker_deps, FaultyModel())
    result = handle_intake(deps, json.dumps({"schema_version": 1, "idempotency_key": model_id,
                                             "document": {"text": TEXT}}), f"m-{model_id}")
    job = deps.jobs.get(str(result.job_id))
    assert job is not None
    msg = analysis_message(deps, job, deps.claims.for_job(job.job_id)[0], "test")
    outcome = worker.handle(msg, Delivery("m", "rh", 1, 120, remaining_ms=lambda: 10**9))
    assert outcome.action == "done", outcome
    assert _pacers(worker) is not None and _pacers(worker).tokens is not None
    assert _pacers(worker).tokens.ceiling == pytest.approx(2_000_000 / 60)
    assert _daily(worker) is not None and _daily(worker).tokens_per_day == 1e9
    services = {name.split(".")[1] for name in calls}
    assert "dynamodb" in services and not services & {"service-quotas", "bedrock"}, sorted(services)
