from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.config import metrics as M
from contract_review.domain import log_fields
from contract_review.pipeline.collector import collect

from . import deps, observe, tracing
from .telemetry import emit

logger = observe(Logger(service="collector"))
tracer = tracing.tracer("collector")
metrics = Metrics(service="collector")  # namespace from POWERTOOLS_METRICS_NAMESPACE


@metrics.log_metrics
@logger.inject_lambda_context
@tracing.capture_handler(tracer)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The batch collector (pipeline/collector.py), on its own schedule, one run at a time."""
    with log_fields.bound(log_fields.job_fields(step="collect")):
        run = collect(deps())
    report = run.batch
    # Published on every run, zero included. Items whose handling raised (logged one by one as "collector item
    # failed"): the CollectorItemFailures alarm.
    emit(metrics, M.COLLECTOR_ITEM_FAILURES, len(run.item_failures))
    emit(metrics, M.BATCH_JOBS_SUBMITTED, len(report.submitted))
    emit(metrics, M.BATCH_JOBS_COLLECTED, len(report.collected))
    emit(metrics, M.BATCH_JOBS_RUNNING, report.running)
    emit(metrics, M.BATCH_CHUNKS_ON_DEMAND, len(report.on_demand))
    # Batch jobs Bedrock refused for good (batch.refused: the model's batch lane is now off): the BatchRefused alarm.
    emit(metrics, M.BATCH_JOBS_REFUSED, len(report.refused))
    summary = {"submitted": report.submitted, "collected": report.collected, "running": report.running,
               "on_demand": report.on_demand, "waiting_records": report.waiting_records, "refused": report.refused,
               "retrying": report.retrying, "stopped": report.stopped, "released": report.released,
               "resent": report.resent, "paused": report.paused, "item_failures": run.item_failures}
    logger.info("collect", extra=summary)
    return summary
