from __future__ import annotations

import functools
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..messages import AnalysisMessage
from ..worker import ChunkWorker, Delivery, Tier2
from . import deps

logger = Logger(service="worker")
processor = BatchProcessor(event_type=EventType.SQS)


@functools.cache
def chunk_worker() -> ChunkWorker:
    d = deps()
    return ChunkWorker(d.store, d.model())


def record_handler(record: SQSRecord, context: LambdaContext) -> None:
    w = chunk_worker()
    msg = AnalysisMessage.model_validate_json(record.body)
    delivery = Delivery(message_id=record.message_id, receipt_handle=record.receipt_handle,
                        receive_count=int(record.attributes.approximate_receive_count),
                        queue_url=w.s.analysis_queue_url, visibility_s=w.s.profile.analysis_visibility_s,
                        remaining_ms=context.get_remaining_time_in_millis)
    log = {"job_id": msg.job_id, "chunk_id": msg.chunk_id, "receive_count": delivery.receive_count}
    try:
        outcome = w.handle(msg, delivery)
    except Tier2 as exc:
        logger.warning("chunk handed to tier 2", extra={**log, "error_code": exc.envelope.error_code, "tier": 2})
        raise
    logger.info("chunk processed", extra={**log, "outcome": outcome.action, **outcome.detail})


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=functools.partial(record_handler, context=context),
                                    processor=processor, context=context)
