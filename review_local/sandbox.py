"""One emulated Lambda sandbox (a separate OS process): poll, invoke the real handler, ack.

Started by LocalRuntime as a process forked from a server that has already imported the heavy modules
(`forked`: Python's multiprocessing forkserver, see runtime.py), or by hand:
python -m review_local.sandbox '<FunctionSpec JSON>'

Behaves like Lambda's SQS event source mapping: batches up to BatchSize, an event shaped like
Lambda's, a context whose remaining time follows the function timeout, deletes only the records
not listed in `batchItemFailures` (when ReportBatchItemFailures is on), deletes nothing when the
handler raises, and the sandbox dies (and is replaced) when the invocation exceeds its timeout.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3


@dataclass
class LambdaContext:
    function_name: str
    memory_limit_in_mb: int
    timeout_s: int
    aws_request_id: str
    region: str

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        self.invoked_function_arn = f"arn:aws:lambda:{self.region}:123456789012:function:{self.function_name}"
        self.function_version = "$LATEST"
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = time.strftime("%Y/%m/%d/[$LATEST]") + uuid.uuid4().hex
        self.identity = None
        self.client_context = None

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


IDLE_MIN_S, IDLE_MAX_S = 0.05, 0.5


def _on_timeout(signum: int, frame: Any) -> None:
    # Lambda ends a timed-out invocation by discarding the sandbox: no cleanup, no acks.
    sys.stderr.write("Task timed out\n")
    sys.stderr.flush()
    os._exit(124)


def _on_stop(signum: int, frame: Any) -> None:
    # The stack stops (`review up` ends): the sandbox is discarded as Lambda discards one, at once. An invocation
    # cut short is a crash the pipeline recovers from; an interpreter's teardown would only cost seconds per sandbox.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sqs_event(messages: Sequence[Mapping[str, Any]], arn: str, region: str) -> dict[str, Any]:
    records = []
    for m in messages:
        attrs = {k: v for k, v in m.get("Attributes", {}).items()}
        records.append({
            "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
            "attributes": attrs,
            "messageAttributes": {k: {"stringValue": v.get("StringValue"), "binaryValue": v.get("BinaryValue"),
                                      "stringListValues": [], "binaryListValues": [], "dataType": v["DataType"]}
                                  for k, v in m.get("MessageAttributes", {}).items()},
            "md5OfBody": m.get("MD5OfBody", ""), "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": region,
        })
    return {"Records": records}


def _report(what: str, exc: BaseException) -> None:
    """Where it failed, and the exception type; never the message (it may quote a document)."""
    sys.stderr.write(f"{what}: {type(exc).__name__}\n{''.join(traceback.format_tb(exc.__traceback__))}")


def failed_items(response: Any, messages: Sequence[Mapping[str, Any]]) -> set[str] | None:
    """Lambda's reading of a ReportBatchItemFailures response: the ids to keep, or None when the
    response is invalid (then the whole batch counts as failed)."""
    if response is None or response == {}:
        return set()
    if not isinstance(response, dict):
        return None
    items = response.get("batchItemFailures") or []
    ids = {m["MessageId"] for m in messages}
    failed: set[str] = set()
    for item in items:
        ident = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not ident or ident not in ids:
            return None
        failed.add(ident)
    return failed


def main(spec: dict[str, Any]) -> None:
    region = os.environ.get("AWS_REGION", "us-east-1")
    module, func = spec["handler"].rsplit(".", 1)
    if spec["handler"] == "contract_review.handlers.poller.main":  # a Fargate task: a long-running poller
        getattr(importlib.import_module(module), func)()
        return
    handler = getattr(importlib.import_module(module), func)
    signal.signal(signal.SIGALRM, _on_timeout)
    signal.signal(signal.SIGTERM, _on_stop)

    def invoke(event: dict[str, Any]) -> Any:
        ctx = LambdaContext(spec["logical_id"], spec["memory_mb"], spec["timeout_s"], str(uuid.uuid4()), region)
        signal.setitimer(signal.ITIMER_REAL, spec["timeout_s"])
        try:
            return handler(event, ctx)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    if spec.get("schedule_s"):
        while True:
            started = time.monotonic()
            try:
                invoke({"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
                        "source": "aws.events", "account": "123456789012",
                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "region": region, "resources": [], "detail": {}})
            except Exception as exc:  # a failed scheduled run; EventBridge would simply invoke again
                _report("scheduled invocation failed", exc)
            time.sleep(max(0.0, spec["schedule_s"] - (time.monotonic() - started)))

    sqs = boto3.client("sqs", region_name=region)
    url, arn = spec["queue_url"], spec["queue_arn"]
    idle = IDLE_MIN_S
    while True:
        # Short polls with a client-side idle backoff: moto's long poll spins (holding the GIL of
        # the moto server) while a FIFO group is in flight, which slows every other request.
        r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=min(10, spec["batch_size"]), WaitTimeSeconds=0,
                                MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"])
        messages = r.get("Messages", [])
        if not messages:
            time.sleep(idle)
            idle = min(IDLE_MAX_S, idle * 2)
            continue
        idle = IDLE_MIN_S
        try:
            response = invoke(sqs_event(messages, arn, region))
        except Exception as exc:  # a function error: the whole batch returns after its visibility timeout
            _report("invocation failed", exc)
            continue
        failed = failed_items(response, messages) if spec["report_batch_item_failures"] else set()
        if failed is None:
            sys.stderr.write("invalid batch response: the whole batch fails, as on Lambda\n")
            continue
        done = [m for m in messages if m["MessageId"] not in failed]
        for i in range(0, len(done), 10):
            sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                                                            for n, m in enumerate(done[i:i + 10])])


def forked(spec: dict[str, Any], env: dict[str, str], cwd: str, log_path: str) -> None:
    """A sandbox started from the runtime's forkserver: what `subprocess.Popen(start_new_session=True, env=...,
    cwd=..., stdout=log, stderr=STDOUT)` would give a new process (its own session, so the runtime can signal its
    group; its function's environment; stdout and stderr appended to its log), then `main`. The handler module
    is imported here, after the environment is set: it reads the environment at import (Powertools)."""
    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # as PYTHONUNBUFFERED: a kill -9 loses no line
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    main(spec)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
