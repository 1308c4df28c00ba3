from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..aggregator import handle_result
from ..messages import ResultMessage
from . import deps

logger = Logger(service="aggregator")
# FIFO: after a failure the rest of *that job's* messages in the batch are returned too (order
# kept per message group); other jobs' messages in the batch still go through.
processor = SqsFifoPartialProcessor(skip_group_on_error=True)


def record_handler(record: SQSRecord) -> None:
    msg = ResultMessage.model_validate_json(record.body)
    outcome = handle_result(deps(), msg)
    logger.info("result processed", extra={"job_id": msg.job_id, "chunk_id": msg.chunk_id, "status": msg.status,
                                           "outcome": outcome})


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
