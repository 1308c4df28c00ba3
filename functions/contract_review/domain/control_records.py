"""Typed records of the runtime control of the model: what an operator (or the batch collector, or the sweeper's
spend cap) set without a redeploy (`ModelControl`, adapters/model_control.py), and the model's Bedrock quotas the
sweeper publishes for the workers (`PublishedQuotas`, adapters/published_quotas.py). Split from `records.py`."""

from __future__ import annotations

from pydantic import Field

from contract_review.domain.records import _Record


class BatchLaneOff(_Record):
    """Why the batch lane is off for one model: the first non-retryable refusal of `CreateModelInvocationJob` (the
    model or profile not offered in batch, access denied) turns it off, and `inference: batch` jobs then run on
    demand with a `batch.unavailable` event, until an operator turns it on again (`review quota batch --on`)."""

    error_code: str  # the registry's code of the refusal (batch.refused)
    reason: str  # Bedrock's error code and message, never document text
    at: float
    by: str = ""  # who turned it off: "collector", or an operator


class SpendHold(_Record):
    """The stack's spend-cap hold (domain/spend_cap.py): set by the sweeper when the UTC day's recorded model spend
    reached `daily_spend_cap_usd`; it holds that day only."""

    day: int  # the UTC day (epoch seconds // 86400) it holds
    at: float
    recorded_micro_usd: int
    cap_micro_usd: int


class ModelControl(_Record):
    """What an operator (or an automated writer: the batch collector) set for the model at runtime, without a
    redeploy (`review quota`; one item of the runtime control store the workers read, cached about a minute): a pause
    (no model call starts; chunks are held as backpressure, never failed; the batch collector packs nothing), the
    tokens-per-minute quota to pace to (None: the deploy's or Service Quotas'), and the models whose batch lane is off.

    `version` is the store's compare-and-set counter: every write is `ModelControls.update`, conditional on the
    version it read, so two writers never lose each other's fields."""

    paused: bool = False
    tokens_per_minute: float | None = None
    by: str = ""
    at: float = 0.0
    version: int = 0
    batch_off: dict[str, BatchLaneOff] = Field(default_factory=dict)  # model id -> why its batch lane is off
    # the stack's spend-cap hold (set by the sweeper when the day's recorded spend reached the cap), and the UTC day an
    # operator lifted the cap for (`review quota resume --override-cap`: no hold, and admissions uncapped, that day)
    spend_hold: SpendHold | None = None
    cap_override_day: int | None = None
    # the model an operator moved the stack's calls to (`review model use ID`; None: the deploy's): new jobs are
    # taken in on it, and each job in flight moves to it at its next chunk (`job.model_switched`, by the operator)
    model_override: str | None = None

    def spend_held(self, day: int) -> SpendHold | None:
        """The spend-cap hold in force on UTC `day`: set for that day and not lifted by an operator."""
        hold = self.spend_hold
        return hold if hold is not None and hold.day == day and self.cap_override_day != day else None

    def batch_lane_off(self, model_id: str) -> BatchLaneOff | None:
        return self.batch_off.get(model_id)


class PublishedQuotas(_Record):
    """The model's Bedrock quotas as the sweeper last read them from Service Quotas (model/quotas.py), published for
    the workers in an item of the runtime control table of their own (adapters/published_quotas.py), apart from the
    operator's `ModelControl`: the workers pace and hold to them without each reading Service Quotas at cold start.

    Written only when a value changed (compare-and-set on `version`: two sweepers at once write it once); `read_at` is
    when the sweeper read the values it wrote (an unchanged read writes nothing, so it is the values' age, not the last
    sweep's). A quota Service Quotas does not name for the model is None (its `*_quota` says why)."""

    model_id: str
    tokens_per_minute: float | None = None
    tokens_per_minute_quota: str = ""  # the quota's name and where its value came from (applied | AWS default)
    tokens_per_day: float | None = None
    tokens_per_day_quota: str = ""
    read_at: float = 0.0
    by: str = ""  # the process that published it ("sweeper")
    version: int = 0

    def same_values(self, other: PublishedQuotas) -> bool:
        """The same quotas (who read them, when, and the store's version aside): nothing to publish."""
        skip = {"read_at", "by", "version"}
        return self.model_dump(exclude=skip) == other.model_dump(exclude=skip)
