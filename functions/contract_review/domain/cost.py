"""What a job costs: model tokens x the model's price, plus orchestration requests x AWS list prices.

- `model_price` / `model_micro_usd`: a model's tokens (input, output, cache reads, cache writes, as the
  Converse `usage` reports them) at the profile's dated price table (config.PRICES, docs/cost.md).
- `RequestMeter`: counts the AWS requests a process's code makes, by price class, through a botocore event
  hook on the `Deps` clients (wiring.py). A chunk attempt opens an `AttemptMeter`; the requests of the
  process while it is open (its threads: analysts, heartbeat) are the attempt's. A thread that does other
  work meanwhile (the Fargate poller's sweep loop) says so with `exclude_current_thread`.
- `AttemptMeter.usage`: what the attempt spent, in integer micro-dollars, ready for the chunk record.

Money is integer micro-dollars (USD x 1,000,000) wherever it is stored; prices are `Decimal`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from contract_review.config.prices import ModelPrice, PriceTable
from contract_review.domain.records import Usage

MICRO = Decimal(1_000_000)
_THOUSAND = Decimal(1000)
_MILLION = Decimal(1_000_000)

# Price classes of the requests counted (RequestMeter.classify)
DYNAMODB_WRITE, DYNAMODB_READ = "dynamodb.write", "dynamodb.read"
SQS_STANDARD, SQS_FIFO = "sqs.standard", "sqs.fifo"
S3_WRITE, S3_READ = "s3.write", "s3.read"
LAMBDA_REQUEST = "lambda.request"
FREE = "free"  # control-plane and other requests without a request price (DeleteObject, Describe*)
_DDB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DDB_READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"})
_S3_WRITES = frozenset({"PutObject", "CopyObject", "PostObject", "ListObjects", "ListObjectsV2",
                        "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"})
_S3_READS = frozenset({"GetObject", "HeadObject"})


def micro_usd(usd: Decimal) -> int:
    return int((usd * MICRO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def usd(micro: int) -> Decimal:
    return Decimal(micro) / MICRO


def format_usd(micro: int) -> str:
    """$0.012345 (six places: a single chunk costs fractions of a cent)."""
    return f"${usd(micro):.6f}"


# ------------------------------------------------------------------------------ model tokens
@dataclass(frozen=True)
class PricedModel:
    price: ModelPrice | None  # None: its tokens are counted, not priced (a test's price table only)
    priced_as: str  # the table entry used (the dearest catalogued for a model without a confirmed price)
    premium: Decimal  # the regional inference profile premium applied (0 for global profiles and base ids)


def model_price(table: PriceTable, model_id: str) -> PricedModel:
    """The price of `model_id`: a foundation-model id, a cross-region inference profile id (priced as its
    model, plus the regional premium for a geographic profile of the models that have one), or an id the
    table prices as another (`priced_as`: the offline rule model). A model without a price confirmed on AWS's
    pricing page (a catalogue row's unverified price, an uncatalogued id) is priced at the dearest catalogued price:
    never $0, never cheaper than it may be."""
    from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id, is_inference_profile

    base = table.priced_as.get(model_id) or base_model_id(model_id)
    price = table.models.get(base)
    if price is None:
        return PricedModel(table.unconfirmed, f"{table.unconfirmed_as} (the dearest catalogued price: {base} has no "
                                              "price confirmed on AWS's pricing page)", Decimal(0))
    regional = (is_inference_profile(model_id) and not model_id.startswith(GLOBAL_PROFILE_PREFIX)
                and base in table.regional_premium_models)
    return PricedModel(price, base, table.regional_premium if regional else Decimal(0))


def model_cost_usd(priced: PricedModel, usage: Usage) -> Decimal:
    p = priced.price
    if p is None:
        return Decimal(0)
    per_1k = (usage.input_tokens * p.input_per_1k + usage.output_tokens * p.output_per_1k
              + usage.cache_read_tokens * p.cache_read_per_1k + usage.cache_write_tokens * p.cache_write_per_1k)
    return per_1k / _THOUSAND * (1 + priced.premium)


def batch_cost_usd(priced: PricedModel, usage: Usage) -> Decimal | None:
    """What `usage` costs through Bedrock batch inference (docs/batch-inference.md): input and output tokens at the
    model's batch price, plus the regional premium of a geographic profile as on demand. Cache tokens, which a
    batch job should not report (no cache point in a batch record), are priced as on demand, never less. None when
    the table has no batch price for the model (it is not offered in batch, or its price is unknown)."""
    p = priced.price
    if p is None or p.batch_input_per_1k is None or p.batch_output_per_1k is None:
        return None
    per_1k = (usage.input_tokens * p.batch_input_per_1k + usage.output_tokens * p.batch_output_per_1k
              + usage.cache_read_tokens * p.cache_read_per_1k + usage.cache_write_tokens * p.cache_write_per_1k)
    return per_1k / _THOUSAND * (1 + priced.premium)


def batch_usage(table: PriceTable, model_id: str, usage: Usage) -> Usage | None:
    """`usage` (a batch job's tokens for one chunk or job) with its model cost at the batch price, or None when
    `model_id` has no batch price; orchestration fields unchanged."""
    dollars = batch_cost_usd(model_price(table, model_id), usage)
    if dollars is None:
        return None
    return usage.model_copy(update={"model_micro_usd": micro_usd(dollars)})


# The estimate a budget is checked against before any model call (`estimate_document`): generous on purpose
# (a budget refused at the door costs a resubmission; one passed that the job then overshoots costs money).
ESTIMATE_ANSWER_TOKENS = 300  # an LLM-like answer (the strict double's bench default median is 150; p99 600)
ESTIMATE_ANALYST_PART_TOKENS = 150  # what follows the cache point: the analyst's task, the located clauses


def estimate_document(table: PriceTable, model_id: str, prefix_tokens: Sequence[int],
                      calls_per_chunk: int, min_cache_tokens: int) -> Usage:
    """What reviewing a document is expected to cost (model tokens and their price; orchestration, about 1 %,
    left out): each chunk (its cached prefix, `prefix_tokens`) makes `calls_per_chunk` calls; a prefix at the
    model's minimum is written once and read by the other calls, a shorter one is sent whole with each; each
    call adds the analyst's own part and an answer."""
    cached = sum(p for p in prefix_tokens if p >= min_cache_tokens)
    uncached = sum(p for p in prefix_tokens if p < min_cache_tokens)
    calls = calls_per_chunk * len(prefix_tokens)
    usage = Usage(input_tokens=calls * ESTIMATE_ANALYST_PART_TOKENS + calls_per_chunk * uncached,
                  output_tokens=calls * ESTIMATE_ANSWER_TOKENS,
                  cache_write_tokens=cached, cache_read_tokens=cached * (calls_per_chunk - 1))
    dollars = model_cost_usd(model_price(table, model_id), usage)
    return usage.model_copy(update={"model_micro_usd": micro_usd(dollars)})


def request_cost_usd(table: PriceTable, requests: Counter[str], lambda_gb_s: Decimal = Decimal(0)) -> Decimal:
    """Orchestration: each counted request at its class's list price (one request unit per DynamoDB request:
    items under 1 KB written, 4 KB read), plus Lambda compute."""
    return (requests[DYNAMODB_WRITE] * table.dynamodb_write_per_million / _MILLION
            + requests[DYNAMODB_READ] * table.dynamodb_read_per_million / _MILLION
            + requests[SQS_STANDARD] * table.sqs_standard_per_million / _MILLION
            + requests[SQS_FIFO] * table.sqs_fifo_per_million / _MILLION
            + requests[S3_WRITE] * table.s3_write_per_1k / _THOUSAND
            + requests[S3_READ] * table.s3_read_per_1k / _THOUSAND
            + requests[LAMBDA_REQUEST] * table.lambda_request_per_million / _MILLION
            + lambda_gb_s * table.lambda_gb_second)


# ------------------------------------------------------------------------------ AWS requests
def classify(service: str, operation: str, params: Mapping[str, object]) -> str:
    if service == "dynamodb":
        return DYNAMODB_WRITE if operation in _DDB_WRITES else DYNAMODB_READ if operation in _DDB_READS else FREE
    if service == "sqs":
        return SQS_FIFO if str(params.get("QueueUrl", "")).endswith(".fifo") else SQS_STANDARD
    if service == "s3":
        return S3_WRITE if operation in _S3_WRITES else S3_READ if operation in _S3_READS else FREE
    return FREE


class RequestCounter:
    """Requests by price class (thread-safe: an attempt's threads add to it at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_class: Counter[str] = Counter()

    def add(self, price_class: str, n: int = 1) -> None:
        with self._lock:
            self.by_class[price_class] += n

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.by_class)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(n for c, n in self.by_class.items() if c != FREE)


class RequestMeter:
    """One per process (wiring.build_deps): a botocore hook counts every API call of the hooked clients into
    the open attempt's counter, if any."""

    def __init__(self) -> None:
        self._active: RequestCounter | None = None
        self._local = threading.local()
        self.process = RequestCounter()  # everything this process made, attempts or not (benchmarks)

    def hook(self, client: Any) -> Any:
        """Count `client`'s API calls (one per call, before botocore's own retries of it)."""
        client.meta.events.register("provide-client-params.*.*", self._on_call)
        return client

    def _on_call(self, params: Mapping[str, object], model: Any, **_: Any) -> None:
        price_class = classify(model.service_model.service_name, model.name, params)
        self.process.add(price_class)
        if getattr(self._local, "excluded", False):
            return
        counter = self._active
        if counter is not None:
            counter.add(price_class)

    def exclude_current_thread(self) -> None:
        """This thread's requests are never an attempt's (a sweep loop beside the chunk work)."""
        self._local.excluded = True

    @contextmanager
    def attempt(self) -> Iterator[RequestCounter]:
        """The requests of this process while the block runs, one attempt at a time (a Lambda worker handles
        one record at a time; so does the Fargate poller)."""
        counter = RequestCounter()
        previous, self._active = self._active, counter
        try:
            yield counter
        finally:
            self._active = previous


@contextmanager
def metered(meter: RequestMeter | None) -> Iterator[RequestCounter]:
    """`meter.attempt()`, or a counter nothing adds to when the process has no meter (unit tests)."""
    if meter is None:
        yield RequestCounter()
        return
    with meter.attempt() as counter:
        yield counter


@dataclass
class AttemptMeter:
    """What one chunk attempt spent besides its model tokens: its AWS requests (counted) and, in a Lambda
    worker, one invocation and its duration at the function's memory (measured)."""

    table: PriceTable
    model: PricedModel
    counter: RequestCounter = field(default_factory=RequestCounter)
    lambda_memory_mb: int | None = None  # None: not a Lambda worker (Fargate): no Lambda charge
    started: float = field(default_factory=time.monotonic)
    clock: Callable[[], float] = time.monotonic

    def usage(self, tokens: Usage, pending_writes: int = 1) -> Usage:
        """The attempt's usage now: `tokens` (its model tokens), its requests so far plus `pending_writes`
        DynamoDB writes about to be made (the write that records this usage), priced."""
        requests = self.counter.snapshot()
        requests[DYNAMODB_WRITE] += pending_writes
        gb_s = Decimal(0)
        if self.lambda_memory_mb is not None:
            requests[LAMBDA_REQUEST] += 1
            seconds = Decimal(str(round(max(0.0, self.clock() - self.started), 3)))
            gb_s = seconds * Decimal(self.lambda_memory_mb) / 1024
        model_usd = model_cost_usd(self.model, tokens)
        aws_usd = request_cost_usd(self.table, requests, gb_s)
        return Usage(input_tokens=tokens.input_tokens, output_tokens=tokens.output_tokens,
                     cache_read_tokens=tokens.cache_read_tokens, cache_write_tokens=tokens.cache_write_tokens,
                     aws_requests=sum(n for c, n in requests.items() if c != FREE),
                     model_micro_usd=micro_usd(model_usd), aws_micro_usd=micro_usd(aws_usd))


def describe(usage: Usage, budget_micro_usd: int | None = None) -> str:
    """One line: "$0.012345 (model $0.010000: 1,234 input, 56 output, 900 cache-read, 300 cache-write tokens;
    orchestration $0.002345: 78 AWS requests); budget $1.000000", and, when calls timed out, the estimated part apart:
    "...; estimated $0.004000: 2 timed-out calls Bedrock may bill)"."""
    estimated = (f"; estimated {format_usd(usage.estimated_micro_usd)}: {usage.timed_out_calls:,} timed-out "
                 "call(s) Bedrock may bill") if usage.timed_out_calls or usage.estimated_micro_usd else ""
    line = (f"{format_usd(usage.total_micro_usd)} (model {format_usd(usage.model_micro_usd)}: "
            f"{usage.input_tokens:,} input, {usage.output_tokens:,} output, {usage.cache_read_tokens:,} cache-read, "
            f"{usage.cache_write_tokens:,} cache-write tokens; orchestration {format_usd(usage.aws_micro_usd)}: "
            f"{usage.aws_requests:,} AWS requests{estimated})")
    if budget_micro_usd is not None:
        line += f"; budget {format_usd(budget_micro_usd)}"
    return line


def over_budget(usage: Usage, budget_micro_usd: int | None) -> bool:
    return budget_micro_usd is not None and usage.total_micro_usd >= budget_micro_usd


def aggregator_usage(table: PriceTable, counter: RequestCounter, pending_writes: int = 1) -> Usage:
    """The aggregator's requests for one result, counted up to and including the write that settles it."""
    requests = counter.snapshot()
    requests[DYNAMODB_WRITE] += pending_writes
    return Usage(aws_requests=sum(n for c, n in requests.items() if c != FREE),
                 aws_micro_usd=micro_usd(request_cost_usd(table, requests)))
