"""The specialist analysts: output validation, error codes, offsets, and the model-call count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract_review.config.profile import PROFILES
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.doubles.offline_model import EXAMPLES, PATTERNS, OfflineRuleModel, locate
from contract_review.review.analysts import (
    ANALYSTS,
    CATEGORIES,
    CATEGORY_BY_KEY,
    MAX_TOKENS,
    STEPS,
    AnalystSpec,
    Assessed,
    Located,
    analysts_for,
    build_request,
    build_step,
    parse_response,
    run_analyst,
    to_findings,
)
from contract_review.review.chunking import Chunk, split_into_chunks

# One clause for each category (the offline rules' example of it), so every analyst's locate step finds something.
ALL_CATEGORIES_TEXT = "".join(f"{i}. {EXAMPLES[c.key]}\n" for i, c in enumerate(CATEGORIES, 1))


def _chunk(text: str, start: int = 0, index: int = 0) -> Chunk:
    return Chunk(index=index, chunk_id=f"c{index:05d}-test", start=start, end=start + len(text), text=text)


SPEC = AnalystSpec("liability", ("liability_cap", "uncapped_liability"), True)
CHUNK = _chunk("Preamble. In no event shall the Supplier be liable for indirect damages. The end.")
QUOTE = "In no event shall the Supplier be liable for indirect damages."


def _resp(body: object, stop: str = "end_turn") -> ModelResponse:
    return ModelResponse(text=body if isinstance(body, str) else json.dumps(body), stop_reason=stop)


def _code(exc: pytest.ExceptionInfo[ReviewError]) -> str:
    return exc.value.envelope.error_code


class CountingModel:
    """OfflineRuleModel behind a call counter; call_step makes exactly one attempt."""

    def __init__(self) -> None:
        self.inner = OfflineRuleModel()
        self.requests: list[ModelRequest] = []

    def call_step(self, build, parse):
        request = build(None)
        self.requests.append(request)
        return parse(self.inner.invoke(request)), 1


# --- parse_response ---------------------------------------------------------------------------

def test_valid_locate_and_assess_answers_parse() -> None:
    located = parse_response(SPEC, "locate", CHUNK, _resp({"clauses": [{"category": "liability_cap", "quote": QUOTE}]}))
    assert located == [Located(category="liability_cap", quote=QUOTE)]
    assert type(located[0]) is Located  # a located clause has no score yet
    assessed = parse_response(SPEC, "assess", CHUNK, _resp({"findings": [
        {"category": "liability_cap", "quote": QUOTE, "score": 0.4, "rationale": "caps indirect damages"}]}))
    assert assessed == [Assessed(category="liability_cap", quote=QUOTE, score=0.4, rationale="caps indirect damages")]
    assert isinstance(assessed[0], Assessed) and assessed[0].score == 0.4


def test_non_verbatim_quote_is_output_invalid() -> None:
    paraphrase = "In no event shall the supplier be liable for indirect damages."  # case changed
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, "locate", CHUNK, _resp({"clauses": [{"category": "liability_cap", "quote": paraphrase}]}))
    assert _code(exc) == "model.output_invalid"
    assert "verbatim" in exc.value.envelope.message and exc.value.envelope.step == "liability.locate"


def test_category_not_asked_for_is_output_invalid() -> None:
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, "locate", CHUNK, _resp({"clauses": [{"category": "governing_law", "quote": QUOTE}]}))
    assert _code(exc) == "model.output_invalid"


@pytest.mark.parametrize("body", [
    '{"clauses": [',                       # truncated JSON
    "not json at all",
    "",
    '{"findings": []}',                    # the other step's shape
    '{"clauses": [{"category": "liability_cap"}]}',  # missing quote
    '{"clauses": [{"category": "liability_cap", "quote": ""}]}',  # empty quote
])
def test_bad_locate_json_is_output_invalid(body: str) -> None:
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, "locate", CHUNK, _resp(body))
    assert _code(exc) == "model.output_invalid"


@pytest.mark.parametrize("finding", [
    {"category": "liability_cap", "quote": QUOTE, "score": 1.5, "rationale": "x"},   # score out of range
    {"category": "liability_cap", "quote": QUOTE, "score": 0.5, "rationale": ""},    # empty rationale
    {"category": "liability_cap", "quote": QUOTE, "rationale": "no score"},
])
def test_bad_assess_answer_is_output_invalid(finding: dict) -> None:
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, "assess", CHUNK, _resp({"findings": [finding]}))
    assert _code(exc) == "model.output_invalid"


@pytest.mark.parametrize("stop", ["content_filtered", "guardrail_intervened"])
@pytest.mark.parametrize("step", STEPS)
def test_refusal_stop_reasons_are_model_refused(stop: str, step: str) -> None:
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, step, CHUNK, _resp({"clauses": []}, stop=stop))
    assert _code(exc) == "model.refused"
    assert exc.value.envelope.step == f"liability.{step}"


@pytest.mark.parametrize("stop", ["max_tokens", "malformed_model_output", "malformed_tool_use"])
def test_truncated_or_malformed_stop_reasons_are_output_invalid(stop: str) -> None:
    with pytest.raises(ReviewError) as exc:
        parse_response(SPEC, "locate", CHUNK, _resp({"clauses": []}, stop=stop))
    assert _code(exc) == "model.output_invalid"


# --- requests, findings and offsets -----------------------------------------------------------

def test_request_carries_the_chunk_and_only_the_analysts_categories() -> None:
    req = build_request(SPEC, "locate", CHUNK, None, None)
    assert req.payload["chunk_text"] == CHUNK.text and CHUNK.text in req.context and CHUNK.text not in req.prompt
    assert [c["key"] for c in req.payload["categories"]] == list(SPEC.categories)
    assert req.analyst == "liability" and req.step == "locate" and req.chunk_id == CHUNK.chunk_id
    assess = build_request(SPEC, "assess", CHUNK, [Located(category="liability_cap", quote=QUOTE)], "bad score")
    assert assess.payload["clauses"] == [{"category": "liability_cap", "quote": QUOTE}]
    assert "bad score" in assess.prompt and assess.payload["repair_hint"] == "bad score"
    # the assess step is given the located clauses only, never a previous score or rationale
    scored = Assessed(category="liability_cap", quote=QUOTE, score=0.9, rationale="earlier answer")
    again = build_request(SPEC, "assess", CHUNK, [scored], None)
    assert again.payload["clauses"] == [{"category": "liability_cap", "quote": QUOTE}]
    assert "earlier answer" not in again.prompt and "repair_hint" not in again.payload


def test_an_answer_cut_at_max_tokens_is_asked_again_once_with_twice_the_room() -> None:
    """A locate answer is short, so its maxTokens is small (Bedrock reserves maxTokens against the quota); one that
    stops on max_tokens is asked again with twice as many, without a repair text; a second cut answer is invalid."""
    cut = ModelResponse(text='{"clauses": [', stop_reason="max_tokens")
    with pytest.raises(ReviewError) as info:
        parse_response(SPEC, "locate", CHUNK, cut)
    again = build_step(SPEC, "locate", CHUNK, None, info.value.envelope)
    assert again.max_tokens == 2 * MAX_TOKENS["locate"] and "repair_hint" not in again.payload
    assert MAX_TOKENS["locate"] < MAX_TOKENS["assess"]
    other = build_step(SPEC, "locate", CHUNK, None, ReviewError.of("model.output_invalid", "bad quote").envelope)
    assert other.max_tokens == MAX_TOKENS["locate"] and other.payload["repair_hint"] == "bad quote"


def test_findings_offsets_map_back_to_the_document() -> None:
    filler = "\n\n".join(f"Section {i}. The parties shall cooperate in good faith on item {i}." for i in range(60))
    doc = filler + "\n\n" + ALL_CATEGORIES_TEXT + "\n\n" + filler
    chunks = split_into_chunks(doc, target_chars=1500, max_chars=2000)
    assert len(chunks) > 3
    model = CountingModel()
    findings = [f for c in chunks for spec in ANALYSTS for f in run_analyst(spec, c, model.call_step).findings]
    assert {f.category for f in findings} == {c.key for c in CATEGORIES}
    for f in findings:
        assert doc[f.start:f.end] == f.quote
        chunk = chunks[f.chunk_index]
        assert chunk.chunk_id == f.chunk_id and chunk.start <= f.start and f.end <= chunk.end
        assert 0.0 <= f.score <= 1.0 and f.rationale


def test_to_findings_drops_duplicate_quotes_and_offsets_by_chunk_start() -> None:
    chunk = _chunk(CHUNK.text, start=1000, index=7)
    item = Assessed(category="liability_cap", quote=QUOTE, score=0.5, rationale="r")
    out = to_findings(SPEC, chunk, [item, item.model_copy()])
    assert len(out) == 1
    assert out[0].start == 1000 + CHUNK.text.index(QUOTE) and out[0].end == out[0].start + len(QUOTE)
    assert out[0].chunk_index == 7 and out[0].analyst == "liability"
    assert (out[0].category, out[0].quote, out[0].score, out[0].rationale) == ("liability_cap", QUOTE, 0.5, "r")


def test_to_findings_skips_clauses_that_were_never_assessed() -> None:
    located = Located(category="liability_cap", quote=QUOTE)
    assert to_findings(SPEC, CHUNK, [located]) == []
    assessed = Assessed(category="liability_cap", quote=QUOTE, score=0.2, rationale="r")
    (only,) = to_findings(SPEC, CHUNK, [located, assessed])
    assert only.score == 0.2 and only.quote == QUOTE


# --- model calls -------------------------------------------------------------------------------

def test_every_analyst_makes_two_calls_per_chunk_when_its_locate_finds_something() -> None:
    chunk = _chunk(ALL_CATEGORIES_TEXT)
    model = CountingModel()
    outputs = [run_analyst(spec, chunk, model.call_step) for spec in ANALYSTS]
    assert [o.model_calls for o in outputs] == [2] * len(ANALYSTS)
    assert sum(o.model_calls for o in outputs) == len(model.requests) == 2 * len(ANALYSTS)
    assert [(r.analyst, r.step) for r in model.requests] == [(s.name, step) for s in ANALYSTS for step in STEPS]
    for spec, out in zip(ANALYSTS, outputs):
        assert out.status == "ok" and out.findings, spec.name
        assert {f.category for f in out.findings} <= set(spec.categories)
        for f in out.findings:
            assert ALL_CATEGORIES_TEXT[f.start:f.end] == f.quote
    assert {f.category for o in outputs for f in o.findings} == set(CATEGORY_BY_KEY)


def test_locate_that_finds_nothing_skips_assess() -> None:
    chunk = _chunk("The parties shall meet quarterly to discuss the weather and nothing else of consequence.")
    model = CountingModel()
    out = run_analyst(ANALYSTS[0], chunk, model.call_step)
    assert out.model_calls == 1 and out.findings == [] and out.status == "ok"
    assert [r.step for r in model.requests] == ["locate"]


def test_analysts_for_bounds() -> None:
    assert analysts_for(len(ANALYSTS)) == ANALYSTS
    assert analysts_for(3) == ANALYSTS[:3]
    for bad in (0, len(ANALYSTS) + 1, -1):
        with pytest.raises(ValueError):
            analysts_for(bad)


# --- the category and analyst tables: what adding a category must keep true (docs/extending.md) ---

def test_every_category_is_asked_by_exactly_one_analyst_and_every_analyst_asks_known_categories() -> None:
    keys = [c.key for c in CATEGORIES]
    assert len(keys) == len(set(keys)) == len(CATEGORY_BY_KEY)
    asked = [k for spec in ANALYSTS for k in spec.categories]
    assert sorted(asked) == sorted(keys), "a category no analyst asks is never looked for"
    names = [spec.name for spec in ANALYSTS]
    assert len(names) == len(set(names)) and all(spec.categories for spec in ANALYSTS)


def test_every_category_has_offline_rules_that_find_its_example() -> None:
    assert set(PATTERNS) == set(EXAMPLES) == set(CATEGORY_BY_KEY)
    for cat in CATEGORIES:
        assert cat.key in _cats(EXAMPLES[cat.key]), f"the offline rules of {cat.key} miss its example"


def test_every_profile_runs_every_analyst() -> None:
    # the profile states how many analysts a job runs (its sizing grows with it); adding an analyst to
    # review/analysts.py raises it (docs/extending.md): a profile running fewer would silently skip the new one
    for profile in PROFILES.values():
        assert profile.review.analyst_count == len(ANALYSTS), (
            f"profile {profile.name} runs {profile.review.analyst_count} analysts, review/analysts.py has {len(ANALYSTS)}")
        assert 1 <= profile.review.analyst_concurrency <= profile.review.analyst_count


# --- the project's own sample contracts --------------------------------------------------------

SAMPLES = sorted((Path(__file__).resolve().parents[3] / "samples").glob("*.txt"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_each_sample_contract_yields_findings_in_most_categories(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    chunks = split_into_chunks(text)
    model = CountingModel()
    findings = [f for c in chunks for spec in ANALYSTS for f in run_analyst(spec, c, model.call_step).findings]
    for f in findings:
        assert text[f.start:f.end] == f.quote
    found = {f.category for f in findings}
    assert len(found) >= 10, f"{path.name}: only {sorted(found)}"


def test_samples_include_a_long_master_services_agreement() -> None:
    names = {p.name: p.stat().st_size for p in SAMPLES}
    assert len(names) >= 4
    assert names.get("master-services-agreement.txt", 0) >= 100_000


# --- the offline rule model's own behaviour ---------------------------------------------------

ALL_KEYS = [c.key for c in CATEGORIES]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([
    "Either party may terminate this Agreement for convenience on 30 days' notice.",
    "4. Limitation of Liability.", "In no event shall liability exceed the fees paid.",
    "This Agreement is governed by the laws of the State of Delaware.",
    "The Licensee may not assign this Agreement without consent.", "Inc.", "U.S.", "Section 14.1.",
    "\n\n", "\n", "   ", "; ", ": (a) ", "exclusive", "minimum", "audit", "records", "x" * 30,
]), max_size=40))
def test_offline_quotes_are_exact_substrings_of_any_text(parts: list[str]) -> None:
    text = " ".join(parts)
    located = locate(text, ALL_KEYS)
    assert located == locate(text, ALL_KEYS)  # deterministic
    for c in located:
        assert c["category"] in ALL_KEYS
        assert c["quote"] and c["quote"] in text and c["quote"] == c["quote"].strip()


def _cats(text: str) -> set[str]:
    return {c["category"] for c in locate(text, ALL_KEYS)}


def test_a_heading_is_prefixed_to_its_clause_and_counts_for_it() -> None:
    text = "4. Limitation of Liability. The Sponsor shall not be liable for any error of judgment."
    quotes = [c["quote"] for c in locate(text, ["liability_cap"])]
    assert quotes == [text]
    # the heading alone is not a clause
    assert locate("4. Limitation of Liability.", ["liability_cap"]) == []


def test_a_for_cause_right_is_not_termination_for_convenience() -> None:
    assert "termination" in _cats("Either party may terminate this Agreement upon thirty (30) days' prior written notice.")
    assert "termination" not in _cats("Either party may terminate this Agreement upon thirty (30) days' prior written "
                                      "notice if the other party commits a material breach.")


def test_rules_tolerate_padded_and_wrapped_lines() -> None:
    assert "governing_law" in _cats("This Agreement will be governed   and interpreted according to the laws\n"
                                    "          of the State of California.")


def test_abbreviations_do_not_split_sentences() -> None:
    text = "Acme Widgets, Inc. grants to the Customer a non-exclusive license to use the Software in the U.S. market."
    assert [c["quote"] for c in locate(text, ["license_grant"])] == [text]


def test_long_sentences_are_quoted_by_their_relevant_parts() -> None:
    filler = "; ".join(f"the Supplier shall deliver the item numbered {i} to the warehouse" for i in range(12))
    text = f"The parties agree that {filler}; and the Customer shall purchase a minimum of 5,000 units each year; {filler}."
    quotes = [c["quote"] for c in locate(text, ["commitments"])]
    assert quotes and all(len(q) < 200 for q in quotes)
    assert any("minimum of 5,000 units" in q for q in quotes)


def test_model_answers_both_steps_through_the_request_payload() -> None:
    spec = AnalystSpec("disputes", ("governing_law",), False)
    chunk = _chunk("This Agreement is governed by the laws of the State of Delaware. Notices must be in writing.")
    model = OfflineRuleModel()
    located = parse_response(spec, "locate", chunk, model.invoke(build_request(spec, "locate", chunk, None, None)))
    assert located == [Located(category="governing_law",
                               quote="This Agreement is governed by the laws of the State of Delaware.")]
    assessed = parse_response(spec, "assess", chunk, model.invoke(build_request(spec, "assess", chunk, located, None)))
    assert len(assessed) == 1 and isinstance(assessed[0], Assessed)
    assert assessed[0].quote == located[0].quote and 0 <= assessed[0].score <= 1
    assert model.model_id == "offline-rules-v1"
