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
from botocore.exceptions import ReadTimeoutError

from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.records import ChunkStatus, JobState, ModelControl, Usage
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.daily_quota import DailyQuota
from contract_review.pipeline.worker import ChunkWorker, Delivery
from contract_review.reliability.chunks import analysis_message

from .inprocess import Fault, FaultyModel, on
from .test_recoveries import Run, client_error, raises


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


class Billed:
    """The model as its bill sees it: every call it received, and the tokens of every answer it gave."""

    def __init__(self, model: FaultyModel):
        self.model, self.calls, self.tokens = model, 0, Usage()

    @property
    def model_id(self) -> str:
        return self.model.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        response = self.model.invoke(request)
        self.tokens = Usage.of([self.tokens, Usage(input_tokens=response.input_tokens,
                                                   output_tokens=response.output_tokens,
                                                   cache_read_tokens=response.cache_read_tokens,
                                                   cache_write_tokens=response.cache_write_tokens)])
        return response


def _on_the_job(r: Run, bill: Billed) -> None:
    job = r.world.jobs.get(r.job_id)
    assert job is not None
    tokens = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    assert bill.tokens.input_tokens > 0
    assert {t: getattr(job, t) for t in tokens} == {t: getattr(bill.tokens, t) for t in tokens}
    assert _recorded_calls(r) == bill.calls
    assert job.model_micro_usd > 0


def test_an_attempt_fenced_out_of_its_chunk_still_puts_what_it_spent_on_the_job():
    """Issue 25 finding 15: a worker froze in a call on chunk 0, its lease lapsed, another worker finished the chunk;
    the frozen one's answers (and those of its other analysts, answered before their checkpoints were refused) were
    paid for, and were on no job: an attempt that lost its lease recorded nothing."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.worker.model = bill
    w = r.world

    def freeze(request: ModelRequest) -> ModelResponse:
        w.clock.advance(w.settings.claim_lease_s + 1)
        job, rec = w.jobs.get(r.job_id), w.claims.get(r.job_id, ids[0])
        assert job is not None and rec is not None
        other = ChunkWorker(w.deps, bill, sleep=lambda _s: None)
        assert other.handle(analysis_message(w.deps, job, rec, "sweeper"),
                            Delivery(message_id="m-2", receipt_handle="", receive_count=2, visibility_s=120)).action == "done"
        return OfflineRuleModel().invoke(request)

    r.p.model.faults.append(Fault(on(ids[0]), freeze, 1))
    r.completes_as_fault_free()
    assert '"chunk.lease_lost"' in r.seen()
    _on_the_job(r, bill)


def test_a_chunk_that_settles_after_its_job_ended_puts_what_it_spent_on_the_job():
    """Issue 25 finding 15: a job-fatal error in one analyst of chunk 1 (access denied) fails the job at once; the
    chunk's other analysts had answered, and the chunk settles after the job ended: the aggregator dropped its
    result, and with it what the chunk spent."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.worker.model = bill
    r.p.model.faults.append(Fault(on(ids[1], "termination"), raises(client_error("AccessDeniedException", 403)), 1))
    job = r.p.run(r.job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "model.access_denied")
    assert r.world.claims.get(r.job_id, ids[1]).status is ChunkStatus.FAILED  # type: ignore[union-attr]
    _on_the_job(r, bill)


def test_a_chunk_whose_calls_mostly_time_out_dead_letters_with_its_answered_calls_on_the_job():
    """Issue 25 finding 15, as reported: calls that outlive the client's timeout (9 answers in 560 attempts), the chunk
    dead-lettered; the answered calls' tokens are on the job (and the calls that timed out are calls too)."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.worker.model = bill
    n = {"calls": 0}
    inner = r.p.model.inner

    def mostly_times_out(request: ModelRequest) -> ModelResponse:
        n["calls"] += 1
        if n["calls"] % 10:
            raise ReadTimeoutError(endpoint_url="https://bedrock")
        return inner.invoke(request)

    r.p.model.faults.append(Fault(on(ids[0]), mostly_times_out))
    job = r.p.run(r.job_id)
    assert job.state is JobState.DEAD_LETTERED
    assert r.world.claims.get(r.job_id, ids[0]).status is ChunkStatus.DEAD_LETTERED  # type: ignore[union-attr]
    assert n["calls"] >= 10
    _on_the_job(r, bill)
