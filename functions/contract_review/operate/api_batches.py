"""Submission batches of the Job API (`POST /batches`, `GET /batches/{id}`; `review submit --batch`): each item its
own job through the one submit (`submission.submit`), a manifest (`batches/<batch>.json`) naming each item's job or
its error. Not Bedrock batch inference (`pipeline/batch_inference.py`), which a job's calls may use whatever way it came in."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from pydantic import BaseModel, JsonValue

from contract_review.domain.errors import REGISTRY, ReviewError
from contract_review.domain.keys import batch_key
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller
from contract_review.domain.records import Job, JobState, Submission
from contract_review.operate.api_requests import BatchItem, check_unicode, parse_request
from contract_review.operate.job_view import api_time, job_status
from contract_review.operate.submission import Refused, submit
from contract_review.pipeline import admission

MAX_BATCH_ITEMS = 100  # an HTTP API request must be answered within 29 s: each item is a few AWS calls
_BATCH_ID = re.compile(r"^batch-[0-9a-f]{20}$")


class SubmissionItem(BaseModel):
    custom_id: str | None
    where: str | None = None  # `line N` / `item N` (manifests written before it: None)
    job_id: str | None = None
    error: dict[str, JsonValue] | None = None


class SubmissionBatch(BaseModel):
    batch_id: str
    principal: str
    created_at: float
    items: list[SubmissionItem]



@dataclass(frozen=True)
class RawItem:
    """One item of a batch as it was sent, and where: `line N` of JSON Lines (the line in the body or file, blank
    lines counted) or `item N` of a JSON list. `fault`: why it could not even be read (code, message: a line that
    is no JSON, a file the CLI could not read); such an item is reported, never sent."""

    value: JsonValue
    where: str
    fault: tuple[str, str] | None = None


def numbered(values: list[JsonValue]) -> list[RawItem]:
    """A JSON list's items: `item 1`, `item 2`, ..."""
    return [RawItem(v, f"item {n}") for n, v in enumerate(values, 1)]


def parse_jsonl(raw: str) -> list[RawItem]:
    """JSON Lines: one item per non-blank line, named by its line; a line that is no JSON stays an item (rejected,
    with why)."""
    items: list[RawItem] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(RawItem(json.loads(line), f"line {n}"))
        except ValueError as exc:
            why = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            items.append(RawItem(None, f"line {n}", ("input.invalid", f"not JSON ({why})")))
    return items


def _item_error(code: str, message: str) -> dict[str, JsonValue]:
    return {"code": code, "message": message, "retryable": REGISTRY[code].retryable}


def _submit_item(deps: Deps, who: Caller, batch_id: str, item: RawItem, seen: set[str]) -> SubmissionItem:
    """One item: its own job, or its error (its message starts with where the item is). Never raises for the
    item's own fault."""
    raw = item.value
    custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
    custom_id = custom_id if isinstance(custom_id, str) else None
    if item.fault is not None:
        return SubmissionItem(custom_id=custom_id, where=item.where,
                              error=_item_error(item.fault[0], f"{item.where}: {item.fault[1]}"))
    if custom_id is not None and custom_id in seen:
        return SubmissionItem(custom_id=custom_id, where=item.where, error=_item_error(
            "input.invalid", f"{item.where}: custom_id {custom_id!r} appears twice in the batch"))
    try:
        check_unicode(raw)
        req = parse_request(BatchItem, raw)
        assert isinstance(req, BatchItem)
        seen.add(req.custom_id)
        # without a key: keyed by its document
        done = submit(deps, who, req.submit_request(req.idempotency_key, batch_id))
    except Refused as exc:
        return SubmissionItem(custom_id=custom_id, where=item.where, error=_item_error(
            exc.envelope.error_code, f"{item.where}: {exc.envelope.message}"))
    return SubmissionItem(custom_id=req.custom_id, where=item.where, job_id=done.job_id)


def batch_manifest(deps: Deps, who: Caller, batch_id: str) -> SubmissionBatch | None:
    """The caller's batch; None when there is none (also another principal's: its existence is not revealed)."""
    raw = _get_json(deps, batch_key(batch_id)) if _BATCH_ID.fullmatch(batch_id) else None
    manifest = SubmissionBatch.model_validate_json(raw) if raw else None
    return manifest if manifest is not None and who.owns(manifest.principal) else None


def batch_view(deps: Deps, manifest: SubmissionBatch, base_url: str = "") -> dict[str, JsonValue]:
    """`GET /batches/{id}`: each item's state (URLs under `base_url`)."""
    counts: dict[str, int] = {}
    items: list[JsonValue] = []
    for line in manifest.items:
        if line.job_id is None:
            status, error = "rejected", line.error
        else:
            found: Job | Submission | None = deps.jobs.get(line.job_id) or admission.submission(deps, line.job_id)
            view = job_status(deps, found, base_url) if found is not None else None
            status = str(view["status"]) if view else JobState.QUEUED.value
            error = view["error"] if view and isinstance(view["error"], dict) else None
        counts[status] = counts.get(status, 0) + 1
        items.append({"customId": line.custom_id, "jobId": line.job_id, "status": status, "error": error,
                      "statusUrl": f"{base_url}/jobs/{line.job_id}" if line.job_id else None})
    ended = all(s == "rejected" or JobState(s).terminal for s in counts)
    return {"batchId": manifest.batch_id, "createdAt": api_time(manifest.created_at), "total": len(manifest.items),
            "counts": dict(counts), "ended": ended, "items": items,
            "statusUrl": f"{base_url}/batches/{manifest.batch_id}"}


def submit_batch(deps: Deps, who: Caller, raw_items: list[RawItem], key: str) -> tuple[SubmissionBatch, bool]:
    """Each item its own job; one bad item is reported, never fails the batch. The same batch (key) again
    answers with the manifest already stored."""
    batch_id = "batch-" + hashlib.sha256(f"{who.principal}\n{key}".encode()).hexdigest()[:20]
    manifest_key = batch_key(batch_id)
    stored = _get_json(deps, manifest_key)
    if stored:
        manifest = SubmissionBatch.model_validate_json(stored)
        if who.owns(manifest.principal):
            return manifest, True
    seen: set[str] = set()
    lines = [_submit_item(deps, who, batch_id, item, seen) for item in raw_items]
    manifest = SubmissionBatch(batch_id=batch_id, principal=who.principal, created_at=deps.clock(), items=lines)
    deps.artifacts.put_text(manifest_key, manifest.model_dump_json())
    return manifest, False



def _get_json(deps: Deps, key: str) -> str | None:
    """An object of the bucket, or None when there is none."""
    try:
        return deps.artifacts.read_uri(deps.artifacts.bucket, key).decode("utf-8")
    except ReviewError as exc:
        if exc.envelope.error_code == "input.document_missing":
            return None
        raise

