"""Scenario builders shared by the unit tests: jobs taken in or written directly, claims and
settled chunks, against the in-memory fakes."""

from __future__ import annotations

import json

from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord
from contract_review.domain.keys import document_key, findings_key
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState, job_id_for
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.reliability.chunks import announce, settled_result
from contract_review.review.analysts import ANALYSTS, ChunkFindings, Finding, analysts_for

from ..texts import LONG_TEXT, TEXT
from .fakes import SETTINGS, FakeWorld

ALL_OK = {a.name: "ok" for a in ANALYSTS}


# --- worlds and jobs --------------------------------------------------------------------------------

def small_chunk_world(**profile: object) -> FakeWorld:
    """A world whose profile has a 150-character chunk target (every clause of TEXT is a chunk), plus `profile`."""
    profile = {"chunk_target_chars": 150, "chunk_min_chars": 0, **profile}
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": SETTINGS.profile.with_overrides(**profile)}))


def intake(world: FakeWorld, text: str = LONG_TEXT, document_id: str | None = "msa-1") -> tuple[str, list[ChunkRecord]]:
    """A running job taken in by intake, and its (pending) chunk records in chunk order."""
    fields = {} if document_id is None else {"document_id": document_id}
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": text}, **fields}), "m-1")
    assert result.job_id is not None
    return result.job_id, world.claims.for_job(result.job_id)


def one_chunk_job(world: FakeWorld) -> tuple[str, AnalysisMessage]:
    """Intake TEXT with the default profile (one chunk); its analysis message, taken off the queue."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    (msg,) = world.queues.analysis()
    world.queues.drain(Queue.ANALYSIS)
    assert result.job_id
    return result.job_id, msg


def start_job(world: FakeWorld) -> tuple[str, list[str]]:
    """Intake TEXT in a `small_chunk_world`; the workers have taken its four analysis messages off the queue.
    Returns the job id and the chunk ids in chunk order."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    assert result.job_id is not None and result.state == "running"
    assert len(world.queues.drain(Queue.ANALYSIS)) == 4
    return result.job_id, [c.chunk_id for c in world.claims.for_job(result.job_id)]


def running_job(world: FakeWorld, n_chunks: int, job_key: str = "big",
                model_id: str = "offline-rules-v1") -> tuple[str, list[ChunkRecord]]:
    """A running job with `n_chunks` pending chunk records, written directly, and its document as intake stores it
    (TEXT, numbered clauses: what the report reads each finding's section from)."""
    job_id, now = job_id_for(job_key), world.clock()
    world.artifacts.put_text(document_key(job_id), TEXT)
    world.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now,
                          idempotency_key=job_key, document_key=document_key(job_id), chunk_count=n_chunks,
                          analyst_count=len(ANALYSTS), model_id=model_id))
    for i in range(n_chunks):
        world.claims.create(ChunkRecord(job_id=job_id, chunk_id=f"c{i:05d}-x", chunk_index=i, start=i * 10,
                                        end=i * 10 + 10))
    return job_id, world.claims.for_job(job_id)


# --- chunks -----------------------------------------------------------------------------------------

def claim(world: FakeWorld, record: ChunkRecord, receive_count: int = 1) -> int:
    """worker-1 claims the chunk (30 s lease); returns the fencing token."""
    won = world.claims.claim(record.job_id, record.chunk_id, "worker-1", 30.0, receive_count)
    assert won.won
    return won.fence


def settle_done(world: FakeWorld, record: ChunkRecord, *, coverage: dict[str, str] | None = None,
                findings: list[Finding] | None = None, stats: AttemptStats | None = None,
                receive_count: int = 1) -> ChunkRecord:
    """Claim the chunk and finish it `done`, its findings JSON in the artifacts (nothing announced)."""
    fence = claim(world, record, receive_count)
    key = findings_key(record.job_id, record.chunk_index, record.chunk_id, fence)
    found = findings or []
    world.artifacts.put_text(key, ChunkFindings(chunk_id=record.chunk_id, chunk_index=record.chunk_index,
                                                findings=found).model_dump_json())
    done = world.claims.finish(record.job_id, record.chunk_id, fence, ChunkStatus.DONE,
                               stats or AttemptStats(calls=22),
                               outcome=ChunkOutcome(findings_key=key, coverage=coverage or ALL_OK,
                                                    n_findings=len(found)))
    assert done is not None
    return done


def deliver(world: FakeWorld, record: ChunkRecord) -> str:
    """The aggregator handles the settled chunk's result; returns its outcome."""
    return handle_result(world.deps, settled_result(record))


def worker_finishes(world: FakeWorld, job_id: str, chunk_id: str) -> ChunkRecord:
    """A worker claims the chunk, writes its findings, settles it `done` and announces it."""
    won = world.claims.claim(job_id, chunk_id, "worker-ok", SETTINGS.claim_lease_s, 1)
    assert won.won and won.record is not None
    key = findings_key(job_id, won.record.chunk_index, chunk_id, won.fence)
    world.artifacts.put_text(key, ChunkFindings(chunk_id=chunk_id, chunk_index=won.record.chunk_index,
                                                findings=[]).model_dump_json())
    coverage = {a.name: "ok" for a in analysts_for(SETTINGS.profile.review.analyst_count)}
    done = world.claims.finish(job_id, chunk_id, won.fence, ChunkStatus.DONE, AttemptStats(calls=11),
                               outcome=ChunkOutcome(findings_key=key, coverage=coverage, n_findings=0))
    assert done is not None
    announce(world.deps, done)
    return done


def events_of(world: FakeWorld, job_id: str, kind: str) -> list[dict]:
    """The details of the job's events of type `kind`, oldest first."""
    return [e.detail for e in world.jobs.events(job_id) if e.type == kind]
