"""Reopening chunks and jobs, and DLQ redrive (contract_review.pipeline.redrive) against the in-memory fakes."""

from __future__ import annotations

import json

import pytest

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import ResultMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobFailure, JobState
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.redrive import Redriven, dlq_redrive, reopen
from contract_review.reliability.chunks import analysis_message, announce, dead_letter
from tests.oracle import counted

from ...texts import TEXT
from ..fakes import SETTINGS, FakeWorld, Sent
from ..scenarios import events_of, small_chunk_world, start_job, worker_finishes

INTAKE_BODY = json.dumps({"schema_version": 1, "document": {"text": TEXT}})
LEASE = SETTINGS.claim_lease_s


# --- helpers ----------------------------------------------------------------------------------------

def _claim(world: FakeWorld, job_id: str, chunk_id: str) -> tuple[int, ChunkRecord]:
    claim = world.claims.claim(job_id, chunk_id, "worker-x", LEASE, 1)
    assert claim.won and claim.record is not None
    return claim.fence, claim.record


def worker_fails(world: FakeWorld, job_id: str, chunk_id: str, code: str) -> ChunkRecord:
    """A permanent error: the worker settles the chunk `failed` and announces it (ChunkWorker._fail)."""
    fence, _ = _claim(world, job_id, chunk_id)
    env = ErrorEnvelope.of(code, "permanent", step="worker")
    failed = world.claims.finish(job_id, chunk_id, fence, ChunkStatus.FAILED, AttemptStats(calls=1), error=env)
    assert failed is not None
    if env.job_fatal:
        failure = JobFailure(error=env, error_code=code, ended_at=world.clock())
        assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED, outcome=failure)
    announce(world.deps, failed)
    return failed


def worker_dead_letters(world: FakeWorld, job_id: str, chunk_id: str) -> ChunkRecord:
    """The poison budget is used up: the worker dead-letters the chunk (DLQ copy + announcement)."""
    fence, record = _claim(world, job_id, chunk_id)
    job = world.jobs.get(job_id)
    assert job is not None
    env = ErrorEnvelope.of("model.unavailable", "provider failed", step="worker", attempt=5)
    settled = dead_letter(world.deps, analysis_message(world.deps, job, record, "intake"), fence, env,
                          AttemptStats(calls=1), by="worker")
    assert settled is not None
    return settled


def aggregate(world: FakeWorld) -> list[str]:
    """The aggregator consumes every results message."""
    return [handle_result(world.deps, ResultMessage.model_validate_json(s.body))
            for s in world.queues.drain(Queue.RESULTS)]


def dead_lettered_job(world: FakeWorld) -> tuple[str, list[str], dict[str, ChunkRecord]]:
    """A job that ended dead_lettered: chunks 0 and 3 done, 1 dead-lettered, 2 failed permanently."""
    job_id, ids = start_job(world)
    before = {ids[0]: worker_finishes(world, job_id, ids[0]),
              ids[1]: worker_dead_letters(world, job_id, ids[1]),
              ids[2]: worker_fails(world, job_id, ids[2], "model.output_invalid"),
              ids[3]: worker_finishes(world, job_id, ids[3])}
    assert aggregate(world)[-1] == "dead_lettered"
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.DEAD_LETTERED and job.error_code == "runtime.dead_lettered"
    assert len(job.missing) == 2 and job.ended_at is not None and counted(world.claims, job) == set(ids)
    return job_id, ids, before


# --- reopen -----------------------------------------------------------------------------------------

def test_reopening_a_dead_lettered_job_resets_every_failed_chunk_and_resends_what_is_not_done():
    # GIVEN a job that ended dead_lettered (chunks 0, 3 done; 1 dead-lettered; 2 failed)
    world = small_chunk_world()
    job_id, ids, before = dead_lettered_job(world)
    world.clock.advance(60)
    # WHEN an operator reopens the dead-lettered chunk
    action = reopen(world.deps, job_id, ids[1])
    # THEN both the dead-lettered and the failed chunk get a fresh budget and a new fencing token
    assert action == "redriven (2 chunk(s) sent)"
    for chunk_id in (ids[1], ids[2]):
        rec = world.claims.get(job_id, chunk_id)
        assert rec is not None and rec.status is ChunkStatus.PENDING
        assert rec.failures == 0 and rec.fence == before[chunk_id].fence + 1
        assert rec.redriven == 1 and rec.redriven_at == world.clock() and rec.settled_at is None
    # AND the done chunks are untouched
    for chunk_id in (ids[0], ids[3]):  # (but for the mark of being counted, which they keep)
        rec = world.claims.get(job_id, chunk_id)
        assert rec is not None and rec.counted and rec.model_copy(update={"counted": False}) == before[chunk_id]
    # AND the job runs again: its earlier ending is cleared and only the done chunks count as settled
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING
    assert counted(world.claims, job) == {ids[0], ids[3]}
    assert (job.error, job.error_code, job.root_error, job.ended_at) == (None, None, None, None)
    assert job.missing == [] and job.mandatory_gaps == []
    # AND one analysis message per chunk that is not done, rebuilt from the stored document
    msgs = world.queues.analysis()
    assert sorted(m.chunk_id for m in msgs) == [ids[1], ids[2]]
    for m in msgs:
        rec = world.claims.get(job_id, m.chunk_id)
        assert rec is not None
        assert m.reason == "redrive" and m.attempt == 1 and m.text == TEXT[rec.start:rec.end]
    assert events_of(world, job_id, "job.reopened") == [{"from_state": "dead_lettered", "chunks_resent": 2, "via": "redrive"}]
    # AND when the resent chunks succeed, the job completes
    worker_finishes(world, job_id, ids[1])
    worker_finishes(world, job_id, ids[2])
    assert aggregate(world) == ["recorded", "completed"]
    assert world.jobs.get(job_id).state is JobState.COMPLETED  # type: ignore[union-attr]


def test_reopening_a_job_failed_by_a_job_fatal_error_also_sends_its_unstarted_chunks():
    # GIVEN chunk 0 done, then chunk 1 failed the whole job (access denied) while a worker held chunk 2;
    # chunk 3 never ran
    world = small_chunk_world()
    job_id, ids = start_job(world)
    worker_finishes(world, job_id, ids[0])
    assert aggregate(world) == ["recorded"]
    _claim(world, job_id, ids[2])
    worker_fails(world, job_id, ids[1], "model.access_denied")
    assert aggregate(world) == ["ignored"]
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.access_denied"
    # WHEN the operator reopens chunk 1 (access has been granted)
    action = reopen(world.deps, job_id, ids[1])
    # THEN chunk 1 is reset and every chunk that is not done is sent: the held and the unstarted ones too
    assert action == "redriven (3 chunk(s) sent)"
    assert sorted(m.chunk_id for m in world.queues.analysis()) == sorted(ids[1:])
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and (rec.status, rec.failures, rec.redriven) == (ChunkStatus.PENDING, 0, 1)
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and counted(world.claims, job) == {ids[0]}
    assert job.error is None and job.error_code is None and job.ended_at is None
    assert events_of(world, job_id, "job.reopened") == [{"from_state": "failed", "chunks_resent": 3, "via": "redrive"}]


def test_reopening_a_chunk_of_a_running_job_resets_only_that_chunk_and_unsettles_it():
    # GIVEN a running job: chunk 0 done, chunk 1 dead-lettered, chunk 2 failed (all three counted), 3 pending
    world = small_chunk_world()
    job_id, ids = start_job(world)
    worker_finishes(world, job_id, ids[0])
    dead = worker_dead_letters(world, job_id, ids[1])
    failed = worker_fails(world, job_id, ids[2], "model.output_invalid")
    assert aggregate(world) == ["recorded"] * 3
    assert counted(world.claims, world.jobs.get(job_id)) == {ids[0], ids[1], ids[2]}  # type: ignore[union-attr]
    # WHEN chunk 1 is reopened
    action = reopen(world.deps, job_id, ids[1])
    # THEN only chunk 1 is reset and re-sent; the failed chunk 2 is left as it is
    assert action == "redriven (1 chunk(s) sent)"
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.status is ChunkStatus.PENDING
    assert (rec.failures, rec.fence, rec.redriven) == (0, dead.fence + 1, 1)
    assert world.claims.get(job_id, ids[2]) == failed.model_copy(update={"counted": True})  # still counted
    (msg,) = world.queues.analysis()
    assert (msg.chunk_id, msg.reason, msg.text) == (ids[1], "redrive", TEXT[rec.start:rec.end])
    # AND the job keeps running with chunk 1 no longer counted as settled; no job.reopened event
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and counted(world.claims, job) == {ids[0], ids[2]}
    assert "job.reopened" not in world.jobs.types(job_id)


@pytest.mark.parametrize("status", ["done", "claimed", "unknown"])
def test_reopening_a_chunk_of_a_running_job_that_is_not_failed_is_dropped(status):
    # GIVEN a running job whose chunk is done, held by a worker, or does not exist
    world = small_chunk_world()
    job_id, ids = start_job(world)
    if status == "done":
        worker_finishes(world, job_id, ids[0])
        aggregate(world)
    elif status == "claimed":
        _claim(world, job_id, ids[0])
    chunk_id = "c99999-nope" if status == "unknown" else ids[0]
    records, job = world.claims.for_job(job_id), world.jobs.get(job_id)
    # WHEN it is reopened
    action = reopen(world.deps, job_id, chunk_id)
    # THEN nothing changes and nothing is sent
    assert action == f"dropped (chunk is {None if status == 'unknown' else status})"
    assert world.claims.for_job(job_id) == records and world.jobs.get(job_id) == job
    assert world.queues.analysis() == []


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.CANCELLED, JobState.QUEUED])
def test_reopen_refuses_jobs_that_are_not_running_failed_or_dead_lettered(state):
    # GIVEN a job in `state`
    world = small_chunk_world()
    if state is JobState.QUEUED:
        now = world.clock()
        job_id = "job-queued"
        world.jobs.create(Job(job_id=job_id, state=JobState.QUEUED, created_at=now, updated_at=now,
                              idempotency_key="k", chunk_count=4))
        chunk_id = "c00000-x"
    else:
        job_id, ids = start_job(world)
        if state is JobState.CANCELLED:
            assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.CANCELLED)
        else:
            for chunk_id in ids:
                worker_finishes(world, job_id, chunk_id)
            assert aggregate(world)[-1] == "completed"
        chunk_id = ids[0]
    records, job = world.claims.for_job(job_id), world.jobs.get(job_id)
    assert job is not None and job.state is state
    # WHEN a chunk of it is reopened
    action = reopen(world.deps, job_id, chunk_id)
    # THEN it is dropped with the job's state, and nothing changes
    assert action == f"dropped (job is {state.value})"
    assert world.claims.for_job(job_id) == records and world.jobs.get(job_id) == job
    assert world.queues.analysis() == [] and "job.reopened" not in world.jobs.types(job_id)


def test_reopen_of_an_unknown_job_is_dropped():
    # GIVEN no job WHEN a chunk of it is reopened THEN it is dropped and nothing is sent
    world = small_chunk_world()
    assert reopen(world.deps, "job-missing", "c00000-x") == "dropped (no such job)"
    assert world.queues.analysis() == [] and world.jobs.log == []


def test_reopen_loses_the_race_when_the_job_changed_meanwhile(monkeypatch):
    # GIVEN a dead-lettered job, and another reopen moves it before this one's conditional transition
    world = small_chunk_world()
    job_id, ids, _ = dead_lettered_job(world)
    monkeypatch.setattr(world.jobs, "transition", lambda *a, **kw: None)
    # WHEN it is reopened
    action = reopen(world.deps, job_id, ids[1])
    # THEN this reopen sends nothing and records nothing (the winner does)
    assert action == "dropped (job changed meanwhile)"
    assert world.queues.analysis() == [] and "job.reopened" not in world.jobs.types(job_id)


# --- dlq_redrive ------------------------------------------------------------------------------------

def test_dlq_redrive_reopens_an_ended_job_and_deletes_the_dlq_message():
    # GIVEN a dead-lettered job whose dead-lettered chunk's message is in the analysis DLQ
    world = small_chunk_world()
    job_id, ids, _ = dead_lettered_job(world)
    (dlq,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN the job is reopened, the DLQ message deleted and the redrive recorded on the job
    assert done == [Redriven(message_id=dlq.message_id, queue="analysis", action="redriven (2 chunk(s) sent)",
                             job_id=job_id, chunk_id=ids[1])]
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []
    assert world.queues.deleted == [(Queue.ANALYSIS_DLQ, dlq.message_id)]
    assert world.jobs.get(job_id).state is JobState.RUNNING  # type: ignore[union-attr]
    assert sorted(m.chunk_id for m in world.queues.analysis()) == [ids[1], ids[2]]
    assert world.jobs.types(job_id)[-2:] == ["job.reopened", "dlq.redriven"]
    assert events_of(world, job_id, "dlq.redriven") == [
        {"chunk_id": ids[1], "dlq_message_id": dlq.message_id, "action": "redriven (2 chunk(s) sent)"}]


def test_dlq_redrive_redrives_a_chunk_once_however_many_copies_are_in_the_dlq():
    # GIVEN chunk 1 of a running job was dead-lettered by its worker (one DLQ copy), and SQS moved
    # its original message to the DLQ as well (a second copy)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    dead = worker_dead_letters(world, job_id, ids[1])
    job, rec = world.jobs.get(job_id), world.claims.get(job_id, ids[1])
    assert job is not None and rec is not None
    world.queues.sent[Queue.ANALYSIS_DLQ].append(
        Sent(analysis_message(world.deps, job, rec, "intake").model_dump_json(), sent_at=world.clock()))
    first, second = (s.message_id for s in world.queues.sent[Queue.ANALYSIS_DLQ])
    world.queues.drain(Queue.RESULTS)
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN the first copy reopens the chunk, the second is dropped; both leave the DLQ
    assert [(d.message_id, d.chunk_id, d.action) for d in done] == [
        (first, ids[1], "redriven (1 chunk(s) sent)"), (second, ids[1], "dropped (chunk already redriven)")]
    assert world.queues.deleted == [(Queue.ANALYSIS_DLQ, first), (Queue.ANALYSIS_DLQ, second)]
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []
    # AND exactly one fresh message is sent, for a chunk reset once
    assert [m.chunk_id for m in world.queues.analysis()] == [ids[1]]
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and (rec.status, rec.fence, rec.redriven) == (ChunkStatus.PENDING, dead.fence + 1, 1)
    assert [(e["dlq_message_id"], e["action"]) for e in events_of(world, job_id, "dlq.redriven")] == [
        (first, "redriven (1 chunk(s) sent)"), (second, "dropped (chunk already redriven)")]


def test_dlq_redrive_resends_intake_messages_but_skips_permanent_input_errors():
    # GIVEN the intake DLQ holds a body intake rejected (input.invalid, no key to record it under) and a
    # valid submission that SQS moved there after intake kept failing on a transient error
    world = small_chunk_world()
    assert handle_intake(world.deps, "{not json", "m-bad").state == "rejected"
    world.queues.sent[Queue.INTAKE_DLQ].append(Sent(INTAKE_BODY, sent_at=world.clock()))
    rejected, moved = (s.message_id for s in world.queues.sent[Queue.INTAKE_DLQ])
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN the moved submission is re-sent unchanged and leaves the DLQ
    assert done[1] == Redriven(message_id=moved, queue="intake", action="resent")
    assert [s.body for s in world.queues.sent[Queue.INTAKE]] == [INTAKE_BODY]
    # AND the permanent input error is not resent: skipped with the reason, left in the DLQ, visible again
    assert (done[0].message_id, done[0].skipped) == (rejected, True)
    assert done[0].action.startswith("skipped: input.invalid is a permanent input error") and "--force" in done[0].action
    assert [s.message_id for s in world.queues.sent[Queue.INTAKE_DLQ]] == [rejected]
    assert world.queues.visibility == [(Queue.INTAKE_DLQ, rejected, 0)]
    assert world.queues.analysis() == [] and world.jobs.log == []
    # AND the re-sent submission starts the job when intake gets it
    assert handle_intake(world.deps, world.queues.sent[Queue.INTAKE][0].body, "m-2").state == "running"


def test_dlq_redrive_with_force_resends_a_permanent_input_error():
    # GIVEN an s3_uri submission without a key that failed with input.document_missing (intake DLQ)
    world = small_chunk_world()
    body = json.dumps({"schema_version": 1, "document": {"s3_uri": f"s3://{SETTINGS.bucket}/uploads/late.txt"}})
    assert handle_intake(world.deps, body, "m-1").state == "rejected"
    (dead,) = world.queues.sent[Queue.INTAKE_DLQ]
    # WHEN the document is uploaded after all and the message redriven with force
    world.artifacts.put_text("uploads/late.txt", TEXT)
    done = dlq_redrive(world.deps, {dead.message_id}, force=True)
    # THEN it is resent, saying so, and leaves the DLQ; this time intake takes it in
    assert done == [Redriven(message_id=dead.message_id, queue="intake",
                             action="resent (--force: it failed with input.document_missing before)")]
    assert world.queues.sent[Queue.INTAKE_DLQ] == []
    assert handle_intake(world.deps, world.queues.sent[Queue.INTAKE][0].body, "m-2").state == "running"


def test_dlq_redrive_of_one_message_makes_the_others_visible_again():
    # GIVEN two submissions that SQS moved to the intake DLQ
    world = small_chunk_world()
    world.queues.sent[Queue.INTAKE_DLQ] += [Sent(INTAKE_BODY), Sent(INTAKE_BODY.replace("1", "1 "))]
    first, second = (s.message_id for s in world.queues.sent[Queue.INTAKE_DLQ])
    # WHEN only the first is redriven
    done = dlq_redrive(world.deps, {first})
    # THEN it alone is resent; the second, received along the way, is made visible at once
    assert [d.message_id for d in done] == [first]
    assert [s.message_id for s in world.queues.sent[Queue.INTAKE_DLQ]] == [second]
    assert world.queues.visibility == [(Queue.INTAKE_DLQ, second, 0)]


def test_dlq_redrive_resends_results_past_fifo_deduplication():
    # GIVEN chunk 0's results message went to the results DLQ (the aggregator kept failing on it);
    # its original deduplication id has been used on the results queue
    world = small_chunk_world()
    job_id, ids = start_job(world)
    worker_finishes(world, job_id, ids[0])
    (sent,) = world.queues.sent[Queue.RESULTS]
    world.queues.dead_letter(Queue.RESULTS, sent.body, ErrorEnvelope.of("runtime.internal", "aggregator bug"))
    (dlq,) = world.queues.sent[Queue.RESULTS_DLQ]
    original = ResultMessage.model_validate_json(sent.body)
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN the result is re-sent with a redrive nonce in its deduplication id, and leaves the DLQ
    assert done == [Redriven(message_id=dlq.message_id, queue="results", action="resent", job_id=job_id)]
    assert len(world.queues.sent[Queue.RESULTS]) == 2
    resent = world.queues.sent[Queue.RESULTS][1]
    assert resent.dedup_id == f"{original.dedup_id()}:redrive:{dlq.message_id}"
    assert ResultMessage.model_validate_json(resent.body) == original
    assert world.queues.sent[Queue.RESULTS_DLQ] == []
    # AND the aggregator counts it
    assert handle_result(world.deps, ResultMessage.model_validate_json(resent.body)) == "recorded"
    assert counted(world.claims, world.jobs.get(job_id)) == {ids[0]}  # type: ignore[union-attr]


def test_dlq_redrive_only_touches_the_selected_messages():
    # GIVEN chunks 1 and 2 dead-lettered (two analysis DLQ messages) and a message in the intake DLQ
    world = small_chunk_world()
    job_id, ids = start_job(world)
    c1 = worker_dead_letters(world, job_id, ids[1])
    worker_dead_letters(world, job_id, ids[2])
    handle_intake(world.deps, "{not json", "m-bad")
    m1, m2 = (s.message_id for s in world.queues.sent[Queue.ANALYSIS_DLQ])
    # WHEN only chunk 2's message is redriven
    done = dlq_redrive(world.deps, {m2})
    # THEN only chunk 2 is reopened; the other messages stay in their DLQs, chunk 1 stays dead-lettered
    assert [(d.message_id, d.chunk_id, d.action) for d in done] == [(m2, ids[2], "redriven (1 chunk(s) sent)")]
    assert [m.chunk_id for m in world.queues.analysis()] == [ids[2]]
    assert [s.message_id for s in world.queues.sent[Queue.ANALYSIS_DLQ]] == [m1]
    assert len(world.queues.sent[Queue.INTAKE_DLQ]) == 1 and world.queues.sent[Queue.INTAKE] == []
    assert world.queues.deleted == [(Queue.ANALYSIS_DLQ, m2)]
    assert world.claims.get(job_id, ids[1]) == c1
    assert world.claims.get(job_id, ids[2]).status is ChunkStatus.PENDING  # type: ignore[union-attr]


def test_dlq_redrive_leaves_a_foreign_analysis_dlq_message_for_a_person():
    # GIVEN the analysis DLQ holds something that is not an analysis message
    world = small_chunk_world()
    world.queues.dead_letter(Queue.ANALYSIS, "{not a chunk", ErrorEnvelope.of("input.invalid", "?"))
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN it is neither redriven nor deleted
    assert done == [] and world.queues.deleted == [] and len(world.queues.sent[Queue.ANALYSIS_DLQ]) == 1
    assert world.queues.analysis() == [] and world.jobs.log == []


def test_dlq_redrive_leaves_a_malformed_results_dlq_message_and_redrives_the_rest():
    # GIVEN the results DLQ holds a malformed body followed by chunk 0's genuine result
    world = small_chunk_world()
    job_id, ids = start_job(world)
    worker_finishes(world, job_id, ids[0])
    (sent,) = world.queues.drain(Queue.RESULTS)
    env = ErrorEnvelope.of("runtime.internal", "aggregator failed")
    world.queues.dead_letter(Queue.RESULTS, '{"job_id": "x"}', env)
    world.queues.dead_letter(Queue.RESULTS, sent.body, env)
    bad, good = (s.message_id for s in world.queues.sent[Queue.RESULTS_DLQ])
    # WHEN the DLQ is redriven
    done = dlq_redrive(world.deps)
    # THEN the genuine result is re-sent and the malformed one stays in the DLQ for a person
    assert [d.message_id for d in done] == [good]
    assert [s.message_id for s in world.queues.sent[Queue.RESULTS_DLQ]] == [bad]
    assert len(world.queues.results()) == 1


@pytest.mark.parametrize("state", [JobState.CANCELLING, JobState.WAITING_APPROVAL])
def test_a_job_being_cancelled_or_waiting_for_approval_is_not_retried_and_nothing_is_reset(state: JobState):
    # GIVEN a running job with a failed chunk, then cancelling (a cancel under way) or waiting for approval (a person
    # decides its ambiguous side effect): found by the Job API's stateful schemathesis run (POST /jobs, cancel, retry)
    from contract_review.pipeline.redrive import retry

    world = small_chunk_world()
    job_id, chunk_ids = start_job(world)
    worker_fails(world, job_id, chunk_ids[0], "model.request_invalid")
    assert world.jobs.transition(job_id, (JobState.RUNNING,), state)
    before = (world.jobs.get(job_id), world.claims.for_job(job_id), len(world.queues.sent[Queue.ANALYSIS]))
    # WHEN it is retried (`review retry`, POST /jobs/{id}/retry)
    retried = retry(world.deps, job_id)
    # THEN it is not (an answer, not an illegal transition), and nothing of the job or its chunks changed
    assert not retried.retried and retried.state is state
    assert state.value in retried.action
    assert (world.jobs.get(job_id), world.claims.for_job(job_id), len(world.queues.sent[Queue.ANALYSIS])) == before


def test_retry_of_a_job_that_ended_mid_fan_out_says_how_many_chunks_are_left_not_only_those_sent():
    # GIVEN a job of 24 chunks failed by a job-fatal error when its fan-out had sent 3 of them
    from contract_review.pipeline import redrive

    from ..scenarios import running_job
    world = FakeWorld()
    job_id, records = running_job(world, 3)
    world.jobs.items[job_id] = world.jobs.items[job_id].model_copy(update={"chunk_count": 24, "fanned_out": 3})
    env = ErrorEnvelope.of("model.access_denied", "AccessDeniedException", http_status=403)
    assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED,
                                 outcome=JobFailure(error=env, error_code=env.error_code, ended_at=world.clock()))
    # WHEN it is retried
    done = redrive.retry(world.deps, job_id)
    # THEN the 3 recorded chunks are sent now, and the answer says the other 21 follow: 24 left in all
    assert done.retried and len(world.queues.sent[Queue.ANALYSIS]) == 3
    assert "3 chunk(s) sent; its other 21 never sent follow as its fan-out goes on: 24 of its 24 left to run" \
        in done.action, done.action
