"""`review`: run the pipeline locally and operate any stack (local by default, or `--stack NAME`)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from contract_review import ops, redrive
from contract_review.config import FaultSpec
from contract_review.ports import Deps

from .progress import watch_jobs

console = Console()


class Ctx:
    def __init__(self, stack: str | None, region: str | None):
        self.stack, self.region = stack, region
        self._deps: Deps | None = None

    @property
    def deps(self) -> Deps:
        if self._deps is None:
            from .connect import connect

            try:
                self._deps = connect(self.stack, self.region)
            except FileNotFoundError as exc:
                raise click.ClickException(str(exc)) from exc
        return self._deps


@click.group()
@click.option("--stack", default=None, help="A deployed stack's name (default: the local stack of `review up`).")
@click.option("--region", default=None, help="AWS region of --stack.")
@click.pass_context
def cli(ctx: click.Context, stack: str | None, region: str | None) -> None:
    """Contract review pipeline: local runtime and operator CLI."""
    ctx.obj = Ctx(stack, region)


# ------------------------------------------------------------------------------------ up
@cli.command()
@click.option("--faults", "fault_rate", type=float, default=0.0, help="Transient model fault rate (e.g. 0.05).")
@click.option("--seed", type=int, default=7)
@click.option("--workers", type=int, default=None, help="Analysis sandboxes (default: the template's MaximumConcurrency).")
@click.option("--worker", "worker_kind", type=click.Choice(["lambda", "fargate"]), default="lambda", show_default=True,
              help="The CDK context `worker`: Lambda sandboxes, or the Fargate task as long-running pollers.")
def up(fault_rate: float, seed: int, workers: int | None, worker_kind: str) -> None:
    """Start embedded AWS (moto) with the stack deployed, and the workers, in the foreground."""
    from .stack import LocalStack

    faults = FaultSpec(seed=seed, transient_rate=fault_rate) if fault_rate else None
    stack = LocalStack(faults=faults, worker=worker_kind, concurrency={"worker": workers} if workers else {})
    console.print("[bold]synthesizing and deploying the template into embedded AWS...[/]")
    stack.start()
    stack.write_local_json()
    console.print(f"AWS endpoint: [bold cyan]{stack.aws.endpoint}[/]  region: {stack.aws.region}")
    for k, v in sorted(stack.outputs.items()):
        console.print(f"  {k:22} {v}")
    console.print("wrote .review/local.json; worker logs in .review/logs/. Ctrl-C to stop.")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        console.print("stopping...")
        stack.stop()


# ------------------------------------------------------------------------------------ submit
@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait for the jobs to end, showing progress.")
@click.option("--idempotency-key", default=None, help="Only with one file. Default: a hash of the document.")
@click.option("--timeout", type=float, default=600.0)
@click.pass_obj
def submit(obj: Ctx, files: tuple[Path, ...], wait: bool, idempotency_key: str | None, timeout: float) -> None:
    """Submit documents to the intake queue; print their job ids."""
    if idempotency_key and len(files) > 1:
        raise click.UsageError("--idempotency-key takes one file")
    jobs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise click.ClickException(f"{f}: not UTF-8 text") from exc
        job_id = ops.submit(obj.deps, text, document_id=f.name, idempotency_key=idempotency_key)
        jobs.append(job_id)
        console.print(f"{job_id}  {f}")
    if wait:
        states = watch_jobs(console, obj.deps.jobs, jobs, timeout)
        if any(s != "completed" for s in states.values()):
            sys.exit(1)


# ------------------------------------------------------------------------------------ status & co
@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Show a job: state, progress, errors, and what would happen next."""
    view = ops.job_view(obj.deps, job_id)
    if view is None:
        raise click.ClickException(f"no job {job_id}")
    if as_json:
        click.echo(view.model_dump_json(indent=2))
        return
    c = view.chunks
    console.print(f"[bold]{job_id}[/]  state: [bold]{view.state.value}[/]  chunks settled {c['settled']}/{c['total']}")
    if view.error_code:
        console.print(f"  error: [red]{view.error_code}[/] {view.error.message if view.error else ''}")
    for m in view.missing_chunks:
        console.print(f"  missing chunk {m.chunk_index} {m.chunk_id}: {m.status.value} ({m.error_code})")
    for g in view.mandatory_gaps:
        console.print(f"  mandatory gap: chunk {g.chunk_index} analyst {g.analyst}: {g.status}")
    r = view.reliability
    console.print(f"  model calls {r.model_calls}, retries {r.retries_by_code}, redeliveries {r.redeliveries}")
    for k, v in view.answers.model_dump(mode="json").items():
        console.print(f"  {k.replace('_', ' ')}: {v}")
    console.print("  recent events:")
    for e in view.recent_events:
        detail = ", ".join(f"{k}={v}" for k, v in (e.model_extra or {}).items())
        console.print(f"    {e.at}  {e.type}  {detail}", soft_wrap=True)


@cli.command()
@click.argument("job_id")
@click.option("--timeout", type=float, default=600.0)
@click.pass_obj
def watch(obj: Ctx, job_id: str, timeout: float) -> None:
    """Live progress bar for a job until it ends."""
    states = watch_jobs(console, obj.deps.jobs, [job_id], timeout)
    sys.exit(0 if states.get(job_id) == "completed" else 1)


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of Markdown.")
@click.pass_obj
def report(obj: Ctx, job_id: str, as_json: bool) -> None:
    """Print a job's report."""
    job = obj.deps.jobs.get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    key = job.report_json_key if as_json else job.report_md_key
    if not key:
        raise click.ClickException(f"job {job_id} has no report yet (state {job.state.value})")
    click.echo(obj.deps.artifacts.get_text(key))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def jobs(obj: Ctx, as_json: bool) -> None:
    """List jobs."""
    items = obj.deps.jobs.all()
    if as_json:
        click.echo(json.dumps([j.model_dump(mode="json", exclude_defaults=True) for j in items], indent=2))
        return
    t = Table("job", "state", "chunks", "document", "error")
    for j in items:
        t.add_row(j.job_id, j.state.value, str(j.chunk_count), j.document_id, j.error_code or "")
    console.print(t)


# ------------------------------------------------------------------------------------ dlq
@cli.group()
def dlq() -> None:
    """Inspect and redrive dead letters."""


@dlq.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def dlq_list(obj: Ctx, as_json: bool) -> None:
    """DLQ messages joined with their job and chunk records."""
    items = ops.dlq_list(obj.deps)
    if as_json:
        click.echo(json.dumps([i.model_dump(mode="json") for i in items], indent=2))
        return
    t = Table("message", "queue", "job", "chunk", "error", "failed step", "attempts")
    for i in items:
        t.add_row(i.message_id, i.queue, i.job_id or "", str(i.chunk.chunk_index) if i.chunk else "",
                  (i.envelope.error_code if i.envelope else None) or i.error_code or "", i.failed_step or "",
                  str(i.chunk.failures) if i.chunk else "")
    console.print(t)
    console.print(f"{len(items)} message(s)")


@dlq.command("show")
@click.argument("message_id")
@click.pass_obj
def dlq_show(obj: Ctx, message_id: str) -> None:
    """Everything known about one DLQ message: payload, attempts, last error envelope."""
    item = ops.dlq_show(obj.deps, message_id)
    if item is None:
        raise click.ClickException(f"no DLQ message {message_id}")
    click.echo(item.model_dump_json(indent=2))


@dlq.command("redrive")
@click.argument("message_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Redrive every DLQ message.")
@click.pass_obj
def dlq_redrive(obj: Ctx, message_id: str | None, all_: bool) -> None:
    """Re-inject DLQ messages with a fresh attempt budget (leaves an audit event)."""
    if not message_id and not all_:
        raise click.UsageError("give a MESSAGE_ID or --all")
    done = redrive.dlq_redrive(obj.deps, None if all_ or not message_id else {message_id})
    for d in done:
        console.print(f"{d.message_id}  {d.queue}  {d.job_id or ''}  {d.action}")
    if not done:
        raise click.ClickException("nothing redriven")


# ------------------------------------------------------------------------------------ demo
@cli.command()
@click.option("--faults", "fault_rate", type=float, default=0.05, show_default=True)
@click.option("--samples", "samples_dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def demo(fault_rate: float, samples_dir: Path | None) -> None:
    """Run the whole pipeline on embedded AWS with the sample contracts, then print the results."""
    from .demo import run_demo

    sys.exit(run_demo(console, fault_rate, samples_dir))


def main() -> None:
    cli(obj=None)


if __name__ == "__main__":
    main()
