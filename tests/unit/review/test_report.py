"""The report a reader gets (`contract_review.review.report`, written by the aggregator) against the in-memory
fakes: report.md says how many findings it lists and that long quotes are shortened, states each
category's question, says when the findings come from the offline rule model, and carries the
metadata sent with the document (report.json too)."""

from __future__ import annotations

import json
import re

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.keys import report_keys
from contract_review.pipeline.intake import handle_intake
from contract_review.review.analysts import CATEGORIES, CATEGORY_BY_KEY, Finding
from contract_review.review.report import (
    QUOTE_MAX,
    REPORT_SCHEMA_VERSION,
    TOP_FINDINGS,
    Report,
    nearest_section,
    sections,
)

from ...texts import LONG_TEXT
from ..fakes import FakeWorld
from ..scenarios import deliver, running_job, settle_done

METADATA = {"matter": "M-7", "pages": 3, "urgent": True, "tags": ["nda", "eu"]}


def finding(record: ChunkRecord, i: int, quote: str, category: str = "termination") -> Finding:
    return Finding(category=category, score=round(0.1 + (i % 9) / 10, 2), quote=quote, start=record.start + i,
                   end=record.start + i + len(quote), rationale=f"reason {i}", analyst="termination",
                   chunk_id=record.chunk_id, chunk_index=record.chunk_index)


def complete(world: FakeWorld, job_id: str, records: list[ChunkRecord],
             findings: dict[int, list[Finding]]) -> tuple[Report, str]:
    """Every chunk settles done with its findings; returns report.json (parsed) and report.md."""
    outcomes = [deliver(world, settle_done(world, r, findings=findings.get(r.chunk_index, []))) for r in records]
    assert outcomes[-1] == "completed"
    json_key, md_key = report_keys(job_id)
    return Report.model_validate_json(world.artifacts.get_text(json_key)), world.artifacts.get_text(md_key)


def bullets(md: str) -> list[str]:
    section = md.split("## Highest-risk clauses", 1)[1]
    return [line for line in section.splitlines() if line.startswith("- **")]


def test_report_md_says_it_lists_15_of_42_findings_and_marks_shortened_quotes():
    # GIVEN a 3-chunk job with 42 findings, one of them the riskiest with a 400-character quote
    world = FakeWorld()
    job_id, records = running_job(world, 3)
    long_quote = "The Customer may terminate for convenience " + "x" * 357
    assert len(long_quote) == 400
    found = {r.chunk_index: [finding(r, i, f"clause {r.chunk_index}-{i}") for i in range(14)] for r in records}
    found[0][0] = finding(records[0], 0, long_quote).model_copy(update={"score": 0.99})
    # WHEN the job completes
    report, md = complete(world, job_id, records, found)
    # THEN report.json has all 42, the long quote whole
    assert len(report.findings) == 42 and long_quote in [f.quote for f in report.findings]
    # AND report.md lists 15 and says so, pointing at report.json for the rest
    assert TOP_FINDINGS == 15
    assert "Showing the 15 highest-risk of 42 clauses (a clause in several categories is listed once; all are in " \
        "report.json)." in md
    assert len(bullets(md)) == 15
    # AND the long quote is cut to QUOTE_MAX characters and marked as shortened
    top = bullets(md)[0]
    assert long_quote[:QUOTE_MAX - 3] + "... _[quote shortened; whole in report.json]_" in top
    assert long_quote not in md
    assert sum("quote shortened" in b for b in bullets(md)) == 1


def test_report_md_with_few_findings_says_they_are_all_there():
    # GIVEN a job with 3 short findings
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    _, md = complete(world, job_id, records, {0: [finding(records[0], i, f"clause {i}") for i in range(3)]})
    # WHEN/THEN report.md lists all three and says nothing is shortened
    assert "All 3 clauses, highest risk first" in md and "Showing the" not in md
    assert len(bullets(md)) == 3 and "quote shortened" not in md


def test_summary_table_states_the_question_each_category_asks():
    # GIVEN a completed job with no termination-for-convenience finding
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    _, md = complete(world, job_id, records, {0: [finding(records[0], 0, "clause", category="governing_law")]})
    # WHEN the summary table is read
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    # THEN every category's row states its question, so "Termination rights 0" reads as what it means
    assert rows["category"] == "| category | question | findings | max risk |"
    for cat in CATEGORIES:
        assert f"| {cat.title} | {cat.question} |" in rows[cat.title]
    assert rows["Termination rights"] == (f"| Termination rights | {CATEGORY_BY_KEY['termination'].question} "
                                          "| 0 | 0.00 |")
    assert "Can a party terminate without cause or for convenience" in rows["Termination rights"]
    assert re.search(r"\| Governing law and disputes \| .+ \| 1 \| 0\.10 \|", rows["Governing law and disputes"])


def test_report_says_when_findings_come_from_the_offline_rule_model():
    # GIVEN one job reviewed by the offline rule model and one by a Bedrock model
    world = FakeWorld()
    offline_id, offline_records = running_job(world, 1, "offline", model_id="offline-rules-v1")
    bedrock_id, bedrock_records = running_job(world, 1, "bedrock", model_id="anthropic.claude-sonnet-4-x")
    # WHEN both complete
    offline_report, offline_md = complete(world, offline_id, offline_records, {})
    _, bedrock_md = complete(world, bedrock_id, bedrock_records, {})
    # THEN only the offline one says its findings come from rules, not an LLM
    [offline_line] = [line for line in offline_md.splitlines() if line.startswith("- model:")]
    assert offline_line.startswith("- model: offline-rules-v1 (prompt ")
    assert "**the offline rule model** (deterministic keyword/regex rules, not an LLM)" in offline_line
    [bedrock_line] = [line for line in bedrock_md.splitlines() if line.startswith("- model:")]
    assert "anthropic.claude-sonnet-4-x" in bedrock_line and "not an LLM" not in bedrock_md
    assert offline_report.model_id == "offline-rules-v1"


def test_a_local_runs_cost_is_labelled_an_estimate_and_a_bedrock_runs_is_not():
    world = FakeWorld()
    offline_id, offline_records = running_job(world, 1, "offline", model_id="offline-rules-v1")
    bedrock_id, bedrock_records = running_job(world, 1, "bedrock", model_id="anthropic.claude-sonnet-4-6")
    offline_report, offline_md = complete(world, offline_id, offline_records, {})
    bedrock_report, bedrock_md = complete(world, bedrock_id, bedrock_records, {})
    assert offline_report.cost is not None and offline_report.cost.estimate
    assert "## Estimated cost" in offline_md and "Nothing was charged" in offline_md
    assert bedrock_report.cost is not None and not bedrock_report.cost.estimate
    assert "## Cost" in bedrock_md and "Nothing was charged" not in bedrock_md
    # AND the local one gives the estimate at LLM-like answer lengths beside its own (a real run's is measured)
    assert offline_report.cost.llm_like_usd is not None and float(offline_report.cost.llm_like_usd) > 0
    assert f"the same document's model tokens are estimated at ${offline_report.cost.llm_like_usd}" in offline_md
    assert bedrock_report.cost.llm_like_usd is None and "LLM-like" not in bedrock_md


def test_metadata_sent_with_the_document_appears_in_both_reports():
    # GIVEN a document submitted with metadata and taken in by intake (offline model: provider recorded)
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}, "metadata": METADATA})
    result = handle_intake(world.deps, body, "m-1")
    assert result.job_id is not None
    # WHEN it completes
    report, md = complete(world, result.job_id, world.claims.for_job(result.job_id), {})
    # THEN report.json carries the metadata and the model provider
    assert report.metadata == METADATA and report.model_provider == "offline"
    # AND report.md lists it, one key per line
    assert "- metadata:\n  - matter: M-7\n  - pages: 3\n  - urgent: true\n  - tags: [\"nda\", \"eu\"]\n" in md
    assert "not an LLM" in md


def test_report_without_metadata_has_no_metadata_line():
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    report, md = complete(world, job_id, records, {})
    assert report.metadata == {} and "- metadata:" not in md


def test_report_md_has_its_date_a_coverage_statement_and_a_risk_legend():
    from datetime import UTC, datetime

    from contract_review.review.analysts import ANALYSTS
    from contract_review.review.report import HIGH_RISK
    from contract_review.sideeffects.saga import HIGH_RISK_SCORE

    # GIVEN a 2-chunk job every analyst read whole
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    _, md = complete(world, job_id, records, {0: [finding(records[0], 1, "clause")]})
    # THEN report.md says when it was reviewed (and submitted), as a date a reader can use
    day = datetime.fromtimestamp(world.clock.now, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    assert f"- reviewed: {day} (submitted " in md
    # AND states its coverage: complete, all chunks by every analyst
    assert (f"Coverage: complete. All 2 chunks of the document were read by each of the {len(ANALYSTS)} analysts "
            f"({sum(a.mandatory for a in ANALYSTS)} mandatory)") in md
    # AND explains the risk score, with the band that opens a ticket (the saga's own threshold)
    assert HIGH_RISK == HIGH_RISK_SCORE
    assert "Risk score: from 0 (benign) to 1" in md and f"{HIGH_RISK_SCORE:.2f} and above is high risk" in md
    # GIVEN another job whose optional analyst refused on one chunk  THEN its coverage is said to be incomplete
    optional = next(a.name for a in ANALYSTS if not a.mandatory)
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    deliver(world, settle_done(world, records[0]))
    coverage = {a.name: "ok" for a in ANALYSTS} | {optional: "refused"}
    assert deliver(world, settle_done(world, records[1], coverage=coverage)) == "completed"
    md = world.artifacts.get_text(report_keys(job_id)[1])
    assert ("Coverage: incomplete. 2 of 2 chunks were analysed by the " in md
            and "with 0 mandatory and 1 optional analyst gap(s)" in md)


def test_a_clause_found_under_two_categories_is_listed_once_with_both_its_section_and_the_reviewing_party():
    # GIVEN a job submitted for a named party, whose one clause two analysts flagged under two categories
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    world.jobs.items[job_id] = world.jobs.items[job_id].model_copy(
        update={"metadata": {"reviewing_party": "Acme Supplies Ltd"}})
    text = world.artifacts.get_text(world.jobs.items[job_id].document_key)
    r = records[0]
    at = text.index("3. Law") + 8
    quote = text[at:at + 40]
    same = [finding(r, at, quote, category="liability_cap").model_copy(update={"score": 0.9, "analyst": "liability"}),
            finding(r, at, quote, category="indemnification").model_copy(update={"score": 0.6,
                                                                                 "analyst": "indemnity"})]
    # WHEN the job completes
    report, md = complete(world, job_id, records, {0: same})
    # THEN report.json keeps both findings and lists one clause with both categories, highest score first
    assert len(report.findings) == 2 and report.schema_version == REPORT_SCHEMA_VERSION
    (clause,) = report.clauses
    assert clause.categories == ["liability_cap", "indemnification"] and clause.score == 0.9
    assert clause.analysts == ["indemnity", "liability"] and clause.confidence is None
    # AND the clause names the heading nearest before it in the document
    assert clause.section == "3. Law" == nearest_section(sections(text), clause.start)
    # AND report.md lists it once, with both titles and its section
    (bullet,) = bullets(md)
    assert bullet.startswith(f"- **{CATEGORY_BY_KEY['liability_cap'].title}, {CATEGORY_BY_KEY['indemnification'].title}** "
                             f"(0.90; {clause.section}, chars ")
    # AND the party is named, the date, the mode and the statement on confidence are there
    assert report.reviewing_party == "Acme Supplies Ltd" and "- reviewing party: Acme Supplies Ltd" in md
    assert "most unfavourable to the reviewing party, Acme Supplies Ltd" in md
    assert report.reviewed_at == world.clock() and report.inference == "on_demand" and "- inference: on demand" in md
    assert "Confidence: The analysts give no confidence per finding" in md


def test_a_report_without_a_named_party_says_so_and_how_to_name_it():
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    report, md = complete(world, job_id, records, {0: [finding(records[0], 0, "clause")]})
    assert report.reviewing_party == "not stated"
    assert "the reviewing party (not stated: name it in the document's metadata, `review submit --metadata " \
        "reviewing_party=NAME`)" in md


def test_sections_are_headings_numbered_or_in_capitals() -> None:
    text = "MASTER AGREEMENT\n\n1. DEFINITIONS\nwords here.\n12.3 Limitation of Liability. The Supplier shall...\n" \
           "plain sentence line\nARTICLE 5 - TERM\nmore words"
    heads = sections(text)
    assert [h for _, h in heads] == ["MASTER AGREEMENT", "1. DEFINITIONS", "12.3 Limitation of Liability",
                                     "ARTICLE 5 - TERM"]
    assert nearest_section(heads, text.index("plain sentence")) == "12.3 Limitation of Liability"
    assert nearest_section(heads, 0) == "MASTER AGREEMENT" and nearest_section([], 5) == ""


def test_a_numbered_paragraph_is_its_sections_name_by_its_number_alone_when_its_text_is_long() -> None:
    text = ("9.2 Either party may terminate this Agreement at any time, without cause, by giving the other party "
            "notice.\nSection 4 The Supplier shall deliver the goods in accordance with the schedule agreed in writing.")
    assert [h for _, h in sections(text)] == ["9.2", "Section 4"]
