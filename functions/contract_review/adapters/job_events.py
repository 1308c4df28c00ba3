"""Each job's events in the events table (`DynamoJobEvents`): appended under the job's next number, the number and the
event written together in one transaction with the job's counter item (beside its events, `seq` COUNTER_SEQ), and
read back in order. An append may carry one more update in its transaction (a settle's owed event paid, a batch
job's unused answers counted on the job: `record_owed_event`, `record_unused`)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping

from botocore.exceptions import ClientError

from contract_review.domain.records import JobEvent, Usage, event_seq

from .dynamo import Write, cancel_codes, deserialize, is_conditional_failure, serialize, to_item
from .job_tables import EVENT_OWED, JobTables, usage_adds

# The job's event counter: one small item in the events table, beside its events. "#" sorts before every
# event's zero-padded number, so `seq > event_seq(after)` never returns it.
COUNTER_SEQ = "#counter"
EVENT_APPEND_ATTEMPTS = 50  # concurrent writers of one job's events each win one round


class DynamoJobEvents(JobTables):
    def record_event(self, job_id: str, kind: str, **detail: object) -> int:
        return self._append(job_id, kind, detail)

    def record_owed_event(self, job_id: str, chunk_id: str, kind: str, /, **detail: object) -> int:
        """The event a settle owes (`event_owed` on the chunk record, set by the transaction that counted it),
        written with the flag's removal in one transaction conditional on the flag: at most once per settle,
        whoever writes it (the aggregator that counted the chunk, or whoever finds it owed later: a redelivery,
        finalize, finish-cancel). 0 when nothing is owed (or there is no such job)."""
        return self._append(job_id, kind, detail, also={  # the event's settle owed it: it is paid, once
            "TableName": self.claims.name, "Key": serialize({"job_id": job_id, "chunk_id": chunk_id}),
            "UpdateExpression": "REMOVE #o", "ConditionExpression": "#o = :t",
            "ExpressionAttributeNames": {"#o": EVENT_OWED}, "ExpressionAttributeValues": serialize({":t": True})})

    def record_unused(self, job_id: str, token: str, usage: Usage, /, **detail: object) -> int:
        adds, values = usage_adds(usage)
        return self._append(job_id, "batch.unused", detail, also={
            "TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
            "UpdateExpression": "ADD " + ", ".join([*adds, "#bu :tokens"]),
            "ConditionExpression": "attribute_exists(job_id) AND NOT contains(#bu, :token)",
            "ExpressionAttributeNames": {"#bu": "batch_unused"},
            "ExpressionAttributeValues": serialize({**values, ":tokens": {token}, ":token": token})})

    def _append(self, job_id: str, kind: str, detail: Mapping[str, object],
                also: Write | None = None) -> int:
        """The job's next number and the event, written together: one transaction of the job's counter item (in the
        events table, `seq` COUNTER_SEQ) and the event, conditional on the counter being what was read. So numbers
        have no gaps (a writer that dies wrote neither), and the job item takes no write per event (each event used
        to `ADD event_seq` on the job item, a write billed at the whole item's size, which grows with the
        document). `also`: one more update written in the same transaction, whose condition failing writes nothing
        and returns 0 (a settle's owed event already paid; a batch job's unused answers already recorded). The
        counter item keeps the job's own expiry (`job_expires_at`): once it has passed, the job item is
        read again, and a job that is gone (deleted by its TTL, while the counter, written later, lives on) gets no
        event."""
        for attempt in range(EVENT_APPEND_ATTEMPTS):
            now = self.clock()
            last, counted, job_expires_at = self._last_number(job_id, now)
            if last is None:
                return 0  # no such job (never created, or expired): it has no event stream
            event = JobEvent(job_id=job_id, seq=event_seq(last + 1), type=kind, at=now,
                             detail=json.loads(json.dumps(detail, default=str)))
            item = to_item(event)
            item.update(serialize({"expires_at": int(now) + self.ttl_s}))
            counter_cond = "#n = :last" if counted else "attribute_not_exists(#n)"
            try:
                self.events_table.client.transact_write_items(TransactItems=[
                    {"Update": {"TableName": self.events_table.name,
                                "Key": serialize({"job_id": job_id, "seq": COUNTER_SEQ}),
                                "UpdateExpression": "SET #n = :next, expires_at = :exp, job_expires_at = :jexp",
                                "ConditionExpression": counter_cond, "ExpressionAttributeNames": {"#n": "number"},
                                "ExpressionAttributeValues": serialize({
                                    ":next": last + 1, ":exp": int(now) + self.ttl_s, ":jexp": job_expires_at,
                                    **({":last": last} if counted else {})})}},
                    {"Put": {"TableName": self.events_table.name, "Item": item,
                             "ConditionExpression": "attribute_not_exists(seq)"}},
                    *([{"Update": also}] if also is not None else []),
                ])
                return last + 1
            except ClientError as exc:
                if not is_conditional_failure(exc):  # another writer took the number: read again, try again
                    raise
                if also is not None and cancel_codes(exc)[2:] == ["ConditionalCheckFailed"]:
                    return 0  # its condition failed: written by another before, or nothing to write
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # noqa: S311 (jitter, not crypto)
        raise RuntimeError(f"job {job_id}: its event counter kept changing ({EVENT_APPEND_ATTEMPTS} attempts)")

    def _last_number(self, job_id: str, now: float) -> tuple[int | None, bool, int]:
        """The job's last event number, whether its counter item holds it, and the job's expiry; for a job whose
        events predate the counter item, the `event_seq` its job item kept (read once: the first append writes the
        counter). The job item is read only when there is no counter yet or the job's expiry the counter keeps has
        passed (or is unknown: a counter from before it). None: no such job."""
        item = self.events_table.get({"job_id": job_id, "seq": COUNTER_SEQ})
        if item is not None and int(item.get("job_expires_at", 0)) > now:
            return int(item["number"]), True, int(item["job_expires_at"])
        r = self.jobs.client.get_item(TableName=self.jobs.name, Key=serialize({"job_id": job_id}),
                                      ProjectionExpression="event_seq, expires_at", ConsistentRead=True)
        if "Item" not in r:
            return None, False, 0
        job = deserialize(r["Item"])
        expires_at = int(job.get("expires_at", 0))
        if item is not None:
            return int(item["number"]), True, expires_at
        return int(job.get("event_seq", 0)), False, expires_at

    def last_event(self, job_id: str) -> JobEvent | None:
        r = self.events_table.client.query(
            TableName=self.events_table.name, KeyConditionExpression="job_id = :j AND seq > :zero",
            ExpressionAttributeValues=serialize({":j": job_id, ":zero": event_seq(0)}), ScanIndexForward=False,
            Limit=1, ConsistentRead=True)
        items = r.get("Items", [])
        return JobEvent.model_validate(deserialize(items[0])) if items else None

    def events(self, job_id: str, after: int = 0, limit: int | None = None) -> list[JobEvent]:
        """The job's events numbered above `after`, in order, at most `limit` (a consistent read: an event
        written before the call is in the answer). Fewer than `limit` only when there are no more: a Query stops
        at 1 MB whatever its Limit, so the read goes on from where each page stopped until it has `limit`."""
        found: list[JobEvent] = []
        for item in self.events_table.pages(
                "query", KeyConditionExpression="job_id = :j AND seq > :after", ConsistentRead=True,
                ExpressionAttributeValues=serialize({":j": job_id, ":after": event_seq(after)}),
                **({"Limit": limit} if limit is not None else {})):
            found.append(JobEvent.model_validate(item))
            if limit is not None and len(found) >= limit:
                break
        return found

