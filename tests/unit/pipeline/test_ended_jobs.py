"""No work, and no chunk pending, under an ended job. Each test forces its interleaving on the
in-memory repositories by wrapping one repository call."""

from __future__ import annotations

import random

from contract_review.domain import lifecycle
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import document_key
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, Cancellation, ChunkStatus, JobState, Usage
from contract_review.pipeline import fanout, redrive
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker
from tests.oracle import counted

from ..fakes import FakeWorld
from ..model_doubles import EchoModel
from ..scenarios import claim, deliver, one_chunk_job, running_job


def _cancel(world: FakeWorld, job_id: str) -> None:
    """A cancel from start to end: cancelling, then finished (every chunk nobody holds settled `cancelled`)."""
    job = lifecycle.transition(world.deps, world.jobs.get(job_id), JobState.CANCELLING,
                               outcome=Cancellation(cancel_requested_at=world.clock(), cancelled_by="api"))
    assert job is not None
    lifecycle.finish_cancel(world.deps, job)


def test_a_chunk_message_of_a_job_cancelled_meanwhile_is_settled_cancelled_not_left_pending():
    # GIVEN a job whose chunk message is on its way, and a cancel that ended the job meanwhile without seeing the
    # chunk (it was not yet recorded when the cancel finished: the fan-out's race), so its record is pending
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    record = world.claims.get(job_id, msg.chunk_id)
    del world.claims.items[(job_id, msg.chunk_id)]
    _cancel(world, job_id)
    assert world.jobs.get(job_id).state is JobState.CANCELLED
    world.claims.items[(job_id, msg.chunk_id)] = record  # the fan-out's write lands after the cancel
    # WHEN a worker receives the message
    delivery = Delivery(message_id="m", receipt_handle="r", receive_count=1, visibility_s=120,
                        remaining_ms=lambda: 10**9)
    model = EchoModel()
    worker = chunk_worker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None)
    outcome = worker.handle(msg, delivery)
    # THEN it settles the chunk `cancelled`, fenced, counts it on the job, and calls no model
    after = world.claims.get(job_id, msg.chunk_id)
    assert outcome.action == "cancelled" and after.status is ChunkStatus.CANCELLED and after.settled
    assert model.calls == 0
    assert msg.chunk_id in counted(world.claims, world.jobs.get(job_id))


def test_a_redrive_racing_a_cancel_leaves_no_chunk_pending_under_the_cancelled_job():
    # GIVEN a running job with a dead-lettered chunk (counted, 900 tokens) and another one pending
    world = FakeWorld()
    job_id, (first, second) = running_job(world, 2)
    world.artifacts.put_text(document_key(job_id), "Clause one applies. " * 10)
    fence = claim(world, first)
    dead = world.claims.finish(job_id, first.chunk_id, fence, ChunkStatus.DEAD_LETTERED,
                               AttemptStats(calls=2, input_tokens=900),
                               error=ErrorEnvelope.of("model.request_invalid", "rejected", step="analyst.locate"))
    deliver(world, dead)
    # WHEN a redrive of it passed its check while the job ran, and the job is cancelled before its reset lands
    reset = world.claims.reset_for_redrive

    def cancel_first(*a: object, **kw: object) -> object:
        world.claims.reset_for_redrive = reset  # type: ignore[method-assign]  # once
        _cancel(world, job_id)
        return reset(*a, **kw)  # type: ignore[arg-type]  # the repository's own arguments
    world.claims.reset_for_redrive = cancel_first  # type: ignore[method-assign]  # one call wrapped
    action = redrive.reopen(world.deps, job_id, first.chunk_id)
    # THEN nothing was sent, no chunk is pending under the cancelled job, and its cost is its chunks'
    job = world.jobs.get(job_id)
    assert job.state is JobState.CANCELLED and action.startswith("dropped")
    assert world.queues.sent[Queue.ANALYSIS] == []
    records = world.claims.for_job(job_id)
    assert all(r.settled for r in records), [(r.chunk_id, r.status) for r in records]
    assert job.usage().input_tokens == Usage.of(r.usage() for r in records).input_tokens == 900


def test_a_cancelled_job_is_resumed_by_retry_from_its_checkpoints_and_completes_as_a_clean_run():
    """`review retry` of a cancelled job resumes it: the chunk done before the cancel is kept (no
    model call for it again), the cancelled ones run, and the report equals a fault-free run's."""
    from contract_review.domain.records import job_id_for
    from contract_review.review.chunking import document_hash

    from ...texts import TEXT
    from ..inprocess import InProcess, fault_free_findings
    from ..scenarios import small_chunk_world

    world = small_chunk_world()
    p = InProcess(world)
    p.send({"text": TEXT})
    p.intake()
    job_id = job_id_for(document_hash(TEXT))
    first, *_ = world.queues.drain(Queue.ANALYSIS)  # the others are lost with the cancel
    p.deliver(first)  # one chunk done before the cancel
    calls_done_chunk = p.model.calls
    assert lifecycle.request_cancel(world.deps, job_id, by="cli").changed
    assert p.run(job_id).state is JobState.CANCELLED
    records = world.claims.for_job(job_id)
    assert [r.status for r in records].count(ChunkStatus.DONE) == 1 and calls_done_chunk > 0
    # WHEN it is retried
    retried = redrive.retry(world.deps, job_id)
    assert retried.retried and retried.action.startswith("reopened from cancelled")
    p.run(job_id)
    # THEN it completes with exactly the fault-free findings; the chunk done before made no call again
    assert p.assert_complete_and_consistent(job_id) == fault_free_findings(small_chunk_world, {"text": TEXT})
    clean = InProcess(small_chunk_world())
    clean.send({"text": TEXT}, key="clean")
    clean.round()
    clean.run(job_id_for("clean"))
    assert p.model.calls == clean.model.calls  # every analyst once: nothing redone, nothing lost


# --- no chunk sent that the budget left cannot cover at its estimate ---------------------------

def test_the_fanout_sends_only_the_chunks_the_budget_left_covers_and_the_job_stops_before_passing_it():
    from contract_review.pipeline import fanout

    from ..scenarios import settle_done

    # GIVEN a 10-chunk job estimated at $0.0001 a chunk, with a budget of $0.00045, its first 4 chunks sent
    world = FakeWorld()
    job_id, records = running_job(world, 10)
    job = world.jobs.items[job_id].model_copy(update={"budget_micro_usd": 450, "estimate_micro_usd": 1_000,
                                                      "fanned_out": 4})
    world.jobs.items[job_id] = job
    assert fanout.page_size(world.deps, job.model_copy(update={"fanned_out": 0})) == 4  # what the budget covers
    assert fanout.budget_room(job, in_flight=4) == 0 and not fanout.stalled_by_budget(job)
    # WHEN the 4 chunks settle, each having spent its estimate
    for r in records[:4]:
        outcome = deliver(world, settle_done(world, r, stats=AttemptStats(calls=11, model_micro_usd=100)))
    # THEN no further chunk was sent (the $0.00005 left covers none) and the job stopped before spending more:
    # cancelled with job.budget_exceeded, its cost within its budget
    ended = world.jobs.get(job_id)
    assert outcome == "cancelled" and (ended.state, ended.error_code) == (JobState.CANCELLED, "job.budget_exceeded")
    assert ended.fanned_out == 4 and world.queues.sent[Queue.ANALYSIS] == []
    assert ended.total_micro_usd <= ended.budget_micro_usd == 450
    (stop,) = [e for e in world.jobs.events(job_id) if e.type == "job.cancelling"]
    assert stop.detail["before_spending"] is True


def test_a_job_cancelled_between_intake_storing_its_plan_and_its_fan_out_is_fanned_out_by_retry():
    """Found by the extended soak: a cancel that won intake's move to running left the job with its
    document and plan stored but no chunk record; `review retry` reopened it `running` with nothing to send, and
    nothing else would ever fan it out (it stayed running, stalled, for good)."""
    from contract_review.domain.records import job_id_for
    from contract_review.review.chunking import document_hash

    from ...texts import TEXT
    from ..inprocess import InProcess, fault_free_findings
    from ..scenarios import small_chunk_world

    world = small_chunk_world()
    p = InProcess(world)
    job_id = job_id_for(document_hash(TEXT))
    store_plan = fanout.store_plan

    def cancel_after_the_plan(deps: object, jid: str, plan: object) -> None:  # one call wrapped
        store_plan(world.deps, jid, plan)  # type: ignore[arg-type]  # the wrapped call's own arguments
        assert lifecycle.request_cancel(world.deps, jid, by="cli").changed

    fanout.store_plan = cancel_after_the_plan  # type: ignore[assignment]  # the interleaving under test
    try:
        p.send({"text": TEXT})
        p.intake()
    finally:
        fanout.store_plan = store_plan
    assert p.run(job_id).state is JobState.CANCELLED and world.claims.for_job(job_id) == []
    # WHEN it is retried THEN its fan-out starts, and it completes as a clean run
    retried = redrive.retry(world.deps, job_id)
    assert retried.retried and "fan-out starts" in retried.action, retried
    p.run(job_id)
    assert p.assert_complete_and_consistent(job_id) == fault_free_findings(small_chunk_world, {"text": TEXT})


def test_a_job_cancelled_before_intake_stored_its_document_is_not_reopened_to_wait_for_ever():
    """The other case the soak found: intake died between creating the job and storing its document, the job was
    cancelled, and the redelivered intake message found it ended (dropped). Nothing of it is stored: a retry is
    refused with what to do, the job stays cancelled, nothing is sent."""
    from contract_review.domain.records import job_id_for
    from contract_review.review.chunking import document_hash

    from ...texts import TEXT
    from ..inprocess import Crash, InProcess
    from ..scenarios import small_chunk_world

    world = small_chunk_world()
    p = InProcess(world)
    job_id = job_id_for(document_hash(TEXT))
    put_text = world.artifacts.put_text

    def die_before_the_document(key: str, body: str, content_type: str = "application/json") -> None:
        if key == document_key(job_id):
            raise Crash("intake killed after creating the job, before storing its document")
        put_text(key, body, content_type)

    world.artifacts.put_text = die_before_the_document  # type: ignore[method-assign]  # one call wrapped
    p.send({"text": TEXT})
    p.intake()  # the job is created `queued`; intake dies; its message comes back
    world.artifacts.put_text = put_text  # type: ignore[method-assign]
    assert lifecycle.request_cancel(world.deps, job_id, by="cli").changed
    assert p.run(job_id).state is JobState.CANCELLED  # the redelivered message finds it ended
    retried = redrive.retry(world.deps, job_id)
    assert not retried.retried and "another idempotency key" in retried.action
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED
    assert world.claims.for_job(job_id) == [] and not world.queues.drain(Queue.ANALYSIS)
