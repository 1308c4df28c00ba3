"""The catalogue of metrics: every metric our code publishes, and every AWS metric an alarm or the dashboard reads,
with its namespace, unit and dimensions. One row per series: a name two services publish (`BackpressureRequeues`, by
the worker and by the sweeper) is two rows, as CloudWatch keeps them apart by their `service` dimension.

Ours are Powertools EMF lines in namespace `ContractReview` (the functions' POWERTOOLS_METRICS_NAMESPACE, the Fargate
poller's too) whose first dimension is `service`, the Powertools service name of the publisher (`worker` for the
worker Lambda and the Fargate poller alike). AWS's (`AWS/Lambda`, `AWS/SQS`, `AWS/Bedrock`) have no publisher of ours;
they are here so that every metric the template reads has one row to be checked against.

Who reads the rows, so that a misspelt name fails a test instead of an alarm that never fires:
- the handlers publish ours through `handlers/telemetry.emit` (name, unit and extra dimensions from the row);
- infra/monitoring.py builds every alarm's and dashboard widget's metric of ours, Lambda's recursion count and
  Bedrock's token counts from the rows (the queues' and functions' own CDK helpers name the other AWS metrics);
- docs/runbook.md's alarm table names each alarm's metrics;
- tests/infra/test_metric_catalogue.py holds the synthesized templates (alarms and dashboard) and the runbook's table
  to this catalogue, and every row of ours to an emitter; tests/unit/handlers/test_telemetry.py reads the handlers'
  EMF lines against the rows (namespace, unit, dimensions).

Adding a metric: a row here (its constant), an `emit` where it happens, and, when it is alarmed or graphed, its use in
infra/monitoring.py and its alarm's row in docs/runbook.md.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "ContractReview"  # POWERTOOLS_METRICS_NAMESPACE of every function and the Fargate task (infra/functions.py)


@dataclass(frozen=True)
class Metric:
    """One series: `name` in `namespace`, published by `service` (ours: the Powertools service name, the value of the
    first dimension; AWS's: None), with `unit` (a Powertools `MetricUnit` value; AWS's: the unit AWS publishes it
    in) and the names of its dimensions (ours: `service` first, then any the emitter adds per datapoint)."""

    name: str
    service: str | None
    about: str
    unit: str = "Count"
    namespace: str = NAMESPACE
    dimensions: tuple[str, ...] = ("service",)

    @property
    def ours(self) -> bool:
        return self.service is not None


def _aws(namespace: str, dimension: str, name: str, about: str, unit: str = "Count") -> Metric:
    return Metric(name, None, about, unit=unit, namespace=namespace, dimensions=(dimension,))


# ---------------------------------------------------------------- ours: the worker (Lambda and Fargate poller)
MODEL_CALLS = Metric("ModelCalls", "worker", "model calls of one chunk attempt, retries included")
TIER1_RETRIES = Metric("Tier1Retries", "worker", "in-process (tier-1) retries of one chunk attempt")
SEMANTIC_REPAIRS = Metric("SemanticRepairs", "worker", "model answers sent back for repair in one chunk attempt")
PRIORITY_DEFERRALS = Metric("PriorityDeferrals", "worker",
                            "a bulk chunk sent back to give way to interactive work (pipeline/priority.py)")
BACKPRESSURE_REQUEUES = Metric("BackpressureRequeues", "worker", "a chunk requeued under backpressure (throttling)")
CIRCUIT_OPEN = Metric("CircuitOpen", "worker", "a chunk requeued because the model's circuit breaker was open")
TIER2_HANDOFFS = Metric("Tier2Handoffs", "worker", "a chunk attempt handed to the queue's redelivery (tier 2)")
RETRIES = Metric("Retries", "worker", "retries by error code and tier (tier 1: in process; tier 2: a handoff)",
                 dimensions=("service", "tier", "code"))
# ---------------------------------------------------------------- ours: the sweeper, published on every run
STUCK_JOBS = Metric("StuckJobs", "sweeper",
                    "running jobs without progress for stall_after_s that one sweep found (0 included: silence means "
                    "the sweeper is not running)")
SWEEPER_BACKPRESSURE_REQUEUES = Metric("BackpressureRequeues", "sweeper",
                                       "chunks whose Lambda ran out of time, requeued without a failure")
SWEEP_ITEM_FAILURES = Metric("SweepItemFailures", "sweeper", "items a sweep failed on (logged `sweep item failed`)")
DAILY_SPEND = Metric("DailySpendUsd", "sweeper", "the stack's recorded model spend today, USD (when a cap is set)",
                     unit="None")
SPEND_CAP_HELD = Metric("SpendCapHeld", "sweeper", "1 while the daily spend cap holds model calls (when a cap is set)")
# ---------------------------------------------------------------- ours: the aggregator, when a result ends a job
JOB_DURATION = Metric("JobDuration", "aggregator", "seconds from a job's submission to its end", unit="Seconds")
JOBS_COMPLETED = Metric("JobsCompleted", "aggregator", "a job ended `completed`")
JOBS_FAILED = Metric("JobsFailed", "aggregator", "a job ended `failed`")
JOBS_DEAD_LETTERED = Metric("JobsDeadLettered", "aggregator", "a job ended `dead_lettered`")
JOBS_CANCELLED = Metric("JobsCancelled", "aggregator", "a job ended `cancelled`")
# ---------------------------------------------------------------- ours: the batch collector, published on every run
COLLECTOR_ITEM_FAILURES = Metric("CollectorItemFailures", "collector",
                                 "items a collector run failed on (logged `collector item failed`)")
BATCH_JOBS_SUBMITTED = Metric("BatchJobsSubmitted", "collector", "batch inference jobs submitted by one run")
BATCH_JOBS_COLLECTED = Metric("BatchJobsCollected", "collector", "batch inference jobs whose answers one run returned")
BATCH_JOBS_RUNNING = Metric("BatchJobsRunning", "collector", "batch inference jobs running at the end of one run")
BATCH_CHUNKS_ON_DEMAND = Metric("BatchChunksOnDemand", "collector", "chunks one run sent back to on-demand calls")
BATCH_JOBS_REFUSED = Metric("BatchJobsRefused", "collector",
                            "batch inference jobs Bedrock refused for good (batch.refused: the lane is now off)")
# ---------------------------------------------------------------- ours: intake and the Job API
JOBS_CREATED = Metric("JobsCreated", "intake", "an intake message that created a job")
INTAKE_DUPLICATES = Metric("IntakeDuplicates", "intake", "an intake message for a job that already exists")
API_SERVER_ERRORS = Metric("ApiServerErrors", "api", "a Job API request answered 5xx")

# ---------------------------------------------------------------- AWS's, read by the alarms and the dashboard
_LAMBDA, _SQS, _BEDROCK = "AWS/Lambda", "AWS/SQS", "AWS/Bedrock"
LAMBDA_ERRORS = _aws(_LAMBDA, "FunctionName", "Errors", "invocations that failed (exceptions, timeouts)")
LAMBDA_INVOCATIONS = _aws(_LAMBDA, "FunctionName", "Invocations", "invocations")
LAMBDA_THROTTLES = _aws(_LAMBDA, "FunctionName", "Throttles", "invocations throttled (no concurrency left)")
LAMBDA_RECURSION_DROPPED = _aws(_LAMBDA, "FunctionName", "RecursiveInvocationsDropped",
                                "invocations Lambda's recursive-loop detection dropped")
QUEUE_VISIBLE = _aws(_SQS, "QueueName", "ApproximateNumberOfMessagesVisible", "messages waiting in a queue or DLQ")
QUEUE_IN_FLIGHT = _aws(_SQS, "QueueName", "ApproximateNumberOfMessagesNotVisible", "messages received, not deleted")
QUEUE_OLDEST_AGE = _aws(_SQS, "QueueName", "ApproximateAgeOfOldestMessage", "age of the oldest message",
                        unit="Seconds")
BEDROCK_INPUT_TOKENS = _aws(_BEDROCK, "ModelId", "InputTokenCount", "input tokens of a model or inference profile")
BEDROCK_OUTPUT_TOKENS = _aws(_BEDROCK, "ModelId", "OutputTokenCount", "output tokens")
BEDROCK_CACHE_READ_TOKENS = _aws(_BEDROCK, "ModelId", "CacheReadInputTokenCount", "input tokens read from the cache")
BEDROCK_CACHE_WRITE_TOKENS = _aws(_BEDROCK, "ModelId", "CacheWriteInputTokenCount", "input tokens written to the cache")

# Every row above, in the order written (each constant is its one definition).
CATALOGUE: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))
# The aggregator's count of jobs that ended, by the terminal state's value (domain/records.TERMINAL_JOB_STATES).
JOBS_ENDED = {"completed": JOBS_COMPLETED, "failed": JOBS_FAILED, "dead_lettered": JOBS_DEAD_LETTERED,
              "cancelled": JOBS_CANCELLED}


def find(namespace: str, name: str, dimensions: dict[str, str]) -> Metric | None:
    """The row of a series as CloudWatch names it (`dimensions`: name -> value; only `service`'s value matters)."""
    for m in CATALOGUE:
        if (m.namespace, m.name, set(m.dimensions)) == (namespace, name, set(dimensions)) and (
                not m.ours or dimensions.get("service") == m.service):
            return m
    return None


def render_markdown() -> str:
    """The catalogue as docs/metrics.md shows it."""
    lines = ["# Metrics", "",
             "Generated from `functions/contract_review/config/metrics.py` (`python -m contract_review.config.metrics "
             "> docs/metrics.md`): every metric our code publishes (namespace `ContractReview`, Powertools EMF), and "
             "every AWS metric an alarm or the dashboard reads. The alarms that read them: "
             "[runbook.md](runbook.md#alarms-and-what-to-do).",
             "", "| namespace | metric | service | dimensions | unit | what it counts |", "|---|---|---|---|---|---|"]
    lines += [f"| {m.namespace} | `{m.name}` | {m.service or '-'} | {', '.join(m.dimensions)} | {m.unit} | {m.about} |"
              for m in CATALOGUE]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
