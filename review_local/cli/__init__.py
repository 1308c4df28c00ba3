"""`review`: run the pipeline locally and operate any stack (local by default, or `--stack NAME`).

The group and its options are here; the commands are in one module per group of them: `stack` (up, ui, preflight,
demo, backfill-open-jobs), `submit` (submit, batch), `jobs` (status, explain, watch, report, jobs, retry, cancel,
approve, reject), `quota`, `dlq` (dlq, compensations). `context` is what every command gets, `render` what they
print on."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from botocore.exceptions import BotoCoreError, ClientError

from . import dlq, jobs, model, quota, stack, submit
from .context import Ctx

__all__ = ["Ctx", "cli", "main"]


class ReviewGroup(click.Group):
    """Any AWS error a command runs into ends as one line (`Error: ...`, exit 1), not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (BotoCoreError, ClientError) as exc:
            from ..connect import describe_aws_error

            obj = ctx.obj if isinstance(ctx.obj, Ctx) else None
            raise click.ClickException(describe_aws_error(exc, obj.local_endpoint if obj else None)) from exc


@click.group(cls=ReviewGroup)
@click.option("--stack", default=None, help="A deployed stack's name (default: the local stack of `review up`).")
@click.option("--region", default=None, help="AWS region of --stack.")
@click.pass_context
def cli(ctx: click.Context, stack: str | None, region: str | None) -> None:
    """Contract review pipeline: local runtime and operator CLI."""
    if not isinstance(ctx.obj, Ctx) or ctx.obj._deps is None:  # a Ctx with Deps given (tests) is kept
        ctx.obj = Ctx(stack, region)


for _command in (*stack.COMMANDS, *submit.COMMANDS, *jobs.COMMANDS, *quota.COMMANDS, *model.COMMANDS, *dlq.COMMANDS):
    cli.add_command(_command)


def main() -> None:
    try:
        cli(obj=None)
    except SystemExit as exc:
        if not stack.STOPPED_CLEANLY.is_set():
            raise
        # `review up` stopped everything it started: end now, not after seconds of tearing down moto's memory
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exc.code if isinstance(exc.code, int) else 0)
