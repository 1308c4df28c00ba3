"""`QuotaStore` (domain/ports.py): the model's Bedrock quotas as the sweeper publishes them, in an item of the runtime
control table of their own (`control` = "quotas#<model id>"), beside the operator's control item (adapters/
model_control.py) and never in it: the operator's fields and the sweeper's are written by different writers on
different schedules, and a quota the sweeper reads is not an operator's decision.

Why: every worker used to read Service Quotas at its cold start (paginating all of Bedrock's quotas); twenty cold
starts at once could be throttled, and a worker whose read failed ran unpaced, without a daily-token hold. Now the
sweeper reads them (pipeline/sweeper.py `publish_quotas`, once a sweep) and writes this item only when a value
changed: a consistent GetItem, then an UpdateItem of its fields conditional on the version it read (on the item not
existing, for the first; never a PutItem: no role may overwrite an item of the control table whole). Two sweepers that read the same change write it once: the second one's condition fails, and it leaves the
winner's item (no retry: the next sweep compares again). An unchanged read writes nothing.

One item per model id: a deploy that changes the model never paces its workers to the old model's quotas, and a
worker reads only its own model's item.

Workers read it (`get`) with the control, at the start of each chunk, cached `max_age_s` (the profile's
`model_control_max_age_s`). A read that fails, or finds no item, keeps the last one this process read (None before
any: the caller's fallback, model/quota_targets.py); the failure is logged with its code, never raised: an
unreadable quota must neither stop the pipeline nor leave it unpaced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from contract_review.domain.control_records import PublishedQuotas
from contract_review.domain.errors import classify

from .dynamo import Table, serialize
from .model_control import KEY_ATTRIBUTE

log = logging.getLogger(__name__)

QUOTAS_KEY_PREFIX = "quotas#"  # + the model id: the item's `control` key


def quotas_key(model_id: str) -> str:
    return f"{QUOTAS_KEY_PREFIX}{model_id}"


class DynamoPublishedQuotas:
    def __init__(self, client: Any, table: str, model_id: str, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.table, self.model_id = Table(client, table), model_id
        self.key = {KEY_ATTRIBUTE: quotas_key(model_id)}
        self.max_age_s, self.clock = max_age_s, clock
        self._lock = threading.Lock()  # the analysts of one chunk may ask at once: one read refreshes it for all
        self._read_at: float | None = None
        self._last: PublishedQuotas | None = None

    def get(self) -> PublishedQuotas | None:
        with self._lock:
            now = self.clock()
            if self._read_at is not None and now - self._read_at < self.max_age_s:
                return self._last
            try:
                found = self._read()
            except (ClientError, BotoCoreError) as exc:
                found = None
                log.warning("published quotas not read: the last ones read hold", extra={
                    "error_code": classify(exc, step="published_quotas.get").error_code, "model_id": self.model_id,
                    "tokens_per_minute": self._last.tokens_per_minute if self._last is not None else None})
            if found is not None:
                self._last = found
            self._read_at = now
            return self._last

    def publish(self, quotas: PublishedQuotas) -> bool:
        current = self._read()
        if current is not None and current.same_values(quotas):
            return False
        wanted = quotas.model_copy(update={"version": (current.version if current is not None else 0) + 1})
        fields = wanted.model_dump(mode="json")
        names = {f"#f{i}": k for i, k in enumerate(fields)}
        values = {f":f{i}": v for i, v in enumerate(fields.values()) if v is not None}
        update = "SET " + ", ".join(f"#f{i} = :f{i}" for i, v in enumerate(fields.values()) if v is not None)
        removes = [f"#f{i}" for i, v in enumerate(fields.values()) if v is None]
        if current is None:
            condition, names["#k"] = "attribute_not_exists(#k)", KEY_ATTRIBUTE
        else:
            condition, values[":seen"] = f"#f{list(fields).index('version')} = :seen", current.version
        written = self.table.update_if(
            self.key, UpdateExpression=update + (" REMOVE " + ", ".join(removes) if removes else ""),
            ConditionExpression=condition, ExpressionAttributeNames=names, ExpressionAttributeValues=serialize(values))
        if written is None:
            log.info("quotas published by another writer first: theirs stand", extra={"model_id": self.model_id})
            return False
        log.info("model quotas published", extra={
            "model_id": self.model_id, "tokens_per_minute": wanted.tokens_per_minute,
            "tokens_per_day": wanted.tokens_per_day, "version": wanted.version,
            "before": current.model_dump(exclude={"by", "version"}) if current is not None else None})
        return True

    def _read(self) -> PublishedQuotas | None:
        item = self.table.get(self.key)
        if item is None:
            return None
        item.pop(KEY_ATTRIBUTE, None)
        return PublishedQuotas.model_validate(item)
