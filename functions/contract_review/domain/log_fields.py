"""The fields every log line about a job carries: built here, in one place, and bound for the code that runs
on the job's behalf, so a line logged deep in the core carries what its handler knew.

Fields (each only when known at that point; None is left out):
  job_id, chunk_id, step (what is being done: intake, analysis, aggregate, sweep, api), queue (the queue the
  message came from), attempt (the delivery's receive count), lease_deadline (epoch s the claim lapses),
  idempotency_key_sha256 (the key is user text: only its hash), state (the job's), checkpoint_version (the
  claim's fencing token: every checkpoint write of the attempt is conditional on it), external_ids (the SQS
  message id, a ticket's id...), cancel_requested, error_code.
No document text, ever: nothing here takes it.

`bound(fields)` sets them for a block (a handler's record); `bind(fields)` adds to them for the rest of the
block (the worker, once it holds the claim). They live in a context variable: a thread the block starts sees
them when it runs in a copy of the block's context (`contextvars.copy_context().run`, as the analyst pool and
the heartbeat do). `LogFieldsFilter` on a logging handler adds them to every record it emits.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contract_review.domain.records import Job

FIELDS = ("job_id", "chunk_id", "step", "queue", "attempt", "lease_deadline", "idempotency_key_sha256", "state",
          "checkpoint_version", "external_ids", "cancel_requested", "error_code")
RAW_KEY = "idempotency_key"  # never logged as such: `LogFieldsFilter` replaces it with its hash

_CURRENT: contextvars.ContextVar[Mapping[str, object] | None] = contextvars.ContextVar("job_log_fields", default=None)


def _bound() -> Mapping[str, object]:
    return _CURRENT.get() or {}


def key_hash(idempotency_key: str) -> str:
    """The idempotency key as logs show it: a SHA-256 prefix (enough to match two lines, not to read the key)."""
    return hashlib.sha256(idempotency_key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def job_fields(*, job_id: str | None = None, chunk_id: str | None = None, step: str | None = None,
               queue: str | None = None, attempt: int | None = None, lease_deadline: float | None = None,
               idempotency_key: str | None = None, state: str | None = None, checkpoint_version: int | None = None,
               external_ids: Mapping[str, str] | None = None, cancel_requested: bool | None = None,
               error_code: str | None = None) -> dict[str, object]:
    """The one builder of the fields (the key hashed); the ones not known (None) are left out."""
    fields: dict[str, object] = {
        "job_id": job_id, "chunk_id": chunk_id, "step": step, "queue": queue, "attempt": attempt,
        "lease_deadline": round(lease_deadline, 3) if lease_deadline is not None else None,
        "idempotency_key_sha256": key_hash(idempotency_key) if idempotency_key else None,
        "state": str(state) if state is not None else None, "checkpoint_version": checkpoint_version,
        "external_ids": dict(external_ids) if external_ids else None, "cancel_requested": cancel_requested,
        "error_code": error_code,
    }
    return {k: v for k, v in fields.items() if v is not None}


def of_job(job: Job) -> dict[str, object]:
    """What a job record tells: its id, state, key (hashed), whether a cancel was asked, its error code, the
    message it came from and the ids its side effects got (`<step>.<field>`, e.g. `ticket.open.ticket_id`)."""
    ids = {"source_message_id": job.source_message_id} if job.source_message_id else {}
    for effect in job.side_effects:
        ids.update({f"{effect.step}.{k}": str(v) for k, v in effect.result.items()
                    if k.endswith("_id") and isinstance(v, str | int)})
    return job_fields(job_id=job.job_id, state=job.state.value, idempotency_key=job.idempotency_key,
                      cancel_requested=job.cancel_requested_at is not None, error_code=job.error_code,
                      external_ids=ids or None)


def current() -> dict[str, object]:
    """The fields bound here (a copy)."""
    return dict(_bound())


def merged(base: Mapping[str, object], more: Mapping[str, object]) -> dict[str, object]:
    out = {**base, **more}
    ids, more_ids = base.get("external_ids"), more.get("external_ids")
    if isinstance(ids, Mapping) and isinstance(more_ids, Mapping):  # ids add up: the message's and a ticket's
        out["external_ids"] = {**ids, **more_ids}
    return out


@contextmanager
def bound(fields: Mapping[str, object]) -> Iterator[None]:
    """`fields` (from `job_fields`) on every log line of the block, on top of those bound around it."""
    token = _CURRENT.set(merged(_bound(), fields))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def bind(fields: Mapping[str, object]) -> None:
    """Add `fields` for the rest of the enclosing `bound` block (what became known meanwhile). Outside one
    (the core called directly, as tests and the local harness do) nothing: fields never outlive their block."""
    if _CURRENT.get() is not None:
        _CURRENT.set(merged(_bound(), fields))


class LogFieldsFilter(logging.Filter):
    """On a logging handler: every record it emits gets the bound fields it does not carry already, and a raw
    idempotency key passed in `extra` is replaced by its hash."""

    def filter(self, record: logging.LogRecord) -> bool:
        raw = record.__dict__.pop(RAW_KEY, None)
        if isinstance(raw, str) and raw:
            record.__dict__.setdefault("idempotency_key_sha256", key_hash(raw))
        for k, v in _bound().items():
            record.__dict__.setdefault(k, v)
        return True
