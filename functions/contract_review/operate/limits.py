"""Spend limits (docs/cost.md "Spend limits"; profile `limits`): what one Job API principal may admit and ask.
Used by the Job API only (`operate/submission.py`, `operate/api.py`); the charge ids, and the money spent outside any
admission, are the spend cap's (`domain/spend_cap.py`: `spend_charge_id`, `admission_id`, `add_spend`).

- A principal's daily spend: each admission takes its estimate (`admission.estimate`, the same figure its
  budget is checked against) from the principal's allowance of the UTC day (`principal_daily_spend_usd`), in one
  conditional write: a submission that would go over is refused before it is queued (`quota.spend_exceeded`,
  HTTP 429 with Retry-After until the next UTC day). The allowance counts admissions at their estimates, not
  the cost the jobs later record: the estimate is deliberately high, so the cap holds whatever the jobs do.
  It is taken under a charge id, the job it admits (`spend_cap.spend_charge_id`: the job id; for a replacement of a job
  that failed on its input, the job id and the version it replaces): a replay of the same submission, or a
  client's retry of one whose admission failed half-way, takes nothing again; an admission that fails after
  taking gives it back (`spend_cap.give_back`); a replacement under a failed job's key is a new admission, charged.
- A principal's request rate: every Job API request counts against `api_requests_per_minute` for its
  principal, in the function (an HTTP API has no per-client throttling or usage plans): over it, `api.rate_limited`
  (HTTP 429, Retry-After until the next minute).

Both are counters of the token ledger table (`TokenLedger.take`), keyed by the principal's owner hash, never its
ARN; a stack without that table (from before it) enforces neither. Queue senders have no principal: their jobs
get the default budget and the stack-wide daily cap (domain/spend_cap.py), which every admission takes from.
"""

from __future__ import annotations

import math
from decimal import Decimal

from contract_review.domain import cost
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Charge, Deps, Taken
from contract_review.domain.principals import owner
from contract_review.domain.spend_cap import day_charge, seconds_to_reset

MINUTE_S = 60


def take_spend(deps: Deps, principal: str, estimate_micro_usd: int, charge_id: str) -> Charge | None:
    """Take an admission's estimate from `principal`'s allowance of today, once per `charge_id`
    (`spend_cap.spend_charge_id`); `quota.spend_exceeded` if over. What this call took (to give back if the admission then
    fails), None when it took nothing: no cap, or taken before under that id (a replay, a client's retry)."""
    cap = deps.settings.profile.limits.principal_daily_spend_usd
    if cap is None or deps.token_ledger is None:
        return None
    now = deps.clock()
    limit = cost.micro_usd(Decimal(str(cap)))
    charge = day_charge(deps, charge_id, f"spend#{owner(principal)}", estimate_micro_usd, now)
    taken = deps.token_ledger.take_once(charge, limit, int(now))
    if taken is Taken.REFUSED:
        raise ReviewError.of(
            "quota.spend_exceeded",
            f"this submission's estimate, {cost.format_usd(estimate_micro_usd)}, would take your admissions today "
            f"over the daily cap of {cost.format_usd(limit)} per principal: send it after 00:00 UTC (in "
            f"{seconds_to_reset(now)} s), or ask the stack's operator to raise "
            "principal_daily_spend_usd", step="admission", retry_after_s=seconds_to_reset(now))
    return charge if taken is Taken.NOW else None


def request_wait(deps: Deps, principal: str) -> int | None:
    """Count one request of `principal`: None when within its rate, else the seconds until the next minute."""
    limit = deps.settings.profile.limits.api_requests_per_minute
    if limit is None or deps.token_ledger is None:
        return None
    now = deps.clock()
    minute = int(now // MINUTE_S)
    if deps.token_ledger.take(f"requests#{owner(principal)}", minute, 1, limit, (minute + 2) * MINUTE_S) is not None:
        return None
    return max(1, math.ceil((minute + 1) * MINUTE_S - now))
