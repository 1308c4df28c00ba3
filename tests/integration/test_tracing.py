"""Traces: one chunk through the worker Lambda handler and through the Fargate poller, against the deployed
template, with the X-Ray SDK's recorder switched on and its segments captured by an in-memory emitter (the
daemon's UDP socket, faked: the only thing that cannot run here). The chunk's trace shows each model call and
each DynamoDB and SQS call as a subsegment carrying the job and chunk as annotations."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core import patch, xray_recorder

from contract_review import handlers
from contract_review.handlers import tracing
from contract_review.pipeline.intake import handle_intake
from review_local.embedded import EmbeddedAws
from review_local.sandbox import LambdaContext, sqs_event

TEXT = ("1. Governing Law. This Agreement shall be governed by the laws of the State of Delaware.\n\n"
        "2. Assignment. Neither party may assign this Agreement without the prior written consent of the other.\n")


class FakeDaemonEmitter:
    """Stands in for the X-Ray daemon's UDP emitter: keeps every entity the recorder sends, as JSON."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_entity(self, entity: Any) -> None:
        self.sent.append(json.loads(entity.serialize()))

    def set_daemon_address(self, address: str | None) -> None:
        pass


@pytest.fixture
def traces() -> Iterator[FakeDaemonEmitter]:
    """The recorder on, every segment sampled and kept whole; off again after (offline, tracing is disabled)."""
    from contract_review.handlers import worker  # noqa: F401 -- its Tracer, disabled here, has switched the SDK off

    assert not tracing.enabled()  # offline, outside Lambda: nothing is traced, nothing is sent
    emitter = FakeDaemonEmitter()
    saved = (xray_recorder.emitter, xray_recorder.sampling, xray_recorder.streaming_threshold, xray_recorder.context)
    global_sdk_config.set_sdk_enabled(True)
    xray_recorder.configure(emitter=emitter, sampling=False, streaming_threshold=10_000,
                            context=tracing.InheritedContext(context_missing="IGNORE_ERROR"))
    patch(["botocore"])  # what Powertools Tracer does where it is enabled (Lambda, the poller with a daemon)
    try:
        yield emitter
    finally:
        xray_recorder.emitter, xray_recorder.sampling, xray_recorder.streaming_threshold = saved[:3]
        xray_recorder.context = saved[3]
        global_sdk_config.set_sdk_enabled(False)


def _subsegments(entity: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for sub in entity.get("subsegments", []):
        yield sub
        yield from _subsegments(sub)


def _one_chunk(aws: EmbeddedAws) -> tuple[str, dict[str, Any]]:
    deps = handlers.deps()
    job = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m1")
    assert job.job_id is not None
    r = aws.client("sqs").receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10,
                                          MessageSystemAttributeNames=["All"])
    (m,) = r["Messages"]
    return job.job_id, m


def _assert_chunk_trace(segment: dict[str, Any], job_id: str, chunk_id: str) -> None:
    subs = list(_subsegments(segment))
    mine = {"job_id": job_id, "chunk_id": chunk_id}

    def annotated(s: dict[str, Any]) -> bool:
        return {k: s.get("annotations", {}).get(k) for k in mine} == mine

    models = [s for s in subs if s["name"] == "model"]
    assert models and all(annotated(s) for s in models), models[:1]
    ddb = [s for s in subs if s.get("namespace") == "aws" and s["name"] == "dynamodb"]
    ops = {s["aws"]["operation"] for s in ddb}
    assert {"GetItem", "UpdateItem"} <= ops, ops  # the job read, the claim, the checkpoints, the settle
    assert all(annotated(s) for s in ddb), [s for s in ddb if not annotated(s)][:1]
    sqs = [s for s in subs if s.get("namespace") == "aws" and s["name"] == "sqs"]
    assert sqs and all(annotated(s) for s in sqs)  # the chunk's result sent to the results queue
    # the model calls ran in the analyst pool's threads: still under this chunk's segment
    assert len(models) >= 2


def test_a_chunk_through_the_worker_lambda_is_one_trace_of_its_model_and_aws_calls(lambda_env, traces,
                                                                                   monkeypatch) -> None:
    from contract_review.handlers import worker as worker_handler

    monkeypatch.setattr(worker_handler.metrics, "namespace", "ContractReview")  # whoever imported it first

    worker_handler.chunk_worker.cache_clear()
    job_id, m = _one_chunk(lambda_env)
    chunk_id = json.loads(m["Body"])["chunk_id"]
    event = sqs_event([m], "arn:aws:sqs:us-east-1:123456789012:analysis", "us-east-1")
    # GIVEN the invocation's segment (Lambda's facade segment, which the SDK finds in Lambda)
    xray_recorder.begin_segment("WorkerFn")
    try:
        # WHEN the handler runs the chunk
        response = worker_handler.handler(event, LambdaContext("WorkerFn", 1024, 20, "req-1", "us-east-1"))
    finally:
        xray_recorder.end_segment()
    worker_handler.chunk_worker.cache_clear()
    assert response == {"batchItemFailures": []}
    # THEN one segment was sent, and in it the chunk's model, DynamoDB and SQS calls, each annotated
    (segment,) = [e for e in traces.sent if e["name"] == "WorkerFn"]
    _assert_chunk_trace(segment, job_id, chunk_id)
    (record,) = [s for s in _subsegments(segment) if s["name"] == "chunk"]  # the record's own subsegment
    assert record["annotations"] == {"job_id": job_id, "chunk_id": chunk_id}
    assert {s["name"] for s in _subsegments(record)} >= {"model", "dynamodb", "sqs"}


def test_the_poller_opens_one_annotated_segment_per_chunk(lambda_env, traces) -> None:
    from contract_review.handlers import poller
    from contract_review.wiring import build_chunk_worker

    settings = handlers.settings().model_copy(update={"worker_kind": "fargate"})
    deps = handlers.deps()
    worker = build_chunk_worker(settings, deps, handlers.build_traced_model(settings, handlers.session()))
    job_id, m = _one_chunk(lambda_env)
    chunk_id = json.loads(m["Body"])["chunk_id"]
    stop = poller.Shutdown(settings.profile.fargate.fargate_stop_timeout_s)
    # its log lines, as main() sets them up (the core's loggers through the worker's structured handler)
    handlers.observe(Logger(service="worker"))
    out = io.StringIO()
    (handler,) = logging.getLogger("contract_review").handlers
    previous = handler.setStream(out)  # type: ignore[attr-defined]
    # WHEN the poller handles the message (no segment open: the poller opens its own)
    try:
        assert poller._process(worker, m, settings.profile.fargate.fargate_visibility_s, stop,
                               Metrics(service="worker"))
    finally:
        handler.setStream(previous)  # type: ignore[attr-defined]
    # THEN its line about the chunk carries the chunk's fields (and no document text)
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if '"message":"chunk done"' in x]
    assert {"job_id": job_id, "chunk_id": chunk_id, "step": "analysis", "queue": "analysis", "attempt": 1,
            "state": "running", "cancel_requested": False}.items() <= line.items()
    assert {"lease_deadline", "checkpoint_version", "idempotency_key_sha256", "external_ids"} <= set(line)
    assert "Governing Law" not in out.getvalue()
    # THEN its segment is the chunk's, annotated, with the chunk's calls under it
    (segment,) = [e for e in traces.sent if e["name"] == "worker-poller"]
    assert {k: segment["annotations"][k] for k in ("job_id", "chunk_id")} == {"job_id": job_id, "chunk_id": chunk_id}
    _assert_chunk_trace(segment, job_id, chunk_id)


def test_the_pollers_calls_outside_a_chunk_are_kept_out_of_traces_quietly(lambda_env, traces, caplog) -> None:
    """The poller's receives and deletes belong to no chunk: no trace, and no SDK warning per poll."""
    sqs = lambda_env.client("sqs")
    with caplog.at_level(logging.WARNING, logger="aws_xray_sdk"):
        sqs.list_queues()  # outside any segment: the SDK warns (what `untraced` is for)
        assert "No segment found" in caplog.text
        caplog.clear()
        with tracing.untraced():
            sqs.list_queues()
    assert "No segment found" not in caplog.text
    assert traces.sent == []  # the unsampled segment is never sent


def test_a_failed_model_call_is_traced_by_its_code_never_its_message(traces) -> None:
    from contract_review.domain import log_fields
    from contract_review.domain.errors import ReviewError

    secret = "the Licensee shall indemnify ZEBRA-7731"  # what a model error's message might quote
    xray_recorder.begin_segment("WorkerFn")
    try:
        with log_fields.bound(log_fields.job_fields(job_id="job-1", chunk_id="c-1")):
            with pytest.raises(ReviewError), tracing.span("model"):
                raise ReviewError.of("model.output_invalid", secret)
    finally:
        xray_recorder.end_segment()
    (segment,) = traces.sent
    (sub,) = segment["subsegments"]
    assert sub["error"] is True
    assert sub["annotations"] == {"job_id": "job-1", "chunk_id": "c-1", "error_type": "ReviewError",
                                  "error_code": "model.output_invalid"}
    assert "ZEBRA" not in json.dumps(segment)
