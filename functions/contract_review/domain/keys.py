"""Every S3 key the pipeline writes or reads, in one place (the layout is a stored format: never change
a key's shape without a migration). `infra/` grants and lifecycles the same prefixes."""

from __future__ import annotations

DOCUMENTS_PREFIX = "documents/"  # the document's text as intake stored it, and its fan-out plan
CHECKPOINTS_PREFIX = "checkpoints/"  # analyst outputs too large for their checkpoint item
FINDINGS_PREFIX = "findings/"  # each settled chunk's findings
REPORTS_PREFIX = "reports/"  # report.json and report.md
SUBMISSIONS_PREFIX = "submissions/"  # the Job API: job id -> principal, until intake records the job
BATCHES_PREFIX = "batches/"  # the Job API: batch manifests
# Bedrock batch inference (docs/batch-inference.md): everything under batch/ of the artifacts bucket. The worker
# writes batch/pending/ (a batch-mode chunk's records) and reads batch/answers/; the sweeper (the collector) reads
# and writes all of batch/ (batch/jobs/: the jobs it submitted); the adapter writes batch/input/ and Bedrock (its
# service role) reads batch/input/ and writes batch/output/ (infra/batch.py grants exactly these).
BATCH_PREFIX = "batch"
BATCH_PENDING_PREFIX = f"{BATCH_PREFIX}/pending/"
BATCH_ANSWERS_PREFIX = f"{BATCH_PREFIX}/answers/"
BATCH_JOBS_PREFIX = f"{BATCH_PREFIX}/jobs/"
# One empty object per batch job of ours not yet ended (pipeline/batch_inference.py): what the collector follows, whether or
# not a chunk still waits in it (a batch job none of whose records are wanted is stopped and followed to its end)
BATCH_OPEN_PREFIX = f"{BATCH_JOBS_PREFIX}open/"
BATCH_INPUT_PREFIX = f"{BATCH_PREFIX}/input/"  # adapters/batch_inference.py: <prefix>/input/<token>/records.jsonl
BATCH_OUTPUT_PREFIX = f"{BATCH_PREFIX}/output/"  # where Bedrock writes: <prefix>/output/<token>/<job id>/


def document_key(job_id: str) -> str:
    return f"{DOCUMENTS_PREFIX}{job_id}.txt"


def plan_key(job_id: str) -> str:
    """Where a job's fan-out plan lives, next to its document."""
    return f"{DOCUMENTS_PREFIX}{job_id}.plan.json"


UPLOADS_PREFIX = "uploads/"  # the only place intake reads claim-checked documents from (its role's grant)


def upload_key(job_id: str) -> str:
    return f"{UPLOADS_PREFIX}{job_id}.txt"


def findings_key(job_id: str, chunk_index: int, chunk_id: str, fence: int) -> str:
    return f"{FINDINGS_PREFIX}{job_id}/{chunk_index:05d}-{chunk_id}/{fence}.json"


def checkpoint_key(job_id: str, chunk_id: str, analyst: str, fence: int) -> str:
    return f"{CHECKPOINTS_PREFIX}{job_id}/{chunk_id}/{analyst}/{fence}.json"


def report_keys(job_id: str) -> tuple[str, str]:
    """(report.json, report.md)"""
    return f"{REPORTS_PREFIX}{job_id}/report.json", f"{REPORTS_PREFIX}{job_id}/report.md"


def submission_key(job_id: str) -> str:
    return f"{SUBMISSIONS_PREFIX}{job_id}.json"


def batch_key(batch_id: str) -> str:
    return f"{BATCHES_PREFIX}{batch_id}.json"


def batch_pending_key(job_id: str, chunk_id: str, fence: int) -> str:
    """A parked chunk's requests waiting to be packed into a batch job (pipeline/batch_inference.py)."""
    return f"{BATCH_PENDING_PREFIX}{job_id}/{chunk_id}/{fence}.jsonl"


def batch_manifest_key(token: str) -> str:
    """One batch job of ours: its chunks, Bedrock's job, its last status (not the Job API's `batches/`)."""
    return f"{BATCH_JOBS_PREFIX}{token}.json"


def batch_open_key(token: str) -> str:
    return f"{BATCH_OPEN_PREFIX}{token}"


def batch_answers_key(job_id: str, chunk_id: str, token: str) -> str:
    """A chunk's answers from one batch job, replayed by its worker."""
    return f"{BATCH_ANSWERS_PREFIX}{job_id}/{chunk_id}/{token}.json"


# Every prefix the pipeline writes under: the stack grants and lifecycles exactly these (infra/storage.py).
PREFIXES = (UPLOADS_PREFIX, DOCUMENTS_PREFIX, CHECKPOINTS_PREFIX, FINDINGS_PREFIX, REPORTS_PREFIX,
            SUBMISSIONS_PREFIX, BATCHES_PREFIX, f"{BATCH_PREFIX}/")
