"""The worker's metrics, one definition for the worker Lambda and the Fargate poller (both publish
as `service=worker` in namespace `ContractReview`; infra/monitoring.py alarms and graphs them).

Per attempt: `ModelCalls`, `Tier1Retries`, `SemanticRepairs`; per outcome: `BackpressureRequeues`
(a chunk requeued under backpressure), `PriorityDeferrals` (a bulk chunk sent back to give way to interactive
work, pipeline/priority.py) or `Tier2Handoffs` (handed to the queue's redelivery); and
`Retries` by error code and tier (dimensions service, tier, code: one EMF line each; the codes come
from the error registry, so the set of dimension values is bounded).
"""

from __future__ import annotations

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from contract_review.reliability.retry import RetryStats


def record_attempt(metrics: Metrics, stats: RetryStats, *, action: str | None = None,
                   tier2_code: str | None = None, reason: str | None = None) -> None:
    """`action`: the worker's outcome (None when the attempt was handed to tier 2 as `tier2_code`)."""
    metrics.add_metric(name="ModelCalls", unit=MetricUnit.Count, value=stats.calls)
    metrics.add_metric(name="Tier1Retries", unit=MetricUnit.Count, value=sum(stats.retries.values()))
    metrics.add_metric(name="SemanticRepairs", unit=MetricUnit.Count, value=stats.repairs)
    if action == "deferred":  # a bulk chunk gave way to interactive work (pipeline/priority.py)
        metrics.add_metric(name="PriorityDeferrals", unit=MetricUnit.Count, value=1)
    if action == "requeued":
        metrics.add_metric(name="BackpressureRequeues", unit=MetricUnit.Count, value=1)
        if reason == "model.circuit_open":  # the model's circuit breaker was open (breaker.py)
            metrics.add_metric(name="CircuitOpen", unit=MetricUnit.Count, value=1)
    by_code = [("1", code, n) for code, n in sorted(stats.retries.items()) if n]
    if tier2_code is not None:
        metrics.add_metric(name="Tier2Handoffs", unit=MetricUnit.Count, value=1)
        by_code.append(("2", tier2_code, 1))
    for tier, code, n in by_code:
        with single_metric(name="Retries", unit=MetricUnit.Count, value=n, namespace=metrics.namespace,
                           default_dimensions={"service": str(metrics.service)}) as m:
            m.add_dimension(name="tier", value=tier)
            m.add_dimension(name="code", value=code)
