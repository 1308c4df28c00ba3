from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.config import metrics as M
from contract_review.domain import log_fields
from contract_review.domain.messages import ResultMessage, parse_results_body
from contract_review.domain.records import TERMINAL_JOB_STATES
from contract_review.pipeline.aggregator import handle_message

from . import deps, invocation, observe, receive_count, tracing
from .telemetry import emit

logger = observe(Logger(service="aggregator"))
tracer = tracing.tracer("aggregator")
metrics = Metrics(service="aggregator")  # namespace from POWERTOOLS_METRICS_NAMESPACE
# FIFO: after a failure the rest of *that job's* messages in the batch are returned too (order
# kept per message group); other jobs' messages in the batch still go through.
processor = SqsFifoPartialProcessor(skip_group_on_error=True)
ENDED = {s.value for s in TERMINAL_JOB_STATES}


def record_handler(record: SQSRecord) -> None:
    msg = parse_results_body(record.body)
    chunk_id = msg.chunk_id if isinstance(msg, ResultMessage) else None
    with log_fields.bound(log_fields.job_fields(job_id=msg.job_id, chunk_id=chunk_id, step="aggregate", queue="results",
                                                attempt=receive_count(record),
                                                external_ids={"sqs_message_id": record.message_id})), \
            tracing.span("result"):
        outcome = handle_message(deps(), msg)
        about = {"status": msg.status} if isinstance(msg, ResultMessage) else {"control": msg.control}
        logger.info("result processed", extra={**about, "outcome": outcome})
    if outcome in ENDED:  # this result ended the job: how long it took, submit to end (dashboard)
        job = deps().jobs.get(msg.job_id)
        if job is not None and job.ended_at is not None:
            emit(metrics, M.JOB_DURATION, round(job.ended_at - job.created_at, 3))
            emit(metrics, M.JOBS_ENDED[outcome], 1)


@metrics.log_metrics
@logger.inject_lambda_context
@tracing.capture_handler(tracer)
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    invocation.context = context  # the saga's in-progress records expire with this invocation
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
