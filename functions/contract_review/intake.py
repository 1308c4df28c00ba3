"""Intake: validate, create the job (idempotently), chunk, fan out one message per chunk.

Bad input fails in one attempt with a permanent code: recorded on the job when a job id can be
derived (idempotency key or document id), otherwise sent to the intake DLQ with its envelope.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from .chunking import document_hash, split_into_chunks
from .errors import ErrorEnvelope, ReviewError
from .messages import MAX_DOCUMENT_BYTES, AnalysisMessage, InlineDocument, IntakeMessage, parse_intake
from .store import Store


def job_id_for(idempotency_key: str) -> str:
    return "job-" + hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class IntakeResult:
    job_id: str | None
    created: bool
    state: str
    error: ErrorEnvelope | None = None


def _derivable_key(body: str) -> str | None:
    """For a message that failed validation: a key to record the failure under, if any."""
    try:
        raw = json.loads(body)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    for field in ("idempotency_key", "document_id"):
        v = raw.get(field)
        if isinstance(v, str) and v:
            return v
    return None


def _load_text(store: Store, msg: IntakeMessage) -> str:
    if isinstance(msg.document, InlineDocument):
        text = msg.document.text
    else:
        bucket, key = msg.document.bucket_key
        try:
            data = store.get_object_bytes(bucket, key)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "NoSuchBucket", "AccessDenied", "404", "403") or status in (403, 404):
                raise ReviewError.of("input.document_missing", f"{code} for the referenced object",
                                     provider_code=code, http_status=status, step="intake.load") from exc
            raise
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ReviewError.of("input.too_large", f"{len(data)} bytes > {MAX_DOCUMENT_BYTES}", step="intake.load")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReviewError.of("input.undecodable", f"not UTF-8 at byte {exc.start}", step="intake.load") from exc
    if not text.strip():
        raise ReviewError.of("input.empty_document", "document has no text", step="intake.validate")
    return text


def _record_failure(store: Store, body: str, env: ErrorEnvelope, message_id: str, key: str | None) -> IntakeResult:
    """A permanent input error: a failed job when there is a key to name it by, else the DLQ."""
    if key is None:
        dlq = store.s.intake_dlq_url
        if not dlq:
            raise ReviewError(env)  # no DLQ configured: let the queue's redrive take it
        store.send_to_dlq(dlq, body, env, {"source_message_id": message_id})
        return IntakeResult(None, False, "rejected", env)
    job_id = job_id_for(key)
    now = store.clock()
    job, created = store.create_job({
        "job_id": job_id, "state": "failed", "created_at": now, "updated_at": now, "idempotency_key": key,
        "error": env.model_dump(mode="json"), "error_code": env.error_code, "chunk_count": 0,
    })
    if created:
        store.event(job_id, "job.failed", error_code=env.error_code, reason="invalid input")
    return IntakeResult(job_id, created, job.get("state", "failed"), env)


def handle_intake(store: Store, body: str, message_id: str = "") -> IntakeResult:
    """Process one intake message. Raises only for transient (retryable) failures."""
    try:
        msg = parse_intake(body)
    except ReviewError as exc:
        return _record_failure(store, body, exc.envelope, message_id, _derivable_key(body))

    try:
        text = _load_text(store, msg)
    except ReviewError as exc:
        if exc.envelope.retryable:
            raise
        key = msg.idempotency_key or msg.document_id
        if key is None and isinstance(msg.document, InlineDocument):
            key = document_hash(msg.document.text)
        return _record_failure(store, body, exc.envelope, message_id, key)

    s = store.s
    key = msg.idempotency_key or document_hash(text)
    job_id = job_id_for(key)
    chunks = split_into_chunks(text, s.profile.chunk_target_chars, s.profile.chunk_max_chars)
    now = store.clock()
    document_key = f"documents/{job_id}.txt"
    job: dict[str, Any] = {
        "job_id": job_id, "state": "queued", "created_at": now, "updated_at": now, "idempotency_key": key,
        "document_id": msg.document_id or "", "document_key": document_key, "document_chars": len(text),
        "document_sha256": document_hash(text), "metadata": msg.metadata, "chunk_count": len(chunks),
        "analyst_count": s.profile.analyst_count, "model_id": s.effective_model_id,
        "model_provider": s.model_provider, "prompt_version": s.profile.prompt_version,
        "config_hash": s.analysis_config_hash(), "source_message_id": message_id,
    }
    existing, created = store.create_job(job)
    redelivered = not created and message_id and existing.get("source_message_id") == message_id
    if not created and not (existing.get("state") == "queued" or (redelivered and existing.get("state") == "running")):
        return IntakeResult(job_id, False, existing.get("state", "unknown"))  # duplicate submission
    if created:
        store.event(job_id, "job.queued", chunk_count=len(chunks), document_chars=len(text))
    job = existing if not created else job

    # Idempotent from here on: a crash is finished by this message's redelivery, which sends every
    # chunk again (claims make duplicates harmless). The job is `running` before the first chunk
    # message exists, so no result can arrive for a job that is still `queued`.
    store.put_object(document_key, text, "text/plain; charset=utf-8")
    bodies = []
    for c in chunks:
        store.create_chunk_record(job_id, c.chunk_id, {"chunk_index": c.index, "start": c.start, "end": c.end})
        bodies.append(AnalysisMessage(
            job_id=job_id, chunk_id=c.chunk_id, chunk_index=c.index, chunk_count=len(chunks), start=c.start,
            end=c.end, text=c.text, max_attempts=s.profile.poison_budget, checkpoint_version=job["config_hash"],
        ).model_dump_json())
    if store.transition(job_id, ["queued"], "running", {"started_at": store.clock()}):
        store.event(job_id, "job.running", chunks=len(bodies))
    store.send_analysis(bodies)
    return IntakeResult(job_id, created, "running")
