"""Cost per job on embedded AWS with real worker processes: a job's cost is recorded (model tokens with the
prompt cache, counted AWS requests) on the job, in its report and in `review status`; a tiny budget stops a
job with job.budget_exceeded, and nothing happens after the stop."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from contract_review.domain import cost
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState, Usage
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import job_view, submission
from contract_review.operate.submission import SubmitRequest
from contract_review.pipeline import admission

from ..large_docs import large_contract
from .conftest import ledger, wait_for, wait_jobs

CALL_S = 0.1  # each model call takes this long, so a budget stop finds chunks in flight
CHECK_TO_CALL_S = 0.1  # a worker reads the job's state right before each call (as in test_cancel.py)


def test_a_jobs_cost_is_recorded_and_a_tiny_budget_stops_a_job_with_its_code(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    # the model's own cache minimum (the one the adapter and the warm-up gate decide by: some of this contract's
    # chunks reach it), the cache shared by the worker processes through the state directory, as Bedrock's is by
    # the account
    # answers of ~900 tokens: three times what the budget estimate assumes, so a budget at the estimate is passed
    # at the door and then spent during the run (the in-run stop below)
    stack = make_stack(FaultSpec(latency_ms=int(CALL_S * 1000), call_log=str(log), answer_tokens_median=900,
                                 answer_tokens_p99=1000, throttle_state_dir=str(tmp_path / "bedrock")))
    deps = stack.deps()
    # GIVEN a contract reviewed without a budget
    job_id = submission.submit(deps, None, SubmitRequest.inline(large_contract(24_000, variant=2), document_id="priced")).job_id  # more chunks than workers
    job = wait_jobs(deps, [job_id], timeout=90)[job_id]
    # THEN its cost is recorded: every chunk's tokens, cache writes then reads, and the AWS requests counted
    assert job.state is JobState.COMPLETED
    chunks = deps.claims.for_job(job_id)
    assert (job.input_tokens, job.output_tokens, job.cache_read_tokens, job.cache_write_tokens) == (
        sum(c.input_tokens for c in chunks), sum(c.output_tokens for c in chunks),
        sum(c.cache_read_tokens for c in chunks), sum(c.cache_write_tokens for c in chunks))
    # a cached chunk's prefix is written once, by its warm-up call, then read by the ten other locates and the
    # assessments (the cache is shared by the processes): eleven misses at once would write more than they read
    assert job.cache_write_tokens > 0 and job.cache_read_tokens >= 5 * job.cache_write_tokens
    # more than the fixed part (the recording write, the Lambda request, the aggregator's settle) per chunk:
    # the worker processes' own requests (claim, heartbeat, checkpoints, events, findings) were counted
    assert job.aws_requests > 6 * len(chunks) and job.aws_requests > Usage.of(chunks).aws_requests
    assert job.model_micro_usd > 0 and job.aws_micro_usd > 0
    report = json.loads(deps.artifacts.get_text(job.report_json_key or ""))
    assert Decimal(report["cost"]["total_usd"]) == cost.usd(job.total_micro_usd)
    assert "## Estimated cost" in deps.artifacts.get_text(job.report_md_key or "")  # the offline model: nothing charged
    view = job_view.job_view(deps, job_id)
    assert view is not None and view.cost.startswith(cost.format_usd(job.total_micro_usd))

    # GIVEN a budget under a document's estimate: refused before anything is sent (job.budget_insufficient)
    big = large_contract(60_000, variant=4)
    estimate = admission.estimate(deps.settings, big).model_micro_usd
    with pytest.raises(ReviewError) as refused:
        submission.submit(deps, None, SubmitRequest.inline(big, document_id="under-estimate", budget_usd=float(cost.usd(estimate)) / 2))
    assert refused.value.envelope.error_code == "job.budget_insufficient"
    # AND the document with a budget at its estimate, which its long answers then overrun
    calls_before = len(ledger(log))
    budget = float(cost.usd(estimate)) + 0.000001
    stopped_id = submission.submit(deps, None, SubmitRequest.inline(big, document_id="over-budget", budget_usd=budget)).job_id
    # WHEN its first chunk settles THEN it is stopped and ends cancelled with job.budget_exceeded
    stopped = wait_jobs(deps, [stopped_id], timeout=90)[stopped_id]
    assert (stopped.state, stopped.error_code) == (JobState.CANCELLED, "job.budget_exceeded")
    assert stopped.budget_micro_usd == cost.micro_usd(Decimal(str(budget)))
    assert stopped.total_micro_usd >= stopped.budget_micro_usd
    events = deps.jobs.events(stopped_id)
    (stop,) = [e for e in events if e.type == "job.cancelling"]
    assert stop.detail["code"] == "job.budget_exceeded" and stop.detail["by"] == "budget"
    # no model call started after the stop, no report, no side effect, chunks settled, not run
    calls = ledger(log)[calls_before:]
    assert calls and [c for c in calls if c["started_at"] > stop.at + CHECK_TO_CALL_S] == []
    assert stopped.report_json_key is None and stopped.side_effects == []
    records = deps.claims.for_job(stopped_id)
    assert records and all(r.settled for r in records)
    assert sum(1 for r in records if r.status is ChunkStatus.DONE) < stopped.chunk_count
    # AND nothing is left to do: the queues drain, no DLQ message, and the job stays as it ended
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == 0, 30, what="the analysis queue drained")
    for q in (Queue.ANALYSIS_DLQ, Queue.RESULTS_DLQ):
        assert deps.queues.depth(q) == 0
    assert len(ledger(log)) == calls_before + len(calls)
    assert deps.jobs.get(stopped_id) == stopped
