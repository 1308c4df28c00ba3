"""The report: coverage policy, the chunk x analyst coverage matrix, and its Markdown form.

Coverage policy (docs/runbook.md):
- every mandatory analyst `ok` on every chunk, optional ones `ok` -> `completed`;
- optional analysts refused/failed somewhere -> `completed`, with `coverage.optional_gaps` listed;
- a mandatory analyst refused/failed on some chunk -> `failed` (`job.chunks_missing`), naming the
  chunk and analyst of each gap;
- any chunk dead-lettered (no coverage at all) -> `dead_lettered`, listing the missing chunks and why.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, Field, JsonValue

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.config.prices import PriceTable
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.cost import ESTIMATE_ANSWER_TOKENS, describe, model_price, usd
from contract_review.domain.records import ChunkStatus, CoverageGap, Job, JobState, MissingChunk, Reliability, Usage
from contract_review.review.analysts import ANALYSTS, CATEGORY_BY_KEY, Finding, analysts_for


class Coverage(BaseModel):
    analysts: list[str]
    mandatory: list[str]
    matrix: dict[str, dict[str, str]]  # chunk id -> analyst -> ok | refused | failed | the chunk's status
    mandatory_gaps: list[CoverageGap]
    optional_gaps: list[CoverageGap]
    missing_chunks: list[MissingChunk]
    # analyst -> model -> the chunks whose answer came from it (a job that fell back ran on more than one model)
    models: dict[str, dict[str, int]] = Field(default_factory=dict)

    def verdict(self) -> tuple[JobState, str | None]:
        """The job's end state and error code under the coverage policy."""
        if any(m.status is ChunkStatus.DEAD_LETTERED for m in self.missing_chunks):
            return JobState.DEAD_LETTERED, "runtime.dead_lettered"
        if self.missing_chunks or self.mandatory_gaps:
            return JobState.FAILED, "job.chunks_missing"
        return JobState.COMPLETED, None


class CostReport(BaseModel):
    """What the job cost (cost.py, docs/cost.md): amounts in USD as decimal strings, never floats."""

    total_usd: str
    model_usd: str
    orchestration_usd: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    aws_requests: int
    # calls that timed out on the client, which Bedrock may still bill, and their estimated cost (in total_usd, not in
    # model_usd: no usage came back to measure; docs/cost.md "Estimated spend")
    timed_out_calls: int = 0
    estimated_usd: str = "0"
    budget_usd: str | None = None
    model_id: str
    priced_as: str  # the price-table entry the model's tokens were priced at ("": none, the tokens are unpriced)
    prices_as_of: str
    # True for a job of the offline rule model (local runs): what its calls would cost at Bedrock's list prices,
    # with token counts the simulated Bedrock estimates; nothing was charged.
    estimate: bool = False
    # For such a job: what the same document is expected to cost at LLM-like answer lengths (the admission estimate,
    # cost.estimate_document: ESTIMATE_ANSWER_TOKENS a call), beside the estimate above, which prices the rule model's
    # own answers (much shorter than an LLM's). None: a real model's job (its cost is measured).
    llm_like_usd: str | None = None
    note: str = ("model tokens as the model reported them x its list price; orchestration: the AWS requests the "
                 "workers' chunk attempts and the aggregator counted (DynamoDB, SQS, S3) and the worker Lambda's "
                 "invocations and GB-seconds, at list prices; estimated: calls that timed out on the client, at their "
                 "request's input and maxTokens; not counted: intake, the sweeper, the report and side effects, what "
                 "an attempt that crashed spent after its last heartbeat or checkpoint. See docs/cost.md.")


def cost_report(table: PriceTable, job: Job, usage: Usage, llm_like_micro_usd: int | None = None) -> CostReport:
    """`llm_like_micro_usd`: the document's admission estimate (at LLM-like answers), shown for the offline model's
    jobs only (a real model's cost is measured)."""
    priced = model_price(table, job.model_id)
    return CostReport(total_usd=str(usd(usage.total_micro_usd)), model_usd=str(usd(usage.model_micro_usd)),
                      orchestration_usd=str(usd(usage.aws_micro_usd)), input_tokens=usage.input_tokens,
                      output_tokens=usage.output_tokens, cache_read_tokens=usage.cache_read_tokens,
                      cache_write_tokens=usage.cache_write_tokens, aws_requests=usage.aws_requests,
                      timed_out_calls=usage.timed_out_calls, estimated_usd=str(usd(usage.estimated_micro_usd)),
                      budget_usd=str(usd(job.budget_micro_usd)) if job.budget_micro_usd is not None else None,
                      model_id=job.model_id, priced_as=priced.priced_as, prices_as_of=table.as_of,
                      estimate=is_offline(job),
                      llm_like_usd=str(usd(llm_like_micro_usd)) if is_offline(job) and llm_like_micro_usd is not None
                      else None)


ESTIMATE_NOTE = ("an estimate: the offline rule model (not an LLM) made these calls; this is what they would cost at "
                 "Bedrock's list prices, with token counts the simulated Bedrock estimates and the rule model's own "
                 "answers, much shorter than an LLM's (the report gives the estimate at LLM-like answer lengths "
                 "beside it). Nothing was charged")


def cost_line(job: Job) -> str:
    """The job's cost in one line, said to be an estimate when nothing real was called (the offline model)."""
    line = describe(job.usage(), job.budget_micro_usd)
    return f"{line} -- {ESTIMATE_NOTE}" if is_offline(job) else line


REPORT_SCHEMA_VERSION = 2  # 2: `clauses` (one per span, all its categories), `reviewed_at`, `inference`,
# `reviewing_party`, `confidence`, each analyst's models (`coverage.models`); `findings` as in 1
PARTY_KEYS = ("reviewing_party", "reviewingParty", "party")  # the metadata keys the reviewing party is read from
NOT_STATED = "not stated"
CONFIDENCE_NOTE = ("The analysts give no confidence per finding: a risk score is the model's own assessment of the "
                   "clause quoted, and a model's self-rated confidence is known to be poorly calibrated, so read the "
                   "scores as an order of attention, not as probabilities. Every quote is verbatim from the document: "
                   "check it there.")


class Clause(BaseModel):
    """One span of the document, with every category a finding put it in (highest score first): a clause that answers
    two questions is one entry, not two (report.json `clauses`; report.md's highest-risk list)."""

    start: int
    end: int
    quote: str
    categories: list[str]
    score: float  # the highest of its findings'
    rationale: str  # the highest-scored finding's
    analysts: list[str]
    chunk_index: int
    section: str = ""  # the nearest heading or clause number before it in the document ("": none found)
    confidence: float | None = None  # the analyst's own, where one gives it (none does today: CONFIDENCE_NOTE)


# A line that heads a part of the document: numbered ("ARTICLE 5", "Section 12.3 ...", "12.3 Limitation of
# Liability", "12. TERM") or in capitals ("GOVERNING LAW"). A numbered paragraph counts: its number is its section.
_LINE = re.compile(r"^[ \t]*(\S[^\n]*?)[ \t]*$", re.MULTILINE)
_NUMBERED = re.compile(r"(?:article|section|clause|schedule|annex|exhibit)\s+[\dIVXLC]+\b|\d{1,3}(?:\.\d{1,3})*\.?\s+\S",
                       re.IGNORECASE)
_NUMBER = re.compile(r"(?:article|section|clause|schedule|annex|exhibit)\s+[\dIVXLC]+|\d{1,3}(?:\.\d{1,3})*\.?",
                     re.IGNORECASE)
SECTION_MAX = 60  # a heading longer than this (a numbered paragraph's own text) is shown by its number alone


def sections(text: str) -> list[tuple[int, str]]:
    """The document's heading lines (offset, heading), in order: a heading cut at its first sentence; a numbered
    paragraph whose first sentence is longer than SECTION_MAX by its number alone ("9.2", "Section 4"), so the
    section beside a clause is a place to look it up, not the start of its text again."""
    out = []
    for m in _LINE.finditer(text):
        line = " ".join(m.group(1).split())
        numbered = _NUMBERED.match(line)
        if numbered or (line.isupper() and 4 <= len(line) <= 100):
            head = re.split(r"(?<=[a-z\)])\.\s", line, maxsplit=1)[0]
            if len(head) > SECTION_MAX:
                number = _NUMBER.match(line) if numbered else None
                head = number.group(0).rstrip(".") if number else head[:SECTION_MAX - 3] + "..."
            out.append((m.start(1), head))
    return out


def nearest_section(heads: list[tuple[int, str]], offset: int) -> str:
    i = bisect.bisect_right(heads, (offset, "\uffff")) - 1
    return heads[i][1] if i >= 0 else ""


def clauses_of(findings: Sequence[Finding], text: str) -> list[Clause]:
    """The findings as clauses: one per span (start, end), its categories and analysts, its highest score; each with
    the section it is in (`text`: the document; "" when it is not at hand)."""
    heads = sections(text) if text else []
    by_span: dict[tuple[int, int], list[Finding]] = {}
    for f in findings:
        by_span.setdefault((f.start, f.end), []).append(f)
    out = []
    for (start, end), fs in sorted(by_span.items()):
        fs = sorted(fs, key=lambda f: -f.score)
        out.append(Clause(start=start, end=end, quote=fs[0].quote, categories=list(dict.fromkeys(f.category for f in fs)),
                          score=fs[0].score, rationale=fs[0].rationale, analysts=sorted({f.analyst for f in fs}),
                          chunk_index=fs[0].chunk_index, section=nearest_section(heads, start)))
    return out


def reviewing_party(metadata: dict[str, JsonValue]) -> str:
    """The party the review is for, as the submitter named it in the metadata (PARTY_KEYS); else "not stated"."""
    named = next((metadata[k] for k in PARTY_KEYS if isinstance(metadata.get(k), str) and str(metadata[k]).strip()),
                 None)
    return " ".join(str(named).split()) if named is not None else NOT_STATED


class Report(BaseModel):
    schema_version: int = 1  # REPORT_SCHEMA_VERSION for a report written now (1: before clauses and the fields below)
    job_id: str
    state: JobState
    document_id: str
    document_sha256: str
    model_id: str
    model_provider: str = ""  # bedrock | offline (the rule model, not an LLM)
    prompt_version: str
    chunk_count: int
    metadata: dict[str, JsonValue] = Field(default_factory=dict)  # as sent with the document
    findings: list[Finding]
    coverage: Coverage
    reliability: Reliability
    cost: CostReport | None = None  # None: a report written before cost was recorded
    reviewed_at: float | None = None  # when the report was written
    inference: str = "on_demand"  # on_demand | batch: how its model calls were made (a batch-mode job's: batch)
    reviewing_party: str = NOT_STATED
    confidence: str = CONFIDENCE_NOTE
    clauses: list[Clause] = Field(default_factory=list)


def coverage_of(analyst_count: int, chunks: Sequence[ChunkRecord]) -> Coverage:
    specs = analysts_for(analyst_count or len(ANALYSTS))
    matrix: dict[str, dict[str, str]] = {}
    mandatory_gaps: list[CoverageGap] = []
    optional_gaps: list[CoverageGap] = []
    missing: list[MissingChunk] = []
    models: dict[str, dict[str, int]] = {}
    for c in chunks:
        for analyst, model_id in c.models.items():
            by_model = models.setdefault(analyst, {})
            by_model[model_id] = by_model.get(model_id, 0) + 1
        row: dict[str, str] = {}
        for spec in specs:
            st = c.coverage.get(spec.name, "missing") if c.status is ChunkStatus.DONE else c.status.value
            row[spec.name] = st
            if st != "ok":
                gap = CoverageGap(chunk_id=c.chunk_id, chunk_index=c.chunk_index, analyst=spec.name, status=st)
                (mandatory_gaps if spec.mandatory else optional_gaps).append(gap)
        matrix[c.chunk_id] = row
        if c.status is not ChunkStatus.DONE:
            missing.append(MissingChunk(chunk_id=c.chunk_id, chunk_index=c.chunk_index, status=c.status,
                                        error=c.last_error, failures=c.failures))
    return Coverage(analysts=[s.name for s in specs], mandatory=[s.name for s in specs if s.mandatory],
                    matrix=matrix, mandatory_gaps=mandatory_gaps, optional_gaps=optional_gaps, missing_chunks=missing,
                    models=models)


TOP_FINDINGS = 15  # report.md lists this many highest-risk findings; report.json has all of them
QUOTE_MAX = 300  # report.md shortens longer quotes (report.json has them whole)


def is_offline(job: Job) -> bool:
    """Whether the findings come from the offline rule model (keyword/regex rules), not an LLM."""
    return job.model_provider in ("offline", "simulated") or job.model_id == OFFLINE_MODEL_ID


def _metadata_lines(metadata: dict[str, JsonValue]) -> list[str]:
    if not metadata:
        return []
    lines = ["- metadata:"]
    for k, v in metadata.items():
        shown = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        lines.append(f"  - {k}: {' '.join(shown.split())}")
    return lines


def _model_lines(job: Job, coverage: Coverage) -> list[str]:
    """The model line; and, when the job's answers came from more than one model (it fell back), each analyst's."""
    line = f"- model: {job.model_id} (prompt {job.prompt_version})"
    if is_offline(job):
        line += (" — **the offline rule model** (deterministic keyword/regex rules, not an LLM): the findings "
                 "show the pipeline at work; they are not a model's legal review")
    if len({m for by_model in coverage.models.values() for m in by_model}) < 2:
        return [line]
    return [line + f"; it ran on {', '.join([*job.earlier_models, job.model_id])} (it fell back), each analyst on:",
            *(f"  - {analyst}: " + ", ".join(f"{m} ({n} chunk{'s' if n != 1 else ''})" for m, n in by_model.items())
              for analyst, by_model in coverage.models.items())]


def _quote(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) <= QUOTE_MAX:
        return one_line
    return one_line[:QUOTE_MAX - 3] + "... _[quote shortened; whole in report.json]_"


HIGH_RISK = 0.7  # the band "high risk" starts at (the saga's HIGH_RISK_SCORE: such a finding opens a ticket)


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def coverage_statement(report: Report) -> str:
    """One sentence: how much of the document the analysts read, and what they missed."""
    cov = report.coverage
    read = report.chunk_count - len(cov.missing_chunks)
    analysts = f"{len(cov.analysts)} analysts ({len(cov.mandatory)} mandatory)"
    if not (cov.missing_chunks or cov.mandatory_gaps or cov.optional_gaps):
        return (f"Coverage: complete. All {report.chunk_count} chunks of the document were read by each of the "
                f"{analysts}: a category without findings means no such clause was found, not that it was skipped.")
    gaps = [f"{len(cov.missing_chunks)} chunk(s) not analysed at all"] if cov.missing_chunks else []
    gaps += [f"{len(cov.mandatory_gaps)} mandatory and {len(cov.optional_gaps)} optional analyst gap(s)"]
    return (f"Coverage: incomplete. {read} of {report.chunk_count} chunks were analysed by the {analysts}, with "
            f"{'; '.join(gaps)} (listed under \"Coverage gaps\"): a category without findings may have been missed "
            "there.")


def risk_legend(party: str) -> str:
    whose = f"the reviewing party, {party}" if party != NOT_STATED else "the reviewing party (not stated: name it in " \
        "the document's metadata, `review submit --metadata reviewing_party=NAME`)"
    return (f"Risk score: from 0 (benign) to 1 (most unfavourable to {whose}), one per finding, given by the model's "
            f"assessment of the clause quoted; {HIGH_RISK:.2f} and above is high risk (a completed review with such a "
            f"finding opens a review ticket where a ticket system is configured), below {HIGH_RISK:.2f} worth "
            "reading. \"max risk\" is a category's highest score (0.00: no finding).")


RISK_LEGEND = risk_legend(NOT_STATED)


def markdown(job: Job, report: Report, written_at: float | None = None) -> str:
    """`written_at`: when the report is written (the aggregator's clock); the job's end when not given."""
    n = len(report.findings)
    when = written_at or job.ended_at
    dates = (f"- reviewed: {_when(when)} (submitted {_when(job.created_at)})" if when
             else f"- submitted: {_when(job.created_at)}")
    mode = "batch (Bedrock batch inference, where its calls stayed in the batch lane)" \
        if report.inference == "batch" else "on demand"
    lines = [f"# Contract review {job.job_id}", "",
             f"- state: **{report.state.value}**", dates, f"- document: {job.document_id or job.document_sha256[:12]}"
             f" ({job.document_chars} chars, {job.chunk_count} chunks)", f"- reviewing party: {report.reviewing_party}",
             *_model_lines(job, report.coverage), f"- inference: {mode}", *_metadata_lines(report.metadata),
             f"- findings: {n}" + (f" in {len(report.clauses)} clauses" if report.clauses else ""), "",
             coverage_statement(report), "", risk_legend(report.reviewing_party), "",
             f"Confidence: {report.confidence}", ""]
    by_cat: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_cat.setdefault(f.category, []).append(f)
    lines += ["## Summary by category", "",
              "Each category asks one question; `findings` counts the clauses that answer it (0: no clause "
              "found that does, not a verdict on the contract).", "",
              "| category | question | findings | max risk |", "|---|---|---|---|"]
    for key, cat in CATEGORY_BY_KEY.items():
        fs = by_cat.get(key, [])
        lines.append(f"| {cat.title} | {cat.question} | {len(fs)} | {max((f.score for f in fs), default=0):.2f} |")
    lines += ["", "## Highest-risk clauses", ""]
    clauses = report.clauses or clauses_of(report.findings, "")
    k = len(clauses)
    if k > TOP_FINDINGS:
        lines += [f"Showing the {TOP_FINDINGS} highest-risk of {k} clauses (a clause in several categories is listed "
                  "once; all are in report.json).", ""]
    elif k:
        lines += [f"All {k} clauses, highest risk first (a clause in several categories is listed once).", ""]
    else:
        lines += ["No findings.", ""]
    for clause in sorted(clauses, key=lambda c: (-c.score, c.start))[:TOP_FINDINGS]:
        where = f"chars {clause.start}-{clause.end}"
        where = f"{clause.section}, {where}" if clause.section else where
        titles = ", ".join(CATEGORY_BY_KEY[cat].title for cat in clause.categories)
        lines.append(f"- **{titles}** ({clause.score:.2f}; {where}): > {_quote(clause.quote)}  \n  _{clause.rationale}_")
    if report.cost is not None:
        c = report.cost
        lines += ["", "## Estimated cost" if c.estimate else "## Cost", "",
                  cost_line(job), "",
                  *([f"At LLM-like answer lengths ({ESTIMATE_ANSWER_TOKENS} output tokens a call, where the rule "
                     f"model answered {c.output_tokens // max(report.reliability.model_calls, 1)} on average) the same "
                     f"document's model tokens are estimated at ${c.llm_like_usd} (the admission estimate a budget is "
                     "checked against; docs/cost.md).", ""] if c.llm_like_usd is not None else []),
                  f"Model tokens priced as {c.priced_as or 'nothing (no price for ' + c.model_id + ')'}; list prices "
                  f"of {c.prices_as_of} (docs/cost.md). Orchestration counts the workers' and the aggregator's AWS "
                  "requests and the worker Lambda's time; intake, the sweeper and the report are not counted."]
    cov = report.coverage
    if cov.missing_chunks or cov.mandatory_gaps or cov.optional_gaps:
        lines += ["", "## Coverage gaps", ""]
        for m in cov.missing_chunks:
            code = m.error.error_code if m.error else "unknown"
            lines.append(f"- chunk {m.chunk_index} ({m.chunk_id}): {m.status.value} — {code}")
        for g in cov.mandatory_gaps + cov.optional_gaps:
            if g.status in ("refused", "failed"):
                lines.append(f"- chunk {g.chunk_index} analyst {g.analyst}: {g.status}")
    return "\n".join(lines) + "\n"
