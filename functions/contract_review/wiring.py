"""Wiring: Settings + a boto3 session -> the `Deps` (repositories, queues, clock) and the model
the use cases take. Called once per process (handlers: lazily, on the first invocation), never at
import."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from contract_review.adapters.artifacts import S3Artifacts
from contract_review.adapters.batch_inference import BedrockBatchInference
from contract_review.adapters.claims import DynamoClaims
from contract_review.adapters.jobs import DynamoJobs
from contract_review.adapters.model_control import DynamoModelControl
from contract_review.adapters.outcomes import PowertoolsOutcomes
from contract_review.adapters.published_quotas import DynamoPublishedQuotas
from contract_review.adapters.queues import SqsQueues
from contract_review.adapters.task_protection import ScaleInGuard, TaskProtection
from contract_review.adapters.token_ledger import DynamoTokenLedger
from contract_review.config.constants import AWS_CALL_ATTEMPTS, AWS_CONNECT_TIMEOUT_S, AWS_READ_TIMEOUT_S
from contract_review.config.settings import Settings
from contract_review.domain.control_records import PublishedQuotas
from contract_review.domain.cost import RequestMeter, model_price
from contract_review.domain.effects import SideEffects
from contract_review.domain.errors import ReviewError, classify
from contract_review.domain.keys import BATCH_PREFIX
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse
from contract_review.domain.ports import Deps, Queue
from contract_review.model.bedrock import ModelIdCheck, bedrock_client_config, bedrock_model, describe_model
from contract_review.model.breaker import BreakerModel, CircuitBreaker
from contract_review.model.daily_quota import DailyQuota
from contract_review.model.onion import CountedModel, DailyQuotaModel, Layer, PacedModel, PausableModel
from contract_review.model.pacing import QuotaLimiter
from contract_review.model.quota_targets import QuotaTargets
from contract_review.model.quotas import published, read_batch_quota, read_model_quotas
from contract_review.pipeline.worker import ChunkWorker
from contract_review.sideeffects import saga

log = logging.getLogger(__name__)


def aws_client_config() -> Config:
    # AWS API calls (DynamoDB, S3, SQS): botocore's standard retry mode (config/constants.py: the event reader's
    # grace is derived from these). Tier 1 wraps model calls only, so the two never multiply.
    return Config(retries={"mode": "standard", "total_max_attempts": AWS_CALL_ATTEMPTS},
                  connect_timeout=AWS_CONNECT_TIMEOUT_S, read_timeout=AWS_READ_TIMEOUT_S)


def queue_urls(settings: Settings) -> dict[Queue, str]:
    return {Queue.INTAKE: settings.intake_queue_url, Queue.ANALYSIS: settings.analysis_queue_url,
            Queue.RESULTS: settings.results_queue_url, Queue.INTAKE_DLQ: settings.intake_dlq_url,
            Queue.ANALYSIS_DLQ: settings.analysis_dlq_url, Queue.RESULTS_DLQ: settings.results_dlq_url}


def build_deps(settings: Settings, session: Any, endpoint_url: str | None = None,
               remaining_ms: Callable[[], int] | None = None) -> Deps:
    """`remaining_ms`: the invocation's remaining time (handlers), for the side effects' outcome store."""
    kw: dict[str, Any] = {"config": aws_client_config()}
    if endpoint_url:
        kw["endpoint_url"] = endpoint_url
    meter = RequestMeter()  # counts these clients' requests: a chunk attempt's are part of its cost (cost.py)
    ddb = meter.hook(session.client("dynamodb", **kw))
    clock = time.time
    p = settings.profile
    s3 = meter.hook(session.client("s3", **kw))
    artifacts = S3Artifacts(s3, settings.bucket)
    return Deps(
        settings=settings,
        jobs=DynamoJobs(ddb, settings.jobs_table, settings.events_table, p.record_ttl_s, clock,
                        claims_table=settings.claims_table),
        claims=DynamoClaims(ddb, settings.claims_table, settings.checkpoints_table, artifacts, p.record_ttl_s,
                            p.review.checkpoint_inline_max_bytes, clock),
        artifacts=artifacts,
        queues=SqsQueues(meter.hook(session.client("sqs", **kw)), queue_urls(settings)),
        clock=clock,
        meter=meter,
        side_effects=(build_side_effects(settings, session, endpoint_url, remaining_ms)
                      if settings.idempotency_table else None),
        compensator=saga.compensate_job if settings.idempotency_table else None,
        model_control=(DynamoModelControl(ddb, settings.control_table, p.quota.model_control_max_age_s)
                       if settings.control_table else None),
        published_quotas=(DynamoPublishedQuotas(ddb, settings.control_table, settings.effective_model_id,
                                                p.quota.model_control_max_age_s) if settings.control_table else None),
        read_quotas=quota_reader(settings, session),
        token_ledger=(DynamoTokenLedger(ddb, settings.token_ledger_table, p.quota.daily_ledger_bucket_s)
                      if settings.token_ledger_table else None),
        batch_inference=build_batch_inference(settings, session, s3, meter, endpoint_url),
    )


def build_batch_inference(settings: Settings, session: Any, s3: Any, meter: RequestMeter | None = None,
                endpoint_url: str | None = None) -> BedrockBatchInference | None:
    """Bedrock batch inference (adapters/batch_inference.py) for the process that submits and collects batch jobs:
    only where the batch service role is configured (BATCH_ROLE_ARN: the sweeper; the CLI from the stack's outputs),
    else None. Its `bedrock` client (the control plane) goes to BEDROCK_BATCH_ENDPOINT_URL when set (locally: the
    stand-in, review_local/batch_service.py), else where the other clients go; the records and answers live under
    BATCH_PREFIX of the artifacts bucket, through `s3` (the artifacts' client)."""
    if not settings.batch_role_arn:
        return None
    kw: dict[str, Any] = {"config": aws_client_config()}
    if settings.batch_endpoint_url or endpoint_url:
        kw["endpoint_url"] = settings.batch_endpoint_url or endpoint_url
    bedrock = session.client("bedrock", **kw)
    if meter is not None:
        meter.hook(bedrock)
    return BedrockBatchInference(bedrock, s3, bucket=settings.bucket, prefix=BATCH_PREFIX,
                                 role_arn=settings.batch_role_arn, model_id=settings.effective_model_id,
                                 timeout_hours=settings.profile.batch.batch_timeout_hours,
                                 read_min_records=lambda: batch_min_records(settings, session, bedrock),
                                 stack_tag=settings.stack_tag)


def batch_min_records(settings: Settings, session: Any, bedrock: Any) -> int | None:
    """The account's minimum records per batch job for the stack's model, as Service Quotas names it (the model's name
    from the control plane, then its quota: model/quotas.py `read_batch_quota`), or None, logged, when it cannot be
    read (the collector then holds to Bedrock's default, 100)."""
    model_id = settings.effective_model_id
    try:
        facts = ModelIdCheck(lambda: bedrock).facts(model_id)
        if facts is None or not facts.display_name:
            log.warning("batch minimum not read: the control plane did not name the model",
                        extra={"model_id": model_id})
            return None
        row = read_batch_quota(session.client("service-quotas", config=aws_client_config()), facts.display_name)
    except (ClientError, BotoCoreError) as exc:
        log.warning("batch minimum not read", extra={"model_id": model_id, "error_code": classify(exc).error_code})
        return None
    return int(row.value) if row is not None else None


def build_side_effects(settings: Settings, session: Any, endpoint_url: str | None = None,
                       remaining_ms: Callable[[], int] | None = None) -> SideEffects:
    """The saga's adapters: Powertools idempotency on the idempotency table, the ticket system over HTTP
    (`ticket_url`; none configured: the ticket step is skipped), SNS + EventBridge, the compensation DLQ."""
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    from contract_review.adapters.notify import SnsEventBridgeNotifier, SqsCompensationDlq
    from contract_review.adapters.tickets import HttpTicketSystem, SecretCredentials

    if not settings.idempotency_table:
        raise ValueError("the side effects need the idempotency table (IDEMPOTENCY_TABLE)")
    kw: dict[str, Any] = {"config": aws_client_config()}
    if endpoint_url:
        kw["endpoint_url"] = endpoint_url
    p = settings.profile
    persistence = DynamoDBPersistenceLayer(table_name=settings.idempotency_table,
                                           boto3_client=session.client("dynamodb", **kw))
    tickets = None
    if settings.ticket_url:
        import urllib3

        credentials = None
        if settings.ticket_secret_arn:  # Powertools' parameters utility, on our client (endpoint, retries)
            from aws_lambda_powertools.utilities.parameters import SecretsProvider

            credentials = SecretCredentials(SecretsProvider(boto3_client=session.client("secretsmanager", **kw)),
                                            settings.ticket_secret_arn, p.side_effects.ticket_secret_max_age_s)
        tickets = HttpTicketSystem(settings.ticket_url, urllib3.PoolManager(maxsize=4),
                                   read_timeout_s=p.side_effects.ticket_read_timeout_s, credentials=credentials)
    notifier = (SnsEventBridgeNotifier(session.client("sns", **kw), session.client("events", **kw),
                                       settings.job_events_topic_arn) if settings.job_events_topic_arn else None)
    dlq = SqsCompensationDlq(session.client("sqs", **kw), settings.compensation_dlq_url) \
        if settings.compensation_dlq_url else None
    return SideEffects(outcomes=PowertoolsOutcomes(persistence, expires_after_s=p.record_ttl_s), tickets=tickets,
                       notifier=notifier, dlq=dlq, remaining_ms=remaining_ms)


def bedrock_runtime_client(session: Any, read_timeout_s: int, calls_at_once: int = 1) -> Any:
    """Converse: each call sent once (tier 1 owns retries), with the call's read timeout, and a connection for
    each call made at once (the analysts at once)."""
    return session.client("bedrock-runtime", config=bedrock_client_config(read_timeout_s, calls_at_once))


def bedrock_control_client(session: Any) -> Any:
    """The Bedrock control plane (GetFoundationModel, GetInferenceProfile): built on first use only."""
    return session.client("bedrock", config=aws_client_config())


def quota_reader(settings: Settings, session: Any,
                 clock: Callable[[], float] = time.time) -> Callable[[], PublishedQuotas] | None:
    """The sweeper's read of the model's quotas as Service Quotas names them (model/quotas.py), to publish for the
    workers (pipeline/sweeper.py `publish_quotas`; `Deps.read_quotas`): the model's name from the Bedrock control plane
    (GetFoundationModel, asked once per process), then its quotas (paginated, each read). Its clients are built on its
    first call: only the sweeper calls it. None for the offline model (it has no quota).
    Raises what the clients raise, and ReviewError `model.not_found` when the control plane does not name the model:
    the sweep counts it as an item failure (logged, alarmed), and the published quotas stay as they were."""
    if settings.model_provider != "bedrock" or session is None:
        return None
    model_id = settings.effective_model_id
    names: list[str] = []
    clients: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in clients:
            clients[service] = session.client(service, config=aws_client_config())
        return clients[service]

    def read() -> PublishedQuotas:
        if not names:
            facts = describe_model(client("bedrock"), model_id)
            if not facts.display_name:
                raise ReviewError.of("model.not_found", f"the Bedrock control plane did not name {model_id} "
                                     f"(GetFoundationModel: {facts.rejection or 'no model name'}): its quotas are "
                                     "looked up by that name", step="sweeper.quotas")
            names.append(facts.display_name)
        return published(read_model_quotas(client("service-quotas"), model_id, names[0]), names[0], clock())
    return read


def build_chunk_worker(settings: Settings, deps: Deps, model: ModelClient,
                       build: Callable[[Settings], ModelClient] | None = None) -> ChunkWorker:
    """The process's analysis worker: its model, and the quotas it paces and holds to (model/quota_targets.py: given
    at deploy, else as the sweeper published them; no worker reads Service Quotas). Its pacers and its daily-quota
    hold are built at its first chunk and follow the quotas from then on (model/onion.py). `build(settings)`: the
    model of other settings (the handlers': traced), for the jobs recorded on another model than this deploy's (each
    such model's onion built once, with its own pacers and daily hold: `model_settings`)."""
    def onion(model_id: str) -> Layer:
        other = model_settings(settings, model_id)
        assert build is not None
        model = build(other) if settings.grants(model_id) else NotGranted(model_id, settings.effective_model_id)
        return worker_model(deps, model, quotas=QuotaTargets.for_settings(other, deps.published_quotas))

    return ChunkWorker(deps, worker_model(deps, model, quotas=QuotaTargets.for_settings(settings, deps.published_quotas)),
                       models=functools.cache(onion) if build is not None else None)


class NotGranted:
    """The model of a job this deploy does not grant (redeployed with another model, the job's not among
    `model_fallbacks`): every call fails the job at once with `model.not_granted`, before anything is sent."""

    def __init__(self, model_id: str, deployed: str):
        self.model_id, self.deployed = model_id, deployed

    def invoke(self, request: ModelRequest) -> ModelResponse:
        raise ReviewError.of(
            "model.not_granted",
            f"this job runs on {self.model_id}, the model it was submitted on, and this deploy grants {self.deployed} "
            f"only: redeploy with `-c model_fallbacks={self.model_id}` to let it finish on its model, then `review "
            "retry JOB`; or cancel it and submit the document again to review it on the new model")


def model_settings(settings: Settings, model_id: str) -> Settings:
    """The settings a call to `model_id` is made with: that model, called by its id (the stack's application
    inference profile is the deploy's model's only)."""
    return settings.model_copy(update={"model_id": model_id, "invoke_model_id": ""})


def chunk_worker(deps: Deps, model: ModelClient, *, quotas: QuotaTargets | None = None,
                 limiter: QuotaLimiter | None = None, daily: DailyQuota | None = None,
                 rng: random.Random | None = None, sleep: Callable[[float], None] = time.sleep,
                 call_safety_s: float | None = None) -> ChunkWorker:
    """An analysis worker calling `model` through its onion (`worker_model`); `rng`, `sleep`, `call_safety_s`: the
    worker's (pipeline/worker.py)."""
    return ChunkWorker(deps, worker_model(deps, model, quotas=quotas, limiter=limiter, daily=daily), rng=rng,
                       sleep=sleep, call_safety_s=call_safety_s)


def worker_model(deps: Deps, model: ModelClient, *, quotas: QuotaTargets | None = None,
                 limiter: QuotaLimiter | None = None, daily: DailyQuota | None = None) -> Layer:
    """The onion of a worker's model call (model/onion.py), outermost first: the pause and spend-cap hold (with a
    runtime control), the daily token quota (with `quotas` and a token ledger, or the hold given), the pacers (with
    `quotas` or a runtime control to follow, or the pacers given), the counting, then `model` (its breaker, trace and
    faults: `build_model`, the handlers). A layer with nothing to do is not built."""
    p, model_id = deps.settings.profile, model.model_id  # the model the calls go to: its price, burndown, quotas
    client: Layer = CountedModel(model, model_price(p.prices, model_id))
    if limiter is not None or quotas is not None or deps.model_control is not None:
        client = PacedModel(client, p, model_id, deps.model_control, quotas, limiter)
    if daily is not None or (quotas is not None and deps.token_ledger is not None):
        client = DailyQuotaModel(client, p, model_id, deps.clock, deps.token_ledger, quotas, daily)
    if deps.model_control is not None:
        client = PausableModel(client, deps, deps.model_control)
    return client


def _offline_model(settings: Settings) -> ModelClient:
    """The offline rule model (not an LLM). Its prompt cache is the simulated Bedrock's: shared by every process
    of the run through the fault spec's state directory when there is one (as Bedrock's is by the account)."""
    from contract_review.doubles.bedrock_sim import SimulatedPromptCache
    from contract_review.doubles.offline_model import OfflineRuleModel
    from contract_review.doubles.spec import FaultSpec

    spec = FaultSpec.model_validate_json(settings.fault_spec) if settings.fault_spec else FaultSpec()
    return OfflineRuleModel(SimulatedPromptCache(spec.throttle_state_dir, ttl_s=spec.cache_ttl_s))


def _simulated_model(settings: Settings) -> ModelClient:
    """The real Bedrock client of the catalogued model, on the strict simulated Bedrock (doubles/bedrock_runtime.py: a
    request the model would reject fails with its 400; a revoked model answers 403), answered by the offline rule
    model. The local stack and tests only (infra refuses the provider in prod)."""
    from contract_review.doubles.bedrock_runtime import RevokedFile, StrictBedrock
    from contract_review.doubles.spec import FaultSpec

    spec = FaultSpec.model_validate_json(settings.fault_spec) if settings.fault_spec else FaultSpec()
    revoked = RevokedFile(spec.revoked_file) if spec.revoked_file else None
    return StrictBedrock(_offline_model(settings), revoked).client(settings.effective_model_id)


def build_model(settings: Settings, session: Any) -> ModelClient:
    model: ModelClient
    if settings.model_provider == "simulated":
        model = _simulated_model(settings)
    elif settings.model_provider == "bedrock":
        model = bedrock_model(bedrock_runtime_client(session, settings.model_call_timeout_s,
                                                     settings.profile.review.analyst_concurrency),
                              settings.effective_model_id,
                              id_check=ModelIdCheck(lambda: bedrock_control_client(session)),
                              invoke_id=settings.invoke_model_id)
    else:  # the offline stand-in: imported only when configured, never on a Bedrock deploy's path
        model = _offline_model(settings)
    if settings.fault_spec:  # demo, tests and bench only (infra refuses it in the prod profile)
        from contract_review.doubles.faults import CallLedger, FaultInjectingModel
        from contract_review.doubles.spec import FaultSpec

        spec = FaultSpec.model_validate_json(settings.fault_spec)
        model = FaultInjectingModel(model, spec, read_timeout_s=settings.model_call_timeout_s)
        model = spec.wrap(model)  # the bench's own wrapper, if any: the strict double sees what it sends
        if spec.call_log:
            model = CallLedger(model, spec.call_log)
    p = settings.profile  # outermost: a call the open breaker refuses is never sent (nor logged as sent)
    return BreakerModel(model, CircuitBreaker(model.model_id, p.quota.breaker_failures, p.quota.breaker_open_s))


def build_scale_in_guard(settings: Settings, agent_uri: str | None) -> ScaleInGuard:
    """The Fargate poller's ECS scale-in protection (through the task's agent endpoint; None: a no-op)."""
    return ScaleInGuard(TaskProtection(agent_uri), settings.profile.fargate.fargate_protection_minutes)
