"""Operator views and actions shared by the CLI (and, later, the Job API).

- `job_view`: the job record answering the six questions (DESIGN rule 7).
- `dlq_list` / `dlq_show`: DLQ messages joined with their job and chunk records.
- `dlq_redrive`: re-inject with a fresh attempt budget, leaving an audit event. Works on moto
  (no StartMessageMoveTask): receive, re-send, delete.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from collections import Counter
from typing import Any

from pydantic import ValidationError

from .aggregator import reliability
from .chunking import document_hash
from .intake import job_id_for
from .messages import MAX_INLINE_CHARS, AnalysisMessage, ResultMessage
from .store import TERMINAL_JOB_STATES, Store
from .sweeper import chunk_message


def job_view(store: Store, job_id: str) -> dict[str, Any] | None:
    job = store.get_job(job_id)
    if job is None:
        return None
    chunks = store.chunk_records(job_id) if job.get("chunk_count") else []
    by_status = Counter(c.get("status", "pending") for c in chunks)
    settled = len(job.get("settled") or ())
    state = job.get("state")
    last_cp = max((float(c.get("settled_at", 0)) for c in chunks if c.get("status") == "done"), default=None)
    dead = [c for c in chunks if c.get("status") in ("dead_lettered", "failed")]
    view = {
        "job_id": job_id, "state": state, "document_id": job.get("document_id"),
        "chunks": {"total": int(job.get("chunk_count") or 0), "settled": settled, **by_status},
        "progress": (settled / int(job["chunk_count"])) if job.get("chunk_count") else (1.0 if state in TERMINAL_JOB_STATES else 0.0),
        "error_code": job.get("error_code"), "error": job.get("error"),
        "missing_chunks": [{"chunk_id": c["chunk_id"], "chunk_index": c.get("chunk_index"), "status": c.get("status"),
                            "error_code": (c.get("last_error") or {}).get("error_code")} for c in dead],
        "mandatory_gaps": job.get("mandatory_gaps") or [],
        "reliability": job.get("reliability") or reliability(chunks),
        "report": {"json": job.get("report_json_key"), "markdown": job.get("report_md_key")},
        "created_at": job.get("created_at"), "ended_at": job.get("ended_at"),
        "model_id": job.get("model_id"), "prompt_version": job.get("prompt_version"),
        "recent_events": [{"at": _iso(e["at"]), "type": e["type"], **e.get("detail", {})}
                          for e in store.events(job_id)[-10:]],
        # the six questions
        "answers": {
            "state": state,
            "last_durable_checkpoint": (f"{by_status.get('done', 0)} of {job.get('chunk_count', 0)} chunks settled done"
                                        + (f", last at {_iso(last_cp)}" if last_cp else "")),
            "side_effects_done": [k for k in ("report_json_key", "report_md_key") if job.get(k)],
            "retry_would": ("nothing: the job is complete" if state == "completed" else
                            f"redrive {len(dead)} chunk(s) from the DLQ; finished chunks and analysts are reused"
                            if dead else "resume unsettled chunks from their checkpoints"),
            "if_cancelled_now": ("nothing: it has ended" if state in TERMINAL_JOB_STATES else
                                 "workers stop at the next stage entry; checkpoints stay; no report is written"),
            "if_it_fails_again": "chunk messages go to the analysis DLQ with their error envelope; the job ends "
                                 "`dead_lettered` listing them",
        },
    }
    return view


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds")


def _join(store: Store, queue: str, m: dict[str, Any]) -> dict[str, Any]:
    attrs = {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()}
    entry: dict[str, Any] = {"message_id": m["MessageId"], "queue": queue,
                             "receive_count": int(m.get("Attributes", {}).get("ApproximateReceiveCount", 0)),
                             "error_code": attrs.get("error_code"), "body": m["Body"]}
    if attrs.get("envelope"):
        entry["envelope"] = json.loads(attrs["envelope"])
    job_id = chunk_id = None
    try:
        if queue == "analysis":
            am = AnalysisMessage.model_validate_json(m["Body"])
            job_id, chunk_id = am.job_id, am.chunk_id
            entry["payload"] = am.model_dump(exclude={"text"}) | {"text_chars": len(am.text)}
        elif queue == "results":
            rm = ResultMessage.model_validate_json(m["Body"])
            job_id, chunk_id = rm.job_id, rm.chunk_id
            entry["payload"] = rm.model_dump()
        else:
            entry["payload"] = {"chars": len(m["Body"])}  # intake bodies hold document text: not shown
    except ValidationError:
        entry["payload"] = {"unparsed": True, "chars": len(m["Body"])}
    entry["job_id"], entry["chunk_id"] = job_id, chunk_id
    if job_id:
        job = store.get_job(job_id) or {}
        entry["job"] = {"state": job.get("state"), "error_code": job.get("error_code")}
    if job_id and chunk_id:
        c = store.get_chunk(job_id, chunk_id) or {}
        entry["chunk"] = {k: c.get(k) for k in ("status", "chunk_index", "failures", "receives", "redeliveries",
                                                  "fence", "last_error", "n_calls", "retries", "claimed_by")}
        entry.setdefault("envelope", c.get("last_error"))
        entry["failed_step"] = (entry.get("envelope") or {}).get("step")
    entry.pop("body")
    return entry


def _dlqs(store: Store) -> dict[str, str]:
    s = store.s
    return {k: v for k, v in {"analysis": s.analysis_dlq_url, "intake": s.intake_dlq_url,
                              "results": s.results_dlq_url}.items() if v}


def _receive_all(store: Store, url: str, visibility: int = 30) -> list[dict[str, Any]]:
    """Take every message of a DLQ for processing (hidden for `visibility` seconds)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(100):
        r = store.aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=visibility,
                                          MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
                                          WaitTimeSeconds=0)
        batch = r.get("Messages", [])
        if not batch:
            break
        for m in batch:
            seen.setdefault(m["MessageId"], m)
    return list(seen.values())


def dlq_list(store: Store) -> list[dict[str, Any]]:
    out = []
    for queue, url in _dlqs(store).items():
        for m in store.peek(url):
            out.append(_join(store, queue, m))
    return out


def dlq_show(store: Store, message_id: str) -> dict[str, Any] | None:
    for item in dlq_list(store):
        if item["message_id"] == message_id:
            return item
    return None


def reopen(store: Store, job_id: str, chunk_id: str) -> str:
    """Give a dead-lettered or failed chunk a fresh attempt budget and put its job back to work.

    A job that had ended (`dead_lettered` / `failed`) is reconciled as a whole: every failed or
    dead-lettered chunk is reset, every chunk that is not done gets a fresh message (also chunks a
    job-fatal error left unstarted), and the settled set is rebuilt from the chunk records."""
    job = store.get_job(job_id)
    if job is None:
        return "dropped (no such job)"
    state = job.get("state")
    if state not in ("running", "failed", "dead_lettered"):
        return f"dropped (job is {state})"
    targets = store.chunk_records(job_id) if state != "running" else [store.get_chunk(job_id, chunk_id) or {}]
    for c in targets:
        if c.get("status") in ("failed", "dead_lettered"):
            store.reset_for_redrive(job_id, c["chunk_id"])
    if state == "running":
        current = store.get_chunk(job_id, chunk_id) or {}
        if current.get("status") != "pending":
            return f"dropped (chunk is {current.get('status')})"
        store.unsettle_chunks(job_id, [chunk_id])
        todo = [current]
    else:
        records = store.chunk_records(job_id)
        done = {c["chunk_id"] for c in records if c.get("status") == "done"}
        todo = [c for c in records if c.get("status") != "done"]
        fields: dict[str, Any] = {"settled": done} if done else {}
        if store.transition(job_id, [state], "running", fields,
                            remove=["error", "error_code", "missing", "mandatory_gaps", "ended_at", "root_error"]
                            + ([] if done else ["settled"])) is None:
            return "dropped (job changed meanwhile)"
        store.event(job_id, "job.reopened", from_state=state, chunks_resent=len(todo))
    text = store.get_object(job["document_key"])
    store.send_analysis([chunk_message(store, job, c, "redrive", text).model_dump_json() for c in todo])
    return f"redriven ({len(todo)} chunk(s) sent)"


def dlq_redrive(store: Store, message_ids: set[str] | None = None) -> list[dict[str, Any]]:
    """Re-inject DLQ messages (all when message_ids is None) with a fresh attempt budget."""
    s = store.s
    done: list[dict[str, Any]] = []
    chunk_seen: set[tuple[str, str]] = set()
    for queue, url in _dlqs(store).items():
        for m in _receive_all(store, url, visibility=30):
            if message_ids is not None and m["MessageId"] not in message_ids:
                continue
            entry: dict[str, Any] = {"message_id": m["MessageId"], "queue": queue, "action": "resent"}
            if queue == "analysis":
                try:
                    am = AnalysisMessage.model_validate_json(m["Body"])
                except ValidationError:
                    continue
                key = (am.job_id, am.chunk_id)
                action = reopen(store, *key) if key not in chunk_seen else "dropped (chunk already redriven)"
                chunk_seen.add(key)
                store.event(am.job_id, "dlq.redriven", chunk_id=am.chunk_id, dlq_message_id=m["MessageId"],
                            action=action)
                entry.update(job_id=am.job_id, chunk_id=am.chunk_id, action=action)
            elif queue == "intake":
                store.aws.sqs.send_message(QueueUrl=s.intake_queue_url, MessageBody=m["Body"])
            else:
                rm = ResultMessage.model_validate_json(m["Body"])
                store.send_result(m["Body"], rm.job_id,
                                  f"{rm.job_id}:{rm.chunk_id}:{rm.status}:{rm.fence}:redrive:{m['MessageId']}")
                entry["job_id"] = rm.job_id
            store.aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            done.append(entry)
    return done


def submit(store: Store, text: str, document_id: str | None = None, idempotency_key: str | None = None,
           metadata: dict[str, Any] | None = None) -> str:
    """Send one document to the intake queue (inline, or claim-check via S3 when large). Returns the job id."""
    key = idempotency_key or document_hash(text)
    job_id = job_id_for(key)
    if len(text) > MAX_INLINE_CHARS or len(text.encode("utf-8")) > 200_000:
        upload_key = f"uploads/{job_id}.txt"
        store.put_object(upload_key, text, "text/plain; charset=utf-8")
        document: dict[str, Any] = {"s3_uri": f"s3://{store.s.bucket}/{upload_key}"}
    else:
        document = {"text": text}
    body: dict[str, Any] = {"schema_version": 1, "document": document, "metadata": metadata or {}}
    if document_id:
        body["document_id"] = document_id
    if idempotency_key:
        body["idempotency_key"] = idempotency_key
    store.aws.sqs.send_message(QueueUrl=store.s.intake_queue_url, MessageBody=json.dumps(body))
    return job_id
