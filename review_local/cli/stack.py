"""The stack itself: start the local one (`review up`), serve the status page (`review ui`), check an account and
a model before deploying (`review preflight`), the demo, and the one-off index backfill after an upgrade."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from contract_review.doubles.spec import FaultSpec

from .context import Ctx
from .render import STDERR, console


# ------------------------------------------------------------------------------------ up
@click.command()
@click.option("--faults", "fault_rate", type=float, default=0.0, help="Transient model fault rate (e.g. 0.05).")
@click.option("--seed", type=int, default=7)
@click.option("--workers", type=int, default=None, help="Analysis sandboxes (default: the template's MaximumConcurrency).")
@click.option("--worker", "worker_kind", type=click.Choice(["lambda", "fargate"]), default="lambda", show_default=True,
              help="The CDK context `worker`: Lambda sandboxes, or the Fargate task as long-running pollers.")
@click.option("--no-tickets", is_flag=True,
              help="Without the local fake of the external ticket system (the ticket step is then skipped).")
@click.option("--ticket-faults", default="", metavar="SPEC",
              help="Ticket system failures: rates, e.g. 'error=0.1,timeout_after_write=0.05,hang=3,seed=7', or the next N "
                   "requests, e.g. 'timeout_after_write=x1,lookup_unavailable=x4' (the next ticket's outcome stays "
                   "unknown: its job waits in waiting_approval; the 4 lookups are the ticket step's attempts, so the "
                   "faults end once it waits).")
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
    from ..batch_service import BatchFaults
    from ..embedded import LOCAL_JSON
    from ..instance import AlreadyRunning, UpLock
    from ..stack import LocalStack
    from ..ticket_service import TicketFaults

    out = STDERR if as_json else console
    faults = FaultSpec(seed=seed, transient_rate=fault_rate) if fault_rate else None
    try:
        tickets = None if no_tickets else TicketFaults.parse(ticket_faults)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ticket-faults") from exc
    try:
        batch = BatchFaults.parse(batch_faults)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--batch-faults") from exc
    try:  # one `review up` per checkout: a second one would take over .review/local.json
        lock = UpLock(LOCAL_JSON).acquire()
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from exc
    stack = LocalStack(faults=faults, worker=worker_kind, concurrency={"worker": workers} if workers else {},
                       ticket_faults=tickets, batch_faults=batch)
    try:
        out.print("[bold]synthesizing and deploying the template into embedded AWS...[/]")
        stack.start()
        stack.write_local_json()
        lock.record(endpoint=stack.aws.endpoint, api=stack.api.url if stack.api else None,
                    ui=stack.ui.url if stack.ui else None)
        _print_up(stack, out, batch_faults, ticket_faults)
        if as_json:
            click.echo(json.dumps(_up_document(stack, LOCAL_JSON), indent=2))
            sys.stdout.flush()
        _serve_until_stopped()
    finally:
        _stop(stack, out)
        lock.release()
    # everything it started is stopped and its files written: the interpreter's teardown of embedded AWS's memory
    # (moto's backends, hundreds of thousands of objects) would hold the terminal for seconds more, holding nothing.
    # The `review` program (`main`) then ends without it; a caller in-process (a test) goes on.
    STOPPED_CLEANLY.set()


STOPPED_CLEANLY = threading.Event()  # `review up` stopped all it started: `main` may skip the interpreter's teardown


def _print_up(stack: Any, out: Console, batch_faults: str, ticket_faults: str = "") -> None:
    from ..embedded import LOCAL_JSON

    out.print(f"AWS endpoint: [bold cyan]{stack.aws.endpoint}[/]  region: {stack.aws.region}")
    spec = stack.faults
    out.print("model faults: " + (f"{spec.transient_rate:.0%} transient (throttles, 5xx, timeouts; seed {spec.seed})"
                                  if spec is not None and spec.transient_rate else "none (--faults R injects them)")
              + (f"; ticket system faults: {ticket_faults}" if ticket_faults else ""), soft_wrap=True, markup=False)
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
    out.print(f"wrote {_shown(LOCAL_JSON)}; worker logs in .review/logs/. Ctrl-C to stop (pid {os.getpid()}).",
              soft_wrap=True)


def _shown(path: Path) -> str:
    """A path relative to the working directory when it is under it (`.review/local.json`)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _stop(stack: Any, out: Console) -> None:
    """Say what is stopped, stop it, and say so: a second Ctrl-C meanwhile is ignored (the stop is bounded)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parts = [name for name, running in (("the status page", stack.ui), ("the Job API", stack.api),
                                        ("the ticket system's fake", stack.tickets),
                                        ("the batch inference stand-in", stack.batch_service)) if running]
    if stack.runtime is not None:
        parts.append(f"{len(stack.runtime.sandboxes)} worker processes")
    if stack.aws.endpoint:
        parts.append(f"embedded AWS at {stack.aws.endpoint} (its jobs, reports and dead letters go with it)")
    out.print(f"stopping the local stack (pid {os.getpid()}): {', '.join(parts) or 'nothing had started'}...",
              markup=False, highlight=False, soft_wrap=True)
    started = time.monotonic()
    stack.stop()
    out.print(f"stopped in {time.monotonic() - started:.1f} s", markup=False, highlight=False)


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
@click.command()
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
    from ..api_server import local_principal
    from ..ui_server import UiServer

    principal = None
    if as_name is not None:
        if obj.stack is not None:
            raise click.UsageError("--as acts as a principal of the local stack; against --stack the page is an "
                                   "operator's view")
        from ..embedded import load_local_json

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


@click.command("backfill-open-jobs")
@click.pass_obj
def backfill_open_jobs(obj: Ctx) -> None:
    """Once, after upgrading a stack whose jobs table predates the open-jobs index (`by-open-state`): give every
    open job written before it (queued, running, waiting_approval, cancelling, compensating) its index key, so
    the sweeper finds it again. One scan of the jobs table with your credentials (the pipeline never scans);
    each job is indexed only if its state is still the one read. Safe to run again: it prints 0."""
    n = obj.deps.jobs.backfill_open_index()
    console.print(f"indexed {n} open job(s) written before the open-jobs index")


# ------------------------------------------------------------------------------------ preflight
@click.command()
@click.option("--model-id", default=None, help="Check this Bedrock model or inference profile id instead.")
@click.option("--region", default=None, help="AWS region to check (the same as `review --region R preflight`).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (ok, target, model: access, latency, quotas, pacing; checks: name, ok, "
                   "line, remedy, redeploy_fixes; or ok false and the error) instead of lines.")
@click.option("--worker", type=click.Choice(["lambda", "fargate"]), default=None,
              help="Check the account for this analysis worker (default: the stack's WorkerKind, or lambda); fargate "
                   "adds the ECS and Application Auto Scaling service-linked roles.")
@click.option("--fallbacks", default=None, metavar="ID,ID",
              help="Check these fallback models (comma-separated) instead of the stack's (its ModelFallbacks): each "
                   "as the stack's model is checked (catalogue row, one tiny call, batch quota row).")
@click.option("--before-deploy", is_flag=True,
              help="The checks that gate a deploy (`make deploy`): --stack need not exist yet (without it: a first "
                   "deploy with the prod defaults, no local stack needed), and a failure the deploy itself repairs "
                   "(the stack's SDK layer, its batch role) is printed but does not fail.")
@click.pass_obj
def preflight(obj: Ctx, model_id: str | None, region: str | None, as_json: bool, worker: str | None,
              fallbacks: str | None, before_deploy: bool) -> None:
    """Before deploying and submitting: one tiny Converse call with the stack's model (access, latency; a global
    profile an SCP keeps out of other regions is named, with the us./eu. profile to deploy instead), the
    tokens-per-minute quota the workers will pace to, and the account: the Powertools layer's SSM parameter exists
    in the region, Lambda's concurrency covers the stack's reservations plus the 100 AWS keeps unreserved, and
    whether the model is offered through batch inference there (informational); for a deployed stack, its batch role,
    its alarm subscribers and whether its functions' SDK layer carries the boto3/botocore this checkout pins; for the
    Fargate worker (the stack's, or --worker fargate), the ECS and Application Auto Scaling service-linked roles exist.
    One line per check, with a command that fixes a failed one. Exits 1 unless the model answers and every account
    check passes (with --before-deploy: every check a deploy does not fix). Each model of the fallback chain (the
    stack's -c model_fallbacks, or --fallbacks) is checked the same way, one line each."""
    from ..preflight import PreflightError
    from ..preflight import preflight as run

    if not as_json:
        try:
            ok = run(obj.stack, region or obj.region, model_id, echo=click.echo, worker=worker,
                     before_deploy=before_deploy, fallbacks=fallbacks)
        except PreflightError as exc:
            raise click.ClickException(str(exc)) from exc
        sys.exit(0 if ok else 1)
    document: dict[str, Any] = {}
    try:
        ok = run(obj.stack, region or obj.region, model_id, echo=lambda _line: None, document=document,
                 worker=worker, before_deploy=before_deploy, fallbacks=fallbacks)
    except PreflightError as exc:
        ok, document = False, {"ok": False, "error": str(exc)}
    click.echo(json.dumps(document, indent=2))
    sys.exit(0 if ok else 1)


# ------------------------------------------------------------------------------------ demo
@click.command()
@click.option("--faults", "fault_rate", type=float, default=0.05, show_default=True)
@click.option("--samples", "samples_dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as one JSON document (ok, jobs: job_id, sample, state, report_json, report_md, "
                   "findings, cost_usd, coverage; reliability; completed, total, seconds); progress on stderr.")
def demo(fault_rate: float, samples_dir: Path | None, as_json: bool) -> None:
    """Run the whole pipeline on embedded AWS with the sample contracts, then print the results."""
    from ..demo import run_demo

    if not as_json:
        sys.exit(run_demo(console, fault_rate, samples_dir))
    document: dict[str, Any] = {}
    code = run_demo(STDERR, fault_rate, samples_dir, document=document)
    click.echo(json.dumps(document or {"ok": False, "error": "no samples/*.txt found"}, indent=2))
    sys.exit(code)


COMMANDS = (up, ui, preflight, demo, backfill_open_jobs)
