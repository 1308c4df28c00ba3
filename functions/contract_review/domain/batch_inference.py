"""Bedrock batch inference, as the core sees it (docs/batch-inference.md).

A batch job is a JSONL file of records in S3, `{"recordId", "modelInput"}` each, answered hours later by
`{"recordId", "modelInput", "modelOutput"}` or `{"recordId", "modelInput", "error"}` lines in another file,
in no guaranteed order: outcomes are joined on `recordId`. The port is `domain/ports.py` `BatchInference`;
the boto3 adapter is `adapters/batch_inference.py`; the local stand-in for the service is
`review_local/batch_service.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class BatchJobStatus(StrEnum):
    """Bedrock's ModelInvocationJobStatus (botocore `bedrock` 2023-04-20)."""

    SUBMITTED = "Submitted"
    VALIDATING = "Validating"
    SCHEDULED = "Scheduled"
    IN_PROGRESS = "InProgress"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    PARTIALLY_COMPLETED = "PartiallyCompleted"
    FAILED = "Failed"
    STOPPED = "Stopped"
    EXPIRED = "Expired"


# Where a job ends. Completed / PartiallyCompleted have an output to read (PartiallyCompleted: some records
# answered an error); Stopped and Expired have the output of the records processed before the stop or the timeout
# (Bedrock writes and bills those; the others have no line); Failed ends without one to rely on.
TERMINAL = frozenset({BatchJobStatus.COMPLETED, BatchJobStatus.PARTIALLY_COMPLETED, BatchJobStatus.FAILED,
                      BatchJobStatus.STOPPED, BatchJobStatus.EXPIRED})
HAS_OUTPUT = frozenset({BatchJobStatus.COMPLETED, BatchJobStatus.PARTIALLY_COMPLETED, BatchJobStatus.STOPPED,
                        BatchJobStatus.EXPIRED})
ENDED_EARLY = frozenset({BatchJobStatus.STOPPED, BatchJobStatus.EXPIRED})  # an output of part of its records

# CreateModelInvocationJob's `modelInvocationType`: the record format of `modelInput` / `modelOutput`.
CONVERSE, INVOKE_MODEL = "Converse", "InvokeModel"

# A recordId as our records name them (the docs show 11 alphanumerics; Bedrock accepts a string): letters,
# digits, "-", "_" and ":", so a record can be named after its chunk, analyst and step.
RECORD_ID = re.compile(r"^[A-Za-z0-9_:.-]{1,128}$")


@dataclass(frozen=True)
class BatchRecord:
    """One model call of a batch job: `model_input` is the request body in the job's invocation type's format
    (Converse: the Converse request without `modelId`; InvokeModel: the model's InvokeModel body)."""

    record_id: str
    model_input: dict[str, Any]

    def __post_init__(self) -> None:
        if not RECORD_ID.match(self.record_id):
            raise ValueError(f"recordId {self.record_id!r} does not match {RECORD_ID.pattern}")


@dataclass(frozen=True)
class BatchJobState:
    """GetModelInvocationJob, as much as the core needs."""

    job_id: str  # the job's ARN (GetModelInvocationJob's jobIdentifier)
    status: BatchJobStatus
    message: str = ""  # Bedrock's reason for a Failed job (never document text)
    total: int | None = None  # totalRecordCount ... errorRecordCount, when Bedrock reports them
    processed: int | None = None
    succeeded: int | None = None
    errored: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class RecordOutcome:
    """One record's answer: `output` (the modelOutput body) or an error (`error_code`: Bedrock's errorCode for a
    record it answered with an error; "missing" for a submitted record with no line in the output)."""

    record_id: str
    output: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.output is not None


# A model request or response body in the model's own format (Converse): opaque to the core, stored and replayed
ModelBody = dict[str, Any]


class ManifestChunk(BaseModel):
    job_id: str
    chunk_id: str
    fence: int
    records: int
    # the recordIds of its records in the batch job's input (a sealed manifest's; kept here so that the collector
    # joins the output back without reading the input file again). Empty in a manifest from before the seal.
    record_ids: list[str] = Field(default_factory=list)


class BatchManifest(BaseModel):
    """What one batch job of ours holds (`batch/jobs/<token>.json`, pipeline/batch_inference.py), written ahead of every step:
    first the chunks a collector means to pack (`chunks`, not `sealed`: it is tagging them), then `sealed` with
    exactly the chunks it tagged and their recordIds (the input written), then the Bedrock job, its last status seen,
    and its end. Only a sealed manifest is submitted or finished by a later collect; an unsealed one older than the
    collector's timeout is abandoned (its chunks untagged, packed again)."""

    token: str
    created_at: float
    chunks: list[ManifestChunk]
    model_id: str | None = None  # the model its batch job is created with (answers priced with it); None: older
    sealed: bool = False
    sealed_at: float | None = None
    job_arn: str | None = None
    status: str | None = None  # Bedrock's status; or ours before and after it: Abandoned, Released, Refused
    records: int | None = None
    submitted_at: float | None = None
    checked_at: float | None = None
    ended_at: float | None = None
    # a submit refused by a retryable error (throttling, 5xx): how many so far, and not before when again
    submit_failures: int = 0
    retry_at: float | None = None
    error_code: str | None = None  # the registry's code of what ended it without an answer (batch.refused)
    reason: str = ""  # Bedrock's error code and message (never document text)
    stop_requested_at: float | None = None  # StopModelInvocationJob: none of its records were still wanted

    @property
    def is_sealed(self) -> bool:
        """Sealed, or submitted before seals existed (such a manifest named exactly the chunks tagged)."""
        return self.sealed or self.job_arn is not None


class BatchStatus(BaseModel):
    """A batch job holding some of a job's calls, as `review status`, the API and the page show it."""

    batch: str | None  # our token; None: records still waiting to reach the minimum
    batch_job_arn: str | None
    status: str  # Bedrock's status, `packing`, or `waiting_for_records`
    records: int  # this job's records in it
    batch_records: int | None  # all its records
    submitted_at: float | None
    expected_by: float | None


MISSING = "missing"  # RecordOutcome.error_code of a submitted record the output does not mention

# CreateModelInvocationJob errors (botocore error codes) that refuse the job for good: the model or inference profile
# is not offered in batch, the role may not, a resource it names does not exist. Anything else (throttling, 5xx) is
# retried with backoff. Classified by domain/errors.py `classify_batch_submit`, never by message text.
REFUSALS = frozenset({"ValidationException", "AccessDeniedException", "ResourceNotFoundException"})
# ... and those that pass by themselves though their status is a 4xx: too many batch jobs (or records) in flight for
# the account's quotas, which frees as its jobs end: backed off like a throttle (`aws.throttled`), the lane stays on.
BACKOFFS = frozenset({"ServiceQuotaExceededException"})
