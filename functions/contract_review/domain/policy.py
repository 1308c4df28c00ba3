"""The recovery policy: one row per error code, beside the registry (errors.py), read by everything that
decides what a failure does next. Changing one code's behaviour is changing its row.

- `tier1`: which tier-1 retry policy retries it inside the process (`Tier1`; None: never retried there).
  The numbers (attempts, base, cap) are the profile's (`tier1_policy`), so prod and local differ only there.
- `handling`: what a chunk attempt that ends with it does (`Handling`): backpressure (requeued, no failure
  counted, bounded by the backpressure deadline), a handoff (out of time: requeued; a failure only when the
  attempt saw errors and checkpointed nothing), a failed attempt (tier 2: the queue's redelivery, then the
  poison budget and the DLQ), a permanent failure of the chunk, or a stop (someone else owns the work).
- `trips_breaker`: counts as a failed call towards the model's circuit breaker (model/breaker.py).
- `slows`: the quota a throttle with this code slows down (model/pacing.py); None for every other code.
- `bounded`: backpressure for this cause ends at the backpressure deadline (not for an operator's pause, nor for
  the daily token quota: a hold, whose release does not count towards the chunk's backpressure streak).
- `again`: tried again later outside the worker's tiers (by its caller, the sweeper, the batch collector).

A code's retryability is its row's (`Recovery.retryable`: tier 1 retries it, its attempt is tried again, or someone
tries it again); the registry (errors.py) derives the envelope's `retryable` from it, so it is written once and stays
on the wire. The class and job-fatality of a code stay in the registry. What a chunk attempt that ended with an error
does next is `decide`: a pure function of the envelope and the attempt's progress, read from these rows only.
This module imports nothing of the registry (errors.py imports it); `docs/error-codes.md` is generated from both
(`python -m contract_review.domain.policy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from contract_review.config.profile import Profile, RetryPolicy


class Coded(Protocol):
    """What the policy reads of an error envelope (errors.ErrorEnvelope): its code and the code behind it."""

    @property
    def error_code(self) -> str: ...

    @property
    def cause_code(self) -> str | None: ...


class Tier1(StrEnum):
    MODEL = "model"  # a model call: Profile.tier1.model_retry
    BOTOCORE = "botocore"  # an AWS call: botocore's standard retry mode (wiring.aws_client_config), not ours
    SIDE_EFFECT = "side_effect"  # a side-effect step call: tool_retry's backoff, side_effect_attempts
    COMPENSATION = "compensation"  # a compensation call: tool_retry's backoff, compensation_attempts


class Handling(StrEnum):
    BACKPRESSURE = "backpressure"  # requeued with a delay; no failure, no receive burned
    HANDOFF = "handoff"  # out of time: requeued at once, checkpoints kept; a failure only after errors
    FAILURE = "failure"  # a failed attempt: tier 2 (redelivery after a backoff), then the DLQ
    PERMANENT = "permanent"  # the chunk (or the job, when job-fatal) fails at once
    STOP = "stop"  # not ours to finish (lease lost, cancelled): stop work, no failure
    NONE = "none"  # not a chunk outcome (intake, the job, side effects, the API)


class Quota(StrEnum):
    MODEL = "model"  # the model's account quota: the pacer whose quota the throttle names slows


@dataclass(frozen=True)
class Recovery:
    tier1: Tier1 | None
    handling: Handling
    trips_breaker: bool = False
    slows: Quota | None = None
    bounded: bool = True  # backpressure for this cause ends at the backpressure deadline (False: a hold, which waits
    # for an operator or a quota and is released as `held`, outside the chunk's backpressure streak)
    again: bool = False  # tried again later outside the worker's tiers: by its caller, the sweeper, the collector
    falls_back: bool = False  # the model is unavailable to this account: a job moves to its deploy's next model

    @property
    def retryable(self) -> bool:
        """A later try may succeed (the envelope's `retryable`): tier 1 retries it, a chunk attempt that ends with it
        is tried again (a failed attempt, a handoff), or someone tries it again (`again`)."""
        return self.tier1 is not None or self.handling in (Handling.FAILURE, Handling.HANDOFF) or self.again


M, A, FX, COMP = Tier1.MODEL, Tier1.BOTOCORE, Tier1.SIDE_EFFECT, Tier1.COMPENSATION
BOTOCORE_ATTEMPTS = 5  # wiring.aws_client_config: standard mode, total_max_attempts
BP, HANDOFF, FAIL, PERM, STOP, NONE = (Handling.BACKPRESSURE, Handling.HANDOFF, Handling.FAILURE, Handling.PERMANENT,
                                       Handling.STOP, Handling.NONE)

POLICY: dict[str, Recovery] = {
    #  code                              tier 1  outcome  breaker  quota it slows
    "model.throttled": Recovery(M, BP, slows=Quota.MODEL),
    "model.unavailable": Recovery(M, FAIL, trips_breaker=True),
    "model.timeout": Recovery(M, FAIL, trips_breaker=True),
    "model.output_invalid": Recovery(None, PERM),  # one repair attempt (semantic), then permanent for the analyst
    "model.refused": Recovery(None, PERM),
    "model.access_denied": Recovery(None, PERM, falls_back=True),
    "model.not_found": Recovery(None, PERM, falls_back=True),
    "model.id_rejected": Recovery(None, PERM, falls_back=True),
    "model.not_granted": Recovery(None, PERM),
    "model.not_catalogued": Recovery(None, NONE),  # refused before anything is written (`review model use`)
    "model.request_invalid": Recovery(None, PERM),
    "model.circuit_open": Recovery(None, BP),
    "model.paused": Recovery(None, BP, bounded=False),
    "model.spend_capped": Recovery(None, BP, bounded=False),  # held until 00:00 UTC or an operator's override
    "model.switched": Recovery(None, BP, bounded=False),  # requeued at once on the job's next model
    "model.daily_quota_exhausted": Recovery(None, BP, bounded=False),  # held until the hourly probe succeeds
    "control.contended": Recovery(None, NONE, again=True),  # an answer to the writer (the CLI, the collector): write again
    "batch.request_invalid": Recovery(None, NONE),  # refused before anything is submitted
    "batch.job_failed": Recovery(None, NONE, again=True),  # not a chunk outcome: the collector re-batches its chunks (batch.py)
    "batch.record_failed": Recovery(None, NONE, again=True),  # likewise, per record
    "batch.refused": Recovery(None, NONE),  # not a chunk outcome: the collector sends the chunks on demand
    "input.invalid": Recovery(None, NONE),
    "input.empty_document": Recovery(None, NONE),
    "input.undecodable": Recovery(None, NONE),
    "input.document_missing": Recovery(None, NONE),
    "input.document_forbidden": Recovery(None, NONE),
    "input.too_large": Recovery(None, NONE),
    "input.key_conflict": Recovery(None, NONE),
    "aws.throttled": Recovery(A, BP),
    "aws.unavailable": Recovery(A, FAIL),
    "aws.access_denied": Recovery(None, PERM),
    "aws.client_error": Recovery(None, PERM),
    "runtime.lease_lost": Recovery(None, STOP),
    "runtime.worker_lost": Recovery(None, FAIL),
    "runtime.retry_budget_exhausted": Recovery(None, FAIL),  # backpressure when its cause_code's row is
    "runtime.checkpoint_missing": Recovery(None, NONE),  # the analyst is re-run
    "runtime.time_exhausted": Recovery(None, HANDOFF),
    "runtime.backpressure_exhausted": Recovery(None, PERM),
    "runtime.dead_lettered": Recovery(None, PERM),
    "runtime.receives_exhausted": Recovery(None, BP, again=True),
    "runtime.intake_exhausted": Recovery(None, NONE, again=True),
    "runtime.internal": Recovery(None, PERM),
    "job.chunks_missing": Recovery(None, NONE),
    "job.cancelled": Recovery(None, STOP),
    "job.budget_exceeded": Recovery(None, STOP),
    "job.budget_insufficient": Recovery(None, NONE),  # refused before the job runs: not a chunk outcome
    "sideeffect.failed": Recovery(FX, NONE),
    "sideeffect.unauthorized": Recovery(None, NONE),  # a refused credential: the adapter re-reads the secret once
    "sideeffect.ambiguous": Recovery(None, NONE),
    "sideeffect.compensation_failed": Recovery(COMP, NONE),
    "job.approval_rejected": Recovery(None, NONE),
    "job.approval_expired": Recovery(None, NONE),
    "quota.spend_exceeded": Recovery(None, NONE),  # refused at admission: no job, no chunk outcome
    "quota.spend_cap": Recovery(None, NONE),  # refused (API) or held `queued` (intake) at admission
    "api.unauthenticated": Recovery(None, NONE),
    "api.not_found": Recovery(None, NONE),
    "api.conflict": Recovery(None, NONE),
    "api.rate_limited": Recovery(None, NONE, again=True),  # an answer to a request: the caller sends it again after Retry-After
    "api.invalid_request": Recovery(None, NONE),
}


def recovery(code: str) -> Recovery:
    return POLICY[code]


def tier1_policy(profile: Profile, kind: Tier1) -> RetryPolicy:
    """The attempts and backoff of one kind of tier-1 retry, from the profile."""
    if kind is Tier1.MODEL:
        return profile.tier1.model_retry
    if kind is Tier1.BOTOCORE:
        raise ValueError("botocore retries AWS calls itself (standard mode); no profile policy applies")
    attempts = profile.side_effects.side_effect_attempts if kind is Tier1.SIDE_EFFECT else profile.side_effects.compensation_attempts
    return profile.tier1.tool_retry.model_copy(update={"max_attempts": attempts})


def retried_in_tier1(env: Coded) -> bool:
    """Whether the model-call retrier (reliability/retry.py) retries it: a model call's transient failure."""
    return POLICY[env.error_code].tier1 is Tier1.MODEL


def is_backpressure(env: Coded) -> bool:
    """Requeue, not failure: the code's outcome is backpressure or a handoff, or it wraps a backpressure
    cause (tier 1's budget spent on throttles). The worker decides when a handoff after errors counts."""
    if POLICY[env.error_code].handling in (BP, HANDOFF):
        return True
    return env.cause_code is not None and POLICY[env.cause_code].handling is BP


def bounded_by_deadline(env: Coded) -> bool:
    """Whether backpressure for this cause is dead-lettered once it lasts the backpressure deadline."""
    return POLICY[env.error_code].bounded


def counts_as_error(code: str | None) -> bool:
    """An error behind a handoff that makes it a failed attempt (not backpressure)."""
    return bool(code) and POLICY[code or ""].handling is not BP


class Next(StrEnum):
    """What a chunk attempt that ended with an error does next (the worker carries it out)."""

    REQUEUE = "requeue"  # backpressure: released without a failure, sent again after a delay
    REQUEUE_AT_ONCE = "requeue_at_once"  # a clean handoff (progress, no error behind it): sent again at once
    RETRY = "retry"  # a failed attempt: tier 2 (the queue's redelivery after a backoff), then the DLQ
    FAIL = "fail"  # the chunk fails at once (the job too, when the code is job-fatal)
    STOP = "stop"  # not ours to finish: the attempt stops, writes nothing and counts no failure


@dataclass(frozen=True)
class Decision:
    next: Next
    cause_code: str | None = None  # a handoff that counts as a failed attempt: the error it counts as


def decide(env: Coded, *, progressed: bool, retried: Iterable[str] = ()) -> Decision:
    """What a chunk attempt that ended with `env` does next, from the rows only. `progressed`: the attempt
    checkpointed something; `retried`: the codes tier 1 retried during it.
    - a handoff (out of time) is requeued, at once when the attempt progressed and no error drove it; only when
      errors (not throttles) ate the time and nothing was saved is it a failed attempt, counted as the first error;
    - backpressure (the code's, or its cause's: a retry budget spent on throttles) is requeued after a delay;
    - then the code's handling: a failure is retried (tier 2), a permanent error fails, a stop stops;
    - a code that is not a chunk outcome (`NONE`) but ended one anyway: retried when its row says a later try may
      succeed, else failed."""
    row = POLICY[env.error_code]
    if row.handling is HANDOFF:
        errors = [c for c in (env.cause_code, *retried) if counts_as_error(c)]
        if errors and not progressed:
            return Decision(Next.RETRY, cause_code=env.cause_code or errors[0])
        return Decision(Next.REQUEUE_AT_ONCE if progressed and env.cause_code is None else Next.REQUEUE)
    if is_backpressure(env):
        return Decision(Next.REQUEUE)
    by_handling = {FAIL: Next.RETRY, PERM: Next.FAIL, STOP: Next.STOP}
    return Decision(by_handling.get(row.handling) or (Next.RETRY if row.retryable else Next.FAIL))


def trips_breaker(code: str) -> bool:
    return POLICY[code].trips_breaker


def slows_model_quota(code: str) -> bool:
    return POLICY[code].slows is Quota.MODEL


def falls_back(env: Coded) -> bool:
    """The model is unavailable to this account (the code's row, or its cause's): a job moves to its next model."""
    return POLICY[env.error_code].falls_back or (env.cause_code is not None and POLICY[env.cause_code].falls_back)


def _cell(value: object) -> str:
    return "-" if value is None or value is False else ("yes" if value is True else str(value))


class CodeDoc(Protocol):
    """What the generated document shows of a registered code (errors.ErrorCode)."""

    @property
    def cls(self) -> StrEnum: ...

    @property
    def retryable(self) -> bool: ...

    @property
    def job_fatal(self) -> bool: ...

    @property
    def cause(self) -> str: ...

    @property
    def recovery(self) -> str: ...


def render_markdown(profile: Profile, registry: Mapping[str, CodeDoc]) -> str:
    """docs/error-codes.md: the registry's codes (errors.REGISTRY, given: errors.py imports this module) with their rows."""
    lines = [
        "# Error codes",
        "",
        "Generated from the registry (`functions/contract_review/domain/errors.py`) and the recovery policy "
        "(`functions/contract_review/domain/policy.py`) by "
        "`python -m contract_review.domain.policy > docs/error-codes.md`. Do not edit by hand.",
        "",
        "Every failure is stored as an envelope: `error_code`, `error_class`, `retryable`, "
        "`retry_after_s`, `http_status`, `provider_code`, `message`, `step`, `attempt`, `cause_code` "
        "(the error behind a wrapper code such as `runtime.retry_budget_exhausted`), timestamps.",
        "",
        f"Tier 1 in the `{profile.name}` profile: "
        + "; ".join(f"`{k.value}` {p.max_attempts} attempts, full jitter {p.base_s:g}-{p.cap_s:g} s"
                    for k, p in ((k, tier1_policy(profile, k)) for k in Tier1 if k is not Tier1.BOTOCORE))
        + f"; `botocore` {BOTOCORE_ATTEMPTS} attempts in botocore's standard retry mode (its own backoff). "
        "Handling: what a chunk attempt ending with the code does (backpressure: requeued, no failure counted; "
        "handoff: requeued, a failure only after errors with nothing checkpointed; failure: tier 2, then the "
        "DLQ; permanent: fails at once; stop: the work is someone else's; none: not a chunk outcome). Falls back: "
        "the model is unavailable, and a job whose deploy has a next model in its fallback chain "
        "(`-c model_fallbacks`) moves to it (`model.switched`) instead.",
        "",
        "| code | class | retryable | tier 1 | handling | trips breaker | slows quota | falls back | job-fatal | cause | "
        "recovery |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for code, spec in registry.items():
        r = POLICY[code]
        lines.append(
            f"| `{code}` | {spec.cls.value} | {_cell(spec.retryable)} | {_cell(r.tier1 and r.tier1.value)} | "
            f"{r.handling.value} | {_cell(r.trips_breaker)} | {_cell(r.slows and r.slows.value)} | {_cell(r.falls_back)} | "
            f"{_cell(spec.job_fatal)} | {spec.cause} | {spec.recovery} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from contract_review.config.profile import get_profile
    from contract_review.domain.errors import REGISTRY

    print(render_markdown(get_profile("prod"), REGISTRY), end="")
