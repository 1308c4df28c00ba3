"""Message sizes are counted in bytes before sending: SQS takes at most 256 KiB per message and per
SendMessageBatch (the sum of its bodies). Ten chunks of control characters (6 JSON bytes each) are
360 KB; the queue adapter splits such a batch, and no chunk can make one message over the limit."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from contract_review.adapters.queues import SqsQueues
from contract_review.config.profile import get_profile
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Queue

LOCAL = get_profile("local")
MAX_CHARS = LOCAL.review.chunk_max_chars
# SQS's limit (config.SQS_MAX_MESSAGE_BYTES, checked below). The names added with byte-sized batches are
# imported inside the tests that use them, so the adapter test also runs (and fails) on the code before.
SQS_MAX_MESSAGE_BYTES = 262_144


def body_bytes(body: str) -> int:
    return len(body.encode("utf-8"))


class StrictSqs:
    """A SendMessageBatch that refuses what SQS refuses (moto takes up to 1 MiB): more than 10 entries,
    a body over 256 KiB, a batch whose bodies add up to more than 256 KiB."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        sizes = [len(e["MessageBody"].encode("utf-8")) for e in Entries]
        if len(Entries) > 10:
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"}},
                              "SendMessageBatch")
        if max(sizes) > SQS_MAX_MESSAGE_BYTES or sum(sizes) > SQS_MAX_MESSAGE_BYTES:
            raise ClientError({"Error": {"Code": "AWS.SimpleQueueService.BatchRequestTooLong"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "SendMessageBatch")
        self.batches.append(sizes)
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


def chunk_message(i: int, text: str) -> AnalysisMessage:
    return AnalysisMessage(job_id="job-0123456789abcdef0123", chunk_id=f"c{i:05d}-0123456789ab", chunk_index=i,
                           chunk_count=1385, start=i * len(text), end=(i + 1) * len(text), text=text,
                           checkpoint_version="0123456789abcdef", resume_from=["liability", "indemnity"])


@pytest.mark.parametrize("char,bytes_per_char", [("\x01", 6), ("𝄞", 4), ("é", 2), ("a", 1)],
                         ids=["control", "4-byte", "2-byte", "ascii"])
def test_a_page_of_full_chunks_is_sent_in_batches_sqs_accepts(char: str, bytes_per_char: int):
    # GIVEN ten chunk messages at the chunk size limit, of characters that take `bytes_per_char` in JSON
    messages = [chunk_message(i, char * MAX_CHARS) for i in range(10)]
    sizes = [body_bytes(m.model_dump_json()) for m in messages]
    assert all(MAX_CHARS * bytes_per_char < s < MAX_CHARS * bytes_per_char + 1024 for s in sizes)
    sqs = StrictSqs()
    # WHEN the queue adapter sends them
    SqsQueues(sqs, {Queue.ANALYSIS: "analysis"}).send_analysis(messages)
    # THEN SQS took every message, in order, in as few batches as its limits allow
    assert [s for batch in sqs.batches for s in batch] == sizes
    assert all(len(b) <= 10 and sum(b) <= SQS_MAX_MESSAGE_BYTES for b in sqs.batches)
    assert len(sqs.batches) == (1 if sum(sizes) <= SQS_MAX_MESSAGE_BYTES else 2)


def test_batches_keep_order_and_respect_count_and_bytes():
    from contract_review.config.constants import SQS_MAX_MESSAGE_BYTES as LIMIT
    from contract_review.domain.messages import size_batches

    assert LIMIT == SQS_MAX_MESSAGE_BYTES
    bodies = ["x" * n for n in (100, 200_000, 70_000, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 262_144)]
    batches = size_batches(bodies)
    assert [b for batch in batches for b in batch] == bodies
    assert [len(b) for b in batches] == [2, 10, 1, 1]  # 200,100 + 70,000 > 256 KiB; ten at most; the full one alone
    assert all(sum(len(b) for b in batch) <= SQS_MAX_MESSAGE_BYTES for batch in batches)
    assert size_batches([]) == []


def test_a_message_over_the_limit_is_never_sent():
    from contract_review.domain.messages import MessageTooLarge

    sqs = StrictSqs()
    too_big = chunk_message(0, "a" * SQS_MAX_MESSAGE_BYTES)
    with pytest.raises(MessageTooLarge, match="over SQS's 262,144-byte limit"):
        SqsQueues(sqs, {Queue.ANALYSIS: "analysis"}).send_analysis([chunk_message(1, "ok"), too_big])
    assert sqs.batches == []  # nothing of the page went out


def test_the_worst_chunk_the_profiles_allow_fits_one_message():
    # a chunk of chunk_max_chars control characters: the largest message chunking can produce
    for name in ("prod", "local"):
        worst = chunk_message(0, "\x1f" * get_profile(name).review.chunk_max_chars)
        assert body_bytes(worst.model_dump_json()) <= SQS_MAX_MESSAGE_BYTES // 6


def test_a_profile_whose_chunks_could_overflow_a_message_is_refused():
    with pytest.raises(ValidationError, match="could make an analysis message over SQS"):
        LOCAL.model_validate({**LOCAL.model_dump(), "chunk_target_chars": 40_000, "chunk_max_chars": 50_000})
    with pytest.raises(ValidationError, match="fanout_page <= fanout_window"):
        LOCAL.model_validate({**LOCAL.model_dump(), "fanout_window": 2, "fanout_page": 3})
