"""`review submit --batch ITEMS.jsonl` and `review batch BATCH_ID`: the Job API's batches (the same core,
`contract_review.operate.api.submit_batch` / `batch_view`), from the command line.

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

from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller
from contract_review.operate import api

from .api_server import local_principal

LOCAL_PRINCIPAL = local_principal("local-user")  # the first principal of the local API (ApiServer)


def cli_principal(stack: str | None, region: str | None) -> str:
    if stack is None:
        return LOCAL_PRINCIPAL
    import boto3

    return str(boto3.Session(region_name=region).client("sts").get_caller_identity()["Arn"])


def _with_files(items: list[object], base: Path) -> list[object]:
    """`file` items: the file's text as the document (a file that cannot be read stops the command: one line)."""
    out: list[object] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("file"), str) and "document" not in item:
            path = base / item["file"]
            rest = {k: v for k, v in item.items() if k != "file"}
            try:
                if path.stat().st_size > MAX_DOCUMENT_BYTES:
                    raise click.ClickException(f"{path}: more than {MAX_DOCUMENT_BYTES:,} bytes: split it")
                out.append({**rest, "document": {"text": path.read_text(encoding="utf-8")}})
            except OSError as exc:
                raise click.ClickException(f"{path} (item {item.get('custom_id')!r}): {exc.strerror}") from exc
            except UnicodeDecodeError as exc:
                raise click.ClickException(f"{path} (item {item.get('custom_id')!r}): not UTF-8 text (at byte "
                                           f"{exc.start}): convert it to UTF-8 first") from exc
            continue
        out.append(item)
    return out


def submit_batch_file(deps: Deps, who: str, path: Path, key: str | None, console: Console) -> tuple[list[str], list[str]]:
    """Submit the file's items; print one line per item. (job ids accepted, custom ids rejected)."""
    raw = path.read_text(encoding="utf-8")
    parsed: object = None
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    items = list(parsed) if isinstance(parsed, list) else api.parse_jsonl(raw)
    if not items:
        raise click.ClickException(f"{path}: no items (one JSON object per line, each with a custom_id)")
    items = _with_files(items, path.parent)
    manifest, replayed = api.submit_batch(deps, Caller(who), items, key or hashlib.sha256(raw.encode()).hexdigest())
    console.print(f"batch {manifest.batch_id}" + ("  (submitted before: the same batch)" if replayed else ""),
                  markup=False, highlight=False)
    accepted, rejected = [], []
    for line in manifest.items:
        name = line.custom_id or "?"
        if line.job_id:
            accepted.append(line.job_id)
            console.print(f"  {name}  {line.job_id}", markup=False, highlight=False)
        else:
            rejected.append(name)
            error = line.error or {}
            console.print(f"  {name}  rejected: {error.get('code')} {error.get('message')}", style="yellow",
                          markup=False, highlight=False, soft_wrap=True)
    return accepted, rejected


def show_batch(deps: Deps, who: str, batch_id: str, as_json: bool, console: Console) -> None:
    try:
        manifest = api.batch_manifest(deps, Caller(who), batch_id)
    except api.ApiError as exc:
        raise click.ClickException(f"no batch {batch_id} of {who} (`review submit --batch` prints its id)") from exc
    view = api.batch_view(deps, manifest)
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
