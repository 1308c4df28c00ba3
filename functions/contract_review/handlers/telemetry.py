"""The one way our code publishes a metric (`emit`, a row of config/metrics.py: name, unit and dimensions from the
catalogue, so a misspelt name does not compile into an alarm that never fires), and the worker's metrics, one
definition for the worker Lambda and the Fargate poller (both publish as `service=worker` in namespace
`ContractReview`; infra/monitoring.py alarms and graphs them).

Per attempt: `ModelCalls`, `Tier1Retries`, `SemanticRepairs`; per outcome: `BackpressureRequeues`
(a chunk requeued under backpressure), `PriorityDeferrals` (a bulk chunk sent back to give way to interactive
work, pipeline/priority.py) or `Tier2Handoffs` (handed to the queue's redelivery); and
`Retries` by error code and tier (dimensions service, tier, code: one EMF line each; the codes come
from the error registry, so the set of dimension values is bounded).
"""

from __future__ import annotations

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from contract_review.config import metrics as M
from contract_review.config.metrics import Metric
from contract_review.reliability.retry import RetryStats


def emit(metrics: Metrics, metric: Metric, value: float, **dimensions: str) -> None:
    """One datapoint of `metric` (its publisher's `metrics`, whose service is the row's). A metric with dimensions
    beyond `service` is its own EMF line, with `dimensions` giving each one's value (a KeyError names one missing)."""
    extra = metric.dimensions[1:]
    if not extra:
        metrics.add_metric(name=metric.name, unit=MetricUnit(metric.unit), value=value)
        return
    with single_metric(name=metric.name, unit=MetricUnit(metric.unit), value=value, namespace=metrics.namespace,
                       default_dimensions={"service": str(metrics.service)}) as m:
        for name in extra:
            m.add_dimension(name=name, value=dimensions[name])


def record_attempt(metrics: Metrics, stats: RetryStats, *, action: str | None = None,
                   tier2_code: str | None = None, reason: str | None = None) -> None:
    """`action`: the worker's outcome (None when the attempt was handed to tier 2 as `tier2_code`)."""
    emit(metrics, M.MODEL_CALLS, stats.calls)
    emit(metrics, M.TIER1_RETRIES, sum(stats.retries.values()))
    emit(metrics, M.SEMANTIC_REPAIRS, stats.repairs)
    if action == "deferred":  # a bulk chunk gave way to interactive work (pipeline/priority.py)
        emit(metrics, M.PRIORITY_DEFERRALS, 1)
    if action == "requeued":
        emit(metrics, M.BACKPRESSURE_REQUEUES, 1)
        if reason == "model.circuit_open":  # the model's circuit breaker was open (breaker.py)
            emit(metrics, M.CIRCUIT_OPEN, 1)
    by_code = [("1", code, n) for code, n in sorted(stats.retries.items()) if n]
    if tier2_code is not None:
        emit(metrics, M.TIER2_HANDOFFS, 1)
        by_code.append(("2", tier2_code, 1))
    for tier, code, n in by_code:
        emit(metrics, M.RETRIES, n, tier=tier, code=code)
