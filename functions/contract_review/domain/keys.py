"""Every S3 key the pipeline writes or reads, in one place (the layout is a stored format: never change
a key's shape without a migration). `infra/` grants and lifecycles the same prefixes."""

from __future__ import annotations


# ------------------------------------------------------------------------------ artifact keys
def document_key(job_id: str) -> str:
    return f"documents/{job_id}.txt"


UPLOADS_PREFIX = "uploads/"  # the only place intake reads claim-checked documents from (its role's grant)


def upload_key(job_id: str) -> str:
    return f"{UPLOADS_PREFIX}{job_id}.txt"


def findings_key(job_id: str, chunk_index: int, chunk_id: str, fence: int) -> str:
    return f"findings/{job_id}/{chunk_index:05d}-{chunk_id}/{fence}.json"


def checkpoint_key(job_id: str, chunk_id: str, analyst: str, fence: int) -> str:
    return f"checkpoints/{job_id}/{chunk_id}/{analyst}/{fence}.json"


def report_keys(job_id: str) -> tuple[str, str]:
    """(report.json, report.md)"""
    return f"reports/{job_id}/report.json", f"reports/{job_id}/report.md"
