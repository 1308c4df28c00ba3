"""The Job API function's AWS calls, for tests/infra/test_role_coverage.py: its Lambda handler answers HTTP
API v2 events (built as the local server builds them) for every route and every AWS path behind them:
submit (inline, claim check, s3_uri), batches, reads, events, cancel, and retry of a dead-lettered job (its
DLQ copy removed, another message left) and of a job that failed in intake (its message taken back)."""

from __future__ import annotations

import json
import time
from typing import Any

from contract_review.domain import lifecycle
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import report_keys
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    AttemptStats,
    ChunkStatus,
    CoverageSummary,
    Job,
    JobFailure,
    JobOutcome,
    JobState,
    Reliability,
    job_id_for,
)
from contract_review.pipeline.intake import handle_intake
from review_local.api_server import http_api_event, local_principal
from review_local.embedded import EmbeddedAws
from review_local.sandbox import LambdaContext

from ..texts import LONG_TEXT, TEXT
from .aws_calls import REGION, Recorder, declared

WHO = local_principal("role-coverage")


def _call(rec: Recorder, method: str, path: str, body: object = None, query: str = "") -> dict[str, Any]:
    from contract_review.handlers import api as api_handler

    raw = b"" if body is None else json.dumps(body).encode()
    event = http_api_event(method, path, query, {"content-type": "application/json"}, raw, WHO, "api.test", "127.0.0.1")
    with rec.acting_as("api"):
        answer = api_handler.handler(event, LambdaContext("ApiFn", 512, 29, "r-api", REGION))
    assert isinstance(answer, dict)
    return {"status": answer["statusCode"], "body": json.loads(answer["body"] or "null")}


def _take_in(setup: Deps, aws: EmbeddedAws, want: int) -> None:
    """Intake (outside the recording) takes the API's messages in."""
    sqs, url, seen = aws.client("sqs"), setup.settings.intake_queue_url, 0
    deadline = time.monotonic() + 10
    while seen < want and time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
            handle_intake(setup, m["Body"], m["MessageId"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            seen += 1
    assert seen >= want, f"intake took {seen} of {want} API messages"


def _dead_lettered(setup: Deps, aws: EmbeddedAws, job_id: str) -> None:
    """The job's only chunk dead-lettered, its message in the analysis DLQ (next to someone else's)."""
    sqs = aws.client("sqs")
    [record] = setup.claims.for_job(job_id)
    won = setup.claims.claim(job_id, record.chunk_id, "w-api", 30, 1)
    assert setup.claims.finish(job_id, record.chunk_id, won.fence, ChunkStatus.DEAD_LETTERED, AttemptStats())
    setup.jobs.settle_chunk(job_id, record.chunk_id)
    assert lifecycle.move(setup, job_id, (JobState.RUNNING,), JobState.DEAD_LETTERED, event="job.dead_lettered")
    job = setup.jobs.get(job_id)
    assert job is not None
    body = AnalysisMessage(job_id=job_id, chunk_id=record.chunk_id, chunk_index=0, chunk_count=1, start=record.start,
                           end=record.end, text=TEXT).model_dump_json()
    for b in (body, "not ours"):
        sqs.send_message(QueueUrl=setup.settings.analysis_dlq_url, MessageBody=b)


def _failed_in_intake(setup: Deps, aws: EmbeddedAws) -> str:
    """A job of WHO that failed in intake, its message on the intake DLQ (next to someone else's)."""
    key = "api-intake-exhausted"
    job_id, now = job_id_for(key), time.time()
    env = ErrorEnvelope.of("runtime.intake_exhausted", "never finished")
    setup.jobs.create(Job(job_id=job_id, state=JobState.QUEUED, created_at=now, updated_at=now, idempotency_key=key,
                          principal=WHO))
    assert lifecycle.move(setup, job_id, (JobState.QUEUED,), JobState.FAILED, event="job.failed",
                          outcome=JobFailure(error=env, error_code=env.error_code, ended_at=now))
    body = json.dumps({"schema_version": 1, "idempotency_key": key, "document": {"text": TEXT}, "principal": WHO})
    sqs = aws.client("sqs")
    sqs.send_message(QueueUrl=setup.settings.intake_dlq_url, MessageBody=body,
                     MessageAttributes={"job_id": {"DataType": "String", "StringValue": job_id}})
    sqs.send_message(QueueUrl=setup.settings.intake_dlq_url, MessageBody="someone else's")
    return job_id


def _report(rec: Recorder, setup: Deps, job_id: str, bucket: str) -> None:
    """A completed job's report, read by its owner through the GET the API presigns."""
    json_key, md_key = report_keys(job_id)
    setup.artifacts.put_text(json_key, "{}")  # as finalize writes them (outside the recording)
    setup.artifacts.put_text(md_key, "# report", "text/markdown")
    outcome = JobOutcome(report_json_key=json_key, report_md_key=md_key, ended_at=time.time(), n_findings=0,
                         reliability=Reliability(), coverage_summary=CoverageSummary())
    assert lifecycle.move(setup, job_id, (JobState.RUNNING,), JobState.COMPLETED, outcome=outcome) is not None
    answer = _call(rec, "GET", f"/jobs/{job_id}/report", query="format=md")
    assert answer["status"] == 302 and md_key in answer["body"]["reportUrl"], answer
    rec.add("api", "s3", "GetObject", {"Bucket": bucket, "Key": md_key}, origin=declared("presigned-get"))


def run(rec: Recorder, setup: Deps, aws: EmbeddedAws) -> None:
    uploaded = _call(rec, "POST", "/uploads", {"name": "api-contract"})
    assert uploaded["status"] == 201, uploaded
    s3_uri = uploaded["body"]["s3Uri"]
    bucket, key = s3_uri.removeprefix("s3://").split("/", 1)
    setup.artifacts.put_text(key, LONG_TEXT, "text/plain")  # the caller's upload, with the presigned POST:
    rec.add("api", "s3", "PutObject", {"Bucket": bucket, "Key": key},  # S3 checks the signer's (the API role's) grant
            origin=declared("presigned-post"))
    big = "\n\n".join([LONG_TEXT] * (210_000 // len(LONG_TEXT) + 1))  # over the inline limit: claim check
    jobs = [_call(rec, "POST", "/jobs", {"document": d}) for d in (
        {"text": TEXT.replace("New York", "Ohio")}, {"text": big}, {"s3_uri": s3_uri},
        {"text": TEXT.replace("New York", "Utah")})]
    assert [j["status"] for j in jobs] == [202, 202, 202, 202], jobs
    batch = _call(rec, "POST", "/batches", [{"custom_id": "b1", "document": {"text": TEXT.replace("York", "Jersey")}},
                                            {"custom_id": "bad", "document": {"text": " "}}])
    assert batch["status"] == 202 and batch["body"]["accepted"] == 1, batch
    pending = jobs[0]["body"]["jobId"]
    assert _call(rec, "GET", f"/jobs/{pending}")["body"]["status"] == "queued"  # its submission answers
    _take_in(setup, aws, 5)
    for j in jobs:
        assert _call(rec, "GET", f"/jobs/{j['body']['jobId']}")["status"] == 200
        assert _call(rec, "GET", f"/jobs/{j['body']['jobId']}/events", query="after=0")["status"] == 200
    assert _call(rec, "GET", f"/batches/{batch['body']['batchId']}")["status"] == 200
    _report(rec, setup, jobs[3]["body"]["jobId"], bucket)
    # cancel the claim-checked job; retry a dead-lettered one and one that failed in intake
    assert _call(rec, "POST", f"/jobs/{jobs[1]['body']['jobId']}/cancel")["status"] == 202
    dead = jobs[0]["body"]["jobId"]
    _dead_lettered(setup, aws, dead)
    assert _call(rec, "POST", f"/jobs/{dead}/retry")["status"] == 202
    # retry a running job with a dead-lettered chunk that was counted: the chunk is uncounted (its mark and the
    # job's count off together, one transaction) and sent again
    running = jobs[2]["body"]["jobId"]
    record = setup.claims.for_job(running)[0]
    won = setup.claims.claim(running, record.chunk_id, "w-api", 30, 1)
    assert setup.claims.finish(running, record.chunk_id, won.fence, ChunkStatus.DEAD_LETTERED, AttemptStats())
    assert setup.jobs.settle_new_chunk(running, record.chunk_id) is not None
    assert _call(rec, "POST", f"/jobs/{running}/retry")["status"] == 202
    again = setup.jobs.get(running)
    assert again is not None and again.settled_count == 0 and not setup.claims.get(running, record.chunk_id).counted  # type: ignore[union-attr]
    exhausted = _failed_in_intake(setup, aws)
    assert _call(rec, "POST", f"/jobs/{exhausted}/retry")["status"] == 202
    assert _call(rec, "POST", f"/jobs/{dead}/approval", {"decision": "approve"})["status"] in (202, 409)
    for url in (setup.settings.analysis_dlq_url, setup.settings.intake_dlq_url, setup.settings.intake_queue_url):
        aws.client("sqs").purge_queue(QueueUrl=url)  # nothing of this scenario is left for the next
