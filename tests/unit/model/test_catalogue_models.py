"""Every catalogued model works, and adding one is one row (config/catalogue.py): the real Bedrock clients build each
request by the model's row, and the strict stand-in for bedrock-runtime (doubles/bedrock_runtime.py) refuses, with
Bedrock's 400, what the real model refuses."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from contract_review.config import catalogue
from contract_review.config.catalogue import CATALOGUE, ModelRow, per_million
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.doubles.bedrock_runtime import StrictBedrock, rejection
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.bedrock import converse_body
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..model_doubles import request

ROOT = Path(__file__).resolve().parents[3]
SONNET_4_6 = "global.anthropic.claude-sonnet-4-6"


def test_the_default_is_the_newest_sonnet_whose_request_rules_are_confirmed() -> None:
    sonnets = [r for r in CATALOGUE.values() if "Sonnet" in r.name]
    confirmed = [r for r in sonnets if not set(catalogue.CORRECTNESS) & r.unverified]
    newest = max(confirmed, key=lambda r: r.name.split()[-1])  # "4.6" > "4.5"
    assert catalogue.catalogued(catalogue.DEFAULT_MODEL_ID) == newest
    assert any(r.name > newest.name for r in sonnets)  # newer ones exist, with an unconfirmed rule


def _invoked_id(row: ModelRow) -> str:
    """How a deploy names the model: its first inference profile (global. where it has one)."""
    return f"{row.profiles[0]}{row.model_id}" if row.profiles else row.model_id


def _review(world: FakeWorld, strict: StrictBedrock, model_id: str, text: str = TEXT) -> tuple[str, set[str]]:
    """Intake `text`, then one worker on the model (through its real Bedrock client on the stand-in) takes every
    analysis message, and the aggregator every result: the job id and the workers' actions."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": text}}), "m-1")
    assert result.job_id is not None
    worker = chunk_worker(world.deps, strict.client(model_id), rng=random.Random(1), sleep=lambda _s: None,
                          call_safety_s=0.5)
    actions: set[str] = set()
    while world.queues.sent[Queue.ANALYSIS]:
        for i, sent in enumerate(world.queues.drain(Queue.ANALYSIS)):
            delivery = Delivery(message_id=f"mid-{i}", receipt_handle="rh", receive_count=1, visibility_s=120,
                                remaining_ms=lambda: 10**9)
            actions.add(str(worker.handle(AnalysisMessage.model_validate_json(sent.body), delivery).action))
        for sent in world.queues.drain(Queue.RESULTS):
            handle_result(world.deps, ResultMessage.model_validate_json(sent.body))
    return result.job_id, actions


def _findings(world: FakeWorld, job_id: str) -> list[tuple[str, str, int]]:
    return sorted((f["analyst"], f["category"], f["start"]) for c in world.claims.for_job(job_id) if c.findings_key
                  for f in json.loads(world.artifacts.get_text(c.findings_key))["findings"])


@pytest.fixture(scope="module")
def reference() -> list[tuple[str, str, int]]:
    """The findings of TEXT on the default model (the offline rule model's answers)."""
    world = FakeWorld()
    job_id, _ = _review(world, StrictBedrock(OfflineRuleModel()), SONNET_4_6)
    return _findings(world, job_id)


@pytest.mark.parametrize("model_id", sorted(CATALOGUE))
def test_a_chunks_analysts_complete_on_every_catalogued_model_with_its_request_rules_enforced(
        model_id: str, reference: list[tuple[str, str, int]]) -> None:
    # GIVEN a one-chunk job, and the strict bedrock-runtime stand-in answering with the offline rule model
    world, strict = FakeWorld(), StrictBedrock(OfflineRuleModel())
    # WHEN a worker runs its analysts through the real Bedrock client of the model (its row's API and body)
    job_id, actions = _review(world, strict, _invoked_id(CATALOGUE[model_id]))
    # THEN no request was refused, every call was answered, and the chunk is done with the same findings
    assert strict.refused == [] and actions == {"done"}
    (record,) = world.claims.for_job(job_id)
    assert record.status is ChunkStatus.DONE and strict.answered == record.n_calls > 0
    assert _findings(world, job_id) == reference != []


# --- the rules the stand-in enforces, each from a row ----------------------------------------------------------

def test_a_body_built_for_one_model_is_refused_by_a_model_with_stricter_rules() -> None:
    permissive = converse_body(request(), CATALOGUE["anthropic.claude-sonnet-4-6"], cache_point=False)
    assert permissive["toolConfig"]["toolChoice"] == {"tool": {"name": "record_answer"}}
    assert "temperature" in permissive["inferenceConfig"]
    sonnet_5 = CATALOGUE["anthropic.claude-sonnet-5"].model_copy(update={"api": "converse", "unverified": frozenset()})
    assert "forced tool choice" in (rejection(sonnet_5, "converse", permissive) or "")
    unforced = converse_body(request(), sonnet_5.model_copy(update={"sampling": True}), cache_point=False)
    assert unforced["toolConfig"]["toolChoice"] == {"auto": {}} and "temperature" in unforced["inferenceConfig"]
    assert "temperature" in (rejection(sonnet_5, "converse", unforced) or "")
    # the body built by the row itself passes
    assert rejection(sonnet_5, "converse", converse_body(request(), sonnet_5, cache_point=False)) is None


def test_messages_bodies_carry_the_rows_version_and_a_wrong_one_is_refused() -> None:
    row = CATALOGUE["anthropic.claude-sonnet-5-5"]
    assert rejection(row, "messages", {"anthropic_version": "2026-10-21", "max_tokens": 8}) is not None
    assert rejection(row, "messages", {"anthropic_version": row.anthropic_version, "max_tokens": 8}) is None
    assert rejection(row, "messages", {"anthropic_version": row.anthropic_version, "thinking": {
        "type": "enabled", "budget_tokens": 1024}}) is not None  # adaptive thinking only
    fable = CATALOGUE["anthropic.claude-fable-5-1"]
    assert rejection(fable, "messages", {"anthropic_version": fable.anthropic_version,
                                         "thinking": {"type": "disabled"}}) is not None  # it always thinks


def test_a_refused_request_is_bedrocks_400_validation_exception() -> None:
    strict = StrictBedrock(OfflineRuleModel())
    with pytest.raises(ClientError) as info:
        strict.converse(modelId="global.anthropic.claude-sonnet-5-5", messages=[])  # Messages only (unverified)
    assert info.value.response["Error"]["Code"] == "ValidationException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400 and strict.refused


# --- adding a model is one row ----------------------------------------------------------------------------------

NEW = ModelRow(model_id="anthropic.claude-test-9", name="Claude Test 9 (fictitious)", profiles=("global.",),
               api="messages", forced_tool_choice=False, sampling=False, thinking="adaptive", min_cache_tokens=1024,
               output_burndown=10, price=per_million("2", "10"), batch=False)


def test_a_new_models_row_is_all_a_job_needs_to_run_on_it_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a model the code has never seen: without its row the stand-in knows nothing that lets a request through
    world, strict = FakeWorld(), StrictBedrock(OfflineRuleModel())
    job_id, _ = _review(world, strict, "global.anthropic.claude-test-9", LONG_TEXT)
    assert strict.answered == 0 and strict.refused and world.jobs.get(job_id).state is not JobState.COMPLETED
    # WHEN its row is added to the catalogue, and nothing else
    monkeypatch.setitem(catalogue.CATALOGUE, NEW.model_id, NEW)
    world, strict = FakeWorld(), StrictBedrock(OfflineRuleModel())
    job_id, actions = _review(world, strict, "global.anthropic.claude-test-9", LONG_TEXT)
    # THEN a job of several chunks completes on it with no request refused: a Messages body with the tool offered,
    # not forced, and no temperature, as its row says
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.chunk_count > 1
    assert strict.refused == [] and strict.answered > 0 and actions == {"done"}


def test_no_other_table_of_model_facts_exists() -> None:
    """Model ids are named in code only by the catalogue (the default too)."""
    model_id = re.compile(r"[\"'](?:[a-z-]+\.)?anthropic\.claude-[a-z0-9.:-]+[\"']")
    found: dict[str, list[str]] = {}
    for path in [*ROOT.glob("functions/**/*.py"), *ROOT.glob("review_local/**/*.py"), *ROOT.glob("infra/**/*.py"),
                 *ROOT.glob("bench/*.py"), ROOT / "app.py"]:
        names = model_id.findall(path.read_text(encoding="utf-8"))
        if names and path.name != "catalogue.py":
            found[str(path.relative_to(ROOT))] = names
    assert found == {}
