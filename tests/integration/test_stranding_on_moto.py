"""The redrive-versus-finalize interleavings of `tests/unit/pipeline/test_stranding.py`, on the real adapters
(DynamoDB conditional writes, SQS) against the deployed template on moto: one repository call is
wrapped so that the operator's redrive lands exactly inside finalize, and the job must end the way
a fault-free run does."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import finalize, handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.redrive import dlq_redrive
from contract_review.pipeline.worker import Delivery
from contract_review.reliability.chunks import analysis_message, dead_letter
from contract_review.wiring import chunk_worker
from review_local.embedded import EmbeddedAws

from ..oracle import counted
from ..texts import TEXT
from .conftest import emptied, get_chunk, get_job, report_json


@pytest.fixture
def deps(embedded: EmbeddedAws) -> Deps:
    return emptied(embedded)


def _take(deps: Deps, queue: Queue) -> list[tuple[str, str]]:
    """Every message of the queue, deleted: (body, receipt handle)."""
    out = []
    for m in deps.queues.take_all(queue, visibility_s=30):
        deps.queues.delete(queue, m.receipt_handle)
        out.append((m.body, m.receipt_handle))
    return out


def _dead_lettered_and_counted(deps: Deps, key: str) -> tuple[str, str]:
    """A one-chunk job whose chunk a worker dead-lettered (its copy in the DLQ), the result counted,
    finalize not run yet: the job id and the chunk id."""
    result = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT},
                                             "idempotency_key": key}), f"m-{key}")
    assert result.job_id is not None and result.state == "running"
    ((body, _),) = _take(deps, Queue.ANALYSIS)
    msg = AnalysisMessage.model_validate_json(body)
    won = deps.claims.claim(msg.job_id, msg.chunk_id, "worker-x", 30, 1)
    assert won.won and won.record is not None
    env = ErrorEnvelope.of("model.unavailable", "provider failed", step="worker", attempt=5)
    assert dead_letter(deps, analysis_message(deps, get_job(deps, msg.job_id), won.record, "intake"), won.fence, env,
                       AttemptStats(calls=1), by="worker") is not None
    for rbody, _ in _take(deps, Queue.RESULTS):
        deps.jobs.settle_chunk(msg.job_id, ResultMessage.model_validate_json(rbody).chunk_id)
    return msg.job_id, msg.chunk_id


def _worker_finishes_and_job_completes(deps: Deps, job_id: str, chunk_id: str) -> Job:
    ((body, handle),) = _take(deps, Queue.ANALYSIS)
    msg = AnalysisMessage.model_validate_json(body)
    assert (msg.chunk_id, msg.reason) == (chunk_id, "redrive")
    worker = chunk_worker(deps, OfflineRuleModel(), rng=random.Random(1), sleep=lambda _s: None)
    assert worker.handle(msg, Delivery(message_id="m", receipt_handle="", receive_count=1, visibility_s=120)).action \
        == "done"
    outcomes = [handle_result(deps, ResultMessage.model_validate_json(b)) for b, _ in _take(deps, Queue.RESULTS)]
    assert outcomes[-1] == "completed"
    return get_job(deps, job_id)


def test_a_redrive_inside_finalize_keeps_the_job_running_on_dynamodb(deps: Deps):
    # GIVEN a job whose only chunk is dead-lettered and counted; finalize is about to end it
    job_id, chunk_id = _dead_lettered_and_counted(deps, "race-transition")
    job = get_job(deps, job_id)
    # AND the operator's `review dlq redrive` lands right before finalize's (conditional) transition
    real = deps.jobs.transition
    raced: list[str] = []

    def transition(jid: str, from_states: Any, to: JobState, **kw: Any) -> Job | None:
        if to is JobState.DEAD_LETTERED and not raced:
            raced.extend(d.action for d in dlq_redrive(deps))
        return real(jid, from_states, to, **kw)

    setattr(deps.jobs, "transition", transition)  # noqa: B010 -- wrapping one call of the real adapter
    # WHEN finalize runs
    state = finalize(deps, job)
    # THEN DynamoDB rejects finalize's transition (the settled version moved): the job keeps running
    assert raced == ["redriven (1 chunk(s) sent)"]
    assert state is JobState.RUNNING and get_job(deps, job_id).state is JobState.RUNNING
    assert get_chunk(deps, job_id, chunk_id).status is ChunkStatus.PENDING
    assert deps.queues.peek(Queue.ANALYSIS_DLQ) == []
    # AND the redriven chunk is worked and the job completes with a report
    done = _worker_finishes_and_job_completes(deps, job_id, chunk_id)
    assert done.state is JobState.COMPLETED and report_json(deps, done)["state"] == "completed"


def test_a_finalize_landing_inside_the_redrive_is_undone_on_dynamodb(deps: Deps):
    # GIVEN the same job, and a finalize that read the chunk records while the chunk was dead-lettered
    job_id, chunk_id = _dead_lettered_and_counted(deps, "race-unsettle")
    job_as_read, records_as_read = get_job(deps, job_id), deps.claims.for_job(job_id)
    # AND its transition lands between the redrive's reset of the chunk and its unsettle
    real_unsettle, real_for_job = deps.jobs.unsettle_chunks, deps.claims.for_job
    ended: list[JobState] = []

    def unsettle(jid: str, chunk_ids: Any) -> Job | None:
        if not ended:
            setattr(deps.claims, "for_job", lambda _j: records_as_read)  # noqa: B010 -- its earlier read
            try:
                ended.append(finalize(deps, job_as_read))
            finally:
                setattr(deps.claims, "for_job", real_for_job)  # noqa: B010 -- restored
        return real_unsettle(jid, chunk_ids)

    setattr(deps.jobs, "unsettle_chunks", unsettle)  # noqa: B010 -- wrapping one call of the real adapter
    # WHEN the operator redrives the DLQ
    (done,) = dlq_redrive(deps)
    # THEN finalize ended the job in between, and the redrive reopened it as a whole
    assert ended == [JobState.DEAD_LETTERED] and done.action == "redriven (1 chunk(s) sent)"
    job = get_job(deps, job_id)
    assert job.state is JobState.RUNNING and job.error_code is None and counted(deps.claims, job) == set()
    # AND the chunk is worked and the job completes
    assert _worker_finishes_and_job_completes(deps, job_id, chunk_id).state is JobState.COMPLETED
