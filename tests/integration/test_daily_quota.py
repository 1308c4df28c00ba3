"""The daily token quota on embedded AWS with real worker processes and the strict double's daily quota
(FaultSpec daily_tokens_per_model: a call is refused with a 429 that looks like any other throttle once the
model's count for the double's "day" is over it).

1. The ledger is really written: after a job, the workers' counters in the stack's token-ledger table (moto)
   hold exactly what the simulated Bedrock counted against its daily quota (the same settled tokens).
2. A full ledger holds: no model call, no failure, no dead letter, past the backpressure deadline (8 s on this stack,
   set for its workers; the local profile's is 20 s),
   the job names what it waits for (`review status`); one probe per ledger bucket (5 s here instead of an hour)
   fails while the double's day is used up, and the first probe after the double's day turns (nobody told the
   workers when) lifts the hold and the job completes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.config.profile import get_profile
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.doubles.bedrock_sim import DailyTokenLedger
from contract_review.doubles.spec import FaultSpec
from contract_review.model.daily_quota import DAILY_QUOTA_CODE
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from review_local.cli import Ctx, cli

from ..texts import TEXT
from .conftest import ledger, wait_for, wait_jobs

BUCKET_S = 5.0  # the ledger's "hour" on this stack: a probe every 5 s
# the workers' backpressure deadline on this stack (the local profile's 20 s, shortened: the double's day must outlast
# it, and the test waits for that day to turn)
DEADLINE_S = 8.0


def _double_count(state_dir: Path) -> int:
    """What the simulated Bedrock counted against the model's daily quota in its current day."""
    (counts,) = json.loads((state_dir / "daily-tokens.json").read_text()).values()
    return int(counts[OFFLINE_MODEL_ID])


def test_the_workers_ledger_counts_what_the_simulated_bedrock_counted_against_its_daily_quota(make_stack, tmp_path):
    state = tmp_path / "bedrock"
    quota = 10**9  # far from full: nothing is held
    stack = make_stack(FaultSpec.simulated_bedrock(str(state), median_ms=20.0, daily_tokens_per_model=quota),
                       worker_profile={"model_tokens_per_day": quota})
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(TEXT, document_id="counted")).job_id
    assert wait_jobs(deps, [job_id])[job_id].state is JobState.COMPLETED
    # THEN the counters are in the table (one item per model per hour, written by the workers' ADDs)
    counters = deps.token_ledger
    assert counters is not None
    window = wait_for(lambda: counters.window(OFFLINE_MODEL_ID, 0).hours, 10, 0.2, "the ledger's counters")
    assert sum(window.values()) == _double_count(state) > 0


def test_a_full_ledger_holds_the_job_past_the_deadline_and_the_first_probe_after_the_quota_turns_lifts_it(
        make_stack, tmp_path):
    state = tmp_path / "bedrock"
    quota, day_s = 2_000_000, 2 * DEADLINE_S + 2
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(throttle_state_dir=str(state), daily_tokens_per_model=quota, daily_window_s=day_s,
                                 call_log=str(log)),
                       worker_profile={"model_tokens_per_day": quota, "daily_ledger_bucket_s": BUCKET_S,
                                       "backpressure_deadline_s": DEADLINE_S})
    deps = stack.deps()
    assert deps.token_ledger is not None
    assert DEADLINE_S < get_profile("local").recovery.backpressure_deadline_s
    # GIVEN the double's day just began (it lasts longer than the backpressure deadline) and is already used up,
    # and the stack's ledger says so too (99 % of the quota counted in this bucket)
    left = day_s - time.time() % day_s
    if left < DEADLINE_S + 6:
        time.sleep(left + 0.2)
    double = DailyTokenLedger(str(state), model_per_day=quota, account_per_day=None, day_s=day_s)
    double.settle(OFFLINE_MODEL_ID, -quota)  # its day's count at the quota: every call is throttled
    turns_at = (time.time() // day_s + 1) * day_s
    deps.token_ledger.add(OFFLINE_MODEL_ID, int(time.time() // BUCKET_S), int(quota * 0.99))
    # WHEN a job is submitted
    job_id = submission.submit(deps, None, SubmitRequest.inline(TEXT, document_id="held")).job_id
    # THEN its chunk is held and the job says what it waits for
    wait_for(lambda: any(e.type == "job.waiting_quota" for e in deps.jobs.events(job_id)), 30, 0.2, "the hold")
    shown = CliRunner().invoke(cli, ["status", job_id], obj=Ctx(None, None, deps=deps))
    assert shown.exit_code == 0, shown.output
    assert f"waiting: waiting for the daily token quota of {OFFLINE_MODEL_ID} (2,000,000 tokens/day), re-probed " \
           "hourly" in " ".join(shown.output.split())  # the console wraps long lines
    # AND past the backpressure deadline nothing failed and nothing was dead-lettered; the only calls made were
    # the probes, at most one per bucket, all throttled by the double (its day is used up)
    wait_for(lambda: time.time() > turns_at - 1, day_s, 0.5, "the double's day to near its end")
    job = deps.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and job.waiting is not None
    assert all(c.failures == 0 and c.status.value in ("pending", "claimed") for c in deps.claims.for_job(job_id))
    assert deps.queues.depth(Queue.ANALYSIS_DLQ) == 0
    calls = ledger(log)
    assert all(c["outcome"] == "ThrottlingException" for c in calls), calls
    assert len(calls) <= (time.time() - (turns_at - day_s)) / BUCKET_S + 2, calls
    events = deps.jobs.events(job_id)
    assert any(e.type == "chunk.requeued" and e.detail.get("reason") == DAILY_QUOTA_CODE for e in events)
    assert not any(e.type == "chunk.dead_lettered" for e in events)
    # WHEN the double's day turns (the workers were not told when) THEN the next probe answers and the job completes
    ended = wait_jobs(deps, [job_id], timeout=90)[job_id]
    assert ended.state is JobState.COMPLETED, (ended.state, ended.error_code)
    assert ended.waiting is None and any(e.type == "job.waiting_ended" for e in deps.jobs.events(job_id))
    assert all(r.failures == 0 for r in deps.claims.for_job(job_id))
