"""Admission: the one way a document is taken in, whoever sends it: intake (a message on the queue), and the one
submit of the Job API, `review submit` and the status page (`operate/submission.py`).

- `document_text`: the document checks. The text of an inline document, or of the claim-checked upload an
  `s3_uri` names, read only from the stack's own bucket and only where its sender may put documents
  (`upload_area`): a Job API caller's own `uploads/principals/<owner>/`, a queue sender's
  `queue_uploads_prefix` (default `uploads/`) but never another principal's uploads. At most
  MAX_DOCUMENT_BYTES (never more is read), UTF-8, not blank. Otherwise a `ReviewError` with the stable code of
  the check: `input.document_forbidden`, `input.document_missing`, `input.too_large`, `input.undecodable`,
  `input.empty_document` (permanent). A failed read keeps its own envelope (a throttled S3 is retryable).
- `intake_body`: the one builder of the intake message (schema v1, `messages.IntakeMessage`), from the job's
  options (`JobOptions`): the text inline
  while it fits in a message, else by claim check in the sender's upload area (`<area><job>.txt`), with the idempotency key, the
  document id, metadata, budget and principal. A sender that answers its caller (the Job API) validates it
  first with `messages.parse_intake`, exactly as intake will; a queue sender (`review submit`) leaves that
  to intake, which records a failure under the job id the key names.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from contract_review.config.fleet import CALLS_PER_CHUNK
from contract_review.config.settings import Settings
from contract_review.domain import cost, plain_text
from contract_review.domain.errors import ReviewError
from contract_review.domain.keys import submission_key
from contract_review.domain.messages import MAX_DOCUMENT_BYTES, MAX_INLINE_CHARS, InlineDocument, S3Document
from contract_review.domain.model import prefix_tokens, traits_for
from contract_review.domain.ports import Deps
from contract_review.domain.principals import PRINCIPAL_UPLOADS_PREFIX, uploads_prefix
from contract_review.domain.records import Inference, Priority, Submission, Usage, job_id_for
from contract_review.review.analysts import analysts_for, build_request
from contract_review.review.chunking import Chunk, chunk_document

MAX_INLINE_BYTES = 200_000  # inline text in a message, in UTF-8 bytes (SQS's 256 KiB is the whole message)


class TextDocument(BaseModel):
    """Inline text as a submitter gives it (the Job API): bounded by the document checks (MAX_DOCUMENT_BYTES, not
    blank), not by what a queue message takes inline (`InlineDocument`): `intake_body` sends a text that does not
    fit in a message by claim check."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The contract text, UTF-8.")


Document = InlineDocument | TextDocument | S3Document


# ------------------------------------------------------------------------------ the document checks
def upload_area(settings: Settings, principal: str | None) -> str:
    """Where a sender's claim-checked documents live: a Job API caller's own prefix, else the queue's."""
    return uploads_prefix(principal) if principal is not None else settings.queue_uploads_prefix


def document_text(deps: Deps, document: Document, principal: str | None = None) -> str:
    """The document's text, through the checks every way in makes (the errors name the URI of an upload).
    `principal`: the Job API caller the document is read for (None: a sender to the queue)."""
    if isinstance(document, S3Document):
        data = _read_upload(deps, document, principal)  # at most one byte over the limit: a larger one is not read
        if len(data) > MAX_DOCUMENT_BYTES:  # (so its size is not known: "more than")
            raise ReviewError.of("input.too_large", f"{document.s3_uri}: more than {MAX_DOCUMENT_BYTES:,} bytes: "
                                 "split the document", step="intake.load")
        text = plain_text.decoded(document.s3_uri, data)
    else:
        text = plain_text.plain("document.text", document.text)
        _check_size("document.text", len(text.encode("utf-8")))
    if _blank(text):
        raise ReviewError.of("input.empty_document", "document has no text (nothing but blanks, control or invisible "
                             "format characters)", step="intake.validate")
    return text


def _blank(text: str) -> bool:
    """No visible character: only whitespace, controls (Cc) and format characters (Cf: zero-width spaces and
    joiners, BOMs, bidi marks, soft hyphens), which no analyst can quote a clause from."""
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in text)


def _read_upload(deps: Deps, document: S3Document, principal: str | None) -> bytes:
    """The claim-checked document: only from the stack's own bucket, in the sender's upload area (nothing else
    is read), and never more than one byte past MAX_DOCUMENT_BYTES (enough to refuse it as too large)."""
    bucket, key = document.bucket_key
    own, area = deps.artifacts.bucket, upload_area(deps.settings, principal)
    if bucket != own or not key.startswith(area) or (principal is None and key.startswith(PRINCIPAL_UPLOADS_PREFIX)):
        how = ("upload it with POST /uploads and send the s3Uri it answers"
               if principal is not None else "upload the document there and send its s3_uri (`review submit` does)")
        raise ReviewError.of("input.document_forbidden", f"{document.s3_uri} is outside s3://{own}/{area}"
                             + (f" (except {PRINCIPAL_UPLOADS_PREFIX}: the Job API callers' own uploads)"
                                if principal is None else ", the caller's own uploads") + f": {how}",
                             step="intake.load")
    try:
        return deps.artifacts.read_uri(bucket, key, max_bytes=MAX_DOCUMENT_BYTES)
    except ReviewError as exc:
        if exc.envelope.error_code != "input.document_missing":
            raise
        env = exc.envelope
        raise ReviewError(env.model_copy(update={"message": f"{document.s3_uri} does not exist or may not be read "
                                                            f"({env.message})"[:500]})) from exc


def _check_size(where: str, size: int) -> None:
    if size > MAX_DOCUMENT_BYTES:
        raise ReviewError.of("input.too_large", f"{where}: {size:,} bytes > {MAX_DOCUMENT_BYTES:,}: split the document",
                             step="intake.load")


# ------------------------------------------------------------------------------ who sent it
def submission(deps: Deps, job_id: str) -> Submission | None:
    """The Job API's submission record of `job_id` (`records.Submission`); None when there is none."""
    try:
        raw = deps.artifacts.read_uri(deps.artifacts.bucket, submission_key(job_id))
    except ReviewError as exc:
        if exc.envelope.error_code != "input.document_missing":
            raise
        return None
    return Submission.model_validate_json(raw)


def check_principal(deps: Deps, principal: str, key: str | None, sha: str | None = None) -> None:
    """A message that names a `principal` is the Job API's only when the API's own submission record (which
    only the API's role may write, before it sends) binds the message's job to that principal, and (`sha`, once
    the text is read) to this very document. Anything else is a sender to the intake queue acting as an API
    caller: `input.invalid`. Intake checks before it reads a document from that principal's uploads."""
    record = submission(deps, job_id_for(key)) if key else None
    if record is None or record.principal != principal or sha not in (None, record.document_sha256):
        raise ReviewError.of("input.invalid", "principal: only the Job API sets it (and only on the jobs it "
                             "submits); a message sent to the intake queue leaves it out", step="intake.parse")


# ------------------------------------------------------------------------------ the budget, before any call
def estimate(settings: Settings, text: str, chunks: Sequence[Chunk] | None = None) -> Usage:
    """What reviewing `text` is expected to cost (cost.estimate_document) on the dearest model of the deploy's chain
    (`Settings.model_chain`: a job may fall back to any of them, so a budget admitted at a cheaper model's price
    cannot be overrun by a fallback): its chunks as intake cuts them (`chunks`, when the caller has cut them
    already), each one's cached prefix as the analysts send it."""
    spec = analysts_for(1)[0]
    cut = chunks if chunks is not None else chunk_document(text, settings.profile.review)

    def on(model_id: str) -> Usage:
        prefixes = [prefix_tokens(model_id, build_request(spec, "locate", c, None, None)) for c in cut]
        return cost.estimate_document(settings.profile.prices, model_id, prefixes, CALLS_PER_CHUNK,
                                      traits_for(model_id).min_cache_tokens)
    return max((on(m) for m in settings.model_chain), key=lambda u: u.model_micro_usd)


def effective_budget(settings: Settings, budget_usd: float | None) -> float | None:
    """A job's budget: its own `budget_usd`, else the stack's default per-job budget (profile limits)."""
    return budget_usd if budget_usd is not None else settings.profile.limits.default_budget_usd


def check_budget(settings: Settings, text: str, budget_usd: float | None,
                 chunks: Sequence[Chunk] | None = None) -> int | None:
    """Refuse a budget the document's estimate is over (`job.budget_insufficient`), before any model call: the
    same check for `review submit`, `POST /jobs` and intake. Without `budget_usd` the stack's default per-job
    budget applies. The estimate (micro-dollars), None when no budget applies."""
    budget_usd_ = effective_budget(settings, budget_usd)
    if budget_usd_ is None:
        return None
    budget = cost.micro_usd(Decimal(str(budget_usd_)))
    expected = estimate(settings, text, chunks=chunks).model_micro_usd
    if expected > budget:
        whose = "its budget" if budget_usd is not None else "the stack's default per-job budget (default_budget_usd)"
        raise ReviewError.of(
            "job.budget_insufficient",
            f"this document's estimated cost, {cost.format_usd(expected)} of model tokens, is over {whose} "
            f"{cost.format_usd(budget)}: send it with a budget of at least {cost.format_usd(expected)} "
            "(--budget-usd / budget_usd)" + (", or without one" if budget_usd is not None
                                             and settings.profile.limits.default_budget_usd is None else ""),
            step="admission")
    return expected


# ------------------------------------------------------------------------------ the intake message
class JobOptions(BaseModel):
    """A job's options, as its sender gives them (`review submit`'s flags, a `POST /jobs` body): the one object that
    carries them from the sender to the intake message (`operate/submission.py` `SubmitRequest` adds how it is
    sent). Each is the intake message's field of that name (`messages.IntakeMessage`); one not given is left out."""

    model_config = ConfigDict(frozen=True)
    document_id: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    budget_usd: float | None = None
    priority: Priority | None = None
    inference: Inference | None = None
    deadline_hours: float | None = None


def intake_body(deps: Deps, text: str, options: JobOptions, *, key: str, upload: S3Document | None = None,
                principal: str | None = None) -> str:
    """The intake message (JSON) for a document whose text is at hand, with the job's `options`, under idempotency
    key `key`. `upload`: the claim check the text was read from, named as it is; else the text goes inline when it
    fits in a message, or is stored under `uploads/` (the key's job id) and named by its s3_uri. `principal`: the Job
    API's caller (only the API sets it)."""
    body: dict[str, JsonValue] = {"schema_version": 1,
                                  "document": upload.model_dump() if upload else _document(deps, key, text, principal),
                                  "idempotency_key": key, "metadata": dict(options.metadata)}
    if options.document_id:
        body["document_id"] = options.document_id
    if options.budget_usd is not None:
        body["budget_usd"] = options.budget_usd
    if options.priority is not None:
        body["priority"] = options.priority.value
    if options.inference is not None:
        body["inference"] = options.inference.value
    if options.deadline_hours is not None:
        body["deadline_hours"] = options.deadline_hours
    if principal is not None:
        body["principal"] = principal
    return json.dumps(body)


def _document(deps: Deps, key: str, text: str, principal: str | None) -> dict[str, JsonValue]:
    """The `document` of the message for `text`: inline, or by claim check (in the sender's upload area) when it
    is too large for a message."""
    if len(text) <= MAX_INLINE_CHARS and len(text.encode("utf-8")) <= MAX_INLINE_BYTES:
        return {"text": text}
    upload = f"{upload_area(deps.settings, principal)}{job_id_for(key)}.txt"
    deps.artifacts.put_text(upload, text, "text/plain; charset=utf-8")
    return {"s3_uri": f"s3://{deps.artifacts.bucket}/{upload}"}
