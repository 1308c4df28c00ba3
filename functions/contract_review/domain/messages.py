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
    """Which `document` form a message meant: "S3Document" when it names `s3_uri`, else the inline form."""
    document = raw.get("document") if isinstance(raw, dict) else None
    if not isinstance(document, dict):
        return None
    return "S3Document" if "s3_uri" in document else "inline"


_EXPECTED = {"string_type": "a string", "bool_type": "true or false", "int_type": "a whole number",
             "float_type": "a number", "list_type": "a list", "dict_type": "an object", "model_type": "an object",
             "model_attributes_type": "an object", "none_required": "null",
             # not the member's type either (what lax JSON parsing says of the same values)
             "int_parsing": "a whole number", "int_parsing_size": "a whole number", "int_from_float": "a whole number",
             "float_parsing": "a number", "bool_parsing": "true or false"}
MAX_SENTENCES = 5


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _user_path(loc: Sequence[Any], raw: Any, kind: str) -> tuple[tuple[str | int, ...], bool]:
    """The error's place in the caller's JSON (keys and list indexes) and whether it went through a union member
    (pydantic names the member it tried, e.g. `constrained-str`: no key of the caller's)."""
    path: list[str | int] = []
    here, tagged = raw, False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(here, dict) and isinstance(part, str) and (part in here or (last and kind == "missing")):
            path.append(part)
            here = here.get(part)
        elif isinstance(here, list) and isinstance(part, int):
            path.append(part)
            here = here[part] if 0 <= part < len(here) else None
        else:
            tagged = True
    return tuple(path), tagged


def _place(path: tuple[str | int, ...], whole: str) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or whole


def _sentence(e: Any, place: str) -> str:
    """One mistake, in the caller's terms (the JSON field, what it must be, what it was)."""
    kind, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    if kind == "missing":
        return f"{place} is required"
    if kind == "extra_forbidden":
        return f"{place} is not a field here: leave it out (a misspelling?)"
    if kind in _EXPECTED:
        return f"{place} must be {_EXPECTED[kind]}, not {_json_kind(value)}"
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind == "string_too_long" else "entries"
        return f"{place} is too long: at most {ctx.get('max_length')} {unit}, it has {len(value) if hasattr(value, '__len__') else '?'}"
    if kind in ("string_too_short", "too_short"):
        return f"{place} must not be empty" if ctx.get("min_length") == 1 else \
            f"{place} is too short: at least {ctx.get('min_length')}"
    if kind == "string_pattern_mismatch":
        return f"{place} {value!r} is not of the allowed form ({ctx.get('pattern')})"
    bounds = {"greater_than": "greater than", "greater_than_equal": "at least", "less_than": "less than",
              "less_than_equal": "at most"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "?")
        return f"{place} must be {bounds[kind]} {limit:g}, not {value!r}" if isinstance(limit, int | float) else \
            f"{place} must be {bounds[kind]} {limit}"
    if kind in ("literal_error", "enum"):
        return f"{place} must be {ctx.get('expected')}, not {json.dumps(value) if _plain(value) else _json_kind(value)}"
    if kind == "finite_number":
        return f"{place} must be a finite number"
    if kind == "value_error" and "error" in ctx:
        return f"{place}: {ctx['error']}"
    if kind == "json_invalid":
        return f"{place} is not JSON ({ctx.get('error', 'invalid')})"
    return f"{place}: {e['msg']}"


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def plain_errors(errors: Sequence[Any], raw: Any, whole: str = "the body") -> str:
    """Pydantic's validation errors as sentences, one per mistake, in the terms of the caller's JSON: the intake
    message (the queue), the Job API's bodies and a batch's items say the same thing for the same mistake. Of the
    two `document` forms, only the one the caller meant; of a union (a metadata value: a string, true or false, a
    number or a list of strings), the member the value's type matched, or else what it may be."""
    meant = _union_branch(raw)
    groups: dict[tuple[str | int, ...], list[tuple[Any, bool]]] = {}
    for e in errors:
        loc = tuple(e["loc"])
        if meant and loc[:1] == ("document",) and len(loc) > 1 and isinstance(loc[1], str) \
                and loc[1].endswith("Document"):
            if (loc[1] == "S3Document") != (meant == "S3Document"):
                continue
        path, tagged = _user_path(loc, raw, e["type"])
        groups.setdefault(path, []).append((e, tagged))
    sentences: list[str] = []
    for path, found in groups.items():
        place = _place(path, whole)
        union = [e for e, tagged in found if tagged]
        if len(union) > 1:
            if all(e["type"] in _EXPECTED for e in union):
                if any(len(other) > len(path) and other[:len(path)] == path for other in groups):
                    continue  # a member matched the value's type and failed deeper: that mistake is said there
                names = list(dict.fromkeys(_EXPECTED[e["type"]] for e in union))
                kinds = ", ".join(names[:-1]) + f" or {names[-1]}"
                sentences.append(f"{place} must be {kinds}, not {_json_kind(union[0].get('input'))}")
            else:
                sentences += [_sentence(e, place) for e in union if e["type"] not in _EXPECTED]
            sentences += [_sentence(e, place) for e, tagged in found if not tagged]
            continue
        sentences += [_sentence(e, place) for e, _ in found]
    sentences = [x[0].upper() + x[1:] if x.startswith("the ") else x for x in dict.fromkeys(sentences)]
    more = len(sentences) - MAX_SENTENCES
    return ". ".join(sentences[:MAX_SENTENCES]) + "." + (f" ({more} more not shown.)" if more > 0 else "")


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
        raise ReviewError.of("input.invalid", plain_errors(errors, raw, "the message"), step="intake.parse") from exc


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
