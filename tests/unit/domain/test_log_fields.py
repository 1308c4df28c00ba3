"""Every log line about a job carries the fields known at that point (domain/log_fields.py), never the
document's text, never the raw idempotency key: a job run through the real intake, worker and aggregator
handlers (over the in-memory fakes), reading the JSON lines their Powertools loggers write."""

from __future__ import annotations

import io
import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest

from contract_review.domain.log_fields import key_hash
from contract_review.domain.ports import Queue
from contract_review.wiring import chunk_worker
from review_local.sandbox import LambdaContext, sqs_event

from ..fakes import FakeWorld, Sent
from ..inprocess import FaultyModel

SECRET = "ZEBRA-MARKER-7731"  # in the document only: no log line may show it
KEY = "customer-order 2026/ACME: renewal of the Delaware lease"  # user text: logged only as its hash
TEXT = (f"1. Governing Law. This Agreement shall be governed by the laws of the State of Delaware. {SECRET}\n\n"
        "2. Assignment. Neither party may assign this Agreement without the prior written consent of the other.\n")
# What each line must carry at its point in the job (on top of job_id)
WORKER = {"chunk_id", "step", "queue", "attempt", "lease_deadline", "idempotency_key_sha256", "state",
          "checkpoint_version", "external_ids", "cancel_requested"}
EXPECTED = {
    "intake processed": {"step", "queue", "attempt", "external_ids", "state", "idempotency_key_sha256",
                         "cancel_requested"},
    "chunk processed": WORKER,
    "result processed": {"chunk_id", "step", "queue", "attempt", "idempotency_key_sha256", "state",
                         "checkpoint_version", "external_ids", "cancel_requested"},
}


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """The handler modules, imported here (not at collection) with the namespace they have on AWS: a handler
    module imported without it would publish no metric in any later test of the session."""
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "ContractReview")
    from contract_review.handlers import aggregator, intake, worker

    return intake, worker, aggregator


@pytest.fixture
def handlers_read_world(world: FakeWorld, monkeypatch: pytest.MonkeyPatch, modules: tuple[Any, Any, Any]) -> FakeWorld:
    """The intake, worker and aggregator handlers run on `world` (the worker with the offline model behind a fault
    switch), publishing in the namespace they have on AWS."""
    intake_handler, worker_handler, aggregator_handler = modules
    w = world
    worker = chunk_worker(w.deps, FaultyModel(), rng=random.Random(7), sleep=lambda _s: None)
    for module in (intake_handler, aggregator_handler):
        monkeypatch.setattr(module, "deps", lambda: w.deps)
    monkeypatch.setattr(worker_handler, "chunk_worker", lambda: worker)
    for module in (worker_handler, aggregator_handler):
        monkeypatch.setattr(module.metrics, "namespace", "ContractReview")  # POWERTOOLS_METRICS_NAMESPACE on AWS
    return w


@pytest.fixture
def lines(modules: tuple[Any, Any, Any]) -> Iterator[io.StringIO]:
    """The handlers' structured log output (their Powertools handlers, which the core's loggers share)."""
    out = io.StringIO()
    handlers = [m.logger.registered_handler for m in modules]
    handlers += logging.getLogger("contract_review").handlers
    saved = [(h, h.setStream(out)) for h in handlers if isinstance(h, logging.StreamHandler)]  # type: ignore[func-returns-value]
    try:
        yield out
    finally:
        for h, stream in saved:
            h.setStream(stream)  # type: ignore[arg-type]


def _event(sent: list[Sent], queue: str, job_id: str | None = None) -> dict[str, Any]:
    attrs = {"ApproximateReceiveCount": "1", **({"MessageGroupId": job_id} if job_id else {})}
    return sqs_event([{"MessageId": s.message_id, "ReceiptHandle": f"rh-{s.message_id}", "Body": s.body,
                       "Attributes": attrs} for s in sent], f"arn:aws:sqs:us-east-1:123456789012:{queue}", "us-east-1")


def _ctx(name: str) -> LambdaContext:
    return LambdaContext(name, 512, 30, "req-1", "us-east-1")


@pytest.mark.usefixtures("handlers_read_world")
def test_every_line_about_a_job_carries_its_fields_and_no_document_text(world: FakeWorld, lines: io.StringIO,
                                                                        modules: tuple[Any, Any, Any]) -> None:
    intake_handler, worker_handler, aggregator_handler = modules
    # GIVEN a document with a user-chosen idempotency key, and a message that is no document
    world.queues.send_intake(json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": KEY}))
    world.queues.send_intake(json.dumps({"schema_version": 1, "document": {"text": ""}, "idempotency_key": KEY + "!"}))
    # WHEN the handlers run it: intake, each chunk through the worker, each result through the aggregator
    assert intake_handler.handler(_event(world.queues.drain(Queue.INTAKE), "intake"), _ctx("IntakeFn")) == \
        {"batchItemFailures": []}
    for _ in range(3):
        for s in world.queues.drain(Queue.ANALYSIS):
            worker_handler.handler(_event([s], "analysis"), _ctx("WorkerFn"))
        for s in world.queues.drain(Queue.RESULTS):
            aggregator_handler.handler(_event([s], "results.fifo", json.loads(s.body)["job_id"]), _ctx("AggregatorFn"))
    (job,) = [j for j in world.jobs.all() if j.state.value == "completed"]
    # THEN the output holds no document text and no raw key ...
    out = lines.getvalue()
    assert SECRET not in out and "Governing Law" not in out
    assert KEY not in out and json.dumps(KEY)[1:-1] not in out
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    about_jobs = [r for r in records if "job_id" in r]
    # ... and every line about a job carries what was known at its point
    seen = {r["message"] for r in about_jobs}
    assert set(EXPECTED) <= seen, seen
    for r in about_jobs:
        missing = EXPECTED.get(r["message"], set()) - set(r)
        assert not missing, (r["message"], missing)
    for r in (r for r in about_jobs if r["job_id"] == job.job_id and "idempotency_key_sha256" in r):
        assert r["idempotency_key_sha256"] == key_hash(KEY)
    worker_lines = [r for r in about_jobs if r["message"] == "chunk processed"]
    assert {r["chunk_id"] for r in worker_lines} == {c.chunk_id for c in world.claims.for_job(job.job_id)}
    assert all(r["step"] == "analysis" and r["queue"] == "analysis" and r["attempt"] == 1
               and r["state"] == "running" and r["cancel_requested"] is False and r["checkpoint_version"] >= 1
               and "sqs_message_id" in r["external_ids"] for r in worker_lines)
    ended = [r for r in about_jobs if r["message"] == "result processed" and r["outcome"] == "completed"]
    assert len(ended) == 1 and ended[0]["queue"] == "results"
    # the failed intake: its error code and state on its line
    (failed,) = [r for r in about_jobs if r["message"] == "intake processed" and r.get("error_code")]
    assert failed["state"] == "failed" and failed["error_code"].startswith("input.")


def test_fields_live_only_within_their_block_and_a_raw_key_in_extra_is_hashed() -> None:
    from contract_review.domain import log_fields

    # bind outside a bound block (the core called directly) leaves nothing behind for later lines
    log_fields.bind(log_fields.job_fields(job_id="job-leak"))
    assert log_fields.current() == {}
    record = logging.LogRecord("contract_review.x", logging.INFO, __file__, 1, "m", None, None)
    record.__dict__["idempotency_key"] = KEY  # a careless `extra={"idempotency_key": ...}`
    with log_fields.bound(log_fields.job_fields(job_id="job-1", queue="analysis")):
        log_fields.bind(log_fields.job_fields(chunk_id="c-0", external_ids={"sqs_message_id": "m-1"}))
        log_fields.bind(log_fields.job_fields(external_ids={"ticket_id": "T-9"}))
        assert log_fields.LogFieldsFilter().filter(record)
    assert log_fields.current() == {}
    fields = record.__dict__
    assert "idempotency_key" not in fields and fields["idempotency_key_sha256"] == key_hash(KEY)
    assert (fields["job_id"], fields["chunk_id"], fields["queue"]) == ("job-1", "c-0", "analysis")
    assert fields["external_ids"] == {"sqs_message_id": "m-1", "ticket_id": "T-9"}


def test_a_jobs_fields_name_its_side_effects_ids_and_hash_its_key() -> None:
    from contract_review.domain.log_fields import of_job
    from contract_review.domain.records import Job, JobState, SideEffectDone

    job = Job(job_id="job-1", state=JobState.CANCELLING, created_at=1.0, updated_at=2.0, idempotency_key=KEY,
              source_message_id="m-1", cancel_requested_at=2.0, error_code="job.cancelled",
              side_effects=[SideEffectDone(step="ticket.open", key="k", at=1.5, result={"ticket_id": "T-42",
                                                                                        "note": "free text"})])
    assert of_job(job) == {"job_id": "job-1", "state": "cancelling", "idempotency_key_sha256": key_hash(KEY),
                           "cancel_requested": True, "error_code": "job.cancelled",
                           "external_ids": {"source_message_id": "m-1", "ticket.open.ticket_id": "T-42"}}
