"""Each role may make every AWS call its code makes, and is granted nothing its code does not call.

moto does not enforce IAM, so a missing permission passes every other test and fails on AWS (the
Fargate task role once lacked the sweeper's index query and DLQ receive: the poller's sweep failed
with AccessDenied on every round). Here the real code runs in-process against the local template
deployed into moto, with a botocore hook recording every call per role (tests/infra/aws_calls.py):

- intake, worker, aggregator, sweeper, collector: their Lambda handlers, with Lambda-shaped events;
- worker error paths (throttling, 5xx, poison, a retired model id) through the same `ChunkWorker`;
- fargate: the poller (`handlers.poller.run`), which runs the worker and sweeps lapsed claims in-process
  (jobs are the sweeper Lambda's), with a fake ECS agent for scale-in protection;
- batch inference: the batch collector's handler, in its own environment (BATCH_ROLE_ARN and STACK_TAG from the
  template), against the batch stand-in (review_local/batch_service.py), whose S3 calls are recorded as the batch
  service role's (what Bedrock does with it: list and read batch/input/, write batch/output/).

Bedrock is answered at the HTTP boundary (botocore `before-call`), so the worker runs its real
Bedrock client. Each call is recorded with the shipped module that made it (aws_calls.origin_of: the
innermost frame under functions/ or review_local/). Then, on the synthesized local, prod and Fargate
templates: every recorded call is allowed by the role's policy on its resource (ARNs resolved against
the deployed stack), and every grant (`infra.permissions.ACCESS`, and infra/batch.py's) was used by a
call shipped code made: a call the test makes itself counts for nothing (the
test once called Stop and List "as the sweeper" so that grants no code used passed).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from contract_review import handlers
from contract_review.adapters.task_protection import ScaleInGuard, TaskProtection
from contract_review.config.settings import Settings
from contract_review.domain import cost, lifecycle, spend_cap
from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord
from contract_review.domain.keys import (
    findings_key,
    report_keys,
    submission_key,
)
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Deps
from contract_review.domain.principals import uploads_prefix
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState, Reliability, Submission, job_id_for
from contract_review.handlers import poller
from contract_review.model.daily_quota import DailyQuota
from contract_review.operate import job_view, model_control
from contract_review.pipeline import admission, batch_inference
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery, Tier2
from contract_review.reliability.chunks import announce
from contract_review.review.analysts import ChunkFindings, Finding
from contract_review.review.chunking import document_hash
from contract_review.review.report import Report, coverage_of
from contract_review.sideeffects import saga
from contract_review.sideeffects.saga import TICKET, SagaStatus
from contract_review.wiring import build_deps, chunk_worker
from infra.permissions import ACCESS
from review_local.batch_service import BedrockBatchStandIn
from review_local.connect import local_deps
from review_local.embedded import FAKE_CREDENTIALS, EmbeddedAws
from review_local.runtime import function_specs
from review_local.sandbox import LambdaContext, sqs_event
from review_local.ticket_service import TicketServiceFake

from ..fake_ecs_agent import FakeEcsAgent
from ..texts import LONG_TEXT, TEXT
from . import api_scenario
from .aws_calls import ACCOUNT, REGION, XRAY_DAEMON_CALLS, Call, Need, Recorder, allowed, declared
from .conftest import (
    FARGATE,
    LOCAL,
    PROD,
    TICKET_SECRET_NAME,
    Synth,
    policy_statements_for_role,
    resources,
    role_id,
)

CLUSTER = "<cluster>"  # the ECS cluster's name: resolved per template
TASK_ID = "0123456789abcdef0"
FUNCTION_ROLES = ("intake", "worker", "aggregator", "sweeper", "collector", "api")
# What each role's code runs: the Fargate poller runs the worker, and sweeps lapsed claims in-process (recorded
# as "fargate"; not the sweeper Lambda's job reconciliation).
CODE_OF = {"intake": ("intake",), "worker": ("worker",), "aggregator": ("aggregator",), "sweeper": ("sweeper",),
           "collector": ("collector",),
           "api": ("api",), "fargate": ("fargate", "worker"), "batch": ("batch",)}
BATCH_MIN_RECORDS = 3  # the stand-in's minimum per job here (Bedrock's default quota is 100)


@dataclass
class Recorded:
    recorder: Recorder
    aws: EmbeddedAws
    protection_puts: int


# ------------------------------------------------------------------------ Bedrock at the boundary
class BedrockDouble:
    """Answers Converse (an empty, valid tool answer), the control plane's model questions (the model named, as Bedrock
    names it), and Service Quotas' list of Bedrock's quotas (moto has none): the model's rows, as the sweeper reads
    them to publish them for the workers."""

    def __init__(self) -> None:
        self.converse_error: str | None = None  # e.g. "ValidationException": every Converse fails so
        self.converse_calls = 0

    def attach(self, session: Any) -> None:
        session.events.register("before-call.bedrock-runtime.Converse", self._converse)
        session.events.register("before-call.bedrock.GetInferenceProfile", self._profile)
        session.events.register("before-call.bedrock.GetFoundationModel", self._model)
        session.events.register("before-call.service-quotas.ListServiceQuotas", self._quotas)

    def _converse(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        self.converse_calls += 1
        if self.converse_error:
            return AWSResponse("", 400, {}, None), {
                "Error": {"Code": self.converse_error, "Message": "The provided model identifier is invalid."},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        time.sleep(0.06)  # a chunk lasts long enough for the heartbeat (lease/3 = 1 s locally)
        return AWSResponse("", 200, {}, None), {
            "output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "t1", "name": "record_answer", "input": {"clauses": []}}}]}},
            "stopReason": "tool_use", "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
            "ResponseMetadata": {"HTTPStatusCode": 200}}

    def _profile(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("", 200, {}, None), {"status": "ACTIVE", "ResponseMetadata": {"HTTPStatusCode": 200}}

    def _model(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("", 200, {}, None), {"modelDetails": {"modelLifecycle": {"status": "LEGACY"},
                                                                 "providerName": "Anthropic",
                                                                 "modelName": "Claude Sonnet 4.6"},
                                                "ResponseMetadata": {"HTTPStatusCode": 200}}

    def _quotas(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        rows = [("Global cross-Region InvokeModel tokens per minute for Anthropic Claude Sonnet 4.6 V1", 2_000_000),
                ("Global cross-Region InvokeModel requests per minute for Anthropic Claude Sonnet 4.6 V1", 250),
                ("Model invocation max tokens per day for Anthropic Claude Sonnet 4.6 V1", 1e9),
                ("Cross-Model Max Tokens Per Day", 5e9),
                ("Minimum number of records per batch inference job for Anthropic Claude Sonnet 4.6 V1", 100)]
        return AWSResponse("", 200, {}, None), {
            "Quotas": [{"ServiceCode": "bedrock", "QuotaName": name, "QuotaCode": f"L-{i:08d}", "Value": value,
                        "Adjustable": True} for i, (name, value) in enumerate(rows)],
            "ResponseMetadata": {"HTTPStatusCode": 200}}


class FailingModel:
    """A model whose calls fail with a Bedrock error shape after `ok` successful calls."""

    model_id = "global.anthropic.claude-sonnet-4-6"

    def __init__(self, code: str, status: int, ok: int = 0):
        self.code, self.status, self.ok = code, status, ok

    def invoke(self, request: ModelRequest) -> ModelResponse:
        if self.ok > 0:
            self.ok -= 1
            return ModelResponse(text='{"clauses": []}', stop_reason="end_turn")
        raise ClientError({"Error": {"Code": self.code, "Message": "Too many requests, please wait."},
                           "ResponseMetadata": {"HTTPStatusCode": self.status}}, "Converse")


class OkModel(FailingModel):
    def __init__(self) -> None:
        super().__init__("", 200, ok=10**6)


class CountedModel(OkModel):
    """Answers as OkModel, with the usage Bedrock reports (what the daily token ledger counts)."""

    def invoke(self, request: ModelRequest) -> ModelResponse:
        return dataclasses.replace(super().invoke(request), input_tokens=10)


# ------------------------------------------------------------------------ the scenarios
def _receive(aws: EmbeddedAws, url: str, want: int = 1, timeout_s: float = 60) -> list[dict[str, Any]]:
    sqs, got, deadline = aws.client("sqs"), [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"],
                                MessageAttributeNames=["All"], WaitTimeSeconds=0)
        got += r.get("Messages", [])
        if len(got) < want:
            time.sleep(0.1)
    assert len(got) >= want, f"expected {want} message(s) on {url}, got {len(got)}"
    return got


def _job(setup: Deps, aws: EmbeddedAws, key: str) -> tuple[str, dict[str, Any]]:
    """A one-chunk job created outside the recording; its analysis message as received from SQS."""
    result = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": key,
                                              "document": {"text": TEXT}}), f"m-{key}")
    assert result.job_id is not None
    return result.job_id, _message_of(aws, setup.settings.analysis_queue_url, result.job_id)


def _message_of(aws: EmbeddedAws, url: str, job_id: str) -> dict[str, Any]:
    """A chunk message of `job_id` as received from SQS (the others received on the way deleted)."""
    sqs, deadline = aws.client("sqs"), time.monotonic() + 10
    while time.monotonic() < deadline:
        for m in _receive(aws, url):
            if AnalysisMessage.model_validate_json(m["Body"]).job_id == job_id:
                return m
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # an earlier scenario's
    raise AssertionError(f"no analysis message for {job_id}")


PAGED_TEXT = "\n\n".join([LONG_TEXT] * 4)  # more chunks than the local fan-out window


def _paged_job(setup: Deps, key: str, counted: int, stats: AttemptStats = AttemptStats(calls=1),
               **fields: object) -> tuple[str, list[ChunkRecord]]:
    """A job of more chunks than its window, taken in outside the recording, whose first `counted`
    chunks are settled done (having spent `stats`); returns the job id and those chunk records. Counting them
    is the caller's. `fields`: more of the intake message (a budget)."""
    result = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": key,
                                              "document": {"text": PAGED_TEXT}, **fields}), f"m-{key}")
    assert result.job_id is not None and result.state == "running"
    job = setup.jobs.get(result.job_id)
    assert job is not None and job.fanned_out is not None and job.fanned_out < job.chunk_count
    settled = []
    for c in setup.claims.for_job(result.job_id)[:counted]:
        won = setup.claims.claim(result.job_id, c.chunk_id, "w-setup", 30, 1)
        key_ = findings_key(result.job_id, c.chunk_index, c.chunk_id, won.fence)
        setup.artifacts.put_text(key_, ChunkFindings(chunk_id=c.chunk_id, chunk_index=c.chunk_index,
                                                     findings=[]).model_dump_json())
        done = setup.claims.finish(result.job_id, c.chunk_id, won.fence, ChunkStatus.DONE, stats,
                                   outcome=ChunkOutcome(findings_key=key_, coverage={}, n_findings=0))
        assert done is not None
        settled.append(done)
    return result.job_id, settled


def _delivery(m: dict[str, Any], visibility_s: int) -> Delivery:
    return Delivery(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"],
                    receive_count=int(m["Attributes"]["ApproximateReceiveCount"]), visibility_s=visibility_s,
                    remaining_ms=lambda: 20_000)


def _intake(rec: Recorder, setup: Deps, arn: str) -> None:
    from contract_review.handlers import intake as intake_handler

    setup.artifacts.put_text("uploads/contract.txt", TEXT.replace("New York", "Delaware"), "text/plain")
    bucket = setup.settings.bucket
    bodies = [
        {"schema_version": 1, "document_id": "inline", "document": {"text": TEXT}},
        {"schema_version": 1, "idempotency_key": "by-uri", "document": {"s3_uri": f"s3://{bucket}/uploads/contract.txt"}},
        {"schema_version": 1, "idempotency_key": "gone", "document": {"s3_uri": f"s3://{bucket}/uploads/none.txt"}},
        {"schema_version": 1, "document_id": "empty", "document": {"text": "   "}},
        {"schema_version": 1, "document_id": "inline", "document": {"text": TEXT}},  # a duplicate
        # a batch-mode job: admitted in batch unless the runtime control says the model's batch lane is off
        {"schema_version": 1, "idempotency_key": "i-batch", "inference": "batch",
         "document": {"text": TEXT.replace("New York", "Vermont")}},
    ]
    # a running job whose fan-out stalled (a page is due, its trigger lost): the document sent again moves it on
    stalled, counted = _paged_job(setup, "stalled-fanout", setup.settings.profile.fanout.fanout_page)
    for record in counted:
        setup.jobs.settle_chunk(stalled, record.chunk_id)
    bodies.append({"schema_version": 1, "idempotency_key": "stalled-fanout", "document": {"text": PAGED_TEXT}})
    # a Job API submission: its principal is taken on the API's submission record, its upload in that caller's area
    who, api_key, api_text = "arn:aws:iam::123456789012:user/api-caller", "api:role-coverage", TEXT.replace("York", "Hampshire")
    upload = f"{uploads_prefix(who)}contract.txt"
    setup.artifacts.put_text(upload, api_text, "text/plain")
    setup.artifacts.put_text(submission_key(job_id_for(api_key)), Submission(
        job_id=job_id_for(api_key), principal=who, document_sha256=document_hash(api_text), submitted_at=0).model_dump_json())
    bodies.append({"schema_version": 1, "idempotency_key": api_key, "principal": who,
                   "document": {"s3_uri": f"s3://{bucket}/{upload}"}})
    records = [{"MessageId": f"i-{n}", "ReceiptHandle": f"rh-{n}", "Body": json.dumps(b)} for n, b in enumerate(bodies)]
    records.append({"MessageId": "i-poison", "ReceiptHandle": "rh-p", "Body": "{nope"})  # no key: to the DLQ
    # the duplicate's conditional put fails without the winner's item (the adapter then reads it)
    inline_job = job_id_for(document_hash(TEXT))
    puts: list[str] = []

    def second_put_of_the_inline_job(body: dict[str, Any]) -> bool:
        if body.get("TableName") != setup.settings.jobs_table or body["Item"]["job_id"]["S"] != inline_job:
            return False
        puts.append(inline_job)
        return len(puts) == 2

    _answer_once(handlers.session(), "PutItem", second_put_of_the_inline_job, 400,
                 {"Error": {"Code": "ConditionalCheckFailedException", "Message": "The conditional request failed"}})
    with rec.acting_as("intake"):
        intake_handler.handler(sqs_event(records, arn, REGION), LambdaContext("IntakeFn", 512, 10, "r-i", REGION))


def _worker(rec: Recorder, setup: Deps, aws: EmbeddedAws, bedrock: BedrockDouble, arn: str) -> None:
    from contract_review.handlers import worker as worker_handler

    p = setup.settings.profile
    # 1. the handler, Bedrock answering: the chunk completes (heartbeats on the way) and is announced
    _, m = _job(setup, aws, "w-ok")
    with rec.acting_as("worker"):
        worker_handler.handler(sqs_event([m], arn, REGION), LambdaContext("WorkerFn", 1024, 20, "r-w", REGION))
    # 2. the handler, Bedrock refusing the model id, the control plane saying it is retired: job-fatal
    _, m = _job(setup, aws, "w-retired")
    bedrock.converse_error = "ValidationException"
    try:
        with rec.acting_as("worker"):
            worker_handler.handler(sqs_event([m], arn, REGION), LambdaContext("WorkerFn", 1024, 20, "r-w2", REGION))
    finally:
        bedrock.converse_error = None
    # 3. large outputs go to S3: throttled after one analyst (a checkpoint, then backpressure) ...
    small = handlers.settings().model_copy(update={"profile": p.with_overrides(**{"checkpoint_inline_max_bytes": 1})})
    _unprocessed_once(handlers.session(), setup.settings.checkpoints_table)  # before its clients exist (below)
    deps = build_deps(small, handlers.session())
    job_id, m = _job(setup, aws, "w-throttled")
    msg = AnalysisMessage.model_validate_json(m["Body"])
    with rec.acting_as("worker"):
        chunk_worker(deps, FailingModel("ThrottlingException", 429, ok=1), sleep=lambda _s: None).handle(
            msg, _delivery(m, p.queues.analysis_visibility_s))
    # ... then resumed from its checkpoint (read back from S3), with BatchGetItem leaving keys unprocessed
    with rec.acting_as("worker"):
        outcome = chunk_worker(deps, OkModel(), sleep=lambda _s: None).handle(msg, _delivery(m, p.queues.analysis_visibility_s))
    assert outcome.action == "done", outcome
    # 4. a 5xx: tier 2 (visibility backoff), then with the budget spent: dead-lettered
    _, m = _job(setup, aws, "w-5xx")
    msg = AnalysisMessage.model_validate_json(m["Body"])
    with rec.acting_as("worker"), pytest.raises(Tier2):
        chunk_worker(handlers.deps(), FailingModel("ServiceUnavailableException", 503),
                    sleep=lambda _s: None).handle(msg, _delivery(m, p.queues.analysis_visibility_s))
    with rec.acting_as("worker"):
        outcome = chunk_worker(handlers.deps(), OkModel(), sleep=lambda _s: None).handle(
            msg.model_copy(update={"max_attempts": 1}), _delivery(m, p.queues.analysis_visibility_s))
    assert outcome.action == "dead_lettered", outcome
    # 5. the daily token ledger: a chunk's calls counted (flushed with an ADD at the end of the attempt) ...
    deps = handlers.deps()
    assert deps.token_ledger is not None
    _, m = _job(setup, aws, "w-daily")
    counting = DailyQuota.for_profile(deps.token_ledger, OkModel.model_id, 10**12, p)
    with rec.acting_as("worker"):
        outcome = chunk_worker(deps, CountedModel(), sleep=lambda _s: None, daily=counting).handle(
            AnalysisMessage.model_validate_json(m["Body"]), _delivery(m, p.queues.analysis_visibility_s))
    assert outcome.action == "done", outcome
    # ... then a quota that the ledger shows used up (those 110 tokens): the chunk is held (the ledger read, the
    # hold started)
    _, m = _job(setup, aws, "w-held")
    full = DailyQuota.for_profile(deps.token_ledger, OkModel.model_id, 100, p)
    with rec.acting_as("worker"):
        outcome = chunk_worker(deps, OkModel(), sleep=lambda _s: None, daily=full).handle(
            AnalysisMessage.model_validate_json(m["Body"]), _delivery(m, p.queues.analysis_visibility_s))
    assert outcome.action == "requeued" and outcome.detail["reason"] == "model.daily_quota_exhausted", outcome
    # 6. a bulk job's chunk while an interactive job is open (w-held's, just held): it gives way, sent back delayed
    bulk = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": "w-bulk", "priority": "bulk",
                                            "document": {"text": LONG_TEXT}}), "m-w-bulk")
    assert bulk.job_id is not None
    m = _message_of(aws, setup.settings.analysis_queue_url, bulk.job_id)
    with rec.acting_as("worker"):
        outcome = chunk_worker(handlers.deps(), OkModel(), sleep=lambda _s: None).handle(
            AnalysisMessage.model_validate_json(m["Body"]), _delivery(m, p.queues.analysis_visibility_s))
    assert outcome.action == "deferred", outcome


def _answer_once(session: Any, operation: str, match: Callable[[dict[str, Any]], bool],
                 status: int, parsed: dict[str, Any]) -> None:
    """The next DynamoDB `operation` whose request body `match`es gets this answer instead of moto's."""
    done: list[bool] = []

    def answer(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = json.loads(params["body"])
        if done or not match(body):
            return None
        done.append(True)
        return AWSResponse("", status, {}, None), {**parsed, "ResponseMetadata": {"HTTPStatusCode": status}}

    session.events.register(f"before-call.dynamodb.{operation}", answer)


def _unprocessed_once(session: Any, table: str) -> None:
    """The next BatchGetItem on `table` answers with every key unprocessed (DynamoDB may)."""
    done: list[bool] = []

    def answer(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if done:
            return None
        done.append(True)
        body = json.loads(params["body"])
        return AWSResponse("", 200, {}, None), {"Responses": {table: []},
                                                "UnprocessedKeys": {table: body["RequestItems"][table]},
                                                "ResponseMetadata": {"HTTPStatusCode": 200}}

    session.events.register("before-call.dynamodb.BatchGetItem", answer)


def _aggregator(rec: Recorder, setup: Deps, aws: EmbeddedAws, arn: str) -> None:
    from contract_review.handlers import aggregator as aggregator_handler

    # a job of several pages whose settling chunks make room in its window: the aggregator sends the next page
    job_id, settled = _paged_job(setup, "a-paged", setup.settings.profile.fanout.fanout_page)
    for record in settled:
        announce(setup, record)
    messages = _receive(aws, setup.settings.results_queue_url, want=3 + len(settled))
    with rec.acting_as("aggregator"):
        aggregator_handler.handler(sqs_event(messages, arn, REGION),
                                   LambdaContext("AggregatorFn", 512, 10, "r-a", REGION))
    job = setup.jobs.get(job_id)
    assert job is not None and job.fanned_out == setup.settings.profile.fanout.fanout_window + len(settled), job
    # a job whose first settled chunk spent more than its budget: stopped (job.budget_exceeded), its chunks
    # nobody holds settled `cancelled` (fenced updates of their records)
    # (a budget at the document's estimate passes intake; the first chunk then spends more than all of it)
    estimate = admission.estimate(setup.settings, PAGED_TEXT).model_micro_usd
    job_id, settled = _paged_job(setup, "a-budget", 1, AttemptStats(calls=1, model_micro_usd=estimate + 1),
                                 budget_usd=float(cost.usd(estimate)))
    announce(setup, settled[0])
    messages = _receive(aws, setup.settings.results_queue_url, want=1)
    with rec.acting_as("aggregator"):
        aggregator_handler.handler(sqs_event(messages, arn, REGION),
                                   LambdaContext("AggregatorFn", 512, 10, "r-b", REGION))
    job = setup.jobs.get(job_id)
    assert job is not None and (job.state.value, job.error_code) == ("cancelled", "job.budget_exceeded"), job


def _sweeper(rec: Recorder, setup: Deps, aws: EmbeddedAws) -> None:
    from contract_review.handlers import sweeper as sweeper_handler

    budget = setup.settings.profile.recovery.poison_budget
    # a lapsed claim (its worker died) and one whose poison budget is spent
    for key, failures in (("s-lapsed", 0), ("s-poison", budget - 1)):
        job_id, m = _job(setup, aws, key)
        chunk_id = AnalysisMessage.model_validate_json(m["Body"]).chunk_id
        for _ in range(failures):
            c = setup.claims.claim(job_id, chunk_id, "ghost", 30, 1)
            setup.claims.release(job_id, chunk_id, c.fence, AttemptStats(), None, failure=True)
        setup.claims.claim(job_id, chunk_id, "ghost", 0.01, 1)
    # a chunk message the queue moved to the DLQ, its chunk unsettled
    _, m = _job(setup, aws, "s-dlq")
    aws.client("sqs").send_message(QueueUrl=setup.settings.analysis_dlq_url, MessageBody=m["Body"])
    # a running job without progress for longer than stall_after_s
    job_id, _ = _job(setup, aws, "s-stalled")
    stale = {"UpdateExpression": "SET updated_at = :t", "ExpressionAttributeValues": {":t": {"N": "1"}}}
    aws.client("dynamodb").update_item(TableName=setup.settings.jobs_table, Key={"job_id": {"S": job_id}}, **stale)
    # a stalled job whose only chunk is done and counted, its finalize lost: the reconciler finalizes it
    job_id, m = _job(setup, aws, "s-final")
    chunk_id = AnalysisMessage.model_validate_json(m["Body"]).chunk_id
    won = setup.claims.claim(job_id, chunk_id, "w-setup", 30, 1)
    key_ = findings_key(job_id, 0, chunk_id, won.fence)
    setup.artifacts.put_text(key_, ChunkFindings(chunk_id=chunk_id, chunk_index=0, findings=[]).model_dump_json())
    assert setup.claims.finish(job_id, chunk_id, won.fence, ChunkStatus.DONE, AttemptStats(calls=1),
                               outcome=ChunkOutcome(findings_key=key_, coverage={}, n_findings=0))
    setup.jobs.settle_chunk(job_id, chunk_id)
    aws.client("dynamodb").update_item(TableName=setup.settings.jobs_table, Key={"job_id": {"S": job_id}}, **stale)
    # a cancelling job idle for a lease (its control message lost) whose only chunk finished but was never counted:
    # the sweeper counts it (the settle's transaction of the chunk record and the job item), then ends the job
    job_id, m = _job(setup, aws, "s-cancel")
    chunk_id = AnalysisMessage.model_validate_json(m["Body"]).chunk_id
    won = setup.claims.claim(job_id, chunk_id, "w-setup", 30, 1)
    assert setup.claims.finish(job_id, chunk_id, won.fence, ChunkStatus.DONE, AttemptStats(calls=1))
    assert lifecycle.move(setup, job_id, (JobState.RUNNING,), JobState.CANCELLING, event="job.cancelling")
    aws.client("dynamodb").update_item(TableName=setup.settings.jobs_table, Key={"job_id": {"S": job_id}}, **stale)
    cancelling = job_id
    # a job stuck `queued` whose intake message the queue moved to the intake DLQ
    body = json.dumps({"schema_version": 1, "idempotency_key": "s-queued", "document": {"text": TEXT}})
    setup.jobs.create(Job(job_id=job_id_for("s-queued"), state=JobState.QUEUED, created_at=1.0, updated_at=1.0,
                          idempotency_key="s-queued"))
    aws.client("sqs").send_message(QueueUrl=setup.settings.intake_dlq_url, MessageBody=body)
    time.sleep(0.05)
    with rec.acting_as("sweeper"):
        timeout_s = setup.settings.profile.functions.sweeper_timeout_s  # the function's: the sweep keeps a reserve
        result = sweeper_handler.handler({}, LambdaContext("SweeperFn", 256, timeout_s, "r-s", REGION))
    assert result["requeued"] and result["dead_lettered"] and result["stalled_jobs"] >= 1, result
    assert result["dlq_requeued"] and result["finalized"] and result["intake_failed"], result
    after = setup.jobs.get(cancelling)
    assert after is not None and after.state is JobState.CANCELLED and after.settled_count == 1, after


def _spend_cap(rec: Recorder, setup: Deps, arn: str) -> None:
    """The stack's daily spend cap reached (its counters set outside the recording): intake holds a job `queued`, the
    Job API refuses one (reading the control for an override), the sweeper sets the spend-cap hold; after an operator's
    override the sweeper admits and starts the held job. The counters, hold and override are cleared after."""
    from contract_review.handlers import intake as intake_handler
    from contract_review.handlers import sweeper as sweeper_handler

    from . import api_scenario

    assert setup.token_ledger is not None and setup.model_control is not None
    cap = spend_cap.cap_micro_usd(setup)
    assert cap is not None, "the local profile has a daily spend cap"
    day = spend_cap.utc_day(time.time())
    for counter in (spend_cap.ADMITTED_COUNTER, spend_cap.RECORDED_COUNTER):
        setup.token_ledger.take(counter, day, cap, spend_cap.UNCAPPED, (day + 2) * 86400)
    body = {"schema_version": 1, "idempotency_key": "over-the-cap", "document": {"text": TEXT.replace("York", "Mexico")}}
    with rec.acting_as("intake"):
        intake_handler.handler(sqs_event([{"MessageId": "i-cap", "ReceiptHandle": "rh-cap", "Body": json.dumps(body)}],
                                         arn, REGION), LambdaContext("IntakeFn", 512, 10, "r-ic", REGION))
    held = setup.jobs.get(job_id_for("over-the-cap"))
    assert held is not None and held.waiting is not None and held.waiting.condition == spend_cap.CONDITION, held
    time.sleep(setup.settings.profile.quota.model_control_max_age_s + 0.2)  # intake's read of the control ages: the
    # handlers share one process here (and so one cached control), each its own on AWS
    refused = api_scenario._call(rec, "POST", "/jobs", {"document": {"text": TEXT.replace("York", "Amsterdam")}})
    assert refused["status"] == 429 and refused["body"]["error"]["code"] == "quota.spend_cap", refused
    timeout_s = setup.settings.profile.functions.sweeper_timeout_s
    with rec.acting_as("sweeper"):
        sweeper_handler.handler({}, LambdaContext("SweeperFn", 256, timeout_s, "r-sc", REGION))
    assert setup.model_control.update(lambda c: c).spend_held(day) is not None  # read again, not from the cache
    model_control.quota_change(setup, "role-coverage", override_cap=True)
    time.sleep(setup.settings.profile.quota.model_control_max_age_s + 0.2)  # the sweeper's cached control ages
    with rec.acting_as("sweeper"):
        result = sweeper_handler.handler({}, LambdaContext("SweeperFn", 256, timeout_s, "r-sd", REGION))
    started = setup.jobs.get(held.job_id)
    assert started is not None and started.state is JobState.RUNNING and started.waiting is None, (result, started)
    setup.model_control.update(lambda c: c.model_copy(update={"spend_hold": None, "cap_override_day": None}))
    for counter in (spend_cap.ADMITTED_COUNTER, spend_cap.RECORDED_COUNTER):
        setup.token_ledger.take(counter, day, -setup.token_ledger.count(counter, day), spend_cap.UNCAPPED, 0)


def _finished_job(setup: Deps, key: str) -> Job:
    """A running job whose report (one high-risk finding) is written: where the saga runs."""
    job_id, now = job_id_for(key), time.time()
    job, _ = setup.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now,
                                   idempotency_key=key, document_id=key, chunk_count=1, analyst_count=11))
    finding = Finding(category="indemnification", score=0.9, quote="shall indemnify", start=0, end=15,
                      rationale="raises risk", analyst="indemnity", chunk_id="c00000-x", chunk_index=0)
    report = Report(job_id=job_id, state=JobState.COMPLETED, document_id=key, document_sha256="0" * 64,
                    model_id="m", prompt_version="p", chunk_count=1, findings=[finding],
                    coverage=coverage_of(11, []), reliability=Reliability())
    setup.artifacts.put_text(report_keys(job_id)[0], report.model_dump_json())
    return job


def _side_effects(rec: Recorder, setup: Deps, aws: EmbeddedAws, tickets: TicketServiceFake, role: str) -> None:
    """The saga as the aggregator (and the sweeper) runs it: the ticket system over HTTP (not AWS), the
    outcome store on the idempotency table, SNS + EventBridge, the compensation DLQ."""
    deps = handlers.deps()
    fx = deps.side_effects
    assert fx is not None, "the template gives every function the idempotency table"
    # 1. both steps done, their outcomes stored (report read back from S3)
    job = _finished_job(setup, f"{role}-fx-ok")
    with rec.acting_as(role):
        assert saga.run_side_effects(deps, fx, job).status is SagaStatus.DONE
    # 2. a step failing on every attempt frees its in-progress record
    tickets.inject("error_before_write", times=deps.settings.profile.side_effects.side_effect_attempts)
    with rec.acting_as(role):
        assert saga.run_side_effects(deps, fx, _finished_job(setup, f"{role}-fx-fail")).status is SagaStatus.FAILED
    # 2b. the credentials rotated: the cached token refused, the secret read again, the request sent again
    rotated = f"{role}-rotated"
    aws.client("secretsmanager").put_secret_value(SecretId=deps.settings.ticket_secret_arn,
                              SecretString=json.dumps({"bearer_token": rotated}))
    tickets.require_bearer(rotated)
    with rec.acting_as(role):
        assert saga.run_side_effects(deps, fx, _finished_job(setup, f"{role}-fx-rotated")).status is SagaStatus.DONE
    # 3. compensation: the publish withdrawn, the ticket's close failing on every attempt: dead-lettered
    tickets.inject("error_before_write", op="close", times=deps.settings.profile.side_effects.compensation_attempts)
    with rec.acting_as(role):
        assert saga.compensate(deps, fx, job, reason="job.cancelled").dead_lettered == [TICKET]


def _fargate(rec: Recorder, setup: Deps, aws: EmbeddedAws, agent: FakeEcsAgent, env: dict[str, str]) -> None:
    sqs, url = aws.client("sqs"), setup.settings.analysis_queue_url
    # a chunk whose worker died holding it (its message gone): the poller's in-process sweep of lapsed claims
    # rebuilds its message from the stored document and sends it
    lost = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": "f-lost",
                                            "document": {"text": TEXT}}), "m-f-lost")
    assert lost.job_id is not None
    (chunk,) = setup.claims.for_job(lost.job_id)
    sqs.purge_queue(QueueUrl=url)  # only the jobs of this scenario for the poller, and f-lost's message lost
    time.sleep(0.1)
    setup.claims.claim(lost.job_id, chunk.chunk_id, "ghost", 0.01, 1)
    # a bulk job: its chunk gives way to f-lost (interactive, open) until that one is done
    result = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": "f-ok", "priority": "bulk",
                                              "document": {"text": TEXT}}), "m-f")
    assert result.job_id is not None
    settings = Settings.from_env(env).model_copy(update={"worker_kind": "fargate"})
    # earlier scenarios leave interactive jobs open: f-ok gives way twice (1 s, 2 s: the priority query made), then runs
    settings = settings.model_copy(update={"profile": settings.profile.with_overrides(bulk_max_deferrals=2,
                                                                                      bulk_defer_s=1)})
    stop = poller.Shutdown(settings.profile.fargate.fargate_stop_timeout_s)
    guard = ScaleInGuard(TaskProtection(agent.uri), settings.profile.fargate.fargate_protection_minutes)
    with rec.acting_as("fargate"):
        thread = threading.Thread(target=poller.run, args=(settings, handlers.session(), stop, guard), daemon=True)
        thread.start()
        try:
            _wait(lambda: all(c.status is ChunkStatus.DONE for j in (result.job_id, lost.job_id)
                              for c in setup.claims.for_job(str(j))), WAIT_S)
            time.sleep(settings.profile.fargate.fargate_sweep_interval_s * 1.5)  # at least one in-process sweep
        finally:
            stop.request()
            thread.join(timeout=30)
    assert not thread.is_alive()


def _collector(rec: Recorder, aws: EmbeddedAws, collector_env: dict[str, str], service: BedrockBatchStandIn,
               bedrock: BedrockDouble, mp: pytest.MonkeyPatch) -> None:
    """The batch lane as it runs (pipeline/batch_inference*.py), the collector in its own function's environment (BATCH_ROLE_ARN and
    STACK_TAG from the template, the stand-in's URL for its bedrock client): a batch-mode job's chunk parked by the
    worker (its requests to batch/pending/); a collector run under the account's minimum records per job (read from
    Bedrock and Service Quotas, as in prod) that waits; one under the stand-in's minimum that packs and submits them,
    tagged with the stack's tag (a manifest in batch/jobs/); the Job API showing the batch job; a run that returns the
    answers (batch/answers/) and the chunk's message; the worker replaying them. Then a batch job whose only job is
    cancelled while it runs, stopped; a batch job of two jobs one of which was cancelled before it answered (its
    answers nobody takes: `batch.unused` on the job and, under a spend cap, on its principal's day); and a batch job
    Bedrock refuses, which turns the model's batch lane off in the
    runtime control (last: the lane stays off). Every call is the handlers' own; none is the test's."""
    from contract_review.handlers import collector as collector_handler

    def run(minimum: int | None) -> dict[str, Any]:
        """One collector run with this minimum records per batch job (None: the account's, read at cold start)."""
        for k in ("BATCH_ROLE_ARN", "STACK_TAG"):
            mp.setenv(k, collector_env[k])
        mp.setenv("BEDROCK_BATCH_ENDPOINT_URL", service.url)
        mp.setenv("PROFILE_OVERRIDES", json.dumps({"batch_min_records": minimum, "principal_daily_spend_usd": 100.0}))
        handlers.reset()  # a cold start in that environment
        session = handlers.session()
        rec.attach(session)
        bedrock.attach(session)
        with rec.acting_as("collector"):
            return collector_handler.handler({}, LambdaContext("CollectorFn", 1024, 60, "r-c", REGION))

    setup = as_deployed(local_deps(aws.outputs, aws.region, aws.endpoint), collector_env)
    p, url = setup.settings.profile, setup.settings.analysis_queue_url

    def work(job_id: str) -> str:
        """The worker takes the job's chunk message: what it did with it."""
        m = _message_of(aws, url, job_id)
        with rec.acting_as("worker"):
            return chunk_worker(handlers.deps(), OkModel(), sleep=lambda _s: None).handle(
                AnalysisMessage.model_validate_json(m["Body"]), _delivery(m, p.queues.analysis_visibility_s)).action

    def parked(key: str) -> str:
        result = handle_intake(setup, json.dumps({"schema_version": 1, "idempotency_key": key, "inference": "batch",
                                                  "document": {"text": TEXT}}), f"m-{key}")
        assert result.job_id is not None and work(result.job_id) == "awaiting_batch"
        return result.job_id

    job_id = parked("b-lane")
    assert not run(None)["submitted"]  # below the account's minimum (Bedrock's default, 100): the records wait
    for _ in range(2):  # two rounds: locate, then assess
        assert run(BATCH_MIN_RECORDS)["submitted"]
        job = setup.jobs.get(job_id)
        assert job is not None
        with rec.acting_as("api"):
            assert job_view.job_status(handlers.deps(), job)["batches"]
        _wait(lambda: _batch_jobs_ended(setup, service.url, job_id), WAIT_S)
        assert run(BATCH_MIN_RECORDS)["collected"]
        if (action := work(job_id)) != "awaiting_batch":
            assert action == "done", action
            break
    else:
        raise AssertionError("the batch-mode chunk did not finish in two rounds")
    # a batch job none of whose records is still wanted (its only job cancelled while it runs): stopped
    step = service.step_s
    service.step_s = 60.0  # it runs until stopped
    try:
        cancelled = parked("b-stop")
        assert run(BATCH_MIN_RECORDS)["submitted"]
        lifecycle.request_cancel(setup, cancelled, by="role-coverage")
        assert run(BATCH_MIN_RECORDS)["stopped"]
    finally:
        service.step_s = step
    # a batch job of two jobs, one of them ended before it answered (cancelled) with a daily spend cap on its principal:
    # its member read again (not waiting), its answers nobody takes on its cost and on the principal's day, once
    answered, dropped = parked("b-kept"), parked("b-dropped")
    assert run(BATCH_MIN_RECORDS)["submitted"]
    aws.client("dynamodb").update_item(  # the principal the Job API would have admitted it for (the test's own call)
        TableName=setup.settings.jobs_table, Key={"job_id": {"S": dropped}}, UpdateExpression="SET principal = :p",
        ExpressionAttributeValues={":p": {"S": "arn:aws:iam::123456789012:user/alice"}})
    lifecycle.request_cancel(setup, dropped, by="role-coverage")
    _wait(lambda: _batch_jobs_ended(setup, service.url, answered), WAIT_S)
    assert run(BATCH_MIN_RECORDS)["collected"]
    after = setup.jobs.get(dropped)
    assert after is not None and after.batch_unused
    # a batch job Bedrock refuses (the model is not offered in batch): its chunks on demand, the lane off for the model
    service.faults.refuse_create = "ValidationException"
    parked("b-refused")
    assert run(BATCH_MIN_RECORDS)["refused"]
    assert run(BATCH_MIN_RECORDS)["item_failures"] == []


def _batch_jobs_ended(setup: Deps, service_url: str, job_id: str) -> bool:
    """Outside the recording: the stand-in says each batch job holding the job's chunks has ended."""
    bedrock = boto3.Session(**{k.lower(): v for k, v in FAKE_CREDENTIALS.items()}, region_name=REGION).client(
        "bedrock", endpoint_url=service_url)
    shown = batch_inference.batches_of(setup, setup.claims.for_job(job_id), 0)
    return all(b.batch_job_arn is not None and bedrock.get_model_invocation_job(
        jobIdentifier=b.batch_job_arn)["status"] in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
        for b in shown)


# How long a scenario waits for the local stack to get somewhere: a wait, not a bound (a loaded machine is slow)
WAIT_S = 90.0


def as_deployed(setup: Deps, env: dict[str, str]) -> Deps:
    """The set-up's jobs are taken in on the model the functions run (env: Bedrock), as on a deployed stack: a job
    records its model at intake and the workers keep to it (the local stack's outputs say the offline model)."""
    return dataclasses.replace(setup, settings=setup.settings.model_copy(update={
        "model_provider": "bedrock", "model_id": Settings.from_env(env).effective_model_id}))


def _wait(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recorded(synth: Synth) -> Iterator[Recorded]:
    aws = EmbeddedAws().start()
    tickets: TicketServiceFake | None = None
    batch_service: BedrockBatchStandIn | None = None

    def job_tags(arn: str) -> dict[str, str]:
        """A batch job's tags, as Bedrock holds them for IAM (aws:ResourceTag): those it was created with."""
        job = batch_service.jobs.get(arn) if batch_service is not None else None
        return {t["key"]: t["value"] for t in (job.request.get("tags") or [])} if job is not None else {}

    rec = Recorder(resource_tags=job_tags)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            aws.deploy(synth.templates[LOCAL])
        specs = {s.name: s for s in function_specs(aws, 1.0)}
        env = {**specs["worker"].env, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": aws.endpoint,
               "AWS_DEFAULT_REGION": aws.region, "AWS_REGION": aws.region, "MODEL_PROVIDER": "bedrock"}
        tickets = TicketServiceFake().start()  # the external ticket system's local stand-in
        env["TICKET_URL"] = tickets.url
        # its credentials: the secret the templates grant (TICKET_SECRET_ARN, without its suffix), which the fake checks
        env["TICKET_SECRET_ARN"] = aws.client("secretsmanager").create_secret(
            Name=TICKET_SECRET_NAME, SecretString=json.dumps({"bearer_token": "t0ken"}))["ARN"]
        tickets.require_bearer("t0ken")
        # the batch stand-in: its S3 calls are Bedrock's, made with the batch service role
        as_bedrock = Recorder(role="batch", missing_key_404=False)
        service_session = aws.session()
        as_bedrock.attach(service_session)
        batch_service = BedrockBatchStandIn(service_session.client("s3", endpoint_url=aws.endpoint), step_s=0.05,
                                         min_records=BATCH_MIN_RECORDS).__enter__()
        with pytest.MonkeyPatch.context() as mp, FakeEcsAgent() as agent:
            for k, v in env.items():
                mp.setenv(k, v)
            from contract_review.handlers import aggregator, collector, intake, sweeper, worker

            for module in (aggregator, collector, intake, sweeper, worker):  # maybe imported earlier, without it
                mp.setattr(module.metrics, "namespace", env["POWERTOOLS_METRICS_NAMESPACE"])
            handlers.reset()
            session = handlers.session()
            rec.attach(session)
            bedrock = BedrockDouble()
            bedrock.attach(session)
            setup = as_deployed(local_deps(aws.outputs, aws.region, aws.endpoint), env)
            try:
                _intake(rec, setup, specs["intake"].queue_arn)
                _worker(rec, setup, aws, bedrock, specs["worker"].queue_arn)
                _aggregator(rec, setup, aws, specs["aggregator"].queue_arn)
                _sweeper(rec, setup, aws)
                api_scenario.run(rec, setup, aws)  # the Job API function (tests/infra/api_scenario.py)
                _spend_cap(rec, setup, specs["intake"].queue_arn)
                for role in ("aggregator", "sweeper"):
                    _side_effects(rec, setup, aws, tickets, role)
                _fargate(rec, setup, aws, agent, env)
                _collector(rec, aws, specs["collector"].env, batch_service, bedrock, mp)  # last: its environment
            finally:
                from contract_review.handlers import worker as worker_handler

                worker_handler.chunk_worker.cache_clear()
                handlers.reset()
            for _request in agent.requests:  # the agent calls UpdateTaskProtection with the task role
                rec.add("fargate", "ecs-agent", "UpdateTaskProtection", {"cluster": CLUSTER, "task": TASK_ID},
                        origin=declared("ecs-agent"))
            # the X-Ray daemon sidecar (not run here: offline, tracing is off) makes these with the task role
            # whenever the task runs (infra/fargate.py; the poller sends it its segments)
            for operation in XRAY_DAEMON_CALLS:
                rec.add("fargate", "xray-daemon", operation, {}, origin=declared("xray-daemon"))
            # Bedrock invokes a batch job's model with the service role (not run here: the stand-in answers with the
            # offline model)
            rec.add("batch", "bedrock-runtime", "InvokeModel",
                    {"modelId": Settings.from_env(specs["collector"].env | env).effective_model_id},
                    origin=declared("bedrock"))
            puts = len(agent.requests)
        batch_service.close()
        batch_service = None
        rec.calls.extend(as_bedrock.calls)
        yield Recorded(rec, aws, puts)
    finally:
        if tickets is not None:
            tickets.stop()
        if batch_service is not None:
            batch_service.close()
        aws.stop()


# ------------------------------------------------------------------------ the template side
def _cluster(t: dict[str, Any]) -> str:
    found = list(resources(t, "AWS::ECS::Cluster"))
    return found[0] if found else CLUSTER


def _statements(recorded: Recorded, t: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """The role's identity-policy statements, every resource resolved against the deployed stack (the Bedrock
    templates' application inference profile, which the local stack has not, by the ARN Bedrock would give it)."""
    profiles = set(resources(t, "AWS::Bedrock::ApplicationInferenceProfile"))

    def resolve(node: Any) -> Any:
        target = node.get("Fn::GetAtt") if isinstance(node, dict) else None
        if isinstance(target, list) and target[0] in profiles:
            return f"arn:aws:bedrock:{REGION}:123456789012:application-inference-profile/{target[0]}"
        if isinstance(node, dict):
            return recorded.aws.resolve({k: resolve(v) for k, v in node.items()}) if any(
                k.startswith("Fn::") or k == "Ref" for k in node) else {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return recorded.aws.resolve(node)

    return [{**st, "Resource": resolve(st["Resource"]),
             **({"Condition": resolve(st["Condition"])} if "Condition" in st else {})}
            for st in policy_statements_for_role(t, role_id(t, role))]


def _needs(calls: list[Call], cluster: str, stack: str = LOCAL) -> dict[Need, Call]:
    """Each call's needs as the template `stack` (its cluster, its review-stack tag) would see them: the calls were
    recorded on the local stack, whose collector tags its batch jobs with the local stack's name."""
    def tag(context: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        return tuple((k, stack if k.startswith(TAG_CONDITIONS) and v == LOCAL else v) for k, v in context)
    return {Need(n.action, n.resource.replace(CLUSTER, cluster), tag(n.context)): c for c in calls for n in c.needs}


TAG_CONDITIONS = ("aws:RequestTag/review-stack", "aws:ResourceTag/review-stack")


def _by_the_code(recorded: Recorded, role: str) -> list[Call]:
    """The calls the role's shipped code made (or a component its grant serves: aws_calls.DECLARED), never the test's."""
    return [c for c in recorded.recorder.of(*CODE_OF[role]) if c.by_the_code]


# PENDING: grants a role holds for calls that shipped code makes on a branch merged beside this one ("role", "action") ->
# what will make the call. Each must be unused by the code here; the test fails as soon as shipped code makes the call
# (then delete its entry). Empty: every grant is used by the code.
PENDING: dict[tuple[str, str], str] = {}


def unused_grants(role: str, granted: dict[str, tuple[str, ...]], calls: list[Call]) -> list[str]:
    """"action on target" of each grant (target ARN pattern -> actions) no call shipped code made needed."""
    import fnmatch

    needs = [n for c in calls if c.by_the_code for n in c.needs]
    return [f"{action} on {arn}" for arn, actions in granted.items() for action in actions
            if not any(n.action == action and fnmatch.fnmatchcase(n.resource, arn) for n in needs)]


def _pending_check(role: str, granted: set[str], unused: list[str]) -> list[str]:
    """The unused grants ("action on ...") that are not PENDING; a PENDING action among the `granted` ones that the code
    now uses fails (remove its entry)."""
    pending = {action for (r, action) in PENDING if r == role}
    used_now = (pending & granted) - {u.split(" on ", 1)[0] for u in unused}
    assert not used_now, f"{role}: shipped code now makes {sorted(used_now)}: remove it from PENDING"
    return [u for u in unused if u.split(" on ", 1)[0] not in pending]


CASES = [(LOCAL, r) for r in FUNCTION_ROLES] + [(PROD, r) for r in FUNCTION_ROLES] + [(FARGATE, "fargate")] + \
    [(name, "batch") for name in (LOCAL, PROD, FARGATE)]  # the role Bedrock assumes for batch jobs


@pytest.mark.parametrize("name,role", CASES, ids=[f"{n}-{r}" for n, r in CASES])
def test_every_call_the_code_makes_is_allowed(recorded: Recorded, synth: Synth, name: str, role: str) -> None:
    t = synth.templates[name]
    # GIVEN every call the role's code made, against moto, in the scenarios above
    needs = _needs(recorded.recorder.of(*CODE_OF[role]), _cluster(t), name)
    assert needs, role
    # THEN the role's policy in the synthesized template allows each one on its resource
    statements = _statements(recorded, t, role)
    denied = sorted(f"{c.service}:{c.operation} needs {n.action} on {n.resource} {dict(n.context) or ''}"
                    for n, c in needs.items() if not allowed(statements, n))
    assert not denied, f"{name} {role} role would get AccessDenied for:\n  " + "\n  ".join(denied)


def _target_arn(outputs: dict[str, str], target: str) -> str:
    kind, _, name = target.partition(":")
    if kind == "table":  # table:token-ledger -> TokenLedgerTableName
        table = name.title().replace("-", "")
        return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{outputs[f'{table}TableName']}"
    if kind == "index":
        table, index = name.split("/")
        return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{outputs[f'{table.title()}TableName']}/index/{index}"
    if kind == "objects":
        return f"arn:aws:s3:::{outputs['ArtifactBucketName']}/{name}*"
    if kind == "bucket":
        return f"arn:aws:s3:::{outputs['ArtifactBucketName']}"
    if kind == "topic":  # topic:job-events -> JobEventsTopicArn
        return outputs[f"{name.title().replace('-', '')}TopicArn"]
    if kind == "bus":
        return f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{name}"
    url = outputs[f"{name.title()}{'Queue' if kind == 'queue' else 'Dlq'}Url"]
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url.rsplit('/', 1)[-1]}"


@pytest.mark.parametrize("role", sorted(ACCESS))
def test_every_grant_is_used_by_the_code(recorded: Recorded, role: str) -> None:
    """`ACCESS` is trimmed to the calls the code makes: each (resource, action) it grants was used by a call shipped
    code made (a call the test makes itself does not count)."""
    granted: dict[str, tuple[str, ...]] = {}
    for access in ACCESS[role]:
        arn = _target_arn(recorded.aws.outputs, access.target)
        granted[arn] = granted.get(arn, ()) + access.actions
    unused = _pending_check(role, {a for actions in granted.values() for a in actions},
                            unused_grants(role, granted, recorded.recorder.of(*CODE_OF[role])))
    assert not unused, f"{role}: granted but never called by the code; remove it or add the scenario that needs " \
                       "it:\n  " + "\n  ".join(unused)


def test_no_recorded_call_is_the_tests_own(recorded: Recorded) -> None:
    """Every call recorded under a role was made by shipped code (its innermost frame under functions/ or
    review_local/) or is one a role's grant serves outside our code (aws_calls.DECLARED): the scenarios drive the
    code, they do not make its calls for it."""
    own = sorted({f"{c.role}: {c.service}:{c.operation}" for c in recorded.recorder.calls if not c.by_the_code})
    assert not own, "calls the test made itself, as if it were the code:\n  " + "\n  ".join(own)
    origins = {c.origin for c in recorded.recorder.of("collector")}
    assert any(o and o.startswith("functions/contract_review/adapters/batch_inference.py") for o in origins), origins


def test_a_grant_only_a_test_exercises_is_unused() -> None:
    """The rule above, on its own: the same call counts when shipped code makes it, and not when a test file does."""
    rec = Recorder(role="collector")
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name=REGION)
    rec.attach(session)
    bedrock = session.client("bedrock")
    job = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/abcdefabcdef"
    with Stubber(bedrock) as stub:
        stub.add_response("get_model_invocation_job", _job_answer(job))
        stub.add_response("stop_model_invocation_job", {})
        from contract_review.adapters.batch_inference import BedrockBatchInference

        BedrockBatchInference(bedrock, None, bucket="b", prefix="batch", role_arn="r", model_id="m").status(job)
        bedrock.stop_model_invocation_job(jobIdentifier=job)  # the test's own call, "as the collector"
    granted = {f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/*": ("bedrock:GetModelInvocationJob",
                                                                              "bedrock:StopModelInvocationJob")}
    get, stop = rec.calls
    assert get.origin == "functions/contract_review/adapters/batch_inference.py:_job" and stop.origin is None
    assert unused_grants("collector", granted, rec.calls) == [f"bedrock:StopModelInvocationJob on {job.rsplit('/', 1)[0]}/*"]


def _job_answer(arn: str) -> dict[str, Any]:
    return {"jobArn": arn, "jobName": "j", "modelId": "m", "roleArn": "arn:aws:iam::123456789012:role/r",
            "status": "InProgress", "submitTime": "2026-01-01T00:00:00Z",
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": "s3://b/i/"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://b/o/"}}}


def test_the_scenarios_reach_the_paths_they_are_for(recorded: Recorded) -> None:
    """The recording is only as good as its scenarios: the calls that once went missing were made."""
    ops = {(c.role, c.service, c.operation) for c in recorded.recorder.calls}
    assert ("fargate", "dynamodb", "Query") in ops and ("fargate", "sqs", "ReceiveMessage") in ops
    fargate = [n for c in recorded.recorder.of("fargate") for n in c.needs]
    assert any(n.resource.endswith("/index/by-lease") for n in fargate), "the poller's sweep queried the claims index"
    assert any(n.action == "s3:GetObject" and "/documents/" in n.resource for n in fargate), "it requeued a lost chunk"
    # the DLQs are the sweeper Lambda's: no poller reads one; a poller reads the open jobs only for priority
    # (pipeline/priority.py: is an interactive job open?), as the worker Lambda does
    assert not [n for n in fargate if n.action == "sqs:ReceiveMessage" and "dlq" in n.resource.lower()]
    for role in ("worker", "fargate"):
        assert any(n.resource.endswith("/index/by-open-state") for c in recorded.recorder.of(role) for n in c.needs)
    assert not [c for c in recorded.recorder.calls if c.operation == "Scan"], "nothing in the pipeline scans"
    # a settle (and an unsettle) is one transaction of the chunk record and the job item (the
    # settled count off the job item): UpdateItem on both tables, by each role that counts or uncounts chunks
    both = {Need("dynamodb:UpdateItem", _target_arn(recorded.aws.outputs, t)) for t in ("table:claims", "table:jobs")}
    settling = {c.role for c in recorded.recorder.calls if c.operation == "TransactWriteItems" and both <= set(c.needs)}
    assert settling >= {"aggregator", "sweeper", "api"}, settling
    assert ("sweeper", "dynamodb", "Query") in ops and any(
        n.resource.endswith("/index/by-open-state") for c in recorded.recorder.of("sweeper") for n in c.needs)
    assert ("worker", "bedrock-runtime", "Converse") in ops and ("worker", "bedrock", "GetFoundationModel") in ops
    assert ("worker", "dynamodb", "GetItem") in ops  # incl. the unprocessed-keys fallback on checkpoints
    assert recorded.protection_puts >= 2  # protected while busy, released when idle or stopped
    for role in ("aggregator", "sweeper"):  # the saga: outcome stored and freed, published, dead-lettered
        assert {(role, "dynamodb", "PutItem"), (role, "dynamodb", "DeleteItem"), (role, "sns", "Publish"),
                (role, "events", "PutEvents"), (role, "sqs", "SendMessage")} <= ops
    # the ticket system's credentials, read from its secret: first by the aggregator, then by each role again after
    # its rotated token's 403 (the two roles' scenarios share one process's cached value, as a Fargate task would)
    # batch inference: the collector (its own function) read the account's minimum, submitted and read jobs, passing
    # the service role; the stand-in, as Bedrock with that role, listed and read the input and wrote the output.
    # Nothing lists batch jobs, and the sweeper makes no batch call
    assert {("collector", "bedrock", op) for op in ("CreateModelInvocationJob", "GetModelInvocationJob",
                                                     "GetFoundationModel")} <= ops
    assert not [c for c in recorded.recorder.calls if c.operation == "ListModelInvocationJobs"]
    assert {c.operation for c in recorded.recorder.of("sweeper") if c.service == "bedrock"} <= {
        "GetFoundationModel", "GetInferenceProfile"}  # the model's name, for its quotas: no batch call
    # The model's quotas, read once: the sweeper reads Service Quotas and publishes them in their own
    # item of the control table; no worker (Lambda or Fargate) reads Service Quotas, at cold start or after
    assert ("sweeper", "service-quotas", "ListServiceQuotas") in ops
    assert any(c.operation == "UpdateItem" and c.service == "dynamodb" and any("ControlTable" in n.resource
                                                                              for n in c.needs)
               for c in recorded.recorder.of("sweeper"))
    assert not [c for c in recorded.recorder.of("worker", "fargate") if c.service == "service-quotas"]
    assert not [c for c in recorded.recorder.of("sweeper") if any("/batch/" in n.resource for n in c.needs)]
    assert {("batch", "s3", op) for op in ("ListObjectsV2", "GetObject", "PutObject")} <= ops
    reads = {role: sum(1 for c in recorded.recorder.of(role) if (c.service, c.operation) == ("secretsmanager",
                                                                                            "GetSecretValue"))
             for role in ("aggregator", "sweeper")}
    assert reads["aggregator"] >= 2 and reads["sweeper"] >= 1, reads


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_every_batch_grant_is_used_by_the_code(recorded: Recorded, synth: Synth, name: str) -> None:
    """The grants of infra/batch.py are outside `ACCESS`: each of the collector's Bedrock batch and PassRole actions,
    and each action of the service role, was needed by a call shipped code made (or Bedrock, with the service role)."""
    t = synth.templates[name]
    for role in ("collector", "batch"):
        needed = {n.action for c in _by_the_code(recorded, role) for n in c.needs}
        granted = {a for st in policy_statements_for_role(t, role_id(t, role))
                   for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
                   if a.startswith(("bedrock:", "iam:")) or role == "batch"}
        unused = _pending_check(role, granted, [f"{a} on *" for a in sorted(granted - needed)])
        assert granted and not unused, f"{role}: granted, never needed by the code: {unused}"


def test_the_service_role_may_not_read_or_write_outside_its_prefixes(recorded: Recorded, synth: Synth) -> None:
    """The evaluation the coverage test relies on refuses what the role must not do (so its passing means
    something): reading the documents or the output, writing the input, listing anything but batch/input/."""
    t = synth.templates[PROD]
    statements = _statements(recorded, t, "batch")
    bucket = f"arn:aws:s3:::{recorded.aws.outputs['ArtifactBucketName']}"
    assert allowed(statements, Need("s3:GetObject", f"{bucket}/batch/input/t/records.jsonl"))
    assert allowed(statements, Need("s3:ListBucket", bucket, (("s3:prefix", "batch/input/t/"),)))
    for refused in (Need("s3:GetObject", f"{bucket}/documents/j.txt"), Need("s3:GetObject", f"{bucket}/batch/output/x"),
                    Need("s3:PutObject", f"{bucket}/batch/input/t/records.jsonl"),
                    Need("s3:ListBucket", bucket, (("s3:prefix", "documents/"),)), Need("s3:ListBucket", bucket),
                    Need("s3:DeleteObject", f"{bucket}/batch/output/x")):
        assert not allowed(statements, refused), refused
    collector = _statements(recorded, t, "collector")
    role_arn = recorded.aws.resolve({"Fn::GetAtt": [role_id(t, "batch"), "Arn"]})
    assert allowed(collector, Need("iam:PassRole", role_arn, (("iam:PassedToService", "bedrock.amazonaws.com"),)))
    assert not allowed(collector, Need("iam:PassRole", role_arn, (("iam:PassedToService", "lambda.amazonaws.com"),)))
    assert not allowed(collector, Need("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/other",
                                       (("iam:PassedToService", "bedrock.amazonaws.com"),)))
    # Stop only on this stack's jobs (their review-stack tag), TagResource only with that tag's value
    job = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/abcdefabcdef"
    ours, theirs = (("aws:ResourceTag/review-stack", PROD),), (("aws:ResourceTag/review-stack", "other-stack"),)
    assert allowed(collector, Need("bedrock:StopModelInvocationJob", job, ours))
    for refused in (Need("bedrock:StopModelInvocationJob", job, theirs), Need("bedrock:StopModelInvocationJob", job),
                    Need("bedrock:TagResource", job, (("aws:RequestTag/review-stack", "other-stack"),)),
                    Need("bedrock:ListModelInvocationJobs", "*")):
        assert not allowed(collector, refused), refused
    assert allowed(collector, Need("bedrock:TagResource", job, (("aws:RequestTag/review-stack", PROD),)))


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_only_the_roles_that_call_the_ticket_system_may_read_its_secret(synth: Synth, name: str) -> None:
    """`-c ticket_secret_arn`: GetSecretValue on exactly that secret (given by its name: `<name>-??????` in the
    stack's account and region, the one secret of that name), for the roles that run the saga (aggregator, sweeper; Fargate's task role, whose
    in-process sweep compensates), and for no other role; no KMS grant without `-c ticket_secret_kms_key`."""
    t = synth.templates[name]
    roles = ["intake", "worker", "aggregator", "sweeper", "collector", "api"] + (["fargate"] if name == FARGATE else [])
    readers = {}
    for role in roles:
        statements = policy_statements_for_role(t, role_id(t, role))
        granted = [st for st in statements if "secretsmanager:GetSecretValue" in json.dumps(st["Action"])]
        if granted:
            readers[role] = [st["Resource"] for st in granted]
        assert not any("kms:Decrypt" in json.dumps(st["Action"]) for st in statements), role
    callers = {"aggregator", "sweeper"} | ({"fargate"} if name == FARGATE else set())
    secret = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":secretsmanager:", {"Ref": "AWS::Region"}, ":",
                                {"Ref": "AWS::AccountId"}, f":secret:{TICKET_SECRET_NAME}-??????"]]}
    assert readers == {role: [secret] for role in callers}
