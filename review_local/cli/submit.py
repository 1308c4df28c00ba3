"""`review submit` (files, or a batch of the Job API) and `review batch`: what is refused before anything is
sent, and the CLI's own resubmission rule (the same document again, for a job that ended without completing,
retries it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from contract_review.domain import plain_text
from contract_review.domain.errors import ReviewError
from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.records import Inference, Priority
from contract_review.operate import ids, submission
from contract_review.operate.submission import KeyConflict, SubmitRequest, check_document, job_id_of

from .context import Ctx
from .jobs import wait_for_jobs
from .render import STDERR, console

SUBMIT_GRACE_S = 10.0  # a just-submitted job id without a record: wait this long (and while intake is busy)


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


@click.command()
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
@click.option("--metadata", "metadata", multiple=True, metavar="KEY=VALUE",
              help="Metadata echoed on the job and in its reports (repeatable; each value a string). "
                   "`reviewing_party=NAME` names the party the review is for in the report's risk legend.")
@click.option("--timeout", type=float, default=600.0)
@click.option("--json", "as_json", is_flag=True,
              help="Print the submissions as JSON (a list of {job_id, file, note}; with --batch the batch's items).")
@click.pass_obj
def submit(obj: Ctx, files: tuple[Path, ...], batch_file: Path | None, wait: bool, idempotency_key: str | None,
           budget_usd: float | None, priority: str | None, inference: str | None, deadline_hours: float | None,
           metadata: tuple[str, ...], timeout: float, as_json: bool) -> None:
    """Submit documents (UTF-8 text files) to the intake queue; print their job ids.

    The same document twice is one job (its id is a hash of the text): it is sent and waited on once.
    With --batch, a batch of the Job API (each item its own job; a bad item never stops the others)."""
    _check_submit_options(files, batch_file, idempotency_key, priority, inference, deadline_hours)
    meta = _metadata(metadata)
    if batch_file is not None and meta:
        raise click.UsageError("--metadata is for FILES; each batch item carries its own \"metadata\"")
    if batch_file is not None:
        _submit_batch(obj, batch_file, bool(files), wait, idempotency_key, timeout, as_json)
        return
    texts = [(f, _read_document(f)) for f in files]
    for f, text in texts:  # what intake would refuse at once is refused here, before anything is sent
        try:
            check_document(obj.deps, text)
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
        job_id = job_id_of(text, idempotency_key)
        if job_id in jobs:
            said(job_id, f, f"the same document as {jobs[job_id]}: one job, not sent again")
            continue
        try:  # the one submit; `review submit` of a job that ended without completing retries it (`retry_ended`)
            done = submission.submit(obj.deps, None, SubmitRequest.inline(
                text, document_id=_document_id(f), idempotency_key=idempotency_key, budget_usd=budget_usd,
                priority=Priority(priority) if priority else None, inference=Inference(inference) if inference else None,
                deadline_hours=deadline_hours, metadata=meta, retry_ended=True))
        except KeyConflict as exc:  # as the Job API and intake refuse it: one line and exit 1, never that other job
            raise click.ClickException(
                f"input.key_conflict: idempotency key {idempotency_key!r} names job {exc.job_id}, made from another "
                f"{exc.conflict.removeprefix('another ')}; send {f} with its own key (without --idempotency-key, the "
                "document's SHA-256 is its key)") from exc
        except ReviewError as exc:  # job.budget_insufficient: nothing was sent
            raise click.ClickException(f"{f}: {exc.envelope.error_code}: {exc.envelope.message}") from exc
        shas[job_id] = done.document_sha256
        jobs[job_id] = f
        said(job_id, f, done.note)
    if as_json:
        click.echo(json.dumps(records, indent=2))
    if wait:  # with --json, progress goes to stderr: stdout is the JSON alone
        wait_for_jobs(obj, list(jobs), timeout, SUBMIT_GRACE_S, documents=shas, out=STDERR if as_json else console)


def _metadata(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--metadata KEY=VALUE` pairs as the message's metadata (each value a string); a pair without `=` is refused."""
    bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0].strip()]
    if bad:
        raise click.BadParameter(f"{bad[0]!r}: give KEY=VALUE, e.g. reviewing_party=\"Acme Ltd\"",
                                 param_hint="--metadata")
    return {k.strip(): v for k, v in (p.split("=", 1) for p in pairs)}


def _read_document(f: Path) -> str:
    size = f.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise click.ClickException(f"{f}: {size:,} bytes, more than the {MAX_DOCUMENT_BYTES:,} a document may have: "
                                   "split it")
    try:  # the rule intake applies (domain/plain_text.py), with the advice the bytes give, before anything is sent
        return plain_text.decoded(str(f), f.read_bytes())
    except ReviewError as exc:
        raise click.ClickException(f"{exc.envelope.error_code}: {exc.envelope.message}") from exc


def _document_id(f: Path) -> str:
    """The file's name as a valid document_id (schema: [A-Za-z0-9._:/-], at most 256)."""
    return re.sub(r"[^A-Za-z0-9._:/\-]", "_", f.name)[:256]


def _submit_batch(obj: Ctx, path: Path, with_files: bool, wait: bool, key: str | None, timeout: float,
                  as_json: bool = False) -> None:
    from ..batches import cli_principal, submit_batch_file

    if with_files:
        raise click.UsageError("give FILE... or --batch ITEMS.jsonl, not both")
    accepted, rejected = submit_batch_file(obj.deps, cli_principal(obj.stack, obj.region), path, key, console,
                                           as_json=as_json)
    if wait and accepted:
        wait_for_jobs(obj, accepted, timeout, SUBMIT_GRACE_S, out=STDERR if as_json else console)
    if rejected:
        total = len(accepted) + len(rejected)
        done = (f"the other {len(accepted)} submitted" if accepted else "nothing submitted")
        raise click.ClickException(f"{len(rejected)} of {total} item(s) of {path} rejected ({done}): "
                                   f"{', '.join(rejected)}")


@click.command("batch")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def batch(obj: Ctx, batch_id: str, as_json: bool) -> None:
    """Each item of a batch (`review submit --batch`, or the Job API's POST /batches): its job and state. Also
    accepts a unique prefix of the batch id."""
    from ..batches import cli_principal, show_batch

    try:
        batch_id = ids.resolve_batch_id(obj.deps, batch_id)
    except ids.AmbiguousId as exc:
        raise click.ClickException(str(exc)) from exc
    show_batch(obj.deps, cli_principal(obj.stack, obj.region), batch_id, as_json, console)


COMMANDS = (submit, batch)
