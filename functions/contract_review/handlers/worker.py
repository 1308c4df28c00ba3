from __future__ import annotations

import functools
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.domain import log_fields
from contract_review.domain.messages import AnalysisMessage
from contract_review.pipeline.worker import ChunkWorker, Delivery, Tier2

from ..wiring import build_chunk_worker
from . import build_traced_model, deps, model, observe, session, settings, tracing
from .telemetry import record_attempt

logger = observe(Logger(service="worker"))
tracer = tracing.tracer("worker")
metrics = Metrics(service="worker")  # namespace from POWERTOOLS_METRICS_NAMESPACE
# A tier-2 hand-off is a normal outcome, not a function error (batch size 1 would make it one).
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)


@functools.cache
def chunk_worker() -> ChunkWorker:
    # one per process: its pacers, its daily hold; another model's, for a job recorded on it, built when first needed
    return build_chunk_worker(settings(), deps(), model(), lambda other: build_traced_model(other, session()))


def record_handler(record: SQSRecord, context: LambdaContext) -> None:
    w = chunk_worker()
    msg = AnalysisMessage.model_validate_json(record.body)
    delivery = Delivery(message_id=record.message_id, receipt_handle=record.receipt_handle,
                        receive_count=int(record.attributes.approximate_receive_count),
                        visibility_s=w.s.profile.queues.analysis_visibility_s,
                        remaining_ms=context.get_remaining_time_in_millis)
    with log_fields.bound(log_fields.job_fields(job_id=msg.job_id, chunk_id=msg.chunk_id, step="analysis",
                                                queue="analysis", attempt=delivery.receive_count,
                                                external_ids={"sqs_message_id": record.message_id})), \
            tracing.span("chunk"):  # the record's calls under one annotated subsegment (a batch holds several)
        try:
            outcome = w.handle(msg, delivery)
        except Tier2 as exc:
            record_attempt(metrics, exc.stats, tier2_code=exc.envelope.error_code)
            logger.warning("chunk handed to tier 2 (queue redelivery)",
                           extra={"error_code": exc.envelope.error_code, "tier": 2,
                                  "tier1_retries": dict(exc.stats.retries)})
            raise
        record_attempt(metrics, outcome.stats, action=outcome.action, reason=str(outcome.detail.get("reason") or ""))
        logger.info("chunk processed", extra={"outcome": outcome.action, **outcome.detail,
                                              "tier1_retries": dict(outcome.stats.retries)})


@metrics.log_metrics
@logger.inject_lambda_context
@tracing.capture_handler(tracer)
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=functools.partial(record_handler, context=context),
                                    processor=processor, context=context)
