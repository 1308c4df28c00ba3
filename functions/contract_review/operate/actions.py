"""What an operator (or a Job API caller) does to a job, and what the local tools read of a job's review, as use
cases the operator surface reaches: `review retry|approve|reject`, the status page's buttons and grid, `review demo`'s
summary. The local tools (`review_local/`) reach the pipeline only through `operate` (the import contract in
pyproject.toml): each function here is the one they call.
"""

from __future__ import annotations

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


def report_of(deps: Deps, job: Job) -> Report | None:
    """The job's report, as written when it completed (None while it has none)."""
    return Report.model_validate_json(deps.artifacts.get_text(job.report_json_key)) if job.report_json_key else None


def category_title(key: str) -> str:
    """A finding category's title, as the report names it."""
    return CATEGORY_BY_KEY[key].title


def category_keys() -> list[str]:
    """Every finding category, in the report's order."""
    return list(CATEGORY_BY_KEY)
