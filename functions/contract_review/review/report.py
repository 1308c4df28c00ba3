"""The report: coverage policy, the chunk x analyst coverage matrix, and its Markdown form.

Coverage policy (docs/runbook.md):
- every mandatory analyst `ok` on every chunk, optional ones `ok` -> `completed`;
- optional analysts refused/failed somewhere -> `completed`, with `coverage.optional_gaps` listed;
- a mandatory analyst refused/failed on some chunk -> `failed` (`job.chunks_missing`), naming the
  chunk and analyst of each gap;
- any chunk dead-lettered (no coverage at all) -> `dead_lettered`, listing the missing chunks and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, Field, JsonValue

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.config.prices import PriceTable
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.cost import describe, model_price, usd
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
    note: str = ("model tokens as the model reported them x its list price; orchestration: the AWS requests the "
                 "workers' chunk attempts and the aggregator counted (DynamoDB, SQS, S3) and the worker Lambda's "
                 "invocations and GB-seconds, at list prices; estimated: calls that timed out on the client, at their "
                 "request's input and maxTokens; not counted: intake, the sweeper, the report and side effects, what "
                 "an attempt that crashed spent after its last heartbeat or checkpoint. See docs/cost.md.")


def cost_report(table: PriceTable, job: Job, usage: Usage) -> CostReport:
    priced = model_price(table, job.model_id)
    return CostReport(total_usd=str(usd(usage.total_micro_usd)), model_usd=str(usd(usage.model_micro_usd)),
                      orchestration_usd=str(usd(usage.aws_micro_usd)), input_tokens=usage.input_tokens,
                      output_tokens=usage.output_tokens, cache_read_tokens=usage.cache_read_tokens,
                      cache_write_tokens=usage.cache_write_tokens, aws_requests=usage.aws_requests,
                      timed_out_calls=usage.timed_out_calls, estimated_usd=str(usd(usage.estimated_micro_usd)),
                      budget_usd=str(usd(job.budget_micro_usd)) if job.budget_micro_usd is not None else None,
                      model_id=job.model_id, priced_as=priced.priced_as, prices_as_of=table.as_of,
                      estimate=is_offline(job))


ESTIMATE_NOTE = ("an estimate: the offline rule model (not an LLM) made these calls; this is what they would cost at "
                 "Bedrock's list prices, with token counts the simulated Bedrock estimates. Nothing was charged")


def cost_line(job: Job) -> str:
    """The job's cost in one line, said to be an estimate when nothing real was called (the offline model)."""
    line = describe(job.usage(), job.budget_micro_usd)
    return f"{line} -- {ESTIMATE_NOTE}" if is_offline(job) else line


class Report(BaseModel):
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


RISK_LEGEND = (f"Risk score: from 0 (benign) to 1 (most unfavourable to the reviewing party), one per finding, given "
               f"by the model's assessment of the clause quoted; {HIGH_RISK:.2f} and above is high risk (a completed "
               f"review with such a finding opens a review ticket where a ticket system is configured), below "
               f"{HIGH_RISK:.2f} worth reading. \"max risk\" is a category's highest score (0.00: no finding).")


def markdown(job: Job, report: Report, written_at: float | None = None) -> str:
    """`written_at`: when the report is written (the aggregator's clock); the job's end when not given."""
    n = len(report.findings)
    when = written_at or job.ended_at
    dates = (f"- reviewed: {_when(when)} (submitted {_when(job.created_at)})" if when
             else f"- submitted: {_when(job.created_at)}")
    lines = [f"# Contract review {job.job_id}", "",
             f"- state: **{report.state.value}**", dates, f"- document: {job.document_id or job.document_sha256[:12]}"
             f" ({job.document_chars} chars, {job.chunk_count} chunks)",
             *_model_lines(job, report.coverage), *_metadata_lines(report.metadata), f"- findings: {n}", "",
             coverage_statement(report), "", RISK_LEGEND, ""]
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
    if n > TOP_FINDINGS:
        lines += [f"Showing the {TOP_FINDINGS} highest-risk of {n} findings (all {n} are in report.json).", ""]
    elif n:
        lines += [f"All {n} findings, highest risk first.", ""]
    else:
        lines += ["No findings.", ""]
    for f in sorted(report.findings, key=lambda f: (-f.score, f.start))[:TOP_FINDINGS]:
        lines.append(f"- **{CATEGORY_BY_KEY[f.category].title}** ({f.score:.2f}, chars {f.start}-{f.end}): "
                     f"> {_quote(f.quote)}  \n  _{f.rationale}_")
    if report.cost is not None:
        c = report.cost
        lines += ["", "## Estimated cost" if c.estimate else "## Cost", "",
                  cost_line(job), "",
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
