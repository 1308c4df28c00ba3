"""The analysis identity (review/analysts.py): checkpoints are reused per analyst, under an identity derived
from everything that shapes its output; and adding a category through its extension points (the category and
analyst tables, the offline model's rules) reaches the report, the coverage matrix and the identities.

Categories and rules are changed with monkeypatch, the way a code change would change them: in the category
table (`CATEGORIES` / `CATEGORY_BY_KEY`), the analysts (`ANALYSTS`) and the offline rules (`PATTERNS`, `EXAMPLES`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.doubles import offline_model
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.redrive import retry
from contract_review.review import analysts
from contract_review.review.analysts import (
    STEPS,
    AnalystSpec,
    Category,
    analysis_identities,
    analyst_identity,
    build_request,
    identity_material,
    instructions,
    job_config_hash,
    job_identity,
    own_instructions,
)

from ...texts import TEXT
from ..fakes import FakeWorld
from ..inprocess import CrashOnPut, FaultyModel, InProcess
from ..scenarios import events_of, small_chunk_world

MODEL, PROVIDER = "global.anthropic.claude-sonnet-4-6", "bedrock"
ROOT = Path(__file__).resolve().parents[3]


def identities(model_id: str = MODEL, provider: str = PROVIDER) -> dict[str, str]:
    """Every analyst's identity, read from the tables as they are now (after any monkeypatch)."""
    return {spec.name: analyst_identity(spec, model_id, provider) for spec in analysts.ANALYSTS}


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def askers(key: str) -> set[str]:
    return {spec.name for spec in analysts.ANALYSTS if key in spec.categories}


def replace_category(monkeypatch: pytest.MonkeyPatch, key: str, **changes: object) -> Category:
    """Edit one category in place in the category table, as a change to review/analysts.py would."""
    new = dataclasses.replace(analysts.CATEGORY_BY_KEY[key], **changes)
    monkeypatch.setitem(analysts.CATEGORY_BY_KEY, key, new)
    monkeypatch.setattr(analysts, "CATEGORIES", tuple(new if c.key == key else c for c in analysts.CATEGORIES))
    return new


# --- the identity itself ------------------------------------------------------------------------------------

def test_the_identity_is_the_same_in_every_process():
    # GIVEN the identities computed here
    here = identities()
    # WHEN two other interpreters compute them, with different hash seeds (dict and set order, ids differ)
    script = ("import json; from contract_review.review.analysts import ANALYSTS, analyst_identity; "
              f"print(json.dumps({{s.name: analyst_identity(s, {MODEL!r}, {PROVIDER!r}) for s in ANALYSTS}}))")
    answers = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT / "functions")}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        answers.append(json.loads(out.stdout))
    # THEN they are the same 16 hex digits, and differ between analysts
    assert answers == [here, here]
    assert all(len(v) == 16 and int(v, 16) >= 0 for v in here.values()) and len(set(here.values())) == len(here)


def test_the_identity_is_rendered_from_the_requests_the_analyst_sends():
    # GIVEN an analyst and one of its real requests
    spec = analysts.ANALYSTS[0]
    material = identity_material(spec, MODEL, PROVIDER)
    # THEN the material holds, for each step (first answer and repair), what build_request sends
    assert (material["model_id"], material["provider"]) == (MODEL, PROVIDER)
    assert [(r["step"], "repair_hint" in r["payload"], r["max_tokens"]) for r in material["requests"]] == \
        [(step, hint, room * analysts.MAX_TOKENS[step]) for step in STEPS for hint, room in ((False, 1), (True, 1),
                                                                                           (False, 2))]
    for r in material["requests"]:
        real = build_request(spec, r["step"], analysts._PLACEHOLDER_CHUNK, None, None)
        # the shared system prompt describes every category; the identity reads it for the analyst's own only
        assert real.system == instructions() and r["system"] == own_instructions(spec) != real.system
        assert r["context"] == real.context
        assert r["output_schema"] == real.output_schema
        assert r["temperature"] == real.temperature
        assert r["payload"]["categories"] == [
            {"key": c.key, "title": c.title, "question": c.question} for c in analysts.categories_of(spec)]
        assert set(r) == {f.name for f in dataclasses.fields(ModelRequest)}  # every field of the request


def test_the_identity_changes_with_the_model_id_and_the_provider():
    base = identities()
    assert changed(base, identities(model_id="us.anthropic.claude-sonnet-4-6")) == set(base)
    assert changed(base, identities(provider="offline")) == set(base)


@pytest.mark.parametrize("name, value, sent", [("MAX_TOKENS", {"locate": 4096, "assess": 4096}, 4096),
                                               ("TEMPERATURE", 0.3, 0.3)])
def test_the_identity_changes_with_max_tokens_and_temperature(monkeypatch, name, value, sent):
    base = identities()
    monkeypatch.setattr(analysts, name, value)
    assert changed(base, identities()) == set(base)
    request = build_request(analysts.ANALYSTS[0], "locate", analysts._PLACEHOLDER_CHUNK, None, None)
    assert getattr(request, name.lower()) == sent  # what the identity saw is what is sent


@pytest.mark.parametrize("key", ["governing_law", "uncapped_liability", "commitments"])
def test_changing_one_question_changes_only_the_analysts_that_ask_it(monkeypatch, key):
    # GIVEN the identities, and a category asked by one analyst
    base = identities()
    # WHEN its question is changed
    replace_category(monkeypatch, key, question="Is this clause mentioned anywhere at all?")
    # THEN only that analyst's identity changed, and its instructions changed with it (no stale cache)
    after = identities()
    assert changed(base, after) == askers(key) and len(askers(key)) == 1
    (spec,) = [s for s in analysts.ANALYSTS if key in s.categories]
    assert "Is this clause mentioned anywhere at all?" in own_instructions(spec) and \
        "Is this clause mentioned anywhere at all?" in instructions()


def test_changing_a_title_or_a_key_changes_only_its_analyst(monkeypatch):
    base = identities()
    replace_category(monkeypatch, "audit_rights", title="Audit, inspection and records")
    assert changed(base, identities()) == {"audit"}


def test_a_schema_change_changes_every_analyst(monkeypatch):
    # GIVEN the identities, WHEN the tool's schema changes (e.g. a new field)
    base = identities()
    schema = json.loads(json.dumps(analysts.SCHEMA))
    schema.setdefault("properties", {})["confidence"] = {"type": "number"}
    monkeypatch.setattr(analysts, "SCHEMA", schema)
    # THEN every analyst (they all use it) has a new identity
    assert changed(base, identities()) == set(base)


@pytest.mark.parametrize("change", ["system", "task"])
def test_a_prompt_text_change_changes_every_analyst(monkeypatch, change):
    base = identities()
    if change == "system":
        monkeypatch.setattr(analysts, "SYSTEM", analysts.SYSTEM + " Be brief.")
    else:
        monkeypatch.setitem(analysts.TASKS, "assess", analysts.TASKS["assess"] + " Cite the section number.")
    assert changed(base, identities()) == set(base)


def test_what_does_not_shape_the_output_leaves_the_identity_alone(monkeypatch):
    # GIVEN the identities and the job's
    base = identities()
    # WHEN a category's CUAD mapping changes (the quality test's ground truth) and an analyst becomes optional
    replace_category(monkeypatch, "governing_law", cuad=("Governing Law", "Dispute Resolution"))
    monkeypatch.setattr(analysts, "ANALYSTS", tuple(dataclasses.replace(s, mandatory=False) if s.name == "ip" else s
                                                    for s in analysts.ANALYSTS))
    # THEN no identity changed: neither is sent to the model
    assert identities() == base


def test_the_job_identity_changes_when_any_analyst_does_and_ignores_order():
    ids = identities()
    job = job_identity(ids)
    assert job == job_identity(dict(reversed(list(ids.items())))) and len(job) == 16
    assert job_identity({**ids, "audit": "0" * 16}) != job
    assert job_identity({k: v for k, v in ids.items() if k != "audit"}) != job


def test_the_job_config_hash_is_over_the_analysts_the_job_runs():
    world = FakeWorld()
    s = world.settings
    ids = analysis_identities(s, analysts.analysts_for(s.profile.review.analyst_count))
    assert job_config_hash(s) == job_identity(ids)
    assert ids == identities(s.effective_model_id, s.model_provider)


# --- a question changed between two runs of a job -----------------------------------------------------------

class CountingRules(OfflineRuleModel):
    """The offline rule model, counting calls per (chunk, analyst)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, str]] = Counter()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.calls[(request.chunk_id, request.analyst)] += 1
        return super().invoke(request)


def dead_lettered_after_every_analyst_ran(monkeypatch: pytest.MonkeyPatch) -> tuple[InProcess, str, CountingRules]:
    """TEXT (four chunks) through the whole pipeline, where every attempt dies writing its chunk's findings,
    after its analysts were checkpointed: the sweeper recovers each lapsed chunk until its poison budget is
    used, and the job ends dead_lettered with all 4 x 11 analysts checkpointed."""
    world = small_chunk_world()
    rules = CountingRules()
    p = InProcess(world, FaultyModel(inner=rules))
    dying = CrashOnPut(world, "findings/")
    p.send({"text": TEXT}, key="msa")
    p.round()
    (job,) = world.jobs.all()
    job = p.run(job.job_id)
    assert job.state is JobState.DEAD_LETTERED, (job.state, job.error_code)
    records = world.claims.for_job(job.job_id)
    assert len(records) == 4 and all(c.status is ChunkStatus.DEAD_LETTERED for c in records)
    assert all(set(c.checkpoints) == {s.name for s in analysts.ANALYSTS} for c in records)
    dying.on = False
    return p, job.job_id, rules


def test_review_retry_after_a_question_changed_reruns_only_the_analyst_that_asks_it(monkeypatch):
    # GIVEN a job whose every analyst ran and was checkpointed on every chunk, but which ended dead_lettered
    # (the findings writes died; `review retry` reopens only ended jobs that did not complete)
    p, job_id, rules = dead_lettered_after_every_analyst_ran(monkeypatch)
    world = p.world
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    # each analyst ran once per chunk: the redeliveries after the crashes reused the checkpoints
    assert {a for _, a in rules.calls} == {s.name for s in analysts.ANALYSTS}
    assert all(n <= 2 for n in rules.calls.values()) and {c for c, _ in rules.calls} == set(ids)
    before = analysis_identities(world.settings, analysts.ANALYSTS)
    # WHEN one category's question is changed (a code change, then a deploy) and the operator retries the job
    replace_category(monkeypatch, "governing_law", question="Which law governs, and which courts or arbitrators "
                                                            "decide disputes?")
    rules.calls.clear()
    answer = retry(world.deps, job_id)
    assert answer.retried, answer.action
    job = p.run(job_id)
    # THEN the job completes, and on every chunk only the analyst that asks that question ran again
    assert job.state is JobState.COMPLETED, (job.state, job.error_code)
    p.assert_complete_and_consistent(job_id)
    assert {a for _, a in rules.calls} == {"disputes"} and {c for c, _ in rules.calls} == set(ids)
    # the others' checkpoints were reused; a checkpoint.stale event per chunk names the analyst and both identities
    after = analysis_identities(world.settings, analysts.ANALYSTS)
    assert changed(before, after) == {"disputes"}
    stale = events_of(world, job_id, "checkpoint.stale")
    assert sorted(e["chunk_id"] for e in stale) == sorted(ids)
    assert all((e["analyst"], e["checkpoint_hash"], e["current_hash"]) == ("disputes", before["disputes"],
                                                                          after["disputes"]) for e in stale)
    for record in world.claims.for_job(job_id):
        saved = world.claims.checkpoints(record)
        assert {name: cp.config_hash for name, cp in saved.items()} == after


# --- adding a category through its extension points ---------------------------------------------------------

PAYMENT = Category("payment_terms", "Payment terms", (),
                   "When must invoices be paid, and what happens when a payment is late?")
PAYMENT_RULES: tuple[offline_model.Rule, ...] = (
    r"\binvoices?\b.{0,150}\b(?:payable|paid|due)\b",
    r"\blate payments?\b|\binterest\b.{0,80}\boverdue\b",
)
PAYMENT_EXAMPLE = "Payment. Each invoice is payable within thirty (30) days of its receipt."
PAYMENT_CLAUSE = "5. Payment. Invoices are payable within thirty (30) days; late payments bear interest at 1% a month.\n"


def add_payment_terms(monkeypatch: pytest.MonkeyPatch, own_analyst: bool) -> str:
    """What docs/extending.md says to do, as monkeypatch: the category and its analyst in review/analysts.py
    (joining the commercial analyst, or its own new one), its rules and example in doubles/offline_model.py.
    The analyst that asks it."""
    monkeypatch.setattr(analysts, "CATEGORIES", analysts.CATEGORIES + (PAYMENT,))
    monkeypatch.setitem(analysts.CATEGORY_BY_KEY, PAYMENT.key, PAYMENT)  # (derived from CATEGORIES in the file)
    if own_analyst:
        monkeypatch.setattr(analysts, "ANALYSTS", analysts.ANALYSTS + (AnalystSpec("payments", (PAYMENT.key,), False),))
    else:
        monkeypatch.setattr(analysts, "ANALYSTS", tuple(
            dataclasses.replace(s, categories=s.categories + (PAYMENT.key,)) if s.name == "commercial" else s
            for s in analysts.ANALYSTS))
    monkeypatch.setitem(offline_model.PATTERNS, PAYMENT.key, PAYMENT_RULES)
    monkeypatch.setitem(offline_model.EXAMPLES, PAYMENT.key, PAYMENT_EXAMPLE)
    return "payments" if own_analyst else "commercial"


@pytest.mark.parametrize("own_analyst", [False, True], ids=["joins-an-analyst", "its-own-analyst"])
def test_a_category_added_through_its_extension_points_reaches_the_report_coverage_and_identity(monkeypatch,
                                                                                                own_analyst):
    # GIVEN the identities before, and a 13th category added where docs/extending.md says
    before = identities()
    asker = add_payment_terms(monkeypatch, own_analyst)
    world = FakeWorld()
    if own_analyst:  # a new analyst: the profile runs one more (docs/extending.md; test_every_profile_runs_every_analyst)
        profile = world.settings.profile.with_overrides(**{"analyst_count": len(analysts.ANALYSTS)})
        world = FakeWorld(settings=world.settings.model_copy(update={"profile": profile}))
    # WHEN a contract with a payment clause is reviewed
    p = InProcess(world)
    p.send({"text": TEXT + "\n" + PAYMENT_CLAUSE}, key="with-payment")
    p.round()
    (job,) = world.jobs.all()
    job = p.run(job.job_id)
    # THEN the report has findings of the new category, from the analyst that asks it,
    findings = p.assert_complete_and_consistent(job.job_id)
    paid = [f for f in findings if f["category"] == PAYMENT.key]
    assert paid and {f["analyst"] for f in paid} == {asker} and all("payable" in str(f["quote"]) for f in paid)
    # and its summary row; the coverage matrix has that analyst on every chunk (ok),
    assert job.report_md_key and job.report_json_key
    md = world.artifacts.get_text(job.report_md_key)
    assert f"| {PAYMENT.title} | {PAYMENT.question} | {len(paid)} |" in md
    coverage = json.loads(world.artifacts.get_text(job.report_json_key))["coverage"]
    assert asker in coverage["analysts"] and len(coverage["analysts"]) == len(analysts.ANALYSTS)
    assert coverage["matrix"] and all(row[asker] == "ok" for row in coverage["matrix"].values())
    # and only the identity of the analyst that gained it is new; every other analyst's checkpoints stay valid
    after = identities()
    assert changed(before, after) == {asker}
    assert offline_model.locate(PAYMENT_EXAMPLE, [PAYMENT.key])  # its rules find its example
    assert not world.queues.sent[Queue.ANALYSIS_DLQ]
