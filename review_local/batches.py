"""`review submit --batch ITEMS.jsonl` and `review batch BATCH_ID`: the Job API's batches (the same core,
`contract_review.operate.api_batches.submit_batch` / `batch_view`), from the command line.

The batch and its jobs belong to the CLI's principal, as if submitted through the API: locally the first
principal of `review up`'s API (its `api_token` reads them over HTTP too); with `--stack`, the caller's IAM
identity (STS GetCallerIdentity), which is what the HTTP API binds a SigV4-signed request to.

An item is an API batch item (`custom_id`, `document` {text | s3_uri}, `document_id`, `metadata`) or, for
convenience, `{"custom_id": ..., "file": "path.txt"}`: the file (relative to the JSONL file) is sent as
the document's text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from contract_review.domain import plain_text
from contract_review.domain.errors import ReviewError
from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller
from contract_review.operate import api_batches

from .api_server import local_principal

LOCAL_PRINCIPAL = local_principal("local-user")  # the first principal of the local API (ApiServer)


def cli_principal(stack: str | None, region: str | None) -> str:
    if stack is None:
        return LOCAL_PRINCIPAL
    import boto3

    return str(boto3.Session(region_name=region).client("sts").get_caller_identity()["Arn"])


def _with_files(items: list[api_batches.RawItem], base: Path) -> list[api_batches.RawItem]:
    """`file` items: the file's text as the document. A file that cannot be read makes its item a fault (its code
    and why), reported on its line like any other bad item: the other items are still submitted."""
    out: list[api_batches.RawItem] = []
    for item in items:
        value = item.value
        if not (isinstance(value, dict) and isinstance(value.get("file"), str) and "document" not in value):
            out.append(item)
            continue
        path = base / str(value["file"])
        rest = {k: v for k, v in value.items() if k != "file"}
        fault: tuple[str, str] | None = None
        try:
            if path.stat().st_size > MAX_DOCUMENT_BYTES:
                fault = ("input.too_large", f"{path}: more than {MAX_DOCUMENT_BYTES:,} bytes: split it")
            else:
                rest["document"] = {"text": plain_text.decoded(str(path), path.read_bytes())}
        except OSError as exc:
            fault = ("input.document_missing", f"{path}: {exc.strerror}")
        except ReviewError as exc:  # not UTF-8 plain text (domain/plain_text.py: the rule intake applies)
            fault = (exc.envelope.error_code, exc.envelope.message)
        out.append(api_batches.RawItem(value if fault else rest, item.where, fault))
    return out


def read_batch_file(path: Path) -> list[api_batches.RawItem]:
    """The file's items, each named by where it is (`line N` of JSON Lines, `item N` of a JSON list)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{path}: not UTF-8 text (at byte {exc.start}): a batch file is JSON Lines in "
                                   "UTF-8") from exc
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    items = api_batches.numbered(parsed) if isinstance(parsed, list) else api_batches.parse_jsonl(raw)
    if not items:
        raise click.ClickException(f"{path}: no items (one JSON object per line, each with a custom_id)")
    return _with_files(items, path.parent)


def submit_batch_file(deps: Deps, who: str, path: Path, key: str | None, console: Console,
                      as_json: bool = False) -> tuple[list[str], list[str]]:
    """Submit the file's items; print one line per item (a rejected one: where it is in the file, its code and
    why), or with `as_json` one JSON object (`batchId`, `replayed`, `items`: `customId`, `where`, `jobId`, `error`
    {code, message}). (job ids accepted, the rejected items' places)."""
    items = read_batch_file(path)
    # the batch's key: what is sent (a file fixed since is a new batch; its good items are still the same jobs)
    sent = hashlib.sha256(json.dumps([[i.where, i.value, i.fault] for i in items], sort_keys=True).encode()).hexdigest()
    manifest, replayed = api_batches.submit_batch(deps, Caller(who), items, key or sent)
    say = (lambda *_a, **_k: None) if as_json else console.print
    say(f"batch {manifest.batch_id}" + ("  (submitted before: the same batch)" if replayed else ""),
        markup=False, highlight=False)
    accepted, rejected = [], []
    records: list[dict[str, object]] = []
    for line in manifest.items:
        name = line.custom_id or "-"
        records.append({"customId": line.custom_id, "where": line.where, "jobId": line.job_id, "error": line.error})
        if line.job_id:
            accepted.append(line.job_id)
            say(f"  {name}  {line.job_id}", markup=False, highlight=False)
        else:
            where = line.where or "?"
            rejected.append(f"{where} ({line.custom_id})" if line.custom_id else where)
            error = line.error or {}
            why = str(error.get("message")).removeprefix(f"{where}: ")
            say(f"  {path} {rejected[-1]}: {error.get('code')}: {why}", style="yellow", markup=False, highlight=False,
                soft_wrap=True)
    if as_json:
        click.echo(json.dumps({"batchId": manifest.batch_id, "replayed": replayed, "items": records}, indent=2))
    return accepted, rejected


def show_batch(deps: Deps, who: str, batch_id: str, as_json: bool, console: Console) -> None:
    manifest = api_batches.batch_manifest(deps, Caller(who), batch_id)
    if manifest is None:
        raise click.ClickException(f"no batch {batch_id} of {who} (`review submit --batch` prints its id)")
    view = api_batches.batch_view(deps, manifest)
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    counts = view["counts"]
    items = view["items"]
    assert isinstance(counts, dict) and isinstance(items, list)
    console.print(f"[bold]{batch_id}[/]  {view['total']} item(s): "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                  + ("  (all ended)" if view["ended"] else ""))
    t = Table("custom id", "job", "status", "error")
    for item in items:
        assert isinstance(item, dict)
        error = item.get("error")
        t.add_row(str(item.get("customId") or "?"), str(item.get("jobId") or ""), str(item.get("status")),
                  f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else "")
    console.print(t)
