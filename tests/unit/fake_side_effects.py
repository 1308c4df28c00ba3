"""In-memory fakes of the side-effect ports (`contract_review.domain.effects`), for unit tests of the saga.

- `MemoryPersistence`: a Powertools idempotency persistence layer in memory, with the DynamoDB
  layer's put condition (absent, expired, or in progress past its in-progress expiry), so the saga
  runs the real `@idempotent_function` code;
- `FakeTickets`: the external ticket system's `Idempotency-Key` contract (one ticket per key, the
  same answer again), with scripted failures: `error_before_write` (nothing written),
  `timeout_after_write` (written, the answer lost), `timeout_before_write` (nothing written, the
  answer lost), `lookup_unavailable`; it counts tickets opened and closed;
- `FakeNotifier`: every publish, in order; scripted failures the same way;
- `FakeCompensationDlq`: the messages with their attributes.

The HTTP fake of the ticket system (`review_local/ticket_service.py`) is tested with the real client
adapter in test_ticket_service.py; these keep the same semantics in memory.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from pydantic import JsonValue

from contract_review.adapters.outcomes import PowertoolsOutcomes
from contract_review.domain.effects import DeadLetter, JsonObject, SideEffectError, SideEffects
from contract_review.domain.errors import ErrorEnvelope


class MemoryPersistence(BasePersistenceLayer):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, DataRecord] = {}
        self.puts = 0

    def _get_record(self, idempotency_key: str) -> DataRecord:
        try:
            return self.records[idempotency_key]
        except KeyError:
            raise IdempotencyItemNotFoundError from None

    def _put_record(self, data_record: DataRecord) -> None:
        self.puts += 1
        old = self.records.get(data_record.idempotency_key)
        now = dt.datetime.now()
        if old is not None:
            expired = old.expiry_timestamp is not None and old.expiry_timestamp < int(now.timestamp())
            lapsed = (old._status == "INPROGRESS" and old.in_progress_expiry_timestamp is not None
                      and old.in_progress_expiry_timestamp < int(now.timestamp() * 1000))
            if not (expired or lapsed):
                raise IdempotencyItemAlreadyExistsError(old_data_record=old)
        self.records[data_record.idempotency_key] = data_record

    def _update_record(self, data_record: DataRecord) -> None:
        self.records[data_record.idempotency_key] = data_record

    def _delete_record(self, data_record: DataRecord) -> None:
        self.records.pop(data_record.idempotency_key, None)

    def completed(self) -> int:
        return sum(1 for r in self.records.values() if r._status == "COMPLETED")

    def lapse_in_progress(self) -> None:
        """The invocations holding in-progress records ran out of time (the fake clock moved past them, which
        Powertools, on the wall clock, cannot see): their records are free, as Powertools frees them."""
        for r in self.records.values():
            if r._status == "INPROGRESS":
                r.in_progress_expiry_timestamp = 0


def _unknown(step: str) -> SideEffectError:
    return SideEffectError(ErrorEnvelope.of("sideeffect.ambiguous", "read timeout (scripted)",
                                            provider_code="ReadTimeoutError", step=step), written="unknown")


def _unavailable(step: str) -> SideEffectError:
    return SideEffectError(ErrorEnvelope.of("sideeffect.failed", "HTTP 503 (scripted)", http_status=503,
                                            provider_code="service_unavailable", step=step), written="no")


@dataclass
class Scripted:
    """The next `times` calls of `op` fail with `kind` (-1: until cleared)."""

    kind: str
    op: str
    times: int = 1


@dataclass
class _Faults:
    scripted: list[Scripted] = field(default_factory=list)

    def inject(self, kind: str, op: str, times: int = 1) -> None:
        self.scripted.append(Scripted(kind, op, times))

    def clear(self) -> None:
        self.scripted.clear()

    def take(self, op: str) -> str | None:
        for s in self.scripted:
            if s.op == op and s.times != 0:
                s.times -= 1
                return s.kind
        return None


class FakeTickets(_Faults):
    def __init__(self) -> None:
        super().__init__()
        self.tickets: dict[str, dict[str, JsonValue]] = {}
        self.keys: dict[str, str] = {}  # idempotency key -> ticket id
        self.calls: list[str] = []
        self._ids = itertools.count(1)

    def open(self, key: str, fields: Mapping[str, JsonValue]) -> JsonObject:
        self.calls.append("open")
        fault = self.take("open")
        if fault == "error_before_write":
            raise _unavailable("ticket.open")
        if fault == "unauthorized":  # 401/403 again after the secret was read once more (adapters/tickets.py)
            raise SideEffectError(ErrorEnvelope.of("sideeffect.unauthorized", "HTTP 401 (scripted)", http_status=401,
                                                   step="ticket.open"), written="no")
        if fault == "timeout_before_write":
            raise _unknown("ticket.open")
        if key not in self.keys:
            tid = f"TCK-{next(self._ids):05d}"
            self.tickets[tid] = {"id": tid, "status": "open", "fields": dict(fields), "idempotency_key": key,
                                 "close_comment": None}
            self.keys[key] = tid
        if fault == "timeout_after_write":
            raise _unknown("ticket.open")
        return dict(self.tickets[self.keys[key]])

    def find(self, key: str) -> JsonObject | None:
        self.calls.append("find")
        if self.take("find") == "lookup_unavailable":
            raise _unavailable("ticket.lookup")
        tid = self.keys.get(key)
        return dict(self.tickets[tid]) if tid else None

    def close(self, ticket_id: str, comment: str, key: str) -> JsonObject:
        self.calls.append("close")
        fault = self.take("close")
        if fault == "error_before_write":
            raise _unavailable("ticket.close")
        t = self.tickets[ticket_id]
        if t["status"] != "closed":
            t.update(status="closed", close_comment=comment)
        if fault == "timeout_after_write":
            raise _unknown("ticket.close")
        return dict(t)

    @property
    def opened(self) -> int:
        return len(self.tickets)

    @property
    def closed(self) -> int:
        return sum(1 for t in self.tickets.values() if t["status"] == "closed")


class FakeNotifier(_Faults):
    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[str, str, dict[str, JsonValue]]] = []  # (key, detail type, detail)
        self.calls = 0

    def publish(self, key: str, detail_type: str, detail: Mapping[str, JsonValue]) -> JsonObject:
        self.calls += 1
        fault = self.take(detail_type)
        if fault == "error_before_write":
            raise _unavailable("report.publish")
        self.published.append((key, detail_type, dict(detail)))
        if fault == "timeout_after_write":
            raise _unknown("report.publish")
        n = len(self.published)
        return {"sns_message_id": f"sns-{n}", "event_id": f"evt-{n}"}

    def of(self, detail_type: str) -> list[dict[str, JsonValue]]:
        return [d for _, t, d in self.published if t == detail_type]


class FakeCompensationDlq:
    def __init__(self) -> None:
        self.messages: dict[str, DeadLetter] = {}
        self.hidden: set[str] = set()  # taken, not deleted nor released: in flight
        self._ids = itertools.count(1)

    def send(self, body: str, envelope: ErrorEnvelope, **attributes: str) -> None:
        mid = f"m-{next(self._ids)}"
        attrs = {"error_code": envelope.error_code, "error_class": envelope.error_class.value,
                 "envelope": envelope.model_dump_json(), **attributes}
        self.messages[mid] = DeadLetter(message_id=mid, receipt_handle=mid, body=body, attributes=attrs)

    def take_all(self, visibility_s: int = 30) -> list[DeadLetter]:
        """The visible messages; with `visibility_s` > 0 they are hidden until released or deleted (a fake clock:
        they never come back by themselves)."""
        taken = [m for mid, m in self.messages.items() if mid not in self.hidden]
        if visibility_s > 0:
            self.hidden.update(m.message_id for m in taken)
        return taken

    def delete(self, receipt_handle: str) -> None:
        self.messages.pop(receipt_handle, None)
        self.hidden.discard(receipt_handle)

    def release(self, receipt_handle: str) -> None:
        self.hidden.discard(receipt_handle)

    def in_flight(self) -> int:
        return len(self.hidden & set(self.messages))


@dataclass
class FakeSideEffects:
    """The fakes, and the `SideEffects` over them (`fx`), for GIVEN and THEN."""

    with_tickets: bool = True
    persistence: MemoryPersistence = field(default_factory=MemoryPersistence)
    tickets: FakeTickets = field(default_factory=FakeTickets)
    notifier: FakeNotifier = field(default_factory=FakeNotifier)
    dlq: FakeCompensationDlq = field(default_factory=FakeCompensationDlq)
    sleeps: list[float] = field(default_factory=list)

    @property
    def fx(self) -> SideEffects:
        return SideEffects(outcomes=PowertoolsOutcomes(self.persistence, expires_after_s=3600),
                           tickets=self.tickets if self.with_tickets else None, notifier=self.notifier,
                           dlq=self.dlq, sleep=self.sleeps.append, remaining_ms=lambda: 60_000)
