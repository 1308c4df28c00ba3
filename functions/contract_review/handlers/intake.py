from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.config import metrics as M
from contract_review.domain import log_fields
from contract_review.pipeline.intake import handle_intake

from . import deps, observe, receive_count, tracing
from .telemetry import emit

logger = observe(Logger(service="intake"))
tracer = tracing.tracer("intake")
metrics = Metrics(namespace=M.NAMESPACE, service="intake")
processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record: SQSRecord) -> None:
    with log_fields.bound(log_fields.job_fields(step="intake", queue="intake",
                                                attempt=receive_count(record),
                                                external_ids={"sqs_message_id": record.message_id})):
        result = handle_intake(deps(), record.body, record.message_id)
        logger.info("intake processed", extra={**log_fields.job_fields(
            job_id=result.job_id, state=result.state, error_code=result.error.error_code if result.error else None),
            "job_created": result.created})
    emit(metrics, M.JOBS_CREATED if result.created else M.INTAKE_DUPLICATES, 1)


@metrics.log_metrics
@logger.inject_lambda_context
@tracing.capture_handler(tracer)
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
