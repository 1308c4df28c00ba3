"""Interactive before bulk (pipeline/priority.py): one worker serving the analysis queue in order, with delays, as
SQS does; a bulk job's chunks are already queued when an interactive job arrives behind them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from contract_review.domain.messages import AnalysisMessage, parse_results_body
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, Inference, Job, JobState, Priority
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline import batch_inference_collect
from contract_review.pipeline.aggregator import handle_message
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.priority import PriorityGate, starvation_bound_s
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker

from ...texts import LONG_TEXT
from ..fakes import FakeWorld
from ..scenarios import small_chunk_world

CHUNK_S = 1.0  # what one analysed chunk takes on the fake clock


class SerialQueue:
    """One worker taking the first visible message of the analysis queue (FIFO, `DelaySeconds` honoured), then the
    results; the job ids of the chunks it analysed, in order, and every deferral it made."""

    def __init__(self, world: FakeWorld):
        self.world = world
        self.worker = chunk_worker(world.deps, OfflineRuleModel(), rng=random.Random(1), sleep=lambda _s: None)
        self.done: list[str] = []
        self.deferred: list[AnalysisMessage] = []

    def intake(self, key: str, priority: Priority) -> str:
        body = json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}, "idempotency_key": key,
                           "priority": priority.value})
        result = handle_intake(self.world.deps, body, f"m-{key}")
        assert result.job_id is not None
        return result.job_id

    def step(self) -> None:
        w = self.world
        queue = w.queues.sent[Queue.ANALYSIS]
        now = w.clock()
        visible = next((s for s in queue if s.sent_at + s.delay_s <= now), None)
        if visible is None:
            w.clock.advance(CHUNK_S)
            return
        queue.remove(visible)
        msg = AnalysisMessage.model_validate_json(visible.body)
        outcome = self.worker.handle(msg, Delivery(visible.message_id, "", 1, 120))
        if outcome.action == "done":
            self.done.append(msg.job_id)
            w.clock.advance(CHUNK_S)
        elif outcome.action == "deferred":
            self.deferred.append(msg)
        for s in w.queues.drain(Queue.RESULTS):
            handle_message(w.deps, parse_results_body(s.body))

    def until_ended(self, *job_ids: str, steps: int = 2000) -> None:
        for _ in range(steps):
            if all(self.world.jobs.get(j).terminal for j in job_ids):  # type: ignore[union-attr]
                return
            self.step()
        raise AssertionError("jobs did not end")


def _bulk_then_interactive(world: FakeWorld) -> tuple[SerialQueue, list[str], str, int]:
    q = SerialQueue(world)
    bulk = [q.intake(f"bulk-{n}", Priority.BULK) for n in range(3)]
    for _ in range(3):  # bulk work under way: each bulk job's window is queued
        q.step()
    urgent = q.intake("urgent", Priority.INTERACTIVE)
    arrived = len(q.done)
    q.until_ended(urgent, *bulk)
    return q, bulk, urgent, arrived


def test_an_interactive_job_behind_queued_bulk_work_is_served_first():
    # GIVEN three bulk jobs whose windows fill the queue, and an interactive job taken in behind them
    world = small_chunk_world()
    q, bulk, urgent, arrived = _bulk_then_interactive(world)
    job = world.jobs.get(urgent)
    assert job is not None and job.priority is Priority.INTERACTIVE and job.state is JobState.COMPLETED
    assert world.jobs.get(bulk[0]).priority is Priority.BULK  # type: ignore[union-attr]
    # THEN from its arrival the worker analyses the interactive job's chunks and nothing else until it has ended
    chunks = job.chunk_count
    assert chunks >= 4
    assert q.done[arrived:arrived + chunks] == [urgent] * chunks
    # AND the bulk work gave way by deferrals, then ended too
    assert q.deferred and all(world.jobs.get(b).state is JobState.COMPLETED for b in bulk)  # type: ignore[union-attr]


def test_without_deferrals_the_interactive_job_waits_behind_the_bulk_chunks():
    # GIVEN the same arrival with deferrals switched off (what the pipeline did before priorities)
    world = small_chunk_world(bulk_max_deferrals=0)
    q, _bulk, urgent, arrived = _bulk_then_interactive(world)
    chunks = world.jobs.get(urgent).chunk_count  # type: ignore[union-attr]
    # THEN bulk chunks already queued are analysed before it: the first test's assertion would fail
    assert q.done[arrived:arrived + chunks] != [urgent] * chunks
    assert not q.deferred


def test_bulk_work_is_not_starved_a_chunk_gives_way_at_most_bulk_max_deferrals_times():
    # GIVEN interactive work that never ends while a bulk job waits (an interactive job whose chunks stay open)
    world = small_chunk_world(bulk_max_deferrals=3, bulk_defer_s=2)
    q = SerialQueue(world)
    q.intake("urgent", Priority.INTERACTIVE)
    world.queues.sent[Queue.ANALYSIS].clear()  # its chunks are held elsewhere: it stays open
    bulk = q.intake("bulk", Priority.BULK)
    # WHEN the worker serves the queue
    q.until_ended(bulk)
    # THEN the bulk job ends all the same, each chunk deferred at most 3 times (at most 2 + 4 + 8 s late)
    assert world.jobs.get(bulk).state is JobState.COMPLETED  # type: ignore[union-attr]
    assert starvation_bound_s(2, 3) == 14
    assert q.deferred and max(m.deferrals for m in q.deferred) == 2  # the copies sent back carry 1..3
    assert all(m.job_id == bulk and m.deferrals < 3 for m in q.deferred)
    # AND only a chunk's last deferral is a job event (`spent`): one per chunk that used all three, none before
    events = [e.detail for e in world.jobs.events(bulk) if e.type == "chunk.deferred"]
    assert events and all(d["spent"] and d["deferrals"] == 3 and d["delay_s"] == 8 for d in events)
    assert len(events) == sum(1 for m in q.deferred if m.deferrals == 2)


def test_while_an_interactive_job_stays_open_the_check_reads_that_job_again_not_the_index():
    # GIVEN an interactive job whose chunks stay open, and a worker's gate that found it through the index
    world = small_chunk_world()
    q = SerialQueue(world)
    urgent = q.intake("urgent", Priority.INTERACTIVE)
    world.queues.sent[Queue.ANALYSIS].clear()
    queries: list[int] = []
    index = world.jobs.running_brief

    def counted() -> Iterator[Job]:
        queries.append(1)
        return index()

    world.jobs.running_brief = counted  # type: ignore[method-assign]
    gate = PriorityGate(world.deps)
    every = world.settings.profile.fanout.interactive_check_s
    assert gate.interactive_waiting() and len(queries) == 1
    # WHEN the workers check again and again while it stays open
    for _ in range(5):
        world.clock.advance(every)
        assert gate.interactive_waiting()
    # THEN each check read that one job again: no further query of the open-jobs index
    assert len(queries) == 1
    # AND once it has ended, the next check queries the index again and finds no interactive work
    world.jobs.transition(urgent, (JobState.RUNNING,), JobState.COMPLETED)
    world.clock.advance(every)
    assert not gate.interactive_waiting() and len(queries) == 2
    # AND "not open" is not kept: the very next bulk chunk asks the index again, and finds a job taken in since
    assert not gate.interactive_waiting() and len(queries) == 3
    q.intake("urgent-2", Priority.INTERACTIVE)
    assert gate.interactive_waiting() and len(queries) == 4


def test_an_interactive_batch_mode_job_counts_only_once_one_of_its_chunks_went_on_demand():
    """An interactive job sent with `inference: batch`, every chunk parked in a batch job (waiting
    for hours, not on the workers), made every bulk chunk give way (a bulk job took 234 s instead of 24 s, with 72
    deferrals). It is interactive work waiting on the workers only once one of its chunks went on demand."""
    # GIVEN an interactive batch-mode job whose chunks the workers have parked, all of them, awaiting a batch job
    world = small_chunk_world()
    q = SerialQueue(world)
    body = json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}, "idempotency_key": "urgent-batch",
                       "priority": "interactive", "inference": "batch", "deadline_hours": 72})
    urgent = handle_intake(world.deps, body, "m-urgent").job_id
    assert urgent is not None and world.jobs.get(urgent).inference is Inference.BATCH  # type: ignore[union-attr]
    while world.queues.sent[Queue.ANALYSIS]:
        q.step()
    assert {c.status for c in world.claims.for_job(urgent)} == {ChunkStatus.AWAITING_BATCH}
    # WHEN a bulk job arrives  THEN its chunks are analysed at once: none gives way to the parked job
    bulk = q.intake("bulk", Priority.BULK)
    q.until_ended(bulk)
    assert world.jobs.get(bulk).state is JobState.COMPLETED and q.deferred == []  # type: ignore[union-attr]
    # WHEN the parked chunks go on demand (no batch service: the collector sends them) and a worker takes the first
    batch_inference_collect.collect(world.deps, world.clock())
    q.step()
    assert sum(c.status is ChunkStatus.DONE for c in world.claims.for_job(urgent)) == 1
    # THEN the job waits on the workers: a bulk chunk received now gives way to it
    later = q.intake("bulk-2", Priority.BULK)
    first = next(s for s in world.queues.sent[Queue.ANALYSIS] if later in s.body)
    world.queues.sent[Queue.ANALYSIS].remove(first)
    outcome = q.worker.handle(AnalysisMessage.model_validate_json(first.body), Delivery(first.message_id, "", 1, 120))
    assert outcome.action == "deferred"
