"""What the Job API takes: a submission's body (`POST /jobs`, and one item of `POST /batches`), parsed and checked
as the intake message defines its fields. A body it refuses is `submission.Refused` (`input.invalid`: a 400 of the
API, or that item's error in a batch): one refusal type for everything a submission is refused for."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import IntakeMessage, MetaKey, MetaValue, S3Document, plain_errors
from contract_review.domain.records import Inference, Priority
from contract_review.operate.submission import Refused, SubmitRequest
from contract_review.pipeline.admission import TextDocument

_CUSTOM_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,64}$")


def invalid(message: str) -> Refused:
    return Refused(ErrorEnvelope.of("input.invalid", message, step="api"))


def _as_in_the_intake_message(name: str) -> Any:
    """The intake message's own definition of its field `name` (constraints, default, description)."""
    return IntakeMessage.model_fields[name]


class JobRequest(BaseModel):
    """`POST /jobs` (and one batch item, with its `custom_id`): the intake message's fields, each as the message
    defines it, but `principal` (always the caller: a body that names it is refused, `PRINCIPAL_REFUSED`).
    `idempotency_key` in the body is the Idempotency-Key header's equivalent (both given: they must agree). Inline
    text may be larger than a message takes inline (up to MAX_DOCUMENT_BYTES: admission sends it on by claim check). JSON types only (`strict`): "1" is no number."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: Literal[1] = 1  # optional: 1 (a queue message pasted as it is)
    document: TextDocument | S3Document
    document_id: str | None = _as_in_the_intake_message("document_id")
    idempotency_key: str | None = _as_in_the_intake_message("idempotency_key")
    metadata: dict[MetaKey, MetaValue] = _as_in_the_intake_message("metadata")
    budget_usd: float | None = _as_in_the_intake_message("budget_usd")
    # left out: interactive; a batch's items: bulk. Not strict: JSON names the enum by its string
    priority: Priority | None = Field(default=None, strict=False,
                                      description=_as_in_the_intake_message("priority").description)
    inference: Inference | None = Field(default=None, strict=False,
                                        description=_as_in_the_intake_message("inference").description)
    deadline_hours: float | None = _as_in_the_intake_message("deadline_hours")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_version(cls, v: Any) -> Any:
        return IntakeMessage._integer_version(v)  # the message's own check: JSON `true` is not the integer 1

    def submit_request(self, key: str | None, batch_id: str | None = None) -> SubmitRequest:
        """The one submit's request: under `key` (the header's or the body's), its priority given or the default of
        its way in (a single job: interactive; a batch's item: bulk)."""
        default = Priority.BULK if batch_id is not None else Priority.INTERACTIVE
        return SubmitRequest(document=self.document, idempotency_key=key, document_id=self.document_id,
                             metadata=self.model_dump(mode="json")["metadata"], budget_usd=self.budget_usd,
                             priority=self.priority or default, inference=self.inference,
                             deadline_hours=self.deadline_hours, batch_id=batch_id)


PRINCIPAL_REFUSED = ("principal: the API sets it to the caller (the principal that signed the request), never "
                     "the body: leave it out")


class BatchItem(JobRequest):
    custom_id: str = Field(pattern=_CUSTOM_ID.pattern)


def validation_message(exc: ValidationError, raw: object) -> str:
    """One sentence per mistake, in the body's terms: the intake message's wording (`plain_errors`), so the API, a
    batch's items and the queue say the same thing for the same mistake."""
    return plain_errors(exc.errors(), raw)


def parse_request(model: type[JobRequest], raw: object) -> JobRequest:
    if isinstance(raw, dict) and "principal" in raw:
        raise invalid(PRINCIPAL_REFUSED)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid(validation_message(exc, raw)) from exc



def check_unicode(value: object) -> None:
    """JSON may escape a lone surrogate (\\ud800), which no UTF-8 text (nor DynamoDB) can hold: refused."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid("the body holds a string that is not valid Unicode (a lone surrogate escape)") from exc
