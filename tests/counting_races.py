"""The counting races, written once over `Deps`, so each runs on the in-memory fakes
(tests/unit/pipeline/test_counting_races.py) and on the real adapters against the deployed template on moto
(tests/integration/test_counting_on_moto.py). Each forces one interleaving by wrapping one repository call, and
ends with the job's count and tokens checked against its chunk records."""

from __future__ import annotations

from typing import Any

from contract_review.domain.chunk_records import ChunkOutcome, ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import document_key, findings_key
from contract_review.domain.ports import Deps
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState, Usage, job_id_for
from contract_review.pipeline import redrive
from contract_review.pipeline.aggregator import handle_result
from contract_review.reliability.chunks import settled_result
from contract_review.review.analysts import ANALYSTS, ChunkFindings

from .oracle import counted

CHUNKS = 3
TEXT = "Clause one applies. " * 10  # what a resend is cut from (the chunks are 10 characters each)


def ended_job(deps: Deps, key: str) -> tuple[str, list[str]]:
    """A job of three chunks: c0 done, c1 and c2 dead-lettered, every result counted, and the job ended
    `dead_lettered` by the aggregator's finalize (two chunks missing). The job id and the chunk ids."""
    job_id, now = job_id_for(key), deps.clock()
    deps.artifacts.put_text(document_key(job_id), TEXT)
    deps.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now, idempotency_key=key,
                         document_key=document_key(job_id), chunk_count=CHUNKS, analyst_count=len(ANALYSTS)))
    ids = [f"c{i}" for i in range(CHUNKS)]
    for i, chunk_id in enumerate(ids):
        deps.claims.create(ChunkRecord(job_id=job_id, chunk_id=chunk_id, chunk_index=i, start=i * 10, end=i * 10 + 10))
    outcomes = [handle_result(deps, settled_result(done(deps, job_id, ids[0])))]
    outcomes += [handle_result(deps, settled_result(dead(deps, job_id, c))) for c in ids[1:]]
    assert outcomes[-1] == JobState.DEAD_LETTERED.value, outcomes
    return job_id, ids


def _claim(deps: Deps, job_id: str, chunk_id: str) -> tuple[ChunkRecord, int]:
    won = deps.claims.claim(job_id, chunk_id, "worker-1", 30.0, 1)
    assert won.won and won.record is not None, won
    return won.record, won.fence


def done(deps: Deps, job_id: str, chunk_id: str, tokens: int = 100) -> ChunkRecord:
    """A worker claims the chunk, writes its findings and settles it `done` (nothing announced)."""
    record, fence = _claim(deps, job_id, chunk_id)
    key = findings_key(job_id, record.chunk_index, chunk_id, fence)
    deps.artifacts.put_text(key, ChunkFindings(chunk_id=chunk_id, chunk_index=record.chunk_index,
                                               findings=[]).model_dump_json())
    finished = deps.claims.finish(job_id, chunk_id, fence, ChunkStatus.DONE,
                                  AttemptStats(calls=11, input_tokens=tokens, output_tokens=tokens // 10),
                                  outcome=ChunkOutcome(findings_key=key, coverage={a.name: "ok" for a in ANALYSTS},
                                                       n_findings=0))
    assert finished is not None
    return finished


def dead(deps: Deps, job_id: str, chunk_id: str, tokens: int = 100) -> ChunkRecord:
    """A worker claims the chunk and dead-letters it (nothing announced)."""
    _, fence = _claim(deps, job_id, chunk_id)
    env = ErrorEnvelope.of("model.request_invalid", "provider rejected the request", step="analyst.locate")
    finished = deps.claims.finish(job_id, chunk_id, fence, ChunkStatus.DEAD_LETTERED,
                                  AttemptStats(calls=2, input_tokens=tokens, output_tokens=tokens // 10), error=env)
    assert finished is not None
    return finished


def the_job(deps: Deps, job_id: str) -> Job:
    job = deps.jobs.get(job_id)
    assert job is not None
    return job


def assert_counted_once(deps: Deps, job_id: str) -> Job:
    """The job's count agrees with its records' marks, and its tokens are the sum of its counted chunks'."""
    job = the_job(deps, job_id)
    marked = counted(deps.claims, job)  # asserts the count equals the marks
    records = [c for c in deps.claims.for_job(job_id) if c.chunk_id in marked]
    assert job.n_settled <= job.chunk_count, f"settled {job.n_settled} of {job.chunk_count} chunks"
    assert job.usage().input_tokens == Usage.of(c.usage() for c in records).input_tokens, \
        (job.usage().input_tokens, [(c.chunk_id, c.input_tokens) for c in records])
    return job


# ------------------------------------------------------------------------------ finding 8
def two_retries_at_once(deps: Deps, key: str = "two-retries") -> None:
    """Two `review retry` of one ended job at once (the CLI and the status page; a client retrying after API Gateway's
    30 s timeout): retry B has read the job and its chunks; retry A then runs whole, and the chunk it reset (c1) is
    worked and counted under it; B's transition comes last. B must lose without touching a mark: c1 counted once."""
    job_id, ids = ended_job(deps, key)
    real = deps.jobs.transition
    raced: list[object] = []

    def transition(jid: str, from_states: Any, to: JobState, **kw: Any) -> Job | None:
        if to is JobState.RUNNING and not raced:
            raced.append("B read the job")
            raced.append(redrive.retry(deps, jid).retried)  # retry A, whole
            raced.append(handle_result(deps, settled_result(done(deps, jid, ids[1]))))  # c1 counted under A
        return real(jid, from_states, to, **kw)

    setattr(deps.jobs, "transition", transition)  # noqa: B010 -- one call of the repository wrapped
    try:
        b = redrive.retry(deps, job_id)
    finally:
        setattr(deps.jobs, "transition", real)  # noqa: B010 -- restored
    assert raced == ["B read the job", True, "recorded"]
    assert not b.retried and b.action == "dropped (job changed meanwhile)", b
    # THEN c1 is counted once, and stays so: a second copy of its result (at-least-once) counts nothing
    job = assert_counted_once(deps, job_id)
    assert counted(deps.claims, job) == {ids[0], ids[1]} and job.state is JobState.RUNNING
    c1 = deps.claims.get(job_id, ids[1])
    assert c1 is not None
    assert handle_result(deps, settled_result(c1)) == "recorded"
    assert the_job(deps, job_id).settled_count == 2
    # AND the job completes with every chunk counted once
    assert handle_result(deps, settled_result(done(deps, job_id, ids[2]))) == JobState.COMPLETED.value
    final = assert_counted_once(deps, job_id)
    assert final.settled_count == CHUNKS and counted(deps.claims, final) == set(ids)


# ------------------------------------------------------------------------------ finding 9
def redrive_inside_the_settle(deps: Deps, key: str = "redrive-in-settle") -> None:
    """The aggregator has read a running job and its dead-lettered chunk c1; the operator's DLQ redrive of c1 (reset:
    pending, a new fence) lands before the aggregator's settle. The settle must not count a chunk that is pending
    again: its own result counts it once it settles, with the usage of both its attempts (counted at the read, the
    second attempt's tokens were on no job)."""
    job_id, now = job_id_for(key), deps.clock()
    deps.artifacts.put_text(document_key(job_id), TEXT)
    deps.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now, idempotency_key=key,
                         document_key=document_key(job_id), chunk_count=3, analyst_count=len(ANALYSTS)))
    for i in range(3):
        deps.claims.create(ChunkRecord(job_id=job_id, chunk_id=f"c{i}", chunk_index=i, start=i * 10, end=i * 10 + 10))
    assert handle_result(deps, settled_result(done(deps, job_id, "c0"))) == "recorded"
    dead_c1 = dead(deps, job_id, "c1")
    real = deps.jobs.settle_new_chunk
    raced: list[str] = []

    def settle_new_chunk(jid: str, chunk_id: str, **kw: Any) -> Job | None:
        if not raced:
            raced.append(redrive.reopen(deps, jid, chunk_id))  # `review dlq redrive`, between the read and the settle
        return real(jid, chunk_id, **kw)

    setattr(deps.jobs, "settle_new_chunk", settle_new_chunk)  # noqa: B010 -- one call of the repository wrapped
    try:
        outcome = handle_result(deps, settled_result(dead_c1))
    finally:
        setattr(deps.jobs, "settle_new_chunk", real)  # noqa: B010 -- restored
    assert raced == ["redriven (1 chunk(s) sent)"] and outcome == "recorded"
    # THEN the chunk, pending again, is not counted
    c1 = deps.claims.get(job_id, "c1")
    assert c1 is not None and c1.status is ChunkStatus.PENDING
    job = assert_counted_once(deps, job_id)
    assert counted(deps.claims, job) == {"c0"} and job.state is JobState.RUNNING
    # AND once it is worked, it is counted once, with both its attempts, and the job completes
    assert handle_result(deps, settled_result(done(deps, job_id, "c1"))) == "recorded"
    assert handle_result(deps, settled_result(done(deps, job_id, "c2"))) == JobState.COMPLETED.value
    final = assert_counted_once(deps, job_id)
    assert final.settled_count == 3 and counted(deps.claims, final) == {"c0", "c1", "c2"}
    assert final.input_tokens == 100 + (100 + 100) + 100


# ------------------------------------------------------------------------------ finding 10
class Crash(Exception):
    """The aggregator's process dies here (its message is delivered again)."""


def aggregator_dies_after_counting(deps: Deps, key: str = "dies-after-count") -> None:
    """An aggregator dies right after the transaction that counted a chunk, before the chunk's `chunk.settled` event
    (forced by a settle that commits, then raises). The redelivered result must write the event, once however often
    it comes; a job that completes has every chunk's event, before `job.completed`."""
    job_id, now = job_id_for(key), deps.clock()
    deps.artifacts.put_text(document_key(job_id), TEXT)
    deps.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now, idempotency_key=key,
                         document_key=document_key(job_id), chunk_count=CHUNKS, analyst_count=len(ANALYSTS)))
    ids = [f"c{i}" for i in range(CHUNKS)]
    for i, chunk_id in enumerate(ids):
        deps.claims.create(ChunkRecord(job_id=job_id, chunk_id=chunk_id, chunk_index=i, start=i * 10, end=i * 10 + 10))
    real = deps.jobs.settle_new_chunk

    def dies_after(jid: str, chunk_id: str, **kw: Any) -> Job | None:
        counted_now = real(jid, chunk_id, **kw)
        if counted_now is not None:
            raise Crash(chunk_id)
        return counted_now

    def delivered_after_a_crash(record: ChunkRecord) -> list[str]:
        setattr(deps.jobs, "settle_new_chunk", dies_after)  # noqa: B010 -- one call of the repository wrapped
        try:
            handle_result(deps, settled_result(record))
            raise AssertionError("the settle did not run")
        except Crash:
            pass
        finally:
            setattr(deps.jobs, "settle_new_chunk", real)  # noqa: B010 -- restored
        return [handle_result(deps, settled_result(record)) for _ in range(2)]  # redelivered, twice

    assert delivered_after_a_crash(done(deps, job_id, ids[0])) == ["recorded", "recorded"]
    assert handle_result(deps, settled_result(done(deps, job_id, ids[1]))) == "recorded"
    assert delivered_after_a_crash(done(deps, job_id, ids[2]))[0] == JobState.COMPLETED.value
    # THEN a reader resuming from the start sees every chunk settled, once each, before the job completed
    types = [(e.type, e.detail.get("chunk_id")) for e in deps.jobs.events(job_id)]
    settled = [c for t, c in types if t == "chunk.settled"]
    assert settled == ids, types
    assert types.index(("job.completed", None)) > types.index(("chunk.settled", ids[2]))
    assert_counted_once(deps, job_id)
