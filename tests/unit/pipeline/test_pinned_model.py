"""A job runs on the model it recorded at intake (`Job.model_id`), not on the deploy's default: a worker deployed
with another model calls the job's, under the job's analysis identities (wiring.build_chunk_worker, pipeline/worker.py
`model_for`)."""

from __future__ import annotations

import dataclasses
import json

from contract_review.config.settings import Settings
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.review.analysts import analysis_identities, analysts_for
from contract_review.wiring import build_chunk_worker

from ...texts import LONG_TEXT
from ..fakes import FakeWorld


class Counted:
    """A model that counts its calls, answering as the offline rule model does."""

    def __init__(self, model_id: str):
        self.model_id, self.calls, self.inner = model_id, 0, OfflineRuleModel()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return self.inner.invoke(request)


def redeployed(world: FakeWorld, model_id: str, fallbacks: tuple[str, ...] = ()) -> Settings:
    """The world's settings deployed with the Bedrock model `model_id` and `-c model_fallbacks` (a quota so large
    nothing is paced)."""
    return world.settings.model_copy(update={
        "model_provider": "bedrock", "model_id": model_id, "model_fallbacks": fallbacks,
        "profile": world.settings.profile.with_overrides(model_tokens_per_minute=1e12)})


def _run(world: FakeWorld, worker_model: Counted, others: dict[str, Counted], fallbacks: tuple[str, ...] = ()) -> None:
    """The workers of a deploy whose model is `worker_model`'s work every chunk message; the aggregator each result."""
    settings = redeployed(world, worker_model.model_id, fallbacks)
    deps = dataclasses.replace(world.deps, settings=settings)
    worker = build_chunk_worker(settings, deps, worker_model, lambda s: others[s.model_id])
    while world.queues.sent[Queue.ANALYSIS]:
        for i, sent in enumerate(world.queues.drain(Queue.ANALYSIS)):
            delivery = Delivery(message_id=f"m{i}", receipt_handle="r", receive_count=1, visibility_s=120,
                                remaining_ms=lambda: 10**9)
            worker.handle(AnalysisMessage.model_validate_json(sent.body), delivery)
        for sent in world.queues.drain(Queue.RESULTS):
            handle_result(world.deps, ResultMessage.model_validate_json(sent.body))


def test_a_job_in_flight_keeps_its_model_when_the_workers_come_back_with_another_default() -> None:
    # GIVEN a job taken in while the deploy's model was the offline one (its recorded model)
    world = FakeWorld()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}}), "m-1")
    job = world.jobs.get(result.job_id or "")
    assert job is not None and job.model_id == world.settings.effective_model_id and job.chunk_count > 1
    # WHEN the workers restart deployed with another model, the job's kept granted (`-c model_fallbacks`), and work
    # the job's chunks
    recorded, new_default = Counted(job.model_id), Counted("global.anthropic.claude-sonnet-5-5")
    _run(world, new_default, {job.model_id: recorded}, fallbacks=(job.model_id,))
    # THEN every call went to the job's model, none to the new default, and the job completed on it
    job = world.jobs.get(job.job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.model_id == recorded.model_id
    assert recorded.calls > 0 and new_default.calls == 0
    # AND it was priced at its model: what the same job costs on a deploy that never changed its model
    same = FakeWorld()
    handle_intake(same.deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}}), "m-1")
    _run(same, Counted(recorded.model_id), {})
    unchanged = same.jobs.get(job.job_id)
    assert unchanged is not None and 0 < job.model_micro_usd == unchanged.model_micro_usd
    # AND its analysts' checkpoints are stored under the job's model's identities, not the new default's
    settings = redeployed(world, new_default.model_id, (job.model_id,))
    expected = analysis_identities(settings, analysts_for(job.analyst_count), recorded.model_id)
    assert expected != analysis_identities(settings, analysts_for(job.analyst_count))
    for record in world.claims.for_job(job.job_id):
        saved = world.claims.checkpoints(record)
        assert saved and {cp.analyst: cp.config_hash for cp in saved.values()} == \
            {name: expected[name] for name in saved}


def test_a_job_on_the_deploys_own_model_builds_no_other() -> None:
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}}), "m-1")
    own = Counted(world.settings.effective_model_id)
    _run(world, own, {})  # no other model may be asked for
    assert own.calls > 0


def test_a_job_whose_model_the_redeploy_no_longer_grants_fails_at_once_saying_how_to_keep_it() -> None:
    # GIVEN a job in flight, and the workers redeployed with another model and without the job's among the fallbacks
    world = FakeWorld()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}}), "m-1")
    job = world.jobs.get(result.job_id or "")
    assert job is not None
    recorded, new_default = Counted(job.model_id), Counted("global.anthropic.claude-sonnet-5-5")
    # WHEN they take its chunks
    _run(world, new_default, {job.model_id: recorded})
    # THEN no model was called (neither the job's, not granted, nor the new one, which is not the job's), and the job
    # failed at once with the code that says how to let it finish
    job = world.jobs.get(job.job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.not_granted"
    assert recorded.calls == new_default.calls == 0
    assert job.error is not None and f"-c model_fallbacks={recorded.model_id}" in job.error.message
