"""`review retry` and resubmitting a document whose job ended without completing, through the CLI
(click's CliRunner) against the in-memory fakes, with the progress loop's pipeline from test_cli."""

from __future__ import annotations

import json

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.ports import Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, JobFailure, JobState, job_id_for
from contract_review.pipeline.intake import handle_intake
from contract_review.review.chunking import document_hash
from tests.oracle import counted

from ...texts import TEXT
from ..fakes import FakeWorld
from ..scenarios import small_chunk_world, worker_finishes
from .test_cli import Pipeline, error_lines, fake_time, run, wide_console  # noqa: F401 -- wide_console: autouse fixture


def failed_by_access_denied(world: FakeWorld) -> tuple[str, list[str]]:
    """TEXT submitted without a key: chunk 0 done, chunk 1 hit model.access_denied (job-fatal) and
    failed the job; chunks 2 and 3 never ran. Nothing is in any DLQ."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    assert result.job_id is not None
    job_id = result.job_id
    world.queues.drain(Queue.ANALYSIS)
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    worker_finishes(world, job_id, ids[0])
    won = world.claims.claim(job_id, ids[1], "worker-x", 30, 1)
    env = ErrorEnvelope.of("model.access_denied", "AccessDeniedException", http_status=403, step="liability")
    assert world.claims.finish(job_id, ids[1], won.fence, ChunkStatus.FAILED, AttemptStats(calls=1), error=env)
    assert world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED,
                                 outcome=JobFailure(error=env, error_code=env.error_code, ended_at=world.clock()))
    world.queues.drain(Queue.RESULTS)
    return job_id, ids


def test_review_retry_wait_reopens_a_job_failed_by_a_job_fatal_error_and_it_completes(monkeypatch):
    # GIVEN a job failed by model.access_denied (the access has been granted since)
    world = small_chunk_world()
    job_id, ids = failed_by_access_denied(world)
    fake_time(monkeypatch, Pipeline(world))
    # WHEN the operator retries it and waits
    result = run(world, "retry", "--wait", job_id)
    # THEN it is reopened keeping its finished chunk, runs the other three, and completes
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith(job_id))
    assert line == (f"{job_id}  running  reopened from failed (model.access_denied): 3 chunk(s) sent, finished "
                    "chunks and checkpoints kept")
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED and counted(world.claims, job) == set(ids)
    assert world.jobs.types(job_id).count("job.reopened") == 1


def test_submitting_the_same_document_after_a_job_fatal_error_reopens_the_job(tmp_path, monkeypatch):
    # GIVEN the job of this document failed with model.access_denied (the docs: grant, then resubmit)
    world = small_chunk_world()
    job_id, _ = failed_by_access_denied(world)
    f = tmp_path / "msa.txt"
    f.write_text(TEXT, encoding="utf-8")
    fake_time(monkeypatch, Pipeline(world))
    # WHEN the same document is submitted again, waiting
    result = run(world, "submit", "--wait", str(f))
    # THEN the failed job is not returned unchanged: it is reopened (no new intake message), and completes
    assert job_id == job_id_for(document_hash(TEXT))
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith(job_id))
    assert line.startswith(f"{job_id}  {f}  (it had ended failed with model.access_denied: reopened from failed")
    assert world.jobs.items[job_id].state is JobState.COMPLETED
    assert world.jobs.types(job_id).count("job.queued") == 1


def test_review_retry_says_what_to_do_when_there_is_nothing_to_retry(monkeypatch):
    # GIVEN a job that failed on its input, a completed job, and an unknown id
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": " "}, "idempotency_key": "k"}),
                  "m-1")
    fake_time(monkeypatch)
    # WHEN they are retried
    result = run(world, "retry", job_id_for("k"), "job-unknown")
    # THEN each line says why not (and what to do instead), and the command exits 1
    assert result.exit_code == 1
    assert not result.stdout  # each refusal said once, in the error line
    [line] = error_lines(result)
    assert line.startswith(f"Error: not retried: {job_id_for('k')} (failed): nothing to retry: input.empty_document "
                           "refused the document before anything was analysed. Send it again (corrected, or with a "
                           "budget of at least its estimate) with the same idempotency key")
    assert line.endswith("; job-unknown (no record): no such job")


def test_another_document_under_the_key_of_a_failed_job_is_refused_not_retried(tmp_path, monkeypatch):
    # GIVEN the failed job of TEXT, and another document submitted under the very same key
    world = small_chunk_world()
    job_id, _ = failed_by_access_denied(world)
    f = tmp_path / "other.txt"
    f.write_text(TEXT.replace("New York", "Delaware"), encoding="utf-8")
    fake_time(monkeypatch)
    # WHEN it is submitted
    result = run(world, "submit", "--idempotency-key", document_hash(TEXT), str(f))
    # THEN it is refused as intake and the Job API refuse it (intake would dead-letter it as input.key_conflict),
    # and the failed job is left as it is (a retry would run the other document); nothing is sent
    assert result.exit_code == 1 and "input.key_conflict" in result.output
    assert world.jobs.items[job_id].state is JobState.FAILED and "job.reopened" not in world.jobs.types(job_id)
    assert world.queues.sent[Queue.INTAKE] == []


# --- review cancel ------------------------------------------------------------------------------------

def test_review_cancel_cancels_once_waits_for_the_end_and_refuses_an_ended_job(monkeypatch):
    # GIVEN a running job whose chunk messages no worker has taken yet
    world = small_chunk_world()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    job_id = result.job_id
    assert job_id is not None
    world.queues.drain(Queue.ANALYSIS)
    fake_time(monkeypatch, Pipeline(world))
    # WHEN it is cancelled with --wait THEN it ends cancelled: one line, exit 0
    first = run(world, "cancel", "--wait", job_id)
    assert first.exit_code == 0, first.output
    assert f"{job_id}  cancelling  cancelling: no new work starts" in first.stdout
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED and job.cancelled_by == "cli"
    # AND cancelling again changes nothing and says so, still exit 0
    again = run(world, "cancel", job_id)
    assert again.exit_code == 0 and f"{job_id}  cancelled  already cancelled" in again.stdout
    assert world.jobs.types(job_id).count("job.cancelling") == 1


def test_review_cancel_of_a_completed_job_is_one_clear_line_and_exit_1(monkeypatch):
    world = small_chunk_world()
    fake_time(monkeypatch, Pipeline(world))
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    job_id = result.job_id
    assert job_id is not None
    Pipeline(world).step()
    assert (job := world.jobs.get(job_id)) is not None and job.state is JobState.COMPLETED
    out = run(world, "cancel", job_id, "no-such-job")
    assert out.exit_code == 1
    assert not out.stdout  # each refusal said once, in the error line
    assert error_lines(out) == [f"Error: not cancelled: {job_id}: the job already ended completed: there is nothing "
                                "to cancel; no-such-job: no such job"]
