"""AWS adapters: DynamoDB tables, the artifact bucket, and queues.

Every method is one AWS call (or one conditional write). The core receives an `Aws` bundle;
handlers build it once per process from a boto3 session (never at import).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from .config import Settings
from .errors import ErrorEnvelope

TERMINAL_JOB_STATES = frozenset({"completed", "failed", "dead_lettered", "cancelled"})
SETTLED_CHUNK_STATES = frozenset({"done", "failed", "dead_lettered"})
OPEN = "open"  # value of the sparse `lease_bucket` attribute while a chunk is claimed

_ser = TypeSerializer()
_de = TypeDeserializer()


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


def _dyn(value: Any) -> Any:
    """Python -> DynamoDB-safe (floats become Decimal)."""
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: _dyn(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dyn(v) for v in value]
    return value


def serialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(_dyn(v)) for k, v in item.items()}


def deserialize(item: dict[str, Any]) -> dict[str, Any]:
    return _plain({k: _de.deserialize(v) for k, v in item.items()})


def is_conditional_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("ConditionalCheckFailedException", "TransactionCanceledException")


@dataclass
class Aws:
    ddb: Any  # boto3 dynamodb *client*
    s3: Any
    sqs: Any
    settings: Settings

    @classmethod
    def from_session(cls, session: Any, settings: Settings, config: Any = None) -> Aws:
        return cls(ddb=session.client("dynamodb", config=config), s3=session.client("s3", config=config),
                   sqs=session.client("sqs", config=config), settings=settings)


@dataclass(frozen=True)
class ClaimResult:
    won: bool
    fence: int
    item: dict[str, Any]  # ALL_NEW when won, ALL_OLD (why it failed) when lost


class Store:
    """Typed operations over the stack's tables, bucket and queues."""

    def __init__(self, aws: Aws, clock: Any = time.time):
        self.aws = aws
        self.s = aws.settings
        self.clock = clock

    def _update_if(self, table: str, key: dict[str, Any], **kw: Any) -> dict[str, Any] | None:
        """A conditional update_item: the new item, or None when the condition did not hold."""
        try:
            r = self.aws.ddb.update_item(TableName=table, Key=key, ReturnValues="ALL_NEW", **kw)
        except ClientError as exc:
            if is_conditional_failure(exc):
                return None
            raise
        return deserialize(r["Attributes"])

    # ---------------------------------------------------------------- jobs
    def create_job(self, job: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        job = {**job, "expires_at": int(self.clock()) + self.s.profile.record_ttl_s}
        try:
            # a job that failed on bad input may be replaced by a corrected submission with the same key
            self.aws.ddb.put_item(TableName=self.s.jobs_table, Item=serialize(job),
                                  ConditionExpression="attribute_not_exists(job_id) OR "
                                                      "(#s = :failed AND begins_with(error_code, :input))",
                                  ExpressionAttributeNames={"#s": "state"},
                                  ExpressionAttributeValues=serialize({":failed": "failed", ":input": "input."}),
                                  ReturnValuesOnConditionCheckFailure="ALL_OLD")
            return job, True
        except ClientError as exc:
            if not is_conditional_failure(exc):
                raise
            return deserialize(exc.response.get("Item") or {}) or self.get_job(job["job_id"]) or job, False

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        r = self.aws.ddb.get_item(TableName=self.s.jobs_table, Key=serialize({"job_id": job_id}), ConsistentRead=True)
        return deserialize(r["Item"]) if "Item" in r else None

    def list_jobs(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for page in self.aws.ddb.get_paginator("scan").paginate(
                TableName=self.s.jobs_table,
                ProjectionExpression="job_id, #s, created_at, updated_at, chunk_count, document_id, error_code",
                ExpressionAttributeNames={"#s": "state"}):
            items.extend(deserialize(i) for i in page["Items"])
        return sorted(items, key=lambda j: j.get("created_at", 0))

    def transition(self, job_id: str, from_states: Iterable[str], to_state: str,
                   fields: dict[str, Any] | None = None, remove: Iterable[str] = ()) -> dict[str, Any] | None:
        """Conditional state change. Returns the new job, or None when the job was not in from_states."""
        fields = {**(fields or {}), "state": to_state, "updated_at": self.clock()}
        names = {f"#f{i}": k for i, k in enumerate(fields)}
        values = {f":v{i}": v for i, v in enumerate(fields.values())}
        froms = list(from_states)
        values.update({f":from{i}": s for i, s in enumerate(froms)})
        expr = "SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields)))
        rem = list(remove)
        if rem:
            names.update({f"#r{i}": k for i, k in enumerate(rem)})
            expr += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(rem)))
        names["#state"] = "state"
        return self._update_if(
            self.s.jobs_table, serialize({"job_id": job_id}), UpdateExpression=expr,
            ConditionExpression="#state IN (" + ", ".join(f":from{i}" for i in range(len(froms))) + ")",
            ExpressionAttributeNames=names, ExpressionAttributeValues=serialize(values))

    def stalled_jobs(self, idle_since: float) -> Iterator[dict[str, Any]]:
        """`running` jobs not updated since `idle_since` (a scan: the jobs table holds TTL-bounded jobs)."""
        for page in self.aws.ddb.get_paginator("scan").paginate(
                TableName=self.s.jobs_table, FilterExpression="#s = :running AND updated_at < :t",
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues=serialize({":running": "running", ":t": idle_since})):
            for i in page["Items"]:
                yield deserialize(i)

    def touch_job(self, job_id: str) -> None:
        self.aws.ddb.update_item(TableName=self.s.jobs_table, Key=serialize({"job_id": job_id}),
                                 UpdateExpression="SET updated_at = :now",
                                 ExpressionAttributeValues=serialize({":now": self.clock()}))

    def settle_chunk(self, job_id: str, chunk_id: str) -> dict[str, Any]:
        """Add chunk to the job's settled set (idempotent); returns the job after the update."""
        r = self.aws.ddb.update_item(
            TableName=self.s.jobs_table, Key=serialize({"job_id": job_id}),
            UpdateExpression="ADD settled :c SET updated_at = :now",
            ConditionExpression="attribute_exists(job_id)",
            ExpressionAttributeValues={":c": {"SS": [chunk_id]}, ":now": _ser.serialize(_dyn(self.clock()))},
            ReturnValues="ALL_NEW")
        return deserialize(r["Attributes"])

    def unsettle_chunks(self, job_id: str, chunk_ids: list[str]) -> None:
        self.aws.ddb.update_item(
            TableName=self.s.jobs_table, Key=serialize({"job_id": job_id}), UpdateExpression="DELETE settled :c",
            ExpressionAttributeValues={":c": {"SS": chunk_ids}})

    # ---------------------------------------------------------------- events
    def event(self, job_id: str, kind: str, **detail: Any) -> None:
        now = self.clock()
        item = {"job_id": job_id, "seq": f"{now:017.6f}#{uuid.uuid4().hex[:8]}", "type": kind, "at": now,
                "detail": json.loads(json.dumps(detail, default=str)), "expires_at": int(now) + self.s.profile.record_ttl_s}
        self.aws.ddb.put_item(TableName=self.s.events_table, Item=serialize(item))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events in order (sort key: time, then a random suffix)."""
        kw: dict[str, Any] = {"TableName": self.s.events_table, "KeyConditionExpression": "job_id = :j",
                              "ExpressionAttributeValues": serialize({":j": job_id})}
        out: list[dict[str, Any]] = []
        for page in self.aws.ddb.get_paginator("query").paginate(**kw):
            out.extend(deserialize(i) for i in page["Items"])
        return out

    # ---------------------------------------------------------------- claims (chunk records)
    def _ckey(self, job_id: str, chunk_id: str) -> dict[str, Any]:
        return serialize({"job_id": job_id, "chunk_id": chunk_id})

    def create_chunk_record(self, job_id: str, chunk_id: str, record: dict[str, Any]) -> bool:
        item = {"job_id": job_id, "chunk_id": chunk_id, "status": "pending", "fence": 0, "failures": 0,
                "receives": 0, "redeliveries": 0, "n_calls": 0, "retries": {}, "repairs": 0, "checkpoints": {},
                "expires_at": int(self.clock()) + self.s.profile.record_ttl_s, **record}
        try:
            self.aws.ddb.put_item(TableName=self.s.claims_table, Item=serialize(item),
                                  ConditionExpression="attribute_not_exists(chunk_id)")
            return True
        except ClientError as exc:
            if is_conditional_failure(exc):
                return False
            raise

    def chunk_records(self, job_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for page in self.aws.ddb.get_paginator("query").paginate(
                TableName=self.s.claims_table, KeyConditionExpression="job_id = :j",
                ExpressionAttributeValues=serialize({":j": job_id}), ConsistentRead=True):
            out.extend(deserialize(i) for i in page["Items"])
        return sorted(out, key=lambda c: c.get("chunk_index", 0))

    def get_chunk(self, job_id: str, chunk_id: str) -> dict[str, Any] | None:
        r = self.aws.ddb.get_item(TableName=self.s.claims_table, Key=self._ckey(job_id, chunk_id), ConsistentRead=True)
        return deserialize(r["Item"]) if "Item" in r else None

    def claim(self, job_id: str, chunk_id: str, owner: str, lease_s: float, receive_count: int) -> ClaimResult:
        """One conditional update: take the lease if free or lapsed, bump the fencing token."""
        now = self.clock()
        try:
            r = self.aws.ddb.update_item(
                TableName=self.s.claims_table, Key=self._ckey(job_id, chunk_id),
                UpdateExpression=("SET claimed_by = :me, claim_expires_at = :exp, lease_bucket = :open, #st = :claimed, "
                                  "fence = if_not_exists(fence, :zero) + :one, claimed_at = :now, "
                                  "receives = if_not_exists(receives, :zero) + :one, last_receive_count = :rc "
                                  + ("ADD redeliveries :one" if receive_count > 1 else "")),
                ConditionExpression=("attribute_exists(chunk_id) AND #st IN (:pending, :claimed) AND "
                                     "(attribute_not_exists(claimed_by) OR claim_expires_at < :now)"),
                ExpressionAttributeNames={"#st": "status"},
                ExpressionAttributeValues=serialize({
                    ":me": owner, ":exp": now + lease_s, ":open": OPEN, ":claimed": "claimed", ":pending": "pending",
                    ":zero": 0, ":one": 1, ":now": now, ":rc": receive_count}),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as exc:
            if not is_conditional_failure(exc):
                raise
            return ClaimResult(False, 0, deserialize(exc.response.get("Item") or {}))
        item = deserialize(r["Attributes"])
        return ClaimResult(True, int(item["fence"]), item)

    def _fenced_update(self, job_id: str, chunk_id: str, fence: int, expr: str, values: dict[str, Any],
                       names: dict[str, str] | None = None, states: Iterable[str] = ("claimed",),
                       lapsed_before: float | None = None) -> dict[str, Any] | None:
        """An update that applies only while `fence` is current and the chunk is in `states`
        (and, for the sweeper, only while the lease is still lapsed at `lapsed_before`)."""
        states = list(states)
        names = {**(names or {}), "#st": "status"}
        state_values: dict[str, Any] = {f":fs{i}": st for i, st in enumerate(states)}
        cond = "fence = :fence AND #st IN (" + ", ".join(state_values) + ")"
        if lapsed_before is not None:  # a heartbeat that landed since the sweeper's read wins
            cond += " AND (attribute_not_exists(claim_expires_at) OR claim_expires_at < :lapsed)"
            state_values[":lapsed"] = lapsed_before
        return self._update_if(
            self.s.claims_table, self._ckey(job_id, chunk_id), UpdateExpression=expr, ConditionExpression=cond,
            ExpressionAttributeNames=names, ExpressionAttributeValues=serialize({**values, **state_values, ":fence": fence}))

    def heartbeat(self, job_id: str, chunk_id: str, fence: int, lease_s: float) -> bool:
        return self._fenced_update(job_id, chunk_id, fence, "SET claim_expires_at = :exp",
                                   {":exp": self.clock() + lease_s}) is not None

    def _stats_expr(self, stats: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
        parts = ["n_calls = if_not_exists(n_calls, :z) + :calls", "repairs = if_not_exists(repairs, :z) + :rep"]
        values: dict[str, Any] = {":z": 0, ":calls": stats.get("calls", 0), ":rep": stats.get("repairs", 0)}
        names: dict[str, str] = {}
        for i, (code, n) in enumerate(sorted(stats.get("retries", {}).items())):
            names[f"#rc{i}"] = code
            values[f":rc{i}"] = n
            parts.append(f"retries.#rc{i} = if_not_exists(retries.#rc{i}, :z) + :rc{i}")
        return ", ".join(parts), values, names

    def release(self, job_id: str, chunk_id: str, fence: int, stats: dict[str, Any],
                error: ErrorEnvelope | None, failure: bool, lapsed_before: float | None = None) -> dict[str, Any] | None:
        """Give a claimed chunk back (pending), recording the attempt's stats and error."""
        sx, values, names = self._stats_expr(stats)
        expr = f"SET #st = :pending, {sx}"
        values[":pending"] = "pending"
        if error is not None:
            expr += ", last_error = :err"
            values[":err"] = error.model_dump(mode="json")
        if failure:
            expr += ", failures = if_not_exists(failures, :z) + :one"
            values[":one"] = 1
        expr += " REMOVE claimed_by, claim_expires_at, lease_bucket"
        return self._fenced_update(job_id, chunk_id, fence, expr, values, names, lapsed_before=lapsed_before)

    def finish(self, job_id: str, chunk_id: str, fence: int, status: str, stats: dict[str, Any],
               fields: dict[str, Any], error: ErrorEnvelope | None = None,
               states: Iterable[str] = ("claimed",), lapsed_before: float | None = None) -> dict[str, Any] | None:
        """Settle the chunk (done | failed | dead_lettered), fenced."""
        sx, values, names = self._stats_expr(stats)
        values[":status"] = status
        values[":now"] = self.clock()
        expr = f"SET #st = :status, settled_at = :now, {sx}"
        for i, (k, v) in enumerate(fields.items()):
            names[f"#x{i}"] = k
            values[f":x{i}"] = v
            expr += f", #x{i} = :x{i}"
        if error is not None:
            expr += ", last_error = :err"
            values[":err"] = error.model_dump(mode="json")
        if status == "dead_lettered":
            expr += ", failures = if_not_exists(failures, :z) + :one"
            values[":one"] = 1
        expr += " REMOVE claimed_by, claim_expires_at, lease_bucket"
        return self._fenced_update(job_id, chunk_id, fence, expr, values, names, states, lapsed_before)

    def lapsed_claims(self, now: float) -> Iterator[dict[str, Any]]:
        paginator = self.aws.ddb.get_paginator("query")
        for page in paginator.paginate(
                TableName=self.s.claims_table, IndexName="by-lease",
                KeyConditionExpression="lease_bucket = :open AND claim_expires_at < :now",
                ExpressionAttributeValues=serialize({":open": OPEN, ":now": now})):
            for i in page["Items"]:
                yield deserialize(i)

    def reset_for_redrive(self, job_id: str, chunk_id: str) -> dict[str, Any] | None:
        return self._update_if(
            self.s.claims_table, self._ckey(job_id, chunk_id),
            # the fence moves on, so nothing still holding the old token (a sweep in flight) can settle it
            UpdateExpression="SET #st = :pending, failures = :z, redriven = if_not_exists(redriven, :z) + :one, "
                             "fence = fence + :one, redriven_at = :now "
                             "REMOVE claimed_by, claim_expires_at, lease_bucket, settled_at",
            ConditionExpression="#st IN (:dead, :failed)", ExpressionAttributeNames={"#st": "status"},
            ExpressionAttributeValues=serialize({":pending": "pending", ":z": 0, ":one": 1, ":now": self.clock(),
                                                 ":dead": "dead_lettered", ":failed": "failed"}))

    # ---------------------------------------------------------------- checkpoints
    # Write-then-commit: the checkpoint item is written under a key that includes the writer's
    # fencing token, then committed by a fenced update of the chunk record's `checkpoints` map.
    # A zombie can leave an orphan item behind, never a committed one. (No transactions: a
    # single-item condition is the whole fence.)
    def checkpoints(self, job_id: str, chunk_id: str, record: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """Committed checkpoints of a chunk: analyst -> checkpoint item."""
        record = record if record is not None else (self.get_chunk(job_id, chunk_id) or {})
        committed: dict[str, Any] = record.get("checkpoints") or {}
        if not committed:
            return {}
        keys = [serialize({"pk": f"{job_id}#{chunk_id}", "analyst": f"{a}#{int(f):06d}"}) for a, f in committed.items()]
        r = self.aws.ddb.batch_get_item(RequestItems={self.s.checkpoints_table: {"Keys": keys, "ConsistentRead": True}})
        items = [deserialize(i) for i in r["Responses"].get(self.s.checkpoints_table, [])]
        unprocessed = r.get("UnprocessedKeys", {}).get(self.s.checkpoints_table, {}).get("Keys", [])
        for key in unprocessed:  # rare: read them one by one
            got = self.aws.ddb.get_item(TableName=self.s.checkpoints_table, Key=key, ConsistentRead=True)
            if "Item" in got:
                items.append(deserialize(got["Item"]))
        return {i["analyst"].split("#")[0]: i for i in items}

    def load_checkpoint_output(self, item: dict[str, Any]) -> dict[str, Any]:
        if "output" in item:
            return json.loads(item["output"])
        return json.loads(self.get_object(item["output_key"]))

    def put_checkpoint(self, job_id: str, chunk_id: str, analyst: str, fence: int, config_hash: str,
                       output: dict[str, Any]) -> bool:
        """Persist an analyst's output; returns False when the fence moved on (nothing committed)."""
        body = json.dumps(output)
        now = self.clock()
        item: dict[str, Any] = {"pk": f"{job_id}#{chunk_id}", "analyst": f"{analyst}#{fence:06d}", "fence": fence,
                                "config_hash": config_hash, "status": output.get("status", "ok"),
                                "created_at": now, "expires_at": int(now) + self.s.profile.record_ttl_s}
        if len(body.encode()) > self.s.profile.checkpoint_inline_max_bytes:
            key = f"checkpoints/{job_id}/{chunk_id}/{analyst}/{fence}.json"
            self.put_object(key, body)
            item["output_key"] = key
        else:
            item["output"] = body
        self.aws.ddb.put_item(TableName=self.s.checkpoints_table, Item=serialize(item))
        return self._fenced_update(job_id, chunk_id, fence, "SET checkpoints.#a = :f",
                                   {":f": fence}, {"#a": analyst}) is not None

    # ---------------------------------------------------------------- objects
    def put_object(self, key: str, body: str, content_type: str = "application/json") -> None:
        self.aws.s3.put_object(Bucket=self.s.bucket, Key=key, Body=body.encode("utf-8"), ContentType=content_type,
                               ServerSideEncryption="AES256")

    def get_object(self, key: str, bucket: str | None = None) -> str:
        return self.aws.s3.get_object(Bucket=bucket or self.s.bucket, Key=key)["Body"].read().decode("utf-8")

    def get_object_bytes(self, bucket: str, key: str) -> bytes:
        return self.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    # ---------------------------------------------------------------- queues
    def send_analysis(self, messages: list[str], delay_s: int = 0) -> None:
        for i in range(0, len(messages), 10):
            entries = [{"Id": str(n), "MessageBody": body, **({"DelaySeconds": delay_s} if delay_s else {})}
                       for n, body in enumerate(messages[i:i + 10])]
            pending = entries
            for _ in range(5):
                r = self.aws.sqs.send_message_batch(QueueUrl=self.s.analysis_queue_url, Entries=pending)
                failed = {f["Id"] for f in r.get("Failed", [])}
                pending = [e for e in pending if e["Id"] in failed]
                if not pending:
                    break
                time.sleep(0.2)
            if pending:
                raise RuntimeError(f"SQS refused {len(pending)} analysis messages")

    def send_result(self, body: str, job_id: str, dedup_id: str) -> None:
        self.aws.sqs.send_message(QueueUrl=self.s.results_queue_url, MessageBody=body, MessageGroupId=job_id,
                                  MessageDeduplicationId=dedup_id[:128])

    def peek(self, queue_url: str, max_rounds: int = 20) -> list[dict[str, Any]]:
        """Read a queue's visible messages without hiding them (VisibilityTimeout=0), deduplicated.

        For DLQs, which people and the sweeper read but only redrive consumes."""
        seen: dict[str, dict[str, Any]] = {}
        quiet = 0
        for _ in range(max_rounds):
            r = self.aws.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0,
                                             MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
                                             WaitTimeSeconds=0)
            new = [m for m in r.get("Messages", []) if m["MessageId"] not in seen]
            for m in new:
                seen[m["MessageId"]] = m
            quiet = 0 if new else quiet + 1
            if quiet >= 2:
                break
        return list(seen.values())

    def send_to_dlq(self, queue_url: str, body: str, envelope: ErrorEnvelope, extra: dict[str, str] | None = None) -> None:
        attrs = {"error_code": envelope.error_code, "error_class": envelope.error_class.value,
                 "envelope": envelope.model_dump_json(), **(extra or {})}
        self.aws.sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageAttributes={
            k: {"DataType": "String", "StringValue": v[:4096]} for k, v in attrs.items() if v})
