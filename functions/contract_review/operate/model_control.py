"""The model's runtime control as an operator reads and changes it (`review quota ...`, the status page): a pause,
a tokens-per-minute quota, the daily spend cap's override, the batch lanes that are off; and what holds every
model call now, in words (`model_hold`)."""

from __future__ import annotations

from contract_review.config.catalogue import refused_id
from contract_review.domain import spend_cap
from contract_review.domain.control_records import BatchLaneOff, ModelControl
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Deps, ModelControls


class NoModelControl(Exception):
    """The stack has no runtime control table (deployed before it existed): redeploy it."""


def _controls(deps: Deps) -> ModelControls:
    if deps.model_control is None:
        raise NoModelControl("this stack has no runtime control (no ControlTableName output): redeploy it with this "
                             "version (`cdk deploy`, or `review up` locally)")
    return deps.model_control


def quota_show(deps: Deps) -> ModelControl:
    """`review quota show`: what the operator set (a pause, a quota) and the models whose batch lane is off; the
    workers see it within the profile's model_control_max_age_s."""
    return _controls(deps).get()


def quota_change(deps: Deps, by: str, *, paused: bool | None = None, tokens_per_minute: float | None = None,
                 clear_quota: bool = False, override_cap: bool = False) -> ModelControl:
    """`review quota pause|resume [--override-cap]|set N|set --clear`: the named fields only, compare-and-set
    (`ModelControls.update`): a pause racing a set keeps both. `override_cap`: the stack's daily spend cap lifted for
    the rest of this UTC day (its hold, and the admissions' cap: the jobs waiting for it start within a sweep)."""
    at = deps.clock()

    def change(now: ModelControl) -> ModelControl:
        return now.model_copy(update={
            "paused": now.paused if paused is None else paused,
            "tokens_per_minute": None if clear_quota else (tokens_per_minute or now.tokens_per_minute),
            "cap_override_day": spend_cap.utc_day(at) if override_cap else now.cap_override_day,
            "by": by, "at": at})

    return _controls(deps).update(change)


def batch_lane_on(deps: Deps, model_id: str) -> tuple[ModelControl, BatchLaneOff | None]:
    """`review quota batch --on`: the model's batch lane on again (its `batch_off` entry removed, the other models'
    and every other field left as they are: compare-and-set). Returns the control as it is now and the entry removed
    (None: the lane was not off; nothing is written when nothing changes)."""
    removed: list[BatchLaneOff] = []

    def change(now: ModelControl) -> ModelControl:
        removed[:] = [now.batch_off[model_id]] if model_id in now.batch_off else []
        return now.model_copy(update={"batch_off": {m: off for m, off in now.batch_off.items() if m != model_id}})

    written = _controls(deps).update(change)
    return written, removed[0] if removed else None



def model_use(deps: Deps, by: str, model_id: str) -> ModelControl:
    """`review model use ID`: the stack's model calls go to `model_id` from now on, without a redeploy: new jobs are
    taken in on it, and each job in flight moves to it at its next chunk (pipeline/fallback.py `follow_operator`,
    within the profile's model_control_max_age_s). Refused, with nothing written, for a model with no catalogue row
    (`model.not_catalogued`) or one this deploy does not grant (`model.not_granted`: the workers' role may not call
    it)."""
    refused = refused_id(model_id)
    if refused is not None:
        raise ReviewError.of("model.not_catalogued", refused)
    s = deps.settings
    if not s.grants(model_id) or s.model_provider == "offline":
        raise ReviewError.of("model.not_granted", f"this deploy calls {', '.join(s.model_chain)} only (-c model_id, "
                             f"-c model_fallbacks): redeploy with -c model_fallbacks={model_id} to switch to it")
    return _set_model(deps, by, model_id)


def model_reset(deps: Deps, by: str) -> ModelControl:
    """`review model reset`: new jobs are taken in on the deploy's model again. A job that moved to the operator's
    model stays on it (a job never switches back by itself; `review model use ID` moves them all)."""
    return _set_model(deps, by, None)


def _set_model(deps: Deps, by: str, model_id: str | None) -> ModelControl:
    at = deps.clock()
    return _controls(deps).update(lambda now: now.model_copy(update={"model_override": model_id, "by": by, "at": at}))


def paused(deps: Deps) -> bool:
    return deps.model_control is not None and deps.model_control.get().paused


def model_hold(deps: Deps) -> str | None:
    """Why no model call starts now (`review status`, `review quota show`, the status page), None when nothing holds
    them: an operator's pause, the stack's spend-cap hold of today (domain/spend_cap.py)."""
    c = deps.model_control.get() if deps.model_control is not None else None
    if c is None:
        return None
    if c.paused:
        return f"the model is paused by {c.by or 'an operator'}: `review quota resume` lets it go on"
    hold = c.spend_held(spend_cap.utc_day(deps.clock()))
    return spend_cap.hold_line(hold) if hold is not None else None

