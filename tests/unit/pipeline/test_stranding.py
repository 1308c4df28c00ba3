"""Interleavings and crashes that used to strand work, each forced at the exact step:

1. an operator's redrive between finalize's read of the chunk records and its job transition;
2. a crash between settling a chunk `dead_lettered` and sending its DLQ message (worker, sweeper);
4. a job whose finalize failed after every chunk was counted (and a job item at 600 chunks);
6. a message the queue moved to the DLQ with attempt budget left; one bad item in a sweep; a
   `queued` job whose intake message reached the intake DLQ.

Each ends with the invariant: nothing is stranded in a state no tool can leave, and where a job can
finish, it finishes with the findings of a fault-free run of its document.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from botocore.exceptions import ClientError

from contract_review.adapters.dynamo import to_item
from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState, job_id_for
from contract_review.operate.job_view import job_view
from contract_review.pipeline import (
    redrive,  # `redrive.retry`: looked up when used (these tests also run against older code)
)
from contract_review.pipeline.aggregator import finalize, handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.redrive import dlq_redrive
from contract_review.pipeline.sweeper import sweep
from contract_review.reliability.chunks import analysis_message, dead_letter
from contract_review.review.report import Report
from tests.oracle import counted

from ...texts import TEXT
from ..fakes import SETTINGS, FakeWorld
from ..inprocess import Crash, CrashOnPut, Fault, InProcess, fault_free_findings, on
from ..scenarios import claim, events_of, running_job, small_chunk_world, start_job, worker_finishes

STALL = SETTINGS.profile.recovery.stall_after_s
LEASE = SETTINGS.claim_lease_s


def aggregate(world: FakeWorld) -> list[str]:
    return [handle_result(world.deps, ResultMessage.model_validate_json(s.body))
            for s in world.queues.drain(Queue.RESULTS)]


def worker_dead_letters(world: FakeWorld, job_id: str, chunk_id: str) -> ChunkRecord:
    """A worker uses the chunk's budget: DLQ copy, settled `dead_lettered`, announced."""
    won = world.claims.claim(job_id, chunk_id, "worker-x", LEASE, 1)
    job = world.jobs.get(job_id)
    assert won.won and won.record is not None and job is not None
    env = ErrorEnvelope.of("model.unavailable", "provider failed", step="worker", attempt=5)
    settled = dead_letter(world.deps, analysis_message(world.deps, job, won.record, "intake"), won.fence, env,
                          AttemptStats(calls=1), by="worker")
    assert settled is not None
    return settled


def one_dead_lettered(world: FakeWorld) -> tuple[str, list[str]]:
    """A running job: chunks 0, 2, 3 done and chunk 1 dead-lettered (its copy in the DLQ), every result
    counted, the job not finalized yet (its finalize is in flight)."""
    job_id, ids = start_job(world)
    for i in (0, 2, 3):
        worker_finishes(world, job_id, ids[i])
    worker_dead_letters(world, job_id, ids[1])
    for s in world.queues.drain(Queue.RESULTS):
        world.jobs.settle_chunk(job_id, ResultMessage.model_validate_json(s.body).chunk_id)
    assert len(world.queues.sent[Queue.ANALYSIS_DLQ]) == 1
    return job_id, ids


def the_job(world: FakeWorld, job_id: str) -> Job:
    job = world.jobs.get(job_id)
    assert job is not None
    return job


def completes_after_redrive(world: FakeWorld, job_id: str, chunk_id: str) -> None:
    """The redriven chunk's message was sent; a worker finishes it; the job completes."""
    (msg,) = world.queues.analysis()
    assert msg.chunk_id == chunk_id and msg.reason == "redrive"
    world.queues.drain(Queue.ANALYSIS)
    worker_finishes(world, job_id, chunk_id)
    assert aggregate(world)[-1] == "completed"


# --- 1. redrive racing finalize ----------------------------------------------------------------------

def test_a_redrive_between_finalizes_read_and_its_transition_keeps_the_job_running():
    # GIVEN every chunk of a job counted, chunk 1 dead-lettered, and finalize about to end the job
    world = small_chunk_world()
    job_id, ids = one_dead_lettered(world)
    job = the_job(world, job_id)
    # AND the operator redrives the DLQ right after finalize has read the chunk records
    real = world.jobs.transition
    raced: list[str] = []

    def transition(jid: str, from_states: object, to: JobState, **kw: object) -> Job | None:
        if to is JobState.DEAD_LETTERED and not raced:
            raced.extend(d.action for d in dlq_redrive(world.deps))
        return real(jid, from_states, to, **kw)  # type: ignore[arg-type]  # passed through as given

    world.jobs.transition = transition  # type: ignore[method-assign]  # the fake's method, wrapped
    # WHEN finalize runs
    state = finalize(world.deps, job)
    # THEN the redrive happened in between, and the job keeps running instead of ending dead_lettered
    assert raced == ["redriven (1 chunk(s) sent)"]
    assert state is JobState.RUNNING and the_job(world, job_id).state is JobState.RUNNING
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.status is ChunkStatus.PENDING
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == [] and counted(world.claims, the_job(world, job_id)) == {ids[0], ids[2], ids[3]}
    # AND nothing is stranded: the redriven chunk is worked and the job completes
    completes_after_redrive(world, job_id, ids[1])


def test_a_finalize_that_ends_the_job_between_the_redrives_reset_and_unsettle_is_undone():
    # GIVEN every chunk counted, chunk 1 dead-lettered, and a finalize that read the chunk records
    # before the redrive reset chunk 1 (it saw it dead-lettered)
    world = small_chunk_world()
    job_id, ids = one_dead_lettered(world)
    job_as_read, records_as_read = the_job(world, job_id), world.claims.for_job(job_id)
    # AND that finalize's transition lands between the redrive's reset of the chunk and its unsettle
    real_unsettle, real_for_job = world.jobs.unsettle_chunks, world.claims.for_job
    ended: list[JobState] = []

    def unsettle(jid: str, chunk_ids: object) -> Job | None:
        if not ended:
            world.claims.for_job = lambda _j: records_as_read  # type: ignore[method-assign]  # its earlier read
            try:
                ended.append(finalize(world.deps, job_as_read))
            finally:
                world.claims.for_job = real_for_job  # type: ignore[method-assign]  # restored
        return real_unsettle(jid, chunk_ids)  # type: ignore[arg-type]  # passed through as given

    world.jobs.unsettle_chunks = unsettle  # type: ignore[method-assign]  # the fake's method, wrapped
    # WHEN the operator redrives the DLQ
    (done,) = dlq_redrive(world.deps)
    # THEN finalize did end the job in between, and the redrive reopened it as a whole
    assert ended == [JobState.DEAD_LETTERED]
    assert done.action == "redriven (1 chunk(s) sent)"
    job = the_job(world, job_id)
    assert job.state is JobState.RUNNING and counted(world.claims, job) == {ids[0], ids[2], ids[3]} and job.error_code is None
    assert events_of(world, job_id, "job.reopened")[-1]["from_state"] == "dead_lettered"
    # AND the chunk is worked and the job completes
    completes_after_redrive(world, job_id, ids[1])


# --- 2. a crash between settling dead_lettered and the DLQ message -----------------------------------

class CrashBetweenDeadLetterSteps:
    """The process dies right after the first of `chunks.dead_letter`'s two steps (settling the chunk
    `dead_lettered`, sending its DLQ copy), whichever order they run in; once."""

    def __init__(self, world: FakeWorld):
        self.done: list[str] = []
        real_finish, real_dead_letter = world.claims.finish, world.queues.dead_letter

        def finish(*a: object, **kw: object) -> ChunkRecord | None:
            if a[3] is ChunkStatus.DEAD_LETTERED:
                self.step("settle")
            return real_finish(*a, **kw)  # type: ignore[arg-type]  # passed through as given

        def to_dlq(*a: object, **kw: object) -> None:
            if a[0] is Queue.ANALYSIS:
                self.step("dlq")
            real_dead_letter(*a, **kw)  # type: ignore[arg-type]  # passed through as given

        world.claims.finish = finish  # type: ignore[method-assign]  # wrapped
        world.queues.dead_letter = to_dlq  # type: ignore[method-assign]  # wrapped

    def step(self, name: str) -> None:
        if len(self.done) == 1:
            self.done.append("crash")
            raise Crash()
        self.done.append(name)


def _raise(exc: BaseException) -> Callable[[object], object]:
    def act(_request: object) -> object:
        raise exc
    return act


def crash_in_dead_letter(fault: Callable[[InProcess, list[str]], None]) -> None:
    # GIVEN a one-attempt budget, a chunk that fails, and a crash between the two dead-letter steps
    world = small_chunk_world(poison_budget=1)
    p = InProcess(world)
    p.send({"text": TEXT}, key="k")
    p.intake()
    job_id = job_id_for("k")
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    crash = CrashBetweenDeadLetterSteps(world)
    fault(p, ids)
    # WHEN the pipeline and its sweeper carry on
    job = p.run(job_id)
    # THEN the crash happened, and the job still ended dead_lettered with the chunk's DLQ message there
    assert len(crash.done) >= 2 and crash.done[1] == "crash"
    assert (job.state, job.error_code) == (JobState.DEAD_LETTERED, "runtime.dead_lettered")
    dlq = [AnalysisMessage.model_validate_json(s.body).chunk_id for s in world.queues.sent[Queue.ANALYSIS_DLQ]]
    assert set(dlq) == {ids[1]}, "a dead-lettered chunk without a DLQ message: `review dlq redrive` finds nothing"
    view = job_view(world.deps, job_id)
    assert view is not None and view.answers.retry_would.startswith("`review dlq redrive` re-sends the 1 dead")
    # AND the documented recovery works: the cause fixed, `review dlq redrive` completes the job
    p.model.faults.clear()
    assert any(d.action.startswith("redriven") for d in dlq_redrive(world.deps))
    p.run(job_id)
    assert p.assert_complete_and_consistent(job_id) == fault_free_findings(small_chunk_world, {"text": TEXT})


def test_a_crash_in_the_workers_dead_letter_leaves_a_redrivable_dead_letter():
    crash_in_dead_letter(lambda p, ids: p.model.faults.append(
        Fault(on(ids[1]), _raise(ClientError({"Error": {"Code": "ServiceUnavailableException", "Message": "x"},
                                              "ResponseMetadata": {"HTTPStatusCode": 503}}, "Converse")))))


def test_a_crash_in_the_sweepers_dead_letter_leaves_a_redrivable_dead_letter():
    # (the worker dies holding the chunk: the sweeper dead-letters it at the budget, and crashes midway)
    crash_in_dead_letter(lambda p, ids: p.model.faults.append(Fault(on(ids[1]), _raise(Crash()))))


def test_review_retry_reopens_a_dead_lettered_job_with_no_dlq_message_at_all():
    # GIVEN a job that ended dead_lettered, and its chunk's DLQ message is gone (purged, or never sent)
    world = small_chunk_world()
    job_id, ids = one_dead_lettered(world)
    assert finalize(world.deps, the_job(world, job_id)) is JobState.DEAD_LETTERED
    world.queues.drain(Queue.ANALYSIS_DLQ)
    assert dlq_redrive(world.deps) == []  # nothing to redrive from
    # WHEN the operator retries the job
    done = redrive.retry(world.deps, job_id)
    # THEN it runs again from its records: the dead-lettered chunk resent, the done ones kept
    assert done.retried and done.state is JobState.RUNNING, done
    assert done.action.startswith("reopened from dead_lettered (runtime.dead_lettered): 1 chunk(s) sent")
    completes_after_retry(world, job_id, ids[1])


def completes_after_retry(world: FakeWorld, job_id: str, chunk_id: str) -> None:
    (msg,) = world.queues.analysis()
    assert (msg.chunk_id, msg.reason, msg.attempt) == (chunk_id, "retry", 1)
    world.queues.drain(Queue.ANALYSIS)
    worker_finishes(world, job_id, chunk_id)
    assert aggregate(world)[-1] == "completed"


# --- 4. a job item past 400 KB; a finalize that failed ------------------------------------------------

def test_a_job_of_600_chunks_with_500_missing_keeps_its_item_small_and_the_report_lists_them_all():
    # GIVEN 600 chunks: 100 done, 500 dead-lettered, every result counted
    world = FakeWorld()
    job_id, records = running_job(world, 600)
    env = ErrorEnvelope.of("model.unavailable", "x" * 400, step="worker")
    for r in records:
        fence = claim(world, r)
        if r.chunk_index < 100:
            assert world.claims.finish(job_id, r.chunk_id, fence, ChunkStatus.DONE, AttemptStats(),
                                       outcome=ChunkOutcome(findings_key="", coverage={}, n_findings=0))
        else:
            assert world.claims.finish(job_id, r.chunk_id, fence, ChunkStatus.DEAD_LETTERED, AttemptStats(), error=env)
        world.jobs.settle_chunk(job_id, r.chunk_id)
    # WHEN finalize runs
    assert finalize(world.deps, the_job(world, job_id)) is JobState.DEAD_LETTERED
    # THEN the job item, as stored in DynamoDB, stays far below the 400 KB item limit
    job = the_job(world, job_id)
    size = len(json.dumps(to_item(job)).encode())
    assert size < 50_000, f"job item {size:,} bytes"
    assert job.coverage_summary is not None and job.coverage_summary.missing_chunks == 500
    # AND the report lists every missing chunk
    assert job.report_json_key is not None
    report = Report.model_validate_json(world.artifacts.get_text(job.report_json_key))
    assert [m.chunk_index for m in report.coverage.missing_chunks] == list(range(100, 600))


def test_a_job_whose_finalize_failed_after_the_last_count_is_finalized_by_the_reconciler():
    # GIVEN a job whose every chunk is done and counted, but whose finalize failed on the job update
    # (the results message went on to its DLQ): the job is still running
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for chunk_id in ids:
        worker_finishes(world, job_id, chunk_id)
    real = world.jobs.transition
    refused = {"n": 0}

    def transition(*a: object, **kw: object) -> Job | None:
        if refused["n"] == 0:
            refused["n"] += 1
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "Item size has exceeded"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "UpdateItem")
        return real(*a, **kw)  # type: ignore[arg-type]  # passed through as given

    world.jobs.transition = transition  # type: ignore[method-assign]  # the fake's method, wrapped
    results = world.queues.drain(Queue.RESULTS)
    for s in results[:-1]:
        handle_result(world.deps, ResultMessage.model_validate_json(s.body))
    try:
        handle_result(world.deps, ResultMessage.model_validate_json(results[-1].body))
        raise AssertionError("finalize did not fail")
    except ClientError:
        pass
    assert the_job(world, job_id).state is JobState.RUNNING and counted(world.claims, the_job(world, job_id)) == set(ids)
    # WHEN the job has made no progress for the stall period and the sweeper runs
    world.clock.advance(STALL + 1)
    report = sweep(world.deps)
    # THEN the reconciler finalizes it: the job completes with its report
    job = the_job(world, job_id)
    assert job.state is JobState.COMPLETED and job.report_json_key is not None
    assert report.finalized == [job_id] and report.item_failures == []
    assert events_of(world, job_id, "job.reconciled") == [{"finalized": "completed", "by": "sweeper"}]


# --- 6. the DLQ, and one bad item ---------------------------------------------------------------------

def test_a_chunk_whose_receives_were_burned_is_not_dead_lettered_and_the_job_completes_as_fault_free():
    # GIVEN the queue moves chunk 2's first message to the DLQ (receives burned by throttling before
    # the worker ever ran: no failure counted)
    world = small_chunk_world()
    p = InProcess(world)
    p.send({"text": TEXT}, key="k")
    p.intake()
    job_id = job_id_for("k")
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    p.to_dlq.add(ids[2])
    # WHEN the pipeline and its sweeper carry on
    p.run(job_id)
    # THEN the chunk was sent again, not dead-lettered, and the job completes as a fault-free run does
    assert "chunk.dead_lettered" not in world.jobs.types(job_id) and world.queues.sent[Queue.ANALYSIS_DLQ] == []
    assert [e["reason"] for e in events_of(world, job_id, "chunk.requeued")] == ["runtime.receives_exhausted"]
    assert p.assert_complete_and_consistent(job_id) == fault_free_findings(small_chunk_world, {"text": TEXT})


def test_one_bad_item_does_not_stop_the_sweep():
    # GIVEN two running jobs, each with a chunk whose worker died (lapsed lease) and a chunk whose
    # message was lost; job A's document object is missing
    world = small_chunk_world()
    a_id, a_ids = start_job(world)
    b_id = job_id_for("b")
    assert handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT.upper()},
                                                 "idempotency_key": "b"}), "m-b").state == "running"
    b_ids = [c.chunk_id for c in world.claims.for_job(b_id)]
    world.queues.drain(Queue.ANALYSIS)
    for job_id, ids in ((a_id, a_ids), (b_id, b_ids)):
        world.claims.claim(job_id, ids[0], "worker-dead", LEASE, 1)
    del world.artifacts.objects[(world.artifacts.bucket, the_job(world, a_id).document_key)]
    world.clock.advance(STALL + 1)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN job A's items fail, are counted and logged, and job B is recovered all the same
    assert sorted(report.item_failures) == [f"lapsed:{a_id}/{a_ids[0]}", f"reconcile:{a_id}"]
    assert report.requeued == [b_ids[0]] and report.reconciled == [b_id]
    assert {m.chunk_id for m in world.queues.analysis()} == set(b_ids)


def test_a_queued_job_whose_intake_message_reached_the_intake_dlq_is_failed_with_a_code_and_can_be_redriven():
    # GIVEN intake crashes on every delivery after creating the job (it stays `queued`), so the queue
    # moves the intake message to the intake DLQ
    world = small_chunk_world()
    p = InProcess(world)
    crashing = CrashOnPut(world, "documents/")
    p.send({"text": TEXT}, key="k")
    job_id = job_id_for("k")
    for _ in range(SETTINGS.profile.queues.max_receive_count):
        p.intake()
    (moved,) = world.queues.sent[Queue.INTAKE_DLQ]
    assert the_job(world, job_id).state is JobState.QUEUED and moved.attributes == {}
    # WHEN the job has been idle for the stall period and the sweeper runs
    world.clock.advance(STALL + 1)
    report = sweep(world.deps)
    # THEN the job is failed with a code saying why, and the DLQ copy names the job and the error
    job = the_job(world, job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "runtime.intake_exhausted")
    assert report.intake_failed == [job_id]
    assert job.error is not None and moved.message_id in job.error.message
    (copy,) = world.queues.sent[Queue.INTAKE_DLQ]
    assert (copy.body, copy.attributes["job_id"], copy.attributes["error_code"],
            copy.attributes["source_message_id"]) == (moved.body, job_id, "runtime.intake_exhausted", moved.message_id)
    assert events_of(world, job_id, "job.failed") == [
        {"from_state": "queued", "error_code": "runtime.intake_exhausted", "by": "sweeper", "dlq_message_id": moved.message_id}]
    view = job_view(world.deps, job_id)
    assert view is not None and view.answers.retry_would.startswith("`review retry JOB` puts it back to `queued`")
    # AND once intake is fixed, `review dlq redrive` puts the job back to `queued`; it completes
    crashing.on = False
    (done,) = dlq_redrive(world.deps)
    assert (done.action, done.job_id, done.skipped) == ("resent", job_id, False)
    assert the_job(world, job_id).state is JobState.QUEUED
    p.run(job_id)
    assert p.assert_complete_and_consistent(job_id) == fault_free_findings(small_chunk_world, {"text": TEXT})
