"""The scheduled sweeper (pipeline/sweeper.py): one sweep per run, ending before the function's timeout so that its
metrics are published every run (the stuck-jobs alarm reads a missing `StuckJobs` as "the sweeper is not running")."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.config import metrics as M
from contract_review.domain import log_fields
from contract_review.pipeline.sweeper import Deadline, sweep

from . import deps, invocation, observe, tracing
from .telemetry import emit

logger = observe(Logger(service="sweeper"))
tracer = tracing.tracer("sweeper")
metrics = Metrics(service="sweeper")  # namespace from POWERTOOLS_METRICS_NAMESPACE


@metrics.log_metrics
@logger.inject_lambda_context
@tracing.capture_handler(tracer)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.context = context  # the saga's in-progress records expire with this invocation
    d = deps()
    # Past it the sweep starts no item (the next run takes them up) but still counts the stalled jobs.
    deadline = Deadline(lambda: context.get_remaining_time_in_millis() / 1000, d.settings.profile.functions.sweeper_reserve_s)
    with log_fields.bound(log_fields.job_fields(step="sweep")):
        report = sweep(d, deadline=deadline)
    if report.stopped_at:
        logger.warning("sweep reached its deadline", extra={"stopped_at": report.stopped_at,
                                                             "reserve_s": deadline.reserve_s})
    # Published on every run, zero included (a sweep cut short by its deadline too, with what it counted): the
    # stuck-jobs alarm reads silence as "the sweeper is down".
    emit(metrics, M.STUCK_JOBS, report.stalled_jobs)
    # Chunks whose Lambda ran out of time, requeued without a failure: backpressure like the worker's.
    emit(metrics, M.SWEEPER_BACKPRESSURE_REQUEUES, report.backpressure_requeues)
    # Items whose handling raised (logged one by one as "sweep item failed"); the sweep went on without them.
    emit(metrics, M.SWEEP_ITEM_FAILURES, len(report.item_failures))
    if report.spend_recorded_micro_usd is not None:  # the stack's daily spend cap (the spend-cap alarm's metrics)
        emit(metrics, M.DAILY_SPEND, report.spend_recorded_micro_usd / 1e6)
        emit(metrics, M.SPEND_CAP_HELD, int(report.spend_held))
    logger.info("sweep", extra={"requeued": len(report.requeued), "dead_lettered": len(report.dead_lettered),
                                "dlq_seen": report.dlq_seen, "stalled_jobs": report.stalled_jobs,
                                "backpressure_requeues": report.backpressure_requeues,
                                "dlq_requeued": len(report.dlq_requeued), "dlq_removed": report.dlq_removed,
                                "chunks_resent": report.chunks_resent,
                                "finalized": report.finalized, "intake_failed": report.intake_failed,
                                "spend_cap_started": report.spend_cap_started, "spend_held": report.spend_held,
                                "quotas_published": report.quotas_published, "item_failures": report.item_failures,
                                "stopped_at": report.stopped_at})
    return {"requeued": report.requeued, "dead_lettered": report.dead_lettered, "dlq_seen": report.dlq_seen,
            "stalled_jobs": report.stalled_jobs, "dlq_requeued": report.dlq_requeued,
            "chunks_resent": report.chunks_resent,
            "finalized": report.finalized, "intake_failed": report.intake_failed,
            "item_failures": report.item_failures, "stopped_at": report.stopped_at}
