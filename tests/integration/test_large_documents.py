"""Large documents on embedded AWS with real worker processes: fan-out in pages under a per-job window,
and fairness between jobs (scaled down: the local window is 8 chunks, 2 x the 4 workers).

The full-size runs (a 5 MB contract leaving `queued` within 30 s and completing, a 1.2 MB one, a
small contract behind a 2 MB one) are in `bench/large.py`; results in bench/results/large.json."""

from __future__ import annotations

from contract_review.config.profile import get_profile
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.review.chunking import chunk_document

from ..conftest import SAMPLES_DIR
from ..large_docs import large_contract
from ..oracle import assert_matches_fault_free, counted
from .conftest import get_job, report_json, wait_for, wait_jobs

LOCAL = get_profile("local")
# The local profile's fanout_window (each test checks it at the end): a literal, so that these tests run,
# and fail on their behaviour, against the code from before fan-out in pages too.
WINDOW = 8


def test_a_small_document_behind_a_large_one_completes_before_the_large_one_is_half_done(make_stack):
    # GIVEN the stack with its 4 workers, and a contract of ~40 chunks (5 windows) submitted first
    stack = make_stack()
    deps = stack.deps()
    big = large_contract(160_000, variant=8)
    n_big = len(chunk_document(big, LOCAL.review))
    assert n_big >= 4 * WINDOW
    big_job = submission.submit(deps, None, SubmitRequest.inline(big, document_id="big")).job_id
    # ... which leaves `queued` at once, with all its chunks counted and one window of them sent
    running = wait_for(lambda: (j := deps.jobs.get(big_job)) is not None and j.state is JobState.RUNNING and j,
                       20, what="the large job running")
    assert running.chunk_count == n_big
    # WHEN a 3-chunk contract is submitted behind it
    small = (SAMPLES_DIR / "mutual-nda.txt").read_text()
    small_job = submission.submit(deps, None, SubmitRequest.inline(small, document_id="small")).job_id
    small_ended = wait_jobs(deps, [small_job], timeout=120)[small_job]  # a bound for a busy machine; the check is below
    big_then = get_job(deps, big_job)
    # THEN the small one completed while the large one was not half done (it waited for a window, not
    # for the whole document)
    assert small_ended.state is JobState.COMPLETED, small_ended.error
    assert big_then.n_settled < n_big / 2, (big_then.n_settled, n_big)
    # AND the large one completes with every chunk settled once, its chunks never more than a window
    # ahead of the aggregator
    ended = wait_jobs(deps, [big_job], timeout=120)[big_job]
    assert ended.state is JobState.COMPLETED, ended.error
    assert ended.fanned_out == n_big == len(counted(deps.claims, ended))
    records = deps.claims.for_job(big_job)
    assert [r.chunk_index for r in records] == list(range(n_big))
    settled_events = [e.detail["chunk_id"] for e in deps.jobs.events(big_job) if e.type == "chunk.settled"]
    assert sorted(settled_events) == sorted(r.chunk_id for r in records)
    report = report_json(deps, ended)
    assert report["chunk_count"] == n_big and len(report["coverage"]["matrix"]) == n_big
    # AND both reports are exactly those of a fault-free run (findings, each chunk settled once, counts)
    assert_matches_fault_free(deps, big_job, big)
    assert_matches_fault_free(deps, small_job, small)
    pages = [e.detail for e in deps.jobs.events(big_job) if e.type == "job.fanned_out"]
    assert pages and sum(p["sent"] for p in pages) == n_big - WINDOW == n_big - LOCAL.fanout.fanout_window
    for queue in (Queue.ANALYSIS, Queue.ANALYSIS_DLQ, Queue.INTAKE_DLQ, Queue.RESULTS_DLQ):
        assert deps.queues.depth(queue) == 0


def test_a_large_document_leaves_queued_within_seconds_of_its_first_page(make_stack):
    # GIVEN the stack, its workers not started (nothing drains the queue)
    stack = make_stack(concurrency={"worker": 0})
    deps = stack.deps()
    text = large_contract(1_300_000, variant=12)
    n = len(chunk_document(text, LOCAL.review))
    # WHEN a 1.3 MB contract (~310 chunks) is submitted by s3_uri
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="big-1.3mb")).job_id
    running = wait_for(lambda: (j := deps.jobs.get(job_id)) is not None and j.state is JobState.RUNNING and j,
                       30, what="the job running")
    # THEN it is running within seconds, knowing all its chunks, with one window of them sent and nothing more
    assert running.chunk_count == n > 300
    wait_for(lambda: deps.queues.depth(Queue.INTAKE) == 0, 10, what="intake acknowledged")
    running = get_job(deps, job_id)
    assert len(deps.claims.for_job(job_id)) == WINDOW
    assert deps.queues.depth(Queue.ANALYSIS) == WINDOW
    assert running.fanned_out == WINDOW == LOCAL.fanout.fanout_window
