"""Fan-out in pages under a per-job window (`contract_review.pipeline.fanout`), against the in-memory fakes:
the aggregator refills the window as chunks settle, every chunk goes out exactly once, a failed or
repeated refill loses nothing, and a small document behind a large one waits for at most a window of
the large one's chunks instead of all of them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.sweeper import sweep
from contract_review.review.chunking import chunk_document
from tests.oracle import counted

from ...texts import LONG_TEXT, TEXT
from ..fakes import SETTINGS, FakeWorld
from ..scenarios import worker_finishes

P = SETTINGS.profile
# The local profile's fanout_window and fanout_page (test_the_local_profile_... checks). Literals, and
# `fanout` imported inside the tests that call it, so the behavioural tests also run (and fail) on code
# from before fan-out in pages.
WINDOW, PAGE = 8, 2
BIG = "\n\n".join([LONG_TEXT] * 16)  # 55 chunks with the local profile


def ids_of(text: str) -> list[str]:
    return [c.chunk_id for c in chunk_document(text, P.review)]


def intake(world: FakeWorld, text: str, document_id: str = "doc") -> tuple[str, list[ChunkRecord]]:
    """The document uploaded under uploads/ and taken in by intake: the job id and its chunk records."""
    world.artifacts.objects[(world.artifacts.bucket, f"uploads/{document_id}.txt")] = text
    body = {"schema_version": 1, "document": {"s3_uri": f"s3://{world.artifacts.bucket}/uploads/{document_id}.txt"},
            "document_id": document_id}
    result = handle_intake(world.deps, json.dumps(body), f"m-{document_id}")
    assert result.job_id is not None and result.state == "running", result
    return result.job_id, world.claims.for_job(result.job_id)


def deliver_results(world: FakeWorld) -> None:
    """The aggregator handles every results message sent so far, in order (one FIFO group per job)."""
    for sent in world.queues.drain(Queue.RESULTS):
        handle_result(world.deps, ResultMessage.model_validate_json(sent.body))


def pump(world: FakeWorld, after_each: Callable[[], None] | None = None) -> list[tuple[str, str]]:
    """One worker takes analysis messages in the order they were sent (moto's standard queue does; SQS
    roughly) and finishes each chunk; the aggregator handles each result as it comes. A second copy
    of a chunk's message is dropped (its claim would say so). Returns (job id, chunk id) as analysed."""
    order: list[tuple[str, str]] = []
    while world.queues.sent[Queue.ANALYSIS]:
        msg = AnalysisMessage.model_validate_json(world.queues.sent[Queue.ANALYSIS].pop(0).body)
        record = world.claims.get(msg.job_id, msg.chunk_id)
        assert record is not None, "a chunk message is never sent before its record exists"
        if record.settled:
            continue
        worker_finishes(world, msg.job_id, msg.chunk_id)
        order.append((msg.job_id, msg.chunk_id))
        deliver_results(world)
        if after_each:
            after_each()
    return order


def fanned_out_events(world: FakeWorld, job_id: str) -> list[dict]:
    return [e.detail for e in world.jobs.events(job_id) if e.type == "job.fanned_out"]


# --- pages and the window ------------------------------------------------------------------------------

def test_the_local_profile_window_is_two_pages_of_workers():
    assert (P.fanout.fanout_window, P.fanout.fanout_page) == (WINDOW, PAGE)
    assert P.fanout.fanout_window == 2 * P.functions.worker_max_concurrency



def test_a_large_document_goes_out_a_page_at_a_time_within_its_window_and_completes_with_every_chunk_once():
    # GIVEN a document of 55 chunks taken in by intake: the first page (the window) is out
    world = FakeWorld()
    ids = ids_of(BIG)
    assert len(ids) == 55 and WINDOW < 55
    job_id, records = intake(world, BIG)
    assert [r.chunk_id for r in records] == ids[:WINDOW]
    in_flight: list[int] = []
    states: list[JobState] = []

    def observe() -> None:
        job = world.jobs.get(job_id)
        assert job is not None and job.fanned_out is not None
        in_flight.append(job.fanned_out - len(counted(world.claims, job)))
        states.append(job.state)

    # WHEN workers analyse chunks as they come and the aggregator counts each result
    order = pump(world, observe)
    # THEN every chunk was analysed exactly once, in chunk order, and has one record
    assert [c for _, c in order] == ids
    assert [r.chunk_id for r in world.claims.for_job(job_id)] == ids
    # AND no more than a window of the job's chunks was ever in flight, and the job ran until the last
    # chunk settled (chunk_count was known from the start: no early finalize)
    assert max(in_flight) <= WINDOW
    assert states[:-1] == [JobState.RUNNING] * (len(ids) - 1) and states[-1] is JobState.COMPLETED
    job = world.jobs.get(job_id)
    assert job is not None and job.fanned_out == job.chunk_count == 55 and len(counted(world.claims, job)) == 55
    # AND the rest went out in refills of at least a page each (the last may be shorter), in order
    pages = fanned_out_events(world, job_id)
    assert sum(p["sent"] for p in pages) == 55 - WINDOW
    assert all(p["sent"] >= PAGE for p in pages[:-1])
    assert [p["first"] for p in pages] == [WINDOW + sum(q["sent"] for q in pages[:i]) for i in range(len(pages))]
    report = json.loads(world.artifacts.get_text(job.report_json_key or ""))
    assert report["chunk_count"] == 55 and len(report["coverage"]["matrix"]) == 55


def test_a_small_document_behind_a_large_one_waits_for_at_most_a_window_of_its_chunks():
    # GIVEN a 55-chunk document taken in, and then a one-chunk document
    world = FakeWorld()
    big_job, _ = intake(world, BIG, document_id="big")
    small_job, _ = intake(world, TEXT, document_id="small")
    # WHEN one worker analyses the queue in order
    order = pump(world)
    # THEN the small document's chunk came after at most a window of the large one's chunks, not all 55
    position = order.index((small_job, ids_of(TEXT)[0]))
    assert position <= WINDOW
    # AND both completed, the large one with every chunk
    for job_id in (big_job, small_job):
        job = world.jobs.get(job_id)
        assert job is not None and job.state is JobState.COMPLETED
    assert sum(1 for j, _ in order if j == big_job) == 55


# --- crashes and races ------------------------------------------------------------------------------------

def _settle_until_a_refill_is_due(world: FakeWorld, job_id: str) -> ResultMessage:
    """Workers finish the window's chunks; the aggregator counts results until the next one would refill.
    Returns that result, not yet delivered."""
    from contract_review.pipeline import fanout

    for sent in world.queues.drain(Queue.ANALYSIS):
        msg = AnalysisMessage.model_validate_json(sent.body)
        worker_finishes(world, job_id, msg.chunk_id)
    results = [ResultMessage.model_validate_json(s.body) for s in world.queues.drain(Queue.RESULTS)]
    for n, result in enumerate(results):
        job = world.jobs.get(job_id)
        assert job is not None
        if fanout.page_size(world.deps, job, settling=result.chunk_id):
            for later in results[n + 1:]:  # still on their way
                world.queues.send_result(later, later.dedup_id())
            return result
        handle_result(world.deps, result)
    raise AssertionError("no refill came due")


def test_a_refill_that_fails_leaves_its_chunk_uncounted_and_the_reconciler_brings_it_back(monkeypatch):
    # GIVEN a 55-chunk job whose next settle is due to refill the window, and S3 failing that refill's read
    world = FakeWorld()
    job_id, _ = intake(world, BIG)
    due = _settle_until_a_refill_is_due(world, job_id)
    before = world.jobs.get(job_id)
    assert before is not None
    read = world.artifacts.get_text_range

    def s3_down(key: str, byte_start: int, byte_end: int) -> str:
        raise ConnectionError("S3 unavailable")

    monkeypatch.setattr(world.artifacts, "get_text_range", s3_down)
    # WHEN the aggregator handles the result (and keeps failing until its message is dead-lettered)
    with pytest.raises(ConnectionError):
        handle_result(world.deps, due)
    # THEN the chunk is not counted, the cursor did not move and nothing was sent
    job = world.jobs.get(job_id)
    assert job is not None and due.chunk_id not in counted(world.claims, job) and job.fanned_out == before.fanned_out == WINDOW
    assert world.queues.sent[Queue.ANALYSIS] == []
    # WHEN S3 is back and the job has made no progress for the stall period: the sweeper reconciles it
    monkeypatch.setattr(world.artifacts, "get_text_range", read)
    world.queues.drain(Queue.RESULTS)  # the result (and the ones after it) are gone: lost to the DLQ
    world.clock.advance(P.recovery.stall_after_s + 1)
    sweep(world.deps)
    # THEN the uncounted chunks are announced again, and handling them refills the window
    deliver_results(world)
    job = world.jobs.get(job_id)
    assert job is not None and due.chunk_id in counted(world.claims, job) and job.fanned_out is not None
    assert job.fanned_out > WINDOW
    # AND the job completes with every chunk
    pump(world)
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED and len(world.claims.for_job(job_id)) == 55


def test_a_crash_after_sending_a_page_before_the_cursor_moved_sends_the_same_page_again(monkeypatch):
    # GIVEN a 55-chunk job whose next settle refills, and the aggregator dying after sending that page
    world = FakeWorld()
    job_id, _ = intake(world, BIG)
    due = _settle_until_a_refill_is_due(world, job_id)
    move = world.jobs.advance_fanout

    def crash(job_id: str, from_count: int, to_count: int) -> bool:
        raise ConnectionError("the function died")

    monkeypatch.setattr(world.jobs, "advance_fanout", crash)
    with pytest.raises(ConnectionError):
        handle_result(world.deps, due)
    page = [AnalysisMessage.model_validate_json(s.body).chunk_id for s in world.queues.sent[Queue.ANALYSIS]]
    assert page and len(page) >= PAGE
    # WHEN its results message is delivered again
    monkeypatch.setattr(world.jobs, "advance_fanout", move)
    handle_result(world.deps, due)
    # THEN the same page is sent again (a second copy of each: the claim makes it harmless), the cursor moves
    again = [AnalysisMessage.model_validate_json(s.body).chunk_id for s in world.queues.sent[Queue.ANALYSIS]]
    assert again == page + page
    job = world.jobs.get(job_id)
    assert job is not None and job.fanned_out == WINDOW + len(page)
    # AND the job completes, every chunk analysed once, one record each
    deliver_results(world)
    order = pump(world)
    assert len(order) == len(set(order))
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED
    assert [r.chunk_id for r in world.claims.for_job(job_id)] == ids_of(BIG)


def test_two_refills_racing_move_the_cursor_once_and_create_each_record_once():
    # GIVEN a job whose window has room, read by two refills at once (intake and the aggregator)
    world = FakeWorld()
    job_id, _ = intake(world, BIG)
    world.queues.drain(Queue.ANALYSIS)
    for record in world.claims.for_job(job_id)[:PAGE]:
        worker_finishes(world, job_id, record.chunk_id)
        world.jobs.settle_chunk(job_id, record.chunk_id)
    snapshot = world.jobs.get(job_id)
    assert snapshot is not None
    # WHEN both refill from the same snapshot
    from contract_review.pipeline import fanout

    sent = [fanout.refill(world.deps, snapshot), fanout.refill(world.deps, snapshot)]
    # THEN both sent the same page (a harmless second copy), but the cursor moved once, with one event
    assert sent == [PAGE, PAGE]
    job = world.jobs.get(job_id)
    assert job is not None and job.fanned_out == WINDOW + PAGE
    assert fanned_out_events(world, job_id) == [{"first": WINDOW, "sent": PAGE, "fanned_out": WINDOW + PAGE,
                                                 "total": 55}]
    assert [r.chunk_id for r in world.claims.for_job(job_id)] == ids_of(BIG)[:WINDOW + PAGE]


@pytest.mark.parametrize("case", ["ended", "no-cursor", "window-full", "less-than-a-page"])
def test_refill_sends_nothing_when_there_is_no_room_or_nothing_to_do(case):
    # GIVEN a 55-chunk job in one of the states where a refill must not send anything
    world = FakeWorld()
    job_id, records = intake(world, BIG)
    world.queues.drain(Queue.ANALYSIS)
    if case == "ended":
        assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED)
        world.jobs.settle_chunk(job_id, records[0].chunk_id)
    elif case == "no-cursor":  # taken in before fan-out in pages: everything was sent at once
        world.jobs.items[job_id] = world.jobs.items[job_id].model_copy(update={"fanned_out": None})
    elif case == "less-than-a-page":
        for r in records[:PAGE - 1]:
            world.jobs.settle_chunk(job_id, r.chunk_id)
    job = world.jobs.get(job_id)
    assert job is not None
    # WHEN a refill runs
    from contract_review.pipeline import fanout

    sent = fanout.refill(world.deps, job)
    # THEN nothing is read, created or sent
    assert sent == 0 and world.queues.sent[Queue.ANALYSIS] == []
    assert len(world.claims.for_job(job_id)) == WINDOW


# --- pages cut by bytes -------------------------------------------------------------------------------------

def test_pages_are_cut_from_the_stored_document_by_byte_range_whatever_its_characters():
    # GIVEN a document dense in 2- and 4-byte characters and control characters, many chunks long
    world = FakeWorld()
    paragraph = "Clause é 𝄞 \x01\x02 the Supplier shall deliver — “goods” \x7f. " * 20
    text = "\n\n".join(f"{i}. {paragraph}" for i in range(120))
    ids = ids_of(text)
    assert len(ids) > 3 * WINDOW
    job_id, _ = intake(world, text)
    from contract_review.pipeline.fanout import FanoutPlan, plan_key

    plan = FanoutPlan.model_validate_json(world.artifacts.get_text(plan_key(job_id)))
    encoded = text.encode("utf-8")
    assert all(encoded[bs:be].decode() == text[s:e] for s, e, bs, be in plan.bounds)
    texts: dict[str, str] = {}

    def collect() -> None:
        for s in world.queues.sent[Queue.ANALYSIS]:
            m = AnalysisMessage.model_validate_json(s.body)
            texts[m.chunk_id] = m.text
            assert m.text == text[m.start:m.end]

    collect()
    # WHEN the job is worked to the end
    pump(world, collect)
    # THEN every chunk's message carried exactly its slice of the document
    assert sorted(texts) == sorted(ids)
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED


def test_the_same_document_sent_again_moves_a_stalled_fan_out_on():
    # GIVEN a 55-chunk job whose first chunks were counted settled without the refill they were due
    # (its trigger lost: e.g. an intake that died between `running` and its first page, redriven)
    world = FakeWorld()
    job_id, records = intake(world, BIG, document_id="big")
    world.queues.drain(Queue.ANALYSIS)
    for r in records[:PAGE]:
        worker_finishes(world, job_id, r.chunk_id)
        world.jobs.settle_chunk(job_id, r.chunk_id)
    world.queues.drain(Queue.RESULTS)
    # WHEN the same document is submitted again (a new message)
    body = json.dumps({"schema_version": 1, "document_id": "big",
                       "document": {"s3_uri": f"s3://{world.artifacts.bucket}/uploads/big.txt"}})
    again = handle_intake(world.deps, body, "m-again")
    # THEN it is the same running job, and the page that was due goes out (cut from the text at hand)
    assert (again.job_id, again.created, again.state) == (job_id, False, "running")
    sent = [AnalysisMessage.model_validate_json(s.body) for s in world.queues.sent[Queue.ANALYSIS]]
    assert [m.chunk_id for m in sent] == ids_of(BIG)[WINDOW:WINDOW + PAGE]
    assert all(m.text == BIG[m.start:m.end] for m in sent)
    job = world.jobs.get(job_id)
    assert job is not None and job.fanned_out == WINDOW + PAGE
    # AND sent once more, it sends nothing (the window is full again)
    world.queues.drain(Queue.ANALYSIS)
    handle_intake(world.deps, body, "m-again-2")
    assert world.queues.sent[Queue.ANALYSIS] == []
