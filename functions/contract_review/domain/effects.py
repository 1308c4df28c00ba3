"""Ports of the job's side effects (the saga, `sideeffects/saga.py`): the ticket system, the
notifier, the outcome store (Powertools idempotency) and the compensation DLQ.

Implementations: `adapters/tickets.py` (the external ticket system over HTTP, `Idempotency-Key`),
`adapters/notify.py` (SNS + EventBridge; the compensation DLQ on SQS), `adapters/outcomes.py`
(`@idempotent_function` over any Powertools persistence layer: DynamoDB on AWS and locally, an
in-memory one in the unit tests), and the in-memory fakes of `tests/unit/fake_side_effects.py`.
The job keeps its steps as `records.SideEffectDone` (`Job.side_effects`), and the evidence of an
unknown outcome as `records.Approval` (`Job.approval`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import JsonValue

from contract_review.domain.errors import ErrorEnvelope

JsonObject = dict[str, JsonValue]


class SideEffectError(Exception):
    """A side-effect call that did not knowingly succeed.

    `written`: "no" when the external system certainly did nothing (a 5xx before the write, a refused
    connection): a retry with the same key is safe; "unknown" when the request may have been acted
    on (a read timeout after it was sent, a connection dropped before the answer): look the key up.
    `retryable`: False for an answer that no retry will change (4xx: the request or the key is wrong)."""

    def __init__(self, envelope: ErrorEnvelope, *, written: Literal["no", "unknown"], retryable: bool = True):
        super().__init__(f"{envelope.error_code}: {envelope.message}")
        self.envelope = envelope
        self.written = written
        self.retryable = retryable


class TicketSystem(Protocol):
    """The external ticket system (a third party). Every write carries our idempotency key."""

    def open(self, key: str, fields: Mapping[str, JsonValue]) -> JsonObject:
        """Create the ticket once per key; the ticket (its `id`). Raises `SideEffectError`."""

    def find(self, key: str) -> JsonObject | None:
        """The ticket created with `key`, or None when the system has none. Raises `SideEffectError`."""

    def close(self, ticket_id: str, comment: str, key: str) -> JsonObject:
        """Close the ticket with a comment (idempotent). Raises `SideEffectError`."""


class Notifier(Protocol):
    """Where integrators hear about reports: an SNS topic and EventBridge."""

    def publish(self, key: str, detail_type: str, detail: Mapping[str, JsonValue]) -> JsonObject:
        """Publish one event (the key travels with it, so subscribers can drop a repeat); the receipt
        (message and event ids). Raises `SideEffectError`."""


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    receipt_handle: str
    body: str
    attributes: dict[str, str]


class CompensationDlq(Protocol):
    """The compensation dead-letter queue: compensations that exhausted their retries."""

    def send(self, body: str, envelope: ErrorEnvelope, **attributes: str) -> None: ...

    def take_all(self, visibility_s: int = 30) -> list[DeadLetter]: ...

    def delete(self, receipt_handle: str) -> None: ...

    def release(self, receipt_handle: str) -> None:
        """Make a taken message visible again at once (a redrive that failed: the next one sees it)."""

    def in_flight(self) -> int:
        """Messages taken and not yet deleted or back (another redrive's, or one that stopped half-way)."""


class OutcomeStore(Protocol):
    """Runs an action at most once per key while its outcome is kept: a second call with the same key
    returns the stored result without acting. A failed action keeps nothing (the next call acts)."""

    def once(self, key: str, act: Callable[[], JsonObject], remaining_ms: Callable[[], int]) -> JsonObject: ...


@dataclass(frozen=True)
class SideEffects:
    """Everything the saga acts through. `tickets` None: no ticket system configured (the step is
    skipped, with an event saying so); `notifier` None: nothing to publish to (skipped the same way)."""

    outcomes: OutcomeStore
    tickets: TicketSystem | None
    notifier: Notifier | None
    dlq: CompensationDlq | None
    sleep: Callable[[float], None] = time.sleep
    # The invocation's remaining time in ms (a Lambda context's); None: the profile's function timeout
    # from the start of the saga.
    remaining_ms: Callable[[], int] | None = None
