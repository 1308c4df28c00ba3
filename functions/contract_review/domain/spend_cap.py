"""The stack-wide daily spend cap (docs/cost.md "The stack's daily spend cap"; profile `limits.daily_spend_cap_usd`,
`-c daily_spend_cap_usd=N|none`): what the whole stack may spend on the model in a UTC day, whoever sends the work.

Two counters of the token ledger table (`TokenLedger`), per UTC day:
- **admitted** (ADMITTED_COUNTER): every admission takes its job's estimate (the figure its budget is checked against)
  under the charge id `stack#<job>` (`charge_id`), in one conditional write (`admit`): whatever way the job came in
  (the Job API, `review submit`, a message sent to the intake queue), the same job is taken once. Over the cap, the
  Job API answers 429 with the reset time (`quota.spend_cap`, nothing queued); intake keeps the job `queued`, waiting
  with condition `spend_cap` (`held`), never failed, and the sweeper admits it on the next UTC day (or at once after
  `review quota resume --override-cap`).
- **recorded** (RECORDED_COUNTER): what the jobs' chunks really cost, added as each chunk is counted on its job
  (`record`, from `lifecycle.count_settled`: after the count, so a process that dies between the two leaves at most
  that chunk's cost out of this counter, never in twice). Admissions count estimates (deliberately high), so the
  recorded cost of the day's own admissions stays under the cap; it reaches the cap when work admitted earlier
  (yesterday's jobs, retries and redrives, batch answers nobody took) spends today. Then the sweeper sets the
  spend-cap hold in the runtime control (`hold_if_reached`; `ModelControl.spend_hold`): no model call starts (chunks
  held as backpressure, `model.spend_capped`, never failed) until the next UTC day, or until an operator lifts the
  cap for the rest of the day (`review quota resume --override-cap`: `ModelControl.cap_override_day`, which also
  admits without a cap that day).

A stack without the token ledger or control table (from before them) enforces neither, as for the other limits.
"""

from __future__ import annotations

import math
from decimal import Decimal

from contract_review.domain import cost
from contract_review.domain.control_records import ModelControl, SpendHold
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Charge, Deps, Taken
from contract_review.domain.principals import owner
from contract_review.domain.records import Job, Waiting

DAY_S = 86400
UNCAPPED = 2**62  # the limit of a count that is taken whatever it reaches (money already spent)
ADMITTED_COUNTER = "stackspend#admitted"
RECORDED_COUNTER = "stackspend#recorded"
CONDITION = "spend_cap"  # the waiting condition of a job held at admission (Job.waiting.condition)


def utc_day(now: float) -> int:
    return int(now // DAY_S)


def seconds_to_reset(now: float) -> int:
    """Until 00:00 UTC, when the day's counters start again."""
    return max(1, math.ceil((utc_day(now) + 1) * DAY_S - now))


def cap_micro_usd(deps: Deps) -> int | None:
    """The cap in micro-dollars; None: no cap (`none`), or no ledger to count it in."""
    if deps.token_ledger is None:
        return None
    cap = deps.settings.profile.limits.daily_spend_cap_usd
    return None if cap is None else cost.micro_usd(Decimal(str(cap)))


def control(deps: Deps) -> ModelControl | None:
    return deps.model_control.get() if deps.model_control is not None else None


def lifted_today(deps: Deps, now: float) -> bool:
    """An operator lifted the cap for this UTC day (`review quota resume --override-cap`)."""
    c = control(deps)
    return c is not None and c.cap_override_day == utc_day(now)


def charge_id(admission_id: str) -> str:
    """The stack's charge of one admission (`spend_charge_id`: the job, or a replacement of a failed one)."""
    return f"stack#{admission_id}"


def never_fits(deps: Deps, estimate_micro_usd: int | None) -> ReviewError | None:
    """A job whose estimate alone is over the cap: it could never start under it, whatever the day. Refused at
    admission for good (`quota.spend_cap` without a retry time: the API's 422, intake's failed job), not held."""
    cap = cap_micro_usd(deps)
    if cap is None or estimate_micro_usd is None or estimate_micro_usd <= cap:
        return None
    return ReviewError.of(
        "quota.spend_cap",
        f"this job's estimate alone, {cost.format_usd(estimate_micro_usd)}, is over the stack's daily spend cap of "
        f"{cost.format_usd(cap)} (daily_spend_cap_usd): it could never start under it; split the document, or have "
        "the operator raise the cap (`npx cdk deploy -c daily_spend_cap_usd=<usd>`), then send it again",
        step="admission")


def admit(deps: Deps, estimate_micro_usd: int | None, admission_id: str) -> Charge | None:
    """Take the admission's estimate from the stack's allowance of today, once per admission; `quota.spend_cap` when
    it would go over the cap (nothing taken). What this call took (to give back if the admission then fails), None
    when it took nothing: no cap, no estimate, or taken before (a replay, the API's admission seen again by intake)."""
    cap = cap_micro_usd(deps)
    if cap is None or estimate_micro_usd is None:
        return None
    now = deps.clock()
    charge = day_charge(deps, charge_id(admission_id), ADMITTED_COUNTER, estimate_micro_usd, now)
    assert deps.token_ledger is not None  # cap_micro_usd said so
    taken = deps.token_ledger.take_once(charge, cap, int(now))
    if taken is Taken.REFUSED and lifted_today(deps, now):  # the control is read only when the cap would refuse
        taken = deps.token_ledger.take_once(charge, UNCAPPED, int(now))
    if taken is Taken.REFUSED:
        raise ReviewError.of(
            "quota.spend_cap",
            f"this job's estimate, {cost.format_usd(estimate_micro_usd)}, would take the stack's admissions today "
            f"over its daily spend cap of {cost.format_usd(cap)} (daily_spend_cap_usd): it can start after 00:00 "
            f"UTC (in {seconds_to_reset(now)} s), or when the operator lifts the cap for today "
            "(`review quota resume --override-cap`)", step="admission", retry_after_s=seconds_to_reset(now))
    return charge if taken is Taken.NOW else None


def day_charge(deps: Deps, charge_id_: str, counter: str, amount: int, now: float) -> Charge:
    """A charge on `counter`'s count of the UTC day of `now` (this cap's, a principal's: operate/limits.py). Its
    record outlives the day's counter by the record TTL: a replay days later takes nothing either."""
    day = utc_day(now)
    return Charge(charge_id_, counter, day, amount, (day + 2) * DAY_S + deps.settings.profile.record_ttl_s)


def give_back(deps: Deps, charge: Charge | None) -> None:
    """An admission that took `charge` (this cap's, a principal's) failed before its job could exist (the submission
    record or the intake message not written): the allowance gets it back (once), so the client's retry takes it
    again, once."""
    if charge is not None and deps.token_ledger is not None:
        deps.token_ledger.give_back(charge)


def held(exc: ReviewError, since: float) -> Waiting:
    """The waiting condition of a job intake holds for the cap (`exc`: the `quota.spend_cap` refusal)."""
    return Waiting(condition=CONDITION, since=since, detail=exc.envelope.message)


def record(deps: Deps, spent_micro_usd: int) -> None:
    """Add what a counted chunk spent to today's recorded cost (an atomic ADD; whatever the cap: it is spent). A chunk
    uncounted and counted again (a redrive, a retry) adds its record's whole spend again: the recorded spend errs
    high, toward holding sooner, never low."""
    if cap_micro_usd(deps) is None or spent_micro_usd <= 0:
        return
    now = deps.clock()
    day = utc_day(now)
    assert deps.token_ledger is not None
    deps.token_ledger.take(RECORDED_COUNTER, day, spent_micro_usd, UNCAPPED,
                           (day + 2) * DAY_S + deps.settings.profile.record_ttl_s)


def record_once(deps: Deps, spent_micro_usd: int, charge_id_: str) -> None:
    """`record`, once per `charge_id_` (a retried batch collect adds nothing again): spend outside any chunk's count,
    a batch job's answers nobody took (`batch.unused`)."""
    if cap_micro_usd(deps) is None or spent_micro_usd <= 0:
        return
    now = deps.clock()
    assert deps.token_ledger is not None
    deps.token_ledger.take_once(day_charge(deps, f"recorded#{charge_id_}", RECORDED_COUNTER, spent_micro_usd, now),
                                UNCAPPED, int(now))


def today(deps: Deps) -> tuple[int, int]:
    """Today's (admitted, recorded) micro-dollars (0, 0 without a ledger)."""
    if deps.token_ledger is None:
        return 0, 0
    day = utc_day(deps.clock())
    return deps.token_ledger.count(ADMITTED_COUNTER, day), deps.token_ledger.count(RECORDED_COUNTER, day)


def hold_if_reached(deps: Deps, recorded_micro_usd: int) -> SpendHold | None:
    """The sweeper's check: when today's recorded cost has reached the cap, the spend-cap hold in the runtime control
    (compare-and-set: written once a day, whoever checks; never over an operator's override of today). The hold in
    force now, None when none is."""
    cap = cap_micro_usd(deps)
    if deps.model_control is None:
        return None
    now = deps.clock()
    day = utc_day(now)
    current = deps.model_control.get()
    held = current.spend_held(day)
    if held is not None and (cap is None or recorded_micro_usd < cap):  # a redeploy raised the cap, or turned it off
        return deps.model_control.update(lambda c: c.model_copy(update={"spend_hold": None})).spend_held(day)
    if cap is None or held is not None or current.cap_override_day == day or recorded_micro_usd < cap:
        return held
    hold = SpendHold(day=day, at=now, recorded_micro_usd=recorded_micro_usd, cap_micro_usd=cap)

    def change(c: ModelControl) -> ModelControl:
        if c.cap_override_day == day or c.spend_held(day) is not None:
            return c
        return c.model_copy(update={"spend_hold": hold})

    return deps.model_control.update(change).spend_held(day)


def not_held(deps: Deps, at_step: str) -> None:
    """Before every model call (the worker): `model.spend_capped` while the stack's spend-cap hold of today is on."""
    c = control(deps) if cap_micro_usd(deps) is not None else None  # a cap turned off holds nothing (from its deploy)
    hold = c.spend_held(utc_day(deps.clock())) if c is not None else None
    if hold is not None:
        raise ReviewError.of("model.spend_capped", hold_line(hold), step=at_step)


def hold_line(hold: SpendHold) -> str:
    return (f"the stack's recorded model spend today, {cost.format_usd(hold.recorded_micro_usd)}, reached its daily "
            f"spend cap of {cost.format_usd(hold.cap_micro_usd)} (daily_spend_cap_usd): model calls are held until "
            "00:00 UTC, or `review quota resume --override-cap` lifts the cap for the rest of today")


# ------------------------------------------------------------------------------ admissions' charge ids; money spent outside one
def spend_charge_id(job_id: str, replacing: Job | None = None) -> str:
    """The admission a charge is for: a new job (its id), or the replacement of `replacing`, a job that failed on
    its input (its id and the version replaced: each replacement is an admission of its own)."""
    return job_id if replacing is None else f"{job_id}#replaces-v{replacing.version}"


def admission_id(job: Job) -> str:
    """The admission that created `job`, as the Job API named its charge (`spend_charge_id`): a replacement (created
    over a job that failed on its input, one version on) is the admission that replaced that version."""
    return job.job_id if job.version == 0 else f"{job.job_id}#replaces-v{job.version - 1}"


def add_spend(deps: Deps, principal: str | None, spent_micro_usd: int, charge_id_: str) -> None:
    """Count money already spent outside any admission (a batch job's answers nobody took: `batch.unused`) toward
    `principal`'s allowance of today, whatever the cap (it is spent): later submissions have that much less. Once per
    `charge_id` (`unused_charge_id`): a retried collect adds nothing again."""
    cap = deps.settings.profile.limits.principal_daily_spend_usd
    if principal is None or cap is None or deps.token_ledger is None or spent_micro_usd <= 0:
        return
    now = deps.clock()
    deps.token_ledger.take_once(day_charge(deps, charge_id_, f"spend#{owner(principal)}", spent_micro_usd, now),
                                UNCAPPED, int(now))


def unused_charge_id(token: str, job_id: str) -> str:
    """The charge of batch job `token`'s answers nobody took, on job `job_id` (`add_spend`)."""
    return f"unused#{token}#{job_id}"
