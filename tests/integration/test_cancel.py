"""Cancellation on embedded AWS with real worker processes: a job cancelled while its chunks are being
analysed stops within one model call, and one cancelled before it starts does no work at all."""

from __future__ import annotations

import time

from contract_review.domain import lifecycle
from contract_review.domain.lifecycle import CANCEL_CHECK_MAX_AGE_S
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest

from ..large_docs import large_contract
from ..texts import LONG_TEXT
from .conftest import ledger, wait_for, wait_jobs

CALL_S = 0.25  # each model call takes this long, so calls are in flight when the cancel lands
# A worker reads the job's state right before each call; a cancel written in the few milliseconds
# between that read and the call's start is seen before the next call. Allowed, and nothing more:
CHECK_TO_CALL_S = 0.1


def test_a_running_job_cancelled_stops_within_one_model_call_and_ends_cancelled(make_stack, tmp_path):
    # GIVEN 4 workers analysing a contract of ~25 chunks (3 windows), each model call taking 0.25 s
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_ms=int(CALL_S * 1000), call_log=str(log)))
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(large_contract(100_000, variant=3), document_id="to-cancel")).job_id
    wait_for(lambda: sum(1 for e in ledger(log)) >= 12, 60, 0.05, "model calls under way")
    # WHEN it is cancelled
    out = lifecycle.request_cancel(deps, job_id, by="test")
    cancelled_at = time.time()
    assert out.changed and out.state is JobState.CANCELLING
    ended = wait_jobs(deps, [job_id], timeout=60)[job_id]
    # THEN no model call started later than the cancellation check's cache age after the cancel (one read of the
    # job answers a chunk's analysts for CANCEL_CHECK_MAX_AGE_S; beyond a read-to-call moment), the job is cancelled
    calls = ledger(log)
    late = [c for c in calls if c["started_at"] > cancelled_at + CANCEL_CHECK_MAX_AGE_S + CHECK_TO_CALL_S]
    assert late == [], late
    assert ended.state is JobState.CANCELLED and ended.error_code == "job.cancelled"
    assert ended.report_json_key is None  # no report, no side effect
    records = deps.claims.for_job(job_id)
    assert records and all(r.settled for r in records)
    stopped = [r for r in records if r.status is ChunkStatus.CANCELLED]
    assert stopped and all(r.cancelled_at_stage for r in stopped)
    # AND nothing is left to do: no DLQ message, the queues drain
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == 0, 30, what="the analysis queue drained")
    for q in (Queue.ANALYSIS_DLQ, Queue.RESULTS_DLQ):
        assert deps.queues.depth(q) == 0
    types = [e.type for e in deps.jobs.events(job_id)]
    assert types.count("job.cancelling") == 1 and types[-1] == "job.cancelled"


def test_a_job_cancelled_before_its_workers_start_makes_no_model_call(make_stack, tmp_path):
    # GIVEN the stack with its workers stopped (nothing drains the analysis queue)
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(call_log=str(log)), {"worker": 0})
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(LONG_TEXT, document_id="cancel-early")).job_id
    wait_for(lambda: (j := deps.jobs.get(job_id)) is not None and j.state is JobState.RUNNING, 30, what="running")
    # WHEN it is cancelled, twice
    assert lifecycle.request_cancel(deps, job_id, by="a").changed
    assert not lifecycle.request_cancel(deps, job_id, by="b").changed
    # THEN the aggregator settles its unstarted chunks and ends it cancelled, without a model call
    ended = wait_jobs(deps, [job_id], timeout=30)[job_id]
    assert ended.state is JobState.CANCELLED and ended.cancelled_by == "a"
    assert ledger(log) == []
    assert {r.cancelled_at_stage for r in deps.claims.for_job(job_id)} == {"not started"}
