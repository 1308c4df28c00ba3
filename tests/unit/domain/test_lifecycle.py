"""The job's state machine (`contract_review.domain.lifecycle`): the transition table, conditional
transitions with numbered events, and cancellation at every stage, against the in-memory fakes
with the real intake, worker, aggregator and sweeper (`inprocess.py`)."""

from __future__ import annotations

import pytest

from contract_review.domain import lifecycle
from contract_review.domain.lifecycle import TRANSITIONS, IllegalTransition
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState, job_id_for

from ...texts import TEXT
from ..fakes import FakeWorld
from ..inprocess import Fault, InProcess
from ..scenarios import small_chunk_world

KEY = "msa-lifecycle"
JOB = job_id_for(KEY)
S = JobState


def started(world: FakeWorld | None = None) -> InProcess:
    """TEXT submitted and taken in by intake: a running job of 4 chunks, their messages queued."""
    p = InProcess(world or small_chunk_world())
    p.send({"text": TEXT}, key=KEY)
    p.intake()
    return p


def job(p: InProcess):
    j = p.world.jobs.get(JOB)
    assert j is not None
    return j


# --- the table ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("frm", list(JobState))
@pytest.mark.parametrize("to", list(JobState))
def test_every_transition_outside_the_table_raises_and_writes_nothing(frm: JobState, to: JobState):
    world = small_chunk_world()
    p = started(world)
    world.jobs.items[JOB] = job(p).model_copy(update={"state": frm})
    before = job(p)
    if to in TRANSITIONS[frm]:
        after = lifecycle.transition(world.deps, before, to)
        assert after is not None and after.state is to and after.version == before.version + 1
        last = world.jobs.last_event(JOB)
        assert last is not None and (last.type, last.detail["from_state"]) == (f"job.{to.value}", frm.value)
    else:
        with pytest.raises(IllegalTransition):
            lifecycle.transition(world.deps, before, to)
        assert job(p) == before


def test_ended_states_lead_nowhere_but_a_reopen():
    assert TRANSITIONS[S.COMPLETED] == frozenset()
    assert TRANSITIONS[S.CANCELLED] == {S.RUNNING}  # review retry: resumed from its checkpoints
    assert TRANSITIONS[S.CANCELLING] == {S.CANCELLED}
    assert TRANSITIONS[S.DEAD_LETTERED] == {S.RUNNING}


def test_a_transition_from_a_stale_read_is_refused():
    # GIVEN two readers of the same running job; the first moves it to waiting_approval
    p = started()
    a, b = job(p), job(p)
    assert lifecycle.transition(p.world.deps, a, S.WAITING_APPROVAL) is not None
    # WHEN the second, from its stale read, tries to complete the job THEN it is refused (version moved)
    assert lifecycle.transition(p.world.deps, b, S.COMPLETED) is None
    assert job(p).state is S.WAITING_APPROVAL


# --- events ------------------------------------------------------------------------------------------

def test_events_are_numbered_one_by_one_and_read_after_a_number():
    p = started()
    p.run(JOB)
    events = p.world.jobs.events(JOB)
    assert [e.number for e in events] == list(range(1, len(events) + 1)) and len(events) > 6
    assert events[0].type == "job.queued" and events[-1].type == "job.completed"
    assert p.world.jobs.last_event(JOB) == events[-1]
    # a reader that stopped after event 3 gets exactly the rest, in order, in pages
    rest, after = [], 3
    while page := lifecycle.read_events(p.world.deps, JOB, after=after, limit=2):
        rest += page
        after = page[-1].number
    assert [e.seq for e in rest] == [e.seq for e in events[3:]]


def test_a_reader_passes_a_gap_left_by_an_older_version_at_once():
    # GIVEN a job whose event n+1 was lost by an older version (a number taken on the job item, its writer dead)
    world = small_chunk_world()
    started(world)
    n = len(world.jobs.events(JOB))
    world.jobs.counters[JOB] = n + 1  # number n+1 taken, never written ...
    world.jobs.record_event(JOB, "later")  # ... and n+2 written
    # THEN a reader gets every written event at once: numbers are now written with their events (no gap can be
    # a write still under way), so no grace period is waited out
    assert [e.number for e in lifecycle.read_events(world.deps, JOB)] == [*range(1, n + 1), n + 2]


# --- cancellation ------------------------------------------------------------------------------------

def test_cancel_before_start_ends_the_job_without_any_model_call():
    # GIVEN a submitted document; the cancel lands while intake stores it (the job is `queued`)
    p = InProcess(small_chunk_world())
    p.send({"text": TEXT}, key=KEY)
    real_put = p.world.artifacts.put_text

    def put_then_cancel(key: str, body: str, content_type: str = "application/json") -> None:
        if key.startswith("documents/") and job(p).state is S.QUEUED:
            assert lifecycle.request_cancel(p.world.deps, JOB, by="alice").changed
        real_put(key, body, content_type)

    p.world.artifacts.put_text = put_then_cancel  # type: ignore[method-assign]  # the fake's method, wrapped
    ended = p.run(JOB)
    # THEN it is cancelled: nothing was fanned out or analysed, no chunk record exists
    assert ended.state is S.CANCELLED and ended.error_code == "job.cancelled"
    assert p.model.calls == 0 and p.world.claims.for_job(JOB) == []
    assert [e.type for e in p.world.jobs.events(JOB)] == ["job.queued", "job.cancelling", "job.cancelled"]


def test_the_cancellation_check_reads_the_job_at_most_once_a_second_for_all_of_a_chunks_analysts():
    # GIVEN a running job, and a chunk's watch asked before every model call (as its analysts' threads do)
    p = started()
    reads: list[str] = []
    real_get = p.world.jobs.get

    def counted_get(job_id: str):  # type: ignore[no-untyped-def]
        reads.append(job_id)
        return real_get(job_id)

    p.world.jobs.get = counted_get  # type: ignore[method-assign]  # the fake's method, wrapped
    watch = lifecycle.CancelWatch(p.world.deps, JOB)
    # WHEN it is asked 50 times within a second: one strongly consistent read answers them all
    for _ in range(50):
        watch.check()
        p.world.clock.advance(0.01)
    assert len(reads) == 1
    # a cancel within that second is not seen yet (the price of the cache: at most a second's more calls) ...
    assert lifecycle.request_cancel(p.world.deps, JOB, by="alice").changed
    reads.clear()
    watch.check()
    assert reads == []
    # ... and is seen by the first check once the read is a second old
    p.world.clock.advance(lifecycle.CANCEL_CHECK_MAX_AGE_S)
    with pytest.raises(lifecycle.JobCancelled):
        watch.check()
    assert len(reads) == 1
    with pytest.raises(lifecycle.JobCancelled):  # cancelled stays cancelled: no more reads
        watch.check()
    assert len(reads) == 1


def test_cancel_while_running_starts_no_model_call_after_the_cancel_is_seen():
    # GIVEN a running job; during its 5th model call a user cancels it
    p = started()
    calls_at_cancel: list[int] = []

    def cancel_during_call(request: ModelRequest) -> ModelResponse:
        calls_at_cancel.append(p.model.calls)
        assert lifecycle.request_cancel(p.world.deps, JOB, by="alice").changed
        p.world.clock.advance(lifecycle.CANCEL_CHECK_MAX_AGE_S)  # the call lasts as long as a read is kept
        return p.model.inner.invoke(request)

    p.model.faults.append(Fault(lambda r: p.model.calls == 5, cancel_during_call, 1))
    ended = p.run(JOB)
    # THEN the call under way finished, and not one model call started after it (measured)
    assert calls_at_cancel == [5] and p.model.calls == 5
    assert ended.state is S.CANCELLED and ended.report_json_key is None
    records = p.world.claims.for_job(JOB)
    assert all(r.settled for r in records) and {r.status for r in records} == {ChunkStatus.CANCELLED}
    (stopped,) = [r for r in records if r.cancelled_at_stage not in ("claim", "not started")]
    assert stopped.chunk_index == 0 and stopped.cancelled_at_stage  # the analyst it was on
    assert stopped.checkpoints  # the analysts it finished stay checkpointed
    events = p.world.jobs.events(JOB)
    assert [e.type for e in events].count("job.cancelling") == 1 and events[-1].type == "job.cancelled"
    assert events[-1].detail["chunks_cancelled"] == 4 and events[-1].detail["chunks_done"] == 0
    # each chunk settled once: by its worker (one event each) or, not started, by the cancel itself
    by_worker = [e.detail["chunk_id"] for e in events if e.type == "chunk.cancelled"]
    assert len(by_worker) == len(set(by_worker)) and stopped.chunk_id in by_worker


def test_cancelling_twice_is_cancelling_once():
    p = started()
    first = lifecycle.request_cancel(p.world.deps, JOB, by="alice")
    second = lifecycle.request_cancel(p.world.deps, JOB, by="bob")
    assert (first.changed, first.state) == (True, S.CANCELLING)
    assert (second.changed, second.state) == (False, S.CANCELLING) and "already cancelling" in second.message
    p.run(JOB)
    third = lifecycle.request_cancel(p.world.deps, JOB, by="bob")
    assert (third.changed, third.state) == (False, S.CANCELLED)
    assert job(p).cancelled_by == "alice" and p.model.calls == 0
    assert [e.type for e in p.world.jobs.events(JOB)].count("job.cancelling") == 1
    assert len(p.world.queues.sent[Queue.RESULTS]) == 0


@pytest.mark.parametrize("ended", [S.COMPLETED, S.FAILED, S.DEAD_LETTERED])
def test_cancelling_an_ended_job_changes_nothing(ended: JobState):
    p = started()
    p.world.jobs.items[JOB] = job(p).model_copy(update={"state": ended})
    before = job(p)
    out = lifecycle.request_cancel(p.world.deps, JOB)
    assert (out.changed, out.state) == (False, ended) and "already ended" in out.message
    assert job(p) == before


def test_cancel_landing_inside_finalize_wins_and_the_job_never_completes():
    # GIVEN a job whose last result is being finalized; the cancel lands between finalize's read of
    # the job and its transition to completed (forced by wrapping the repository call)
    p = started()
    real = p.world.jobs.transition

    def cancel_first(job_id, from_states, to, **kw):
        if to is S.COMPLETED:
            assert lifecycle.request_cancel(p.world.deps, job_id, by="alice").changed
        return real(job_id, from_states, to, **kw)

    p.world.jobs.transition = cancel_first  # type: ignore[method-assign]  # the fake's method, wrapped
    ended = p.run(JOB)
    # THEN the completion lost (version moved) and the job is cancelled, its chunks all done
    assert ended.state is S.CANCELLED
    assert {r.status for r in p.world.claims.for_job(JOB)} == {ChunkStatus.DONE}
    assert "job.completed" not in [e.type for e in p.world.jobs.events(JOB)]


def test_cancel_after_completion_is_too_late_and_says_so():
    p = started()
    assert p.run(JOB).state is S.COMPLETED
    out = lifecycle.request_cancel(p.world.deps, JOB)
    assert (out.changed, out.state) == (False, S.COMPLETED)


def test_the_sweeper_finishes_a_cancel_whose_control_message_was_lost():
    # GIVEN a cancelling job whose control message never reached the aggregator
    p = started()
    assert lifecycle.request_cancel(p.world.deps, JOB).changed
    p.world.queues.drain(Queue.RESULTS)  # lost
    p.world.queues.drain(Queue.ANALYSIS)  # and its chunk messages too
    # WHEN sweeps run past the lease
    for _ in range(3):
        p.round()
    # THEN the job is cancelled, every chunk settled cancelled, nothing analysed
    assert job(p).state is S.CANCELLED and p.model.calls == 0
    assert {r.status for r in p.world.claims.for_job(JOB)} == {ChunkStatus.CANCELLED}


def test_a_job_submitted_again_after_a_cancel_stays_cancelled():
    p = started()
    lifecycle.request_cancel(p.world.deps, JOB)
    p.run(JOB)
    p.send({"text": TEXT}, key=KEY)
    p.intake()
    assert job(p).state is S.CANCELLED and p.world.queues.sent[Queue.ANALYSIS] == [] and p.model.calls == 0


