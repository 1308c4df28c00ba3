"""Intake: validate, create the job (idempotently), chunk, fan out one message per chunk.

Bad input fails in one attempt with a permanent code: recorded on a `failed` job when a job id can be
derived (from the idempotency key, else the inline text's SHA-256, else the document id: the job id
a client computes), otherwise sent to the intake DLQ with its envelope. Claim-checked documents are
read only from the stack's own bucket under `uploads/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .chunking import document_hash, split_into_chunks
from .errors import ErrorEnvelope, ReviewError
from .messages import MAX_DOCUMENT_BYTES, AnalysisMessage, InlineDocument, IntakeMessage, S3Document, parse_intake
from .ports import Deps, Queue
from .records import UPLOADS_PREFIX, ChunkRecord, Job, JobState, document_key, job_id_for


@dataclass(frozen=True)
class IntakeResult:
    job_id: str | None
    created: bool
    state: str
    error: ErrorEnvelope | None = None


def failure_key(body: str) -> tuple[str | None, str]:
    """For a message that failed validation: the key to record the failure under (None: there is none),
    and the document id it names (shown on the failed job). The key is the one a valid message
    would have had where it can be told: the idempotency key, else the SHA-256 of the inline text,
    else the document id."""
    try:
        raw = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(raw, dict):
        return None, ""
    document_id = raw.get("document_id")
    document_id = document_id[:256] if isinstance(document_id, str) else ""
    key = raw.get("idempotency_key")
    if isinstance(key, str) and key:
        return key, document_id
    document = raw.get("document")
    if isinstance(document, dict) and isinstance(document.get("text"), str):
        return document_hash(document["text"]), document_id
    return document_id or None, document_id


def _load_text(deps: Deps, msg: IntakeMessage) -> str:
    if isinstance(msg.document, InlineDocument):
        text = msg.document.text
    else:
        data = _read_upload(deps, msg.document)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ReviewError.of("input.too_large", f"{msg.document.s3_uri}: {len(data):,} bytes > "
                                 f"{MAX_DOCUMENT_BYTES:,}: split the document", step="intake.load")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReviewError.of("input.undecodable", f"{msg.document.s3_uri}: not UTF-8 at byte {exc.start}: "
                                 "convert it to UTF-8 text", step="intake.load") from exc
    if not text.strip():
        raise ReviewError.of("input.empty_document", "document has no text", step="intake.validate")
    return text


def _read_upload(deps: Deps, document: S3Document) -> bytes:
    """The claim-checked document: only from the stack's own bucket, under uploads/ (the intake role
    may read nothing else). The errors name the URI."""
    bucket, key = document.bucket_key
    own = deps.artifacts.bucket
    if bucket != own or not key.startswith(UPLOADS_PREFIX):
        raise ReviewError.of("input.document_forbidden", f"{document.s3_uri} is outside s3://{own}/{UPLOADS_PREFIX}: "
                             f"upload the document there and send its s3_uri", step="intake.load")
    try:
        return deps.artifacts.read_uri(bucket, key)
    except ReviewError as exc:
        if exc.envelope.error_code != "input.document_missing":
            raise
        env = exc.envelope
        raise ReviewError(env.model_copy(update={"message": f"{document.s3_uri} does not exist or may not be read "
                                                            f"({env.message})"[:500]})) from exc


def _record_failure(deps: Deps, body: str, env: ErrorEnvelope, message_id: str, key: str | None,
                    document_id: str = "") -> IntakeResult:
    """A permanent input error: a failed job when there is a key to name it by, else the DLQ."""
    if key is None:
        if not deps.queues.has(Queue.INTAKE_DLQ):
            raise ReviewError(env)  # no DLQ configured: let the queue's redrive take it
        deps.queues.dead_letter(Queue.INTAKE, body, env, source_message_id=message_id)
        return IntakeResult(None, False, "rejected", env)
    job_id = job_id_for(key)
    now = deps.clock()
    job, created = deps.jobs.create(Job(job_id=job_id, state=JobState.FAILED, created_at=now, updated_at=now,
                                        idempotency_key=key, document_id=document_id, error=env,
                                        error_code=env.error_code, source_message_id=message_id, ended_at=now))
    if created:
        deps.jobs.record_event(job_id, "job.failed", error_code=env.error_code, reason="invalid input")
    return IntakeResult(job_id, created, job.state.value, env)


def handle_intake(deps: Deps, body: str, message_id: str = "") -> IntakeResult:
    """Process one intake message. Raises only for transient (retryable) failures."""
    try:
        msg = parse_intake(body)
    except ReviewError as exc:
        return _record_failure(deps, body, exc.envelope, message_id, *failure_key(body))

    try:
        text = _load_text(deps, msg)
    except ReviewError as exc:
        if exc.envelope.retryable:
            raise
        key = msg.idempotency_key or (document_hash(msg.document.text) if isinstance(msg.document, InlineDocument)
                                      else msg.document_id)
        return _record_failure(deps, body, exc.envelope, message_id, key, msg.document_id or "")

    s = deps.settings
    key = msg.idempotency_key or document_hash(text)
    job_id = job_id_for(key)
    chunks = split_into_chunks(text, s.profile.chunk_target_chars, s.profile.chunk_max_chars)
    now = deps.clock()
    job = Job(job_id=job_id, state=JobState.QUEUED, created_at=now, updated_at=now, idempotency_key=key,
              document_id=msg.document_id or "", document_key=document_key(job_id), document_chars=len(text),
              document_sha256=document_hash(text), metadata=msg.model_dump(mode="json")["metadata"], chunk_count=len(chunks),
              analyst_count=s.profile.analyst_count, model_id=s.effective_model_id, model_provider=s.model_provider,
              prompt_version=s.profile.prompt_version, config_hash=s.analysis_config_hash(),
              source_message_id=message_id)
    existing, created = deps.jobs.create(job)
    redelivered = not created and message_id and existing.source_message_id == message_id
    if not created and not (existing.state is JobState.QUEUED
                            or (redelivered and existing.state is JobState.RUNNING)):
        return IntakeResult(job_id, False, existing.state.value)  # duplicate submission
    if created:
        deps.jobs.record_event(job_id, "job.queued", chunk_count=len(chunks), document_chars=len(text))
    else:
        job = existing

    # Idempotent from here on: a crash is finished by this message's redelivery, which sends every
    # chunk again (claims make duplicates harmless). The job is `running` before the first chunk
    # message exists, so no result can arrive for a job that is still `queued`.
    deps.artifacts.put_text(job.document_key, text, "text/plain; charset=utf-8")
    messages = []
    for c in chunks:
        deps.claims.create(ChunkRecord(job_id=job_id, chunk_id=c.chunk_id, chunk_index=c.index, start=c.start,
                                       end=c.end))
        messages.append(AnalysisMessage(
            job_id=job_id, chunk_id=c.chunk_id, chunk_index=c.index, chunk_count=len(chunks), start=c.start,
            end=c.end, text=c.text, max_attempts=s.profile.poison_budget, checkpoint_version=job.config_hash))
    if deps.jobs.transition(job_id, (JobState.QUEUED,), JobState.RUNNING, started_at=deps.clock()):
        deps.jobs.record_event(job_id, "job.running", chunks=len(messages))
    deps.queues.send_analysis(messages)
    return IntakeResult(job_id, created, JobState.RUNNING.value)
