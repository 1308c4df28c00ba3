"""A job's cost is the sum of its settled chunks' usage, whatever interleaves.

Each test forces its interleaving on the in-memory repositories (the same conditional updates run on moto in
tests/integration/test_repositories.py) and compares the job's tokens with the sum of its chunk records'."""

from __future__ import annotations

from contract_review.domain import lifecycle
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import document_key
from contract_review.domain.records import AttemptStats, Cancellation, ChunkStatus, JobState, Usage
from contract_review.pipeline import redrive
from contract_review.pipeline.aggregator import handle_result
from contract_review.reliability.chunks import settled_result

from ..fakes import FakeWorld
from ..scenarios import claim, deliver, running_job, settle_done


def _chunks_usage(world: FakeWorld, job_id: str) -> Usage:
    return Usage.of(c.usage() for c in world.claims.for_job(job_id))


def _dead(world: FakeWorld, record: ChunkRecord, tokens: int) -> ChunkRecord:
    fence = claim(world, record)
    env = ErrorEnvelope.of("model.request_invalid", "provider rejected the request", step="analyst.locate")
    dead = world.claims.finish(record.job_id, record.chunk_id, fence, ChunkStatus.DEAD_LETTERED,
                               AttemptStats(calls=2, input_tokens=tokens, output_tokens=tokens // 10), error=env)
    assert dead is not None
    return dead


def test_a_redrive_while_the_job_runs_takes_the_chunks_counted_usage_off_so_it_is_counted_once():
    # GIVEN a running job whose first chunk was dead-lettered after 1,000 input tokens, and counted
    world = FakeWorld()
    job_id, (first, second) = running_job(world, 2)
    world.artifacts.put_text(document_key(job_id), "Clause one applies. " * 10)  # what a resend is cut from
    assert deliver(world, _dead(world, first, 1_000)) == "recorded"
    assert world.jobs.get(job_id).input_tokens == 1_000
    # WHEN it is redriven (`review dlq redrive` / `review retry`) while the job runs, and completes with 400 more
    assert redrive.reopen(world.deps, job_id, first.chunk_id).startswith("redriven")
    assert world.jobs.get(job_id).input_tokens == 0  # off with it, in the update that unsettled it
    again = settle_done(world, world.claims.get(job_id, first.chunk_id),
                        stats=AttemptStats(calls=11, input_tokens=400, output_tokens=40))
    assert again.input_tokens == 1_400  # the record holds both attempts
    deliver(world, again)
    # THEN the job counts both attempts once: 1,400, not 2,400
    job = world.jobs.get(job_id)
    assert job.state is JobState.RUNNING and (job.input_tokens, job.output_tokens) == (1_400, 140)
    assert job.usage().input_tokens == _chunks_usage(world, job_id).input_tokens


def test_a_cancel_finishing_between_the_aggregators_read_and_its_settle_counts_the_chunk_once():
    # GIVEN a cancelling job whose last chunk has settled `done` with 700 tokens, its result on its way
    world = FakeWorld()
    job_id, (only,) = running_job(world, 1)
    done = settle_done(world, only, stats=AttemptStats(calls=11, input_tokens=700, output_tokens=70))
    cancelling = lifecycle.transition(world.deps, world.jobs.get(job_id), JobState.CANCELLING,
                                      outcome=Cancellation(cancel_requested_at=world.clock(), cancelled_by="api"))
    assert cancelling is not None
    # WHEN the aggregator has read the job and the chunk, and the sweeper's finish-cancel lands before its settle
    settle = world.jobs.settle_new_chunk
    landed: list[JobState] = []

    def cancel_lands_first(job_id_: str, chunk_id: str, **kw: object) -> object:
        world.jobs.settle_new_chunk = settle  # type: ignore[method-assign]  # once: the cancel's own run plainly
        landed.append(lifecycle.finish_cancel(world.deps, world.jobs.get(job_id_)))
        return settle(job_id_, chunk_id, **kw)  # type: ignore[arg-type]  # the repository's own keywords

    world.jobs.settle_new_chunk = cancel_lands_first  # type: ignore[method-assign]  # one call wrapped
    handle_result(world.deps, settled_result(done))
    assert landed == [JobState.CANCELLED]
    # THEN the job ended cancelled and its chunk's tokens are counted once
    job = world.jobs.get(job_id)
    assert job.state is JobState.CANCELLED
    assert (job.input_tokens, job.output_tokens) == (700, 70) == (
        _chunks_usage(world, job_id).input_tokens, _chunks_usage(world, job_id).output_tokens)
    # AND its `chunk.settled` event is written once, by whichever counted it (the soak found it missing when the
    # cancel counted the chunk, and a retry then completed the job with that chunk never announced settled)
    settled = [e.detail for e in world.jobs.events(job_id) if e.type == "chunk.settled"]
    assert [(d["chunk_id"], d["status"]) for d in settled] == [(only.chunk_id, "done")]


def test_an_attempt_fenced_out_between_the_aggregators_read_and_its_settle_is_counted_with_the_chunk():
    """The aggregator read the chunk's usage; an attempt fenced out of the chunk (it lost its
    lease to the attempt that finished it) added its spend to the record, still uncounted; the settle added only what
    was read, so the fenced-out spend was on the chunk record and on no job."""
    # GIVEN a running job whose only chunk settled `done` (700 tokens) after taking it over from a frozen attempt
    world = FakeWorld()
    job_id, (only,) = running_job(world, 1)
    frozen = claim(world, only)
    world.clock.advance(31)
    done = settle_done(world, only, stats=AttemptStats(calls=11, input_tokens=700, output_tokens=70))
    # WHEN the frozen attempt, fenced out, adds its 300 tokens between the aggregator's read and its settle
    settle = world.jobs.settle_new_chunk

    def fenced_out_lands_first(job_id_: str, chunk_id: str, **kw: object) -> object:
        world.jobs.settle_new_chunk = settle  # type: ignore[method-assign]  # once
        assert world.jobs.add_fenced_out(job_id_, chunk_id, frozen, AttemptStats(calls=4, input_tokens=300,
                                                                                 output_tokens=30))
        return settle(job_id_, chunk_id, **kw)  # type: ignore[arg-type]  # the repository's own keywords

    world.jobs.settle_new_chunk = fenced_out_lands_first  # type: ignore[method-assign]  # one call wrapped
    handle_result(world.deps, settled_result(done))
    # THEN the job counts the chunk once, with both attempts: what its record holds
    job = world.jobs.get(job_id)
    assert job.state is JobState.COMPLETED
    assert (job.input_tokens, job.output_tokens) == (1_000, 100) == (
        _chunks_usage(world, job_id).input_tokens, _chunks_usage(world, job_id).output_tokens)
