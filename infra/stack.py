"""`ContractReviewStack`: queues, tables, bucket, functions, schedule, grants, alarms, dashboard, outputs."""

from __future__ import annotations

import json
import math

from aws_cdk import ArnFormat, CfnOutput, Duration, Stack, Tags
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from constructs import Construct

from contract_review.config import metrics as M
from contract_review.config.settings import (
    OPTION_ENV,
    OPTION_OUTPUTS,
    PROFILE_OVERRIDES_ENV,
    PROFILE_OVERRIDES_OUTPUT,
    RESOURCES,
)
from contract_review.domain.cost import model_price
from contract_review.domain.keys import (
    BATCH_ANSWERS_PREFIX,
    BATCH_JOBS_PREFIX,
    BATCH_OPEN_PREFIX,
    BATCH_PENDING_PREFIX,
    UPLOADS_PREFIX,
)
from contract_review.domain.model import traits_for
from contract_review.domain.principals import PRINCIPAL_UPLOADS_PREFIX

from . import nag
from .api import JobApi
from .batch import BatchServiceRole, grant_batch_submit
from .deploy_settings import DeploySettings
from .fargate import FargateWorker
from .functions import PipelineFunction, functions_code, powertools_layer
from .inference import ApplicationProfile
from .monitoring import COST_TAG_KEY, AlarmTopic, CostBudget, ModelWatch, Monitoring
from .permissions import (
    ACCESS,
    LEASE_INDEX,
    OPEN_JOBS_INDEX,
    PRINCIPAL_UPLOADS,
    grant_access,
    grant_bedrock,
    grant_quota_read,
    grant_ticket_secret,
)
from .queues import QueueWithDlq
from .removal import removal_policy
from .sdk_layer import sdk_layer
from .side_effects import SideEffectResources
from .storage import PREFIXES, ArtifactBucket
from .tables import CLAIMS_LEASE_INDEX, JOBS_OPEN_INDEX, ReviewTables

HANDLERS = "contract_review.handlers"
INTAKE_MEMORY_MB = 512
AGGREGATOR_MEMORY_MB = 512
SWEEPER_MEMORY_MB = 256
API_MEMORY_MB = 512
API_TIMEOUT_S = 29  # an HTTP API waits at most 30 s for its integration


def sweep_rate_minutes(sweep_interval_s: float) -> int:
    """EventBridge schedules have minute granularity: round up, at least one minute."""
    return max(1, math.ceil(sweep_interval_s / 60))


class ContractReviewStack(Stack):
    """The whole pipeline, built from one profile. Env-agnostic: no account/region at synth."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: DeploySettings) -> None:
        p = settings.profile
        super().__init__(
            scope,
            construct_id,
            stack_name=settings.stack_name,
            description=f"Contract review pipeline (profile={p.name}, worker={settings.worker_kind})",
        )
        self.settings = settings
        retain = not settings.is_disposable
        removal = removal_policy(retain)  # infra/removal.py: deleted on a failed create, kept otherwise
        Tags.of(self).add("project", "contract-review")
        Tags.of(self).add("profile", p.name)

        # ---- alarm topic: the action of every alarm -------------------------------------
        self.alarm_topic = AlarmTopic(self, "Alarms", email=settings.alarm_subscriber, removal_policy=removal)
        # alarms that need no one now (backpressure, throttles, a batch lane off, near a cap or quota): a second topic,
        # so a pager can subscribe to the first only; -c alarm_email subscribes the address to both
        self.notice_topic = AlarmTopic(self, "Notices", email=settings.alarm_subscriber, removal_policy=removal,
                                       what="notices (no action needed now)")
        Tags.of(self).add(COST_TAG_KEY, settings.stack_name)  # what the cost budget filters on (a cost-allocation tag, once activated)
        if settings.monthly_budget_usd:  # not on the local (moto) stack: an AWS Budgets budget on that tag
            self.cost_budget = CostBudget(self, "Cost", topic=self.alarm_topic, monthly_usd=settings.monthly_budget_usd)
        alarm_action = self.alarm_topic.action

        # ---- queues (the construct fails synth when a rule is broken) ------------------
        name = settings.stack_name
        self.intake = QueueWithDlq(
            self, "Intake", profile=p, purpose="intake", name_prefix=name, age_alarm_s=p.alarms.intake_age_alarm_s,
            alarm_action=alarm_action,
            visibility_timeout_s=p.queues.intake_visibility_s, consumer_timeout_s=p.functions.intake_timeout_s,
        )
        self.analysis = QueueWithDlq(
            self, "Analysis", profile=p, purpose="analysis", name_prefix=name, age_alarm_s=p.alarms.analysis_age_alarm_s,
            alarm_action=alarm_action,
            visibility_timeout_s=p.queues.analysis_visibility_s, consumer_timeout_s=p.functions.worker_timeout_s,
        )
        self.results = QueueWithDlq(
            self, "Results", profile=p, purpose="results", fifo=True, name_prefix=name,
            age_alarm_s=p.alarms.results_age_alarm_s, alarm_action=alarm_action,
            visibility_timeout_s=p.queues.results_visibility_s, consumer_timeout_s=p.functions.aggregator_timeout_s,
        )

        # ---- data ----------------------------------------------------------------------
        self.tables = ReviewTables(self, "Tables", retain=retain)
        self.side_effects = SideEffectResources(self, "SideEffects", profile=p, retain=retain,
                                                alarm_action=alarm_action)
        self.storage = ArtifactBucket(
            self, "Storage", retain=retain, artifact_expiry_days=p.record_ttl_days + 1,
            auto_delete_objects=settings.auto_delete_objects,
        )

        # ---- Bedrock batch inference: the role Bedrock assumes to read batch/input/, write batch/output/ (infra/batch.py)
        self.batch = BatchServiceRole(self, "BatchService", bucket=self.storage.bucket, model_id=settings.model_id)

        # ---- the application inference profile the workers call the model through, tagged for cost (infra/inference.py)
        self.model_profile: ApplicationProfile | None = None
        if settings.model_provider == "bedrock":
            self.model_profile = ApplicationProfile(self, "ModelProfile", model_id=settings.model_id,
                                                    tag=(COST_TAG_KEY, settings.stack_name))

        # ---- functions -----------------------------------------------------------------
        code = functions_code()
        # the pinned boto3/botocore, imported ahead of the runtime's own (infra/sdk_layer.py), and Powertools
        self.sdk_layer = sdk_layer(self)
        layers = [self.sdk_layer, powertools_layer(self, settings.powertools_version)]
        log_level = "DEBUG" if settings.is_disposable else "INFO"

        def fn(cid: str, service: str, timeout_s: int, memory_mb: int, what: str,
               recursive_loop: lambda_.RecursiveLoop = lambda_.RecursiveLoop.TERMINATE) -> PipelineFunction:
            return PipelineFunction(
                self, cid, handler=f"{HANDLERS}.{service}.handler", service=service, code=code, layers=layers,
                environment=self.function_environment("lambda"), timeout_s=timeout_s, memory_mb=memory_mb,
                log_retention_days=p.record_ttl_days, log_level=log_level, removal_policy=removal,
                description=f"contract-review {what} ({p.name})", recursive_loop=recursive_loop,
                reserved_concurrency=settings.reserved_concurrency.get(service),
            )

        self.intake_fn = fn("IntakeFn", "intake", p.functions.intake_timeout_s, INTAKE_MEMORY_MB, "intake: validate, chunk, fan out")
        # The worker requeues a throttled chunk to its own queue (bounded: the backpressure deadline and the
        # poison budget, reliability/chunks.py) and the aggregator refills the analysis queue page by page
        # (bounded: the document's chunk count, pipeline/fanout.py): both chains are longer than Lambda's
        # recursion guard allows (~16), so they may recurse. Intake keeps the guard: nothing SQS-triggered
        # sends to the intake queue. The RecursiveInvocationsDropped alarm says if it ever acts.
        allow = lambda_.RecursiveLoop.ALLOW
        self.worker_fn = fn("WorkerFn", "worker", p.functions.worker_timeout_s, p.functions.worker_memory_mb, "analysis worker", allow)
        self.aggregator_fn = fn("AggregatorFn", "aggregator", p.functions.aggregator_timeout_s, AGGREGATOR_MEMORY_MB,
                                "aggregator: findings -> report, side effects", allow)
        self.sweeper_fn = fn("SweeperFn", "sweeper", p.functions.sweeper_timeout_s, SWEEPER_MEMORY_MB,
                             "sweeper: lapsed claims, DLQ explain")
        # Bedrock batch inference's collector, its own function (docs/infrastructure.md "The batch collector"): memory
        # and time for a batch job of batch_max_records, never the recovery sweeper's
        self.collector_fn = fn("CollectorFn", "collector", p.functions.collector_timeout_s, p.functions.collector_memory_mb,
                               "batch collector: pack, submit and collect Bedrock batch jobs")
        self.api_fn = fn("ApiFn", "api", API_TIMEOUT_S, API_MEMORY_MB, "Job API: jobs and batches over HTTP")
        self.job_api = JobApi(self, "JobApi", function=self.api_fn.function, name=name,
                              log_retention_days=p.record_ttl_days, removal_policy=removal)

        # ---- event sources (partial batch responses everywhere) -------------------------
        # Concurrency guards (docs/infrastructure.md "Concurrency"): intake is capped by its mapping, the Lambda
        # worker reserves its maximum (settings.reserved_concurrency), so a burst waits in its queue instead of
        # being throttled (throttled invocations burn receives and page the DLQ alarm).
        self.intake_fn.function.add_event_source(event_sources.SqsEventSource(
            self.intake.queue, batch_size=p.functions.intake_batch_size,
            max_concurrency=p.functions.intake_max_concurrency, report_batch_item_failures=True))

        if settings.worker_kind == "lambda":
            self.worker_fn.function.add_event_source(event_sources.SqsEventSource(
                self.analysis.queue, batch_size=p.functions.worker_batch_size, max_concurrency=p.functions.worker_max_concurrency,
                report_batch_item_failures=True))
        self.aggregator_fn.function.add_event_source(event_sources.SqsEventSource(
            self.results.queue, batch_size=p.functions.aggregator_batch_size, report_batch_item_failures=True))

        # The sweeper and the collector each run one at a time (reserved concurrency 1: settings.reserved_concurrency)
        # on their own schedule, so batch work never delays the stall reconciler. A run that fails, times out or is
        # throttled behind a run still going is not tried again: the next scheduled run is due within one interval.
        minutes = sweep_rate_minutes(p.recovery.sweep_interval_s)
        self.sweep_rule = self._schedule("SweepSchedule", self.sweeper_fn, minutes,
                                         "Run the sweeper: reclaim lapsed claims, explain dead-lettered chunks")
        self.collect_rule = self._schedule("CollectSchedule", self.collector_fn, minutes,
                                           "Run the batch collector: pack, submit and collect Bedrock batch jobs")

        # ---- grants (least privilege, per role: permissions.ACCESS) ----------------------
        arns = self.arns()
        grant_access(self.intake_fn.role, arns, ACCESS["intake"])
        grant_access(self.worker_fn.role, arns, ACCESS["worker"])
        for model_id in (self.settings.model_id, *self.settings.model_fallbacks):  # invoke + describe the model
            grant_bedrock(self.worker_fn.role, self, model_id)  # (`-c model_id`) and those jobs kept (`model_fallbacks`)
        if self.model_profile is not None:  # the calls go through the stack's application profile
            self.model_profile.grant_invoke(self.worker_fn.role)
            self.worker_fn.function.add_environment(OPTION_ENV["invoke_model_id"], self.model_profile.arn)
        grant_access(self.aggregator_fn.role, arns, ACCESS["aggregator"])
        grant_access(self.sweeper_fn.role, arns, ACCESS["sweeper"])
        grant_quota_read(self.sweeper_fn.role, self, self.settings.model_id)  # it publishes the quotas the workers pace to
        grant_access(self.collector_fn.role, arns, ACCESS["collector"])
        # the collector submits, tracks and stops batch jobs (Deps.batch_inference): Bedrock's batch calls, passing it the
        # service role, and the stack's tag on every job it creates (only jobs carrying it may be stopped)
        grant_batch_submit(self.collector_fn.role, self, self.batch.role, self.settings.model_id,
                           tag=(COST_TAG_KEY, settings.stack_name))
        self.collector_fn.function.add_environment(OPTION_ENV["batch_role_arn"], self.batch.role.role_arn)
        self.collector_fn.function.add_environment(OPTION_ENV["stack_tag"], settings.stack_name)
        grant_access(self.api_fn.role, arns, ACCESS["api"])
        # the ticket system's credentials: only the roles that run the saga (permissions.SIDE_EFFECTS) call it
        self.ticket_callers: list[iam.IGrantable] = [self.aggregator_fn.role, self.sweeper_fn.role]

        # ---- Fargate alternative ---------------------------------------------------------
        self.fargate: FargateWorker | None = None
        if settings.worker_kind == "fargate":
            self.fargate = FargateWorker(
                self, "FargateWorker", queue=self.analysis.queue,
                environment={**self.function_environment("fargate"), "POWERTOOLS_SERVICE_NAME": "worker",
                             **({OPTION_ENV["invoke_model_id"]: self.model_profile.arn} if self.model_profile else {}),
                             "POWERTOOLS_METRICS_NAMESPACE": M.NAMESPACE, "LOG_LEVEL": log_level},
                memory_mb=p.functions.worker_memory_mb, max_tasks=p.functions.worker_max_concurrency,
                stop_timeout_s=p.fargate.fargate_stop_timeout_s, log_retention_days=p.record_ttl_days,
                removal_policy=removal, base_image=settings.fargate_base_image,
            )
            # the poller runs the worker and the sweep in-process, and is its own event source
            grant_access(self.fargate.task_role, arns, ACCESS["fargate"])
            for model_id in (self.settings.model_id, *self.settings.model_fallbacks):
                grant_bedrock(self.fargate.task_role, self, model_id)
            if self.model_profile is not None:
                self.model_profile.grant_invoke(self.fargate.task_role)
            self.ticket_callers.append(self.fargate.task_role)  # its in-process sweep compensates tickets
        if settings.ticket_secret_arn:
            secret = settings.ticket_secret_resource
            if not secret.startswith("arn:"):  # a bare name: that secret in this stack's account and region
                secret = self.format_arn(service="secretsmanager", resource="secret", resource_name=secret,
                                         arn_format=ArnFormat.COLON_RESOURCE_NAME)
            for caller in self.ticket_callers:
                grant_ticket_secret(caller, self, secret, settings.ticket_secret_kms_key)

        # ---- alarms and dashboard (the queue alarms live with their queues) -------------
        self.monitoring = Monitoring(
            self, "Monitoring", profile=p, action=alarm_action, notice_action=self.notice_topic.action,
            functions={f.service: f.function for f in self.pipeline_functions},
            queues=[self.intake, self.analysis, self.results], model=self.model_watch(),
        )

        self._outputs()
        nag.acknowledge(self)

    def _schedule(self, construct_id: str, fn: PipelineFunction, minutes: int, description: str) -> events.Rule:
        """`fn` every `minutes`, one run at a time, no asynchronous retries: Lambda's (EventInvokeConfig) and
        EventBridge's (the target's retry policy) are 0, and an event older than one interval is dropped."""
        interval = Duration.minutes(minutes)
        fn.function.configure_async_invoke(retry_attempts=0, max_event_age=interval)
        return events.Rule(self, construct_id, description=description, schedule=events.Schedule.rate(interval),
                           targets=[targets.LambdaFunction(fn.function, retry_attempts=0, max_event_age=interval)])

    # ------------------------------------------------------------------ environment
    def resource_values(self) -> dict[str, str]:
        """`config.RESOURCES` field -> this stack's value (a CloudFormation token)."""
        t, q = self.tables, (self.intake, self.analysis, self.results)
        values = {
            "jobs_table": t.jobs.table_name,
            "claims_table": t.claims.table_name,
            "checkpoints_table": t.checkpoints.table_name,
            "events_table": t.events.table_name,
            "bucket": self.storage.bucket.bucket_name,
            "intake_queue_url": q[0].queue.queue_url,
            "analysis_queue_url": q[1].queue.queue_url,
            "results_queue_url": q[2].queue.queue_url,
            "intake_dlq_url": q[0].dlq.queue_url,
            "analysis_dlq_url": q[1].dlq.queue_url,
            "results_dlq_url": q[2].dlq.queue_url,
            "idempotency_table": self.side_effects.idempotency.table_name,
            "job_events_topic_arn": self.side_effects.topic.topic_arn,
            "compensation_dlq_url": self.side_effects.compensation_dlq.queue_url,
            "control_table": t.control.table_name,
            "token_ledger_table": t.token_ledger.table_name,
        }
        unknown = {r.field for r in RESOURCES} ^ set(values)
        if unknown:  # config.RESOURCES changed: the template must follow, or handlers break at cold start
            raise ValueError(f"infra and config.RESOURCES disagree on: {sorted(unknown)}")
        return values

    def model_watch(self) -> ModelWatch:
        """The spend and token alarms' inputs: the daily spend cap; with the Bedrock provider, the application profile,
        the quota known at synth (-c model_tpm, else the profile's; else none: read at runtime), prices and burndown."""
        s, p = self.settings, self.settings.profile
        if self.model_profile is None:
            return ModelWatch(cap_usd=p.limits.daily_spend_cap_usd)
        price = model_price(p.prices, s.model_id).price
        return ModelWatch(
            cap_usd=p.limits.daily_spend_cap_usd, profile_arn=self.model_profile.arn,
            tokens_per_minute=s.model_tpm or p.quota.model_tokens_per_minute,
            output_burndown=traits_for(s.model_id).output_burndown,
            usd_per_token={M.BEDROCK_INPUT_TOKENS: float(price.input_per_1k) / 1000,
                           M.BEDROCK_OUTPUT_TOKENS: float(price.output_per_1k) / 1000,
                           M.BEDROCK_CACHE_READ_TOKENS: float(price.cache_read_per_1k) / 1000,
                           M.BEDROCK_CACHE_WRITE_TOKENS: float(price.cache_write_per_1k) / 1000} if price else None)

    def function_environment(self, worker_kind: str) -> dict[str, str]:
        """Every resource's variable plus the options (FAULT_SPEC only when a fault spec is given)."""
        s = self.settings
        values = self.resource_values()
        env = {r.env: values[r.field] for r in RESOURCES}
        env.update({OPTION_ENV["profile"]: s.profile.name, OPTION_ENV["model_provider"]: s.model_provider,
                    OPTION_ENV["model_id"]: s.model_id, OPTION_ENV["worker_kind"]: worker_kind})
        if s.fault_spec is not None:
            env[OPTION_ENV["fault_spec"]] = s.fault_spec.to_env()
        if s.model_fallbacks:  # `-c model_fallbacks=ID,ID`: the other models granted (jobs keep their model)
            env[OPTION_ENV["model_fallbacks"]] = ",".join(s.model_fallbacks)
        if s.model_tpm:  # `-c model_tpm=N`; without it the workers read the quota from Service Quotas
            env[OPTION_ENV["model_tpm"]] = f"{s.model_tpm:.0f}" if s.model_tpm.is_integer() else str(s.model_tpm)
        if s.profile_overrides:  # the fleet sized at deploy (config/fleet.py), the spend limits given: the functions'
            env[PROFILE_OVERRIDES_ENV] = json.dumps(s.profile_overrides, sort_keys=True)  # profile matches the stack
        if s.queue_uploads_prefix != UPLOADS_PREFIX:  # `-c queue_uploads_prefix`: the queue path's documents
            env[OPTION_ENV["queue_uploads_prefix"]] = s.queue_uploads_prefix
        if s.ticket_url:  # the external ticket system (`-c ticket_url=...`); without it the ticket step is skipped
            env[OPTION_ENV["ticket_url"]] = s.ticket_url
        if s.ticket_secret_arn:  # its credentials (`-c ticket_secret_arn=...`), read by the functions that call it
            env[OPTION_ENV["ticket_secret_arn"]] = s.ticket_secret_arn
        return env

    # ------------------------------------------------------------------ grants
    @property
    def pipeline_functions(self) -> list[PipelineFunction]:
        return [self.intake_fn, self.worker_fn, self.aggregator_fn, self.sweeper_fn, self.collector_fn, self.api_fn]

    def arns(self) -> dict[str, str]:
        """The resource keys of `permissions.ACCESS` -> ARNs in this stack."""
        t, bucket = self.tables, self.storage.bucket
        out = {f"table:{name}": table.table_arn for name, table in
               (("jobs", t.jobs), ("claims", t.claims), ("checkpoints", t.checkpoints), ("events", t.events),
                ("token-ledger", t.token_ledger), ("control", t.control))}
        out[LEASE_INDEX] = f"{t.claims.table_arn}/index/{CLAIMS_LEASE_INDEX}"
        out[OPEN_JOBS_INDEX] = f"{t.jobs.table_arn}/index/{JOBS_OPEN_INDEX}"
        out["bucket"] = bucket.bucket_arn
        out.update({f"objects:{prefix}": bucket.arn_for_objects(f"{prefix}*") for prefix in PREFIXES})
        out[PRINCIPAL_UPLOADS] = bucket.arn_for_objects(f"{PRINCIPAL_UPLOADS_PREFIX}*")
        out.update({f"objects:{prefix}": bucket.arn_for_objects(f"{prefix}*")  # under batch/ (permissions.BATCH_*)
                    for prefix in (BATCH_PENDING_PREFIX, BATCH_ANSWERS_PREFIX, BATCH_JOBS_PREFIX, BATCH_OPEN_PREFIX)})
        for q in (self.intake, self.analysis, self.results):
            out[f"queue:{q.rules.purpose}"] = q.queue.queue_arn
            out[f"dlq:{q.rules.purpose}"] = q.dlq.queue_arn
        fx = self.side_effects
        out.update({"table:idempotency": fx.idempotency.table_arn, "topic:job-events": fx.topic.topic_arn,
                    "bus:default": self.format_arn(service="events", resource="event-bus", resource_name="default"),
                    "dlq:compensation": fx.compensation_dlq.queue_arn})
        return out

    # ------------------------------------------------------------------ outputs
    def _outputs(self) -> None:
        # CfnOutputs at stack scope keep their ids as logical ids (no hash suffix).
        values = self.resource_values()
        outputs = {r.output: (values[r.field], r.description) for r in RESOURCES}
        outputs.update({
            "IntakeQueueArn": (self.intake.queue.queue_arn, "intake queue ARN"),
            "AnalysisQueueArn": (self.analysis.queue.queue_arn, "analysis queue ARN"),
            "ResultsQueueArn": (self.results.queue.queue_arn, "results queue ARN"),
            "IntakeFunctionName": (self.intake_fn.function.function_name, "intake function"),
            "WorkerFunctionName": (self.worker_fn.function.function_name, "worker function"),
            "AggregatorFunctionName": (self.aggregator_fn.function.function_name, "aggregator function"),
            "SweeperFunctionName": (self.sweeper_fn.function.function_name, "sweeper function"),
            "CollectorFunctionName": (self.collector_fn.function.function_name, "batch collector function"),
            "ApiFunctionName": (self.api_fn.function.function_name, "Job API function"),
            "ApiUrl": (self.job_api.url, "Job API base URL (HTTP API, IAM authorization; docs/openapi.yaml)"),
            "ProfileName": (self.settings.profile.name, "config profile this stack was built from"),
            "WorkerKind": (self.settings.worker_kind, "analysis worker: lambda or fargate"),
            OPTION_OUTPUTS["model_provider"]: (self.settings.model_provider, "model provider: bedrock, or offline (the rule model)"),
            OPTION_OUTPUTS["model_id"]: (self.settings.model_id, "Bedrock model or inference profile id (used when ModelProvider "
                                                "is bedrock; `review preflight` checks it)"),
            "AlarmTopicArn": (self.alarm_topic.topic.topic_arn, "SNS topic of the alarms that need a person now "
                                                                "(subscribe your pager to it)"),
            "NoticeTopicArn": (self.notice_topic.topic.topic_arn, "SNS topic of the alarms that need no one now "
                                                                  "(backpressure, throttles, near a cap or quota)"),
            "DashboardName": (self.monitoring.dashboard.dashboard_name, "CloudWatch dashboard of the pipeline"),
            "SdkLayerArn": (self.sdk_layer.layer_version_arn, "the functions' SDK layer (boto3/botocore as pinned; its "
                                                              "description names them, `review preflight` checks it)"),
            OPTION_OUTPUTS["batch_role_arn"]: (self.batch.role.role_arn, "the role Bedrock assumes to run this stack's "
                                               "batch inference jobs (BATCH_ROLE_ARN of the collector)"),
            OPTION_OUTPUTS["queue_uploads_prefix"]: (self.settings.queue_uploads_prefix, "where senders to the intake "
                                                     "queue put the documents they name by s3_uri (review submit "
                                                     "uploads there)"),
        })
        # `review preflight` checks the account's unreserved concurrency against it
        outputs["ReservedConcurrency"] = (str(sum(self.settings.reserved_concurrency.values())),
                                          "Lambda concurrency this stack reserves: the worker's (cdk deploy -c "
                                          "worker_reserved_concurrency), 1 for the sweeper, 1 for the batch "
                                          "collector; the account must keep 100 unreserved")
        if self.settings.ticket_url:  # the CLI's side effects (`review compensations --redrive`) reach the same system
            outputs[OPTION_OUTPUTS["ticket_url"]] = (self.settings.ticket_url, "external ticket system (-c ticket_url)")
            if self.settings.ticket_secret_arn:
                outputs[OPTION_OUTPUTS["ticket_secret_arn"]] = (self.settings.ticket_secret_arn,
                                                                "its credentials' secret (-c ticket_secret_arn)")
        if self.settings.profile_overrides:  # the CLI's profile (its budget check, `review status`) matches the stack's
            outputs[PROFILE_OVERRIDES_OUTPUT] = (json.dumps(self.settings.profile_overrides, sort_keys=True),
                                                 "profile fields this deploy changed (-c)")
        if self.settings.model_fallbacks:  # the CLI's chain (`review model use` refuses a model the deploy does not grant)
            outputs[OPTION_OUTPUTS["model_fallbacks"]] = (",".join(self.settings.model_fallbacks),
                                                          "the other models the workers may call (-c model_fallbacks): "
                                                          "a job falls back to them in this order")
        if self.model_profile is not None:
            outputs["ModelProfileArn"] = (self.model_profile.arn, "the application inference profile the workers call "
                                          "the model through (tagged review-stack for cost; infra/inference.py)")
        if self.settings.model_tpm:  # `review preflight` says what the workers pace to
            outputs["ModelTpm"] = (f"{self.settings.model_tpm:.0f}", "tokens per minute the workers pace to "
                                                                     "(cdk deploy -c model_tpm)")
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)
