"""Orchestration prices for the bench: AWS list prices in one dated table, and the pure math over them.

The bench counts AWS requests by (service, operation) at the moto server (bench/quota.py); this module
turns those counts into orchestration dollars per 1,000 model calls, beside Step Functions Standard with
one task state per model call. Model tokens are not orchestration and are not priced here (bench/cost.py).

Prices: one place. SQS, DynamoDB, S3 and Lambda come from the product's dated price table
(`contract_review.config.prices.PRICES`, docs/cost.md: the one a job's cost is computed from); what that table has
no use for (Step Functions Standard, EventBridge, SNS, CloudWatch) is in EXTRA below, US East (N. Virginia),
on-demand, after any free tier, read from the AWS pricing pages as of EXTRA_AS_OF and not re-checked since
(the bench runs offline): check them before quoting a figure as a bill.

How requests become money (`request_usd`):
- SQS: every request at the standard-queue price (FIFO requests cost 25 % more; the counter does not tell
  the queues apart, so the results queue's FIFO requests are priced low by that much); a 64 KB payload
  slice is one request, and every message here is below 64 KB.
- DynamoDB on-demand: one write request unit per write request and one read request unit per read
  request: exact for items up to 1 KB written and 4 KB read strongly, a lower bound for larger items (a
  transactional write costs two units per item, a batch one per item: counted as one).
- S3 Standard: PUT/COPY/POST/LIST at the tier-1 price, GET/HEAD at the tier-2 price, DELETE free.
- Lambda invocations and GB-seconds are compute, not requests: not in this figure (see `LAMBDA`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contract_review.config.prices import PRICES

_T = PRICES  # the product's table (Decimal prices)
EXTRA_AS_OF = "2025-06 (AWS pricing pages, us-east-1; not re-checked since)"
PRICES_AS_OF = f"{_T.as_of} ({_T.region}: SQS, DynamoDB, S3, Lambda; config.PRICES); Step Functions, " \
               f"EventBridge, SNS, CloudWatch: {EXTRA_AS_OF}"
PER_MILLION = 1_000_000

# USD per request, by (service, operation); "*" is the service's default.
USD_PER_REQUEST: dict[tuple[str, str], float] = {
    ("sqs", "*"): float(_T.sqs_standard_per_million) / PER_MILLION,  # standard queue (FIFO costs more)
    ("dynamodb", "write"): float(_T.dynamodb_write_per_million) / PER_MILLION,  # on-demand write request unit
    ("dynamodb", "read"): float(_T.dynamodb_read_per_million) / PER_MILLION,  # on-demand read request unit
    ("s3", "tier1"): float(_T.s3_write_per_1k) / 1_000,  # PUT, COPY, POST, LIST
    ("s3", "tier2"): float(_T.s3_read_per_1k) / 1_000,  # GET, HEAD and the rest
    ("s3", "DeleteObject"): 0.0,
    # EXTRA (not in config.PRICES):
    ("AWSEvents", "*"): 1.00 / PER_MILLION,  # EventBridge custom events (64 KB each)
    ("sns", "*"): 0.50 / PER_MILLION,
    ("query", "Publish"): 0.50 / PER_MILLION,  # SNS over the query protocol
    ("query", "PutMetricData"): 0.01 / 1_000,  # CloudWatch
    ("GraniteServiceVersion20100801", "*"): 0.01 / 1_000,  # CloudWatch over JSON
}
STEP_FUNCTIONS_STANDARD_PER_TRANSITION = 0.025 / 1_000  # USD per state transition (EXTRA)
LAMBDA = {"per_request": float(_T.lambda_request_per_million) / PER_MILLION,
          "per_gb_second": float(_T.lambda_gb_second)}  # compute, not requests: not in the figure

DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
DYNAMODB_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
S3_TIER1 = frozenset({"PutObject", "POST", "CopyObject", "ListObjects", "ListObjectsV2", "CreateMultipartUpload",
                      "UploadPart", "CompleteMultipartUpload"})


def request_usd(service: str, operation: str) -> float | None:
    """The list price of one request, or None when the table has none for it."""
    if service == "dynamodb":
        if operation in DYNAMODB_WRITES:
            return USD_PER_REQUEST[("dynamodb", "write")]
        if operation in DYNAMODB_READS:
            return USD_PER_REQUEST[("dynamodb", "read")]
        return None  # control plane (DescribeTable, ...): not priced per request
    if service == "s3":
        if (service, operation) in USD_PER_REQUEST:
            return USD_PER_REQUEST[(service, operation)]
        return USD_PER_REQUEST[("s3", "tier1" if operation in S3_TIER1 else "tier2")]
    for key in ((service, operation), (service, "*")):
        if key in USD_PER_REQUEST:
            return USD_PER_REQUEST[key]
    return None


@dataclass(frozen=True)
class OrchestrationCost:
    usd: float
    by_service: dict[str, float]
    unpriced: dict[str, int]  # "service.operation" -> requests the table has no price for


def orchestration_usd(requests: Mapping[str, int]) -> OrchestrationCost:
    """Dollars for requests counted as {"service.operation": n}."""
    total, by_service, unpriced = 0.0, dict[str, float](), dict[str, int]()
    for key, n in requests.items():
        service, _, operation = key.partition(".")
        price = request_usd(service, operation)
        if price is None:
            unpriced[key] = n
            continue
        total += n * price
        by_service[service] = by_service.get(service, 0.0) + n * price
    return OrchestrationCost(total, by_service, unpriced)


def usd_per_1k_calls(usd: float, model_calls: int) -> float:
    return usd / max(model_calls, 1) * 1_000


def step_functions_transitions(calls_made: int, chunks: int) -> int:
    """State transitions of a Step Functions Standard execution with one task state per model call (the
    Bedrock service integration, no Lambda): one transition per task attempt (a `Retry` is charged as a
    transition too), a Map iteration's start and end per chunk, and the execution's start, Map state and
    end. A lower bound: no Choice state (e.g. skipping `assess` when nothing was located), no Catch path,
    no result-assembly state."""
    return calls_made + 2 * chunks + 3


def step_functions_usd(calls_made: int, chunks: int) -> float:
    return step_functions_transitions(calls_made, chunks) * STEP_FUNCTIONS_STANDARD_PER_TRANSITION
