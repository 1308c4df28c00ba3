"""THE BASELINE, not product code: SQS -> Lambda written with Powertools alone.

What a serverless developer writes from the Powertools docs, with nothing of the pipeline's own machinery:
- one SQS message per chunk, processed with `BatchProcessor` + `process_partial_response` (partial batch
  response: a failed record returns to the queue after its visibility timeout, to the DLQ after
  maxReceiveCount);
- Powertools idempotency (`idempotent_function`, `DynamoDBPersistenceLayer`) on the whole chunk, keyed by
  its chunk id, the Lambda context registered (a crashed invocation's in-progress record expires with it);
- the same analysts (`contract_review.review.analysts.run_analyst`) run one by one, each model call with fixed
  retries (MAX_ATTEMPTS attempts, WAIT_S apart, on what botocore's standard retry mode retries: throttles,
  5xx, read timeouts); no claims, no checkpoints, no heartbeats, no pacing, no circuit breaker;
- the chunk's findings written to S3 (`<prefix>/<chunk index>.json`); the bench counts completion there.

The model is the bench's simulated Bedrock (`FAULT_SPEC`: the offline rule model behind the fault injector,
the same as the pipeline's workers get). Environment: IDEMPOTENCY_TABLE, FINDINGS_BUCKET, FINDINGS_PREFIX,
FAULT_SPEC, ANALYST_COUNT, MODEL_READ_TIMEOUT_S. Run by review_local's sandbox processes (the bench).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import boto3
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.domain.model import ModelClient, ModelRequest
from contract_review.doubles.faults import CallLedger, FaultInjectingModel
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.doubles.spec import FaultSpec
from contract_review.review.analysts import analysts_for, run_analyst
from contract_review.review.chunking import Chunk

MAX_ATTEMPTS = 3  # botocore's standard retry mode: 3 attempts in all
WAIT_S = 0.5  # fixed wait between attempts (one median call latency of the bench's simulated Bedrock)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

processor = BatchProcessor(event_type=EventType.SQS)
persistence_layer = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"])
config = IdempotencyConfig(event_key_jmespath="powertools_json(body).chunk.chunk_id")
s3 = boto3.client("s3")


def _model() -> ModelClient:
    spec = FaultSpec.model_validate_json(os.environ["FAULT_SPEC"])
    model: ModelClient = FaultInjectingModel(OfflineRuleModel(), spec,
                                             read_timeout_s=float(os.environ.get("MODEL_READ_TIMEOUT_S", "1")))
    return CallLedger(model, spec.call_log) if spec.call_log else model


model = _model()


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, ReadTimeoutError):
        return True
    return isinstance(exc, ClientError) and exc.response.get("ResponseMetadata", {}).get(
        "HTTPStatusCode") in RETRYABLE_STATUS


def invoke_with_retries(request: ModelRequest) -> Any:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            return model.invoke(request)
        except (ClientError, ReadTimeoutError) as exc:
            if attempt == MAX_ATTEMPTS or not _retryable(exc):
                raise
            time.sleep(WAIT_S)
    raise AssertionError("unreachable")


def _step(build: Any, parse: Any) -> tuple[Any, int]:
    return parse(invoke_with_retries(build(None))), 1


@idempotent_function(data_keyword_argument="record", config=config, persistence_store=persistence_layer)
def record_handler(record: SQSRecord) -> dict[str, Any]:
    body = json.loads(record.body)
    chunk = Chunk(**body["chunk"])
    findings = []
    for spec in analysts_for(int(os.environ.get("ANALYST_COUNT", "11"))):
        findings.extend(run_analyst(spec, chunk, _step).findings)
    key = f"{os.environ['FINDINGS_PREFIX']}/{chunk.index:06d}.json"
    s3.put_object(Bucket=os.environ["FINDINGS_BUCKET"], Key=key,
                  Body=json.dumps([f.model_dump(mode="json") for f in findings]).encode())
    return {"key": key, "findings": len(findings)}


def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    config.register_lambda_context(context)
    return process_partial_response(event=event, record_handler=record_handler, processor=processor,
                                    context=context)
