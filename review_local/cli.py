"""`review`: run the pipeline locally and operate any stack (local by default, or `--stack NAME`)."""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console
from rich.table import Table

from contract_review.domain import lifecycle, spend_cap
from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import ReviewError
from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import Inference, Job, JobState, Priority
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import ops
from contract_review.pipeline import redrive
from contract_review.review.chunking import document_hash

from .progress import UNKNOWN, WAITING, ended, watch_jobs

console = Console(emoji=False)  # an ARN holds `:secret:`, which rich would print as an emoji
_STDERR = Console(stderr=True, emoji=False)  # progress beside --json output
SUBMIT_GRACE_S = 10.0  # a just-submitted job id without a record: wait this long (and while intake is busy)
WATCH_GRACE_S = 3.0


T = TypeVar("T")


class Ctx:
    """What every command gets: the stack to talk to, and its `Deps` once connected (tests pass fakes)."""

    def __init__(self, stack: str | None, region: str | None, deps: Deps | None = None):
        self.stack, self.region = stack, region
        self._deps = deps
        self.local_endpoint: str | None = None  # set when connected to the local stack

    @property
    def deps(self) -> Deps:
        if self._deps is None:
            from .connect import StackUnavailable, connect

            try:
                self._deps = connect(self.stack, self.region)
            except StackUnavailable as exc:
                raise click.ClickException(str(exc)) from exc
            if self.stack is None:
                from .embedded import load_local_json

                self.local_endpoint = load_local_json()["endpoint"]
        return self._deps


class ReviewGroup(click.Group):
    """Any AWS error a command runs into ends as one line (`Error: ...`, exit 1), not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (BotoCoreError, ClientError) as exc:
            from .connect import describe_aws_error

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


# ------------------------------------------------------------------------------------ up
@cli.command()
@click.option("--faults", "fault_rate", type=float, default=0.0, help="Transient model fault rate (e.g. 0.05).")
@click.option("--seed", type=int, default=7)
@click.option("--workers", type=int, default=None, help="Analysis sandboxes (default: the template's MaximumConcurrency).")
@click.option("--worker", "worker_kind", type=click.Choice(["lambda", "fargate"]), default="lambda", show_default=True,
              help="The CDK context `worker`: Lambda sandboxes, or the Fargate task as long-running pollers.")
@click.option("--no-tickets", is_flag=True,
              help="Without the local fake of the external ticket system (the ticket step is then skipped).")
@click.option("--ticket-faults", default="", metavar="SPEC",
              help="Ticket system failures: rates, e.g. 'error=0.1,timeout_after_write=0.05,hang=3,seed=7', or the next N "
                   "requests, e.g. 'timeout_after_write=x1,lookup_unavailable=x50' (the next ticket's outcome stays "
                   "unknown: its job waits in waiting_approval).")
@click.option("--batch-faults", default="", metavar="SPEC",
              help="Bedrock batch inference stand-in failures, e.g. 'refuse_create' (every CreateModelInvocationJob "
                   "refused with ValidationException, as for a model not offered in batch: the batch lane turns off "
                   "and batch-mode jobs run on demand), 'refuse_create=ThrottlingException', 'expire_job', "
                   "'fail_job=in_progress', 'fail_rate=0.2'.")
@click.option("--json", "as_json", is_flag=True,
              help="Once the stack is up, print one JSON document (what .review/local.json holds: endpoint, region, "
                   "profile, outputs, api, api_token, api_tokens, ui; and tickets, local_json, logs); the rest on stderr.")
def up(fault_rate: float, seed: int, workers: int | None, worker_kind: str, no_tickets: bool,
       ticket_faults: str, batch_faults: str, as_json: bool) -> None:
    """Start embedded AWS (moto) with the stack deployed, the workers, the Job API and the status page, in the
    foreground."""
    from .batch_service import BatchFaults
    from .embedded import LOCAL_JSON
    from .stack import LocalStack
    from .ticket_service import TicketFaults

    out = _STDERR if as_json else console
    faults = FaultSpec(seed=seed, transient_rate=fault_rate) if fault_rate else None
    try:
        tickets = None if no_tickets else TicketFaults.parse(ticket_faults)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ticket-faults") from exc
    try:
        batch = BatchFaults.parse(batch_faults)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--batch-faults") from exc
    stack = LocalStack(faults=faults, worker=worker_kind, concurrency={"worker": workers} if workers else {},
                       ticket_faults=tickets, batch_faults=batch)
    out.print("[bold]synthesizing and deploying the template into embedded AWS...[/]")
    stack.start()
    stack.write_local_json()
    out.print(f"AWS endpoint: [bold cyan]{stack.aws.endpoint}[/]  region: {stack.aws.region}")
    for k, v in sorted(stack.outputs.items()):
        out.print(f"  {k:22} {v}")
    if stack.api is not None:
        out.print(f"Job API: [bold cyan]{stack.api.url}[/]  token: [bold]{stack.api.token}[/]  (docs/openapi.yaml; "
                  "`Authorization: Bearer <token>`)", soft_wrap=True)
    if stack.ui is not None:
        out.print(f"status page: [bold cyan]{stack.ui.url}[/]  (an operator's view; `review ui --as local-user` for "
                  "one principal's)", soft_wrap=True)
    if stack.tickets is not None:
        out.print(f"ticket system (local fake of a third party): [bold cyan]{stack.tickets.url}[/] "
                  "(GET /tickets with the bearer token below, GET /_admin/stats)", soft_wrap=True)
        out.print(f"  its credentials: secret {stack.ticket_secret_arn} (what -c ticket_secret_arn names on AWS), "
                  f"bearer token [bold]{stack.ticket_token}[/]", soft_wrap=True)
    if stack.batch_service is not None:
        out.print(f"Bedrock batch inference (local stand-in): [bold cyan]{stack.batch_service.url}[/] "
                  f"(boto3 \"bedrock\" with endpoint_url; at least {stack.batch_service.min_records} records per "
                  f"job, a status every {stack.batch_service.step_s:g} s)"
                  + (f"; faults: {batch_faults}" if batch_faults else ""), soft_wrap=True)
    out.print("wrote .review/local.json; worker logs in .review/logs/. Ctrl-C to stop.")
    if as_json:
        click.echo(json.dumps(_up_document(stack, LOCAL_JSON), indent=2))
        sys.stdout.flush()
    try:
        _serve_until_stopped()
    finally:
        out.print("stopping...")
        stack.stop()


def _up_document(stack: Any, local_json: Path) -> dict[str, Any]:
    """`review up --json`: the running stack, as .review/local.json records it, plus the ticket fake and the paths."""
    doc: dict[str, Any] = {"endpoint": stack.aws.endpoint, "region": stack.aws.region, "profile": stack.profile,
                           "outputs": stack.outputs, "api": None, "api_token": None, "api_tokens": {}, "ui": None,
                           "tickets": None, "batch_service": None, "local_json": str(local_json),
                           "logs": ".review/logs/"}
    if stack.api is not None:
        doc.update(api=stack.api.url, api_token=stack.api.token, api_tokens=stack.api.tokens_by_name)
    if stack.ui is not None:
        doc["ui"] = stack.ui.url
    if stack.tickets is not None:
        doc["tickets"] = {"url": stack.tickets.url, "secret_arn": stack.ticket_secret_arn, "token": stack.ticket_token}
    if stack.batch_service is not None:
        doc["batch_service"] = stack.batch_service.url
    return doc


def _serve_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM (`review up`, `review ui`): the caller then stops what it serves."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------------------ ui
@cli.command()
@click.option("--port", type=int, default=0, help="Serve on this loopback port (default: a free one).")
@click.option("--as", "as_name", default=None, metavar="NAME",
              help="Local stack only: act as this API principal of .review/local.json's api_tokens (e.g. local-user): "
                   "its jobs only, as the Job API shows them.")
@click.pass_obj
def ui(obj: Ctx, port: int, as_name: str | None) -> None:
    """Serve the status page on 127.0.0.1 until Ctrl-C: jobs (filter, search), per job the chunk x analyst grid
    filling live, the timeline, findings, cost against budget, the approval, cancel/retry/approve/reject; the dead
    letters with redrive and discard; a chart of model calls, throttles and quota use. Against --stack NAME it uses your own AWS credentials (the IAM policy it needs:
    docs/runbook.md "The status page"); nothing is exposed beyond this machine."""
    from .api_server import local_principal
    from .ui_server import UiServer

    principal = None
    if as_name is not None:
        if obj.stack is not None:
            raise click.UsageError("--as acts as a principal of the local stack; against --stack the page is an "
                                   "operator's view")
        from .embedded import load_local_json

        names = sorted(load_local_json().get("api_tokens", {}))
        if as_name not in names:
            raise click.UsageError(f"--as {as_name}: not one of the local stack's principals ({', '.join(names)})")
        principal = local_principal(as_name)
    server = UiServer(obj.deps, principal=principal, port=port).start()
    console.print(f"status page: [bold cyan]{server.url}[/]  ({'acting as ' + principal if principal else 'operator view'}"
                  f"; {'stack ' + obj.stack if obj.stack else 'the local stack'}). Ctrl-C to stop.", soft_wrap=True)
    try:
        _serve_until_stopped()
    finally:
        server.stop()


# ------------------------------------------------------------------------------------ submit
def _check_submit_options(files: tuple[Path, ...], batch_file: Path | None, idempotency_key: str | None,
                          priority: str | None, inference: str | None, deadline_hours: float | None) -> None:
    """`review submit`'s options that do not go together, refused before anything is read or sent."""
    if batch_file is not None:
        if priority is not None:
            raise click.UsageError("--priority is for FILES; a batch's items are bulk unless an item says "
                                   "\"priority\": \"interactive\"")
        if inference is not None or deadline_hours is not None:
            raise click.UsageError("--inference and --deadline-hours are for FILES; a batch's item says "
                                   "\"inference\": \"batch\" (and \"deadline_hours\") itself")
        return
    if not files:
        raise click.UsageError("give FILE... or --batch ITEMS.jsonl")
    if idempotency_key and len(files) > 1:
        raise click.UsageError("--idempotency-key takes one file")
    if deadline_hours is not None and inference != Inference.BATCH.value:
        raise click.UsageError("--deadline-hours is for --inference batch")


@cli.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--batch", "batch_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A batch instead of FILES: JSON Lines, one item per line with a custom_id and a document (or a file).")
@click.option("--wait", is_flag=True, help="Wait for the jobs to end, showing progress.")
@click.option("--idempotency-key", default=None, help="Only with one file. Default: a hash of the document.")
@click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop each job once its recorded cost reaches this many USD (job.budget_exceeded; docs/cost.md).")
@click.option("--priority", type=click.Choice([p.value for p in Priority]), default=None,
              help="interactive (default for FILES) or bulk (default for --batch): interactive chunks are served "
                   "first when both wait, bulk ones never starved (docs/runbook.md \"Interactive and bulk work\").")
@click.option("--inference", type=click.Choice([i.value for i in Inference]), default=None,
              help="on_demand (default) or batch: Bedrock batch inference at half the price, within hours "
                   "(docs/batch-inference.md).")
@click.option("--deadline-hours", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --inference batch: the hours within which each job must end (default: the profile's "
                   "batch_default_deadline_hours); calls go on demand once a batch could not answer by then.")
@click.option("--timeout", type=float, default=600.0)
@click.option("--json", "as_json", is_flag=True,
              help="Print the submissions as JSON (a list of {job_id, file, note}; with --batch the batch's items).")
@click.pass_obj
def submit(obj: Ctx, files: tuple[Path, ...], batch_file: Path | None, wait: bool, idempotency_key: str | None,
           budget_usd: float | None, priority: str | None, inference: str | None, deadline_hours: float | None,
           timeout: float, as_json: bool) -> None:
    """Submit documents (UTF-8 text files) to the intake queue; print their job ids.

    The same document twice is one job (its id is a hash of the text): it is sent and waited on once.
    With --batch, a batch of the Job API (each item its own job; a bad item never stops the others)."""
    _check_submit_options(files, batch_file, idempotency_key, priority, inference, deadline_hours)
    if batch_file is not None:
        _submit_batch(obj, batch_file, bool(files), wait, idempotency_key, timeout, as_json)
        return
    texts = [(f, _read_document(f)) for f in files]
    for f, text in texts:  # what intake would refuse at once is refused here, before anything is sent
        try:
            ops.check_document(obj.deps, text)
        except ReviewError as exc:
            raise click.ClickException(f"{f}: {exc.envelope.error_code}: {exc.envelope.message}") from exc
    jobs: dict[str, Path] = {}
    shas: dict[str, str] = {}
    records: list[dict[str, str | None]] = []

    def said(job_id: str, f: Path, note: str | None) -> None:
        records.append({"job_id": job_id, "file": str(f), "note": note})
        if not as_json:
            console.print(f"{job_id}  {f}" + (f"  ({note})" if note else ""), markup=False, highlight=False)

    for f, text in texts:
        job_id = ops.job_id_of(text, idempotency_key)
        if job_id in jobs:
            said(job_id, f, f"the same document as {jobs[job_id]}: one job, not sent again")
            continue
        shas[job_id] = document_hash(text)
        _refuse_key_conflict(obj.deps.jobs.get(job_id), shas[job_id], idempotency_key, f)
        again = _resubmission(obj.deps, job_id, text)
        if again is None or again.send:
            try:
                ops.submit(obj.deps, text, document_id=_document_id(f), idempotency_key=idempotency_key,
                           budget_usd=budget_usd, priority=Priority(priority) if priority else None,
                           inference=Inference(inference) if inference else None, deadline_hours=deadline_hours)
            except ReviewError as exc:  # job.budget_insufficient: nothing was sent
                raise click.ClickException(f"{f}: {exc.envelope.error_code}: {exc.envelope.message}") from exc
        jobs[job_id] = f
        said(job_id, f, again.note if again else None)
    if as_json:
        click.echo(json.dumps(records, indent=2))
    if wait:  # with --json, progress goes to stderr: stdout is the JSON alone
        _wait(obj, list(jobs), timeout, SUBMIT_GRACE_S, documents=shas, out=_STDERR if as_json else console)


def _refuse_key_conflict(job: Job | None, sha: str, key: str | None, f: Path) -> None:
    """The key names a job made from another document: refused as the Job API and intake refuse it
    (input.key_conflict), one line and exit 1, never that other job's result. A job that failed on its input
    is the exception: a corrected document under its key replaces it."""
    if job is not None and not job.replaceable and job.document_sha256 and job.document_sha256 != sha:
        raise click.ClickException(
            f"input.key_conflict: idempotency key {key!r} names job {job.job_id}, made from another document; "
            f"send {f} with its own key (without --idempotency-key, the document's SHA-256 is its key)")


@dataclass(frozen=True)
class _Again:
    note: str  # what resubmitting did, shown after the job id
    send: bool  # the intake message is still to be sent


def _resubmission(deps: Deps, job_id: str, text: str) -> _Again | None:
    """The same document again, for a job that ended without completing (not on bad input: intake
    replaces those): the job is retried (`review retry`) instead of returning the failed job unchanged.
    None: intake decides (a new job, a duplicate of one that is running or completed, or another
    document under the same key)."""
    job = deps.jobs.get(job_id)
    if job is None or not redrive.retryable(job):
        return None
    if job.document_sha256 and job.document_sha256 != document_hash(text):
        return None
    if redrive.requeue_failed_intake(deps, job_id):  # failed in intake: queued again, intake takes the new message
        return _Again(f"it had failed in intake with {job.error_code}: queued again", send=True)
    r = redrive.retry(deps, job_id)
    ended = f"it had ended {job.state.value}" + (f" with {job.error_code}" if job.error_code else "")
    return _Again(f"{ended}: {r.action}" if r.retried else f"{ended}; not retried: {r.action}", send=False)


def _read_document(f: Path) -> str:
    size = f.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise click.ClickException(f"{f}: {size:,} bytes, more than the {MAX_DOCUMENT_BYTES:,} a document may have: "
                                   "split it")
    try:
        return f.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{f}: not UTF-8 text (at byte {exc.start}): convert it to UTF-8 text first "
                                   "(e.g. `iconv -f latin1 -t utf-8`, or `pdftotext` for a PDF)") from exc


def _document_id(f: Path) -> str:
    """The file's name as a valid document_id (schema: [A-Za-z0-9._:/-], at most 256)."""
    return re.sub(r"[^A-Za-z0-9._:/\-]", "_", f.name)[:256]


def _wait(obj: Ctx, job_ids: list[str], timeout: float, grace_s: float, show_events: bool = False,
          documents: dict[str, str] | None = None, since: int = 0, label: Callable[[Job], str] | None = None,
          out: Console = console) -> None:
    """Watch the jobs; exit 1, with one line per job that did not complete, unless all completed. `documents`:
    the SHA-256 each job must have been made from (a key another document took first, while this one's
    message was on its way, is intake's input.key_conflict: that job's end is not this document's)."""
    deps = obj.deps
    states = watch_jobs(out, deps.jobs, job_ids, timeout, grace_s=grace_s,
                        intake_busy=lambda: deps.queues.depth(Queue.INTAKE) > 0,
                        events=(lambda j, after: lifecycle.read_events(deps, j, after)) if show_events else None,
                        since=since, label=label)
    problems, waiting = [], []
    for j, state in states.items():
        if state == JobState.WAITING_APPROVAL.value:
            waiting.append(_waiting_line(deps.jobs.get(j), j))
        elif state == UNKNOWN:
            problems.append(f"no job {j}: no record after {grace_s:.0f} s and the intake queue is empty, so "
                            "nothing will create it (a mistyped id? or see `review jobs` and `review dlq list`)")
        elif state == WAITING or not ended(state):
            problems.append(f"{j} is still {state} after {timeout:.0f} s (`review watch {j}` to go on watching)")
        elif (documents or {}).get(j) and (job := deps.jobs.get(j)) is not None \
                and job.document_sha256 and job.document_sha256 != (documents or {})[j]:
            problems.append(f"input.key_conflict: {j} was made from another document under the same key; this one "
                            "is in the intake dead-letter queue (`review dlq list`): send it with its own key")
        elif state != "completed":
            problems.append(f"{j} ended {state}: see `review status {j}`")
    if problems:
        raise click.ClickException("\n".join(problems + waiting))
    if waiting:  # not completed, not failed: a person decides. Its own exit status, so scripts can tell
        for line in waiting:
            out.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(EXIT_WAITING_APPROVAL)


EXIT_WAITING_APPROVAL = 3  # `--wait`: a job waits for a person's decision (0: all completed; 1: one did not)


def _waiting_line(job: Job | None, job_id: str) -> str:
    a = job.approval if job is not None else None
    about = f" at step {a.step} ({a.reason}), until {ops.iso(a.expires_at)}" if a is not None else ""
    return (f"{job_id} waits for a person's decision{about}: `review approve {job_id}` or `review reject {job_id}` "
            f"(`review status {job_id}` shows the evidence)")


def _submit_batch(obj: Ctx, path: Path, with_files: bool, wait: bool, key: str | None, timeout: float,
                  as_json: bool = False) -> None:
    from .batches import cli_principal, submit_batch_file

    if with_files:
        raise click.UsageError("give FILE... or --batch ITEMS.jsonl, not both")
    accepted, rejected = submit_batch_file(obj.deps, cli_principal(obj.stack, obj.region), path, key, console,
                                           as_json=as_json)
    if wait and accepted:
        _wait(obj, accepted, timeout, SUBMIT_GRACE_S, out=_STDERR if as_json else console)
    if rejected:
        raise click.ClickException(f"{len(rejected)} item(s) rejected or not submitted (the others were submitted): "
                                   f"{', '.join(rejected)}")


@cli.command("batch")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def batch(obj: Ctx, batch_id: str, as_json: bool) -> None:
    """Each item of a batch (`review submit --batch`, or the Job API's POST /batches): its job and state. Also
    accepts a unique prefix of the batch id."""
    from .batches import cli_principal, show_batch

    try:
        batch_id = ops.resolve_batch_id(obj.deps, batch_id)
    except ops.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc
    show_batch(obj.deps, cli_principal(obj.stack, obj.region), batch_id, as_json, console)


# ------------------------------------------------------------------------------------ status & co
@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Show a job in sentences and tables: state, progress, errors, cost, and what would happen next (`--json`: every
    field). Also accepts a unique prefix of the job id."""
    view = _view(obj, job_id)
    if as_json:
        click.echo(view.model_dump_json(indent=2))
        return
    _print_status(view)


def _job_id(obj: Ctx, given: str) -> str:
    """A job id given whole or by a unique prefix (`review jobs` prints them whole)."""
    try:
        return ops.resolve_job_id(obj.deps, given)
    except ops.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc


def _message_id(obj: Ctx, given: str) -> str:
    try:
        return ops.resolve_message_id(obj.deps, given)
    except ops.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc


def _view(obj: Ctx, job_id: str) -> ops.JobView:
    view = ops.job_view(obj.deps, _job_id(obj, job_id))
    if view is None:
        raise click.ClickException(f"no job {job_id}")
    return view


def _say(text: str, style: str = "") -> None:
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def _print_status(view: ops.JobView) -> None:
    """Sentences and tables, each fact once (`--json` has every field)."""
    a = view.answers
    error = f": {view.error_code}" + (f", {view.error.message}" if view.error else "") if view.error_code else ""
    _say(f"{view.job_id} is {view.state.value}{error}", style="bold")
    when = f"created {ops.iso(view.created_at)}" + (f", ended {ops.iso(view.ended_at)}" if view.ended_at else "")
    _say(f"  document {view.document_id or '(no id)'}; model {view.model_id}, prompts {view.prompt_version}; {when}")
    _say(f"  progress: {ops.chunk_counts(view)}; latest: {view.progress_label}")
    if view.last_checkpoint_at:
        _say(f"  last checkpoint: a chunk settled done at {ops.iso(view.last_checkpoint_at)}")
    if view.missing_chunks:
        t = Table("missing chunk", "chunk id", "status", "error", title=None)
        for m in view.missing_chunks:
            t.add_row(str(m.chunk_index + 1), m.chunk_id, m.status.value, m.error_code or "")
        console.print(t)
    if gaps := ops.other_gaps(view):  # a missing chunk's gaps are its row above
        _say(f"  mandatory gaps ({len(gaps)} chunk-analyst pairs): " + "; ".join(ops.gaps_summary(gaps, view.mandatory_analysts)))
    r = view.reliability
    retries = ", ".join(f"{code} {n}" for code, n in sorted(r.retries_by_code.items())) or "none"
    _say(f"  model: {r.model_calls} call(s), retries: {retries}; {r.repairs} repair(s), {r.redeliveries} "
         f"redelivery(ies); circuit breaker {view.model_circuit}")
    _say(f"  cost: {view.cost}")
    if view.inference is Inference.BATCH:
        _say(f"  inference: batch (Bedrock batch inference at the batch price, where its calls stay in the batch lane)"
             f", deadline {ops.iso(view.deadline_at) if view.deadline_at else 'none'}")
        for b in view.batches:
            _say("    " + ops.batch_line(b, view.model_paused))
        if view.batch_note is not None:
            _say("    " + view.batch_note)
        if view.batch_off is not None:
            _say("    " + ops.batch_off_line(view.batch_off))
    if view.waiting is not None:
        _say(f"  waiting: {ops.waiting_line(view.waiting)}")
    if view.model_hold is not None:
        _say(f"  held: {view.model_hold}")
    if view.approval is not None:
        ap = view.approval
        _say(f"  waits for approval: step {ap.step} (key {ap.key[:12]}): {ap.reason}; expires {ops.iso(ap.expires_at)}; "
             f"decide with `review approve {view.job_id}` or `review reject {view.job_id}`")
        for k, v in sorted((k, v) for k, v in ap.evidence.items() if v is not None):
            _say(f"    evidence {k}: {v if isinstance(v, str | int | float | bool) else json.dumps(v, sort_keys=True)}")
    done = ops.side_effect_words(view)
    _say(f"  side effects done: {'; '.join(done) if done else 'none'}")
    _say(f"  a retry would: {a.retry_would}")
    _say(f"  if cancelled now: {a.if_cancelled_now}")
    _say(f"  if it fails again: {a.if_it_fails_again}")
    if view.recent_events:
        t = Table("at", "event", "what")
        for e in view.recent_events:
            t.add_row(e.at, e.type, ops.event_words(e))
        console.print(t)


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="The six answers as JSON (keys: what_happened, where_it_is, "
              "what_it_cost, what_failed, what_next, if_it_fails_again).")
@click.pass_obj
def explain(obj: Ctx, job_id: str, as_json: bool) -> None:
    """A job's story in six short paragraphs: what happened, where it is, what it cost, what failed and why,
    what to do next, and what happens if it fails again."""
    story = ops.explain(_view(obj, job_id))
    if as_json:
        keys = ("what_happened", "where_it_is", "what_it_cost", "what_failed", "what_next", "if_it_fails_again")
        click.echo(json.dumps({k: p.split(": ", 1)[1] for k, p in zip(keys, story, strict=True)}, indent=2))
        return
    for paragraph in story:
        _say(paragraph)
        _say("")


@cli.command()
@click.argument("job_id")
@click.option("--timeout", type=float, default=600.0)
@click.option("--progress", "progress_only", is_flag=True,
              help="One live line (chunks settled of all, state, the latest event) instead of every event.")
@click.option("--since", type=click.IntRange(min=0), default=0, metavar="N",
              help="Only the events after number N (the `#N` printed before each).")
@click.pass_obj
def watch(obj: Ctx, job_id: str, timeout: float, progress_only: bool, since: int) -> None:
    """Live progress of a job until it ends: its events as they come, and a progress bar; exit 0 only
    if it completed.

    A job id without a record is waited for only while the intake queue still holds messages
    (it may be one just sent) and a few seconds more; then it is unknown."""
    deps = obj.deps
    _wait(obj, [_job_id(obj, job_id)], timeout, WATCH_GRACE_S, show_events=not progress_only, since=since,
          label=(lambda job: ops.job_progress(deps, job).label) if progress_only else None)


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of Markdown.")
@click.pass_obj
def report(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Print a job's report."""
    job_id = _job_id(obj, job_id)
    job = obj.deps.jobs.get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    key = job.report_json_key if as_json else job.report_md_key
    if not key:
        raise click.ClickException(f"job {job_id} has no report yet (state {job.state.value})")
    click.echo(obj.deps.artifacts.get_text(key))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--document-id", default=None, help="Only the jobs of this document id (e.g. after `aws sqs send-message`).")
@click.pass_obj
def jobs(obj: Ctx, as_json: bool, document_id: str | None) -> None:
    """List jobs (oldest first)."""
    items = [j for j in obj.deps.jobs.all() if document_id is None or j.document_id == document_id]
    if as_json:
        click.echo(json.dumps([j.model_dump(mode="json", exclude_defaults=True) for j in items], indent=2))
        return
    t = Table("job", "state", "chunks", "document", "error")  # (the listing leaves the settled set out)
    t.columns[0].no_wrap = True
    t.columns[0].min_width = max((len(j.job_id) for j in items), default=0)  # whole: other columns fold instead
    for c in t.columns[1:]:
        c.overflow = "fold"
    for j in items:
        t.add_row(j.job_id, j.state.value, str(j.chunk_count), j.document_id, j.error_code or "")
    console.print(t)
    if document_id is not None and not items:
        raise click.ClickException(f"no job with document id {document_id!r} (intake may not have taken it yet)")


# ------------------------------------------------------------------------------------ quota
@cli.group()
def quota() -> None:
    """The model's runtime control: pause it, resume it, set the tokens-per-minute quota the workers pace to, or turn
    a model's batch lane back on, without a redeploy (one item of the stack's control table, ControlTableName; the
    workers read it within model_control_max_age_s: prod 60 s)."""


def _show_control(control: ModelControl, deps: Deps) -> None:
    tpm = f"{control.tokens_per_minute:,.0f} tokens/min (review quota set)" if control.tokens_per_minute else \
        "the deploy's (-c model_tpm, else Service Quotas)"
    when = f", by {control.by} at {ops.iso(control.at)}" if control.at else ""
    _say(f"model: {'PAUSED' if control.paused else 'running'}; quota: {tpm}{when}")
    if not control.paused and (hold := ops.model_hold(deps)) is not None:
        _say(f"model HELD: {hold}")
    if control.cap_override_day is not None and control.cap_override_day == spend_cap.utc_day(deps.clock()):
        _say("daily spend cap: lifted for the rest of today (review quota resume --override-cap)")
    for model_id, off in sorted(control.batch_off.items()):
        _say(f"batch lane of {model_id}: OFF since {ops.iso(off.at)}" + (f" (by {off.by})" if off.by else "")
             + f": {off.error_code}: {off.reason}; its `inference: batch` jobs run on demand until "
             f"`review quota batch --on{'' if len(control.batch_off) == 1 else ' --model ' + model_id}`")
    if not control.batch_off:
        _say("batch lane: on")


def _control(obj: Ctx, act: Callable[[Deps], T]) -> T:
    """A quota command's call into the core; its refusals as one line (no control table; a write that kept losing
    its compare-and-set: control.contended)."""
    try:
        return act(obj.deps)
    except ops.NoModelControl as exc:
        raise click.ClickException(str(exc)) from exc
    except ReviewError as exc:
        raise click.ClickException(f"{exc.envelope.error_code}: {exc.envelope.message}") from exc


def _change(obj: Ctx, **change: Any) -> None:
    control = _control(obj, lambda deps: ops.quota_change(deps, "cli", **change))
    _show_control(control, obj.deps)


@quota.command("show")
@click.option("--json", "as_json", is_flag=True,
              help="Print the control as JSON (paused, tokens_per_minute, by, at, version, batch_off).")
@click.pass_obj
def quota_show(obj: Ctx, as_json: bool) -> None:
    """Whether the model is paused, the quota the workers pace to, and the models whose batch lane is off (why)."""
    control = _control(obj, ops.quota_show)
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
        _show_control(_control(obj, ops.quota_show), obj.deps)
        return
    model = model_id or obj.deps.settings.effective_model_id
    control, removed = _control(obj, lambda deps: ops.batch_lane_on(deps, model))
    if removed is None:
        off = ", ".join(sorted(control.batch_off)) or "none"
        _say(f"the batch lane of {model} is not off; nothing changed (lanes off: {off})")
        return
    _say(f"batch lane of {model}: on (it was off since {ops.iso(removed.at)}: {removed.error_code}: {removed.reason})")
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
    if (tokens_per_minute is None) == (not clear):
        raise click.UsageError("give TOKENS_PER_MINUTE or --clear")
    _change(obj, tokens_per_minute=tokens_per_minute, clear_quota=clear)


# ------------------------------------------------------------------------------------ dlq
@cli.group()
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
    items = ops.dlq_list(obj.deps)
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
        _say("  ".join(parts))
    _say(f"{len(items)} message(s); `review dlq show MESSAGE_ID [--body]` for one, `review dlq redrive` or "
         "`review dlq discard` (ids may be shortened to a unique prefix)")


@dlq.command("show")
@click.argument("message_id")
@click.option("--body", "with_body", is_flag=True, help="Include the whole message body (for intake: your document).")
@click.pass_obj
def dlq_show(obj: Ctx, message_id: str, with_body: bool) -> None:
    """Everything known about one DLQ message: payload, attempts, last error envelope."""
    item = ops.dlq_show(obj.deps, _message_id(obj, message_id), with_body=with_body)
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
    done = redrive.dlq_redrive(obj.deps, None if all_ or not message_id else {_message_id(obj, message_id)},
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
    message_id = _message_id(obj, message_id)
    item = ops.dlq_show(obj.deps, message_id)
    if item is None:
        raise click.ClickException(f"no DLQ message {message_id} (`review dlq list` shows their ids)")
    about = (f"{item.message_id} ({item.queue} DLQ"
             + (f", job {item.job_id}" if item.job_id else "") + (f", chunk {item.chunk_id}" if item.chunk_id else "")
             + f", {(item.envelope.error_code if item.envelope else None) or item.error_code or 'no error code'})")
    if not yes:
        click.confirm(f"discard {about} for good?", abort=True, err=True)
    gone = ops.dlq_discard(obj.deps, message_id, by="cli")
    if gone is None:
        raise click.ClickException(f"no DLQ message {message_id}: someone else redrove or discarded it meanwhile")
    _say(f"discarded {about}" + (f"; recorded as dlq.discarded on {gone.job_id}" if gone.job_id else ""))


# ------------------------------------------------------------------------------------ retry
@cli.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--wait", is_flag=True, help="Wait for the retried jobs to end, showing progress.")
@click.option("--timeout", type=float, default=600.0)
@click.option("--budget-usd", type=float, default=None,
              help="The jobs' budget from now on (above what each has cost): continues a job its budget stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON (one object per job: job_id, retried, action, state).")
@click.pass_obj
def retry(obj: Ctx, job_ids: tuple[str, ...], wait: bool, timeout: float, budget_usd: float | None,
          as_json: bool) -> None:
    """Put failed, dead-lettered or cancelled jobs back to work, keeping finished chunks and checkpoints.

    Works from the job's records, with or without DLQ messages (the job's DLQ copies are removed):
    failed and dead-lettered chunks get a fresh attempt budget, analysts with a mandatory gap run
    again, chunks never started are sent. A job that failed in intake (runtime.intake_exhausted) is
    queued again with its intake message. Exits 1 when a job was not retried (its line says why)."""
    retried: list[str] = []
    refused: list[str] = []
    outcomes: list[Any] = []
    for job_id in [_job_id(obj, j) for j in job_ids]:
        r = redrive.retry(obj.deps, job_id, budget_usd=budget_usd)
        outcomes.append(r.model_dump(mode="json"))
        if not as_json:
            console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.action}",
                          style="" if r.retried else "yellow", markup=False, highlight=False, soft_wrap=True)
        (retried if r.retried else refused).append(job_id)
    if as_json:
        click.echo(json.dumps(outcomes, indent=2))
    if wait and retried:
        _wait(obj, retried, timeout, WATCH_GRACE_S)
    if refused:
        raise click.ClickException(f"not retried: {', '.join(refused)}")


# ------------------------------------------------------------------------------------ cancel
@cli.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--wait", is_flag=True, help="Wait until the jobs are cancelled.")
@click.option("--timeout", type=float, default=120.0)
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON (one object per job: job_id, state, changed, message).")
@click.pass_obj
def cancel(obj: Ctx, job_ids: tuple[str, ...], wait: bool, timeout: float, as_json: bool) -> None:
    """Cancel jobs: no new work starts, chunks in flight stop within one model call, side effects
    already done are compensated, and each job ends `cancelled`. Cancelling twice is cancelling once;
    a job that already ended is left as it is (exit 1, its line says so)."""
    refused: list[str] = []
    job_ids = tuple(_job_id(obj, j) for j in job_ids)
    outcomes: list[Any] = []
    for job_id in job_ids:
        r = lifecycle.request_cancel(obj.deps, job_id, by="cli")
        ok = r.changed or r.state in (JobState.CANCELLING, JobState.CANCELLED)
        outcomes.append(r.model_dump(mode="json"))
        if not as_json:
            console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.message}", style="" if ok else "yellow",
                          markup=False, highlight=False, soft_wrap=True)
        if not ok:
            refused.append(job_id)
    if as_json:
        click.echo(json.dumps(outcomes, indent=2))
    pending = [j for j in job_ids if j not in refused]
    if wait and pending:
        states = watch_jobs(console, obj.deps.jobs, pending, timeout)
        late = [j for j, s in states.items() if s != JobState.CANCELLED.value]
        if late:
            raise click.ClickException(f"not cancelled within {timeout:.0f} s: {', '.join(late)}")
    if refused:
        raise click.ClickException(f"not cancelled: {', '.join(refused)}")


# ------------------------------------------------------------------------------------ approve / reject
def _decide(obj: Ctx, job_id: str, decision: str, as_json: bool = False) -> None:
    from contract_review.sideeffects import approvals

    job_id = _job_id(obj, job_id)
    r = approvals.decide_approval(obj.deps, job_id, decision, by="cli")
    if as_json:
        click.echo(r.model_dump_json(indent=2))
    else:
        console.print(f"{job_id}  {r.state.value if r.state else '-'}  {r.message}",
                      style="" if r.changed else "yellow", markup=False, highlight=False, soft_wrap=True)
    if not r.changed:
        raise click.ClickException(f"{job_id}: {r.message}")


_DECISION_JSON = click.option("--json", "as_json", is_flag=True,
                              help="Print the outcome as JSON (job_id, state, changed, message).")


@cli.command()
@click.argument("job_id")
@_DECISION_JSON
@click.pass_obj
def approve(obj: Ctx, job_id: str, as_json: bool) -> None:
    """A job waiting for approval (a side effect whose outcome stayed unknown; `review status` shows the
    step, its key and the evidence): retry the step with the same key (the external system dedups it)
    and go on. Exit 1 when the job is not waiting."""
    _decide(obj, job_id, "approve", as_json)


@cli.command()
@click.argument("job_id")
@_DECISION_JSON
@click.pass_obj
def reject(obj: Ctx, job_id: str, as_json: bool) -> None:
    """A job waiting for approval: fail it (job.approval_rejected): `compensating` while the side effects it did
    are undone (a ticket closed, a withdrawal published), then `failed`. Again on a job still compensating: the
    compensation is sent again. Exit 1 when the job is neither waiting nor compensating."""
    _decide(obj, job_id, "reject", as_json)


@cli.command()
@click.option("--redrive", is_flag=True, help="Run every dead-lettered compensation again (after fixing the cause).")
@click.option("--json", "as_json", is_flag=True, help="Print the dead letters (or the redrive's outcome) as JSON.")
@click.pass_obj
def compensations(obj: Ctx, redrive: bool, as_json: bool) -> None:
    """The compensation DLQ: undoing a side effect (closing a ticket, publishing a withdrawal) that failed
    on every attempt (sideeffect.compensation_failed). Lists each one with its job, step and error; with
    --redrive runs them again (each keeps its own key: nothing is closed or withdrawn twice)."""
    import json as _json

    from contract_review.sideeffects import saga

    fx = obj.deps.side_effects
    if fx is None or fx.dlq is None:
        raise click.ClickException("this stack has no compensation DLQ (CompensationDlqUrl)")
    if redrive:
        out = saga.redrive_compensations(obj.deps, fx)
        if as_json:
            click.echo(_json.dumps({"compensated": out.compensated, "still_failing": out.dead_lettered}, indent=2))
        else:
            console.print(f"compensated: {len(out.compensated)}  still failing: {len(out.dead_lettered)}")
        if out.dead_lettered:
            raise click.ClickException(f"still failing: {', '.join(out.dead_lettered)}")
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


@cli.command("backfill-open-jobs")
@click.pass_obj
def backfill_open_jobs(obj: Ctx) -> None:
    """Once, after upgrading a stack whose jobs table predates the open-jobs index (`by-open-state`): give every
    open job written before it (queued, running, waiting_approval, cancelling, compensating) its index key, so
    the sweeper finds it again. One scan of the jobs table with your credentials (the pipeline never scans);
    each job is indexed only if its state is still the one read. Safe to run again: it prints 0."""
    n = obj.deps.jobs.backfill_open_index()
    console.print(f"indexed {n} open job(s) written before the open-jobs index")


# ------------------------------------------------------------------------------------ preflight
@cli.command()
@click.option("--model-id", default=None, help="Check this Bedrock model or inference profile id instead.")
@click.option("--region", default=None, help="AWS region to check (the same as `review --region R preflight`).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (ok, target, model: access, latency, quotas, pacing; checks: name, ok, "
                   "line, remedy, redeploy_fixes; or ok false and the error) instead of lines.")
@click.option("--worker", type=click.Choice(["lambda", "fargate"]), default=None,
              help="Check the account for this analysis worker (default: the stack's WorkerKind, or lambda); fargate "
                   "adds the ECS and Application Auto Scaling service-linked roles.")
@click.option("--before-deploy", is_flag=True,
              help="The checks that gate a deploy (`make deploy`): --stack need not exist yet (without it: a first "
                   "deploy with the prod defaults, no local stack needed), and a failure the deploy itself repairs "
                   "(the stack's SDK layer, its batch role) is printed but does not fail.")
@click.pass_obj
def preflight(obj: Ctx, model_id: str | None, region: str | None, as_json: bool, worker: str | None,
              before_deploy: bool) -> None:
    """Before deploying and submitting: one tiny Converse call with the stack's model (access, latency; a global
    profile an SCP keeps out of other regions is named, with the us./eu. profile to deploy instead), the
    tokens-per-minute quota the workers will pace to, and the account: the Powertools layer's SSM parameter exists
    in the region, Lambda's concurrency covers the stack's reservations plus the 100 AWS keeps unreserved, and
    whether the model is offered through batch inference there (informational); for a deployed stack, its batch role,
    its alarm subscribers and whether its functions' SDK layer carries the boto3/botocore this checkout pins; for the
    Fargate worker (the stack's, or --worker fargate), the ECS and Application Auto Scaling service-linked roles exist.
    One line per check, with a command that fixes a failed one. Exits 1 unless the model answers and every account
    check passes (with --before-deploy: every check a deploy does not fix)."""
    from .preflight import PreflightError
    from .preflight import preflight as run

    if not as_json:
        try:
            ok = run(obj.stack, region or obj.region, model_id, echo=click.echo, worker=worker,
                     before_deploy=before_deploy)
        except PreflightError as exc:
            raise click.ClickException(str(exc)) from exc
        sys.exit(0 if ok else 1)
    document: dict[str, Any] = {}
    try:
        ok = run(obj.stack, region or obj.region, model_id, echo=lambda _line: None, document=document,
                 worker=worker, before_deploy=before_deploy)
    except PreflightError as exc:
        ok, document = False, {"ok": False, "error": str(exc)}
    click.echo(json.dumps(document, indent=2))
    sys.exit(0 if ok else 1)


# ------------------------------------------------------------------------------------ demo
@cli.command()
@click.option("--faults", "fault_rate", type=float, default=0.05, show_default=True)
@click.option("--samples", "samples_dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as one JSON document (ok, jobs: job_id, sample, state, report_json, report_md, "
                   "findings, cost_usd, coverage; reliability; completed, total, seconds); progress on stderr.")
def demo(fault_rate: float, samples_dir: Path | None, as_json: bool) -> None:
    """Run the whole pipeline on embedded AWS with the sample contracts, then print the results."""
    from .demo import run_demo

    if not as_json:
        sys.exit(run_demo(console, fault_rate, samples_dir))
    document: dict[str, Any] = {}
    code = run_demo(_STDERR, fault_rate, samples_dir, document=document)
    click.echo(json.dumps(document or {"ok": False, "error": "no samples/*.txt found"}, indent=2))
    sys.exit(code)


def main() -> None:
    cli(obj=None)


if __name__ == "__main__":
    main()
