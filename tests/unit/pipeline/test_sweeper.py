"""Sweeper decisions (contract_review.pipeline.sweeper.sweep) against the in-memory fakes: lapsed claims,
the poison budget, heartbeat races, DLQ explanation and stalled-job reconciliation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord, ReleaseReason
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import document_key
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, JobFailure, JobState
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.redrive import reopen
from contract_review.pipeline.sweeper import Deadline, sweep
from contract_review.reliability.chunks import analysis_message
from tests.oracle import counted

from ...texts import TEXT
from ..fakes import SETTINGS, FakeWorld, Sent
from ..scenarios import events_of, running_job, small_chunk_world, start_job, worker_finishes

LEASE = SETTINGS.claim_lease_s  # 3 s (local profile)
LAPSE = LEASE + 1.0  # past the lease, well inside stall_after_s
STALL = SETTINGS.profile.recovery.stall_after_s  # 15 s (local profile)
BUDGET = SETTINGS.profile.recovery.poison_budget  # 5


# --- helpers ----------------------------------------------------------------------------------------

def worker_fails(world: FakeWorld, job_id: str, chunk_id: str, code: str = "model.unavailable") -> ChunkRecord:
    """A worker's attempt fails with a retryable error: the claim is released, the failure counted (tier 2)."""
    claim = world.claims.claim(job_id, chunk_id, "worker-flaky", LEASE, 1)
    assert claim.won
    released = world.claims.release(job_id, chunk_id, claim.fence, AttemptStats(calls=1),
                                    ErrorEnvelope.of(code, "provider failed", step="worker"), failure=True)
    assert released is not None
    return released


def sqs_moves_to_dlq(world: FakeWorld, job_id: str, chunk_id: str) -> str:
    """The analysis queue's redrive policy moves the chunk's message to the DLQ (raw body, no attributes)."""
    job, record = world.jobs.get(job_id), world.claims.get(job_id, chunk_id)
    assert job is not None and record is not None
    sent = Sent(analysis_message(world.deps, job, record, "intake").model_dump_json(), sent_at=world.clock())
    world.queues.sent[Queue.ANALYSIS_DLQ].append(sent)
    return sent.message_id


INTAKE_EVENTS = ["job.queued", "job.running"]


# --- lapsed claims ----------------------------------------------------------------------------------

def test_a_lapsed_claim_is_released_as_a_lost_worker_and_requeued():
    # GIVEN worker-a claimed chunk 1 and died: its lease lapsed a second ago
    world = small_chunk_world()
    job_id, ids = start_job(world)
    claim = world.claims.claim(job_id, ids[1], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is pending again with one runtime.worker_lost failure counted
    assert report.requeued == [ids[1]] and report.dead_lettered == [] and report.reconciled == []
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.status is ChunkStatus.PENDING
    assert rec.failures == 1 and rec.fence == claim.fence
    assert rec.claimed_by is None and rec.claim_expires_at is None
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.worker_lost"
    assert rec.last_error.step == "sweeper" and "worker-a" in rec.last_error.message
    # AND exactly one fresh analysis message carries the chunk's text, sliced from the stored document
    (msg,) = world.queues.analysis()
    job = world.jobs.get(job_id)
    assert job is not None
    assert (msg.job_id, msg.chunk_id, msg.chunk_index, msg.chunk_count) == (job_id, ids[1], 1, 4)
    assert (msg.start, msg.end) == (rec.start, rec.end) and msg.text == TEXT[rec.start:rec.end]
    assert msg.text.startswith("2. Licence.")
    assert msg.reason == "sweeper" and msg.max_attempts == BUDGET and msg.checkpoint_version == job.config_hash
    # AND the requeue is on the job's record, by the sweeper; nothing is announced
    assert world.jobs.types(job_id) == [*INTAKE_EVENTS, "chunk.requeued"]
    assert events_of(world, job_id, "chunk.requeued") == [
        {"chunk_id": ids[1], "reason": "runtime.worker_lost", "by": "sweeper", "lapsed_for_s": 1.0}]
    assert world.queues.results() == [] and world.queues.sent[Queue.ANALYSIS_DLQ] == []


def test_the_sweeper_decides_a_lapsed_claim_by_its_codes_row_in_the_recovery_policy(monkeypatch):
    """GIVEN runtime.worker_lost made backpressure in the policy table (one row) WHEN a lease lapses THEN the
    sweeper requeues the chunk without counting a failure: it reads the row, it does not hard-code the code."""
    from dataclasses import replace

    from contract_review.domain import policy

    monkeypatch.setitem(policy.POLICY, "runtime.worker_lost",
                        replace(policy.POLICY["runtime.worker_lost"], handling=policy.Handling.BACKPRESSURE))
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[1], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    report = sweep(world.deps)
    rec = world.claims.get(job_id, ids[1])
    assert report.timed_out == [ids[1]] and report.requeued == []
    assert rec is not None and rec.status is ChunkStatus.PENDING and rec.failures == 0
    assert rec.backpressure_requeues == 1


def test_every_lost_attempt_counts_towards_the_poison_budget():
    # GIVEN chunk 2 was requeued once after worker-a died, and worker-b died on the fresh message too
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[2], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    assert sweep(world.deps).requeued == [ids[2]]
    world.queues.drain(Queue.ANALYSIS)
    second = world.claims.claim(job_id, ids[2], "worker-b", LEASE, 1)
    assert second.won and second.fence == 2
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs again
    report = sweep(world.deps)
    # THEN the second loss is counted as well and the chunk is requeued, not yet dead-lettered
    assert report.requeued == [ids[2]] and report.dead_lettered == []
    rec = world.claims.get(job_id, ids[2])
    assert rec is not None and (rec.status, rec.failures, rec.fence) == (ChunkStatus.PENDING, 2, 2)
    assert rec.last_error is not None and "worker-b" in rec.last_error.message
    assert [m.chunk_id for m in world.queues.analysis()] == [ids[2]]
    assert world.jobs.types(job_id).count("chunk.requeued") == 2


def test_requeued_message_attempt_counts_the_failure_just_recorded():
    # GIVEN worker-a died holding chunk 0 (no earlier failures)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[0], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    # WHEN the sweeper requeues it
    sweep(world.deps)
    # THEN the fresh message is the chunk's second attempt: failures on the record + 1
    rec = world.claims.get(job_id, ids[0])
    assert rec is not None and rec.failures == 1
    (msg,) = world.queues.analysis()
    assert msg.attempt == rec.failures + 1 == 2


@pytest.mark.parametrize("advance", [0.5, LEASE], ids=["fresh", "expires-exactly-now"])
def test_a_claim_that_has_not_lapsed_is_left_alone(advance):
    # GIVEN worker-a holds chunk 1 and its lease has not lapsed (expiry == now is still live)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[1], "worker-a", LEASE, 1)
    before = world.claims.get(job_id, ids[1])
    job_before = world.jobs.get(job_id)
    world.clock.advance(advance)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN nothing is written, sent or recorded
    assert report.requeued == [] and report.dead_lettered == [] and report.reconciled == []
    assert world.claims.get(job_id, ids[1]) == before
    assert world.jobs.get(job_id) == job_before
    assert world.queues.analysis() == [] and world.queues.results() == []
    assert world.jobs.types(job_id) == INTAKE_EVENTS


# --- the poison budget ------------------------------------------------------------------------------

def test_after_the_poison_budget_a_lapsed_chunk_is_dead_lettered_with_its_last_error():
    # GIVEN chunk 2 failed BUDGET-1 times on a flaky provider, and the worker of its last attempt died
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for _ in range(BUDGET - 1):
        worker_fails(world, job_id, ids[2], "model.unavailable")
    last = world.claims.claim(job_id, ids[2], "worker-e", LEASE, 1)
    assert last.won and last.record is not None and last.record.failures == BUDGET - 1
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is settled dead_lettered, keeping the provider error rather than worker_lost
    assert report.dead_lettered == [ids[2]] and report.requeued == []
    rec = world.claims.get(job_id, ids[2])
    assert rec is not None and rec.status is ChunkStatus.DEAD_LETTERED
    assert rec.failures == BUDGET and rec.fence == last.fence and rec.settled_at == world.clock()
    assert rec.claimed_by is None
    assert rec.last_error is not None and rec.last_error.error_code == "model.unavailable"
    # AND no fresh message; the chunk's message is in the analysis DLQ with the envelope in its attributes
    assert world.queues.analysis() == []
    (dlq,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    body = AnalysisMessage.model_validate_json(dlq.body)
    assert (body.job_id, body.chunk_id, body.text) == (job_id, ids[2], TEXT[rec.start:rec.end])
    assert body.attempt == BUDGET
    assert dlq.attributes["error_code"] == "model.unavailable"
    assert ErrorEnvelope.model_validate_json(dlq.attributes["envelope"]) == rec.last_error
    assert (dlq.attributes["job_id"], dlq.attributes["chunk_id"]) == (job_id, ids[2])
    # AND the settling is announced to the aggregator and recorded
    (result,) = world.queues.results()
    assert (result.chunk_id, result.status, result.fence) == (ids[2], ChunkStatus.DEAD_LETTERED, rec.fence)
    assert result.error is not None and result.error.error_code == "model.unavailable"
    assert result.findings_key is None
    assert events_of(world, job_id, "chunk.dead_lettered") == [
        {"chunk_id": ids[2], "error_code": "model.unavailable", "by": "sweeper"}]
    assert "chunk.requeued" not in world.jobs.types(job_id)


def test_a_lapsed_chunk_one_failure_short_of_the_budget_is_still_requeued():
    # GIVEN chunk 2 failed BUDGET-2 times, and the worker of its next attempt died
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for _ in range(BUDGET - 2):
        worker_fails(world, job_id, ids[2], "model.unavailable")
    world.claims.claim(job_id, ids[2], "worker-d", LEASE, 1)
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the lost attempt is counted (BUDGET-1 failures) and the chunk gets its last attempt
    assert report.requeued == [ids[2]] and report.dead_lettered == []
    rec = world.claims.get(job_id, ids[2])
    assert rec is not None and (rec.status, rec.failures) == (ChunkStatus.PENDING, BUDGET - 1)
    assert [m.chunk_id for m in world.queues.analysis()] == [ids[2]]
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == [] and world.queues.results() == []


def test_a_chunk_with_no_earlier_error_is_dead_lettered_as_a_lost_worker():
    # GIVEN a budget of one attempt, and the worker holding chunk 0 died
    world = small_chunk_world(poison_budget=1)
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[0], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is dead-lettered with the sweeper's runtime.worker_lost envelope
    assert report.dead_lettered == [ids[0]] and report.requeued == []
    rec = world.claims.get(job_id, ids[0])
    assert rec is not None and rec.status is ChunkStatus.DEAD_LETTERED and rec.failures == 1
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.worker_lost"
    (dlq,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    assert dlq.attributes["error_code"] == "runtime.worker_lost"
    assert ErrorEnvelope.model_validate_json(dlq.attributes["envelope"]).step == "sweeper"
    assert [(r.chunk_id, r.status) for r in world.queues.results()] == [(ids[0], ChunkStatus.DEAD_LETTERED)]
    assert world.queues.analysis() == []


# --- races: the owner's write between the sweeper's read and its write wins --------------------------

def _heartbeat(world: FakeWorld, r: ChunkRecord) -> tuple[ChunkStatus, str | None, int]:
    assert world.claims.heartbeat(r.job_id, r.chunk_id, r.fence, LEASE)
    return ChunkStatus.CLAIMED, "worker-a", r.fence


def _reclaim(world: FakeWorld, r: ChunkRecord) -> tuple[ChunkStatus, str | None, int]:
    # a redelivery reaches worker-b, which takes the lapsed lease
    assert world.claims.claim(r.job_id, r.chunk_id, "worker-b", LEASE, 2).won
    return ChunkStatus.CLAIMED, "worker-b", r.fence + 1


def _finish(world: FakeWorld, r: ChunkRecord) -> tuple[ChunkStatus, str | None, int]:
    # the slow worker completes under its (lapsed but still current) fencing token
    outcome = ChunkOutcome(findings_key="findings/x.json", coverage={}, n_findings=0)
    assert world.claims.finish(r.job_id, r.chunk_id, r.fence, ChunkStatus.DONE, AttemptStats(), outcome=outcome)
    return ChunkStatus.DONE, None, r.fence


RACES: dict[str, tuple[Callable[[FakeWorld, ChunkRecord], tuple[ChunkStatus, str | None, int]], int]] = {
    "heartbeat-before-requeue": (_heartbeat, BUDGET),
    "heartbeat-before-dead-letter": (_heartbeat, 1),
    "reclaim-before-requeue": (_reclaim, BUDGET),
    "finish-before-dead-letter": (_finish, 1),
}


@pytest.mark.parametrize("race", RACES)
def test_a_write_by_the_owner_between_the_sweepers_read_and_write_wins(race, monkeypatch):
    owner_write, budget = RACES[race]
    # GIVEN worker-a's lease on chunk 1 has lapsed
    world = small_chunk_world(poison_budget=budget)
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[1], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    # AND the owner writes right after the sweeper has read the lapsed claims
    read_lapsed = world.claims.lapsed
    expected: list[tuple[ChunkStatus, str | None, int]] = []

    def lapsed_then_owner_writes(now: float) -> Iterator[ChunkRecord]:
        for r in read_lapsed(now):
            yield r
            expected.append(owner_write(world, r))

    monkeypatch.setattr(world.claims, "lapsed", lapsed_then_owner_writes)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the owner's write stands: nothing requeued or dead-lettered, no failure counted
    assert len(expected) == 1, "the interleaving did not happen"
    assert report.requeued == [] and report.dead_lettered == []
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and (rec.status, rec.claimed_by, rec.fence) == expected[0]
    assert rec.failures == 0 and rec.last_error is None
    if rec.status is ChunkStatus.CLAIMED:
        assert rec.claim_expires_at == world.clock() + LEASE
    assert world.queues.analysis() == [] and world.queues.results() == []
    assert world.jobs.types(job_id) == INTAKE_EVENTS
    # AND a dead-letter that lost leaves at most its DLQ copy (sent first, so a crash cannot leave a
    # dead-lettered chunk without one), naming the fence it was decided under; it is never acted on,
    # and it is removed once the owner has finished the chunk
    stale = world.queues.sent[Queue.ANALYSIS_DLQ]
    assert all(s.attributes["fence"] == str(expected[0][2]) for s in stale)
    if stale:
        assert rec.status is ChunkStatus.CLAIMED
        assert sweep(world.deps).dead_lettered == [] and world.queues.sent[Queue.ANALYSIS_DLQ] == stale
        _finish(world, rec)
        assert sweep(world.deps).dlq_removed == 1
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []
    after = world.claims.get(job_id, ids[1])
    assert after is not None and after.status is not ChunkStatus.DEAD_LETTERED


# --- lapsed claims of ended jobs --------------------------------------------------------------------

@pytest.mark.parametrize("ended", [JobState.CANCELLED, JobState.FAILED])
def test_a_lapsed_claim_of_an_ended_job_is_only_released(ended):
    # GIVEN worker-a died holding chunk 1, and the job has ended meanwhile
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[1], "worker-a", LEASE, 1)
    env = ErrorEnvelope.of("model.access_denied", "no access", step="worker")
    failure = JobFailure(error=env, error_code=env.error_code, ended_at=world.clock()) \
        if ended is JobState.FAILED else None
    assert world.jobs.transition(job_id, (JobState.RUNNING,), ended, outcome=failure) is not None
    world.clock.advance(LAPSE)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the lease is freed without counting a failure, and no work is sent for a finished job
    assert report.requeued == [] and report.dead_lettered == []
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.status is ChunkStatus.PENDING
    assert rec.claimed_by is None and rec.claim_expires_at is None
    assert rec.failures == 0 and rec.last_error is None
    assert world.queues.analysis() == [] and world.queues.results() == []
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []
    assert not any(t.startswith("chunk.") for t in world.jobs.types(job_id))


# --- DLQ explanation --------------------------------------------------------------------------------

@pytest.mark.parametrize("earlier_failures", [0, 2, BUDGET - 1])
def test_a_message_the_queue_moved_with_attempt_budget_left_is_sent_again_not_dead_lettered(earlier_failures):
    # GIVEN chunk 3 is pending with fewer failed attempts than the poison budget, and SQS has moved its
    # message to the DLQ anyway: its receives were burned without failed attempts (Lambda throttling of
    # the event source, errors before the claim)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for _ in range(earlier_failures):
        worker_fails(world, job_id, ids[3], "model.unavailable")
    before = world.claims.get(job_id, ids[3])
    assert before is not None
    world.clock.advance(1)
    message_id = sqs_moves_to_dlq(world, job_id, ids[3])
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is not dead-lettered: it is pending, no failure counted, its backpressure streak begun
    assert report.dlq_seen == 1 and report.dead_lettered == [] and report.dlq_requeued == [ids[3]]
    rec = world.claims.get(job_id, ids[3])
    assert rec is not None and rec.status is ChunkStatus.PENDING and rec.failures == earlier_failures
    assert rec.release_reason is ReleaseReason.BACKPRESSURE and rec.backpressure_requeues == 1
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.receives_exhausted"
    # AND one fresh, delayed message carries the chunk again; the DLQ copy is gone; nothing is announced
    (again,) = world.queues.sent[Queue.ANALYSIS]
    msg = AnalysisMessage.model_validate_json(again.body)
    assert (msg.chunk_id, msg.reason, msg.attempt, msg.requeues) == (
        ids[3], "runtime.receives_exhausted", earlier_failures + 1, 1)
    assert msg.text == TEXT[rec.start:rec.end] and again.delay_s >= 1
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == [] and world.queues.results() == []
    assert world.queues.deleted == [(Queue.ANALYSIS_DLQ, message_id)]
    assert world.jobs.get(job_id).requeues == 1  # type: ignore[union-attr]
    assert [(e["reason"], e["dlq_message_id"], e["failures"]) for e in events_of(world, job_id, "chunk.requeued")] \
        == [("runtime.receives_exhausted", message_id, earlier_failures)]
    # AND the resent chunk completes
    worker_finishes(world, job_id, ids[3])
    done = world.claims.get(job_id, ids[3])
    assert done is not None and done.status is ChunkStatus.DONE


def test_a_message_the_queue_moved_once_the_budget_is_used_dead_letters_the_chunk():
    # GIVEN chunk 3 used its whole poison budget without being settled, and SQS moved its message
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for _ in range(BUDGET):
        worker_fails(world, job_id, ids[3], "model.unavailable")
    world.clock.advance(1)
    message_id = sqs_moves_to_dlq(world, job_id, ids[3])
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is settled dead_lettered with its last error; the DLQ message stays for people
    assert report.dead_lettered == [ids[3]] and report.dlq_requeued == []
    rec = world.claims.get(job_id, ids[3])
    assert rec is not None and rec.status is ChunkStatus.DEAD_LETTERED
    assert rec.last_error is not None and rec.last_error.error_code == "model.unavailable"
    assert [(r.chunk_id, r.status) for r in world.queues.results()] == [(ids[3], ChunkStatus.DEAD_LETTERED)]
    assert events_of(world, job_id, "chunk.dead_lettered") == [
        {"chunk_id": ids[3], "error_code": "model.unavailable", "by": "sweeper", "dlq_message_id": message_id}]
    assert [s.message_id for s in world.queues.sent[Queue.ANALYSIS_DLQ]] == [message_id]
    assert world.queues.analysis() == []
    # AND a second sweep finds nothing more to do for it
    again = sweep(world.deps)
    assert again.dlq_seen == 1 and again.dead_lettered == [] and len(world.queues.results()) == 1


def test_a_chunk_that_keeps_reaching_the_dlq_ends_at_the_backpressure_deadline():
    # GIVEN a chunk whose message the queue keeps moving to the DLQ (every receive burned, no failure)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    deadline = SETTINGS.profile.recovery.backpressure_deadline_s
    trips = 0
    while world.claims.get(job_id, ids[2]).status is ChunkStatus.PENDING:  # type: ignore[union-attr]
        world.queues.drain(Queue.ANALYSIS)
        sqs_moves_to_dlq(world, job_id, ids[2])
        # WHEN the sweeper explains it, again and again
        sweep(world.deps)
        trips += 1
        world.clock.advance(deadline / 4)
        assert trips < 10, "never dead-lettered"
    # THEN it is requeued while its streak lasts and dead-lettered once it has lasted the deadline
    rec = world.claims.get(job_id, ids[2])
    assert rec is not None and rec.status is ChunkStatus.DEAD_LETTERED and rec.failures == 1
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.backpressure_exhausted"
    assert rec.last_error.cause_code == "runtime.receives_exhausted"
    assert trips == 5  # requeued at 0, 1/4, 1/2 and 3/4 of the deadline; dead-lettered at the deadline
    assert len(world.queues.sent[Queue.ANALYSIS_DLQ]) == 1  # the last copy stays for `review dlq redrive`


@pytest.mark.parametrize("redrive_after_s", [0.0, 1.0], ids=["same-instant", "later"])
def test_a_dlq_message_older_than_the_chunks_redrive_is_ignored(redrive_after_s):
    # GIVEN the sweeper dead-lettered chunk 0 (budget of one attempt), leaving a copy in the DLQ
    world = small_chunk_world(poison_budget=1)
    job_id, ids = start_job(world)
    world.claims.claim(job_id, ids[0], "worker-a", LEASE, 1)
    world.clock.advance(LAPSE)
    assert sweep(world.deps).dead_lettered == [ids[0]]
    (dlq,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    # AND an operator reopened the chunk afterwards (at or after the DLQ message's sent time)
    world.clock.advance(redrive_after_s)
    assert reopen(world.deps, job_id, ids[0]) == "redriven (1 chunk(s) sent)"
    rec = world.claims.get(job_id, ids[0])
    assert rec is not None and rec.status is ChunkStatus.PENDING and rec.redriven_at >= dlq.sent_at
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the stale DLQ copy does not dead-letter the redriven chunk again
    assert report.dlq_seen == 1 and report.dead_lettered == []
    assert world.claims.get(job_id, ids[0]) == rec
    assert len(world.queues.results()) == 1  # only the first dead-lettering's announcement
    assert world.jobs.types(job_id).count("chunk.dead_lettered") == 1


def test_a_dlq_message_of_a_chunk_under_a_live_lease_is_left_alone():
    # GIVEN chunk 1's message reached the DLQ, but worker-b holds a live lease on the chunk
    world = small_chunk_world()
    job_id, ids = start_job(world)
    sqs_moves_to_dlq(world, job_id, ids[1])
    world.clock.advance(1)
    world.claims.claim(job_id, ids[1], "worker-b", LEASE, 1)
    before = world.claims.get(job_id, ids[1])
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the worker keeps the chunk
    assert report.dlq_seen == 1 and report.dead_lettered == []
    assert world.claims.get(job_id, ids[1]) == before
    assert world.queues.results() == [] and world.jobs.types(job_id) == INTAKE_EVENTS


@pytest.mark.parametrize("kind", ["not-json", "not-a-chunk-message"])
def test_a_dlq_message_that_is_not_a_chunk_message_is_ignored(kind):
    # GIVEN chunk 0 is pending, and the analysis DLQ holds something that is not an analysis message
    world = small_chunk_world()
    job_id, ids = start_job(world)
    body = "{not json" if kind == "not-json" else json.dumps({"job_id": job_id, "chunk_id": ids[0]})
    world.queues.dead_letter(Queue.ANALYSIS, body, ErrorEnvelope.of("input.invalid", "?"))
    records = world.claims.for_job(job_id)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN it is counted as seen and left alone; no chunk is touched
    assert report.dlq_seen == 1 and report.dead_lettered == []
    assert world.claims.for_job(job_id) == records
    assert world.queues.results() == [] and len(world.queues.sent[Queue.ANALYSIS_DLQ]) == 1
    assert world.jobs.types(job_id) == INTAKE_EVENTS


# --- stalled jobs -----------------------------------------------------------------------------------

def test_a_stalled_job_gets_uncounted_results_resent_and_pending_chunks_requeued():
    # GIVEN chunk 0 finished and was counted; chunk 1 finished but its result was never counted;
    # chunk 2's message was lost (pending, nobody holds it); chunk 3 is being worked on
    world = small_chunk_world()
    job_id, ids = start_job(world)
    worker_finishes(world, job_id, ids[0])
    c1 = worker_finishes(world, job_id, ids[1])
    first, lost = world.queues.results()
    assert handle_result(world.deps, first) == "recorded"
    # AND nothing has happened on the job for longer than stall_after_s
    world.clock.advance(STALL + 1)
    world.claims.claim(job_id, ids[3], "worker-d", LEASE, 1)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    now = world.clock()
    # THEN chunk 1's result is sent again under a new deduplication id (the first one was used)
    assert report.reconciled == [job_id] and report.requeued == []
    assert len(world.queues.sent[Queue.RESULTS]) == 3
    resent = world.queues.sent[Queue.RESULTS][-1]
    assert resent.dedup_id == f"{lost.dedup_id()}:reconcile:{int(now)}" != lost.dedup_id()
    assert ResultMessage.model_validate_json(resent.body) == lost
    assert (lost.chunk_id, lost.status, lost.fence, lost.findings_key) == (ids[1], "done", c1.fence, c1.findings_key)
    # AND only the pending chunk 2 gets a fresh message (not the done ones, not the claimed one)
    (msg,) = world.queues.analysis()
    rec2 = world.claims.get(job_id, ids[2])
    assert rec2 is not None
    assert (msg.chunk_id, msg.reason, msg.attempt) == (ids[2], "reconcile", 1)
    assert msg.text == TEXT[rec2.start:rec2.end] and msg.text.startswith("3. Law.")
    # AND the job is touched and the reconciliation recorded
    job = world.jobs.get(job_id)
    assert job is not None and job.updated_at == now and job.state is JobState.RUNNING
    assert events_of(world, job_id, "job.reconciled") == [
        {"results_resent": 1, "chunks_requeued": 1, "by": "sweeper", "lost": {"queue_empty": 1}}]
    # AND the resent result is counted by the aggregator; an immediate second sweep does nothing
    assert handle_result(world.deps, ResultMessage.model_validate_json(resent.body)) == "recorded"
    assert counted(world.claims, world.jobs.get(job_id)) == {ids[0], ids[1]}  # type: ignore[union-attr]
    assert sweep(world.deps).reconciled == [] and len(world.queues.analysis()) == 1


def test_a_stalled_job_with_nothing_to_do_is_touched_but_not_reported():
    # GIVEN a job idle for longer than stall_after_s whose four chunks are all held by live workers
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.clock.advance(STALL + 1)
    for i, chunk_id in enumerate(ids):
        assert world.claims.claim(job_id, chunk_id, f"worker-{i}", LEASE, 1).won
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN nothing is sent or recorded, but the job is touched so the next stall period starts now
    assert report.reconciled == [] and report.requeued == []
    assert world.queues.analysis() == [] and world.queues.results() == []
    assert world.jobs.types(job_id) == INTAKE_EVENTS
    job = world.jobs.get(job_id)
    assert job is not None and job.updated_at == world.clock()
    assert list(world.jobs.stalled(world.clock() - STALL)) == []


def test_a_job_that_progressed_within_the_stall_period_is_not_reconciled():
    # GIVEN a running job with pending chunks, last updated just under stall_after_s ago
    world = small_chunk_world()
    job_id, _ = start_job(world)
    updated_at = world.jobs.get(job_id).updated_at  # type: ignore[union-attr]
    world.clock.advance(STALL - 1)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN its pending chunks are not re-sent (their messages are presumably still in the queue)
    assert report.reconciled == [] and world.queues.analysis() == []
    assert world.jobs.get(job_id).updated_at == updated_at  # type: ignore[union-attr]


# --- function timeouts are not crashes --------------------------------------------------------------

INVOCATION = 20.0  # the claiming Lambda's timeout (local profile worker_timeout_s)


def invocation_claims(world: FakeWorld, job_id: str, chunk_id: str, *, beats_until: float) -> float:
    """A Lambda invocation (20 s) claims the chunk and heartbeats every lease/3 until `beats_until`
    seconds into it, then vanishes (killed at its timeout, or crashed). Returns its deadline."""
    deadline = world.clock() + INVOCATION
    claim = world.claims.claim(job_id, chunk_id, "lambda-a", LEASE, 1, deadline_at=deadline)
    assert claim.won and claim.record is not None and claim.record.deadline_at == deadline
    start = world.clock()
    while world.clock() + LEASE / 3 <= start + beats_until:
        world.clock.advance(LEASE / 3)
        assert world.claims.heartbeat(job_id, chunk_id, claim.fence, LEASE)
    world.clock.advance(start + beats_until - world.clock())
    return deadline


def test_a_lease_that_lapsed_after_the_invocations_deadline_is_released_without_a_failure():
    # GIVEN an invocation that worked on chunk 1 until Lambda killed it at its 20 s timeout
    world = small_chunk_world()
    job_id, ids = start_job(world)
    invocation_claims(world, job_id, ids[1], beats_until=INVOCATION)
    world.clock.advance(LEASE + 0.5)  # its lease lapses a little after the deadline
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN the chunk is released as backpressure (out of time): no failure, a delayed fresh message
    assert report.timed_out == [ids[1]] and report.requeued == [] and report.dead_lettered == []
    assert report.backpressure_requeues == 1
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.status is ChunkStatus.PENDING and rec.failures == 0
    assert (rec.release_reason, rec.backpressure_requeues) == (ReleaseReason.BACKPRESSURE, 1)
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.time_exhausted"
    # (the job also stalled meanwhile: its never-claimed chunks were re-sent by the reconciler, not chunk 1)
    (sent,) = [m for m in world.queues.sent[Queue.ANALYSIS] if ids[1] in m.body]
    msg = AnalysisMessage.model_validate_json(sent.body)
    assert (msg.chunk_id, msg.reason, msg.attempt) == (ids[1], "runtime.time_exhausted", 1) and sent.delay_s >= 1
    assert events_of(world, job_id, "chunk.requeued")[0]["reason"] == "runtime.time_exhausted"
    assert world.jobs.get(job_id).requeues == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("died_at", [0.5, INVOCATION - LEASE])
def test_a_lease_that_lapsed_well_before_the_deadline_is_a_crash_and_counts(died_at):
    # GIVEN an invocation that crashed `died_at` seconds in, long before its 20 s deadline
    world = small_chunk_world()
    job_id, ids = start_job(world)
    invocation_claims(world, job_id, ids[1], beats_until=died_at)
    world.clock.advance(LEASE + 0.5)
    # WHEN the sweeper runs THEN it is a lost worker: one failure counted, requeued at once
    report = sweep(world.deps)
    assert report.requeued == [ids[1]] and report.timed_out == []
    rec = world.claims.get(job_id, ids[1])
    assert rec is not None and rec.failures == 1 and rec.release_reason is ReleaseReason.WORKER_LOST
    assert rec.last_error is not None and rec.last_error.error_code == "runtime.worker_lost"
    assert world.jobs.get(job_id).requeues == 0  # type: ignore[union-attr]


def test_function_timeouts_without_progress_end_at_the_backpressure_deadline():
    # GIVEN a chunk whose invocations keep reaching their timeout without checkpointing anything
    world = small_chunk_world(backpressure_deadline_s=60.0)
    job_id, ids = start_job(world)
    outcomes: list[tuple[list[str], list[str]]] = []
    for _ in range(10):
        invocation_claims(world, job_id, ids[0], beats_until=INVOCATION)
        world.clock.advance(LEASE + 0.5)
        report = sweep(world.deps)
        outcomes.append((report.timed_out, report.dead_lettered))
        world.queues.drain(Queue.ANALYSIS)
        if report.dead_lettered:
            break
    # THEN none of them counted as a failure until the deadline, then the chunk was dead-lettered
    timed_out = [o for o in outcomes if o[0]]
    assert outcomes[-1] == ([], [ids[0]]) and len(timed_out) == len(outcomes) - 1 >= 2
    rec = world.claims.get(job_id, ids[0])
    assert rec is not None and rec.status is ChunkStatus.DEAD_LETTERED and rec.failures == 1
    (dlq,) = world.queues.sent[Queue.ANALYSIS_DLQ]
    env = ErrorEnvelope.model_validate_json(dlq.attributes["envelope"])
    assert (env.error_code, env.cause_code) == ("runtime.backpressure_exhausted", "runtime.time_exhausted")
    assert f"{len(timed_out)} requeue(s)" in env.message


# --- the reconciler and chunks whose message is on its way --------------------------------------------

def test_the_reconciler_does_not_resend_chunks_whose_requeue_is_on_its_way():
    # GIVEN a stalled job: chunk 0 throttled (released as backpressure, its delayed message on the
    # way), chunk 1 failed an attempt (tier 2: the same message comes back), chunk 2 never claimed,
    # chunk 3 released as backpressure longer ago than the stall period (its message must be lost)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    env = ErrorEnvelope.of("model.throttled", "429")

    def release(chunk_id: str, reason: ReleaseReason) -> None:
        c = world.claims.claim(job_id, chunk_id, "w", LEASE, 1)
        assert world.claims.release(job_id, chunk_id, c.fence, AttemptStats(), env, failure=False, reason=reason)

    release(ids[3], ReleaseReason.BACKPRESSURE)
    world.clock.advance(STALL + 1)
    release(ids[0], ReleaseReason.BACKPRESSURE)
    release(ids[1], ReleaseReason.RETRY)
    # WHEN the sweeper runs
    report = sweep(world.deps)
    # THEN only the chunks without a message on its way get a fresh one; the stalled job is counted
    assert report.stalled_jobs == 1 and report.reconciled == [job_id]
    assert sorted(m.chunk_id for m in world.queues.analysis()) == [ids[2], ids[3]]
    assert events_of(world, job_id, "job.reconciled") == [
        {"results_resent": 0, "chunks_requeued": 2, "by": "sweeper", "lost": {"queue_empty": 2}}]


def test_each_sweep_reports_how_many_stalled_jobs_it_found():
    # GIVEN a running job with pending chunks
    world = small_chunk_world()
    start_job(world)
    # THEN it is not stalled at first, is counted once idle for the stall period, and not again
    # until another stall period has passed (the sweep touched it)
    assert sweep(world.deps).stalled_jobs == 0
    world.clock.advance(STALL + 1)
    assert sweep(world.deps).stalled_jobs == 1
    assert sweep(world.deps).stalled_jobs == 0
    world.clock.advance(STALL + 1)
    assert sweep(world.deps).stalled_jobs == 1


def test_a_sweep_that_reaches_its_deadline_counts_every_stalled_job_and_leaves_the_rest_to_the_next():
    # GIVEN three running jobs without progress for the stall period
    world = FakeWorld()
    ids = []
    for key in ("a", "b", "c"):
        job_id, _ = running_job(world, 1, key)
        world.artifacts.put_text(document_key(job_id), "x" * 100)  # the reconciler rebuilds messages from it
        ids.append(job_id)
    world.clock.advance(STALL + 1)

    def reconciled() -> list[str]:
        return [j for j in ids if events_of(world, j, "job.reconciled")]

    # AND an invocation whose time left falls under the reserve once the sweep has reconciled one job
    deadline = Deadline(lambda: 1.0 if reconciled() else 60.0, reserve_s=10)
    # WHEN the sweep runs
    report = sweep(world.deps, deadline=deadline)
    # THEN it counted the three (StuckJobs), reconciled one, started nothing after it and says where it stopped
    assert report.stalled_jobs == 3 and len(reconciled()) == 1 and report.stopped_at == "reconcile"
    assert report.approvals_expired == []
    # AND the next sweep, with time, reconciles the other two
    report = sweep(world.deps)
    assert report.stalled_jobs == 2 and len(reconciled()) == 3 and report.stopped_at is None


# --- a backlog is not a loss ----------------------------------------------------------------------------

RETENTION = SETTINGS.profile.queues.queue_retention_days * 86400


def test_a_backlog_waiting_in_the_queue_is_never_resent():
    # GIVEN a running job whose four messages still wait in the analysis queue behind other work
    # (nobody has received them), idle for many stall periods
    world = small_chunk_world()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    job_id = result.job_id
    assert job_id is not None and len(world.queues.analysis()) == 4
    reports = []
    for _ in range(5):
        world.clock.advance(STALL + 1)
        reports.append(sweep(world.deps))
    # THEN every sweep found it stalled, and none sent a chunk message again
    assert [r.stalled_jobs for r in reports] == [1] * 5
    assert [r.chunks_resent for r in reports] == [0] * 5 and all(r.reconciled == [] for r in reports)
    assert len(world.queues.analysis()) == 4 and events_of(world, job_id, "job.reconciled") == []


def test_a_message_lost_between_the_release_and_the_send_is_resent_once_the_queue_has_none():
    # GIVEN a worker released chunk 3 as backpressure and crashed before sending its fresh message,
    # while another job's chunk messages wait in the queue
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for chunk_id in ids[:3]:
        worker_finishes(world, job_id, chunk_id)
    for m in world.queues.results():
        handle_result(world.deps, m)
    c = world.claims.claim(job_id, ids[3], "worker-crashed", LEASE, 1)
    released = world.claims.release(job_id, ids[3], c.fence, AttemptStats(), ErrorEnvelope.of("model.throttled", "429"),
                                    failure=False, reason=ReleaseReason.BACKPRESSURE)
    assert released is not None and released.message_sent_at == world.clock()  # written before the send
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT.upper()}}), "m-2")
    backlog = len(world.queues.analysis())
    assert backlog == 4
    # WHEN the job stalls while that backlog is in the queue THEN the sweeper cannot tell a loss: nothing is sent
    world.clock.advance(STALL + 1)
    assert sweep(world.deps).chunks_resent == 0 and len(world.queues.analysis()) == backlog
    # WHEN the backlog is taken and the job stalls again
    world.queues.drain(Queue.ANALYSIS)
    world.clock.advance(STALL + 1)
    report = sweep(world.deps)
    # THEN the queue held no message at all, so chunk 3's was lost: it gets one fresh message (so do the other
    # job's chunks: their messages were taken off the queue and nobody claimed them)
    resent = {m.chunk_id for m in world.queues.analysis()}
    assert ids[3] in resent and report.chunks_resent == len(resent)
    assert events_of(world, job_id, "job.reconciled") == [
        {"results_resent": 0, "chunks_requeued": 1, "by": "sweeper", "lost": {"queue_empty": 1}}]
    rec = world.claims.get(job_id, ids[3])
    assert rec is not None and rec.message_sent_at == world.clock()
    # AND the next stall period sends nothing more while that message waits
    world.clock.advance(STALL + 1)
    assert sweep(world.deps).chunks_resent == 0


def test_a_message_past_its_retention_is_resent_even_behind_a_backlog():
    # GIVEN a job whose chunk 1 failed an attempt (tier 2: the same message comes back, its first send time kept)
    # and whose other messages wait in a queue that never empties
    world = small_chunk_world()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    job_id = result.job_id
    assert job_id is not None
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    sent_at = world.clock()
    world.clock.advance(3600)
    retried = worker_fails(world, job_id, ids[1])
    assert retried.message_sent_at == sent_at  # a tier-2 retry keeps its message, and its retention clock
    # WHEN the sweeper looks more than a stall period before the messages' retention ends THEN nothing is sent
    world.clock.advance(RETENTION - 2 * STALL - 3600 - 1)
    assert sweep(world.deps).chunks_resent == 0
    # WHEN it looks again a stall period later, with less than a stall period of retention left
    world.clock.advance(STALL + 1)
    report = sweep(world.deps)
    # THEN all four are sent again: SQS deletes them before the next reconcile could look
    assert report.chunks_resent == 4 and report.reconciled == [job_id]
    assert events_of(world, job_id, "job.reconciled")[-1]["lost"] == {"retention": 4}


def test_a_chunk_claimed_between_the_read_and_the_resend_is_not_sent(monkeypatch):
    # GIVEN a stalled job whose chunk messages are lost (the queue is empty)
    world = small_chunk_world()
    job_id, ids = start_job(world)
    world.clock.advance(STALL + 1)
    read = world.claims.for_job

    def read_then_claimed(job: str) -> list[ChunkRecord]:
        records = read(job)
        world.claims.claim(job, ids[0], "worker-late", LEASE, 1)  # a worker claims chunk 0 right after the read
        return records

    monkeypatch.setattr(world.claims, "for_job", read_then_claimed)
    # WHEN the sweeper reconciles THEN the claimed chunk is not sent (its holder has it), the three others are
    report = sweep(world.deps)
    assert sorted(m.chunk_id for m in world.queues.analysis()) == sorted(ids[1:]) and report.chunks_resent == 3


def test_a_chunk_record_from_before_the_send_time_keeps_the_old_rule():
    # GIVEN a stalled job whose chunk records were written before records said when their message was sent,
    # while other messages wait in the queue
    world = small_chunk_world()
    job_id, ids = start_job(world)
    for chunk_id in ids:
        record = world.claims.items[(job_id, chunk_id)]
        world.claims.items[(job_id, chunk_id)] = record.model_copy(update={"message_sent_at": None})
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT.upper()}}), "m-2")
    world.clock.advance(STALL + 1)
    # WHEN the sweeper runs THEN its pending chunks are re-sent as before (nothing says their message is in the queue)
    report = sweep(world.deps)
    assert report.reconciled == [job_id] and report.chunks_resent == 4  # the other job's wait in the queue
    assert events_of(world, job_id, "job.reconciled")[0]["lost"] == {"unknown_send": 4}
