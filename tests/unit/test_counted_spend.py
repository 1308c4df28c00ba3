"""Issue 25 findings 15 and 16: what a job records of its model calls is what reached the model.

- A call held before it is made (an operator's pause, a full daily token ledger) is no model call: the job's
  recorded calls (its chunks' `n_calls`, the report's reliability) equal the calls the model received.
- Every call that reached the model is on its job's tokens and cost whatever becomes of its chunk.

The pipeline runs in-process over the fakes (`inprocess.py`); the model is the offline rule model behind a
counter (`FaultyModel.calls`: what the model received)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest

from contract_review.domain.records import ChunkStatus, JobState, ModelControl
from contract_review.model.daily_quota import DailyQuota
from contract_review.pipeline.worker import ChunkWorker

from .test_recoveries import Run


def _recorded_calls(r: Run) -> int:
    return sum(c.n_calls for c in r.world.claims.for_job(r.job_id))


def _pause(r: Run) -> Callable[[], None]:
    r.world.model_control.put(ModelControl(paused=True, by="ops"))
    return lambda: r.world.model_control.put(ModelControl(paused=False, by="ops"))  # `review quota resume`


def _daily_quota(r: Run) -> Callable[[], None]:
    p = r.world.settings.profile
    model_id = r.p.model.inner.model_id
    daily = DailyQuota.for_profile(r.world.token_ledger, model_id, 1_000_000, p, clock=r.world.clock)
    r.p.worker = ChunkWorker(r.world.deps, r.p.model, rng=random.Random(7), sleep=lambda _s: None, daily=daily)
    r.world.token_ledger.add(model_id, daily.hour(r.world.clock()), 990_000)  # the ledger at 99 % of the quota
    return lambda: r.world.clock.advance(p.quota.daily_ledger_bucket_s)  # the next hour's probe answers


@pytest.mark.parametrize("hold", [_pause, _daily_quota], ids=["paused", "daily_quota"])
def test_calls_held_before_the_model_are_not_model_calls(hold: Callable[[Run], Callable[[], None]]):
    # GIVEN a job whose model is held (paused by an operator / its daily token quota used up) for a while
    r = Run()
    release = hold(r)
    r.submit()
    r.p.run(r.job_id, rounds=8)
    r.world.clock.advance(r.world.settings.profile.recovery.backpressure_deadline_s * 2)
    r.p.run(r.job_id, rounds=8)
    # THEN while held, the model received no call and the job records none (`review status` showed 263)
    assert r.p.model.calls == 0
    assert all(c.status is ChunkStatus.PENDING for c in r.world.claims.for_job(r.job_id))
    assert _recorded_calls(r) == 0
    # WHEN the hold ends and the job completes
    release()
    job = r.p.run(r.job_id)
    assert job.state is JobState.COMPLETED
    # THEN its recorded model calls are the calls the model received: on its chunks, its record and its report
    assert job.reliability is not None and job.reliability.model_calls == r.p.model.calls == _recorded_calls(r)
    report = json.loads(r.world.artifacts.get_text(job.report_json_key or ""))
    assert report["reliability"]["model_calls"] == r.p.model.calls
