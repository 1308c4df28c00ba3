"""`review quota`: the model's runtime control (pause, resume, the tokens-per-minute quota, a batch lane back on)
without a redeploy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from contract_review.domain import spend_cap
from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Deps
from contract_review.operate import model_control, narration

from .context import Ctx
from .render import say

T = TypeVar("T")


@click.group()
def quota() -> None:
    """The model's runtime control: pause it, resume it, set the tokens-per-minute quota the workers pace to, or turn
    a model's batch lane back on, without a redeploy (one item of the stack's control table, ControlTableName; the
    workers read it within model_control_max_age_s: prod 60 s)."""


def _show_control(control: ModelControl, deps: Deps) -> None:
    tpm = f"{control.tokens_per_minute:,.0f} tokens/min (review quota set)" if control.tokens_per_minute else \
        "the deploy's (-c model_tpm, else Service Quotas)"
    when = f", by {control.by} at {narration.human_time(control.at)}" if control.at else ""
    say(f"model: {'PAUSED' if control.paused else 'running'}; quota: {tpm}{when}")
    if not control.paused and (hold := model_control.model_hold(deps)) is not None:
        say(f"model HELD: {hold}")
    if control.cap_override_day is not None and control.cap_override_day == spend_cap.utc_day(deps.clock()):
        say("daily spend cap: lifted for the rest of today (review quota resume --override-cap)")
    for model_id, off in sorted(control.batch_off.items()):
        say(f"batch lane of {model_id}: OFF since {narration.human_time(off.at)}" + (f" (by {off.by})" if off.by else "")
             + f": {off.error_code}: {off.reason}; its `inference: batch` jobs run on demand until "
             f"`review quota batch --on{'' if len(control.batch_off) == 1 else ' --model ' + model_id}`")
    if not control.batch_off:
        say("batch lane: on")


def control_call(obj: Ctx, act: Callable[[Deps], T]) -> T:
    """A control command's call into the core (`review quota`, `review model`); its refusals as one line (no control table; a write that kept losing
    its compare-and-set: control.contended)."""
    try:
        return act(obj.deps)
    except model_control.NoModelControl as exc:
        raise click.ClickException(str(exc)) from exc
    except ReviewError as exc:
        raise click.ClickException(f"{exc.envelope.error_code}: {exc.envelope.message}") from exc


def _change(obj: Ctx, **change: Any) -> None:
    control = control_call(obj, lambda deps: model_control.quota_change(deps, "cli", **change))
    _show_control(control, obj.deps)


@quota.command("show")
@click.option("--json", "as_json", is_flag=True,
              help="Print the control as JSON (paused, tokens_per_minute, by, at, version, batch_off).")
@click.pass_obj
def quota_show(obj: Ctx, as_json: bool) -> None:
    """Whether the model is paused, the quota the workers pace to, and the models whose batch lane is off (why)."""
    control = control_call(obj, model_control.quota_show)
    if as_json:
        click.echo(control.model_dump_json(indent=2))
        return
    _show_control(control, obj.deps)


@quota.command("batch")
@click.option("--on", "turn_on", is_flag=True,
              help="Turn the batch lane on again (after its refusal is fixed: the model or profile offered in batch, "
                   "the service role's access).")
@click.option("--model", "model_id", default=None,
              help="The model whose lane to turn on (default: the stack's model).")
@click.pass_obj
def quota_batch(obj: Ctx, turn_on: bool, model_id: str | None) -> None:
    """The batch lane of a model, turned off by a refused batch job (`review quota show` says why): `--on` lets the
    collector submit batch jobs for it again; its `inference: batch` jobs go to the batch lane from then on. Without
    `--on`: what `review quota show` says."""
    if not turn_on:
        _show_control(control_call(obj, model_control.quota_show), obj.deps)
        return
    model = model_id or obj.deps.settings.effective_model_id
    control, removed = control_call(obj, lambda deps: model_control.batch_lane_on(deps, model))
    if removed is None:
        off = ", ".join(sorted(control.batch_off)) or "none"
        say(f"the batch lane of {model} is not off; nothing changed (lanes off: {off})")
        return
    say(f"batch lane of {model}: on (it was off since {narration.human_time(removed.at)}: {removed.error_code}: {removed.reason})")
    _show_control(control, obj.deps)


@quota.command("pause")
@click.pass_obj
def quota_pause(obj: Ctx) -> None:
    """No new model call starts (within model_control_max_age_s); chunks are held as backpressure, not failed."""
    _change(obj, paused=True)


@quota.command("resume")
@click.option("--override-cap", is_flag=True,
              help="Also lift the stack's daily spend cap for the rest of this UTC day: its hold, and the cap on "
                   "admissions (the jobs waiting for it start within a sweep). It holds again from 00:00 UTC.")
@click.pass_obj
def quota_resume(obj: Ctx, override_cap: bool) -> None:
    """Model calls start again; the held chunks go on (a hold of the daily spend cap only with --override-cap)."""
    _change(obj, paused=False, override_cap=override_cap)


@quota.command("set")
@click.argument("tokens_per_minute", type=click.FloatRange(min=1), required=False)
@click.option("--clear", is_flag=True, help="Forget the quota set here: pace to the deploy's again.")
@click.pass_obj
def quota_set(obj: Ctx, tokens_per_minute: float | None, clear: bool) -> None:
    """Pace to TOKENS_PER_MINUTE (the model's quota, or this stack's share of it)."""
    if tokens_per_minute is not None and clear:
        raise click.UsageError(f"TOKENS_PER_MINUTE ({tokens_per_minute:g}) and --clear both given: give one, a quota "
                               "to pace to or --clear to pace to the deploy's again")
    if tokens_per_minute is None and not clear:
        raise click.UsageError("give TOKENS_PER_MINUTE (e.g. `review quota set 50000`) or --clear")
    _change(obj, tokens_per_minute=tokens_per_minute, clear_quota=clear)


COMMANDS = (quota,)
