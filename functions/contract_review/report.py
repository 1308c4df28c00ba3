"""The report: coverage policy, the chunk x analyst coverage matrix, and its Markdown form.

Coverage policy (docs/runbook.md):
- every mandatory analyst `ok` on every chunk, optional ones `ok` -> `completed`;
- optional analysts refused/failed somewhere -> `completed`, with `coverage.optional_gaps` listed;
- a mandatory analyst refused/failed on some chunk -> `failed` (`job.chunks_missing`), naming the
  chunk and analyst of each gap;
- any chunk dead-lettered (no coverage at all) -> `dead_lettered`, listing the missing chunks and why.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from .analysts import CATEGORY_BY_KEY, Finding, analysts_for
from .records import ChunkRecord, ChunkStatus, CoverageGap, Job, JobState, MissingChunk, Reliability


class Coverage(BaseModel):
    analysts: list[str]
    mandatory: list[str]
    matrix: dict[str, dict[str, str]]  # chunk id -> analyst -> ok | refused | failed | the chunk's status
    mandatory_gaps: list[CoverageGap]
    optional_gaps: list[CoverageGap]
    missing_chunks: list[MissingChunk]

    def verdict(self) -> tuple[JobState, str | None]:
        """The job's end state and error code under the coverage policy."""
        if any(m.status is ChunkStatus.DEAD_LETTERED for m in self.missing_chunks):
            return JobState.DEAD_LETTERED, "runtime.dead_lettered"
        if self.missing_chunks or self.mandatory_gaps:
            return JobState.FAILED, "job.chunks_missing"
        return JobState.COMPLETED, None


class Report(BaseModel):
    job_id: str
    state: JobState
    document_id: str
    document_sha256: str
    model_id: str
    prompt_version: str
    chunk_count: int
    findings: list[Finding]
    coverage: Coverage
    reliability: Reliability


def coverage_of(analyst_count: int, chunks: Sequence[ChunkRecord]) -> Coverage:
    specs = analysts_for(analyst_count or 11)
    matrix: dict[str, dict[str, str]] = {}
    mandatory_gaps: list[CoverageGap] = []
    optional_gaps: list[CoverageGap] = []
    missing: list[MissingChunk] = []
    for c in chunks:
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
                    matrix=matrix, mandatory_gaps=mandatory_gaps, optional_gaps=optional_gaps, missing_chunks=missing)


def markdown(job: Job, report: Report) -> str:
    lines = [f"# Contract review {job.job_id}", "",
             f"- state: **{report.state.value}**", f"- document: {job.document_id or job.document_sha256[:12]}"
             f" ({job.document_chars} chars, {job.chunk_count} chunks)",
             f"- model: {job.model_id} (prompt {job.prompt_version})",
             f"- findings: {len(report.findings)}", ""]
    by_cat: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_cat.setdefault(f.category, []).append(f)
    lines += ["## Summary by category", "", "| category | findings | max risk |", "|---|---|---|"]
    for key, cat in CATEGORY_BY_KEY.items():
        fs = by_cat.get(key, [])
        lines.append(f"| {cat.title} | {len(fs)} | {max((f.score for f in fs), default=0):.2f} |")
    lines += ["", "## Highest-risk clauses", ""]
    for f in sorted(report.findings, key=lambda f: (-f.score, f.start))[:15]:
        quote = f.quote if len(f.quote) <= 300 else f.quote[:297] + "..."
        lines.append(f"- **{CATEGORY_BY_KEY[f.category].title}** ({f.score:.2f}, chars {f.start}-{f.end}): "
                     f"> {quote}  \n  _{f.rationale}_")
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
