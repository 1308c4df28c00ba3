"""The worker, aggregator and sweeper cores called directly against the deployed template on a
moto server (no worker processes): checkpoint reuse and staleness, Lambda time handoff, refusals,
semantic repair, coverage policy, fencing."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from contract_review.aggregator import handle_result
from contract_review.config import get_profile
from contract_review.intake import handle_intake
from contract_review.messages import AnalysisMessage, ResultMessage
from contract_review.models import ModelRequest, ModelResponse
from contract_review.offline_model import OfflineRuleModel
from contract_review.store import Store
from contract_review.sweeper import sweep
from contract_review.worker import ChunkWorker, Delivery
from review_local.connect import local_session, settings_from_outputs, store_for
from review_local.embedded import EmbeddedAws

TEXT = (
    "1. Liability. In no event shall either party be liable for any indirect, incidental or consequential "
    "damages, and each party's aggregate liability shall not exceed the fees paid in the prior twelve months.\n\n"
    "2. Licence. Licensor grants Customer a non-exclusive, non-transferable, worldwide license to use the "
    "Software during the Term.\n\n"
    "3. Law. This Agreement shall be governed by the laws of the State of New York.\n\n"
    "4. Termination. Customer may terminate this Agreement at any time for convenience upon thirty days notice.\n"
)


@pytest.fixture
def store(local_template: dict[str, Any]) -> Iterator[Store]:
    aws = EmbeddedAws().start()
    try:
        aws.deploy(local_template)
        yield store_for(local_session(aws.region), settings_from_outputs(aws.outputs, "local"), aws.endpoint)
    finally:
        aws.stop()


class ScriptedModel:
    """The offline model, with scripted answers for chosen (analyst, step) calls; counts calls."""

    model_id = "offline-rules-v1"

    def __init__(self, script: dict[tuple[str, str], list[ModelResponse]] | None = None):
        self.inner = OfflineRuleModel()
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: Counter[tuple[str, str]] = Counter()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        key = (request.analyst, request.step)
        self.calls[key] += 1
        queue = self.script.get(key)
        if queue:
            return queue.pop(0)
        return self.inner.invoke(request)


def _start_job(store: Store) -> tuple[str, AnalysisMessage, Delivery]:
    result = handle_intake(store, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    r = store.aws.sqs.receive_message(QueueUrl=store.s.analysis_queue_url, MaxNumberOfMessages=10,
                                      MessageSystemAttributeNames=["All"])
    (m,) = r["Messages"]
    delivery = Delivery(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"], receive_count=1,
                        queue_url=store.s.analysis_queue_url, visibility_s=store.s.profile.analysis_visibility_s)
    return result.job_id, AnalysisMessage.model_validate_json(m["Body"]), delivery  # type: ignore[return-value]


def _worker(store: Store, model: Any) -> ChunkWorker:
    return ChunkWorker(store, model, rng=random.Random(1), sleep=lambda s: None, call_safety_s=0.5)


def _aggregate(store: Store) -> list[str]:
    outcomes = []
    r = store.aws.sqs.receive_message(QueueUrl=store.s.results_queue_url, MaxNumberOfMessages=10)
    for m in r.get("Messages", []):
        outcomes.append(handle_result(store, ResultMessage.model_validate_json(m["Body"])))
        store.aws.sqs.delete_message(QueueUrl=store.s.results_queue_url, ReceiptHandle=m["ReceiptHandle"])
    return outcomes


def _commit_checkpoint(store: Store, job_id: str, chunk_id: str, analyst: str, config_hash: str) -> None:
    claim = store.claim(job_id, chunk_id, "earlier-worker", 30, 1)
    assert claim.won
    out = {"analyst": analyst, "status": "ok", "findings": [], "model_calls": 2}
    assert store.put_checkpoint(job_id, chunk_id, analyst, claim.fence, config_hash, out)
    store.release(job_id, chunk_id, claim.fence, {}, None, failure=False)


def test_checkpointed_analyst_is_loaded_not_rerun(store):
    job_id, msg, delivery = _start_job(store)
    _commit_checkpoint(store, job_id, msg.chunk_id, "liability", store.s.analysis_config_hash())
    model = ScriptedModel()
    assert _worker(store, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 0  # loaded from the checkpoint
    assert model.calls[("disputes", "locate")] == 1
    assert _aggregate(store) == ["completed"]


def test_checkpoint_from_another_model_or_prompt_is_not_reused(store):
    job_id, msg, delivery = _start_job(store)
    _commit_checkpoint(store, job_id, msg.chunk_id, "liability", "hash-of-an-older-deploy")
    model = ScriptedModel()
    assert _worker(store, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 1  # re-run with the current model/prompt
    stale = [e for e in store.events(job_id) if e["type"] == "checkpoint.stale"]
    assert stale and stale[0]["detail"]["analyst"] == "liability"


def test_out_of_lambda_time_hands_back_without_a_failure(store):
    job_id, msg, delivery = _start_job(store)
    delivery.remaining_ms = lambda: 300  # less than one call needs
    outcome = _worker(store, ScriptedModel()).handle(msg, delivery)
    assert outcome.action == "requeued" and outcome.detail["reason"] == "runtime.time_exhausted"
    record = store.get_chunk(job_id, msg.chunk_id)
    assert record["status"] == "pending" and record["failures"] == 0
    r = store.aws.sqs.receive_message(QueueUrl=store.s.analysis_queue_url, MaxNumberOfMessages=10)
    fresh = [AnalysisMessage.model_validate_json(m["Body"]) for m in r.get("Messages", [])]
    assert [(f.chunk_id, f.reason, f.requeues, f.attempt) for f in fresh] == \
        [(msg.chunk_id, "runtime.time_exhausted", 1, 1)]


def test_refusal_of_an_optional_analyst_completes_with_the_gap_listed(store):
    job_id, msg, delivery = _start_job(store)
    model = ScriptedModel({("licensing", "locate"): [ModelResponse(text="", stop_reason="content_filtered")]})
    assert _worker(store, model).handle(msg, delivery).action == "done"
    assert model.calls[("licensing", "locate")] == 1  # policy: fallback, not a retry
    assert _aggregate(store) == ["completed"]
    report = json.loads(store.get_object(store.get_job(job_id)["report_json_key"]))
    assert report["coverage"]["optional_gaps"] == [
        {"chunk_id": msg.chunk_id, "chunk_index": 0, "analyst": "licensing", "status": "refused"}]


def test_refusal_of_a_mandatory_analyst_fails_the_job_naming_the_gap(store):
    job_id, msg, delivery = _start_job(store)
    model = ScriptedModel({("liability", "locate"): [ModelResponse(text="", stop_reason="guardrail_intervened")]})
    _worker(store, model).handle(msg, delivery)
    assert _aggregate(store) == ["failed"]
    job = store.get_job(job_id)
    assert job["error_code"] == "job.chunks_missing"
    report = json.loads(store.get_object(job["report_json_key"]))
    assert [g["analyst"] for g in report["coverage"]["mandatory_gaps"]] == ["liability"]


def test_invalid_output_gets_one_repair_with_the_error_fed_back(store):
    job_id, msg, delivery = _start_job(store)
    bad = ModelResponse(text='{"clauses": [{"category": "liability_cap", "quote": "not in the text"}]}',
                        stop_reason="end_turn")
    model = ScriptedModel({("liability", "locate"): [bad]})
    assert _worker(store, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 2
    record = store.get_chunk(job_id, msg.chunk_id)
    assert record["repairs"] == 1 and record["retries"] == {}  # counted apart from transient retries
    assert record["coverage"]["liability"] == "ok"


def test_invalid_output_twice_becomes_a_permanent_gap(store):
    job_id, msg, delivery = _start_job(store)
    bad = ModelResponse(text="{", stop_reason="end_turn")
    model = ScriptedModel({("indemnity", "locate"): [bad, bad]})
    _worker(store, model).handle(msg, delivery)
    assert model.calls[("indemnity", "locate")] == 2
    assert store.get_chunk(job_id, msg.chunk_id)["coverage"]["indemnity"] == "failed"
    assert _aggregate(store) == ["failed"]


def test_a_lapsed_claim_is_taken_over_and_the_old_token_is_rejected(store):
    job_id, msg, _ = _start_job(store)
    first = store.claim(job_id, msg.chunk_id, "a", lease_s=-1, receive_count=1)  # already lapsed
    second = store.claim(job_id, msg.chunk_id, "b", lease_s=30, receive_count=2)
    assert first.won and second.won and second.fence == first.fence + 1
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 0}
    assert not store.put_checkpoint(job_id, msg.chunk_id, "liability", first.fence, "h", out)
    assert store.checkpoints(job_id, msg.chunk_id) == {}  # nothing committed for the zombie
    assert store.finish(job_id, msg.chunk_id, first.fence, "done", {}, {}) is None
    assert not store.heartbeat(job_id, msg.chunk_id, first.fence, 30)
    third = store.claim(job_id, msg.chunk_id, "c", lease_s=30, receive_count=3)
    assert not third.won and third.item["claimed_by"] == "b"  # why it failed, without another read


def test_sweeper_requeues_a_lapsed_claim_and_dead_letters_after_the_poison_budget(store):
    job_id, msg, _ = _start_job(store)
    budget = get_profile("local").poison_budget
    for attempt in range(1, budget + 1):
        claim = store.claim(job_id, msg.chunk_id, f"w{attempt}", lease_s=-1, receive_count=1)
        assert claim.won
        report = sweep(store)
        if attempt < budget:
            assert report.requeued == [msg.chunk_id]
            assert store.get_chunk(job_id, msg.chunk_id)["failures"] == attempt
        else:
            assert report.dead_lettered == [msg.chunk_id]
    record = store.get_chunk(job_id, msg.chunk_id)
    assert record["status"] == "dead_lettered" and record["last_error"]["error_code"] == "runtime.worker_lost"
    assert _aggregate(store) == ["dead_lettered"]
    job = store.get_job(job_id)
    assert job["state"] == "dead_lettered" and [m["chunk_id"] for m in job["missing"]] == [msg.chunk_id]
