"""What a job records of its model calls is what reached the model.

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

from contract_review.domain.control_records import ModelControl
from contract_review.domain.cost import micro_usd, model_cost_usd, model_price
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState, Usage
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.daily_quota import DailyQuota
from contract_review.model.pacing import estimated_reservation
from contract_review.pipeline.worker import Delivery, Heartbeat
from contract_review.reliability.chunks import analysis_message
from contract_review.wiring import chunk_worker

from ..inprocess import Crash, Fault, FaultyModel, on
from ..reliability.test_recoveries import Run, client_error, raises


def _recorded_calls(r: Run) -> int:
    return sum(c.n_calls for c in r.world.claims.for_job(r.job_id))


def _pause(r: Run) -> Callable[[], None]:
    r.world.model_control.put(ModelControl(paused=True, by="ops"))
    return lambda: r.world.model_control.put(ModelControl(paused=False, by="ops"))  # `review quota resume`


def _daily_quota(r: Run) -> Callable[[], None]:
    p = r.world.settings.profile
    model_id = r.p.model.inner.model_id
    daily = DailyQuota.for_profile(r.world.token_ledger, model_id, 1_000_000, p, clock=r.world.clock)
    r.p.worker = chunk_worker(r.world.deps, r.p.model, rng=random.Random(7), sleep=lambda _s: None, daily=daily)
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


def _on_the_job(r: Run, bill: Billed, in_flight_at_a_kill: int = 0) -> None:
    """The job's tokens are the tokens the model answered; its chunks' calls are the calls the model received, but
    for a call under way when its process was killed (nothing survives to say it was made)."""
    job = r.world.jobs.get(r.job_id)
    assert job is not None
    tokens = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    assert bill.tokens.input_tokens > 0
    assert {t: getattr(job, t) for t in tokens} == {t: getattr(bill.tokens, t) for t in tokens}
    assert _recorded_calls(r) == bill.calls - in_flight_at_a_kill
    assert job.model_micro_usd > 0


@pytest.mark.parametrize("analyst", [None, "termination"], ids=["first_call", "after_two_commits"])
def test_an_attempt_fenced_out_of_its_chunk_still_puts_what_it_spent_on_the_job(analyst: str | None):
    """A worker froze in a call on chunk 0, its lease lapsed, another worker finished the chunk;
    the frozen one's answers (and those of its other analysts, answered before their checkpoints were refused) were
    paid for, and were on no job: an attempt that lost its lease recorded nothing. `after_two_commits`: the frozen
    attempt's commits had written its running spend, which the claim that took the chunk over added to it: the
    frozen one, fenced out, adds only the rest (not twice)."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    w = r.world

    def freeze(request: ModelRequest) -> ModelResponse:
        w.clock.advance(w.settings.claim_lease_s + 1)
        job, rec = w.jobs.get(r.job_id), w.claims.get(r.job_id, ids[0])
        assert job is not None and rec is not None
        other = chunk_worker(w.deps, bill, sleep=lambda _s: None)
        assert other.handle(analysis_message(w.deps, job, rec, "sweeper"),
                            Delivery(message_id="m-2", receipt_handle="", receive_count=2, visibility_s=120)).action == "done"
        return OfflineRuleModel().invoke(request)

    r.p.model.faults.append(Fault(on(ids[0], analyst), freeze, 1))
    r.completes_as_fault_free()
    assert '"chunk.lease_lost"' in r.seen()
    _on_the_job(r, bill)


def test_a_chunk_that_settles_after_its_job_ended_puts_what_it_spent_on_the_job():
    """A job-fatal error in one analyst of chunk 1 (access denied) fails the job at once; the
    chunk's other analysts had answered, and the chunk settles after the job ended: the aggregator dropped its
    result, and with it what the chunk spent."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    r.p.model.faults.append(Fault(on(ids[1], "termination"), raises(client_error("AccessDeniedException", 403)), 1))
    job = r.p.run(r.job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "model.access_denied")
    assert r.world.claims.get(r.job_id, ids[1]).status is ChunkStatus.FAILED  # type: ignore[union-attr]
    _on_the_job(r, bill)


def test_a_chunk_whose_calls_mostly_time_out_dead_letters_with_its_answered_calls_on_the_job():
    """As reported: calls that outlive the client's timeout (9 answers in 560 attempts), the chunk
    dead-lettered; the answered calls' tokens are on the job (and the calls that timed out are calls too)."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
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


@pytest.mark.parametrize("forever", [False, True], ids=["then_settles", "then_dead_letters"])
def test_an_attempt_killed_mid_run_leaves_what_it_spent_up_to_its_last_write_on_the_job(forever: bool):
    """A worker killed mid-attempt (kill -9, a Lambda reaching its function timeout, out of
    memory) recorded nothing of what it spent: the sweeper released (or dead-lettered) its lapsed claim with nothing.
    Its commits (and heartbeats) now carry its running spend; the sweeper folds it in, once. Killed at the first call
    of an analyst (the two before it committed), whether the chunk then completes or is dead-lettered."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    r.p.model.faults.append(Fault(on(ids[1], "termination"), raises(Crash()), -1 if forever else 1))
    job = r.p.run(r.job_id)
    assert job.state is (JobState.DEAD_LETTERED if forever else JobState.COMPLETED)
    assert r.p.crashes >= (r.world.settings.profile.recovery.poison_budget if forever else 1)
    _on_the_job(r, bill, in_flight_at_a_kill=r.p.crashes)


def test_a_killed_attempts_spend_is_added_by_the_claim_that_takes_its_chunk_over():
    """The lease of a killed worker lapsed and its message came back to another worker before
    the sweeper looked: the new claim ends the dead fence, and adds what it had written of its spend, once."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    w = r.world
    r.p.model.faults.append(Fault(on(ids[1], "termination"), raises(Crash()), 1))
    for s in w.queues.drain(Queue.ANALYSIS):
        r.p.deliver(s)
    assert r.p.crashes == 1
    w.clock.advance(w.settings.claim_lease_s + 1)
    job, rec = w.jobs.get(r.job_id), w.claims.get(r.job_id, ids[1])
    assert job is not None and rec is not None and rec.status is ChunkStatus.CLAIMED
    other = chunk_worker(w.deps, bill, sleep=lambda _s: None)
    assert other.handle(analysis_message(w.deps, job, rec, "redelivered"),
                        Delivery(message_id="m-2", receipt_handle="", receive_count=2, visibility_s=120)).action == "done"
    assert r.p.run(r.job_id).state is JobState.COMPLETED
    _on_the_job(r, bill, in_flight_at_a_kill=1)


def test_calls_that_time_out_are_on_the_job_with_their_estimated_cost():
    """A call that outlived the client's read timeout reached Bedrock, which may bill it; such
    calls were on no job. The job counts them and carries their estimated cost (the request's estimated input plus
    its maxTokens, at the model's prices) apart from what was measured, and its budget counts it."""
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    w = r.world
    price = model_price(w.settings.profile.prices, w.settings.effective_model_id)
    timed_out: list[ModelRequest] = []  # the double's log of the calls it let time out
    n = {"calls": 0}
    inner = r.p.model.inner

    def mostly_times_out(request: ModelRequest) -> ModelResponse:  # two in three calls outlive the read timeout
        n["calls"] += 1
        if n["calls"] % 3:
            timed_out.append(request)
            raise ReadTimeoutError(endpoint_url="https://bedrock")
        return inner.invoke(request)

    r.p.model.faults.append(Fault(on(ids[0]), mostly_times_out))
    job = r.p.run(r.job_id)
    assert job.terminal and timed_out
    assert job.timed_out_calls == len(timed_out)
    # each: its input as the pacer estimates it (its reservation less maxTokens), and maxTokens of output
    estimated = sum(micro_usd(model_cost_usd(price, Usage(input_tokens=estimated_reservation(q, w.settings.effective_model_id) - q.max_tokens,
                                                          output_tokens=q.max_tokens))) for q in timed_out)
    assert estimated > 0 and job.estimated_micro_usd == estimated
    assert job.total_micro_usd == job.model_micro_usd + job.aws_micro_usd + estimated
    _on_the_job(r, bill)


def test_a_heartbeat_carries_the_spend_of_the_analyst_under_way_when_the_process_is_killed(
        monkeypatch: pytest.MonkeyPatch):
    """As reported: an analyst's calls outlived the read timeout and were retried until its Lambda
    reached its function timeout and was killed: the attempt's spend died with it, the answered calls' tokens and the
    timed-out calls alike. A beat of the heartbeat (driven here in place of its timer, in the analyst's third call)
    writes the attempt's spend so far, the analyst under way included, and the sweeper folds it in."""
    beats: list[Heartbeat] = []
    enter = Heartbeat.__enter__

    def watched(self: Heartbeat) -> Heartbeat:
        beats.append(self)
        return enter(self)

    monkeypatch.setattr(Heartbeat, "__enter__", watched)
    r = Run()
    ids = r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    w = r.world
    price = model_price(w.settings.profile.prices, w.settings.effective_model_id)
    timed_out: list[ModelRequest] = []
    calls = {"n": 0}
    inner = r.p.model.inner

    def times_out_answers_then_dies(request: ModelRequest) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] == 1:  # outlives the read timeout (retried by tier 1)
            timed_out.append(request)
            raise ReadTimeoutError(endpoint_url="https://bedrock")
        if calls["n"] == 2:  # answered
            return inner.invoke(request)
        w.clock.advance(w.settings.claim_lease_s / 3 + 0.01)  # the next beat is due
        beats[-1].tick()
        raise Crash()  # killed in the call

    r.p.model.faults.append(Fault(on(ids[0], "liability"), times_out_answers_then_dies, 3))  # it finds a clause there
    assert r.p.run(r.job_id).state is JobState.COMPLETED
    assert r.p.crashes == 1 and len(timed_out) == 1
    _on_the_job(r, bill)  # the call it was killed in too: the beat counted it
    job = w.jobs.get(r.job_id)
    assert job is not None and job.timed_out_calls == 1
    assert job.estimated_micro_usd == micro_usd(model_cost_usd(price, Usage(
        input_tokens=estimated_reservation(timed_out[0], w.settings.effective_model_id) - timed_out[0].max_tokens,
        output_tokens=timed_out[0].max_tokens)))


def test_an_ending_write_that_landed_though_its_retry_failed_is_not_added_again_fenced_out():
    """The worker's finish went through (all it spent added, its running-spend entry dropped), but botocore's retry of
    it failed the condition: the worker sees its lease lost and calls `add_fenced_out`, which adds nothing again."""
    r = Run()
    r.submit()
    bill = Billed(r.p.model)
    r.p.use_model(bill)
    claims = r.world.claims
    real = claims.finish
    landed: list[str] = []

    def finish_then_retry_fails(job_id: str, chunk_id: str, *a: object, **kw: object) -> object:
        done = real(job_id, chunk_id, *a, **kw)  # type: ignore[arg-type]  # the wrapped call's own arguments
        if done is not None and not landed:
            landed.append(chunk_id)
            return None  # the retry's answer: ConditionalCheckFailed
        return done
    claims.finish = finish_then_retry_fails  # type: ignore[method-assign]  # one call of the fake, wrapped
    r.completes_as_fault_free()
    claims.finish = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    assert landed and '"chunk.lease_lost"' in r.seen()
    _on_the_job(r, bill)
