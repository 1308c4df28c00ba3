"""The daily token quota, held client-side (model/daily_quota.py): the ledger's arithmetic and its 24-hour window,
the worker holding chunks (never failing them) while the ledger is full, the backpressure deadline leaving a hold
alone, and the hourly probe that lifts it. In-memory ledger (fakes.FakeTokenLedger), explicit clock."""

from __future__ import annotations

import random

import pytest

from contract_review.domain.chunk_records import ReleaseReason
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.model.daily_quota import DAILY_QUOTA_CODE, DailyQuota
from contract_review.operate import job_view, narration
from contract_review.pipeline.worker import ChunkWorker, Delivery
from contract_review.wiring import chunk_worker

from ..fakes import FakeClock, FakeTokenLedger, FakeWorld
from ..pipeline.test_worker import RUN, ScriptedModel, _error
from ..scenarios import one_chunk_job

MODEL = "anthropic.claude-sonnet-4-6"  # output burndown 5 (domain/model.py MODEL_TRAITS)
HOUR = 3600.0
QUOTA = 1_000_000.0


def gate(ledger: FakeTokenLedger, clock: FakeClock, quota: float = QUOTA, model_id: str = MODEL,
         max_age_s: float = 60.0) -> DailyQuota:
    return DailyQuota(ledger, model_id, quota, "test", threshold=0.98, bucket_s=HOUR, max_age_s=max_age_s,
                      flush_s=60.0, clock=clock)


def answer(input_tokens: int = 0, output_tokens: int = 0, cache_read: int = 0, cache_write: int = 0) -> ModelResponse:
    return ModelResponse(text="{}", stop_reason="end_turn", input_tokens=input_tokens, output_tokens=output_tokens,
                         cache_read_tokens=cache_read, cache_write_tokens=cache_write)


def hour_of(clock: FakeClock) -> int:
    return int(clock() // HOUR)


# ------------------------------------------------------------------------------ the ledger's arithmetic
def test_a_settled_call_counts_input_cache_writes_and_output_times_the_burndown_and_not_cache_reads():
    ledger, clock = FakeTokenLedger(), FakeClock()
    g = gate(ledger, clock)
    g.settled(answer(input_tokens=100, output_tokens=10, cache_read=5_000, cache_write=50))
    g.settled(answer(input_tokens=1_000, output_tokens=200))
    assert g.used() == (100 + 50 + 5 * 10) + (1_000 + 5 * 200)  # 2,200; the 5,000 cache reads count nothing
    assert ledger.adds == 0  # batched: nothing written per call
    g.flush()
    assert ledger.counters == {(MODEL, hour_of(clock)): 2_200} and ledger.adds == 1
    g.flush()  # nothing pending: no write
    assert ledger.adds == 1 and g.used() == 2_200


def test_pending_tokens_are_flushed_once_a_minute_while_calls_settle():
    ledger, clock = FakeTokenLedger(), FakeClock()
    g = gate(ledger, clock)
    for _ in range(10):  # ten calls within the minute: one write at most
        g.settled(answer(input_tokens=10))
        clock.advance(5)
    assert ledger.adds == 0
    clock.advance(20)
    g.settled(answer(input_tokens=10))
    assert ledger.adds == 1 and sum(ledger.counters.values()) == 110


def test_the_window_is_the_last_24_hourly_counters_shared_by_every_worker():
    ledger, clock = FakeTokenLedger(), FakeClock()
    h = hour_of(clock)
    ledger.add(MODEL, h - 24, 500_000)  # 25 hours ago: outside
    ledger.add(MODEL, h - 23, 300_000)  # the oldest hour inside
    ledger.add(MODEL, h, 100_000)
    ledger.add("other-model", h, 900_000)  # another model's quota
    a, b = gate(ledger, clock), gate(ledger, clock)
    assert a.used() == 400_000
    b.settled(answer(input_tokens=7))
    b.flush()  # another worker's tokens reach the first one at its next read
    clock.advance(61)
    assert a.used() == 400_007
    clock.advance(HOUR)  # an hour later: h - 23 has left the window
    assert a.used() == 100_007


def test_the_ledger_is_read_at_most_once_per_max_age():
    ledger, clock = FakeTokenLedger(), FakeClock()
    g = gate(ledger, clock)
    for _ in range(50):
        g.admit()
        clock.advance(1)
    assert ledger.reads == 1
    clock.advance(10)
    g.admit()
    assert ledger.reads == 2


# ------------------------------------------------------------------------------ holding and the hourly probe
def fill(ledger: FakeTokenLedger, clock: FakeClock, share: float = 0.98, model_id: str = MODEL) -> None:
    ledger.add(model_id, hour_of(clock), int(QUOTA * share))


def test_at_98_percent_a_call_is_held_with_the_time_of_the_next_probe_and_no_probe_the_same_hour():
    ledger, clock = FakeTokenLedger(), FakeClock()
    fill(ledger, clock, 0.979)
    g = gate(ledger, clock, max_age_s=0)
    assert g.admit() is False  # under the threshold: the call goes on
    ledger.add(MODEL, hour_of(clock), int(QUOTA * 0.001))
    with pytest.raises(ReviewError) as held:
        g.admit("liability")
    env = held.value.envelope
    assert (env.error_code, env.step, env.retryable) == (DAILY_QUOTA_CODE, "liability", False)
    next_hour = (hour_of(clock) + 1) * HOUR
    assert env.retry_after_s == pytest.approx(next_hour - clock())
    assert ledger.control[MODEL]["probe_hour"] == hour_of(clock)  # the hold started this hour
    clock.advance(next_hour - clock() - 1)  # the rest of the hour: held, no probe
    with pytest.raises(ReviewError):
        g.admit()


def test_once_an_hour_one_call_of_all_workers_is_the_probe_and_its_answer_lifts_the_hold():
    ledger, clock = FakeTokenLedger(), FakeClock()
    fill(ledger, clock)
    a, b = gate(ledger, clock, max_age_s=0), gate(ledger, clock, max_age_s=0)
    with pytest.raises(ReviewError):
        a.admit()
    clock.advance(HOUR)
    # THEN the next hour exactly one call, of either worker, goes through as the probe
    assert a.admit() is True
    with pytest.raises(ReviewError):
        b.admit()
    with pytest.raises(ReviewError):
        a.admit()  # its own other calls wait for the probe's answer too
    # WHEN the probe answers THEN the hold is lifted for every worker (the ledger counts from this hour on)
    a.settled(answer(input_tokens=100), probe=True)
    assert a.admit() is False and b.admit() is False
    assert ledger.control[MODEL] == {"since_hour": hour_of(clock)}
    # AND a new exhaustion starts a new hold (its first probe is the next hour's)
    fill(ledger, clock)
    with pytest.raises(ReviewError):
        b.admit()
    assert ledger.control[MODEL]["probe_hour"] == hour_of(clock)


def test_a_probe_that_is_throttled_holds_another_hour_and_no_reset_time_is_assumed():
    ledger, clock = FakeTokenLedger(), FakeClock()
    fill(ledger, clock)
    g = gate(ledger, clock, max_age_s=0)
    with pytest.raises(ReviewError):
        g.admit()
    for _ in range(5):  # the quota stays exhausted for hours: one probe an hour, each failing
        clock.advance(HOUR)
        assert g.admit() is True
        g.failed(probe=True)
        with pytest.raises(ReviewError):
            g.admit()
        clock.advance(HOUR / 2)
        with pytest.raises(ReviewError):
            g.admit()
        clock.advance(-HOUR / 2)
    assert MODEL in ledger.control and "since_hour" not in ledger.control[MODEL]


# ------------------------------------------------------------------------------ the worker
def _worker(world: FakeWorld, model: ScriptedModel, quota: float = QUOTA) -> ChunkWorker:
    daily = DailyQuota.for_profile(world.token_ledger, model.model_id, quota, world.settings.profile,
                                   source="test", clock=world.clock)
    return chunk_worker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None, call_safety_s=0.5,
                       daily=daily)


def _delivery() -> Delivery:
    return Delivery(message_id="mid-1", receipt_handle="", receive_count=1, visibility_s=120)


def _full(world: FakeWorld, model_id: str = ScriptedModel.model_id) -> None:
    world.token_ledger.add(model_id, int(world.clock() // world.settings.profile.quota.daily_ledger_bucket_s),
                           int(QUOTA * 0.99))


def test_a_full_ledger_holds_the_chunk_without_a_model_call_a_failure_or_a_dead_letter():
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    _full(world)
    model = ScriptedModel()
    outcome = _worker(world, model).handle(msg, _delivery())
    # THEN the chunk is requeued as a hold: no model call, no failure, no DLQ message
    assert outcome.action == "requeued" and outcome.detail["reason"] == DAILY_QUOTA_CODE
    assert model.total == 0 and world.queues.sent[Queue.ANALYSIS_DLQ] == []
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and record.failures == 0
    assert (record.release_reason, record.backpressure_since, record.backpressure_requeues) == \
        (ReleaseReason.HELD, None, 0)
    assert record.last_error is not None and record.last_error.error_code == DAILY_QUOTA_CODE
    # AND it comes back after the longest requeue delay (the next probe is up to an hour away)
    (sent,) = world.queues.sent[Queue.ANALYSIS]
    assert sent.delay_s == world.settings.profile.recovery.throttle_max_delay_s
    # AND the job names what it waits for: in its record, its events, `review status` and GET /jobs/{id}
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and job.waiting is not None
    assert job.waiting.condition == "daily_token_quota" and job.waiting.model_id == model.model_id
    assert "job.waiting_quota" in world.jobs.types(job_id)
    view = job_view.job_view(world.deps, job_id)
    assert view is not None and view.waiting == job.waiting
    assert narration.waiting_line(view.waiting).startswith(f"waiting for the daily token quota of {model.model_id} "
                                                     "(1,000,000 tokens/day), re-probed hourly (since ")
    status = job_view.job_status(world.deps, job)
    assert status["waiting"] == {"condition": "daily_token_quota", "modelId": model.model_id,
                                 "tokensPerDay": QUOTA, "since": job_view.api_time(job.waiting.since),
                                 "message": job.waiting.detail}


def test_the_backpressure_deadline_never_dead_letters_a_daily_quota_hold_and_the_probe_completes_it():
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    p = world.settings.profile
    model = ScriptedModel(fail={("liability", "locate"): [_error("ThrottlingException", 429)] * 3})
    worker = _worker(world, model)
    # GIVEN a chunk already under backpressure (throttled: its streak runs)
    first = worker.handle(msg, _delivery())
    assert first.action == "requeued" and first.detail["reason"] == "model.throttled"
    streak_from = world.claims.get(job_id, msg.chunk_id).backpressure_since
    assert streak_from is not None
    calls = model.total
    # WHEN the daily quota is used up and the chunk is held far longer than the backpressure deadline
    _full(world)
    for _ in range(4):
        world.clock.advance(p.recovery.backpressure_deadline_s + 1)
        (fresh,) = world.queues.drain(Queue.ANALYSIS)
        held = worker.handle(msg.model_validate_json(fresh.body), _delivery())
        assert held.action == "requeued" and held.detail["reason"] == DAILY_QUOTA_CODE, held
    # THEN it was never dead-lettered nor failed, and no model call was made (no probe within the hour)
    assert model.total == calls and world.queues.sent[Queue.ANALYSIS_DLQ] == []
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.failures == 0 and record.status is ChunkStatus.PENDING
    # WHEN the next hour's probe answers (the quota reset, or was raised)
    world.clock.advance(p.quota.daily_ledger_bucket_s)
    (fresh,) = world.queues.drain(Queue.ANALYSIS)
    done = worker.handle(msg.model_validate_json(fresh.body), _delivery())
    # THEN the hold is lifted and the chunk completes; the job no longer waits
    assert done.action == "done", done
    job = world.jobs.get(job_id)
    assert job is not None and job.waiting is None and "job.waiting_ended" in world.jobs.types(job_id)
    assert world.token_ledger.control[ScriptedModel.model_id].get("probe_hour") is None


def test_after_a_hold_a_throttle_starts_a_new_streak_instead_of_dead_lettering_at_once():
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    p = world.settings.profile
    first = RUN[0].name  # throttled before the hold (a streak starts), then its next step throttled after it
    throttles = [_error("ThrottlingException", 429)] * 3
    worker = _worker(world, ScriptedModel(fail={(first, "locate"): list(throttles), (first, "assess"): list(throttles)}))
    assert worker.handle(msg, _delivery()).detail["reason"] == "model.throttled"
    streak_from = world.claims.get(job_id, msg.chunk_id).backpressure_since
    assert streak_from is not None
    # GIVEN the daily quota used up and the chunk held for longer than the backpressure deadline
    _full(world)
    world.clock.advance(1)
    (fresh,) = world.queues.drain(Queue.ANALYSIS)
    assert worker.handle(msg.model_validate_json(fresh.body), _delivery()).detail["reason"] == DAILY_QUOTA_CODE
    world.clock.advance(max(p.recovery.backpressure_deadline_s, p.quota.daily_ledger_bucket_s) * 3)
    (fresh,) = world.queues.drain(Queue.ANALYSIS)
    # WHEN the probe (its locate call) answers and lifts the hold, and its next call is throttled before any
    # checkpoint
    outcome = worker.handle(msg.model_validate_json(fresh.body), _delivery())
    # THEN that is backpressure starting a new streak, not a dead letter for the streak before the hold
    assert outcome.action == "requeued" and outcome.detail["reason"] == "model.throttled", outcome
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None and record.backpressure_since == world.clock() and record.failures == 0
    assert record.release_reason is ReleaseReason.BACKPRESSURE and world.queues.sent[Queue.ANALYSIS_DLQ] == []


def test_a_failed_ledger_write_after_a_paid_probe_neither_loses_its_tokens_nor_makes_the_call_again():
    """The probe's answer lifted the hold with a ledger write inside the model call's wrapper; when
    that write failed, the answered (paid) call was taken for a failed one: its tokens were on no chunk, and the
    retrier made the call again. Now the call stands, its tokens are counted, and the lift is written later."""
    # GIVEN what a fault-free run of the chunk calls and counts, with the same daily quota and no hold
    plain = FakeWorld()
    _, plain_msg = one_chunk_job(plain)
    plain_model = ScriptedModel()
    assert _worker(plain, plain_model).handle(plain_msg, _delivery()).action == "done"
    plain_record = plain.claims.for_job(plain_msg.job_id)[0]
    # AND a world whose ledger is full: the chunk is held, and the next hour its first call is the probe
    world = FakeWorld()
    job_id, msg = one_chunk_job(world)
    _full(world)
    model = ScriptedModel()
    worker = _worker(world, model)
    assert worker.handle(msg, _delivery()).detail["reason"] == DAILY_QUOTA_CODE
    world.clock.advance(world.settings.profile.quota.daily_ledger_bucket_s)
    # WHEN the probe answers and the ledger write that lifts the hold fails (once)
    real_lift = world.token_ledger.lift
    failed: list[int] = []

    def lift(model_id: str, hour: int) -> None:
        if not failed:
            failed.append(hour)
            raise ReviewError.of("aws.throttled", "the ledger's table throttled the write", step="daily_quota")
        real_lift(model_id, hour)

    world.token_ledger.lift = lift  # type: ignore[method-assign]  # one call of the repository wrapped
    (fresh,) = world.queues.drain(Queue.ANALYSIS)
    done = worker.handle(msg.model_validate_json(fresh.body), _delivery())
    # THEN the chunk completes with exactly the calls of the fault-free run (the probe was not made again)
    assert failed and done.action == "done", done
    assert model.calls == plain_model.calls
    # AND the probe's tokens are on the chunk and in the ledger, and the lift was written after all
    record = world.claims.get(job_id, msg.chunk_id)
    assert record is not None
    assert (record.input_tokens, record.output_tokens) == (plain_record.input_tokens, plain_record.output_tokens)
    hour = failed[0]
    bucket = int(plain.clock() // plain.settings.profile.quota.daily_ledger_bucket_s)
    assert world.token_ledger.counters[(ScriptedModel.model_id, hour)] == \
        plain.token_ledger.counters[(ScriptedModel.model_id, bucket)]
    assert world.token_ledger.control[ScriptedModel.model_id] == {"since_hour": hour}
