"""The stack's queues (`Queues`): sends in batches with per-entry retry, peeks without hiding,
dead-letters with the error envelope in message attributes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import SQS_MAX_BATCH, AnalysisMessage, JobControl, ResultMessage, size_batches
from contract_review.domain.ports import DLQS, Queue, QueueMessage

SQS_BATCH = SQS_MAX_BATCH
BATCH_SEND_ATTEMPTS = 5


def _message(m: dict[str, Any]) -> QueueMessage:
    attrs = m.get("Attributes", {})
    return QueueMessage(
        message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"], body=m["Body"],
        attributes={k: v.get("StringValue", "") for k, v in m.get("MessageAttributes", {}).items()},
        receive_count=int(attrs.get("ApproximateReceiveCount", 0)),
        sent_at=int(attrs.get("SentTimestamp", 0)) / 1000)


class SqsQueues:
    def __init__(self, client: Any, urls: Mapping[Queue, str], sleep: Any = time.sleep):
        self.client = client
        self.urls = {q: u for q, u in urls.items() if u}
        self.sleep = sleep

    def has(self, queue: Queue) -> bool:
        return queue in self.urls

    def url(self, queue: Queue) -> str:
        try:
            return self.urls[queue]
        except KeyError:
            raise ValueError(f"queue {queue.value} is not configured") from None

    def send_analysis(self, messages: Sequence[AnalysisMessage], delay_s: int = 0) -> None:
        url = self.url(Queue.ANALYSIS)
        # batches by count and by size in bytes (10 messages of 4-byte characters can pass 256 KiB)
        for batch in size_batches([m.model_dump_json() for m in messages]):
            pending = [{"Id": str(n), "MessageBody": body, **({"DelaySeconds": delay_s} if delay_s else {})}
                       for n, body in enumerate(batch)]
            for _ in range(BATCH_SEND_ATTEMPTS):
                r = self.client.send_message_batch(QueueUrl=url, Entries=pending)
                failed = {f["Id"] for f in r.get("Failed", [])}
                pending = [e for e in pending if e["Id"] in failed]
                if not pending:
                    break
                self.sleep(0.2)
            if pending:
                raise RuntimeError(f"SQS refused {len(pending)} analysis messages")

    def send_result(self, message: ResultMessage | JobControl, dedup_id: str) -> None:
        self.client.send_message(QueueUrl=self.url(Queue.RESULTS), MessageBody=message.model_dump_json(),
                                 MessageGroupId=message.job_id, MessageDeduplicationId=dedup_id[:128])

    def send_intake(self, body: str) -> None:
        self.client.send_message(QueueUrl=self.url(Queue.INTAKE), MessageBody=body)

    def extend_visibility(self, queue: Queue, receipt_handle: str, seconds: int) -> None:
        self.client.change_message_visibility(QueueUrl=self.url(queue), ReceiptHandle=receipt_handle,
                                              VisibilityTimeout=seconds)

    def dead_letter(self, queue: Queue, body: str, envelope: ErrorEnvelope, **attributes: str) -> None:
        attrs = {"error_code": envelope.error_code, "error_class": envelope.error_class.value,
                 "envelope": envelope.model_dump_json(), **attributes}
        self.client.send_message(QueueUrl=self.url(DLQS[queue]), MessageBody=body, MessageAttributes={
            k: {"DataType": "String", "StringValue": v[:4096]} for k, v in attrs.items() if v})

    def _receive(self, url: str, visibility_s: int) -> list[QueueMessage]:
        r = self.client.receive_message(QueueUrl=url, MaxNumberOfMessages=SQS_BATCH, VisibilityTimeout=visibility_s,
                                        MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
                                        WaitTimeSeconds=0)
        return [_message(m) for m in r.get("Messages", [])]

    def peek(self, queue: Queue, max_rounds: int = 20) -> list[QueueMessage]:
        """Read with VisibilityTimeout=0 until two rounds bring nothing new (deduplicated). Each message
        keeps its latest receipt handle: SQS deletes a message by the most recent one (the sweeper does)."""
        url = self.url(queue)
        seen: dict[str, QueueMessage] = {}
        quiet = 0
        for _ in range(max_rounds):
            batch = self._receive(url, 0)
            new = [m for m in batch if m.message_id not in seen]
            for m in batch:
                seen[m.message_id] = m
            quiet = 0 if new else quiet + 1
            if quiet >= 2:
                break
        return list(seen.values())

    def take_all(self, queue: Queue, visibility_s: int = 30) -> list[QueueMessage]:
        url = self.url(queue)
        seen: dict[str, QueueMessage] = {}
        for _ in range(100):
            batch = self._receive(url, visibility_s)
            if not batch:
                break
            for m in batch:
                seen.setdefault(m.message_id, m)
        return list(seen.values())

    def delete(self, queue: Queue, receipt_handle: str) -> None:
        self.client.delete_message(QueueUrl=self.url(queue), ReceiptHandle=receipt_handle)

    def depth(self, queue: Queue) -> int:
        attrs = self.client.get_queue_attributes(QueueUrl=self.url(queue), AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        return sum(int(v) for v in attrs.values())
