"""Report notifications (SNS topic + EventBridge default bus) and the compensation DLQ (SQS).

boto3 clients are passed in (built by `wiring.py`, never at import). SNS and EventBridge deliver
at least once, like everything else here: the event carries its idempotency key (`idempotency_key`
in the detail and an SNS message attribute) so a subscriber can drop a repeat; the saga itself
publishes once per key while its outcome is kept (Powertools idempotency).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, ReadTimeoutError
from pydantic import JsonValue

from contract_review.domain.effects import DeadLetter, JsonObject, SideEffectError
from contract_review.domain.errors import ErrorEnvelope, classify

EVENT_SOURCE = "contract-review"  # EventBridge `source` of every event the pipeline puts


def _failed(exc: Exception, step: str) -> SideEffectError:
    """An AWS call that failed: a read timeout or dropped connection may have published (unknown)."""
    cause = classify(exc, step=step)
    unknown = isinstance(exc, (ReadTimeoutError, ConnectionError))
    envelope = ErrorEnvelope.of("sideeffect.ambiguous" if unknown else "sideeffect.failed", cause.message,
                                http_status=cause.http_status, provider_code=cause.provider_code,
                                cause_code=cause.error_code, step=step)
    return SideEffectError(envelope, written="unknown" if unknown else "no", retryable=cause.retryable)


class SnsEventBridgeNotifier:
    """`Notifier`: one SNS message on the job-events topic and one EventBridge event per publish."""

    def __init__(self, sns: Any, events: Any, topic_arn: str, bus_name: str = "default",
                 source: str = EVENT_SOURCE):
        self.sns, self.events = sns, events
        self.topic_arn, self.bus_name, self.source = topic_arn, bus_name, source

    def publish(self, key: str, detail_type: str, detail: Mapping[str, JsonValue]) -> JsonObject:
        body = json.dumps({"detail-type": detail_type, "idempotency_key": key, **detail}, sort_keys=True)
        try:
            sns = self.sns.publish(
                TopicArn=self.topic_arn, Subject=detail_type[:100], Message=body,
                MessageAttributes={"idempotency_key": {"DataType": "String", "StringValue": key},
                                   "detail_type": {"DataType": "String", "StringValue": detail_type}})
            put = self.events.put_events(Entries=[{
                "Source": self.source, "DetailType": detail_type, "EventBusName": self.bus_name,
                "Detail": json.dumps({"idempotency_key": key, **detail}, sort_keys=True)}])
        except (ClientError, BotoCoreError) as e:
            raise _failed(e, "report.publish") from e
        entry = (put.get("Entries") or [{}])[0]
        if put.get("FailedEntryCount"):
            raise SideEffectError(ErrorEnvelope.of(
                "sideeffect.failed", "EventBridge did not take the event", provider_code=str(entry.get("ErrorCode")),
                step="report.publish"), written="no")
        return {"sns_message_id": str(sns.get("MessageId", "")), "event_id": str(entry.get("EventId", ""))}


class SqsCompensationDlq:
    """`CompensationDlq` on SQS: the envelope in message attributes, as the pipeline's other DLQs."""

    def __init__(self, sqs: Any, url: str):
        self.sqs, self.url = sqs, url

    def send(self, body: str, envelope: ErrorEnvelope, **attributes: str) -> None:
        attrs = {"error_code": envelope.error_code, "error_class": envelope.error_class.value,
                 "envelope": envelope.model_dump_json(), **attributes}
        self.sqs.send_message(
            QueueUrl=self.url, MessageBody=body,
            MessageAttributes={k: {"DataType": "String", "StringValue": v[:4096]} for k, v in attrs.items() if v})

    def take_all(self, visibility_s: int = 30) -> list[DeadLetter]:
        seen: dict[str, DeadLetter] = {}
        for _ in range(100):
            r = self.sqs.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, VisibilityTimeout=visibility_s,
                MessageAttributeNames=["All"], WaitTimeSeconds=0)
            batch = r.get("Messages", [])
            if not batch:
                break
            for m in batch:
                seen.setdefault(m["MessageId"], DeadLetter(
                    message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"], body=m["Body"],
                    attributes={k: v.get("StringValue", "") for k, v in m.get("MessageAttributes", {}).items()}))
        return list(seen.values())

    def delete(self, receipt_handle: str) -> None:
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=receipt_handle)

    def release(self, receipt_handle: str) -> None:
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt_handle, VisibilityTimeout=0)

    def in_flight(self) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
        return int(attrs["Attributes"].get("ApproximateNumberOfMessagesNotVisible", 0))
