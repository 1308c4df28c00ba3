"""What every `review` command gets (`Ctx`: the stack, and its `Deps` once connected), and the ids an operator
types, resolved to whole ones: a job or message id may be given by a unique prefix (`review jobs` prints them
whole)."""

from __future__ import annotations

import click

from contract_review.domain.ports import Deps
from contract_review.operate import ids
from contract_review.operate import job_view as job_views


class Ctx:
    """What every command gets: the stack to talk to, and its `Deps` once connected (tests pass fakes)."""

    def __init__(self, stack: str | None, region: str | None, deps: Deps | None = None):
        self.stack, self.region = stack, region
        self._deps = deps
        self.local_endpoint: str | None = None  # set when connected to the local stack

    @property
    def deps(self) -> Deps:
        if self._deps is None:
            from ..connect import StackUnavailable, connect

            try:
                self._deps = connect(self.stack, self.region)
            except StackUnavailable as exc:
                raise click.ClickException(str(exc)) from exc
            if self.stack is None:
                from ..embedded import load_local_json

                self.local_endpoint = load_local_json()["endpoint"]
        return self._deps


def whole_job_id(obj: Ctx, given: str) -> str:
    """A job id given whole or by a unique prefix (`review jobs` prints them whole)."""
    try:
        return ids.resolve_job_id(obj.deps, given)
    except ids.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc


def whole_message_id(obj: Ctx, given: str) -> str:
    try:
        return ids.resolve_message_id(obj.deps, given)
    except ids.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc


def job_view(obj: Ctx, job_id: str) -> job_views.JobView:
    view = job_views.job_view(obj.deps, whole_job_id(obj, job_id))
    if view is None:
        raise click.ClickException(f"no job {job_id}")
    return view
