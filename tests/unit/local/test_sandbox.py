"""The local event-source-mapping emulator reads partial batch responses the way Lambda does."""

from __future__ import annotations

import pytest

from review_local.sandbox import failed_items, sqs_event

MESSAGES = [{"MessageId": "a", "ReceiptHandle": "ra", "Body": "{}", "Attributes": {"ApproximateReceiveCount": "2"},
             "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
            {"MessageId": "b", "ReceiptHandle": "rb", "Body": "{}"}]


@pytest.mark.parametrize("response,expected", [
    (None, set()),
    ({}, set()),
    ({"batchItemFailures": []}, set()),
    ({"batchItemFailures": [{"itemIdentifier": "b"}]}, {"b"}),
    ({"batchItemFailures": [{"itemIdentifier": "zzz"}]}, None),  # unknown id: whole batch fails
    ({"batchItemFailures": [{"itemIdentifier": ""}]}, None),
    ({"batchItemFailures": [{"id": "a"}]}, None),
    ("not a dict", None),
])
def test_partial_batch_response_is_read_like_lambda(response, expected):
    assert failed_items(response, MESSAGES) == expected


def test_event_is_lambda_shaped():
    event = sqs_event(MESSAGES, "arn:aws:sqs:us-east-1:123456789012:q", "us-east-1")
    rec = event["Records"][0]
    assert rec["messageId"] == "a" and rec["receiptHandle"] == "ra" and rec["eventSource"] == "aws:sqs"
    assert rec["eventSourceARN"].endswith(":q") and rec["attributes"]["ApproximateReceiveCount"] == "2"
    assert rec["messageAttributes"]["k"]["stringValue"] == "v" and rec["messageAttributes"]["k"]["dataType"] == "String"
