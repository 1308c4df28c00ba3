"""`review quota pause|resume` on embedded AWS with real worker processes: the pause reaches the workers through the
stack's control table (one item, read cached model_control_max_age_s: 1 s locally), no model call starts after it,
no failure is counted, and resume lets the job complete."""

from __future__ import annotations

import time

from click.testing import CliRunner

from contract_review.config.profile import get_profile
from contract_review.domain.records import JobState
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from review_local.cli import Ctx, cli

from ..large_docs import large_contract
from .conftest import ledger, wait_for, wait_jobs

CALL_S = 0.1
MAX_AGE_S = get_profile("local").quota.model_control_max_age_s


def test_review_quota_pause_holds_every_model_call_without_a_failure_and_resume_completes_the_job(make_stack,
                                                                                                   tmp_path):
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_ms=int(CALL_S * 1000), call_log=str(log)))
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(large_contract(40_000, variant=4), document_id="to-pause")).job_id
    wait_for(lambda: len(ledger(log)) >= 10, 60, 0.05, "model calls under way")
    # WHEN an operator pauses the model
    paused = CliRunner().invoke(cli, ["quota", "pause"], obj=Ctx(None, None, deps=deps))
    assert paused.exit_code == 0 and "PAUSED" in paused.output, paused.output
    paused_at = time.time()
    time.sleep(MAX_AGE_S + 3)
    # THEN within the control's cache age (plus a call under way) no model call starts any more
    late = [c for c in ledger(log) if c["started_at"] > paused_at + MAX_AGE_S + CALL_S + 0.5]
    assert late == [], late[:3]
    job = deps.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING
    # AND nothing failed: the chunks are held as backpressure (`model.paused`), checkpoints kept
    assert all(r.failures == 0 for r in deps.claims.for_job(job_id))
    # (the hold reaches each worker at its next call: on a loaded machine that can come after the sleep above)
    wait_for(lambda: any(e.type == "chunk.requeued" and e.detail.get("reason") == "model.paused"
                         for e in deps.jobs.events(job_id)), 60, 0.2, "a chunk held by the pause")
    # WHEN it is resumed THEN the job completes
    resumed = CliRunner().invoke(cli, ["quota", "resume"], obj=Ctx(None, None, deps=deps))
    assert resumed.exit_code == 0 and "model: running" in resumed.output
    ended = wait_jobs(deps, [job_id], timeout=120)[job_id]
    assert ended.state is JobState.COMPLETED, (ended.state, ended.error_code)
    assert all(r.failures == 0 for r in deps.claims.for_job(job_id))
