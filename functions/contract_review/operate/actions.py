"""What an operator (or a Job API caller) does to a job, and what the local tools read of a job's review, as use
cases the operator surface reaches: `review retry|approve|reject`, the status page's buttons and grid, `review demo`'s
summary. The local tools (`review_local/`) reach the pipeline only through `operate` (the import contract in
pyproject.toml): each function here is the one they call.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.ports import Deps
from contract_review.domain.records import Job
from contract_review.pipeline import redrive
from contract_review.pipeline.aggregator import read_findings
from contract_review.review.analysts import CATEGORY_BY_KEY, Finding, analysts_for
from contract_review.review.report import Report
from contract_review.sideeffects import approvals
from contract_review.sideeffects.approvals import ApprovalOutcome


def retry(deps: Deps, job_id: str, budget_usd: float | None = None) -> redrive.Retried:
    """`review retry JOB` (`POST /jobs/{id}/retry`): the job back to work from its records (`redrive.retry`)."""
    return redrive.retry(deps, job_id, budget_usd=budget_usd)


def can_retry(job: Job) -> bool:
    """Whether `retry` would put the job back to work (`redrive.retryable`)."""
    return redrive.retryable(job)


def decide(deps: Deps, job_id: str, decision: str, by: str) -> ApprovalOutcome:
    """`review approve|reject JOB` (`POST /jobs/{id}/approval`): a person's decision on a step of unknown outcome."""
    return approvals.decide_approval(deps, job_id, decision, by=by)


def analyst_names(analyst_count: int) -> list[str]:
    """The analysts a job of `analyst_count` runs, in their order (the status page's grid columns)."""
    return [a.name for a in analysts_for(analyst_count)]


def chunk_findings(deps: Deps, chunks: list[ChunkRecord]) -> list[Finding]:
    """The done chunks' findings, in chunk order (`aggregator.read_findings`)."""
    return read_findings(deps, chunks)


GRID_FOLD = 200  # a job of more chunks than this: the status page shows its grid folded, counts per analyst


class GridRow(BaseModel):
    """One chunk of the grid: its status and each analyst's cell."""

    index: int
    status: str
    cells: list[str | None]
    findings: int
    error: str | None = None


class Grid(BaseModel):
    """The status page's chunk x analyst grid (`grid`); folded: `rows` empty, the counts instead (serialized with the
    page's names: `byStatus`)."""

    model_config = ConfigDict(populate_by_name=True)

    analysts: list[str]
    rows: list[GridRow]
    folded: bool
    chunks: int | None = None
    summary: dict[str, dict[str, int]] | None = None
    by_status: dict[str, int] | None = Field(default=None, alias="byStatus")


class RankedFinding(Finding):
    """A finding as the status page lists it: with its category's title."""

    title: str


def grid(job: Job, chunks: list[ChunkRecord], fold_above: int = GRID_FOLD) -> Grid:
    """The status page's chunk x analyst grid: an analyst's cell is its outcome once the chunk settled (ok, refused,
    failed), `done` once its checkpoint is committed, else the chunk's status (pending, claimed, cancelled, ...).
    Above `fold_above` chunks it is folded: no rows, `summary` counts each analyst's cells per state instead (and
    `byStatus` the chunks per status), so a job of a thousand chunks is a few lines, not a thousand rows."""
    analysts = analyst_names(job.analyst_count) if job.analyst_count else []
    by_index = {c.chunk_index: c for c in chunks}
    rows: list[GridRow] = []
    for i in range(job.chunk_count):
        c = by_index.get(i)
        status = c.status.value if c is not None else "unsent"
        cells = [c.coverage.get(a) if c is not None and a in c.coverage else
                 "done" if c is not None and a in c.checkpoints else status for a in analysts]
        rows.append(GridRow(index=i, status=status, cells=cells, findings=c.n_findings if c is not None else 0,
                            error=c.last_error.error_code if c is not None and c.last_error else None))
    if len(rows) <= fold_above:
        return Grid(analysts=analysts, rows=rows, folded=False)
    summary = {a: dict(Counter(str(r.cells[n]) for r in rows)) for n, a in enumerate(analysts)}
    return Grid(analysts=analysts, rows=[], folded=True, chunks=len(rows), summary=summary,
                by_status=dict(Counter(r.status for r in rows)))


def by_risk(found: list[Finding]) -> list[RankedFinding]:
    """Findings as the status page lists them: highest risk first (then in document order), each with its category's
    title (`title`) beside its key."""
    ranked = sorted(found, key=lambda f: (-f.score, f.start, f.chunk_index, f.analyst))
    return [RankedFinding(**f.model_dump(), title=category_title(f.category)) for f in ranked]


def report_text(deps: Deps, job: Job, fmt: str) -> str | None:
    """The job's report as written (`md` or `json`), None while it has none (`job_view.no_report` says why)."""
    key = job.report_md_key if fmt == "md" else job.report_json_key
    return deps.artifacts.get_text(key) if key else None


def report_of(deps: Deps, job: Job) -> Report | None:
    """The job's report, as written when it completed (None while it has none)."""
    return Report.model_validate_json(deps.artifacts.get_text(job.report_json_key)) if job.report_json_key else None


def category_title(key: str) -> str:
    """A finding category's title, as the report names it (the key itself for a category no analyst has now)."""
    return CATEGORY_BY_KEY[key].title if key in CATEGORY_BY_KEY else key


def category_keys() -> list[str]:
    """Every finding category, in the report's order."""
    return list(CATEGORY_BY_KEY)
