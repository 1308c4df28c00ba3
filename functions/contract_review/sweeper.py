"""Sweeper: recover chunks whose worker died, explain messages that reached the DLQ, and
reconcile jobs that stopped making progress.

1. Lapsed claims (lease expired, not settled): re-enqueue a fresh message, counting a
   `runtime.worker_lost` failure; once the poison budget is used, dead-letter the chunk.
2. Analysis DLQ messages whose chunk is not settled (the queue moved them after maxReceiveCount,
   e.g. the worker was killed on every receive): mark the chunk dead-lettered and settle it.
3. Stalled jobs (`running`, no progress for `stall_after_s`): re-send the results of settled
   chunks the job has not counted, and a fresh message for pending chunks nobody holds.
Every chunk write is conditional on the fencing token the sweeper observed *and* on the lease
still being lapsed, so a heartbeat or a new claim since the sweeper's read wins harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .errors import ErrorEnvelope
from .messages import AnalysisMessage, ResultMessage
from .store import SETTLED_CHUNK_STATES, TERMINAL_JOB_STATES, Store


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    dlq_seen: int = 0
    reconciled: list[str] = field(default_factory=list)  # job ids


def send_settled(store: Store, job_id: str, chunk: dict[str, Any], nonce: str = "") -> None:
    """(Re-)send the results message of a settled chunk."""
    status = chunk["status"]
    body = ResultMessage(job_id=job_id, chunk_id=chunk["chunk_id"], chunk_index=int(chunk.get("chunk_index", 0)),
                         status=status, fence=int(chunk.get("fence", 0)), findings_key=chunk.get("findings_key"),
                         error=chunk.get("last_error") if status != "done" else None)
    store.send_result(body.model_dump_json(), job_id,
                      f"{job_id}:{chunk['chunk_id']}:{status}:{chunk.get('fence', 0)}{nonce}")


def chunk_message(store: Store, job: dict[str, Any], chunk: dict[str, Any], reason: str,
                  text: str | None = None) -> AnalysisMessage:
    """A fresh analysis message for a chunk, rebuilt from the stored document."""
    text = store.get_object(job["document_key"]) if text is None else text
    start, end = int(chunk["start"]), int(chunk["end"])
    return AnalysisMessage(job_id=job["job_id"], chunk_id=chunk["chunk_id"], chunk_index=int(chunk["chunk_index"]),
                           chunk_count=int(job["chunk_count"]), start=start, end=end, text=text[start:end],
                           attempt=int(chunk.get("failures", 0)) + 1, max_attempts=store.s.profile.poison_budget,
                           checkpoint_version=job.get("config_hash", ""), reason=reason)


def sweep(store: Store, now: float | None = None) -> SweepReport:
    now = store.clock() if now is None else now
    report = SweepReport()
    jobs: dict[str, dict[str, Any] | None] = {}

    def job_of(job_id: str) -> dict[str, Any] | None:
        if job_id not in jobs:
            jobs[job_id] = store.get_job(job_id)
        return jobs[job_id]

    for claim in list(store.lapsed_claims(now)):
        _recover_lapsed(store, job_of(claim["job_id"]), claim, now, report)
    _explain_dlq(store, report, job_of)
    _reconcile_stalled(store, now, report)
    return report


def _recover_lapsed(store: Store, job: dict[str, Any] | None, claim: dict[str, Any], now: float,
                    report: SweepReport) -> None:
    job_id, chunk_id, fence = claim["job_id"], claim["chunk_id"], int(claim.get("fence", 0))
    if job is None or job.get("state") in TERMINAL_JOB_STATES:
        store.release(job_id, chunk_id, fence, {}, None, failure=False, lapsed_before=now)
        return
    env = ErrorEnvelope.of("runtime.worker_lost", f"lease held by {claim.get('claimed_by')} lapsed",
                           step="sweeper", attempt=int(claim.get("failures", 0)) + 1)
    msg = chunk_message(store, job, claim, "sweeper")  # built before any write: a failed read changes nothing
    if int(claim.get("failures", 0)) + 1 >= store.s.profile.poison_budget:
        last = claim.get("last_error")
        dead_env = ErrorEnvelope.model_validate(last) if last else env
        settled = store.finish(job_id, chunk_id, fence, "dead_lettered", {}, {}, dead_env, lapsed_before=now)
        if settled is not None:
            if store.s.analysis_dlq_url:
                store.send_to_dlq(store.s.analysis_dlq_url, msg.model_dump_json(), dead_env,
                                  {"job_id": job_id, "chunk_id": chunk_id})
            store.event(job_id, "chunk.dead_lettered", chunk_id=chunk_id, error_code=dead_env.error_code, by="sweeper")
            send_settled(store, job_id, settled)
            report.dead_lettered.append(chunk_id)
        return
    if store.release(job_id, chunk_id, fence, {}, env, failure=True, lapsed_before=now) is not None:
        store.send_analysis([msg.model_dump_json()])
        store.event(job_id, "chunk.requeued", chunk_id=chunk_id, reason="runtime.worker_lost", by="sweeper",
                    lapsed_for_s=round(now - float(claim.get("claim_expires_at", now)), 3))
        report.requeued.append(chunk_id)


def _explain_dlq(store: Store, report: SweepReport, job_of: Any) -> None:
    if not store.s.analysis_dlq_url:
        return
    for m in store.peek(store.s.analysis_dlq_url):
        report.dlq_seen += 1
        try:
            msg = AnalysisMessage.model_validate_json(m["Body"])
        except ValidationError:
            continue  # not a chunk message; `review dlq list` shows it as such
        chunk = store.get_chunk(msg.job_id, msg.chunk_id)
        if chunk is None or chunk.get("status") in SETTLED_CHUNK_STATES:
            continue
        sent_at = int(m.get("Attributes", {}).get("SentTimestamp", 0)) / 1000
        if float(chunk.get("redriven_at", 0)) >= sent_at:
            continue  # an operator redrove this chunk after the message was dead-lettered
        job = job_of(msg.job_id)
        if job is None or job.get("state") in TERMINAL_JOB_STATES:
            continue
        now = store.clock()
        if chunk.get("status") == "claimed" and float(chunk.get("claim_expires_at", 0)) > now:
            continue  # someone is working on it right now
        last = chunk.get("last_error")
        env = ErrorEnvelope.model_validate(last) if last else ErrorEnvelope.of(
            "runtime.worker_lost", "message reached the DLQ with no error recorded", step="sweeper")
        settled = store.finish(msg.job_id, msg.chunk_id, int(chunk.get("fence", 0)), "dead_lettered", {}, {}, env,
                               states=("pending", "claimed"), lapsed_before=now)
        if settled is not None:
            store.event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id, error_code=env.error_code,
                        by="sweeper", dlq_message_id=m["MessageId"])
            send_settled(store, msg.job_id, settled)
            report.dead_lettered.append(msg.chunk_id)


def _reconcile_stalled(store: Store, now: float, report: SweepReport) -> None:
    for job in store.stalled_jobs(now - store.s.profile.stall_after_s):
        job_id = job["job_id"]
        counted = set(job.get("settled") or ())
        resent = requeued = 0
        text: str | None = None
        for c in store.chunk_records(job_id):
            if c.get("status") in SETTLED_CHUNK_STATES:
                if c["chunk_id"] not in counted:
                    send_settled(store, job_id, c, nonce=f":reconcile:{int(now)}")  # new dedup id
                    resent += 1
            elif c.get("status") == "pending":  # nobody holds it; its message may be lost
                text = store.get_object(job["document_key"]) if text is None else text
                store.send_analysis([chunk_message(store, job, c, "reconcile", text).model_dump_json()])
                requeued += 1
        store.touch_job(job_id)  # the next reconcile waits another stall period
        if resent or requeued:
            store.event(job_id, "job.reconciled", results_resent=resent, chunks_requeued=requeued, by="sweeper")
            report.reconciled.append(job_id)
