"""The stack's daily spend cap on embedded AWS with real worker processes (domain/spend_cap.py; docs/runbook.md "The
daily spend cap"): a redeploy lowers the cap below what the day has already recorded while a job runs (the runtime's
processes restarted with the new cap, as `cdk deploy -c daily_spend_cap_usd=N` replaces the functions' environment).
The sweeper holds the model: no model call starts after it, nothing fails, `review status` and `review quota show` say
why; a queue sender past the cap gets a job that waits, with no chunk sent and no model call; `review quota resume
--override-cap` lets both complete."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from contract_review.config.profile import get_profile
from contract_review.domain.records import JobState
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import ops
from review_local.cli import Ctx, cli

from ..large_docs import large_contract
from .conftest import ledger, wait_for, wait_jobs

CALL_S = 0.2
MAX_AGE_S = get_profile("local").quota.model_control_max_age_s
FUNCTIONS = ("intake", "worker", "aggregator", "sweeper", "collector")
LOWERED_CAP_USD = 0.000_001  # below anything a model call records


def _cli(deps, *args: str) -> str:  # noqa: ANN001  # the stack's Deps
    result = CliRunner().invoke(cli, list(args), obj=Ctx(None, None, deps=deps), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cap_holds_every_model_call_and_a_queued_job_until_an_operator_lifts_it(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_ms=int(CALL_S * 1000), call_log=str(log)))
    deps = stack.deps()
    running = ops.submit(deps, large_contract(120_000, variant=5), document_id="under-way")
    wait_for(lambda: len(ledger(log)) >= 10, 60, 0.05, "model calls under way")
    # WHEN a redeploy lowers the cap below what today has recorded (every function gets the new cap)
    stack.stop_workers()
    stack.extra_env = {fn: {"PROFILE_OVERRIDES": json.dumps({"daily_spend_cap_usd": LOWERED_CAP_USD})}
                       for fn in FUNCTIONS}
    stack.start_workers()
    # THEN the sweeper holds the model: within the control's cache age (plus a call under way) no model call starts
    held = wait_for(lambda: ops.model_hold(deps), 30, 0.2, "the spend-cap hold")
    assert "daily spend cap" in held and "--override-cap" in held
    held_at = time.time()
    time.sleep(MAX_AGE_S + 3)
    late = [c for c in ledger(log) if c["started_at"] > held_at + MAX_AGE_S + CALL_S + 0.5]
    assert late == [], late[:3]
    job = deps.jobs.get(running)
    assert job is not None and job.state is JobState.RUNNING
    # held as backpressure, nothing failed for it: a failure counted is the restart's kill of a chunk under way
    # (runtime.worker_lost, one at most), never the hold's
    assert all(r.failures <= 1 for r in deps.claims.for_job(running))
    assert any(e.type == "chunk.requeued" and e.detail.get("reason") == "model.spend_capped"
               for e in deps.jobs.events(running))
    # AND `review status` / `review quota show` say why
    assert "held: the stack's recorded model spend today" in _cli(deps, "status", running)
    assert "model HELD" in _cli(deps, "quota", "show")
    # AND a queue sender past the cap gets a job that waits: no chunk sent, no model call
    calls_before = len(ledger(log))
    waiting = ops.submit(deps, large_contract(8_000, variant=6), document_id="over-the-cap")
    queued = wait_for(lambda: (j := deps.jobs.get(waiting)) is not None and j.waiting is not None and j, 30, 0.2,
                      "the job held at admission")
    assert queued.state is JobState.QUEUED and queued.waiting.condition == "spend_cap"
    time.sleep(3)  # several sweeps: it is not started while the cap holds
    assert deps.claims.for_job(waiting) == [] and len(ledger(log)) == calls_before
    assert "waiting:" in _cli(deps, "status", waiting)
    # WHEN the operator lifts the cap for today THEN both complete, nothing failed
    assert "lifted for the rest of today" in _cli(deps, "quota", "resume", "--override-cap")
    ended = wait_jobs(deps, [running, waiting], timeout=300)
    assert {j: e.state for j, e in ended.items()} == {running: JobState.COMPLETED, waiting: JobState.COMPLETED}
    assert all(r.failures <= 1 for r in deps.claims.for_job(running))
    assert all(r.failures == 0 for r in deps.claims.for_job(waiting))
    assert ended[waiting].waiting is None
