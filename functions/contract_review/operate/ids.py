"""Ids as an operator types them: whole, or by a unique prefix (`review status 3fa2`), for jobs, DLQ messages
and submission batches. A prefix that names more than one is `AmbiguousId`, listing them."""

from __future__ import annotations

import re

from contract_review.domain.keys import BATCHES_PREFIX
from contract_review.domain.ports import Deps
from contract_review.domain.records import job_id_for
from contract_review.operate.dead_letters import QUEUE_OF_DLQ

JOB_ID_CHARS = len(job_id_for(""))  # "job-" + 20 hex
BATCH_ID_CHARS = len("batch-") + 20  # operate/api_batches.py: "batch-" + 20 hex


_JOB_ID = re.compile(r"^job-[0-9a-f]{20}$")


def is_job_id(given: str) -> bool:
    """Whether `given` has a job id's form ("job-" + 20 hex digits): what a job could one day be recorded under."""
    return bool(_JOB_ID.fullmatch(given))


class AmbiguousId(Exception):
    """A prefix that names more than one job or message: the message lists them."""


def _unique(prefix: str, ids: list[str], what: str) -> str | None:
    found = sorted({i for i in ids if i.startswith(prefix)})
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise AmbiguousId(f"{prefix!r} is the start of {len(found)} {what} ids ({shown}): give more of it")
    return found[0] if found else None


def resolve_job_id(deps: Deps, given: str) -> str:
    """A job id given whole, or by a unique prefix ("job-3fa2", or "3fa2" without `job-`): the whole id. A whole
    id is returned as it is even without a record (intake may not have taken it in yet); a prefix that names no
    job is returned as given, so the caller says "no job ..."."""
    if len(given) >= JOB_ID_CHARS or deps.jobs.get(given) is not None:
        return given
    prefix = given if given.startswith("job-") else "job-" + given
    return _unique(prefix, [j.job_id for j in deps.jobs.all()], "job") or given


def resolve_message_id(deps: Deps, given: str) -> str:
    """A DLQ message id given whole or by a unique prefix: the whole id (as given when none matches)."""
    ids = [m.message_id for dlq in QUEUE_OF_DLQ if deps.queues.has(dlq) for m in deps.queues.peek(dlq)]
    if given in ids:
        return given
    return _unique(given, ids, "DLQ message") or given


def resolve_batch_id(deps: Deps, given: str) -> str:
    """A batch id given whole or by a unique prefix ("batch-9c1e", or "9c1e" without `batch-`): the whole id (as
    given when none matches). The ids are the batch manifests' names in the artifact bucket (one S3 listing of the
    `batches/` prefix); whose batch it is, `api_batches.batch_manifest` decides after."""
    prefix = given if given.startswith("batch-") else "batch-" + given
    if len(prefix) >= BATCH_ID_CHARS:
        return given
    ids = [k[len(BATCHES_PREFIX):-len(".json")] for k in deps.artifacts.list_keys(BATCHES_PREFIX + prefix)
           if k.endswith(".json")]
    return _unique(prefix, ids, "batch") or given

