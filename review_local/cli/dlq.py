"""Dead letters: `review dlq` (list, show, redrive, discard the pipeline's) and `review compensations` (the
compensation DLQ of side effects that could not be undone)."""

from __future__ import annotations

import json
import time

import click

from contract_review.operate import dead_letters

from .context import Ctx, whole_message_id
from .render import STDERR, console, say


@click.group()
def dlq() -> None:
    """Inspect, redrive and discard dead letters."""


@dlq.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def dlq_list(obj: Ctx, as_json: bool) -> None:
    """DLQ messages joined with their job and chunk records (document text shown by its length only).

    `source message` is the MessageId that `send-message` returned; `attempts` what the pipeline spent
    before giving up. SQS's own receive count is not shown: SQS has no peek, so every listing is a
    receive and would raise it."""
    items = dead_letters.dlq_list(obj.deps)
    if as_json:
        click.echo(json.dumps([i.model_dump(mode="json", exclude={"body"}) for i in items], indent=2))
        return
    for i in items:  # one line each, ids whole (a table cuts them at the terminal's width)
        parts = [i.message_id, f"{i.queue} DLQ"]
        parts += [f"job {i.job_id}"] if i.job_id else []
        parts += [f"chunk {i.chunk.chunk_index + 1}"] if i.chunk else []
        code = (i.envelope.error_code if i.envelope else None) or i.error_code
        parts += [(code or "no error code") + (f" at {i.failed_step}" if i.failed_step else "")]
        parts += [f"after {i.attempts} attempt(s)"] if i.attempts is not None else []
        parts += [f"moved by {i.moved_by}"]
        parts += [f"source message {i.source_message_id}"] if i.source_message_id else []
        say("  ".join(parts))
    say(f"{len(items)} message(s); `review dlq show MESSAGE_ID [--body]` for one, `review dlq redrive` or "
         "`review dlq discard` (ids may be shortened to a unique prefix)")


@dlq.command("show")
@click.argument("message_id")
@click.option("--body", "with_body", is_flag=True, help="Include the whole message body (for intake: your document).")
@click.pass_obj
def dlq_show(obj: Ctx, message_id: str, with_body: bool) -> None:
    """Everything known about one DLQ message: payload, attempts, last error envelope."""
    item = dead_letters.dlq_show(obj.deps, whole_message_id(obj, message_id), with_body=with_body)
    if item is None:
        raise click.ClickException(f"no DLQ message {message_id} (`review dlq list` shows their ids)")
    click.echo(item.model_dump_json(indent=2, exclude=None if with_body else {"body"}))


@dlq.command("redrive")
@click.argument("message_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Redrive every DLQ message.")
@click.option("--force", is_flag=True, help="Resend intake messages that failed with a permanent input error too.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON (one object per message: message_id, queue, action, job_id, chunk_id, skipped).")
@click.pass_obj
def dlq_redrive(obj: Ctx, message_id: str | None, all_: bool, force: bool, as_json: bool) -> None:
    """Re-inject DLQ messages with a fresh attempt budget (leaves an audit event).

    An intake message that failed with a permanent input error would fail the same way: it is
    skipped, with the reason, unless --force (e.g. the document it names has been uploaded since)."""
    if not message_id and not all_:
        raise click.UsageError("give a MESSAGE_ID or --all")
    done = dead_letters.dlq_redrive(obj.deps, None if all_ or not message_id else {whole_message_id(obj, message_id)},
                               force=force)
    if as_json:
        click.echo(json.dumps([d.model_dump(mode="json") for d in done], indent=2))
    for d in [] if as_json else done:
        style = "yellow" if d.skipped else ""
        console.print(f"{d.message_id}  {d.queue}  {d.job_id or ''}  {d.action}", style=style, soft_wrap=True)
    if not any(not d.skipped for d in done):
        raise click.ClickException("nothing redriven" if not done else "nothing redriven: every message was skipped")


@dlq.command("discard")
@click.argument("message_id")
@click.option("--yes", is_flag=True, help="Do not ask: discard it.")
@click.pass_obj
def dlq_discard(obj: Ctx, message_id: str, yes: bool) -> None:
    """Delete one dead letter that can never be fixed (the DLQ alarm stops counting it). Asks first unless --yes;
    a `dlq.discarded` event on its job, if it names one, records it. The message is gone: `review dlq show
    MESSAGE_ID --body` first if you want to keep it."""
    message_id = whole_message_id(obj, message_id)
    item = dead_letters.dlq_show(obj.deps, message_id)
    if item is None:
        raise click.ClickException(f"no DLQ message {message_id} (`review dlq list` shows their ids)")
    about = (f"{item.message_id} ({item.queue} DLQ"
             + (f", job {item.job_id}" if item.job_id else "") + (f", chunk {item.chunk_id}" if item.chunk_id else "")
             + f", {(item.envelope.error_code if item.envelope else None) or item.error_code or 'no error code'})")
    if not yes:
        click.confirm(f"discard {about} for good?", abort=True, err=True)
    gone = dead_letters.dlq_discard(obj.deps, message_id, by="cli")
    if gone is None:
        raise click.ClickException(f"no DLQ message {message_id}: someone else redrove or discarded it meanwhile")
    say(f"discarded {about}" + (f"; recorded as dlq.discarded on {gone.job_id}" if gone.job_id else ""))


REDRIVE_AGAIN_S = 5.0  # `compensations --redrive --wait`: between two redrives


def _redrive_line(out: dead_letters.CompensationResult) -> str:
    return (f"compensated: {len(out.compensated)}  still failing: {len(out.dead_lettered)}  "
            f"in flight: {out.in_flight}")


def _not_compensated(out: dead_letters.CompensationResult) -> str:
    """Why a redrive did not end it all, and what to run next: one line."""
    parts = []
    if out.dead_lettered:
        failing = ", ".join(f"{step} of {job}" if job else step for step, job in zip(out.dead_lettered,
                                                                                    out.failing_jobs, strict=False))
        parts.append(f"still failing: {failing} (the cause: `review compensations`; fix it, then "
                     "`review compensations --redrive --wait`)")
    if out.in_flight:
        parts.append(f"{out.in_flight} in flight: taken by another redrive (or one that stopped) and not back yet, so "
                     "neither compensated nor failed: `review compensations --redrive --wait` waits for their outcome")
    return "; ".join(parts)


@click.command()
@click.option("--redrive", is_flag=True, help="Run every dead-lettered compensation again (after fixing the cause).")
@click.option("--wait", is_flag=True, help="With --redrive: redrive again until every compensation is done (or "
                                           "--timeout), a progress line each time.")
@click.option("--timeout", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="With --wait: give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the dead letters (or the redrive's outcome) as JSON.")
@click.pass_obj
def compensations(obj: Ctx, redrive: bool, wait: bool, timeout: float, as_json: bool) -> None:
    """The compensation DLQ: undoing a side effect (closing a ticket, publishing a withdrawal) that failed
    on every attempt (sideeffect.compensation_failed). Lists each one with its job, step and error; with
    --redrive runs them again (each keeps its own key: nothing is closed or withdrawn twice). Exit 1 while any is
    not compensated: still failing, or in flight (taken by another redrive: its outcome is not known yet)."""
    import json as _json

    if wait and not redrive:
        raise click.UsageError("--wait is for --redrive")
    fx = obj.deps.side_effects
    if fx is None or fx.dlq is None:
        raise click.ClickException("this stack has no compensation DLQ (CompensationDlqUrl)")
    if redrive:
        progress = STDERR if as_json else console
        deadline = time.monotonic() + timeout
        out = dead_letters.redrive_compensations(obj.deps, fx)
        done = list(out.compensated)
        while wait and not out.complete and time.monotonic() < deadline:
            progress.print(f"{_redrive_line(out)}: {_not_compensated(out)}; again in {REDRIVE_AGAIN_S:g} s "
                           f"(up to {max(0.0, deadline - time.monotonic()):.0f} s more)",
                           markup=False, highlight=False, soft_wrap=True)
            time.sleep(REDRIVE_AGAIN_S)
            out = dead_letters.redrive_compensations(obj.deps, fx)
            done += out.compensated
        out.compensated = done
        if as_json:
            click.echo(_json.dumps({"compensated": out.compensated, "still_failing": out.dead_lettered,
                                    "in_flight": out.in_flight}, indent=2))
        else:
            console.print(_redrive_line(out), markup=False, highlight=False)
        if not out.complete:
            late = f"after {timeout:.0f} s: " if wait else ""
            raise click.ClickException(late + _not_compensated(out))
        return
    letters = fx.dlq.take_all(visibility_s=0)
    if as_json:
        click.echo(_json.dumps([{"message_id": m.message_id, "job_id": m.attributes.get("job_id"),
                                 "step": m.attributes.get("step"), "error_code": m.attributes.get("error_code"),
                                 "envelope": _json.loads(m.attributes.get("envelope") or "null")} for m in letters],
                               indent=2))
        return
    if not letters:
        console.print("the compensation DLQ is empty")
    for m in letters:
        env = _json.loads(m.attributes.get("envelope") or "{}")
        console.print(f"{m.attributes.get('job_id', '-')}  {m.attributes.get('step', '-')}  "
                      f"{m.attributes.get('error_code', '-')} (cause {env.get('cause_code') or '-'})  {m.message_id}",
                      markup=False, highlight=False, soft_wrap=True)


COMMANDS = (dlq, compensations)
