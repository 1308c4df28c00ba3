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
from decimal import Decimal
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, model_validator

LAMBDA_VISIBILITY_FACTOR = 6  # AWS: queue visibility >= 6 x function timeout for Lambda ESMs
SQS_MAX_VISIBILITY_S = 12 * 3600  # SQS: the longest visibility timeout (queue default or ChangeMessageVisibility)
FARGATE_MAX_STOP_TIMEOUT_S = 120  # ECS: the longest stopTimeout a Fargate container may have
OFFLINE_MODEL_ID = "offline-rules-v1"  # the deterministic rule model (offline_model.py), not an LLM
# SQS: one message, and the sum of one SendMessageBatch, at most 256 KiB (the queues keep the default
# MaximumMessageSize). Sizes are counted in UTF-8 bytes of the body.
SQS_MAX_MESSAGE_BYTES = 262_144
JSON_MAX_BYTES_PER_CHAR = 6  # JSON escapes a control character as \u001f; other characters are <= 4 UTF-8 bytes
ANALYSIS_MESSAGE_FIXED_BYTES = 4_096  # an analysis message without its text: ids, counters, resume_from (generous)


class RetryPolicy(BaseModel):
    """Tier-1 retry policy: full-jitter exponential backoff."""

    model_config = ConfigDict(frozen=True)

    base_s: float
    cap_s: float
    max_attempts: int


class ModelPrice(BaseModel):
    """One model's on-demand list price, USD per 1,000 tokens."""

    model_config = ConfigDict(frozen=True)

    input_per_1k: Decimal
    output_per_1k: Decimal
    cache_read_per_1k: Decimal  # Bedrock prompt caching: tokens read from the cache
    cache_write_per_1k: Decimal  # tokens written to the cache (5-minute TTL)


class PriceTable(BaseModel):
    """The dated list prices a job's cost is computed from (cost.py). docs/cost.md states the date and the
    sources, and a test keeps it equal to this table. Prices change: edit both, with the new date."""

    model_config = ConfigDict(frozen=True)

    as_of: str  # the date the prices were transcribed (ISO)
    region: str  # the region the AWS list prices are for
    # Bedrock, by foundation-model id (an inference profile id is priced as its model: `cost.model_price`)
    models: dict[str, ModelPrice]
    # A model id priced as another one: the offline rule model (not an LLM, free) is priced as the default
    # Bedrock model, so a local run shows what its tokens would cost there.
    priced_as: dict[str, str]
    # Geographic cross-region inference profiles (us., eu., jp., ...) of these models cost this much more than
    # the global profile (AWS: "10% premium" for regional endpoints of Claude Sonnet 4.5 and later).
    regional_premium: Decimal
    regional_premium_models: tuple[str, ...]
    dynamodb_write_per_million: Decimal  # on-demand write request units
    dynamodb_read_per_million: Decimal  # on-demand read request units
    sqs_standard_per_million: Decimal  # requests (64 KB chunks)
    sqs_fifo_per_million: Decimal
    s3_write_per_1k: Decimal  # PUT, COPY, POST, LIST (S3 Standard)
    s3_read_per_1k: Decimal  # GET and all other requests
    lambda_request_per_million: Decimal
    lambda_gb_second: Decimal  # x86, first pricing tier


# Transcribed on 2026-11-22 from https://aws.amazon.com/bedrock/pricing/ (Anthropic, on-demand and prompt
# caching), https://aws.amazon.com/dynamodb/pricing/on-demand/, https://aws.amazon.com/sqs/pricing/,
# https://aws.amazon.com/s3/pricing/ and https://aws.amazon.com/lambda/pricing/ (us-east-1; free tiers left
# out). docs/cost.md repeats them; tests/unit/test_cost.py keeps the two equal.
PRICES = PriceTable(
    as_of="2026-11-22",
    region="us-east-1",
    models={
        "anthropic.claude-sonnet-4-6": ModelPrice(input_per_1k=Decimal("0.003"), output_per_1k=Decimal("0.015"),
                                                  cache_read_per_1k=Decimal("0.0003"),
                                                  cache_write_per_1k=Decimal("0.00375")),
        "anthropic.claude-sonnet-4-5-20250929-v1:0": ModelPrice(
            input_per_1k=Decimal("0.003"), output_per_1k=Decimal("0.015"), cache_read_per_1k=Decimal("0.0003"),
            cache_write_per_1k=Decimal("0.00375")),
        "anthropic.claude-haiku-4-5-20251001-v1:0": ModelPrice(
            input_per_1k=Decimal("0.001"), output_per_1k=Decimal("0.005"), cache_read_per_1k=Decimal("0.0001"),
            cache_write_per_1k=Decimal("0.00125")),
    },
    priced_as={OFFLINE_MODEL_ID: "anthropic.claude-sonnet-4-6"},
    regional_premium=Decimal("0.10"),
    regional_premium_models=("anthropic.claude-sonnet-4-6", "anthropic.claude-sonnet-4-5-20250929-v1:0",
                             "anthropic.claude-haiku-4-5-20251001-v1:0"),
    dynamodb_write_per_million=Decimal("0.625"),
    dynamodb_read_per_million=Decimal("0.125"),
    sqs_standard_per_million=Decimal("0.40"),
    sqs_fifo_per_million=Decimal("0.50"),
    s3_write_per_1k=Decimal("0.005"),
    s3_read_per_1k=Decimal("0.0004"),
    lambda_request_per_million=Decimal("0.20"),
    lambda_gb_second=Decimal("0.0000166667"),
)


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
    dlq_alarm_threshold: int = 1  # one dead letter already makes a job `dead_lettered`
    dlq_alarm_period_s: int = 60
    # --- alarms (infra/monitoring.py; every alarm notifies the stack's alarm topic) -----------
    alarm_period_s: int = 300  # period of the function, backpressure and stuck-job alarms
    intake_age_alarm_s: int = 900  # oldest intake message: intake takes seconds per document
    analysis_age_alarm_s: int = 3600  # oldest chunk message: a backlog of an hour means too few workers
    results_age_alarm_s: int = 900  # oldest results message: the aggregator takes seconds per result
    function_errors_alarm_threshold: int = 1  # errors (incl. timeouts) of one function in a period
    function_throttles_alarm_threshold: int = 1  # throttled invocations of one function in a period
    backpressure_alarm_threshold: int = 100  # backpressure requeues per period ...
    backpressure_alarm_periods: int = 3  # ... sustained this many periods in a row
    stuck_jobs_alarm_threshold: int = 1  # stalled jobs one sweep found (StuckJobs, published by the sweeper)
    # --- recovery ------------------------------------------------------------------------
    claim_lease_s: float  # a claim lapses this long after its last heartbeat
    sweep_interval_s: float  # how often the sweeper looks for lapsed claims
    poison_budget: int = 5  # failed attempts of one chunk before it is dead-lettered
    # A running job without progress this long is reconciled. Longer than any delay a chunk's
    # message is knowingly away for (throttle_max_delay_s, tier2_backoff_max_s): the reconciler
    # skips chunks released within this window, whose message is still on its way.
    stall_after_s: float = 1200
    throttle_max_delay_s: int = 900  # SQS DelaySeconds ceiling
    # Tier 2: a failed record comes back after a jittered min(max, base * 2**(failures-1)) s, in
    # [ceiling/2, ceiling] (prod: 15-30, 30-60, 60-120, 120-240 s for failures 1..4, so the poison
    # budget of 5 spans 225-450 s and a two-minute 5xx burst dead-letters nothing; runbook.md).
    tier2_backoff_base_s: float = 30.0
    tier2_backoff_max_s: float = 600.0
    # Backpressure (throttling, time handoffs, function timeouts) is not failure, but it is bounded:
    # a chunk that makes no progress (no analyst checkpointed) under backpressure for this long is
    # dead-lettered as `runtime.backpressure_exhausted`. Hours: throttling must never fail a job fast.
    backpressure_deadline_s: float = 6 * 3600
    # --- tier 1 --------------------------------------------------------------------------
    model_retry: RetryPolicy
    tool_retry: RetryPolicy
    chunk_retry_budget_s: float  # total tier-1 sleep allowed per chunk attempt
    # --- review --------------------------------------------------------------------------
    chunk_target_chars: int = 4000
    chunk_max_chars: int = 6000  # so an analysis message is at most 6 x 6000 + 4096 bytes, far below SQS's limit
    # --- fan-out and fairness (fanout.py; docs/runbook.md "Large documents and fairness") -------
    # At most `fanout_window` chunks of one job are in flight (sent, not yet counted settled); the
    # aggregator refills the window a page of at least `fanout_page` chunks at a time (or what is left).
    # A job alone keeps every worker busy (window >= worker_max_concurrency) with a page in reserve,
    # and a document submitted behind it waits for at most window - concurrency of its chunks, about
    # one chunk's duration, instead of behind every chunk of a large document.
    fanout_window: int = 40
    fanout_page: int = 10
    analyst_count: int = 11
    # How many of a chunk's analysts run at once (threads in one worker; each still checkpointed and
    # fenced): a chunk takes about two call latencies instead of 2 x analyst_count. 1: one by one.
    analyst_concurrency: int = 11
    # The model's account quotas (`review preflight` prints them). Each worker process paces its calls to
    # its share, quota / worker_max_concurrency, adjusted by AIMD on throttles (adaptive.py; runbook
    # "Riding the model quota"). None: calls are not paced (throttles are still backpressure).
    model_requests_per_minute: float | None = None
    model_tokens_per_minute: float | None = None
    # Circuit breaker per model in each worker (breaker.py): this many failed calls in a row (5xx,
    # timeouts) open it; no call is sent for `breaker_open_s`, then one probe decides.
    breaker_failures: int = 5
    breaker_open_s: float = 30.0
    # The Bedrock model, through its global cross-region inference profile (routes to every commercial
    # region; `us.`/`eu.`/`jp.` profiles keep processing in one geography). Claude Sonnet 4.6 is the
    # newest Sonnet served by Converse with an ARN-versioned id (base id anthropic.claude-sonnet-4-6,
    # profiles global/us/eu/jp): Anthropic, "Claude on Amazon Bedrock (legacy)",
    # https://platform.claude.com/docs/en/build-with-claude/claude-on-amazon-bedrock-legacy; AWS,
    # https://docs.aws.amazon.com/bedrock/latest/userguide/inference-profiles-support.html. Models
    # retire: `cdk deploy -c model_id=ID` picks another without a code change (infra/deploy_settings.py).
    model_id: str = "global.anthropic.claude-sonnet-4-6"
    # 2026-11-22: each analyst's fixed instructions (its categories and the step's task) moved into the system
    # prompt, sent as a cached prefix (Bedrock prompt caching); the user message holds the excerpt only.
    prompt_version: str = "2026-11-22"
    # The list prices a job's cost is computed from (docs/cost.md); see PriceTable.
    prices: PriceTable = PRICES
    # Fargate poller: no function timeout, but a call in flight at SIGTERM must end (and the chunk be
    # released) before ECS's SIGKILL: read timeout + handoff_margin_s <= fargate_stop_timeout_s.
    model_read_timeout_s: int = 100
    # Lambda worker: a model call is cut off (model.timeout, retried) after this long (the Bedrock
    # client's read timeout), and a call is only started when the invocation has at least this plus
    # `handoff_margin_s` left (an analyst, two calls, only with room for both), so no call outlives the
    # invocation; out of time, the chunk is handed back through its checkpoints, not failed. Real
    # Bedrock latency for a findings-sized answer is seconds to tens of seconds: 60 s cuts off only
    # a call that is really stuck.
    model_call_timeout_s: int = 60
    handoff_margin_s: float = 10.0  # time to save a checkpoint, release the chunk and send its message
    # larger analyst outputs go to S3: a checkpoint item holds the outputs of the analysts committed
    # together (up to 11), so 11 of them stay far below DynamoDB's 400 KB
    checkpoint_inline_max_bytes: int = 30_000
    # --- side effects (saga.py) ------------------------------------------------------------
    # The external ticket system: a call's answer is awaited this long; past it, the outcome is unknown
    # and the ticket is looked up by its idempotency key.
    ticket_read_timeout_s: float = 10.0
    approval_ttl_s: float = 7 * 86400  # a job waiting for approval fails (job.approval_expired) after this
    record_ttl_days: int = 30
    # --- Fargate poller alternative -------------------------------------------------------
    fargate_visibility_s: int = 30  # the poller heartbeats this short visibility itself
    fargate_claim_lease_s: float = 20
    fargate_sweep_interval_s: float = 10  # each poller also sweeps: Fargate recovery <= 20 + 10 = 30 s
    poller_wait_s: int = 10  # SQS long-poll wait of the Fargate poller
    # ECS waits this long after SIGTERM before SIGKILL (Fargate allows at most 120 s). A SIGTERMed
    # poller starts no model call that could outlast it (the worker's time check) and releases its
    # chunk, so `model_read_timeout_s` + `handoff_margin_s` must fit within it.
    fargate_stop_timeout_s: int = 120
    fargate_protection_minutes: int = 30  # ECS scale-in protection per busy stretch, refreshed at half

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
        if self.worker_timeout_s < self.analyst_reserve_s:
            raise ValueError(
                f"profile {self.name}: worker timeout {self.worker_timeout_s}s cannot fit one analyst "
                f"(2 x model_call_timeout_s {self.model_call_timeout_s}s + handoff_margin_s {self.handoff_margin_s}s)")
        if not 1 <= self.tier2_backoff_base_s <= self.tier2_backoff_max_s <= min(self.analysis_visibility_s,
                                                                                 SQS_MAX_VISIBILITY_S):
            raise ValueError(f"profile {self.name}: tier-2 backoff must be 1 s <= base <= max <= analysis visibility")
        if self.stall_after_s <= max(self.throttle_max_delay_s, self.tier2_backoff_max_s):
            raise ValueError(f"profile {self.name}: stall_after_s must exceed every delay a chunk message is away for")
        if self.backpressure_deadline_s < 2 * self.throttle_max_delay_s:
            raise ValueError(f"profile {self.name}: the backpressure deadline must allow a few delayed requeues")
        if not 1 <= self.fanout_page <= self.fanout_window:
            raise ValueError(f"profile {self.name}: need 1 <= fanout_page <= fanout_window")
        if self.chunk_max_chars * JSON_MAX_BYTES_PER_CHAR + ANALYSIS_MESSAGE_FIXED_BYTES > SQS_MAX_MESSAGE_BYTES:
            raise ValueError(f"profile {self.name}: chunk_max_chars {self.chunk_max_chars} could make an analysis "
                             f"message over SQS's {SQS_MAX_MESSAGE_BYTES:,} bytes ({JSON_MAX_BYTES_PER_CHAR} bytes a "
                             "character at worst)")
        if not 1 <= self.fargate_stop_timeout_s <= FARGATE_MAX_STOP_TIMEOUT_S:
            raise ValueError(f"fargate_stop_timeout_s must be within 1..{FARGATE_MAX_STOP_TIMEOUT_S}")
        if self.model_read_timeout_s + self.handoff_margin_s > self.fargate_stop_timeout_s:
            raise ValueError(
                f"profile {self.name}: model_read_timeout_s {self.model_read_timeout_s}s + handoff_margin_s "
                f"{self.handoff_margin_s}s must fit the Fargate stop timeout {self.fargate_stop_timeout_s}s "
                "(a call in flight at SIGTERM must end, and its chunk be released, before SIGKILL)")
        return self

    @property
    def heartbeat_interval_s(self) -> float:
        return self.claim_lease_s / 3

    @property
    def analyst_reserve_s(self) -> float:
        """Lambda time an analyst needs before it starts: both its calls (locate, assess) and the handoff."""
        return 2 * self.model_call_timeout_s + self.handoff_margin_s

    @property
    def record_ttl_s(self) -> int:
        return self.record_ttl_days * 86400


PROFILES: dict[str, Profile] = {
    "prod": Profile(
        name="prod",
        intake_timeout_s=60,
        # Sized for real Bedrock latency (seconds to tens of seconds per call): a chunk is 11 analysts
        # x 2 calls, ~220-660 s at 10-30 s a call, so it usually finishes in one 15-minute invocation
        # (the Lambda maximum). A slower chunk is handed back through its checkpoints when less than
        # `analyst_reserve_s` (2 x 60 + 10 = 130 s) is left, never killed mid-call; a function timeout
        # that happens anyway is released by the sweeper without counting a failure (runbook.md).
        worker_timeout_s=900,
        aggregator_timeout_s=120,
        sweeper_timeout_s=60,
        analysis_visibility_s=5400,  # 6 x the worker timeout (Lambda's rule); recovery is lease + sweep
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
        # finalizing a 5 MB document (~1,500 chunks) reads every chunk record and findings object: 10-30 s
        # on moto on 2 busy cores (the sweeper finalizes a stalled job too)
        aggregator_timeout_s=60,
        sweeper_timeout_s=60,
        worker_max_concurrency=4,
        fanout_window=8,  # 2 x the 4 local workers, as in prod
        fanout_page=2,
        analysis_visibility_s=120,  # deliberately long: recovery must come from lease + sweep
        intake_visibility_s=60,
        results_visibility_s=360,  # 6 x the aggregator timeout
        claim_lease_s=3.0,
        sweep_interval_s=1.0,
        throttle_max_delay_s=2,
        tier2_backoff_base_s=1.0,  # tier 2: 1, 1-2, 2-4, 4-8 s: the poison budget spans 8-15 s
        tier2_backoff_max_s=8.0,
        backpressure_deadline_s=20.0,  # seconds, so tests reach it (10 x the longest requeue delay)
        stall_after_s=15,
        model_call_timeout_s=1,  # the offline model answers in milliseconds; tests add latency
        handoff_margin_s=0.5,
        model_retry=RetryPolicy(base_s=0.02, cap_s=0.2, max_attempts=3),
        tool_retry=RetryPolicy(base_s=0.01, cap_s=0.1, max_attempts=5),
        chunk_retry_budget_s=3.0,
        record_ttl_days=1,
        fargate_visibility_s=10,
        fargate_claim_lease_s=3.0,
        fargate_sweep_interval_s=1.0,
        poller_wait_s=0,  # short polls against moto (its long poll spins while a FIFO group is busy)
        breaker_open_s=2.0,
        ticket_read_timeout_s=1.0,  # the local ticket fake holds a "timeout after write" answer for seconds
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
    # the job's side effects (saga.py): Powertools idempotency records, the job-events topic, the compensation DLQ
    Resource("idempotency_table", "IDEMPOTENCY_TABLE", "IdempotencyTableName", "idempotency table (side-effect "
             "outcomes)", required=False),
    Resource("job_events_topic_arn", "JOB_EVENTS_TOPIC_ARN", "JobEventsTopicArn", "job-events SNS topic (\"Review "
             "completed\"; subscribe instead of polling)", required=False),
    Resource("compensation_dlq_url", "COMPENSATION_DLQ_URL", "CompensationDlqUrl", "compensation dead-letter queue",
             required=False),
)

# The other environment variables: Settings field -> variable.
OPTION_ENV = {
    "profile": "REVIEW_PROFILE",
    "model_provider": "MODEL_PROVIDER",
    "model_id": "MODEL_ID",
    "fault_spec": "FAULT_SPEC",
    "worker_kind": "WORKER_KIND",
    "ticket_url": "TICKET_URL",  # the external ticket system's base URL (CDK context `ticket_url`); empty: no tickets
}
# Profile fields changed for one local run (a JSON object; the bench compares settings side by side).
PROFILE_OVERRIDES_ENV = "PROFILE_OVERRIDES"
ENV: dict[str, str] = {**OPTION_ENV, **{r.field: r.env for r in RESOURCES}}  # every variable, by Settings field
_REQUIRED = {"profile"} | {r.field for r in RESOURCES if r.required}


class FaultSpec(BaseModel):
    """Seeded fault injection for the offline model (demo and tests only; never in prod).

    Faults arrive in Bedrock's exact shapes (faults.py). Throttles are HTTP 429 ThrottlingException
    with no Retry-After header (Bedrock sends none), "Too many requests, ..." when a requests-per-minute
    quota is hit and "Too many tokens, ..." when a tokens-per-minute one is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 7
    transient_rate: float = 0.0  # split between throttle / 5xx / timeout
    token_throttle_share: float = 0.5  # of the injected throttles, the share that are tokens-per-minute ones
    malformed_rate: float = 0.0
    refusal_rate: float = 0.0
    permanent_code: str | None = None  # e.g. "AccessDeniedException": every call fails so
    # The share of calls answered with a permanent error (HTTP 400 ValidationException, "Malformed input
    # request": `model.request_invalid`, never retried): the chunk fails and its job ends `failed`.
    permanent_rate: float = 0.0
    always_fail_chunk: str | None = None  # chunk index (as str) or chunk id whose calls always 5xx
    # Quotas shared by every worker process (token buckets in throttle_state_dir, via a file lock):
    throttle_quota_per_s: float | None = None  # requests per second ("Too many requests")
    throttle_tokens_per_s: float | None = None  # tokens per second; a call reserves its input + maxTokens
    # The quotas' window: up to rate x window may be used in a burst (Bedrock's are per minute: 60 s;
    # tests scale time down). Without a Retry-After, a burst-free quota would starve every 2-call analyst.
    throttle_window_s: float = 1.0
    throttle_state_dir: str | None = None
    # Latency of every answered call (throttles are answered at once): a constant `latency_ms`, or a
    # seeded lognormal from its median and 99th percentile (p99 unset: constant at the median).
    latency_ms: int = 0
    latency_median_ms: float = 0.0
    latency_p99_ms: float | None = None
    # 5xx bursts: every process's calls fail with 503/500 for `burst_duration_s` out of every
    # `burst_every_s` seconds (wall clock, at a phase drawn from the seed), like a provider incident.
    burst_every_s: float = 0.0
    burst_duration_s: float = 0.0
    switch_file: str | None = None  # faults apply only while this file exists (when set)
    call_log: str | None = None  # append one JSON line per model call (tests count calls)

    @classmethod
    def simulated_bedrock(cls, state_dir: str, *, requests_per_minute: float, tokens_per_minute: float | None = None,
                          median_ms: float = 500.0, p99_ms: float | None = None, window_s: float = 60.0,
                          **faults: Any) -> FaultSpec:
        """The simulated Bedrock (a stand-in, not Bedrock): per-minute quotas shared by every process in
        `state_dir`, a lognormal latency, and any other fault field (`transient_rate`, bursts, seed)."""
        return cls(throttle_state_dir=state_dir, throttle_quota_per_s=requests_per_minute / 60,
                   throttle_tokens_per_s=tokens_per_minute / 60 if tokens_per_minute else None,
                   throttle_window_s=window_s, latency_median_ms=median_ms, latency_p99_ms=p99_ms, **faults)

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        for name in ("transient_rate", "token_throttle_share", "malformed_rate", "refusal_rate", "permanent_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within 0..1")
        if self.transient_rate + self.malformed_rate + self.refusal_rate + self.permanent_rate > 1.0:
            raise ValueError("transient, malformed, refusal and permanent rates share one roll: their sum must be <= 1")
        if self.latency_ms and self.latency_median_ms:
            raise ValueError("give latency_ms (constant) or latency_median_ms (+ latency_p99_ms), not both")
        if self.latency_p99_ms is not None and not 0 < self.latency_median_ms <= self.latency_p99_ms:
            raise ValueError("latency_p99_ms needs 0 < latency_median_ms <= latency_p99_ms")
        if self.burst_duration_s and not 0 < self.burst_duration_s < self.burst_every_s:
            raise ValueError("5xx bursts need 0 < burst_duration_s < burst_every_s")
        if (self.throttle_quota_per_s or self.throttle_tokens_per_s) and not self.throttle_state_dir:
            raise ValueError("a shared throttle quota needs throttle_state_dir (where the workers share it)")
        return self

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
    idempotency_table: str = ""
    job_events_topic_arn: str = ""
    compensation_dlq_url: str = ""
    ticket_url: str = ""
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
        profile = get_profile(str(values["profile"]))
        if env.get(PROFILE_OVERRIDES_ENV):  # local runs and the bench only: e.g. {"analyst_concurrency": 1}
            profile = Profile.model_validate({**profile.model_dump(), **json.loads(env[PROFILE_OVERRIDES_ENV])})
        values["profile"] = profile
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
