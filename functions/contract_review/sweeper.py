"""Sweeper: recover chunks whose worker died, and explain messages that reached the DLQ.

1. Lapsed claims (lease expired, not settled): re-enqueue a fresh message, counting a
   `runtime.worker_lost` failure; once the poison budget is used, dead-letter the chunk.
2. Analysis DLQ messages whose chunk is not settled (the queue moved them after maxReceiveCount,
   e.g. the worker was killed on every receive): mark the chunk dead-lettered and settle it.
Every write is conditional on the fencing token the sweeper observed, so it never races a live
owner: a heartbeat or a new claim makes its update fail harmlessly.
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


def _send_settled(store: Store, job_id: str, chunk: dict[str, Any], env: ErrorEnvelope) -> None:
    body = ResultMessage(job_id=job_id, chunk_id=chunk["chunk_id"], chunk_index=int(chunk.get("chunk_index", 0)),
                         status="dead_lettered", fence=int(chunk.get("fence", 0)), error=env.model_dump(mode="json"))
    store.send_result(body.model_dump_json(), job_id, f"{job_id}:{chunk['chunk_id']}:dead_lettered:{chunk.get('fence', 0)}")


def _rebuild_message(store: Store, job: dict[str, Any], chunk: dict[str, Any], reason: str) -> AnalysisMessage:
    text = store.get_object(job["document_key"])
    start, end = int(chunk["start"]), int(chunk["end"])
    return AnalysisMessage(job_id=job["job_id"], chunk_id=chunk["chunk_id"], chunk_index=int(chunk["chunk_index"]),
                           chunk_count=int(job["chunk_count"]), start=start, end=end, text=text[start:end],
                           attempt=int(chunk.get("failures", 0)) + 1, max_attempts=store.s.profile.poison_budget,
                           checkpoint_version=job.get("config_hash", ""), reason=reason)


def sweep(store: Store, now: float | None = None) -> SweepReport:
    now = store.clock() if now is None else now
    report = SweepReport()
    jobs: dict[str, dict[str, Any] | None] = {}
    for claim in list(store.lapsed_claims(now)):
        job_id = claim["job_id"]
        if job_id not in jobs:
            jobs[job_id] = store.get_job(job_id)
        job = jobs[job_id]
        fence = int(claim.get("fence", 0))
        env = ErrorEnvelope.of("runtime.worker_lost", f"lease held by {claim.get('claimed_by')} lapsed",
                               step="sweeper", attempt=int(claim.get("failures", 0)) + 1)
        if job is None or job.get("state") in TERMINAL_JOB_STATES:
            store.release(job_id, claim["chunk_id"], fence, {}, None, failure=False)
            continue
        if int(claim.get("failures", 0)) + 1 >= store.s.profile.poison_budget:
            last = claim.get("last_error")
            dead_env = ErrorEnvelope.model_validate(last) if last else env
            if store.finish(job_id, claim["chunk_id"], fence, "dead_lettered", {}, {}, dead_env) is not None:
                msg = _rebuild_message(store, job, claim, "sweeper")
                if store.s.analysis_dlq_url:
                    store.send_to_dlq(store.s.analysis_dlq_url, msg.model_dump_json(), dead_env,
                                      {"job_id": job_id, "chunk_id": claim["chunk_id"]})
                store.event(job_id, "chunk.dead_lettered", chunk_id=claim["chunk_id"], error_code=dead_env.error_code,
                            by="sweeper")
                _send_settled(store, job_id, claim, dead_env)
                report.dead_lettered.append(claim["chunk_id"])
            continue
        if store.release(job_id, claim["chunk_id"], fence, {}, env, failure=True) is not None:
            msg = _rebuild_message(store, job, claim, "sweeper")
            store.send_analysis([msg.model_dump_json()])
            store.event(job_id, "chunk.requeued", chunk_id=claim["chunk_id"], reason="runtime.worker_lost",
                        by="sweeper", lapsed_for_s=round(now - float(claim.get("claim_expires_at", now)), 3))
            report.requeued.append(claim["chunk_id"])
    _explain_dlq(store, report, jobs)
    return report


def _explain_dlq(store: Store, report: SweepReport, jobs: dict[str, dict[str, Any] | None]) -> None:
    if not store.s.analysis_dlq_url:
        return
    messages = store.peek(store.s.analysis_dlq_url)
    if messages:
        for m in messages:
            report.dlq_seen += 1
            try:
                msg = AnalysisMessage.model_validate_json(m["Body"])
            except ValidationError:
                continue  # not a chunk message; `review dlq list` shows it as such
            chunk = store.get_chunk(msg.job_id, msg.chunk_id)
            if chunk is None or chunk.get("status") in SETTLED_CHUNK_STATES:
                continue
            if msg.job_id not in jobs:
                jobs[msg.job_id] = store.get_job(msg.job_id)
            job = jobs[msg.job_id]
            if job is None or job.get("state") in TERMINAL_JOB_STATES:
                continue
            if chunk.get("status") == "claimed" and float(chunk.get("claim_expires_at", 0)) > store.clock():
                continue  # someone is working on it right now (e.g. sweeper requeue won)
            last = chunk.get("last_error")
            env = ErrorEnvelope.model_validate(last) if last else ErrorEnvelope.of(
                "runtime.worker_lost", "message reached the DLQ with no error recorded", step="sweeper")
            if store.finish(msg.job_id, msg.chunk_id, int(chunk.get("fence", 0)), "dead_lettered", {}, {}, env,
                            states=("pending", "claimed")):
                store.event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id, error_code=env.error_code,
                            by="sweeper", dlq_message_id=m["MessageId"])
                _send_settled(store, msg.job_id, {**chunk, "fence": chunk.get("fence", 0)}, env)
                report.dead_lettered.append(msg.chunk_id)


