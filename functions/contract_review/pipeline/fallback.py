"""A job's way around a model that disappears: the deploy's fallback chain and the operator's switch.

A job runs on the model it recorded at intake (`Job.model_id`; the worker's `model_for`). It leaves that model only:
- **after a refusal that says the model is unavailable to this account**: access revoked, suspended, retired, not
  served (the recovery policy's `falls_back` rows: model.access_denied, model.not_found, model.id_rejected; decided
  from the error code, never the message text), or a hold by the model's *own* daily token quota that has lasted
  the profile's `fallback_after_daily_hold_s` (the account's quota across models is one a fallback cannot escape: the
  ledger is per model, so only a model's own hold is ever seen here). It moves to the next model of the deploy's
  chain (`Settings.model_chain`: `-c model_id`, then `-c model_fallbacks` in order) that it has not run on yet; with
  none left the error takes its course (the job fails with it);
- **when an operator switches the stack's model** (`review model use ID`, the runtime control's `model_override`): at
  its next chunk, if the deploy grants that model.

Either way the switch is one conditional write on the job (`JobsRepo.switch_model`: only while its model is still the
one the worker saw, so two workers that see the same refusal switch it once) and one `job.model_switched` event naming
both models, the reason (an error code, or `operator`) and who switched it. The chunk that saw the refusal is requeued
at once (`model.switched`, backpressure that no deadline bounds) and runs on the new model; the checkpoints its
analysts made on the earlier models are kept (`Job.earlier_models`: the analyst runner accepts a checkpoint made under
any model the job ran on), so nothing is run or billed twice. A job never switches back by itself.
"""

from __future__ import annotations

from contract_review.domain import policy
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.ports import Deps
from contract_review.domain.records import Job, JobState
from contract_review.model.daily_quota import DAILY_QUOTA_CODE

SWITCHED = "model.switched"  # the requeue's reason: the chunk goes on with the job's next model
OPERATOR = "operator"  # the reason of a switch an operator made (`review model use`)


def next_model(chain: tuple[str, ...], job: Job) -> str | None:
    """The model `job` falls back to: the first of the deploy's chain after its model that it has not run on yet; None
    when none is left, or when its model is not in the chain (no order to follow: the operator decides)."""
    if job.model_id not in chain:
        return None
    tried = set(job.earlier_models)
    return next((m for m in chain[chain.index(job.model_id) + 1:] if m not in tried), None)


def reason_to_leave(deps: Deps, job: Job, error: ErrorEnvelope) -> str | None:
    """Why `job` leaves its model after its attempt ended with `error` (the code that says so), None when it stays."""
    if policy.falls_back(error):
        return error.cause_code if error.cause_code and policy.POLICY[error.cause_code].falls_back else error.error_code
    after = deps.settings.profile.quota.fallback_after_daily_hold_s
    waiting = job.waiting
    if (error.error_code == DAILY_QUOTA_CODE and after is not None and waiting is not None
            and waiting.model_id in ("", job.model_id) and deps.clock() - waiting.since >= after):
        return DAILY_QUOTA_CODE
    return None


def after_error(deps: Deps, job: Job, error: ErrorEnvelope) -> str | None:
    """The model `job` goes on with after `error` (switched here, or by another worker that saw the same), None when it
    stays on its model (the error takes its course)."""
    reason = reason_to_leave(deps, job, error)
    to = next_model(deps.settings.model_chain, job) if reason is not None else None
    if reason is None or to is None:
        return None
    switch(deps, job, to, reason, by="worker")
    return to


def follow_operator(deps: Deps, job: Job) -> Job:
    """`job` on the model an operator switched the stack to (`review model use`), when one is set, is not the job's,
    and this deploy grants it (switched here, once); else `job` as it is."""
    if job.state is not JobState.RUNNING:  # a job being cancelled (or ended) makes no more calls: nothing to move
        return job
    override = operator_model(deps)
    if not override or override == job.model_id or not job.model_id:
        return job
    if switch(deps, job, override, OPERATOR, by=OPERATOR):
        return job.model_copy(update={"model_id": override, "earlier_models": [*job.earlier_models, job.model_id]})
    return deps.jobs.get(job.job_id) or job  # switched by another worker first: as it is now


def intake_model(deps: Deps) -> str:
    """The model a new job is taken in on: the one an operator switched the stack to (`review model use`), when this
    deploy grants it; else the deploy's."""
    return operator_model(deps) or deps.settings.effective_model_id


def operator_model(deps: Deps) -> str | None:
    """The model an operator switched the stack to (`review model use`), when this deploy grants it; None when none is
    set, or when the deploy calls one model only (then no switch can apply: the control is not read)."""
    if deps.model_control is None or len(deps.settings.model_chain) < 2:
        return None
    override = deps.model_control.get().model_override
    return override if override and deps.settings.grants(override) else None


def switch(deps: Deps, job: Job, to: str, reason: str, *, by: str) -> bool:
    """Move `job`'s calls to `to` (conditional on its model being still `job.model_id`) with a `job.model_switched`
    event; a daily-quota wait for the model it leaves ends with it. False when someone switched it first."""
    if not deps.jobs.switch_model(job.job_id, job.model_id, to):
        return False
    deps.jobs.record_event(job.job_id, "job.model_switched", from_model=job.model_id, to_model=to, reason=reason,
                           by=by, detail=f"its calls go to {to} from now on ({reason}); the checkpoints made on "
                           f"{job.model_id} are kept")
    if job.waiting is not None and job.waiting.model_id == job.model_id and deps.jobs.set_waiting(job.job_id, None):
        deps.jobs.record_event(job.job_id, "job.waiting_ended", condition=job.waiting.condition)
    return True
