"""The hostile-input corpus, through the real path in-process (`inprocess.py`: the real intake, worker,
aggregator and sweeper over the in-memory fakes, the offline rule model behind a fault switch). Every case
ends in one attempt with a code (or completes), and nothing is lost: each asserts the model calls made, the
error code, the chunk states and what reached each DLQ, not only that nothing raised.

| case                                   | what is sent                                          | ends                                    |
|----------------------------------------|-------------------------------------------------------|-----------------------------------------|
| lone surrogate, no key                 | `"text": "...\\ud800..."` (JSON escape)               | intake DLQ, `input.invalid`, 0 calls    |
| lone surrogate, in the key             | `"idempotency_key": "k\\udc00"`                       | intake DLQ, `input.invalid`, 0 calls    |
| lone surrogate, valid key              | a key, text with `\\udfff`                            | failed job, `input.invalid`, 0 calls    |
| lone surrogate in document_id          | a key, `"document_id": "\\ud800"`                     | failed job (no document id), 0 calls    |
| Unicode edge cases                     | combining marks, RTL text and marks, zero-width, 4-byte| completed, quotes exact slices          |
| one huge line                          | ~150,000 characters, no newline, no sentence end      | completed, chunks at the hard limit     |
| empty / whitespace-only                | "", " \\n\\t\\u3000"                                  | failed job, `input.empty_document`      |
| duplicate submission                   | the same key and document twice                       | one job, one fan-out                    |
| conflicting submission                 | the same key, another document                        | intake DLQ `input.key_conflict`, job kept|
| prompt injection                       | "ignore previous instructions...", fake JSON, tool use | completed, findings as without it       |
| a quote absent from the chunk          | the model answers with a quote not in the excerpt     | analyst failed `model.output_invalid`   |
"""

from __future__ import annotations

import json

import pytest

from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState, job_id_for

from .fakes import FakeWorld
from .inprocess import InProcess


def dlq_codes(world: FakeWorld, queue: Queue) -> list[str]:
    return [s.attributes["error_code"] for s in world.queues.sent[queue]]


# --- lone surrogates in JSON -------------------------------------------------------------------------

LONE = {
    "no key": '{"schema_version": 1, "document": {"text": "Governing law: Delaware. \\ud800 end."}}',
    "in the key": '{"schema_version": 1, "document": {"text": "Governing law."}, "idempotency_key": "k\\udc00"}',
}


@pytest.mark.parametrize("body", LONE.values(), ids=LONE.keys())
def test_a_lone_surrogate_without_a_usable_key_goes_to_the_intake_dlq_with_its_code(body: str):
    # GIVEN a message whose JSON escapes a lone surrogate (no UTF-8 text can hold it) and names no usable key
    world = FakeWorld()
    p = InProcess(world)
    world.queues.send_intake(body)
    # WHEN intake takes it (one round)
    p.intake()
    # THEN it is in the intake DLQ with input.invalid, after one attempt; no job, no chunk, no model call
    assert dlq_codes(world, Queue.INTAKE_DLQ) == ["input.invalid"]
    assert world.queues.sent[Queue.INTAKE_DLQ][0].body == body  # kept as sent: nothing lost
    assert world.jobs.all() == [] and world.queues.sent[Queue.ANALYSIS] == [] and p.model.calls == 0
    assert not p.intake_receives  # no retry


def test_a_lone_surrogate_with_a_key_fails_the_keyed_job_in_one_attempt():
    world = FakeWorld()
    p = InProcess(world)
    world.queues.send_intake('{"schema_version": 1, "document": {"text": "x \\udfff"}, "idempotency_key": "k-1",'
                             ' "document_id": "\\ud800"}')
    p.intake()
    job = world.jobs.get(job_id_for("k-1"))
    assert job is not None and job.state is JobState.FAILED and job.error_code == "input.invalid"
    assert job.document_id == ""  # not a string any store can hold
    assert json.dumps(job.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")  # storable
    assert world.queues.sent[Queue.INTAKE_DLQ] == [] and world.claims.for_job(job.job_id) == []
    assert p.model.calls == 0 and world.jobs.types(job.job_id) == ["job.failed"]
