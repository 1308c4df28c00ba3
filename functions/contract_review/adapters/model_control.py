"""`ModelControls` (domain/ports.py) on a DynamoDB table of its own: the runtime control of the model (`review quota
pause|resume|set`, `review quota batch --on`; the batch collector's off switch per model), one item.

The item (`control` = CONTROL_KEY) holds `ModelControl`'s fields as attributes, and `version`, the compare-and-set
counter. A write (`update`) reads the item (strongly consistent), applies the writer's change, and sets only the
fields the change touched, plus `version + 1`, in one UpdateItem conditional on the version it read (on the item
not existing, for the first write). A writer that lost the race (ConditionalCheckFailed) reads again and applies its
change again, at most CONTROL_WRITE_ATTEMPTS times: two writers never lose each other's fields, and a field this
version of the code does not know (a later one's) is never overwritten.

Reads (`get`, before each model call) are cached for `max_age_s` (the profile's `model_control_max_age_s`). Not
Powertools' DynamoDBProvider: it reads one value attribute per item, which would make the control one blob written
whole, not fields written by name. A control that cannot be read keeps the last one read (none yet: no control, the
model runs as deployed): a broken control must not stop the pipeline; the failure is logged with its code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import ReviewError, classify

from .dynamo import Table, Values, serialize

log = logging.getLogger(__name__)

KEY_ATTRIBUTE = "control"  # the table's partition key
CONTROL_KEY = "model"  # the one item: the model's runtime control
CONTROL_WRITE_ATTEMPTS = 5  # a write that loses its compare-and-set this many times in a row: control.contended


def contended(attempts: int) -> ReviewError:
    return ReviewError.of("control.contended", f"the runtime control changed under each of {attempts} writes: "
                          "nothing written; run the command again")


class DynamoModelControl:
    def __init__(self, client: Any, table: str, max_age_s: float, clock: Callable[[], float] = time.monotonic):
        self.table = Table(client, table)
        self.max_age_s, self.clock = max_age_s, clock
        self._lock = threading.Lock()  # the analysts of one chunk read it at once: one read refreshes it for all
        self._cached: tuple[float, ModelControl] | None = None

    def get(self) -> ModelControl:
        """The control as last read (at most `max_age_s` old)."""
        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.max_age_s:
                return self._cached[1]
            try:
                control = self._read()[0]
            except (ClientError, BotoCoreError) as exc:
                control = self._cached[1] if self._cached is not None else ModelControl()
                log.warning("model control not read: the last one read holds", extra={
                    "error_code": classify(exc, step="model_control.get").error_code, "paused": control.paused})
            self._cached = (now, control)
            return control

    def update(self, change: Callable[[ModelControl], ModelControl]) -> ModelControl:
        for _ in range(CONTROL_WRITE_ATTEMPTS):
            current, exists = self._read()
            wanted = change(current)
            written = self._write(current, wanted, exists)
            if written is not None:
                with self._lock:
                    self._cached = (self.clock(), written)
                return written
        raise contended(CONTROL_WRITE_ATTEMPTS)

    def _read(self) -> tuple[ModelControl, bool]:
        item = self.table.get({KEY_ATTRIBUTE: CONTROL_KEY})
        if item is None:
            return ModelControl(), False
        item.pop(KEY_ATTRIBUTE, None)
        return ModelControl.model_validate(item), True

    def _write(self, current: ModelControl, wanted: ModelControl, exists: bool) -> ModelControl | None:
        """The fields `wanted` changed from `current`, and the next version, if the item is still at `current`'s
        version; None when another writer got there first."""
        before, after = current.model_dump(mode="json"), wanted.model_dump(mode="json")
        changed = {k: v for k, v in after.items() if k != "version" and v != before.get(k)}
        if not changed:
            return current  # nothing to write: what was read consistently is what the writer wants
        names = {f"#f{i}": k for i, k in enumerate(changed)} | {"#v": "version"}
        values: Values = {f":f{i}": v for i, v in enumerate(changed.values()) if v is not None}
        sets = [f"#f{i} = :f{i}" for i, v in enumerate(changed.values()) if v is not None] + ["#v = :next"]
        removes = [f"#f{i}" for i, v in enumerate(changed.values()) if v is None]
        values[":next"] = current.version + 1
        if exists:
            condition, values[":seen"] = "#v = :seen", current.version
        else:
            condition, names["#k"] = "attribute_not_exists(#k)", KEY_ATTRIBUTE
        item = self.table.update_if(
            {KEY_ATTRIBUTE: CONTROL_KEY},
            UpdateExpression="SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else ""),
            ConditionExpression=condition, ExpressionAttributeNames=names,
            ExpressionAttributeValues=serialize(values))
        if item is None:
            return None
        item.pop(KEY_ATTRIBUTE, None)
        return ModelControl.model_validate(item)

