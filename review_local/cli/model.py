"""`review model`: the model the stack's calls go to, switched without a redeploy (`use`, `reset`), and what it is now
(`show`): the runtime control's `model_override`, read by the workers within model_control_max_age_s."""

from __future__ import annotations

import click

from contract_review.domain.control_records import ModelControl
from contract_review.domain.ports import Deps
from contract_review.operate import model_control, narration

from .context import Ctx
from .quota import control_call
from .render import say


@click.group()
def model() -> None:
    """The model the stack's calls go to: the deploy's (-c model_id), or one an operator switched to with `review
    model use ID` (a model the deploy grants: -c model_id or -c model_fallbacks) until `review model reset`. A job
    refused by its model as unavailable moves to the next of -c model_fallbacks by itself (docs/models.md)."""


def _show(control: ModelControl, deps: Deps) -> None:
    s = deps.settings
    if control.model_override:
        say(f"model: {control.model_override} (review model use, by {control.by} at "
            f"{narration.human_time(control.at)}); the deploy's: {s.effective_model_id}")
    else:
        say(f"model: {s.effective_model_id} (the deploy's)")
    say(f"fallback chain: {' -> '.join(s.model_chain)}")


@model.command("show")
@click.pass_obj
def model_show(obj: Ctx) -> None:
    """The model new calls go to, and the deploy's fallback chain."""
    _show(control_call(obj, model_control.quota_show), obj.deps)


@model.command("use")
@click.argument("model_id")
@click.pass_obj
def model_use(obj: Ctx, model_id: str) -> None:
    """Switch the stack's calls to MODEL_ID: new jobs start on it and each job in flight moves to it at its next
    chunk (its finished analysts' checkpoints kept), within model_control_max_age_s (prod 60 s). MODEL_ID must be
    catalogued (docs/models.md) and granted by the deploy (-c model_id or -c model_fallbacks)."""
    _show(control_call(obj, lambda deps: model_control.model_use(deps, "cli", model_id)), obj.deps)


@model.command("reset")
@click.pass_obj
def model_reset(obj: Ctx) -> None:
    """New jobs start on the deploy's model again (jobs that moved to the switched-to model stay on it)."""
    _show(control_call(obj, lambda deps: model_control.model_reset(deps, "cli")), obj.deps)


COMMANDS = (model,)
