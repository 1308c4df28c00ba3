"""The one config object's numbers.

`Profile` holds every number the infrastructure and the runtime share (timeouts, receive
counts, leases, retry policy). `infra/` builds the template from a profile; the template passes
the profile *name* and the resource names to the functions as environment variables; the process
entry points turn that environment into `Settings` (settings.py) once, and hand it to the core.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract_review.config.catalogue import DEFAULT_MODEL_ID
from contract_review.config.constants import (
    ANALYSIS_MESSAGE_FIXED_BYTES,
    ESM_MAX_CONCURRENCY,
    ESM_MIN_CONCURRENCY,
    FARGATE_MAX_STOP_TIMEOUT_S,
    JSON_MAX_BYTES_PER_CHAR,
    LAMBDA_VISIBILITY_FACTOR,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_VISIBILITY_S,
)
from contract_review.config.prices import PRICES, PriceTable


class RetryPolicy(BaseModel):
    """Tier-1 retry policy: full-jitter exponential backoff."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_s: float
    cap_s: float
    max_attempts: int


class FunctionsConfig(BaseModel):
    """The Lambda functions: timeouts, memory, batch sizes, the worker's concurrency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intake_timeout_s: int
    worker_timeout_s: int
    aggregator_timeout_s: int
    sweeper_timeout_s: int
    # The sweep starts no item with less than this left of its invocation (pipeline/sweeper.py `Deadline`): the time
    # kept to count the stalled jobs (one query) and publish StuckJobs, which the stuck-jobs alarm needs every run
    sweeper_reserve_s: int = 10
    # The batch collector (handlers/collector.py: packs, submits and collects Bedrock batch jobs), its own function,
    # one run at a time: sized for a batch job of `batch_max_records` (docs/infrastructure.md "The batch collector")
    collector_timeout_s: int = 900
    collector_memory_mb: int = 1024
    worker_memory_mb: int = 1024
    worker_batch_size: int = 1  # small batches: a whole-invocation timeout returns the batch
    worker_max_concurrency: int = 20  # ESM MaximumConcurrency (2..1000); the worker reserves as much (infra)
    intake_batch_size: int = 5
    # The intake mapping's MaximumConcurrency (2..1000): intake is short and cheap, a burst waits in its queue
    # instead of taking the account's unreserved concurrency (docs/infrastructure.md "Concurrency").
    intake_max_concurrency: int = 5
    aggregator_batch_size: int = 10


    @model_validator(mode="after")
    def _check_sweeper_reserve(self) -> FunctionsConfig:
        if not 0 < self.sweeper_reserve_s < self.sweeper_timeout_s:
            raise ValueError(f"sweeper_reserve_s {self.sweeper_reserve_s} must be within 1..sweeper_timeout_s - 1 "
                             f"({self.sweeper_timeout_s - 1}): the sweep keeps it to publish StuckJobs")
        return self

    @model_validator(mode="after")
    def _check_concurrency(self) -> FunctionsConfig:
        for field_name in ("intake_max_concurrency", "worker_max_concurrency"):
            value = getattr(self, field_name)
            if not ESM_MIN_CONCURRENCY <= value <= ESM_MAX_CONCURRENCY:  # the mapping's ScalingConfig limits
                raise ValueError(f"{field_name} {value} must be within {ESM_MIN_CONCURRENCY}..{ESM_MAX_CONCURRENCY} "
                                 "(SQS event source MaximumConcurrency)")
        return self


class QueuesConfig(BaseModel):
    """The queues: visibility timeouts, receives before the DLQ, retention."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    analysis_visibility_s: int
    intake_visibility_s: int
    results_visibility_s: int
    # AWS advises >= 5 so that a throttled-but-healthy burst is not dead-lettered; the
    # seed design used 3. Throttling never burns receives here (it is requeued), so 5 real
    # failures of one chunk are needed to dead-letter it.
    max_receive_count: int = 5
    dlq_retention_days: int = 14
    # 14 days, the SQS maximum, on every queue that holds work: a burst waits its turn in the queue, never past
    # its retention (bench/burst_sim.py: 10,000 contracts at once wait up to 2.4 days on 20 workers, 4 days or
    # more on fewer workers or a smaller quota), and the stall reconciler re-sends a message nearing its end
    # (sweeper.message_lost)
    queue_retention_days: int = 14


class AlarmsConfig(BaseModel):
    """The alarms (infra/monitoring.py; every alarm notifies the stack's alarm topic)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dlq_alarm_threshold: int = 1  # one dead letter already makes a job `dead_lettered`
    dlq_alarm_period_s: int = 60
    alarm_period_s: int = 300  # period of the function, backpressure and stuck-job alarms
    intake_age_alarm_s: int = 900  # oldest intake message: intake takes seconds per document
    analysis_age_alarm_s: int = 3600  # oldest chunk message: a backlog of an hour means too few workers
    results_age_alarm_s: int = 900  # oldest results message: the aggregator takes seconds per result
    # a function's errors (incl. timeouts) as a share of its invocations, this many periods in a row: a fleet that
    # retries has the odd error as ordinary noise (one error in a period used to page someone)
    function_error_rate_percent: float = Field(default=5.0, gt=0, le=100)
    function_error_periods: int = Field(default=3, ge=1)
    function_throttles_alarm_threshold: int = 1  # throttled invocations of one function in a period
    backpressure_alarm_threshold: int = 100  # backpressure requeues per period ...
    backpressure_alarm_periods: int = 3  # ... sustained this many periods in a row
    stuck_jobs_alarm_threshold: int = 1  # stalled jobs one sweep found (StuckJobs, published by the sweeper)
    # items one sweep or collector run failed on (SweepItemFailures, CollectorItemFailures: logged one by one)
    item_failures_alarm_threshold: int = 1


class RecoveryConfig(BaseModel):
    """Recovery: leases, sweeps, the poison budget, tier-2 backoff, backpressure bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class Tier1Config(BaseModel):
    """Tier 1: retries inside the worker, and the time a model call may take."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_retry: RetryPolicy
    tool_retry: RetryPolicy
    chunk_retry_budget_s: float  # total tier-1 sleep allowed per chunk attempt
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


class ReviewConfig(BaseModel):
    """The review: chunk sizes, the analysts, the model and its prompts, checkpoints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk_target_chars: int = 4000
    chunk_max_chars: int = 6000  # so an analysis message is at most 6 x 6000 + 4096 bytes, far below SQS's limit
    # A chunk shorter than this takes the next paragraphs too (up to chunk_max_chars), so that its cached prefix
    # (the tool-use prompt, the tool, the shared instructions: ~1,270 tokens, then the excerpt at ~4 characters a
    # token) reaches the model's minimum cacheable prefix: 2,048 tokens assumed for Sonnet 4.6
    # (domain/model.py MODEL_TRAITS; tests/unit/review/test_chunking.py checks it with a margin). A document's last
    # chunk can still be shorter: its calls send no cache point (docs/cost.md).
    chunk_min_chars: int = 3600
    # How many of the analysts (review/analysts.py ANALYSTS, in order) a job runs; the job pins it. Every
    # profile runs all of them (tests/unit/review/test_analysts.py checks it against ANALYSTS): a number here because
    # the per-chunk work the worker timeout and `analyst_concurrency` are sized for grows with it.
    analyst_count: int = 11
    # How many of a chunk's analysts run at once (threads in one worker; each still checkpointed and
    # fenced): a chunk takes about two call latencies instead of 2 x analyst_count. 1: one by one.
    analyst_concurrency: int = 11
    # The Bedrock model, through its global cross-region inference profile (routes to every commercial region;
    # `us.`/`eu.`/`jp.` profiles keep processing in one geography): the catalogue's default (config/catalogue.py,
    # which says why it is the one). Models retire: `cdk deploy -c model_id=ID` picks another catalogued one without
    # a code change (infra/deploy_settings.py).
    model_id: str = DEFAULT_MODEL_ID
    # A label shown on jobs and reports. Checkpoints do not depend on it: each analyst's are matched on its
    # analysis identity, derived from the prompts, categories and schemas themselves (review/analysts.py).
    # 2026-11-25: one cached prefix per chunk (one tool for both steps, the shared instructions with every
    # category, the excerpt), then the cache point, then the analyst's categories and step (docs/cost.md).
    prompt_version: str = "2026-11-25"
    # larger analyst outputs go to S3: a checkpoint item holds the outputs of the analysts committed
    # together (up to 11), so 11 of them stay far below DynamoDB's 400 KB
    checkpoint_inline_max_bytes: int = 30_000


class FanoutConfig(BaseModel):
    """Fan-out and fairness (pipeline/fanout.py; docs/runbook.md "Large documents and fairness")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # At most `fanout_window` chunks of one job are in flight (sent, not yet counted settled); the
    # aggregator refills the window a page of at least `fanout_page` chunks at a time (or what is left).
    # A job alone keeps every worker busy (window >= worker_max_concurrency) with a page in reserve,
    # and a document submitted behind it waits for at most window - concurrency of its chunks, about
    # one chunk's duration, instead of behind every chunk of a large document.
    fanout_window: int = 40
    fanout_page: int = 10
    # Interactive before bulk (pipeline/priority.py): while a running interactive job has chunks not settled, a
    # worker sends a bulk chunk it receives back delayed `bulk_defer_s`, doubling at each deferral (at most 900 s),
    # at most `bulk_max_deferrals` times a chunk, so bulk work waits at most the sum of those delays (the starvation
    # bound: 5 + 10 + ... + 160 = 315 s by default). Whether interactive work is open is asked for each bulk chunk
    # received (the open-jobs index: a query and a batched read); once it is, a worker process keeps that answer
    # for `interactive_check_s`, then reads that one interactive job again.
    bulk_defer_s: int = Field(default=5, ge=1, le=900)  # SQS DelaySeconds: at most 900
    bulk_max_deferrals: int = Field(default=6, ge=0, le=20)
    interactive_check_s: float = Field(default=2.0, gt=0)


class QuotaConfig(BaseModel):
    """The model's quota and the circuit breaker (model/pacing.py, model/breaker.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The model's account quotas (`review preflight` prints them). Each worker process paces its calls to
    # its share, quota / worker_max_concurrency, adjusted by AIMD on throttles (model/pacing.py; runbook
    # "Riding the model quota"). None: calls are not paced (throttles are still backpressure).
    model_requests_per_minute: float | None = None
    model_tokens_per_minute: float | None = None
    # Circuit breaker per model in each worker (breaker.py): this many failed calls in a row (5xx,
    # timeouts) open it; no call is sent for `breaker_open_s`, then one probe decides.
    breaker_failures: int = 5
    breaker_open_s: float = 30.0
    # How long a worker keeps the operator's model control (`review quota`: a pause, a quota) before reading it
    # again: a pause stops new model calls within about this long.
    model_control_max_age_s: float = 60.0
    # The tokens-per-minute quota a Bedrock worker paces to before it has read the quota the sweeper publishes (the
    # first sweep after the first deploy; the control table unreadable since the process started), or when Service
    # Quotas names none for the model (model/quota_targets.py): low, so a worker is never unpaced and never rides a
    # quota it does not know; the daily hold meanwhile is a day at this rate. Not used when -c model_tpm or the
    # profile's model_tokens_per_minute gives the quota.
    quota_fallback_tokens_per_minute: float = Field(100_000.0, gt=0)
    # The model's daily token quota, held client-side with the daily token ledger (model/daily_quota.py; runbook
    # "Daily token quota exhausted"): the quota (None: Service Quotas' "Model invocation max tokens per day for
    # <model>" as the sweeper publishes it: model/quota_targets.py), the share of it at which calls are held, how long
    # a read of the ledger is used, how often a worker writes what its calls counted, and the ledger's bucket:
    # an hour (24 of them are the window; one probe call per bucket while held).
    model_tokens_per_day: float | None = None
    daily_quota_threshold: float = Field(0.98, gt=0, le=1)
    daily_ledger_max_age_s: float = Field(60.0, ge=0)
    daily_ledger_flush_s: float = Field(60.0, ge=0)
    daily_ledger_bucket_s: float = Field(3600.0, gt=0)
    # A job held this long by its model's own daily token quota moves to the next model of the deploy's fallback
    # chain (`-c model_fallbacks`; pipeline/fallback.py), if it has one; None: it waits for the quota. Only the
    # model's own quota: the account's quota across models is one no fallback escapes.
    fallback_after_daily_hold_s: float | None = Field(3600.0, gt=0)


class SideEffectsConfig(BaseModel):
    """The job's side effects (sideeffects/saga.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The external ticket system: a call's answer is awaited this long; past it, the outcome is unknown
    # and the ticket is looked up by its idempotency key.
    ticket_read_timeout_s: float = 10.0
    # The ticket system's credentials (the secret `-c ticket_secret_arn` names) are cached this long by
    # Powertools' parameters utility; a 401/403 fetches them again at once (a rotation needs no redeploy).
    ticket_secret_max_age_s: int = 300
    # tier-1 attempts of one side-effect call (a step; a compensation) before the saga gives up on it (a step:
    # the job fails with sideeffect.failed; a compensation: it goes to the compensation DLQ), at tool_retry's
    # backoff (domain/policy.py `tier1_policy`)
    side_effect_attempts: int = 4
    compensation_attempts: int = 5
    approval_ttl_s: float = 7 * 86400  # a job waiting for approval fails (job.approval_expired) after this


class LimitsConfig(BaseModel):
    """Spend limits (docs/cost.md "Spend limits"): what one job, and one Job API principal, may cost or ask."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # A job sent without `budget_usd` gets this budget (`-c default_budget_usd=N`): refused before any model call
    # when its estimate is over it (job.budget_insufficient), stopped when its recorded cost reaches it. None: none.
    default_budget_usd: float | None = Field(None, gt=0, le=1_000_000)
    # What one Job API principal may admit in a UTC day, at the jobs' estimates (`-c principal_daily_spend_usd=N`):
    # a submission over it is refused (quota.spend_exceeded, 429) before it is queued. None: no cap.
    principal_daily_spend_usd: float | None = Field(None, gt=0)
    # What the whole stack may spend on the model in a UTC day, whoever sends the work (`-c daily_spend_cap_usd=N`;
    # domain/spend_cap.py, docs/cost.md "The stack's daily spend cap"): admissions take their estimates from it (over
    # it: the Job API answers 429, a queued job waits for the next day), and when the day's recorded spend reaches
    # it the model is held until 00:00 UTC. None: no cap.
    daily_spend_cap_usd: float | None = Field(None, gt=0)
    # Job API requests one principal may make a minute, counted in the function (an HTTP API has no per-client
    # throttling or usage plans): more is api.rate_limited (429, Retry-After). None: the stage-wide throttle only.
    api_requests_per_minute: int | None = Field(None, gt=0)


class BatchConfig(BaseModel):
    """Bedrock batch inference for jobs sent with `inference: batch` (docs/batch-inference.md): how their chunks'
    model calls are packed into batch jobs, how long they wait, and when they go on-demand instead."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Records a batch job must hold at least (Bedrock's Service Quota, 100 by default). None: read from Service
    # Quotas at cold start (model/quotas.py `read_batch_quota`), 100 when it cannot be read.
    batch_min_records: int | None = Field(None, ge=1)
    batch_max_records: int = Field(10_000, ge=1)  # records we put in one batch job (its quota is 50,000)
    # How long a chunk's records wait for others to reach the minimum before its chunk goes on-demand. None: until
    # its job's deadline less `batch_expected_s` (a small job waits for others as long as its deadline allows)
    batch_max_wait_s: float | None = Field(None, ge=0)
    # How long a batch job is assumed to take: a job whose deadline is nearer than this goes on-demand
    batch_expected_s: float = Field(24 * 3600.0, ge=0)
    batch_timeout_hours: int = Field(24, ge=24, le=168)  # CreateModelInvocationJob timeoutDurationInHours
    # A chunk whose records failed (or went missing) in this many batch jobs goes on-demand
    batch_max_failures: int = Field(2, ge=1)
    batch_default_deadline_hours: float = Field(72.0, gt=0)  # a batch-mode job's deadline when it names none


class FargateConfig(BaseModel):
    """The Fargate poller alternative (handlers/poller.py, infra/fargate.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fargate_visibility_s: int = 30  # the poller heartbeats this short visibility itself
    fargate_claim_lease_s: float = 20
    fargate_sweep_interval_s: float = 10  # each poller also sweeps: Fargate recovery <= 20 + 10 = 30 s
    poller_wait_s: int = 10  # SQS long-poll wait of the Fargate poller
    # ECS waits this long after SIGTERM before SIGKILL (Fargate allows at most 120 s). A SIGTERMed
    # poller starts no model call that could outlast it (the worker's time check) and releases its
    # chunk, so `model_read_timeout_s` + `handoff_margin_s` must fit within it.
    fargate_stop_timeout_s: int = 120
    fargate_protection_minutes: int = 30  # ECS scale-in protection per busy stretch, refreshed at half


class Profile(BaseModel):
    """Every tunable number of one deployment flavour, in groups (`profile.recovery.claim_lease_s`). See
    docs/runbook.md for the reasoning.

    Flat field names keep working wherever a profile is built from data (`PROFILE_OVERRIDES`, CDK context,
    `from_flat`, `with_overrides`): each is routed to its group (`FLAT_FIELDS`), a flat value winning over the
    group's. One validator checks the rules across groups."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    # The list prices a job's cost is computed from (docs/cost.md); see PriceTable.
    prices: PriceTable = PRICES
    record_ttl_days: int = 30
    functions: FunctionsConfig
    queues: QueuesConfig
    alarms: AlarmsConfig = AlarmsConfig()
    recovery: RecoveryConfig
    tier1: Tier1Config
    review: ReviewConfig = ReviewConfig()
    fanout: FanoutConfig = FanoutConfig()
    quota: QuotaConfig = QuotaConfig()
    side_effects: SideEffectsConfig = SideEffectsConfig()
    limits: LimitsConfig = LimitsConfig()
    fargate: FargateConfig = FargateConfig()
    batch: BatchConfig = BatchConfig()

    @model_validator(mode="before")
    @classmethod
    def _route_flat_fields(cls, data: Any) -> Any:
        """`{"claim_lease_s": 3}` -> `{"recovery": {..., "claim_lease_s": 3}}`, the flat value winning."""
        if not isinstance(data, dict) or not FLAT_FIELDS.keys() & data.keys():
            return data
        routed: dict[str, object] = {k: v for k, v in data.items() if k not in FLAT_FIELDS}
        for key, value in data.items():
            if key in FLAT_FIELDS:
                given = routed.get(FLAT_FIELDS[key])
                group = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})  # type: ignore[call-overload]  # a mapping, or pydantic rejects it below
                routed[FLAT_FIELDS[key]] = {**group, key: value}
        return routed

    @classmethod
    def from_flat(cls, **fields: Any) -> Profile:
        """A profile from flat field names (the profiles below, tests)."""
        return cls.model_validate(fields)

    def flat(self) -> dict[str, object]:
        """Every field by its flat name (the groups' fields and the top-level ones)."""
        out = self.model_dump(exclude=set(FLAT_FIELDS.values()))
        for group in dict.fromkeys(FLAT_FIELDS.values()):
            out.update(getattr(self, group).model_dump())
        return out

    def with_overrides(self, **fields: Any) -> Profile:
        """This profile with some fields (flat names) changed, validated again."""
        return type(self).model_validate({**self.model_dump(), **fields})

    @model_validator(mode="after")
    def _check_rules(self) -> Profile:
        if self.queues.analysis_visibility_s < LAMBDA_VISIBILITY_FACTOR * self.functions.worker_timeout_s:
            raise ValueError(
                f"profile {self.name}: analysis visibility {self.queues.analysis_visibility_s}s must be "
                f">= {LAMBDA_VISIBILITY_FACTOR} x worker timeout {self.functions.worker_timeout_s}s"
            )
        for fn, t, vis in (
            ("intake", self.functions.intake_timeout_s, self.queues.intake_visibility_s),
            ("aggregator", self.functions.aggregator_timeout_s, self.queues.results_visibility_s),
        ):
            if vis < LAMBDA_VISIBILITY_FACTOR * t:
                raise ValueError(f"profile {self.name}: {fn} visibility must be >= 6 x timeout")
        if self.queues.max_receive_count < 1:
            raise ValueError("max_receive_count must be >= 1")
        if self.recovery.claim_lease_s >= self.functions.worker_timeout_s * LAMBDA_VISIBILITY_FACTOR:
            raise ValueError("claim lease must be shorter than the visibility timeout")
        if self.functions.worker_timeout_s < self.analyst_reserve_s:
            raise ValueError(
                f"profile {self.name}: worker timeout {self.functions.worker_timeout_s}s cannot fit one analyst "
                f"(2 x model_call_timeout_s {self.tier1.model_call_timeout_s}s + handoff_margin_s {self.tier1.handoff_margin_s}s)")
        if not 1 <= self.recovery.tier2_backoff_base_s <= self.recovery.tier2_backoff_max_s <= min(self.queues.analysis_visibility_s,
                                                                                 SQS_MAX_VISIBILITY_S):
            raise ValueError(f"profile {self.name}: tier-2 backoff must be 1 s <= base <= max <= analysis visibility")
        if self.recovery.stall_after_s <= max(self.recovery.throttle_max_delay_s, self.recovery.tier2_backoff_max_s):
            raise ValueError(f"profile {self.name}: stall_after_s must exceed every delay a chunk message is away for")
        if self.recovery.backpressure_deadline_s < 2 * self.recovery.throttle_max_delay_s:
            raise ValueError(f"profile {self.name}: the backpressure deadline must allow a few delayed requeues")
        if not 1 <= self.fanout.fanout_page <= self.fanout.fanout_window:
            raise ValueError(f"profile {self.name}: need 1 <= fanout_page <= fanout_window")
        if not 0 <= self.review.chunk_min_chars <= self.review.chunk_target_chars <= self.review.chunk_max_chars:
            raise ValueError(f"profile {self.name}: need 0 <= chunk_min_chars <= chunk_target_chars <= chunk_max_chars")
        if self.review.chunk_max_chars * JSON_MAX_BYTES_PER_CHAR + ANALYSIS_MESSAGE_FIXED_BYTES > SQS_MAX_MESSAGE_BYTES:
            raise ValueError(f"profile {self.name}: chunk_max_chars {self.review.chunk_max_chars} could make an analysis "
                             f"message over SQS's {SQS_MAX_MESSAGE_BYTES:,} bytes ({JSON_MAX_BYTES_PER_CHAR} bytes a "
                             "character at worst)")
        if not 1 <= self.fargate.fargate_stop_timeout_s <= FARGATE_MAX_STOP_TIMEOUT_S:
            raise ValueError(f"fargate_stop_timeout_s must be within 1..{FARGATE_MAX_STOP_TIMEOUT_S}")
        if self.tier1.model_read_timeout_s + self.tier1.handoff_margin_s > self.fargate.fargate_stop_timeout_s:
            raise ValueError(
                f"profile {self.name}: model_read_timeout_s {self.tier1.model_read_timeout_s}s + handoff_margin_s "
                f"{self.tier1.handoff_margin_s}s must fit the Fargate stop timeout {self.fargate.fargate_stop_timeout_s}s "
                "(a call in flight at SIGTERM must end, and its chunk be released, before SIGKILL)")
        return self

    @property
    def analyst_reserve_s(self) -> float:
        """Lambda time an analyst needs before it starts: both its calls (locate, assess) and the handoff."""
        return 2 * self.tier1.model_call_timeout_s + self.tier1.handoff_margin_s

    @property
    def record_ttl_s(self) -> int:
        return self.record_ttl_days * 86400


# Every grouped field by its flat name -> its group: what `PROFILE_OVERRIDES` and the flat names take.
FLAT_FIELDS: dict[str, str] = {name: group for group in (
    "functions", "queues", "alarms", "recovery", "tier1", "review", "fanout", "quota", "side_effects", "limits",
    "fargate", "batch",
) for name in Profile.model_fields[group].annotation.model_fields}  # type: ignore[union-attr]  # every group is a model

PROFILES: dict[str, Profile] = {
    "prod": Profile.from_flat(
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
        # spend limits (docs/cost.md): a 100 KB contract is about $2 of model tokens on the default model, the
        # largest (5 MB) about $90: those need their own budget_usd
        default_budget_usd=20.0,
        principal_daily_spend_usd=500.0,
        # a quarter of what the default fleet can spend in a day (about $4,000 at $170 an hour: docs/cost.md)
        daily_spend_cap_usd=1000.0,
        api_requests_per_minute=600,
    ),
    "local": Profile.from_flat(
        name="local",
        intake_timeout_s=10,
        worker_timeout_s=20,
        # finalizing a 5 MB document (~1,500 chunks) reads every chunk record and findings object: 10-30 s
        # on moto on 2 busy cores (the sweeper finalizes a stalled job too)
        aggregator_timeout_s=60,
        sweeper_timeout_s=60,
        collector_timeout_s=60,
        worker_max_concurrency=4,
        intake_max_concurrency=2,  # as the local runtime ran intake before the mapping named it
        fanout_window=8,  # 2 x the 4 local workers, as in prod
        fanout_page=2,
        # bulk waits at most 10 + 20 + 40 = 70 s for interactive work (pipeline/priority.py); on moto every
        # deferral's calls share the CPU with the interactive chunks' (bench/priority.py, docs/runbook.md)
        bulk_defer_s=10,
        bulk_max_deferrals=3,
        interactive_check_s=0.25,
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
        model_control_max_age_s=1.0,  # a `review quota pause` on the local stack takes effect within a second
        daily_ledger_max_age_s=1.0,  # the local stack's workers see a full daily token ledger within a second
        daily_ledger_flush_s=1.0,
        fallback_after_daily_hold_s=5.0,  # a local job held by its model's daily quota falls back within seconds
        ticket_read_timeout_s=1.0,  # the local ticket fake holds a "timeout after write" answer for seconds
        ticket_secret_max_age_s=1,  # a credential rotated in the local secret is read within a second
        # the same limits as prod, wider: the local stack's soak and bench submit hundreds of documents at once
        principal_daily_spend_usd=10_000.0,
        daily_spend_cap_usd=100_000.0,
        api_requests_per_minute=6000,
        # batch inference against the local stand-in (review_local/batch_service.py), which `review up` starts
        # with the same minimum: seconds where Bedrock takes hours
        batch_min_records=10,
        batch_max_wait_s=5.0,
        batch_expected_s=30.0,
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


