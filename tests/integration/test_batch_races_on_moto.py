"""The batch collector's races (tests/unit/pipeline/test_batch_collector.py) on the real adapters:
DynamoDB conditional writes, S3 and SQS of the deployed template on moto, and Bedrock batch inference's stand-in
(review_local/batch_service.py) reading and writing that S3 through boto3's own `bedrock` client. One repository call
is wrapped so that the interleaving happens exactly there; the job must then end the way a fault-free run does."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from contract_review.adapters.batch_inference import BedrockBatchInference
from contract_review.domain.keys import BATCH_OPEN_PREFIX, BATCH_PREFIX
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import ChunkStatus, Job, JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline import batch_inference_collect, batch_inference_run
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker
from review_local.batch_service import BedrockBatchStandIn
from review_local.embedded import EmbeddedAws

from ..texts import TEXT
from .conftest import emptied, get_job

ROLE = "arn:aws:iam::123456789012:role/BatchServiceRole"
CHUNK_RECORDS, CHUNKS = 11, 4  # TEXT in 150-character chunks: 4 chunks, 11 analysts' locate requests each


def _deps(embedded: EmbeddedAws, service: BedrockBatchStandIn, minimum: int) -> Deps:
    deps = emptied(embedded)
    for key in deps.artifacts.list_keys(BATCH_OPEN_PREFIX):  # and no batch job of an earlier case to follow
        deps.artifacts.delete(key)
    s = deps.settings
    settings = s.model_copy(update={"profile": s.profile.with_overrides(
        chunk_target_chars=150, chunk_min_chars=0, batch_min_records=minimum)})
    bedrock = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                            region_name=embedded.region).client("bedrock", endpoint_url=service.url)
    adapter = BedrockBatchInference(bedrock, service.s3, bucket=s.bucket, prefix=BATCH_PREFIX, role_arn=ROLE,
                                    model_id=s.effective_model_id, stack_tag="test-stack")
    return dataclasses.replace(deps, settings=settings, batch_inference=adapter)


@pytest.fixture
def service(embedded: EmbeddedAws) -> Iterator[BedrockBatchStandIn]:
    with BedrockBatchStandIn(embedded.client("s3"), step_s=0.02, min_records=CHUNKS * CHUNK_RECORDS) as svc:
        yield svc


def _take(deps: Deps, queue: Queue) -> list[str]:
    out = []
    for m in deps.queues.take_all(queue, visibility_s=30):
        deps.queues.delete(queue, m.receipt_handle)
        out.append(m.body)
    return out


def _work(deps: Deps) -> list[str]:
    """Every analysis message worked once, every result aggregated: the chunk ids worked."""
    worker = chunk_worker(deps, OfflineRuleModel(), rng=random.Random(1), sleep=lambda _s: None)
    worked = []
    for body in _take(deps, Queue.ANALYSIS):
        msg = AnalysisMessage.model_validate_json(body)
        worker.handle(msg, Delivery(message_id="m", receipt_handle="", receive_count=1, visibility_s=120))
        worked.append(msg.chunk_id)
    for body in _take(deps, Queue.RESULTS):
        handle_result(deps, ResultMessage.model_validate_json(body))
    return worked


def _parked_job(deps: Deps, key: str) -> str:
    result = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": key,
                                             "inference": "batch"}), f"m-{key}")
    assert result.job_id is not None
    _work(deps)
    chunks = deps.claims.for_job(result.job_id)
    assert len(chunks) == CHUNKS and all(c.status is ChunkStatus.AWAITING_BATCH for c in chunks)
    return result.job_id


def _run_to_the_end(deps: Deps, job_id: str, timeout: float = 90) -> Job:
    """Collect, work, aggregate until the job ends (the stand-in's batch jobs take a fraction of a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch_inference_collect.collect(deps, deps.clock())
        _work(deps)
        job = get_job(deps, job_id)
        if job.terminal:
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not end in {timeout} s")


def _wait_ended(service: BedrockBatchStandIn) -> None:
    deadline = time.monotonic() + 30
    while any(j.status not in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
              for j in service.jobs.values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_returned_chunk_whose_send_failed_is_sent_by_the_next_collect_on_dynamodb(
        embedded: EmbeddedAws, service: BedrockBatchStandIn) -> None:
    # GIVEN a batch-mode job whose chunks are in a batch job that has ended
    deps = _deps(embedded, service, CHUNKS * CHUNK_RECORDS)
    job_id = _parked_job(deps, "race-batch-send")
    assert batch_inference_collect.collect(deps, deps.clock()).submitted
    _wait_ended(service)
    # AND an SQS send that fails once, right after the conditional write that made the first chunk pending
    real = deps.queues.send_analysis
    failed: list[int] = []

    def send_fails_once(messages: Any, delay_s: int = 0) -> None:
        if not failed:
            failed.append(len(messages))
            raise ConnectionError("SQS unreachable")
        real(messages, delay_s)
    setattr(deps.queues, "send_analysis", send_fails_once)  # noqa: B010 -- wrapping one call of the real adapter
    with pytest.raises(ConnectionError):
        batch_inference_collect.collect(deps, deps.clock())
    setattr(deps.queues, "send_analysis", real)  # noqa: B010 -- restored
    stranded = [c for c in deps.claims.for_job(job_id) if c.status is ChunkStatus.PENDING]
    assert stranded and all(c.batch_message_due for c in stranded)
    assert _take(deps, Queue.ANALYSIS) == []
    # WHEN the next collect runs THEN every returned chunk has its message, each recorded as sent
    report = batch_inference_collect.collect(deps, deps.clock())
    assert report.resent == len(stranded)
    sent = [AnalysisMessage.model_validate_json(m.body) for m in deps.queues.peek(Queue.ANALYSIS)]
    assert {c.chunk_id for c in stranded} <= {m.chunk_id for m in sent}
    assert not any(c.batch_message_due for c in deps.claims.for_job(job_id))
    # AND the job completes with a report, in batch
    job = _run_to_the_end(deps, job_id)
    assert job.state is JobState.COMPLETED and all(c.counted for c in deps.claims.for_job(job_id))


@pytest.mark.parametrize("minimum", [CHUNKS * CHUNK_RECORDS, 2 * CHUNK_RECORDS], ids=["B-waits", "B-packs-the-rest"])
def test_two_collects_at_once_never_submit_a_partial_batch_job_on_dynamodb(
        embedded: EmbeddedAws, service: BedrockBatchStandIn, minimum: int) -> None:
    # GIVEN parked chunks, and a minimum per batch job (the stand-in holds its validation to it)
    service.min_records = minimum
    deps = _deps(embedded, service, minimum)
    job_id = _parked_job(deps, f"race-batch-seal-{minimum}")
    # AND collect B runs whole while collect A has tagged its first chunk (DynamoDB's conditional write) and no other
    real = deps.claims.assign_batch
    b_reports: list[batch_inference_run.CollectReport] = []

    def assign_then_b(job: str, chunk_id: str, fence: int, token: str | None, expected: str | None) -> Any:
        won = real(job, chunk_id, fence, token, expected)
        if not b_reports and token is not None:
            setattr(deps.claims, "assign_batch", real)  # noqa: B010 -- B runs with the plain adapter
            b_reports.append(batch_inference_collect.collect(deps, deps.clock()))
            setattr(deps.claims, "assign_batch", assign_then_b)  # noqa: B010
        return won
    setattr(deps.claims, "assign_batch", assign_then_b)  # noqa: B010 -- wrapping one call of the real adapter
    a_report = batch_inference_collect.collect(deps, deps.clock())
    setattr(deps.claims, "assign_batch", real)  # noqa: B010 -- restored
    (b_report,) = b_reports
    # THEN no token was submitted by both; every batch job created holds at least the minimum, and every chunk that
    # names a batch job has its records in that job's input
    assert not set(a_report.submitted) & set(b_report.submitted)
    _wait_ended(service)
    assert all(j.status in ("Completed", "PartiallyCompleted") for j in service.jobs.values())
    for c in deps.claims.for_job(job_id):
        if c.batch_token is not None:
            arn = service.tokens[c.batch_token]
            inputs = service._read_input(service.job(arn))
            ids = {r["recordId"] for _, records in inputs for r in records if r is not None}
            pending = deps.artifacts.get_text(c.batch_pending_key or "").splitlines()
            assert {json.loads(line)["recordId"] for line in pending} <= ids
    # AND the job completes with a report, no record of it missing from the batch job that held it
    job = _run_to_the_end(deps, job_id)
    assert job.state is JobState.COMPLETED
    returned = [e.detail for e in deps.jobs.events(job_id) if e.type == "batch.returned"]
    assert returned and not any(e.get("error_code") for e in returned)
    assert all(j.request["tags"] == [{"key": "review-stack", "value": "test-stack"}] for j in service.jobs.values())
