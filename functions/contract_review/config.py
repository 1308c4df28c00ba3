"""The one config object.

`Profile` holds every number the infrastructure and the runtime share (timeouts, receive
counts, leases, retry policy). `infra/` builds the template from a profile; the template passes
the profile *name* and the resource names to the functions as environment variables; handlers
turn that environment into `Settings` once, at cold start, and hand it to the core.
Nothing else reads `os.environ`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, model_validator

LAMBDA_VISIBILITY_FACTOR = 6  # AWS: queue visibility >= 6 x function timeout for Lambda ESMs
OFFLINE_MODEL_ID = "offline-rules-v1"  # the deterministic rule model (offline_model.py), not an LLM


class RetryPolicy(BaseModel):
    """Tier-1 retry policy: full-jitter exponential backoff."""

    model_config = ConfigDict(frozen=True)

    base_s: float
    cap_s: float
    max_attempts: int


class Profile(BaseModel):
    """Every tunable number of one deployment flavour. See docs/runbook.md for the reasoning."""

    model_config = ConfigDict(frozen=True)

    name: str
    # --- functions -----------------------------------------------------------------------
    intake_timeout_s: int
    worker_timeout_s: int
    aggregator_timeout_s: int
    sweeper_timeout_s: int
    worker_memory_mb: int = 1024
    worker_batch_size: int = 1  # small batches: a whole-invocation timeout returns the batch
    worker_max_concurrency: int = 20  # ESM MaximumConcurrency (2..1000)
    intake_batch_size: int = 5
    aggregator_batch_size: int = 10
    # --- queues --------------------------------------------------------------------------
    analysis_visibility_s: int
    intake_visibility_s: int
    results_visibility_s: int
    # AWS advises >= 5 so that a throttled-but-healthy burst is not dead-lettered; the
    # seed design used 3. Throttling never burns receives here (it is requeued), so 5 real
    # failures of one chunk are needed to dead-letter it.
    max_receive_count: int = 5
    dlq_retention_days: int = 14
    queue_retention_days: int = 4
    dlq_alarm_threshold: int = 3  # messages visible in a DLQ within the alarm period
    dlq_alarm_period_s: int = 300
    # --- recovery ------------------------------------------------------------------------
    claim_lease_s: float  # a claim lapses this long after its last heartbeat
    sweep_interval_s: float  # how often the sweeper looks for lapsed claims
    poison_budget: int = 5  # failed attempts of one chunk before it is dead-lettered
    stall_after_s: float = 1200  # a running job without progress this long is reconciled (> max requeue delay)
    throttle_max_delay_s: int = 900  # SQS DelaySeconds ceiling
    tier2_backoff_base_s: float = 2.0  # a failed record comes back after base * 2**(failures-1) s
    # --- tier 1 --------------------------------------------------------------------------
    model_retry: RetryPolicy
    tool_retry: RetryPolicy
    chunk_retry_budget_s: float  # total tier-1 sleep allowed per chunk attempt
    # --- review --------------------------------------------------------------------------
    chunk_target_chars: int = 4000
    chunk_max_chars: int = 6000
    analyst_count: int = 11
    model_id: str = "anthropic.claude-3-5-sonnet-20240620-v1:0"
    prompt_version: str = "2026-11-01"
    model_read_timeout_s: int = 120  # Fargate poller: no function timeout to respect
    # Lambda worker: a model call is cut off (model.timeout, retried) after this long, and a call is
    # only started when the function has at least this much time left, so no call outlives the
    # invocation (a killed invocation would count as a failure; running out of time must not).
    model_call_timeout_s: int = 20
    checkpoint_inline_max_bytes: int = 100_000  # larger analyst outputs go to S3
    record_ttl_days: int = 30
    # --- Fargate poller alternative -------------------------------------------------------
    fargate_visibility_s: int = 30  # the poller heartbeats this short visibility itself
    fargate_claim_lease_s: float = 20
    fargate_sweep_interval_s: float = 10  # each poller also sweeps: Fargate recovery <= 20 + 10 = 30 s
    poller_wait_s: int = 10  # SQS long-poll wait of the Fargate poller

    @model_validator(mode="after")
    def _check_rules(self) -> Profile:
        if self.analysis_visibility_s < LAMBDA_VISIBILITY_FACTOR * self.worker_timeout_s:
            raise ValueError(
                f"profile {self.name}: analysis visibility {self.analysis_visibility_s}s must be "
                f">= {LAMBDA_VISIBILITY_FACTOR} x worker timeout {self.worker_timeout_s}s"
            )
        for fn, t, vis in (
            ("intake", self.intake_timeout_s, self.intake_visibility_s),
            ("aggregator", self.aggregator_timeout_s, self.results_visibility_s),
        ):
            if vis < LAMBDA_VISIBILITY_FACTOR * t:
                raise ValueError(f"profile {self.name}: {fn} visibility must be >= 6 x timeout")
        if self.max_receive_count < 1:
            raise ValueError("max_receive_count must be >= 1")
        if self.claim_lease_s >= self.worker_timeout_s * LAMBDA_VISIBILITY_FACTOR:
            raise ValueError("claim lease must be shorter than the visibility timeout")
        return self

    @property
    def heartbeat_interval_s(self) -> float:
        return self.claim_lease_s / 3

    @property
    def record_ttl_s(self) -> int:
        return self.record_ttl_days * 86400


PROFILES: dict[str, Profile] = {
    "prod": Profile(
        name="prod",
        intake_timeout_s=60,
        worker_timeout_s=50,
        aggregator_timeout_s=120,
        sweeper_timeout_s=60,
        analysis_visibility_s=300,
        intake_visibility_s=360,
        results_visibility_s=720,
        claim_lease_s=30,  # heartbeat every 10 s
        sweep_interval_s=60,  # EventBridge rate(1 minute): Lambda recovery <= lease + sweep = 90 s
        model_retry=RetryPolicy(base_s=1.0, cap_s=30.0, max_attempts=3),
        tool_retry=RetryPolicy(base_s=0.25, cap_s=5.0, max_attempts=5),
        chunk_retry_budget_s=60.0,
    ),
    "local": Profile(
        name="local",
        intake_timeout_s=10,
        worker_timeout_s=20,
        aggregator_timeout_s=10,
        sweeper_timeout_s=10,
        worker_max_concurrency=4,
        analysis_visibility_s=120,  # deliberately long: recovery must come from lease + sweep
        intake_visibility_s=60,
        results_visibility_s=60,
        claim_lease_s=3.0,
        sweep_interval_s=1.0,
        throttle_max_delay_s=2,
        tier2_backoff_base_s=0.5,
        stall_after_s=15,
        model_call_timeout_s=3,
        model_retry=RetryPolicy(base_s=0.02, cap_s=0.2, max_attempts=3),
        tool_retry=RetryPolicy(base_s=0.01, cap_s=0.1, max_attempts=5),
        chunk_retry_budget_s=3.0,
        record_ttl_days=1,
        fargate_visibility_s=10,
        fargate_claim_lease_s=3.0,
        fargate_sweep_interval_s=1.0,
        poller_wait_s=0,  # short polls against moto (its long poll spins while a FIFO group is busy)
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


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
)

# The other environment variables: Settings field -> variable.
OPTION_ENV = {
    "profile": "REVIEW_PROFILE",
    "model_provider": "MODEL_PROVIDER",
    "model_id": "MODEL_ID",
    "fault_spec": "FAULT_SPEC",
    "worker_kind": "WORKER_KIND",
}
ENV: dict[str, str] = {**OPTION_ENV, **{r.field: r.env for r in RESOURCES}}  # every variable, by Settings field
_REQUIRED = {"profile"} | {r.field for r in RESOURCES if r.required}


class FaultSpec(BaseModel):
    """Seeded fault injection for the offline model (demo and tests only; never in prod)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 7
    transient_rate: float = 0.0  # split between throttle / 5xx / timeout
    malformed_rate: float = 0.0
    refusal_rate: float = 0.0
    permanent_code: str | None = None  # e.g. "AccessDeniedException": every call fails so
    always_fail_chunk: str | None = None  # chunk index (as str) or chunk id whose calls always 5xx
    throttle_quota_per_s: float | None = None  # shared quota (token bucket, via a file lock)
    throttle_state_dir: str | None = None
    retry_after_s: float = 0.05
    latency_ms: int = 0
    switch_file: str | None = None  # faults apply only while this file exists (when set)
    call_log: str | None = None  # append one JSON line per model call (tests count calls)

    def to_env(self) -> str:
        return self.model_dump_json(exclude_defaults=True)


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
    model_provider: Literal["offline", "bedrock"] = "offline"
    model_id: str = ""
    fault_spec: FaultSpec | None = None
    worker_kind: Literal["lambda", "fargate"] = "lambda"

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, str], profile: str) -> Settings:
        """From a stack's outputs (the CLI's view of a deployed or local stack)."""
        missing = [r.output for r in RESOURCES if r.output not in outputs]
        if missing:
            raise ValueError(f"stack outputs missing: {', '.join(missing)}")
        return cls.model_validate({"profile": get_profile(profile), **{r.field: outputs[r.output] for r in RESOURCES}})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        missing = [v for k, v in ENV.items() if k in _REQUIRED and not env.get(v)]
        if missing:
            raise ValueError(f"missing environment variables: {', '.join(missing)}")
        values: dict[str, object] = {k: env[v] for k, v in ENV.items() if env.get(v)}
        values["profile"] = get_profile(str(values["profile"]))
        if "fault_spec" in values:
            values["fault_spec"] = FaultSpec.model_validate_json(str(values["fault_spec"]))
        return cls.model_validate(values)

    @property
    def effective_model_id(self) -> str:
        if self.model_provider == "offline":
            return OFFLINE_MODEL_ID
        return self.model_id or self.profile.model_id

    @property
    def model_call_timeout_s(self) -> int:
        return self.profile.model_read_timeout_s if self.worker_kind == "fargate" else self.profile.model_call_timeout_s

    @property
    def claim_lease_s(self) -> float:
        return self.profile.fargate_claim_lease_s if self.worker_kind == "fargate" else self.profile.claim_lease_s

    def analysis_config_hash(self) -> str:
        """Hash of everything that changes an analyst's output: checkpoints are reused only on match."""
        material = {
            "model": self.effective_model_id,
            "provider": self.model_provider,
            "prompt_version": self.profile.prompt_version,
            "analysts": self.profile.analyst_count,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
