from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..sweeper import sweep
from . import deps

logger = Logger(service="sweeper")
metrics = Metrics(service="sweeper")  # namespace from POWERTOOLS_METRICS_NAMESPACE


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = sweep(deps())
    # Published on every run, zero included: the stuck-jobs alarm reads silence as "the sweeper is down".
    metrics.add_metric(name="StuckJobs", unit=MetricUnit.Count, value=report.stalled_jobs)
    # Chunks whose Lambda ran out of time, requeued without a failure: backpressure like the worker's.
    metrics.add_metric(name="BackpressureRequeues", unit=MetricUnit.Count, value=report.backpressure_requeues)
    logger.info("sweep", extra={"requeued": len(report.requeued), "dead_lettered": len(report.dead_lettered),
                                "dlq_seen": report.dlq_seen, "stalled_jobs": report.stalled_jobs,
                                "backpressure_requeues": report.backpressure_requeues})
    return {"requeued": report.requeued, "dead_lettered": report.dead_lettered, "dlq_seen": report.dlq_seen,
            "stalled_jobs": report.stalled_jobs}
