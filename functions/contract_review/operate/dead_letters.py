"""The dead letters, as an operator reads and acts on them (`review dlq ...`, the status page).

- `dlq_list` / `dlq_show`: each DLQ message joined with its job and chunk records (never the document text, unless
  asked for); `dlq_discard`: delete one that can never be fixed, recorded on its job.
- `dlq_redrive` / `redrive_compensations`: the redrives (`pipeline/redrive.py`, `sideeffects/saga.py`), as the
  operator surface reaches them.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, JsonValue, ValidationError

from contract_review.domain.effects import SideEffects
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import DLQS, Deps, Queue, QueueMessage
from contract_review.domain.records import ChunkStatus, job_id_for
from contract_review.pipeline import redrive
from contract_review.pipeline.intake import failure_key
from contract_review.sideeffects import saga
from contract_review.sideeffects.saga import CompensationResult

QUEUE_OF_DLQ = {dlq: queue for queue, dlq in DLQS.items()}


class DlqChunk(BaseModel):
    status: ChunkStatus
    chunk_index: int
    failures: int
    receives: int
    redeliveries: int
    fence: int
    last_error: ErrorEnvelope | None
    n_calls: int
    retries: dict[str, int]
    claimed_by: str | None


class DlqEntry(BaseModel):
    """A DLQ message joined with its job and chunk records. Never the document text, unless asked
    for (`body`, filled only by `dlq_show(..., with_body=True)`: a user's own message is theirs to see).

    There is no `receive_count`: SQS has no peek, every look at a DLQ is a receive, so the count SQS
    keeps grows each time someone lists it. `attempts` is what the pipeline spent before giving up."""

    message_id: str
    queue: str  # intake | analysis | results
    source_message_id: str | None = None  # the MessageId `send-message` returned, when known
    sent_at: float = 0.0  # epoch s: when we sent it to the DLQ (a message SQS moved keeps its original time)
    moved_by: str  # "pipeline" (with an error envelope) | "sqs" (maxReceiveCount reached, no envelope)
    attempts: int | None = None
    error_code: str | None
    envelope: ErrorEnvelope | None = None
    payload: dict[str, JsonValue]
    job_id: str | None = None
    chunk_id: str | None = None
    job: dict[str, str | None] | None = None  # state, error_code
    chunk: DlqChunk | None = None
    failed_step: str | None = None
    body: str | None = None


_CONSUMER_STEP = {Queue.INTAKE: "intake", Queue.ANALYSIS: "worker", Queue.RESULTS: "aggregate"}


def _intake_payload(body: str) -> tuple[dict[str, JsonValue], str | None]:
    """An intake body as it may be shown (the document text replaced by its length), and its job id
    when one can be told (the job id a client computes: see README)."""
    try:
        raw = json.loads(body)
    except ValueError:
        return {"unparsed": True, "chars": len(body)}, None
    if not isinstance(raw, dict):
        return {"unparsed": True, "chars": len(body)}, None
    document = raw.get("document")
    if isinstance(document, dict) and "text" in document:
        text = document["text"]
        raw["document"] = {**{k: v for k, v in document.items() if k != "text"},
                           "text_chars": len(text) if isinstance(text, str) else None}
    key, _ = failure_key(body)
    return raw, job_id_for(key) if key else None


def _payload(queue: Queue, body: str) -> tuple[dict[str, JsonValue], str | None, str | None]:
    """What may be shown of a message body, and the job and chunk it names."""
    try:
        if queue is Queue.ANALYSIS:
            am = AnalysisMessage.model_validate_json(body)
            return am.model_dump(mode="json", exclude={"text"}) | {"text_chars": len(am.text)}, am.job_id, am.chunk_id
        if queue is Queue.RESULTS:
            rm = ResultMessage.model_validate_json(body)
            return rm.model_dump(mode="json"), rm.job_id, rm.chunk_id
        payload, job_id = _intake_payload(body)  # intake bodies hold document text: shown by size
        return payload, job_id, None
    except ValidationError:
        return {"unparsed": True, "chars": len(body)}, None, None


def _join(deps: Deps, queue: Queue, m: QueueMessage, with_body: bool = False) -> DlqEntry:
    payload, job_id, chunk_id = _payload(queue, m.body)
    job_id = job_id or m.attributes.get("job_id")  # e.g. an intake message whose job the sweeper failed
    envelope = ErrorEnvelope.model_validate_json(m.attributes["envelope"]) if m.attributes.get("envelope") else None
    by_sqs = envelope is None and not m.attributes.get("error_code")
    entry = DlqEntry(message_id=m.message_id, queue=queue.value, sent_at=m.sent_at,
                     # SQS keeps the MessageId when it moves a message to the DLQ; we record it when we do
                     source_message_id=m.attributes.get("source_message_id") or (m.message_id if by_sqs else None),
                     moved_by="sqs" if by_sqs else "pipeline", error_code=m.attributes.get("error_code"),
                     envelope=envelope, payload=payload, job_id=job_id, chunk_id=chunk_id,
                     body=m.body if with_body else None)
    if job_id:
        job = deps.jobs.get(job_id)
        entry.job = {"state": job.state.value if job else None, "error_code": job.error_code if job else None}
    if job_id and chunk_id:
        c = deps.claims.get(job_id, chunk_id)
        if c is not None:
            entry.chunk = DlqChunk.model_validate(c.model_dump())
            entry.envelope = entry.envelope or c.last_error
    if entry.chunk is not None:
        entry.attempts = entry.chunk.failures
    elif by_sqs:
        entry.attempts = deps.settings.profile.queues.max_receive_count  # SQS moved it after this many receives
    elif queue is Queue.INTAKE:
        entry.attempts = 1  # intake dead-letters a permanent input error on its first attempt
    elif entry.envelope is not None and entry.envelope.attempt:
        entry.attempts = entry.envelope.attempt
    entry.failed_step = (entry.envelope.step if entry.envelope else None) or _CONSUMER_STEP[queue]
    return entry


def dlq_reason(entry: DlqEntry) -> tuple[str, str]:
    """Why a letter is dead, as a code and a message: its error envelope's, else the code it was sent with, else SQS
    moved it after its receives ran out (no envelope: the consumer never finished it)."""
    if entry.envelope is not None:
        return entry.envelope.error_code, entry.envelope.message
    if entry.error_code:
        return entry.error_code, f"sent to the {entry.queue} DLQ by the {entry.failed_step or 'pipeline'}"
    return ("runtime.dead_lettered",
            f"SQS moved it after {entry.attempts or 'its'} receive(s) without the {entry.failed_step} finishing it")


def dlq_list(deps: Deps) -> list[DlqEntry]:
    return [_join(deps, queue, m) for dlq, queue in QUEUE_OF_DLQ.items() if deps.queues.has(dlq)
            for m in deps.queues.peek(dlq)]


def dlq_show(deps: Deps, message_id: str, with_body: bool = False) -> DlqEntry | None:
    for dlq, queue in QUEUE_OF_DLQ.items():
        if deps.queues.has(dlq):
            for m in deps.queues.peek(dlq):
                if m.message_id == message_id:
                    return _join(deps, queue, m, with_body)
    return None


def dlq_discard(deps: Deps, message_id: str, by: str) -> DlqEntry | None:
    """Delete one dead letter that can never be fixed (its DLQ alarm stops counting it); a `dlq.discarded` event
    on its job, when it names one, records who discarded what. None when no DLQ holds that message. Every other
    message taken to find it is made visible again at once."""
    found: DlqEntry | None = None
    for dlq, queue in QUEUE_OF_DLQ.items():
        if not deps.queues.has(dlq):
            continue
        for m in deps.queues.take_all(dlq, visibility_s=30):
            if found is None and m.message_id == message_id:
                found = _join(deps, queue, m)
                deps.queues.delete(dlq, m.receipt_handle)
            else:
                deps.queues.extend_visibility(dlq, m.receipt_handle, 0)
    if found is not None and found.job_id and deps.jobs.get(found.job_id) is not None:
        deps.jobs.record_event(found.job_id, "dlq.discarded", dlq_message_id=found.message_id, queue=found.queue,
                               chunk_id=found.chunk_id or "", by=by,
                               error_code=(found.envelope.error_code if found.envelope else None)
                               or found.error_code or "")
    return found



def dlq_redrive(deps: Deps, message_ids: set[str] | None, force: bool = False) -> list[redrive.Redriven]:
    """`review dlq redrive`: the dead letters named (None: all) sent back to work (`redrive.dlq_redrive`)."""
    return redrive.dlq_redrive(deps, message_ids, force=force)


def redrive_compensations(deps: Deps, fx: SideEffects) -> CompensationResult:
    """`review compensations --redrive`: every dead-lettered compensation run again, each with its own key."""
    return saga.redrive_compensations(deps, fx)
