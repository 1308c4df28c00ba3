"""Intake (`contract_review.pipeline.intake.handle_intake`) against the in-memory fakes: validation, idempotent
job creation, chunk records and fan-out, permanent input errors (failed job or intake DLQ), the
S3 claim check, and corrected resubmissions."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contract_review.domain.errors import ErrorClass, ErrorEnvelope, ReviewError
from contract_review.domain.keys import document_key
from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, Job, JobState, job_id_for
from contract_review.pipeline.intake import IntakeResult, handle_intake
from contract_review.review.analysts import job_config_hash
from contract_review.review.chunking import chunk_document, document_hash
from tests.oracle import counted

from ...texts import LONG_TEXT, TEXT
from ..fakes import SETTINGS, FakeQueues, FakeWorld

BUCKET = SETTINGS.bucket


def inline(text: str = TEXT, **fields: object) -> str:
    return json.dumps({"schema_version": 1, "document": {"text": text}, **fields})


def by_uri(key: str, bucket: str = BUCKET, **fields: object) -> str:
    return json.dumps({"schema_version": 1, "document": {"s3_uri": f"s3://{bucket}/{key}"}, **fields})


def chunk_ids(text: str) -> list[str]:
    p = SETTINGS.profile
    return [c.chunk_id for c in chunk_document(text, p.review)]


# --- a valid document --------------------------------------------------------------------------------

def test_valid_inline_document_creates_a_running_job_with_one_chunk_and_message():
    # GIVEN an empty world and a one-chunk contract sent inline without an idempotency key
    world = FakeWorld()
    expected_job = job_id_for(document_hash(TEXT))
    # WHEN intake handles the message
    result = handle_intake(world.deps, inline(document_id="msa-2026"), "m-1")
    # THEN a new job, keyed by the document hash, is running with its pinned configuration
    assert (result.job_id, result.created, result.state, result.error) == (expected_job, True, "running", None)
    job = world.jobs.get(expected_job)
    assert job is not None
    assert job.state is JobState.RUNNING
    assert job.chunk_count == 1
    assert job.config_hash == job_config_hash(SETTINGS) and len(job.config_hash) == 16
    assert job.model_id == "offline-rules-v1" and job.model_provider == "offline"
    assert job.analyst_count == 11 and job.prompt_version == SETTINGS.profile.review.prompt_version
    assert job.idempotency_key == document_hash(TEXT) and job.document_sha256 == document_hash(TEXT)
    assert job.document_id == "msa-2026" and job.document_chars == len(TEXT)
    assert job.source_message_id == "m-1"
    assert job.created_at == world.clock.now and job.started_at == world.clock.now
    assert counted(world.claims, job) == set()
    # AND one pending chunk record at fence 0 covering the whole text
    [record] = world.claims.for_job(expected_job)
    assert record.chunk_id == chunk_ids(TEXT)[0]
    assert (record.status, record.fence, record.chunk_index, record.start, record.end) == (
        ChunkStatus.PENDING, 0, 0, 0, len(TEXT))
    assert record.claimed_by is None and record.failures == 0
    # AND one analysis message carrying the chunk's text
    [msg] = world.queues.analysis()
    assert (msg.job_id, msg.chunk_id, msg.chunk_index, msg.chunk_count) == (expected_job, record.chunk_id, 0, 1)
    assert msg.text == TEXT and (msg.start, msg.end) == (0, len(TEXT))
    assert msg.attempt == 1 and msg.max_attempts == SETTINGS.profile.recovery.poison_budget
    assert msg.checkpoint_version == job.config_hash and msg.reason == "intake"
    # AND the document is stored, and the events tell the story in order
    assert job.document_key == document_key(expected_job)
    assert world.artifacts.get_text(document_key(expected_job)) == TEXT
    assert world.jobs.types(expected_job) == ["job.queued", "job.running"]
    queued = world.jobs.events(expected_job)[0]
    assert queued.detail == {"chunk_count": 1, "document_chars": len(TEXT)}
    # AND nothing reached any DLQ
    assert world.queues.sent[Queue.INTAKE_DLQ] == []


def test_long_document_fans_out_one_record_and_one_message_per_chunk():
    # GIVEN a contract long enough for several chunks
    world = FakeWorld()
    ids = chunk_ids(LONG_TEXT)
    assert len(ids) == 4
    # WHEN intake handles it
    result = handle_intake(world.deps, inline(LONG_TEXT), "m-long")
    # THEN the job counts 4 chunks, each with a pending record at fence 0
    job = world.jobs.get(result.job_id)
    assert job is not None and job.chunk_count == 4 and job.state is JobState.RUNNING
    records = world.claims.for_job(result.job_id)
    assert [r.chunk_id for r in records] == ids
    assert [r.chunk_index for r in records] == [0, 1, 2, 3]
    assert {(r.status, r.fence) for r in records} == {(ChunkStatus.PENDING, 0)}
    # AND one message per chunk, whose texts are exact slices tiling the document
    msgs = sorted(world.queues.analysis(), key=lambda m: m.chunk_index)
    assert [m.chunk_id for m in msgs] == ids
    assert all(m.chunk_count == 4 for m in msgs)
    assert all(m.text == LONG_TEXT[m.start:m.end] for m in msgs)
    assert "".join(m.text for m in msgs) == LONG_TEXT
    assert [(m.start, m.end) for m in msgs] == [(r.start, r.end) for r in records]
    assert world.jobs.events(result.job_id)[-1].detail == {"from_state": "queued", "chunks": 4}


def test_idempotency_key_names_the_job_and_metadata_is_echoed():
    # GIVEN a message with an explicit idempotency key and metadata
    world = FakeWorld()
    body = inline(idempotency_key="client-42", metadata={"matter": "M-7", "pages": 3, "tags": ["nda", "eu"]})
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-1")
    # THEN the job id is derived from the key (a client can compute it), not from the document
    assert result.job_id == job_id_for("client-42") != job_id_for(document_hash(TEXT))
    job = world.jobs.get(job_id_for("client-42"))
    assert job is not None
    assert job.idempotency_key == "client-42"
    assert job.metadata == {"matter": "M-7", "pages": 3, "tags": ["nda", "eu"]}
    assert job.document_id == ""


# --- idempotency -------------------------------------------------------------------------------------

def test_redelivered_message_after_the_fan_out_creates_and_sends_nothing_new():
    # GIVEN a document already taken in by message m-1, all its chunks sent (the cursor says so)
    world = FakeWorld()
    first = handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    job_before = world.jobs.get(first.job_id)
    assert job_before is not None and job_before.fanned_out == 4 == job_before.chunk_count
    records_before = world.claims.for_job(first.job_id)
    world.queues.drain(Queue.ANALYSIS)
    # WHEN the same message (same message id) is delivered again
    again = handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    # THEN it is the same job, not created again, and nothing is sent again
    assert (again.job_id, again.created, again.state) == (first.job_id, False, "running")
    assert world.queues.analysis() == []
    # AND the job, its chunk records and its events are unchanged (no second queued/running)
    assert world.jobs.get(first.job_id) == job_before
    assert world.claims.for_job(first.job_id) == records_before
    assert world.jobs.types(first.job_id) == ["job.queued", "job.running"]


def test_a_crash_before_the_cursor_moved_is_finished_by_the_redelivery_sending_the_page_again(monkeypatch):
    # GIVEN an intake that sent its first page and crashed before moving the fan-out cursor
    world = FakeWorld()

    def crash(job_id: str, from_count: int, to_count: int) -> bool:
        raise ConnectionError("the function died")

    with monkeypatch.context() as m:
        m.setattr(world.jobs, "advance_fanout", crash)
        with pytest.raises(ConnectionError):
            handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    job_id = job_id_for(document_hash(LONG_TEXT))
    crashed = world.jobs.get(job_id)
    assert crashed is not None and crashed.state is JobState.RUNNING and crashed.fanned_out == 0
    assert len(world.queues.analysis()) == 4
    # WHEN the same message is delivered again
    again = handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    # THEN the page is sent again (each chunk twice in all: the claim makes the copy harmless), the
    # cursor moves, and each chunk has exactly one record
    assert (again.job_id, again.state) == (job_id, "running")
    ids = chunk_ids(LONG_TEXT)
    assert sorted(m.chunk_id for m in world.queues.analysis()) == sorted(2 * ids)
    job = world.jobs.get(job_id)
    assert job is not None and job.fanned_out == 4
    assert [r.chunk_id for r in world.claims.for_job(job_id)] == ids
    assert world.jobs.types(job_id) == ["job.queued", "job.running"]


def test_redelivery_does_not_reset_chunks_that_progressed():
    # GIVEN a job whose first chunk a worker already claimed
    world = FakeWorld()
    first = handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    r0 = world.claims.for_job(first.job_id)[0]
    claim = world.claims.claim(first.job_id, r0.chunk_id, "worker-1", 30.0, 1)
    assert claim.won
    # WHEN the intake message is redelivered
    handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    # THEN the claimed chunk keeps its owner and fence (records are created only if absent)
    again = world.claims.get(first.job_id, r0.chunk_id)
    assert again is not None
    assert (again.status, again.fence, again.claimed_by) == (ChunkStatus.CLAIMED, 1, "worker-1")


def test_second_submission_of_the_same_document_creates_and_sends_nothing():
    # GIVEN a document already taken in by message m-1
    world = FakeWorld()
    first = handle_intake(world.deps, inline(LONG_TEXT), "m-1")
    world.queues.drain(Queue.ANALYSIS)
    job_before = world.jobs.get(first.job_id)
    # WHEN a different message (another submission) carries the same document
    second = handle_intake(world.deps, inline(LONG_TEXT), "m-2")
    # THEN the existing job is returned and nothing is created or sent
    assert (second.job_id, second.created, second.state) == (first.job_id, False, "running")
    assert world.queues.sent[Queue.ANALYSIS] == []
    assert world.jobs.get(first.job_id) == job_before
    assert len(world.jobs.items) == 1 and len(world.claims.items) == 4
    assert world.jobs.types(first.job_id) == ["job.queued", "job.running"]


def test_second_submission_of_an_ended_job_returns_its_state():
    # GIVEN a completed job
    world = FakeWorld()
    first = handle_intake(world.deps, inline(), "m-1")
    assert world.jobs.transition(first.job_id, (JobState.RUNNING,), JobState.COMPLETED)
    world.queues.drain(Queue.ANALYSIS)
    # WHEN the same message is redelivered, and the document is submitted again
    redelivered = handle_intake(world.deps, inline(), "m-1")
    resubmitted = handle_intake(world.deps, inline(), "m-9")
    # THEN both answer `completed` and nothing is sent
    assert (redelivered.created, redelivered.state) == (False, "completed")
    assert (resubmitted.created, resubmitted.state) == (False, "completed")
    assert world.queues.sent[Queue.ANALYSIS] == []


def test_a_job_left_queued_by_a_crash_is_finished_by_the_next_message():
    # GIVEN a job that an earlier intake created but never fanned out (crashed before `running`)
    world = FakeWorld()
    job_id = job_id_for(document_hash(TEXT))
    now = world.clock()
    world.jobs.create(Job(job_id=job_id, state=JobState.QUEUED, created_at=now, updated_at=now,
                          idempotency_key=document_hash(TEXT), document_key=document_key(job_id), chunk_count=1,
                          document_sha256=document_hash(TEXT), fanned_out=0, config_hash="pinned-config",
                          source_message_id="m-crashed"))
    world.clock.advance(5)
    # WHEN another message with the same document arrives
    result = handle_intake(world.deps, inline(), "m-2")
    # THEN the existing job is fanned out and made running, under its own pinned config
    assert (result.job_id, result.created, result.state) == (job_id, False, "running")
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and job.started_at == now + 5
    [msg] = world.queues.analysis()
    assert msg.checkpoint_version == "pinned-config" and msg.text == TEXT
    assert len(world.claims.for_job(job_id)) == 1
    assert world.artifacts.get_text(document_key(job_id)) == TEXT
    assert world.jobs.types(job_id) == ["job.running"]


# --- invalid input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,key", [
    ({"schema_version": 2, "document": {"text": TEXT}, "idempotency_key": "k-1"}, "k-1"),
    ({"schema_version": 1, "idempotency_key": "k-2"}, "k-2"),  # no document
    # no key: the inline text's hash, the key a valid message would have had (the job id a client computes)
    ({"schema_version": 1, "document": {"text": TEXT}, "document_id": "doc-3", "colour": "red"}, document_hash(TEXT)),
    ({"schema_version": 1, "document": {"s3_uri": "http://nope"}, "idempotency_key": "", "document_id": "d4"}, "d4"),
    ({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": 7}, document_hash(TEXT)),
], ids=["bad-version", "no-document", "extra-field-text-hash", "bad-uri-empty-key-document-id",
        "non-string-key-text-hash"])
def test_invalid_message_with_a_key_fails_a_job_in_one_attempt(raw, key):
    # GIVEN a schema-invalid message from which a key can still be told (idempotency_key, else the
    # inline text's SHA-256, else document_id)
    world = FakeWorld()
    body = json.dumps(raw)
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-1")
    # THEN a `failed` job records the permanent input.invalid envelope under that key
    job_id = job_id_for(key)
    assert (result.job_id, result.created, result.state) == (job_id, True, "failed")
    assert result.error is not None and result.error.error_code == "input.invalid"
    job = world.jobs.get(job_id)
    assert job is not None
    assert job.state is JobState.FAILED and job.error_code == "input.invalid"
    assert job.error is not None
    assert (job.error.error_class, job.error.retryable, job.error.step) == (ErrorClass.PERMANENT, False,
                                                                              "intake.parse")
    assert job.idempotency_key == key and job.chunk_count == 0
    # AND the failed job shows the message's document id and message id, and has ended
    assert job.document_id == raw.get("document_id", "") and job.source_message_id == "m-1"
    assert job.ended_at == world.clock.now
    # AND no chunks, no messages, no document, one job.failed event, nothing in the DLQ
    assert world.claims.for_job(job_id) == []
    assert world.queues.sent[Queue.ANALYSIS] == [] and world.queues.sent[Queue.INTAKE_DLQ] == []
    assert world.artifacts.objects == {}
    assert world.jobs.types(job_id) == ["job.failed"]
    assert world.jobs.events(job_id)[0].detail == {"error_code": "input.invalid", "reason": "invalid input"}


@pytest.mark.parametrize("body", [
    "not json at all",
    "[1, 2, 3]",
    '{"schema_version": 1}',
    json.dumps({"schema_version": 1, "idempotency_key": "", "document": {}}),
    json.dumps({"schema_version": 1, "idempotency_key": 7, "document": {}}),
    json.dumps({"schema_version": 1, "document": {"text": 12}, "document_id": ""}),
], ids=["not-json", "array", "no-document", "empty-key", "non-string-key", "non-string-text-empty-id"])
def test_invalid_message_without_a_key_goes_to_the_intake_dlq(body):
    # GIVEN an invalid message from which no job key can be derived
    world = FakeWorld()
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-bad")
    # THEN it is rejected to the intake DLQ, body intact, with the envelope in its attributes
    assert (result.job_id, result.created, result.state) == (None, False, "rejected")
    assert result.error is not None and result.error.error_code == "input.invalid"
    [dead] = world.queues.sent[Queue.INTAKE_DLQ]
    assert dead.body == body
    assert dead.attributes["error_code"] == "input.invalid"
    assert dead.attributes["error_class"] == "permanent"
    assert dead.attributes["source_message_id"] == "m-bad"
    env = ErrorEnvelope.model_validate_json(dead.attributes["envelope"])
    assert (env.error_code, env.step, env.retryable) == ("input.invalid", "intake.parse", False)
    # AND no job, no chunk, no analysis message
    assert world.jobs.items == {} and world.claims.items == {}
    assert world.queues.sent[Queue.ANALYSIS] == []


def test_invalid_message_without_a_key_and_no_intake_dlq_raises():
    # GIVEN a deployment without an intake DLQ
    world = FakeWorld()
    queues = FakeQueues(world.clock, configured=set(Queue) - {Queue.INTAKE_DLQ})
    deps = dataclasses.replace(world.deps, queues=queues)
    # WHEN an invalid message without a key arrives
    with pytest.raises(ReviewError) as info:
        handle_intake(deps, "{not json", "m-bad")
    # THEN the error propagates (the queue's own redrive policy takes the message), nothing is written
    assert info.value.envelope.error_code == "input.invalid"
    assert world.jobs.items == {}
    assert all(sent == [] for sent in queues.sent.values())


def test_empty_inline_document_fails_a_job_keyed_by_its_hash():
    # GIVEN a valid message whose document is only whitespace, without a key
    world = FakeWorld()
    blank = "  \n\n\t "
    # WHEN intake handles it
    result = handle_intake(world.deps, inline(blank), "m-1")
    # THEN the job named by the document hash fails with input.empty_document
    job = world.jobs.get(job_id_for(document_hash(blank)))
    assert job is not None and result.job_id == job.job_id
    assert (job.state, job.error_code) == (JobState.FAILED, "input.empty_document")
    assert world.claims.items == {} and world.queues.sent[Queue.ANALYSIS] == []


# --- S3 claim check ----------------------------------------------------------------------------------

def test_claim_check_reads_the_document_from_s3():
    # GIVEN a long document uploaded to the bucket
    world = FakeWorld()
    world.artifacts.objects[(BUCKET, "uploads/big.txt")] = LONG_TEXT
    # WHEN intake handles an s3_uri message for it
    result = handle_intake(world.deps, by_uri("uploads/big.txt", idempotency_key="big-1"), "m-1")
    # THEN the job runs over the object's text, copied to the job's document key
    assert (result.job_id, result.created, result.state) == (job_id_for("big-1"), True, "running")
    job = world.jobs.get(job_id_for("big-1"))
    assert job is not None
    assert (job.state, job.chunk_count, job.document_chars) == (JobState.RUNNING, 4, len(LONG_TEXT))
    assert job.document_sha256 == document_hash(LONG_TEXT)
    assert world.artifacts.get_text(document_key(job.job_id)) == LONG_TEXT
    assert "".join(m.text for m in sorted(world.queues.analysis(), key=lambda m: m.chunk_index)) == LONG_TEXT


def test_claim_check_of_a_utf8_document_with_multibyte_characters():
    # GIVEN an object holding UTF-8 bytes with non-ASCII text
    world = FakeWorld()
    text = TEXT.replace("Licensor", "Lizenzgeber Müller & Søn")
    world.artifacts.objects[(BUCKET, "uploads/de.txt")] = text.encode("utf-8")
    # WHEN intake handles it (no idempotency key)
    result = handle_intake(world.deps, by_uri("uploads/de.txt"), "m-1")
    # THEN it is decoded and keyed by the hash of the decoded text
    assert result.job_id == job_id_for(document_hash(text))
    [msg] = world.queues.analysis()
    assert msg.text == text


@pytest.mark.parametrize("data,code", [
    (None, "input.document_missing"),
    (b"\xff\xfe\x00bad bytes \xc3\x28", "input.undecodable"),
    ("a" * (MAX_DOCUMENT_BYTES + 1), "input.too_large"),
    (b"   \n ", "input.empty_document"),
], ids=["missing", "not-utf8", "too-large", "blank"])
def test_claim_check_bad_object_fails_the_job(data, code):
    # GIVEN an s3_uri message whose object is missing or unusable
    world = FakeWorld()
    if data is not None:
        world.artifacts.objects[(BUCKET, "uploads/doc.txt")] = data
    # WHEN intake handles it
    result = handle_intake(world.deps, by_uri("uploads/doc.txt", idempotency_key="doc-k"), "m-1")
    # THEN the job named by the key fails with the permanent input code, nothing fans out
    assert (result.job_id, result.state) == (job_id_for("doc-k"), "failed")
    job = world.jobs.get(job_id_for("doc-k"))
    assert job is not None and (job.state, job.error_code) == (JobState.FAILED, code)
    assert job.error is not None and job.error.retryable is False
    assert world.claims.items == {} and world.queues.sent[Queue.ANALYSIS] == []
    assert world.jobs.types(job.job_id) == ["job.failed"]
    assert (BUCKET, document_key(job.job_id)) not in world.artifacts.objects
    # AND the error names the object (except for a blank document, which has no URI problem)
    if code != "input.empty_document":
        assert f"s3://{BUCKET}/uploads/doc.txt" in job.error.message


def test_claim_check_missing_object_without_any_key_goes_to_the_dlq():
    # GIVEN an s3_uri message with neither idempotency_key nor document_id, pointing nowhere
    world = FakeWorld()
    body = by_uri("uploads/ghost.txt")
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-ghost")
    # THEN it lands in the intake DLQ with the document_missing envelope; no job
    assert result.state == "rejected" and result.job_id is None
    [dead] = world.queues.sent[Queue.INTAKE_DLQ]
    assert dead.body == body and dead.attributes["error_code"] == "input.document_missing"
    assert ErrorEnvelope.model_validate_json(dead.attributes["envelope"]).provider_code == "NoSuchKey"
    assert world.jobs.items == {}


def test_claim_check_missing_object_with_document_id_fails_a_job_named_by_it():
    # GIVEN an s3_uri message with only a document_id, pointing nowhere
    world = FakeWorld()
    # WHEN intake handles it
    result = handle_intake(world.deps, by_uri("uploads/ghost.txt", document_id="doc-77"), "m-1")
    # THEN the failed job is named by the document id
    assert result.job_id == job_id_for("doc-77")
    job = world.jobs.get(job_id_for("doc-77"))
    assert job is not None and job.error_code == "input.document_missing"


@pytest.mark.parametrize("uri", [
    "s3://someone-elses-bucket/uploads/doc.txt",  # another bucket
    f"s3://{BUCKET}/reports/job-x/report.md",  # the stack's bucket, outside uploads/
    f"s3://{BUCKET}/uploadsX/doc.txt",
], ids=["other-bucket", "other-prefix", "prefix-lookalike"])
def test_claim_check_outside_the_stacks_uploads_prefix_is_forbidden_without_reading(uri, monkeypatch):
    # GIVEN an object that exists at a URI outside s3://<stack bucket>/uploads/
    world = FakeWorld()
    bucket, key = uri[len("s3://"):].split("/", 1)
    world.artifacts.objects[(bucket, key)] = TEXT

    def read_uri(bucket: str, key: str) -> bytes:
        raise AssertionError("intake read an object outside uploads/")

    monkeypatch.setattr(world.artifacts, "read_uri", read_uri)  # a spy: nothing may be read
    body = json.dumps({"schema_version": 1, "document": {"s3_uri": uri}, "idempotency_key": "k-out"})
    # WHEN intake handles a message naming it
    result = handle_intake(world.deps, body, "m-1")
    # THEN the job fails at once with input.document_forbidden, naming the URI and where to upload instead
    assert (result.job_id, result.state) == (job_id_for("k-out"), "failed")
    job = world.jobs.get(job_id_for("k-out"))
    assert job is not None and job.error is not None and job.error_code == "input.document_forbidden"
    assert uri in job.error.message and f"s3://{BUCKET}/uploads/" in job.error.message
    assert (job.error.retryable, job.error.step) == (False, "intake.load")
    assert world.queues.sent[Queue.ANALYSIS] == [] and world.claims.items == {}


def test_missing_claim_check_object_names_the_uri():
    # GIVEN an s3_uri under uploads/ that nobody uploaded
    world = FakeWorld()
    # WHEN intake handles it
    handle_intake(world.deps, by_uri("uploads/never-uploaded.txt", idempotency_key="k-miss"), "m-1")
    # THEN the error echoes the URI (and keeps the provider's code)
    job = world.jobs.get(job_id_for("k-miss"))
    assert job is not None and job.error is not None and job.error_code == "input.document_missing"
    assert f"s3://{BUCKET}/uploads/never-uploaded.txt does not exist" in job.error.message
    assert job.error.provider_code == "NoSuchKey"


# --- oversized and noisy inline messages --------------------------------------------------------------

def test_inline_text_over_the_limit_is_too_large_with_the_advice_to_use_s3_uri():
    # GIVEN a hand-written message with 300 KB of inline text and no key
    world = FakeWorld()
    big = ("The Supplier shall deliver the goods. " * 8000)[:300_000]
    body = inline(big, document_id="big-msa")
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-big")
    # THEN one clear permanent error: input.too_large, the size, and what to do instead
    assert result.error is not None and result.error.error_code == "input.too_large"
    msg = result.error.message
    assert "300,000 characters" in msg and "200,000" in msg and "s3_uri" in msg and "uploads/" in msg
    # AND none of pydantic's union noise (the errors of the form the message did not use)
    assert "S3Document" not in msg and "InlineDocument" not in msg and "Field required" not in msg
    # AND it is recorded under the job id the client computes (SHA-256 of the text), with its document id
    job = world.jobs.get(job_id_for(document_hash(big)))
    assert job is not None and result.job_id == job.job_id
    assert (job.state, job.error_code, job.document_id) == (JobState.FAILED, "input.too_large", "big-msa")
    assert world.queues.sent[Queue.ANALYSIS] == [] and world.queues.sent[Queue.INTAKE_DLQ] == []


@pytest.mark.parametrize("document,expected", [
    ({"text": 5}, "document.text must be a string, not a number."),
    ({"s3_uri": "http://bucket/key"}, "document.s3_uri 'http://bucket/key' is not of the allowed form"),
    ({"txt": "a"}, "document.text is required. document.txt is not a field here: leave it out (a misspelling?)."),
], ids=["text-not-a-string", "bad-s3-uri", "misspelt-text"])
def test_an_invalid_document_reports_only_the_form_it_meant(document, expected):
    # GIVEN a message whose document is wrong in one of its two forms
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": document, "idempotency_key": "k-doc"})
    # WHEN intake handles it
    result = handle_intake(world.deps, body, "m-1")
    # THEN the error speaks of that form only
    assert result.error is not None and result.error.error_code == "input.invalid"
    assert result.error.message.startswith(expected), result.error.message
    assert "Document" not in result.error.message


# --- corrected resubmissions -------------------------------------------------------------------------

def test_corrected_resubmission_replaces_a_job_that_failed_on_bad_input():
    # GIVEN a job that failed on input.document_missing under key "k-fix"
    world = FakeWorld()
    failed = handle_intake(world.deps, by_uri("uploads/late.txt", idempotency_key="k-fix"), "m-1")
    assert failed.state == "failed"
    world.clock.advance(60)
    # WHEN the document is uploaded and the message sent again with the same key
    world.artifacts.objects[(BUCKET, "uploads/late.txt")] = TEXT
    fixed = handle_intake(world.deps, by_uri("uploads/late.txt", idempotency_key="k-fix"), "m-2")
    # THEN the same job id is replaced by a fresh running job
    assert (fixed.job_id, fixed.created, fixed.state) == (failed.job_id, True, "running")
    job = world.jobs.get(failed.job_id)
    assert job is not None
    assert job.state is JobState.RUNNING and job.error is None and job.error_code is None
    assert job.created_at == world.clock.now and job.chunk_count == 1 and job.source_message_id == "m-2"
    assert len(world.queues.analysis()) == 1 and len(world.claims.for_job(job.job_id)) == 1
    assert world.jobs.types(job.job_id) == ["job.failed", "job.queued", "job.running"]


def test_corrected_resubmission_replaces_a_schema_invalid_job():
    # GIVEN a job that failed on input.invalid (wrong schema version) under key "k-v"
    world = FakeWorld()
    bad = json.dumps({"schema_version": 2, "document": {"text": TEXT}, "idempotency_key": "k-v"})
    assert handle_intake(world.deps, bad, "m-1").state == "failed"
    # WHEN the corrected message is sent
    fixed = handle_intake(world.deps, inline(idempotency_key="k-v"), "m-2")
    # THEN it runs
    assert (fixed.created, fixed.state) == (True, "running")
    job = world.jobs.get(job_id_for("k-v"))
    assert job is not None and job.state is JobState.RUNNING and job.chunk_count == 1


@pytest.mark.parametrize("code", ["job.chunks_missing", "model.access_denied", "runtime.dead_lettered"])
def test_resubmission_does_not_replace_a_job_that_failed_for_another_reason(code):
    # GIVEN a job under key "k-x" that failed for a reason other than its input
    world = FakeWorld()
    job_id = job_id_for("k-x")
    env = ErrorEnvelope.of(code, "not the input's fault")
    now = world.clock()
    world.jobs.create(Job(job_id=job_id, state=JobState.FAILED, created_at=now, updated_at=now,
                          idempotency_key="k-x", chunk_count=3, error=env, error_code=code))
    before = world.jobs.get(job_id)
    # WHEN a valid message with the same key arrives
    result = handle_intake(world.deps, inline(idempotency_key="k-x"), "m-2")
    # THEN the failed job stands: nothing created, stored or sent
    assert (result.job_id, result.created, result.state) == (job_id, False, "failed")
    assert world.jobs.get(job_id) == before
    assert world.claims.items == {} and world.queues.sent[Queue.ANALYSIS] == []
    assert world.artifacts.objects == {}
    assert world.jobs.types(job_id) == []


# --- a key never mixes two documents ------------------------------------------------------------------

def test_same_key_for_another_document_while_the_first_is_queued_is_rejected_and_never_mixed(monkeypatch):
    # GIVEN message m-1 (document A, key "k-mix") whose intake has created the job, still `queued`, and is
    # about to store the document, when message m-2 (document B, the same key) is taken in
    world = FakeWorld()
    doc_a, doc_b = LONG_TEXT, LONG_TEXT.replace("New York", "Delaware")
    job_id = job_id_for("k-mix")
    second: list[IntakeResult] = []
    states: list[JobState] = []
    store = world.artifacts.put_text

    def put_text(key: str, body: str, content_type: str = "application/json") -> None:
        if not states and key == document_key(job_id):  # the interleaving: m-2 runs inside m-1's intake (once)
            job = world.jobs.get(job_id)
            assert job is not None
            states.append(job.state)
            second.append(handle_intake(world.deps, inline(doc_b, idempotency_key="k-mix"), "m-2"))
        store(key, body, content_type)

    monkeypatch.setattr(world.artifacts, "put_text", put_text)
    # WHEN m-1's intake goes on
    first = handle_intake(world.deps, inline(doc_a, idempotency_key="k-mix"), "m-1")
    assert states == [JobState.QUEUED], "the interleaving did not happen"
    # THEN the job holds document A only: its chunk records, messages and stored text are A's
    assert (first.job_id, first.created, first.state) == (job_id, True, "running")
    job = world.jobs.get(job_id)
    assert job is not None and job.document_sha256 == document_hash(doc_a)
    assert [r.chunk_id for r in world.claims.for_job(job_id)] == chunk_ids(doc_a)
    assert len(world.claims.for_job(job_id)) == job.chunk_count
    assert sorted(m.chunk_id for m in world.queues.analysis()) == sorted(chunk_ids(doc_a))
    assert all(m.text == doc_a[m.start:m.end] for m in world.queues.analysis())
    assert document_hash(world.artifacts.get_text(job.document_key)) == job.document_sha256
    # AND m-2 is rejected with a permanent input.key_conflict that names the job and what to do
    [rejected] = second
    assert (rejected.job_id, rejected.created, rejected.state) == (job_id, False, "rejected")
    assert rejected.error is not None and rejected.error.error_code == "input.key_conflict"
    assert (rejected.error.error_class, rejected.error.retryable) == (ErrorClass.PERMANENT, False)
    assert job_id in rejected.error.message and "its own idempotency key" in rejected.error.message
    # AND it is visible: on the intake DLQ with its envelope (the document kept in the body) ...
    [dead] = world.queues.sent[Queue.INTAKE_DLQ]
    assert json.loads(dead.body)["document"]["text"] == doc_b
    assert (dead.attributes["error_code"], dead.attributes["source_message_id"], dead.attributes["job_id"]) == (
        "input.key_conflict", "m-2", job_id)
    # ... and as an event on the job, which otherwise went on as if m-2 had never come
    conflicts = [e.detail for e in world.jobs.events(job_id) if e.type == "intake.key_conflict"]
    assert conflicts == [{"error_code": "input.key_conflict", "source_message_id": "m-2",
                          "document_sha256": document_hash(doc_b)}]
    assert world.jobs.types(job_id) == ["job.queued", "intake.key_conflict", "job.running"]


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.COMPLETED])
def test_same_key_for_another_document_of_a_running_or_ended_job_is_rejected(state):
    # GIVEN a job under key "k-1" for TEXT, running or completed
    world = FakeWorld()
    first = handle_intake(world.deps, inline(idempotency_key="k-1"), "m-1")
    if state is JobState.COMPLETED:
        assert world.jobs.transition(first.job_id, (JobState.RUNNING,), JobState.COMPLETED)
    world.queues.drain(Queue.ANALYSIS)
    before = world.jobs.get(first.job_id)
    records = world.claims.for_job(first.job_id)
    # WHEN another document arrives with the same key
    other = TEXT.replace("New York", "Delaware")
    result = handle_intake(world.deps, inline(other, idempotency_key="k-1"), "m-2")
    # THEN it is rejected (not answered as a duplicate of the first) and nothing of the job changes
    assert (result.job_id, result.state) == (first.job_id, "rejected")
    assert result.error is not None and result.error.error_code == "input.key_conflict"
    after = world.jobs.get(first.job_id)
    assert after is not None and before is not None and after == before  # the job item untouched
    last = world.jobs.last_event(first.job_id)
    assert last is not None and last.type == "intake.key_conflict"  # only the rejection's event
    assert world.claims.for_job(first.job_id) == records
    assert world.queues.sent[Queue.ANALYSIS] == []
    assert world.artifacts.get_text(document_key(first.job_id)) == TEXT
    assert [s.attributes["error_code"] for s in world.queues.sent[Queue.INTAKE_DLQ]] == ["input.key_conflict"]
    # AND the same document with the same key is still a plain duplicate
    again = handle_intake(world.deps, inline(idempotency_key="k-1"), "m-3")
    assert (again.state, again.error) == (state.value, None)


# --- large documents: the first page only --------------------------------------------------------------

def test_a_large_document_leaves_queued_with_one_page_sent_and_its_chunk_count_known():
    # GIVEN a contract of 55 chunks uploaded under uploads/ (a large document, scaled down)
    world = FakeWorld()
    big = "\n\n".join([LONG_TEXT] * 16)
    ids = chunk_ids(big)
    window = 8  # the local profile's fanout_window (checked at the end)
    assert len(ids) == 55 > window
    world.artifacts.objects[(BUCKET, "uploads/big.txt")] = big
    # WHEN intake handles it
    result = handle_intake(world.deps, by_uri("uploads/big.txt", document_id="big"), "m-1")
    # THEN the job is running and knows all its chunks ...
    job = world.jobs.get(result.job_id)
    assert job is not None and (job.state, job.chunk_count) == (JobState.RUNNING, 55)
    # ... but only the first page (the window) has records and messages: intake's work does not grow with
    # the document
    assert [r.chunk_id for r in world.claims.for_job(job.job_id)] == ids[:window]
    assert [m.chunk_id for m in world.queues.analysis()] == ids[:window]
    assert job.fanned_out == window == SETTINGS.profile.fanout.fanout_window
    assert all(m.chunk_count == 55 and m.text == big[m.start:m.end] for m in world.queues.analysis())
    # AND the document and its fan-out plan are stored for the pages to come
    assert world.artifacts.get_text(job.document_key) == big
    from contract_review.pipeline.fanout import FanoutPlan, plan_key

    plan = FanoutPlan.model_validate_json(world.artifacts.get_text(plan_key(job.job_id)))
    assert [c.chunk_id for c in plan.page(0, len(plan))] == ids
    assert world.jobs.types(job.job_id) == ["job.queued", "job.running"]
