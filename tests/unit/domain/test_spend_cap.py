"""The stack's daily spend cap when its setting changes under held work, and its edges (domain/spend_cap.py): a cap
turned off or raised by a redeploy lets held work go at the next sweep; a job that could never fit is refused for
good; a cancel racing the sweeper's start gives its charge back; the oldest held job goes first."""

from __future__ import annotations

import json
from dataclasses import replace

from contract_review.domain import spend_cap
from contract_review.domain.ports import Deps
from contract_review.domain.records import JobState, job_id_for
from contract_review.pipeline import admission, intake, sweeper

from ...texts import TEXT
from ..inprocess import InProcess
from ..scenarios import small_chunk_world

ESTIMATE = admission.estimate(small_chunk_world().settings, TEXT).model_micro_usd  # one TEXT, as these worlds cut it


def _with_cap(deps: Deps, cap_usd: float | None) -> Deps:
    """`deps` as a redeploy with `-c daily_spend_cap_usd` leaves the functions: the same stores, the new cap."""
    return replace(deps, settings=deps.settings.model_copy(update={
        "profile": deps.settings.profile.with_overrides(daily_spend_cap_usd=cap_usd)}))


def _send(run: InProcess, key: str, text: str = TEXT) -> str:
    run.send({"text": text}, key=key)
    run.intake()
    return job_id_for(key)


def _held(run: InProcess, job_id: str) -> bool:
    job = run.world.jobs.get(job_id)
    return job is not None and job.state is JobState.QUEUED and job.waiting is not None


def test_a_cap_turned_off_or_raised_lets_the_held_work_go_at_the_next_sweep() -> None:
    world = small_chunk_world(daily_spend_cap_usd=1.5 * ESTIMATE / 1e6)  # room for one such job a day
    run = InProcess(world)
    first, held = _send(run, "first"), _send(run, "second", TEXT.replace("New York", "Ohio"))
    assert not _held(run, first) and _held(run, held)
    # the day's recorded spend reaches the cap: the model is held
    day = spend_cap.utc_day(world.clock())
    world.token_ledger.take(spend_cap.RECORDED_COUNTER, day, 10**12, spend_cap.UNCAPPED, 0)
    sweeper.sweep(world.deps)
    assert world.model_control.get().spend_held(day) is not None and _held(run, held)
    # WHEN a redeploy raises the cap above the recorded spend THEN the next sweep lifts the hold (the job still waits:
    # its admission is still over the raised cap's allowance)
    sweeper.sweep(_with_cap(world.deps, 10**12 / 1e6 * 2))
    assert world.model_control.get().spend_held(day) is None
    # WHEN a redeploy turns the cap off THEN the next sweep starts the held job, and it completes
    off = _with_cap(world.deps, None)
    world.clock.advance(60)  # the next sweep
    report = sweeper.sweep(off)
    assert report.spend_cap_started == [held] and not _held(run, held)
    run.world.deps = off
    assert run.run(held).state is JobState.COMPLETED


def test_a_job_whose_estimate_alone_is_over_the_cap_is_refused_for_good_and_replaced_once_it_fits() -> None:
    world = small_chunk_world(daily_spend_cap_usd=0.5 * ESTIMATE / 1e6)
    run = InProcess(world)
    job_id = _send(run, "too-big")
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "quota.spend_cap", job
    assert job.error is not None and "could never start" in job.error.message and job.replaceable
    # the same key, once the cap is raised: the failed job is replaced and runs
    run.world.deps = _with_cap(world.deps, 2 * ESTIMATE / 1e6)
    _send(run, "too-big")
    assert run.run(job_id).state is JobState.COMPLETED


def test_a_cancel_racing_the_sweepers_start_gives_the_charge_back() -> None:
    world = small_chunk_world(daily_spend_cap_usd=1.5 * ESTIMATE / 1e6)
    run = InProcess(world)
    _send(run, "first")
    held = _send(run, "second", TEXT.replace("New York", "Ohio"))
    job = world.jobs.get(held)
    assert job is not None and _held(run, held)
    # the next day: the sweeper read the job, then a cancel landed before its move
    world.clock.advance(86400)
    from contract_review.domain import lifecycle

    lifecycle.request_cancel(world.deps, held, by="ops")
    assert intake.start_held(world.deps, job) == "skipped"
    day = spend_cap.utc_day(world.clock())
    assert world.token_ledger.count(spend_cap.ADMITTED_COUNTER, day) == 0  # given back: not admitted
    assert world.claims.for_job(held) == []


def test_the_oldest_held_job_goes_first_and_the_first_refusal_ends_the_sweeps_try() -> None:
    world = small_chunk_world(daily_spend_cap_usd=2.5 * ESTIMATE / 1e6)
    run = InProcess(world)
    double = "\n\n".join([TEXT, TEXT.replace("New York", "Utah")])  # about twice the estimate
    _send(run, "first", double)
    big = _send(run, "big", double.replace("Utah", "Maine"))
    small = _send(run, "small", TEXT.replace("New York", "Ohio"))
    tiny = _send(run, "tiny", TEXT.replace("New York", "Iowa"))
    assert _held(run, big) and _held(run, small) and _held(run, tiny)
    attempts: list[str] = []
    real = world.token_ledger.take_once

    def counted(charge, limit, now):  # noqa: ANN001  # TokenLedger.take_once
        attempts.append(charge.charge_id)
        return real(charge, limit, now)

    world.token_ledger.take_once = counted  # type: ignore[method-assign]
    world.clock.advance(86400)  # the next day: the big one (oldest) fits; then the small one is over: it waits
    report = sweeper.sweep(world.deps)
    assert report.spend_cap_started == [big] and _held(run, small) and _held(run, tiny)
    # tried oldest first; the small one's refusal ends the step: the tiny one is not tried (no refused write a minute)
    assert attempts == [f"stack#{big}", f"stack#{small}"]
    assert json.dumps(report.item_failures) == "[]"
