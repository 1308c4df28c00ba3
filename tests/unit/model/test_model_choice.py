"""A model id Bedrock will not serve fails the whole job in one attempt, end to end: the real
Converse adapter (botocore Stubber with Bedrock's error shapes), the control-plane check, the
worker and the job record (in-memory fakes)."""

from __future__ import annotations

import json
import random
from typing import Any

from botocore.stub import Stubber

from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.model.bedrock import BedrockConverseModel, ModelIdCheck
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker

from ...texts import TEXT
from .. import bedrock_stubs as bs
from ..fakes import FakeWorld
from ..scenarios import events_of, small_chunk_world


def _bedrock(model_id: str) -> tuple[BedrockConverseModel, Stubber, Stubber]:
    runtime, runtime_stub = bs.stubbed("bedrock-runtime")
    control, control_stub = bs.stubbed("bedrock")
    runtime_stub.activate()
    control_stub.activate()
    return BedrockConverseModel(runtime, model_id, id_check=ModelIdCheck(lambda: control)), runtime_stub, control_stub


def _job(world: FakeWorld) -> tuple[str, list[AnalysisMessage]]:
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    msgs = world.queues.analysis()
    world.queues.drain(Queue.ANALYSIS)
    assert result.job_id is not None
    return result.job_id, msgs


def _deliver(world: FakeWorld, model: Any, msg: AnalysisMessage) -> str:
    worker = chunk_worker(world.deps, model, rng=random.Random(1), sleep=lambda _s: None, call_safety_s=0.5)
    delivery = Delivery(message_id=f"mid-{msg.chunk_index}", receipt_handle="rh", receive_count=1, visibility_s=120,
                        remaining_ms=lambda: 10**9)
    return worker.handle(msg, delivery).action


def test_a_retired_model_id_fails_the_job_in_one_attempt_with_its_own_code():
    # GIVEN a job of several chunks, and a stack configured with a retired model: Converse answers
    # ValidationException (400) and the control plane lists the model as LEGACY
    world = small_chunk_world()
    job_id, msgs = _job(world)
    assert len(msgs) > 1
    model, runtime_stub, control_stub = _bedrock(bs.RETIRED)
    runtime_stub.add_client_error("converse", service_error_code="ValidationException",
                                  service_message=bs.EOL_MESSAGE, http_status_code=400)
    bs.expect_model(control_stub, bs.RETIRED, lifecycle="LEGACY", name="Claude 3.5 Sonnet",
                    inference_types=("ON_DEMAND",))
    # WHEN the first chunk is delivered
    action = _deliver(world, model, msgs[0])
    # THEN one model call was made (never retried), the control plane asked once, and the job failed at
    # once with model.id_rejected, its message naming the id and what to do
    runtime_stub.assert_no_pending_responses()
    control_stub.assert_no_pending_responses()
    assert action == "job_failed"
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.id_rejected"
    assert job.error is not None and bs.RETIRED in job.error.message and "-c model_id=" in job.error.message
    assert world.claims.get(job_id, msgs[0].chunk_id).status is ChunkStatus.FAILED
    assert [e["error_code"] for e in events_of(world, job_id, "job.failed")] == ["model.id_rejected"]
    # AND the job's other chunks are skipped without a model call (no stubbed answer is left for one)
    assert {_deliver(world, model, m) for m in msgs[1:]} == {"skipped"}
    assert world.queues.sent[Queue.ANALYSIS_DLQ] == []


def test_a_bad_request_to_a_current_model_fails_only_its_chunk():
    # GIVEN a current model that rejects one request (ValidationException, the same shape as above)
    world = small_chunk_world()
    job_id, msgs = _job(world)
    model, runtime_stub, control_stub = _bedrock(bs.CURRENT)
    runtime_stub.add_client_error("converse", service_error_code="ValidationException",
                                  service_message="Input is too long for requested model.", http_status_code=400)
    bs.expect_current(control_stub)
    # WHEN its chunk is delivered
    action = _deliver(world, model, msgs[0])
    # THEN the control plane vouched for the id: the chunk fails as model.request_invalid, the job goes on
    assert action == "failed"
    record = world.claims.get(job_id, msgs[0].chunk_id)
    assert record.status is ChunkStatus.FAILED and record.last_error.error_code == "model.request_invalid"
    assert world.jobs.get(job_id).state is JobState.RUNNING
    control_stub.assert_no_pending_responses()
