"""The real Lambda handlers, invoked in-process with Lambda-shaped events against the deployed
template: partial batch responses, one bad record never failing its batch-mates."""

from __future__ import annotations

import json
from typing import Any

from contract_review import handlers
from contract_review.pipeline.intake import handle_intake
from review_local.sandbox import LambdaContext, sqs_event

TEXT = ("1. Governing Law. This Agreement shall be governed by the laws of the State of Delaware.\n\n"
        "2. Assignment. Neither party may assign this Agreement without the prior written consent of the other.\n")


def _receive_all(sqs: Any, url: str) -> list[dict[str, Any]]:
    r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    return r.get("Messages", [])


def test_worker_handler_reports_only_the_bad_record(lambda_env):
    from contract_review.handlers import worker as worker_handler

    worker_handler.chunk_worker.cache_clear()
    deps = handlers.deps()
    job = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m1")
    sqs = lambda_env.client("sqs")
    good = _receive_all(sqs, deps.settings.analysis_queue_url)
    assert len(good) == 1
    bad = {**good[0], "MessageId": "bad-1", "ReceiptHandle": "rh-bad", "Body": '{"not": "a chunk"}'}
    event = sqs_event([bad, good[0]], "arn:aws:sqs:us-east-1:123456789012:analysis", "us-east-1")
    ctx = LambdaContext("WorkerFn", 1024, 20, "req-1", "us-east-1")
    response = worker_handler.handler(event, ctx)
    assert response == {"batchItemFailures": [{"itemIdentifier": "bad-1"}]}
    (record,) = deps.claims.for_job(job.job_id)  # type: ignore[arg-type]  # a valid document always names its job
    assert record.status == "done"  # the batch-mate went through
    worker_handler.chunk_worker.cache_clear()


def test_intake_handler_poison_record_does_not_fail_the_batch(lambda_env):
    from contract_review.handlers import intake as intake_handler

    deps = handlers.deps()
    ok = {"MessageId": "ok-1", "ReceiptHandle": "rh1", "Body": json.dumps({"schema_version": 1, "document": {"text": TEXT}})}
    poison = {"MessageId": "poison-1", "ReceiptHandle": "rh2", "Body": "{nope"}
    event = sqs_event([poison, ok], "arn:aws:sqs:us-east-1:123456789012:intake", "us-east-1")
    response = intake_handler.handler(event, LambdaContext("IntakeFn", 512, 10, "req-2", "us-east-1"))
    # the poison message is not retried: it went to the DLQ with its envelope, and the record succeeded
    assert response == {"batchItemFailures": []}
    (dlq,) = _receive_all(lambda_env.client("sqs"), deps.settings.intake_dlq_url)
    assert dlq["Body"] == "{nope"
    jobs = deps.jobs.all()
    assert [j.state for j in jobs] == ["running"]
