"""Operator views and actions (`contract_review.operate`: job_view, dead_letters, submission) against the in-memory fakes: `job_view` (the
six questions), `dlq_list` / `dlq_show` (DLQ messages joined with their records, never the
document text) and `submit` (inline or claim check)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import report_keys, upload_key
from contract_review.domain.ports import Queue
from contract_review.domain.records import (
    LIST_SAMPLE,
    AttemptStats,
    ChunkStatus,
    CoverageGap,
    JobFailure,
    JobState,
    Reliability,
    job_id_for,
)
from contract_review.operate import dead_letters, job_view, narration, submission
from contract_review.operate.submission import SubmitRequest
from contract_review.pipeline.intake import handle_intake
from contract_review.reliability.chunks import dead_letter, settled_result
from contract_review.review.analysts import ANALYSTS
from contract_review.review.chunking import document_hash

from ...texts import LONG_TEXT, TEXT
from ..fakes import SETTINGS, FakeQueues, FakeWorld, Sent
from ..inprocess import InProcess
from ..scenarios import ALL_OK, claim, deliver, intake, running_job, settle_done

IF_IT_FAILS_AGAIN = ("chunk messages go to the analysis DLQ with their error envelope; the job ends "
                     "`dead_lettered` listing them")
RESUME = "resume unsettled chunks from their checkpoints"
CANCEL_NOW = ("`review cancel JOB` (or POST /jobs/{id}/cancel): no new model call starts; chunks in flight stop "
              "within one model call and settle `cancelled`; side effects already done are compensated; the job "
              "ends `cancelled`")


# --- helpers -----------------------------------------------------------------------------------------

def dead_letter_chunk(world: FakeWorld, record: ChunkRecord) -> tuple[ChunkRecord, ErrorEnvelope, str]:
    """What a worker does with a poison chunk: DLQ its analysis message, settle, announce.
    Returns the settled record, the envelope and the chunk's text."""
    [msg] = [m for m in world.queues.analysis() if m.chunk_id == record.chunk_id]
    fence = claim(world, record)
    env = ErrorEnvelope.of("model.request_invalid", "provider rejected the request", step="analyst.assess")
    dead = dead_letter(world.deps, msg, fence, env, AttemptStats(calls=4, retries={"model.unavailable": 3}),
                       by="worker")
    assert dead is not None
    return dead, env, msg.text


def view_of(world: FakeWorld, job_id: str) -> job_view.JobView:
    view = job_view.job_view(world.deps, job_id)
    assert view is not None
    return view


# --- job_view ----------------------------------------------------------------------------------------

def test_job_view_of_an_unknown_job_is_none():
    # GIVEN an empty world  WHEN viewing a job id nobody created  THEN there is no view
    assert job_view.job_view(FakeWorld().deps, job_id_for("nope")) is None


def test_job_view_of_a_running_job():
    # GIVEN a 4-chunk job: chunk 0 done (the optional `audit` analyst refused) and counted, chunk 1 claimed
    world = FakeWorld()
    job_id, records = intake(world)
    world.clock.advance(7)
    done = settle_done(world, records[0], coverage={**ALL_OK, "audit": "refused"})
    assert deliver(world, done) == "recorded"
    claim(world, records[1])
    # WHEN an operator views it
    view = view_of(world, job_id)
    # THEN it shows progress and the per-status chunk counts
    assert view.state is JobState.RUNNING and view.document_id == "msa-1"
    assert view.chunks == {"total": 4, "settled": 1, "done": 1, "claimed": 1, "pending": 2}
    assert view.progress == 0.25
    assert view.error_code is None and view.error is None
    assert view.missing_chunks == [] and view.mandatory_gaps == []
    assert view.report == {"json": None, "markdown": None}
    assert view.model_id == "offline-rules-v1" and view.ended_at is None
    # AND reliability is computed from the chunk records while the job runs
    assert view.reliability == Reliability(model_calls=22, claims=2)
    # AND the six answers fit a running job
    a = view.answers
    assert a.state is JobState.RUNNING
    assert a.last_durable_checkpoint == f"1 of 4 chunks settled done, last at {narration.human_time(world.clock.now)}"
    assert a.side_effects_done == []
    assert a.retry_would == RESUME
    assert a.if_cancelled_now == CANCEL_NOW
    assert a.if_it_fails_again == IF_IT_FAILS_AGAIN
    # AND the recent events, flattened
    assert [e.type for e in view.recent_events] == ["job.queued", "job.running", "chunk.settled"]
    settled = view.recent_events[-1]
    assert settled.at == narration.human_time(world.clock.now)
    assert settled.model_extra == {"chunk_id": records[0].chunk_id, "chunk_index": 0, "status": "done",
                                   "settled": 1, "total": 4}


def test_job_view_of_a_running_job_with_nothing_done_yet():
    # GIVEN a freshly taken-in job
    world = FakeWorld()
    job_id, _ = intake(world)
    # WHEN viewed  THEN no checkpoint time is claimed
    view = view_of(world, job_id)
    assert view.answers.last_durable_checkpoint == "0 of 4 chunks settled done"
    assert view.chunks == {"total": 4, "settled": 0, "pending": 4}
    assert view.progress == 0.0


def test_job_view_of_a_completed_job():
    # GIVEN a 4-chunk job that completed
    world = FakeWorld()
    job_id, records = intake(world)
    outcomes = [deliver(world, settle_done(world, r)) for r in records]
    assert outcomes[-1] == "completed"
    job = world.jobs.get(job_id)
    assert job is not None
    # WHEN viewed
    view = view_of(world, job_id)
    # THEN the report and the ending are shown, and the answers say there is nothing to do
    assert view.state is JobState.COMPLETED and view.progress == 1.0
    assert view.chunks == {"total": 4, "settled": 4, "done": 4}
    assert view.report == {"json": report_keys(job_id)[0], "markdown": report_keys(job_id)[1]}
    assert view.ended_at == world.clock.now
    assert view.reliability == job.reliability == Reliability(model_calls=88, claims=4)
    a = view.answers
    assert a.side_effects_done == ["report_json_key", "report_md_key"]
    assert a.retry_would == "nothing: the job is complete"
    assert a.if_it_fails_again.startswith("nothing can fail any more: the job has completed")
    assert a.if_cancelled_now == "nothing: it has ended"
    assert a.last_durable_checkpoint.startswith("4 of 4 chunks settled done, last at ")
    assert view.recent_events[-1].type == "job.completed"


def test_job_view_of_a_dead_lettered_job():
    # GIVEN a 4-chunk job whose chunk 2 was dead-lettered by its worker
    world = FakeWorld()
    job_id, records = intake(world)
    dead, env, _ = dead_letter_chunk(world, records[2])
    outcomes = [deliver(world, settle_done(world, r)) for r in records if r.chunk_index != 2]
    outcomes.append(deliver(world, dead))
    assert outcomes[-1] == "dead_lettered"
    # WHEN viewed
    view = view_of(world, job_id)
    # THEN the missing chunk is named with its error code, and a retry means a redrive
    assert view.state is JobState.DEAD_LETTERED and view.error_code == "runtime.dead_lettered"
    assert [m.model_dump() for m in view.missing_chunks] == [
        {"chunk_id": records[2].chunk_id, "chunk_index": 2, "status": ChunkStatus.DEAD_LETTERED,
         "error_code": "model.request_invalid"}]
    assert view.chunks == {"total": 4, "settled": 4, "done": 3, "dead_lettered": 1}
    a = view.answers
    assert a.retry_would == ("`review dlq redrive` re-sends the 1 dead-lettered chunk(s) with a fresh attempt "
                             "budget; finished chunks and analysts are reused (`review retry JOB` does the same "
                             "from the job's records, with or without a DLQ message)")
    assert a.if_it_fails_again == IF_IT_FAILS_AGAIN
    assert a.if_cancelled_now == "nothing: it has ended"
    assert a.side_effects_done == ["report_json_key", "report_md_key"]
    assert a.last_durable_checkpoint.startswith("3 of 4 chunks settled done")
    # AND the dead chunk's analysts are mandatory gaps computed from the records
    assert {(g.chunk_index, g.status) for g in view.mandatory_gaps} == {(2, "dead_lettered")}
    assert [g.analyst for g in view.mandatory_gaps] == [a.name for a in ANALYSTS if a.mandatory]
    assert [e.type for e in view.recent_events][-2:] == ["chunk.settled", "job.dead_lettered"]
    assert "chunk.dead_lettered" in [e.type for e in view.recent_events]


def test_job_view_lists_every_mandatory_gap_though_the_job_keeps_a_sample():
    # GIVEN a job of LIST_SAMPLE + 5 chunks, each with the mandatory `liability` analyst refused
    n = LIST_SAMPLE + 5
    world = FakeWorld()
    job_id, records = running_job(world, n)
    outcomes = [deliver(world, settle_done(world, r, coverage={**ALL_OK, "liability": "refused"})) for r in records]
    assert outcomes[-1] == "failed"
    job = world.jobs.get(job_id)
    assert job is not None and len(job.mandatory_gaps) == LIST_SAMPLE
    # WHEN viewed
    view = view_of(world, job_id)
    # THEN all n gaps are listed, recomputed from the chunk records, in chunk order
    assert view.mandatory_gaps == [CoverageGap(chunk_id=r.chunk_id, chunk_index=r.chunk_index, analyst="liability",
                                               status="refused") for r in records]
    assert view.error_code == "job.chunks_missing" and view.missing_chunks == []


def test_job_view_mandatory_gaps_of_a_running_job_come_from_settled_chunks_only():
    # GIVEN a running 3-chunk job: chunk 0 done with `ip` failed, chunk 1 pending, chunk 2 claimed
    world = FakeWorld()
    job_id, records = running_job(world, 3)
    settle_done(world, records[0], coverage={**ALL_OK, "ip": "failed"})
    claim(world, records[2])
    # WHEN viewed (the job item has no gaps yet: it has not ended)
    view = view_of(world, job_id)
    # THEN the one real gap shows; unsettled chunks are not gaps
    assert view.mandatory_gaps == [CoverageGap(chunk_id=records[0].chunk_id, chunk_index=0, analyst="ip",
                                               status="failed")]


def test_job_view_shows_at_most_ten_recent_events_oldest_first():
    # GIVEN a job with 2 intake events and 15 more
    world = FakeWorld()
    job_id, _ = intake(world)
    for i in range(15):
        world.clock.advance(1)
        world.jobs.record_event(job_id, "chunk.requeued", n=i)
    world.jobs.record_event(job_id, "spoof.attempt", type="not-the-type", at="not-the-time")
    # WHEN viewed
    view = view_of(world, job_id)
    # THEN only the last ten are shown, in order, each with its details flattened
    assert len(view.recent_events) == job_view.RECENT_EVENTS == 10
    assert [e.model_extra.get("n") for e in view.recent_events] == [*range(6, 15), None]
    assert view.recent_events[0].at == narration.human_time(world.clock.now - 8)
    # AND a detail cannot overwrite the event's own type and time
    assert (view.recent_events[-1].type, view.recent_events[-1].at) == ("spoof.attempt", narration.human_time(world.clock.now))


def test_job_view_of_a_job_failed_on_bad_input():
    # GIVEN a job that failed validation at intake (no chunks)
    world = FakeWorld()
    result = handle_intake(world.deps, json.dumps({"schema_version": 9, "idempotency_key": "k-bad"}), "m-1")
    assert result.job_id == job_id_for("k-bad")
    # WHEN viewed
    view = view_of(world, job_id_for("k-bad"))
    # THEN it shows the input error and no chunks
    assert view.state is JobState.FAILED and view.error_code == "input.invalid"
    assert view.error is not None and view.error.step == "intake.parse"
    assert view.chunks == {"total": 0, "settled": 0}
    assert view.progress == 1.0
    assert view.missing_chunks == [] and view.mandatory_gaps == []
    assert view.reliability == Reliability()
    assert view.answers.if_cancelled_now == "nothing: it has ended"
    assert view.answers.last_durable_checkpoint == "0 of 0 chunks settled done"


@pytest.mark.parametrize("body", [
    {"schema_version": 9, "idempotency_key": "k-bad"},  # input.invalid
    {"schema_version": 1, "document": {"s3_uri": "s3://artifacts/uploads/absent.txt"}, "idempotency_key": "k-bad"},
    {"schema_version": 1, "document": {"s3_uri": "s3://elsewhere/doc.txt"}, "idempotency_key": "k-bad"},
], ids=["invalid", "document-missing", "document-forbidden"])
def test_answers_of_a_job_failed_on_bad_input(body):
    # GIVEN a job that failed at intake on its input (no chunks at all)
    world = FakeWorld()
    assert handle_intake(world.deps, json.dumps(body), "m-1").state == "failed"
    # WHEN viewed
    a = view_of(world, job_id_for("k-bad")).answers
    # THEN a retry is a corrected resubmission, not a resume or a redrive
    code = world.jobs.items[job_id_for("k-bad")].error_code
    assert a.retry_would.startswith(f"nothing by itself: {code} is permanent and nothing was analysed")
    assert "same idempotency key" in a.retry_would and "redrive" not in a.retry_would
    # AND failing again means failing the same way in one attempt, with no DLQ involved
    assert a.if_it_fails_again == ("a resubmission that is still invalid fails again in one attempt with an "
                                   "`input.*` code on this job record; nothing is retried and nothing reaches a DLQ")
    assert a.if_cancelled_now == "nothing: it has ended"


@pytest.mark.parametrize("code,fails_again", [
    ("model.access_denied", "it fails again at once with model.access_denied (job-fatal): fix the cause first"),
    ("job.chunks_missing", "it ends `failed` again with job.chunks_missing, naming each missing chunk or analyst"),
])
def test_answers_of_a_job_that_failed_with_nothing_in_a_dlq(code, fails_again):
    # GIVEN a job that ended failed with a chunk failed permanently (not dead-lettered: no DLQ message)
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    fence = claim(world, records[0])
    env = ErrorEnvelope.of(code, "x")
    assert world.claims.finish(job_id, records[0].chunk_id, fence, ChunkStatus.FAILED, AttemptStats(), error=env)
    assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED,
                                 outcome=JobFailure(error=env, error_code=code, ended_at=world.clock()))
    # WHEN viewed
    a = view_of(world, job_id).answers
    # THEN no redrive is promised (there is nothing in a DLQ), and failing again is told by the code
    assert a.retry_would.startswith(f"nothing by itself: the job ended with {code} and none of its chunks is in a DLQ")
    assert "then `review retry JOB`" in a.retry_would  # the recovery that works without a DLQ message
    assert a.if_it_fails_again == fails_again


# --- dlq_list / dlq_show -----------------------------------------------------------------------------

def test_dlq_list_joins_an_analysis_dead_letter_with_its_job_and_chunk():
    # GIVEN a running 4-chunk job whose chunk 1 a worker dead-lettered
    world = FakeWorld()
    job_id, records = intake(world)
    dead, env, chunk_text = dead_letter_chunk(world, records[1])
    [sent] = world.queues.sent[Queue.ANALYSIS_DLQ]
    # WHEN the operator lists the DLQs
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN the entry names the message, its queue and error, and joins the job and chunk records
    assert (entry.message_id, entry.queue, entry.moved_by) == (sent.message_id, "analysis", "pipeline")
    assert entry.attempts == 1 and entry.sent_at == world.clock.now and entry.source_message_id is None
    assert entry.error_code == "model.request_invalid"
    assert entry.envelope == env
    assert (entry.job_id, entry.chunk_id) == (job_id, records[1].chunk_id)
    assert entry.job == {"state": "running", "error_code": None}
    assert entry.chunk is not None
    assert entry.chunk.model_dump() == {
        "status": ChunkStatus.DEAD_LETTERED, "chunk_index": 1, "failures": 1, "receives": 1, "redeliveries": 0,
        "fence": 1, "last_error": env.model_dump(), "n_calls": 4, "retries": {"model.unavailable": 3}, "claimed_by": None}
    assert entry.failed_step == "analyst.assess"
    # AND the payload describes the message without its text
    assert "text" not in entry.payload
    assert entry.payload["text_chars"] == len(chunk_text) == dead.end - dead.start
    assert (entry.payload["chunk_id"], entry.payload["chunk_index"]) == (records[1].chunk_id, 1)
    dumped = entry.model_dump_json()
    assert chunk_text[:60] not in dumped and "aggregate liability shall not exceed" not in dumped


def test_dlq_list_shows_the_job_state_once_it_ended():
    # GIVEN the dead-lettered chunk's job has ended dead_lettered
    world = FakeWorld()
    job_id, records = intake(world)
    dead, _, _ = dead_letter_chunk(world, records[0])
    for r in records[1:]:
        deliver(world, settle_done(world, r))
    assert deliver(world, dead) == "dead_lettered"
    # WHEN listed  THEN the joined job says so
    [entry] = dead_letters.dlq_list(world.deps)
    assert entry.job == {"state": "dead_lettered", "error_code": "runtime.dead_lettered"}


def test_dlq_list_shows_an_intake_dead_letter_without_its_text():
    # GIVEN an intake message naming a document outside the stack's uploads/, without a key or document id
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"s3_uri": "s3://elsewhere/doc.txt"},
                       "metadata": {"matter": "M-1"}})
    assert handle_intake(world.deps, body, "m-sent-1").state == "rejected"
    # WHEN listed
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN the message's fields are shown, its error, failed step and attempts filled in
    assert entry.queue == "intake" and entry.moved_by == "pipeline"
    assert entry.payload == json.loads(body)
    assert entry.error_code == "input.document_forbidden"
    assert entry.failed_step == "intake.load" and entry.attempts == 1
    # AND it can be matched to the MessageId that send-message returned
    assert entry.source_message_id == "m-sent-1"
    assert (entry.job_id, entry.chunk_id, entry.job, entry.chunk, entry.body) == (None, None, None, None, None)


def test_dlq_list_shows_an_intake_body_by_size_of_its_text_and_show_gives_it_on_request():
    # GIVEN an intake message holding a whole contract, dead-lettered without a key (e.g. by hand)
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"text": TEXT}, "document_id": "nda-1"})
    world.queues.dead_letter(Queue.INTAKE, body, ErrorEnvelope.of("input.invalid", "x", step="intake.parse"),
                             source_message_id="m-7")
    # WHEN listed
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN the text is replaced by its length, never shown
    assert entry.payload == {"schema_version": 1, "document": {"text_chars": len(TEXT)}, "document_id": "nda-1"}
    assert "aggregate liability" not in entry.model_dump_json() and entry.body is None
    # AND `dlq show --body` gives the whole message back (a user's own message is theirs to see)
    shown = dead_letters.dlq_show(world.deps, entry.message_id, with_body=True)
    assert shown is not None and shown.body == body


def test_dlq_list_of_an_intake_message_sqs_moved():
    # GIVEN a valid submission that SQS moved to the intake DLQ after maxReceiveCount receives
    # (intake kept failing on a transient error): no envelope, the original MessageId kept
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": "k-9"})
    world.queues.sent[Queue.INTAKE_DLQ].append(Sent(body, message_id="orig-id", sent_at=world.clock()))
    # WHEN listed
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN it says SQS moved it, after how many receives, in which step, and which job it would be
    assert (entry.moved_by, entry.attempts, entry.failed_step) == ("sqs", SETTINGS.profile.queues.max_receive_count,
                                                                  "intake")
    assert entry.source_message_id == "orig-id" and entry.error_code is None
    assert entry.job_id == job_id_for("k-9") and entry.job == {"state": None, "error_code": None}


def test_intake_dead_letter_names_its_failed_step():
    # GIVEN an invalid intake message without a key, dead-lettered with its envelope
    world = FakeWorld()
    handle_intake(world.deps, "{not json", "m-bad")
    # WHEN listed
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN the failed step is the envelope's
    assert entry.failed_step == "intake.parse"


def test_dlq_list_joins_a_results_dead_letter():
    # GIVEN a results message that was dead-lettered (the aggregator kept failing on it)
    world = FakeWorld()
    job_id, records = intake(world)
    done = settle_done(world, records[3])
    env = ErrorEnvelope.of("aws.unavailable", "dynamodb 500", step="aggregate")
    world.queues.dead_letter(Queue.RESULTS, settled_result(done).model_dump_json(), env)
    # WHEN listed
    [entry] = dead_letters.dlq_list(world.deps)
    # THEN it is joined with its job and chunk, and its payload is the result message
    assert entry.queue == "results" and (entry.job_id, entry.chunk_id) == (job_id, records[3].chunk_id)
    assert entry.payload["status"] == "done" and entry.payload["findings_key"] == done.findings_key
    assert entry.chunk is not None and entry.chunk.status is ChunkStatus.DONE and entry.chunk.chunk_index == 3
    assert entry.envelope == env and entry.failed_step == "aggregate"


def test_dlq_list_of_an_unparseable_analysis_body():
    # GIVEN garbage in the analysis DLQ
    world = FakeWorld()
    world.queues.dead_letter(Queue.ANALYSIS, "garbage!", ErrorEnvelope.of("runtime.internal", "bad body"))
    # WHEN listed  THEN it is shown as unparsed, by size only
    [entry] = dead_letters.dlq_list(world.deps)
    assert entry.payload == {"unparsed": True, "chars": 8}
    assert entry.job_id is None and entry.error_code == "runtime.internal"


def test_dlq_list_skips_dlqs_that_are_not_configured():
    # GIVEN a deployment with only the analysis DLQ, holding one message
    world = FakeWorld()
    queues = FakeQueues(world.clock, configured=set(Queue) - {Queue.INTAKE_DLQ, Queue.RESULTS_DLQ})
    deps = dataclasses.replace(world.deps, queues=queues)
    queues.dead_letter(Queue.ANALYSIS, "x", ErrorEnvelope.of("runtime.internal"))
    # WHEN listed  THEN only that DLQ is read
    assert [e.queue for e in dead_letters.dlq_list(deps)] == ["analysis"]


def test_dlq_list_is_empty_when_nothing_is_dead_lettered():
    world = FakeWorld()
    intake(world)
    assert dead_letters.dlq_list(world.deps) == []


def test_dlq_show_finds_a_message_by_id():
    # GIVEN two dead letters, in the analysis and intake DLQs
    world = FakeWorld()
    job_id, records = intake(world)
    dead_letter_chunk(world, records[0])
    handle_intake(world.deps, "{not json", "m-bad")
    analysis_id = world.queues.sent[Queue.ANALYSIS_DLQ][0].message_id
    intake_id = world.queues.sent[Queue.INTAKE_DLQ][0].message_id
    # WHEN each is shown by id
    shown_analysis = dead_letters.dlq_show(world.deps, analysis_id)
    shown_intake = dead_letters.dlq_show(world.deps, intake_id)
    # THEN each is the matching entry; an unknown id is None
    assert shown_analysis is not None and shown_analysis.queue == "analysis"
    assert shown_analysis.chunk_id == records[0].chunk_id
    assert shown_intake is not None and shown_intake.queue == "intake"
    assert shown_intake.payload == {"unparsed": True, "chars": 9}
    assert dead_letters.dlq_show(world.deps, "no-such-message") is None


# --- submit ------------------------------------------------------------------------------------------

def sent_intake(world: FakeWorld) -> dict:
    [sent] = world.queues.sent[Queue.INTAKE]
    return json.loads(sent.body)


def test_submit_small_document_inline():
    # GIVEN a short contract
    world = FakeWorld()
    # WHEN submitted without a key
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(TEXT)).job_id
    # THEN the job id is derived from the document hash and the text travels inline
    assert job_id == job_id_for(document_hash(TEXT))
    # AND the key is sent explicitly, so intake records even a failure under this very job id
    assert sent_intake(world) == {"schema_version": 1, "document": {"text": TEXT}, "metadata": {},
                                  "idempotency_key": document_hash(TEXT)}
    assert world.artifacts.objects == {}


def test_submit_with_key_document_id_and_metadata():
    # GIVEN a short contract with an idempotency key, a document id and metadata
    world = FakeWorld()
    # WHEN submitted
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(TEXT, document_id="msa-9", idempotency_key="client-9", metadata={"matter": "M-9"})).job_id
    # THEN the job id is derived from the key, and the body carries all of it
    assert job_id == job_id_for("client-9")
    assert sent_intake(world) == {"schema_version": 1, "document": {"text": TEXT}, "metadata": {"matter": "M-9"},
                                  "document_id": "msa-9", "idempotency_key": "client-9"}


def test_submit_large_document_through_a_claim_check():
    # GIVEN a contract over 200,000 characters
    world = FakeWorld()
    big = "\n\n".join([LONG_TEXT] * 16)
    assert len(big) > 200_000
    # WHEN submitted
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(big, idempotency_key="big-1")).job_id
    # THEN the text is uploaded to uploads/<job>.txt and the message carries only its s3_uri
    assert job_id == job_id_for("big-1")
    assert upload_key(job_id) == f"uploads/{job_id}.txt"
    assert world.artifacts.get_text(upload_key(job_id)) == big
    body = sent_intake(world)
    assert body["document"] == {"s3_uri": f"s3://{SETTINGS.bucket}/uploads/{job_id}.txt"}
    assert body["idempotency_key"] == "big-1"
    assert len(world.queues.sent[Queue.INTAKE][0].body) < 500


def test_claim_checked_submission_is_taken_in_by_intake_under_the_same_job_id():
    # GIVEN a large contract submitted without a key
    world = FakeWorld()
    big = "\n\n".join([LONG_TEXT] * 16)
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(big)).job_id
    # WHEN intake handles the message submit sent
    result = handle_intake(world.deps, world.queues.sent[Queue.INTAKE][0].body, "m-1")
    # THEN the job intake creates is the one submit announced, over the whole text
    assert job_id == job_id_for(document_hash(big))
    assert (result.job_id, result.created, result.state) == (job_id, True, "running")
    job = world.jobs.get(job_id)
    assert job is not None and job.document_chars == len(big) and job.document_sha256 == document_hash(big)
    # (the chunks go out a window at a time: the first page now, cut from the whole text stored for the rest)
    assert world.artifacts.get_text(job.document_key) == big
    first_page = world.queues.analysis()
    assert len(first_page) == SETTINGS.profile.fanout.fanout_window < job.chunk_count
    assert all(m.text == big[m.start:m.end] for m in first_page)


@pytest.mark.parametrize("text,claim_check", [
    ("a" * 200_000, False),  # exactly the inline limit
    ("a" * 200_001, True),
    ("é" * 100_000, False),  # 200,000 bytes
    ("é" * 100_001, True),  # 100,001 characters but 200,002 bytes
], ids=["200000-chars", "200001-chars", "200000-bytes", "200002-bytes"])
def test_submit_threshold_counts_characters_and_utf8_bytes(text, claim_check):
    # GIVEN a document at or just over the inline limit (in characters or in UTF-8 bytes)
    world = FakeWorld()
    # WHEN submitted
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(text)).job_id
    # THEN it goes inline or through the claim check
    document = sent_intake(world)["document"]
    if claim_check:
        assert document == {"s3_uri": f"s3://{SETTINGS.bucket}/{upload_key(job_id)}"}
        assert world.artifacts.get_text(upload_key(job_id)) == text
    else:
        assert document == {"text": text}
        assert world.artifacts.objects == {}


@pytest.mark.parametrize("text,document_id,code", [
    ("   \n ", "blank.txt", "input.empty_document"),
    (TEXT, "my contract (v2).txt", "input.invalid"),  # a file name that is not a valid document_id
], ids=["blank-document", "invalid-document-id"])
def test_a_submission_that_intake_rejects_fails_under_the_job_id_submit_returned(text, document_id, code):
    # GIVEN a document intake will reject
    world = FakeWorld()
    # WHEN it is submitted and intake handles the message
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(text, document_id=document_id)).job_id
    result = handle_intake(world.deps, world.queues.sent[Queue.INTAKE][0].body, "m-1")
    # THEN the failure is recorded on the job id the submitter is waiting for, never lost in the DLQ
    assert (result.job_id, result.state) == (job_id, "failed")
    job = world.jobs.get(job_id)
    assert job is not None and job.error_code == code and job.document_id == document_id
    assert world.queues.sent[Queue.INTAKE_DLQ] == []


def test_a_stack_that_restricts_the_queue_path_to_a_prefix_uploads_there_and_intake_reads_nothing_else():
    # GIVEN a stack deployed with -c queue_uploads_prefix=uploads/queue/
    world = FakeWorld(settings=SETTINGS.model_copy(update={"queue_uploads_prefix": "uploads/queue/"}))
    big = "\n\n".join([LONG_TEXT] * 16)
    # WHEN review submit sends a large contract THEN its claim check goes under that prefix, and intake takes it
    job_id = submission.submit(world.deps, None, SubmitRequest.inline(big, idempotency_key="big-2")).job_id
    assert sent_intake(world)["document"] == {"s3_uri": f"s3://{SETTINGS.bucket}/uploads/queue/{job_id}.txt"}
    run = InProcess(world)
    run.intake()
    assert world.jobs.get(job_id).state is JobState.RUNNING  # type: ignore[union-attr]  # recorded just now
    # AND a queue message naming an object elsewhere under uploads/ fails on its input, reading nothing
    world.artifacts.put_text("uploads/elsewhere.txt", LONG_TEXT)
    run.send({"s3_uri": f"s3://{SETTINGS.bucket}/uploads/elsewhere.txt"}, key="outside")
    run.intake()
    outside = world.jobs.get(job_id_for("outside"))
    assert outside is not None and outside.state is JobState.FAILED
    assert outside.error_code == "input.document_forbidden" and "uploads/queue/" in (outside.error.message if outside.error else "")
