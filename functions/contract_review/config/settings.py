"""What one running process needs: its resources (the one table the stack, the environment and the
CLI's stack lookup are derived from) and its profile. The process entry points (handlers/__init__.py for
Lambda, handlers/poller.py for the Fargate poller) build `Settings` once from the environment; the core never
reads `os.environ`."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from typing import Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, field_validator

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.config.profile import Profile, get_profile


class Resource(NamedTuple):
    """One deployed resource a process needs: how `Settings`, the function environment and the
    stack outputs each name it. The stack, `Settings.from_env` and the CLI's stack lookup are
    all derived from `RESOURCES`."""

    field: str  # Settings field
    env: str  # environment variable the template sets on every function and task
    output: str  # CloudFormation stack output
    description: str
    required: bool = True


RESOURCES: tuple[Resource, ...] = (
    Resource("jobs_table", "JOBS_TABLE", "JobsTableName", "jobs table"),
    Resource("claims_table", "CLAIMS_TABLE", "ClaimsTableName", "claims table (one record per chunk)"),
    Resource("checkpoints_table", "CHECKPOINTS_TABLE", "CheckpointsTableName", "checkpoints table"),
    Resource("events_table", "EVENTS_TABLE", "EventsTableName", "events table"),
    Resource("bucket", "ARTIFACT_BUCKET", "ArtifactBucketName", "artifacts bucket"),
    Resource("intake_queue_url", "INTAKE_QUEUE_URL", "IntakeQueueUrl", "intake queue (documents in)"),
    Resource("analysis_queue_url", "ANALYSIS_QUEUE_URL", "AnalysisQueueUrl", "analysis queue (one message per chunk)"),
    Resource("results_queue_url", "RESULTS_QUEUE_URL", "ResultsQueueUrl", "results queue (FIFO, group = job)"),
    Resource("intake_dlq_url", "INTAKE_DLQ_URL", "IntakeDlqUrl", "intake dead-letter queue", required=False),
    Resource("analysis_dlq_url", "ANALYSIS_DLQ_URL", "AnalysisDlqUrl", "analysis dead-letter queue", required=False),
    Resource("results_dlq_url", "RESULTS_DLQ_URL", "ResultsDlqUrl", "results dead-letter queue (FIFO)",
             required=False),
    # the job's side effects (saga.py): Powertools idempotency records, the job-events topic, the compensation DLQ
    Resource("idempotency_table", "IDEMPOTENCY_TABLE", "IdempotencyTableName", "idempotency table (side-effect "
             "outcomes)", required=False),
    Resource("job_events_topic_arn", "JOB_EVENTS_TOPIC_ARN", "JobEventsTopicArn", "job-events SNS topic (\"Review "
             "completed\"; subscribe instead of polling)", required=False),
    Resource("compensation_dlq_url", "COMPENSATION_DLQ_URL", "CompensationDlqUrl", "compensation dead-letter queue",
             required=False),
    # the runtime control of the model (`review quota`: pause, quota, the batch lane's off switch per model), one item
    # written by compare-and-set (adapters/model_control.py)
    Resource("control_table", "CONTROL_TABLE", "ControlTableName",
             "runtime control table (review quota: pause, resume, set the quota, the batch lane)", required=False),
    # the daily token ledger the workers share (model/daily_quota.py): a counter per model per hour
    Resource("token_ledger_table", "TOKEN_LEDGER_TABLE", "TokenLedgerTableName",
             "daily token ledger table (tokens the model calls counted, per model per hour)", required=False),
)


# The other environment variables: Settings field -> variable.
OPTION_ENV = {
    "profile": "REVIEW_PROFILE",
    "model_provider": "MODEL_PROVIDER",
    "model_id": "MODEL_ID",
    "invoke_model_id": "MODEL_INVOKE_ID",  # the application inference profile the workers call through (its ARN)
    # the other models the deploy grants (CDK context `model_fallbacks`, comma-separated): a job recorded on one of
    # them keeps running on it after the deploy's model changed
    "model_fallbacks": "MODEL_FALLBACKS",
    "fault_spec": "FAULT_SPEC",
    "worker_kind": "WORKER_KIND",
    # the model's tokens-per-minute quota to pace to (CDK context `model_tpm`); empty: read from Service Quotas
    "model_tpm": "MODEL_TPM",
    "ticket_url": "TICKET_URL",  # the external ticket system's base URL (CDK context `ticket_url`); empty: no tickets
    # where senders to the intake queue may put claim-checked documents (CDK context `queue_uploads_prefix`)
    "queue_uploads_prefix": "QUEUE_UPLOADS_PREFIX",
    # the Secrets Manager secret holding its credentials (CDK context `ticket_secret_arn`); empty: none sent
    "ticket_secret_arn": "TICKET_SECRET_ARN",
    # Bedrock batch inference (docs/batch-inference.md): the service role Bedrock assumes to read the records and write
    # the answers (infra/batch.py), set on the function that submits and collects batch jobs (the sweeper) only;
    # empty: no batch inference in this process (Deps.batch_inference is None)
    "batch_role_arn": "BATCH_ROLE_ARN",
    # where the `bedrock` client sends the batch calls: empty in AWS; locally the stand-in's URL
    # (review_local/batch_service.py, which `review up` starts)
    "batch_endpoint_url": "BEDROCK_BATCH_ENDPOINT_URL",
    # the value of the stack's `review-stack` tag (infra/monitoring.py COST_TAG_KEY: the stack's name), set on the
    # function that submits batch jobs: each batch job is tagged with it at create, and only jobs carrying it may be
    # stopped (infra/batch.py); empty: batch jobs are created untagged
    "stack_tag": "STACK_TAG",
}

# Options the CLI reads from a stack's outputs (Settings field -> output), beside RESOURCES; absent: the default.
# The ticket system's: so `review compensations --redrive` (the CLI, with the operator's credentials) reaches it.
# The batch service role: so the CLI (`review preflight`, local operations) submits as the sweeper does; the stand-in's
# URL only on a local stack (review_local/stack.py adds it to the outputs it writes into .review/local.json).
OPTION_OUTPUTS = {"queue_uploads_prefix": "QueueUploadsPrefix", "ticket_url": "TicketUrl",
                  "ticket_secret_arn": "TicketSecretArn", "batch_role_arn": "BatchRoleArn",
                  "batch_endpoint_url": "BatchEndpointUrl", "model_provider": "ModelProvider",
                  "model_id": "ModelId", "model_fallbacks": "ModelFallbacks"}


def ticket_url_problem(url: str) -> str | None:
    """Why `url` cannot be the ticket system's base URL, or None. Credentials go over it, so `https://` is required;
    `http://` only to a loopback host (the local fake, a sidecar). Checked at synth (infra/deploy_settings.py) and by
    the adapter (adapters/tickets.py), so a stack deployed without the check still refuses it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        return f"ticket_url {url!r}: an https URL such as https://tickets.example.com/api"
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        return (f"ticket_url {url!r}: https:// is required (credentials are sent to it); http:// only to a loopback "
                "host (localhost, 127.0.0.1, ::1)")
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Profile fields changed for one local run (a JSON object; the bench compares settings side by side), or by a
# deploy's `-c` options (the fleet, the spend limits): the functions' variable and the stack's output.
PROFILE_OVERRIDES_ENV = "PROFILE_OVERRIDES"
PROFILE_OVERRIDES_OUTPUT = "ProfileOverrides"


ENV: dict[str, str] = {**OPTION_ENV, **{r.field: r.env for r in RESOURCES}}  # every variable, by Settings field


_REQUIRED = {"profile"} | {r.field for r in RESOURCES if r.required}


class Settings(BaseModel):
    """What one running function needs: names of its resources plus the profile."""

    model_config = ConfigDict(frozen=True)

    profile: Profile
    jobs_table: str
    claims_table: str
    checkpoints_table: str
    events_table: str
    bucket: str
    intake_queue_url: str
    analysis_queue_url: str
    results_queue_url: str
    intake_dlq_url: str = ""
    analysis_dlq_url: str = ""
    results_dlq_url: str = ""
    idempotency_table: str = ""
    job_events_topic_arn: str = ""
    compensation_dlq_url: str = ""
    control_table: str = ""
    token_ledger_table: str = ""
    ticket_url: str = ""
    # Where senders to the intake queue (no principal: `review submit`, your own producers) may put documents
    # they name by s3_uri (`-c queue_uploads_prefix=uploads/queue/`). Never `uploads/principals/`: the Job API's
    # callers' own uploads (domain/principals.py), which only their owner's jobs read.
    queue_uploads_prefix: str = "uploads/"
    ticket_secret_arn: str = ""
    batch_role_arn: str = ""  # BATCH_ROLE_ARN: the batch service role's ARN; empty: no batch inference here
    batch_endpoint_url: str = ""  # BEDROCK_BATCH_ENDPOINT_URL: empty in AWS; locally the batch stand-in's URL
    stack_tag: str = ""  # STACK_TAG: the stack's `review-stack` tag value, on the batch jobs it creates
    # The tokens-per-minute quota the workers pace to (`-c model_tpm=N`); None: the profile's, else the model's
    # quota as Service Quotas names it, as the sweeper publishes it (model/quota_targets.py).
    model_tpm: float | None = None
    # offline: the rule model; bedrock: Bedrock; simulated: the strict simulated Bedrock (doubles/bedrock_runtime.py)
    # answering as the rule model under the catalogued `model_id` (local stack and tests only: infra refuses it in prod)
    model_provider: Literal["offline", "bedrock", "simulated"] = "offline"
    model_id: str = ""
    # MODEL_INVOKE_ID: what the workers send as `modelId`, the stack's application inference profile's ARN (tagged for
    # cost: infra/inference.py); empty: model_id itself. The model id stays the key for prices, traits and quotas.
    invoke_model_id: str = ""
    model_fallbacks: tuple[str, ...] = ()  # MODEL_FALLBACKS: the other models this deploy grants (comma-separated)
    # The local doubles' FaultSpec as JSON (doubles/spec.py; wiring parses it): demo, tests and bench only.
    fault_spec: str | None = None
    worker_kind: Literal["lambda", "fargate"] = "lambda"

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, str], profile: str) -> Settings:
        """From a stack's outputs (the CLI's view of a deployed or local stack)."""
        missing = [r.output for r in RESOURCES if r.required and r.output not in outputs]
        if missing:
            raise ValueError(f"stack outputs missing: {', '.join(missing)}")
        named = {**{r.field: r.output for r in RESOURCES}, **OPTION_OUTPUTS}
        base = get_profile(profile)
        if outputs.get(PROFILE_OVERRIDES_OUTPUT):  # the deploy's `-c` changes: the CLI checks what the stack checks
            base = base.with_overrides(**json.loads(outputs[PROFILE_OVERRIDES_OUTPUT]))
        return cls.model_validate({"profile": base,
                                   **{f: outputs[o] for f, o in named.items() if o in outputs}})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        missing = [v for k, v in ENV.items() if k in _REQUIRED and not env.get(v)]
        if missing:
            raise ValueError(f"missing environment variables: {', '.join(missing)}")
        values: dict[str, object] = {k: env[v] for k, v in ENV.items() if env.get(v)}
        profile = get_profile(str(values["profile"]))
        if env.get(PROFILE_OVERRIDES_ENV):  # local runs and the bench only: e.g. {"analyst_concurrency": 1}
            profile = Profile.model_validate({**profile.model_dump(), **json.loads(env[PROFILE_OVERRIDES_ENV])})
        values["profile"] = profile
        return cls.model_validate(values)

    @field_validator("model_fallbacks", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value

    def grants(self, model_id: str) -> bool:
        """Whether this deploy may call `model_id`: its own model or one of its fallbacks (the offline model: any)."""
        return self.model_provider == "offline" or model_id in (self.effective_model_id, *self.model_fallbacks)

    @property
    def model_chain(self) -> tuple[str, ...]:
        """The models this deploy calls, in the order a job falls back through them (pipeline/fallback.py): its model,
        then `-c model_fallbacks` (the offline model: itself only)."""
        if self.model_provider == "offline":
            return (OFFLINE_MODEL_ID,)
        return tuple(dict.fromkeys((self.effective_model_id, *self.model_fallbacks)))

    @property
    def effective_model_id(self) -> str:
        if self.model_provider == "offline":
            return OFFLINE_MODEL_ID
        return self.model_id or self.profile.review.model_id

    @property
    def model_call_timeout_s(self) -> int:
        return self.profile.tier1.model_read_timeout_s if self.worker_kind == "fargate" else self.profile.tier1.model_call_timeout_s

    @property
    def claim_lease_s(self) -> float:
        return self.profile.fargate.fargate_claim_lease_s if self.worker_kind == "fargate" else self.profile.recovery.claim_lease_s
