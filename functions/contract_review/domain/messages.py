"""Typed message boundaries. The intake schema v1 is published as JSON Schema in
`docs/intake-message.schema.json` (generated from `IntakeMessage`; a test keeps them equal)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from contract_review.config.constants import SQS_MAX_MESSAGE_BYTES
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.records import ChunkStatus, Inference, Priority

SQS_MAX_BATCH = 10  # SendMessageBatch: at most 10 entries ...

MAX_INLINE_CHARS = 200_000  # SQS max message is 256 KiB; larger documents go through s3_uri
MAX_DOCUMENT_BYTES = 5_000_000
_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(.+)$")


class InlineDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The contract text, UTF-8.", max_length=MAX_INLINE_CHARS)


class S3Document(BaseModel):
    model_config = ConfigDict(extra="forbid")
    s3_uri: str = Field(description="s3://bucket/key of a UTF-8 text object (claim check).", pattern=_S3_URI.pattern)

    @property
    def bucket_key(self) -> tuple[str, str]:
        m = _S3_URI.match(self.s3_uri)
        assert m
        return m.group(1), m.group(2)


MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
# Numbers as DynamoDB holds them (the job record keeps the metadata): at most 38 significant digits, a magnitude
# from 1e-130 to under 1e126, or 0. A larger integer is taken as the float it is.
DYNAMO_MAX_INT = 10**38 - 1
DYNAMO_NUMBER_LIMIT = 1e126  # exclusive
DYNAMO_MIN_MAGNITUDE = 1e-130


def _dynamo_number(v: float) -> float:
    if v != 0 and not DYNAMO_MIN_MAGNITUDE <= abs(v) < DYNAMO_NUMBER_LIMIT:
        raise ValueError(f"a number must be 0 or of a magnitude from {DYNAMO_MIN_MAGNITUDE:g} to under "
                         f"{DYNAMO_NUMBER_LIMIT:g} (what DynamoDB holds)")
    return v


MetaInt = Annotated[int, Field(ge=-DYNAMO_MAX_INT, le=DYNAMO_MAX_INT)]
MetaFloat = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_dynamo_number), WithJsonSchema({
    "type": "number", "anyOf": [{"const": 0}, {"minimum": DYNAMO_MIN_MAGNITUDE, "exclusiveMaximum": DYNAMO_NUMBER_LIMIT},
                                {"exclusiveMinimum": -DYNAMO_NUMBER_LIMIT, "maximum": -DYNAMO_MIN_MAGNITUDE}]})]
MetaValue = (Annotated[str, StringConstraints(max_length=1024)] | StrictBool | MetaInt | MetaFloat
             | Annotated[list[Annotated[str, StringConstraints(max_length=256)]], Field(max_length=16)])


class IntakeMessage(BaseModel):
    """Intake message schema v1."""

    model_config = ConfigDict(extra="forbid", title="ContractReviewIntakeMessageV1")

    schema_version: Literal[1]
    document: InlineDocument | S3Document
    document_id: str | None = Field(default=None, max_length=256, pattern=r"^[A-Za-z0-9._:/\-]+$")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    metadata: dict[MetaKey, MetaValue] = Field(
        default_factory=dict, max_length=32,
        description="Echoed on the job: up to 32 keys (64 chars) with strings (1024 chars), numbers, "
                    "booleans or lists of up to 16 strings (256 chars).")
    budget_usd: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="The most this job may cost, in USD (model tokens and AWS requests at the list prices of "
                    "docs/cost.md). Once its recorded cost reaches it the job is stopped and ends `cancelled` "
                    "with job.budget_exceeded. Left out: no budget.")
    priority: Priority | None = Field(
        default=None,
        description="Which work is served first when both wait: `interactive` chunks before `bulk` ones, bulk "
                    "never starved (docs/runbook.md \"Interactive and bulk work\"). Left out: `interactive` "
                    "(the Job API's batches: `bulk`).")
    inference: Inference | None = Field(
        default=None,
        description="How the job's model calls are made: `on_demand` (left out: the default) or `batch` (Bedrock "
                    "batch inference at the batch price, within hours: docs/batch-inference.md).")
    deadline_hours: float | None = Field(
        default=None, gt=0, le=24 * 365,
        description="With `inference: batch`: the hours from submission within which the job must end (left out: "
                    "the profile's `batch_default_deadline_hours`). Its calls go on demand once a batch could no "
                    "longer answer by then; a deadline nearer than a batch job is expected to take runs the job on "
                    "demand from the start, and says so.")
    principal: str | None = Field(
        default=None, max_length=2048,
        description="Set by the Job API only: who submitted the job (an IAM ARN on AWS). Only that principal "
                    "can read or act on the job through the API. Senders to the queue leave it out.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_version(cls, v: Any) -> Any:
        if isinstance(v, bool):  # JSON `true` == 1 in Python; the schema says integer 1
            raise ValueError("schema_version must be the integer 1")
        return v


def _union_branch(raw: Any) -> str | None:
    """Which `document` form a message meant: "S3Document" when it names `s3_uri`, else "InlineDocument"."""
    document = raw.get("document") if isinstance(raw, dict) else None
    if not isinstance(document, dict):
        return None
    return "S3Document" if "s3_uri" in document else "InlineDocument"


def _detail(errors: list[Any], raw: Any) -> str:
    """The validation errors as one line: of the two `document` forms, only the one the message meant."""
    meant = _union_branch(raw)
    shown = []
    for e in errors:
        loc = tuple(e["loc"])
        if meant and loc[:1] == ("document",) and len(loc) > 1 and loc[1] in ("InlineDocument", "S3Document"):
            if loc[1] != meant:
                continue
            loc = (loc[0], *loc[2:])
        shown.append(f"{'.'.join(map(str, loc)) or '<root>'}: {e['msg']}")
    return "; ".join(shown[:5])


def parse_intake(body: str) -> IntakeMessage:
    """Parse and validate. Inline text over MAX_INLINE_CHARS is `input.too_large` (with the advice to
    use `s3_uri`); every other failure is `input.invalid`. Both permanent; decided from pydantic's
    structured error types and locations, never from message text."""
    try:
        return IntakeMessage.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        too_long = next((e for e in errors if e["type"] == "string_too_long"
                         and tuple(e["loc"]) == ("document", "InlineDocument", "text")), None)
        if too_long is not None:
            chars = len(too_long["input"]) if isinstance(too_long["input"], str) else 0
            raise ReviewError.of(
                "input.too_large",
                f"document.text has {chars:,} characters, more than the {MAX_INLINE_CHARS:,} allowed inline: "
                "upload the text to the stack's bucket under uploads/ and send "
                '{"document": {"s3_uri": "s3://<ArtifactBucketName>/uploads/<name>.txt"}} instead '
                "(`review submit` does this for you)", step="intake.parse") from exc
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
        raise ReviewError.of("input.invalid", _detail(errors, raw), step="intake.parse") from exc


def intake_json_schema() -> dict[str, Any]:
    schema = IntakeMessage.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://contract-review.example/schemas/intake-message-v1.json"
    return schema


class AnalysisMessage(BaseModel):
    """One chunk to analyse. Carries its own attempt accounting across requeues."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    chunk_id: str
    chunk_index: int
    chunk_count: int
    start: int
    end: int
    text: str
    attempt: int = 1  # real failed attempts so far + 1 (throttle requeues do not count)
    max_attempts: int = 5  # poison budget
    # backpressure requeues (throttled, out of time), not failures; the chunk record keeps the
    # current streak (`backpressure_since`, `backpressure_requeues`) that the deadline bounds
    requeues: int = 0
    checkpoint_version: str = ""  # the job's config_hash (its analysis identity; checkpoints are matched per analyst)
    resume_from: list[str] = Field(default_factory=list)  # analysts already checkpointed
    # why this copy was sent: intake | model.throttled | aws.throttled | runtime.time_exhausted |
    # sweeper | reconcile | redrive
    reason: str = "intake"
    # times this copy gave way to interactive work (pipeline/priority.py; at most `bulk_max_deferrals`)
    deferrals: int = 0

    def deferred(self) -> AnalysisMessage:
        """The copy of a bulk chunk sent back to give way to interactive work: nothing counted but the deferral."""
        return self.model_copy(update={"deferrals": self.deferrals + 1, "reason": "priority.deferred"})

    def requeued(self, reason: str, streak: int, resume_from: list[str] | None = None) -> AnalysisMessage:
        """The copy sent again after backpressure: no failure counted, one more requeue (at least the chunk's
        current streak, for a copy rebuilt from the record), resuming after `resume_from` when given."""
        return self.model_copy(update={"requeues": max(self.requeues + 1, streak), "reason": reason,
                                       "resume_from": self.resume_from if resume_from is None else resume_from})

    def after_failure(self) -> AnalysisMessage:
        """The copy sent again after a failed attempt the sender counted (its attempt number moves on)."""
        return self.model_copy(update={"attempt": self.attempt + 1})


class MessageTooLarge(ValueError):
    """A message body over SQS's limit: never sent (chunking and the profile rule make it impossible)."""


def body_bytes(body: str) -> int:
    """The size SQS counts: the body's UTF-8 bytes."""
    return len(body.encode("utf-8"))


def size_batches(bodies: Sequence[str], max_count: int = SQS_MAX_BATCH,
                 max_bytes: int = SQS_MAX_MESSAGE_BYTES) -> list[list[str]]:
    """Consecutive SendMessageBatch batches, in order: at most `max_count` bodies and `max_bytes` bytes
    in all (... and at most 256 KiB together). Raises MessageTooLarge, sending nothing, when one body
    alone is over `max_bytes`."""
    sizes = [body_bytes(b) for b in bodies]
    too_big = next((n for n in sizes if n > max_bytes), None)
    if too_big is not None:
        raise MessageTooLarge(f"a message of {too_big:,} bytes is over SQS's {max_bytes:,}-byte limit")
    batches: list[list[str]] = []
    total = 0
    for body, size in zip(bodies, sizes):
        if not batches or len(batches[-1]) >= max_count or total + size > max_bytes:
            batches.append([])
            total = 0
        batches[-1].append(body)
        total += size
    return batches


class ResultMessage(BaseModel):
    """A chunk settled (done, failed or dead-lettered). Findings live in S3, referenced by the claim."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    chunk_id: str
    chunk_index: int
    status: ChunkStatus

    @field_validator("status")
    @classmethod
    def _settled(cls, v: ChunkStatus) -> ChunkStatus:
        if not v.settled:
            raise ValueError("a result is sent for a settled chunk only (done, failed, dead_lettered)")
        return v
    fence: int = 0
    findings_key: str | None = None
    error: ErrorEnvelope | None = None

    def dedup_id(self, nonce: str = "") -> str:
        """FIFO deduplication id: stable for one settling of one chunk (a nonce makes a deliberate resend)."""
        return f"{self.job_id}:{self.chunk_id}:{self.status}:{self.fence}{nonce}"


class JobControl(BaseModel):
    """A job-level instruction to the aggregator, sent on the results FIFO queue in the job's message
    group so that it is ordered with the job's results: finish a cancel (`lifecycle.finish_cancel`),
    or go on after an approval decision (`resume`, `reject`)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    control: Literal["cancel", "resume", "reject"]
    by: str = ""

    def dedup_id(self, nonce: str) -> str:
        return f"{self.job_id}:control:{self.control}:{nonce}"


def parse_results_body(body: str) -> ResultMessage | JobControl:
    """A results-queue message: a settled chunk's result, or a job control message."""
    data = json.loads(body)
    if isinstance(data, dict) and "control" in data:
        return JobControl.model_validate(data)
    return ResultMessage.model_validate(data)
