"""The jobs table and the events table (`JobsRepo`)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import Clock
from contract_review.domain.records import (
    OUTCOME_FIELDS,
    USAGE_FIELDS,
    AttemptStats,
    ChunkStatus,
    Job,
    JobEvent,
    JobState,
    SideEffectDone,
    Usage,
    Waiting,
    event_seq,
)

from .claims import FENCED_OUT, SPEND, stats_expr
from .dynamo import (
    Table,
    cancel_codes,
    deserialize,
    is_conditional_failure,
    model_values,
    serialize,
    set_clause,
    to_item,
    transact,
)


def _usage_adds(usage: Usage | None) -> tuple[list[str], dict[str, Any]]:
    """`ADD` clauses adding `usage` (its non-zero fields) to a job's running usage."""
    if usage is None:
        return [], {}
    fields = [f for f in USAGE_FIELDS if getattr(usage, f)]
    return [f"{f} :u_{f}" for f in fields], {f":u_{f}": getattr(usage, f) for f in fields}


def _usage_is(read: Usage | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    """A condition (" AND ...") that a chunk record's usage is still `read` (what the settle adds to its job): an
    attempt fenced out since the read added to it (issue 25 finding 15). Empty for None."""
    if read is None:
        return "", {}, {}
    conds, names, values = [], {}, {}
    for f in USAGE_FIELDS:
        names[f"#r_{f}"], values[f":r_{f}"] = f, getattr(read, f)
        conds.append(f"#r_{f} = :r_{f}" if getattr(read, f) else f"(attribute_not_exists(#r_{f}) OR #r_{f} = :r_{f})")
    return " AND " + " AND ".join(conds), names, values


LIST_FIELDS = ("job_id, #s, created_at, updated_at, idempotency_key, chunk_count, document_id, error_code, "
               "principal")  # principal: the status page acting as one lists that principal's jobs only
# The sparse index of open jobs (infra/tables.py JOBS_OPEN_INDEX): only a job in a non-terminal state carries
# `open_state` (its state, written by the same write that writes the state; removed by the write that ends it),
# sorted by `updated_at`. The sweeper queries "jobs in this state idle since T" instead of scanning the table.
OPEN_INDEX = "by-open-state"
# The job's event counter: one small item in the events table, beside its events. "#" sorts before every
# event's zero-padded number, so `seq > event_seq(after)` never returns it.
COUNTER_SEQ = "#counter"
EVENT_APPEND_ATTEMPTS = 50  # concurrent writers of one job's events each win one round
OPEN_STATE = "open_state"


def _open_state(state: JobState) -> str | None:
    return None if state.terminal else state.value


# `running_brief`: what says whether a running job's chunks are open and who for (Job's required fields too)
BRIEF_NAMES = {"#s": "state", "#st": "settled", "#w": "waiting"}
BRIEF_FIELDS = ("job_id, #s, created_at, updated_at, idempotency_key, priority, chunk_count, settled_count, #st, "
                "#w, inference, on_demand_since")
BATCH_GET_KEYS = 100  # BatchGetItem's most keys per request
BATCH_GET_ATTEMPTS = 5
MARKS_PER_TRANSACTION = 99  # TransactWriteItems takes 100 items: the job's check and 99 chunk records
SETTLE_ATTEMPTS = 20  # a settle's transaction cancelled by a concurrent one on the same items (not a condition) is retried
COUNTED = "counted"  # on a chunk record: counted settled on its job (written with the job's `settled_count`)
EVENT_OWED = "event_owed"  # on a chunk record: counted, its `chunk.settled` event not written yet
LEGACY_SETTLED = "settled"  # a job item's string set of counted chunk ids, from before `settled_count`


class DynamoJobs:
    def __init__(self, client: Any, jobs_table: str, events_table: str, ttl_s: int, clock: Clock, *,
                 claims_table: str):
        self.jobs = Table(client, jobs_table)
        self.events_table = Table(client, events_table)
        self.claims = Table(client, claims_table)  # the chunk records' `counted` marks (settle_new_chunk)
        self.ttl_s = ttl_s
        self.clock = clock

    @staticmethod
    def _item(job: Job) -> dict[str, Any]:
        item = to_item(job)
        if (open_state := _open_state(job.state)) is not None:
            item[OPEN_STATE] = {"S": open_state}
        return item

    def create(self, job: Job) -> tuple[Job, bool]:
        job = job.model_copy(update={"expires_at": int(self.clock()) + self.ttl_s})
        created, old = self.jobs.put_if(self._item(job), "attribute_not_exists(job_id)")
        if created:
            return job, True
        existing = Job.model_validate(old) if old else self.get(job.job_id)
        if existing is None or not existing.replaceable:
            return existing or job, False
        # a job that failed on bad input is replaced by a corrected submission with the same key; its
        # event numbers go on (its counter item stays: a reader resuming after its last event loses nothing), conditional on
        # nothing having changed it since the read
        replacement = job.model_copy(update={"version": existing.version + 1, "event_seq": existing.event_seq})
        # (`event_seq`: kept for a job whose events predate the counter item; the counter itself is not replaced)
        version_cond = "(#v = :v OR attribute_not_exists(#v))" if existing.version == 0 else "#v = :v"
        created, old = self.jobs.put_if(self._item(replacement), version_cond, ExpressionAttributeNames={"#v": "version"},
                                        ExpressionAttributeValues=serialize({":v": existing.version}))
        if created:
            return replacement, True
        return (Job.model_validate(old) if old else existing), False

    def get(self, job_id: str) -> Job | None:
        item = self.jobs.get({"job_id": job_id})
        return Job.model_validate(item) if item else None

    def all(self) -> list[Job]:
        items = self.jobs.pages("scan", ProjectionExpression=LIST_FIELDS, ExpressionAttributeNames={"#s": "state"})
        return sorted((Job.model_validate(i) for i in items), key=lambda j: j.created_at)

    def transition(self, job_id: str, from_states: Collection[JobState], to: JobState, *,
                   started_at: float | None = None, outcome: BaseModel | None = None,
                   settled: set[str] | None = None, if_settled_version: int | None = None,
                   if_version: int | None = None) -> Job | None:
        names: dict[str, str] = {"#state": "state"}
        conds: dict[str, Any] = {f":from{i}": s.value for i, s in enumerate(from_states)}
        cond = f"#state IN ({', '.join(conds)})"
        if if_settled_version is not None:  # no chunk was uncounted since the caller's read
            names["#sv"] = "settled_version"
            conds[":sv"] = if_settled_version
            cond += " AND (#sv = :sv" + (" OR attribute_not_exists(#sv))" if if_settled_version == 0 else ")")
        if if_version is not None:  # nothing else changed the job's state since the caller's read
            names["#v"] = "version"
            conds[":v"] = if_version
            cond += " AND (#v = :v" + (" OR attribute_not_exists(#v))" if if_version == 0 else ")")
        fields: dict[str, Any] = model_values(outcome) if outcome is not None else {}
        if started_at is not None:
            fields["started_at"] = started_at
        remove: list[str] = []
        if settled is not None:  # what is counted is rebuilt: the records' marks first, each under the job's condition
            marked = self._mark_counted(job_id, settled, (cond, names, conds))
            if marked is None:
                return None  # the job changed meanwhile (another retry won): nothing more is written
            remove += [f for f in OUTCOME_FIELDS if f not in fields]
            fields["settled_count"] = marked
            remove.append(LEGACY_SETTLED)
        fields.update({"state": to.value, "updated_at": self.clock()})
        if (open_state := _open_state(to)) is not None:  # in the open-jobs index while open, out once ended
            fields[OPEN_STATE] = open_state
        else:
            remove.append(OPEN_STATE)
        expr, set_names, values = set_clause(fields)
        names.update(set_names)
        expr = "SET " + expr + " ADD version :one"
        values[":one"] = 1
        if remove:
            names.update({f"#r{i}": k for i, k in enumerate(remove)})
            expr += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(remove)))
        item = self.jobs.update_if(
            {"job_id": job_id}, UpdateExpression=expr, ConditionExpression=cond,
            ExpressionAttributeNames=names, ExpressionAttributeValues=serialize({**values, **conds}))
        return Job.model_validate(item) if item else None

    def stalled(self, idle_since: float, state: JobState = JobState.RUNNING) -> Iterator[Job]:
        """A query of the sparse open-jobs index (keys only), then each job read again, strongly consistent.

        The index is eventually consistent (a GSI is: moto's happens not to be), so what it says is a hint:
        an entry may still show a job that has since moved on (another state, or progress after `idle_since`),
        or not yet show one that just arrived. Each job is read again and kept only if the item itself is in
        `state` and idle since `idle_since`, so a stale entry costs one read and nothing else; a job missing
        from the index is found by the next sweep (the sweeper only acts on jobs idle for a stall period or a
        lease, far longer than the index's lag). Every write the sweeper then makes is conditional anyway (the
        job's version, the chunk's fence), as it was when this was a scan."""
        yield from self._open(state, idle_since)

    def running(self) -> Iterator[Job]:
        yield from self._open(JobState.RUNNING)

    def _open(self, state: JobState, idle_since: float | None = None) -> Iterator[Job]:
        """The open jobs in `state` the index names (idle since `idle_since`, if given), each read again."""
        cond, values = "#o = :state", dict[str, Any]({":state": state.value})
        if idle_since is not None:
            cond, values[":t"] = cond + " AND updated_at < :t", idle_since
        for key in self.jobs.pages("query", IndexName=OPEN_INDEX, KeyConditionExpression=cond,
                                   ExpressionAttributeNames={"#o": OPEN_STATE},
                                   ExpressionAttributeValues=serialize(values)):
            job = self.get(key["job_id"])
            if job is not None and job.state is state and (idle_since is None or job.updated_at < idle_since):
                yield job

    def running_brief(self) -> Iterator[Job]:
        """The running jobs, only the fields that say whose chunks are still open (pipeline/priority.py): a query of
        the sparse open-jobs index (keys only), then the jobs read in batches of 100 (BatchGetItem, strongly
        consistent, projected): two requests for up to 100 running jobs, where `stalled` makes one per job. The
        other fields keep their defaults: not a job to act on or write back. Each item is kept only if it is
        itself still running (the index lags)."""
        keys = [{"job_id": k["job_id"]} for k in self.jobs.pages(
            "query", IndexName=OPEN_INDEX, KeyConditionExpression="#o = :state",
            ExpressionAttributeNames={"#o": OPEN_STATE}, ExpressionAttributeValues=serialize({":state": "running"}))]
        for i in range(0, len(keys), BATCH_GET_KEYS):
            for item in self._batch_get(keys[i:i + BATCH_GET_KEYS], BRIEF_FIELDS):
                job = Job.model_validate(item)
                if job.state is JobState.RUNNING:
                    yield job

    def _batch_get(self, keys: list[dict[str, Any]], projection: str) -> Iterator[dict[str, Any]]:
        """BatchGetItem of up to 100 keys; the keys DynamoDB leaves unprocessed (throttling, size) are asked
        again after a short jittered pause, a bounded number of times (then `aws.throttled`)."""
        request: dict[str, Any] = {self.jobs.name: {"Keys": [serialize(k) for k in keys], "ConsistentRead": True,
                                                    "ProjectionExpression": projection,
                                                    "ExpressionAttributeNames": BRIEF_NAMES}}
        for attempt in range(BATCH_GET_ATTEMPTS):
            r = self.jobs.client.batch_get_item(RequestItems=request)
            for item in r.get("Responses", {}).get(self.jobs.name, []):
                yield deserialize(item)
            request = r.get("UnprocessedKeys") or {}
            if not request:
                return
            time.sleep(random.uniform(0, 0.05 * 2 ** attempt))  # noqa: S311 (jitter, not crypto)
        raise ReviewError.of("aws.throttled", f"BatchGetItem left keys unprocessed {BATCH_GET_ATTEMPTS} times")

    def backfill_open_index(self) -> int:
        """One-time, for jobs written before the open-jobs index existed (`review backfill-open-jobs`): give
        every open job without `open_state` its key, conditional on its state being the one read (a job that moved
        meanwhile was written by the new code, which sets it). A scan of the table, by an operator, once: the
        pipeline itself never scans. The number of jobs it indexed."""
        names = {"#s": "state", "#o": OPEN_STATE}
        n = 0
        for item in self.jobs.pages("scan", ProjectionExpression="job_id, #s", ExpressionAttributeNames=names,
                                    FilterExpression="attribute_not_exists(#o)"):
            state = JobState(item["state"])
            if state.terminal:
                continue
            if self.jobs.update_if({"job_id": item["job_id"]}, UpdateExpression="SET #o = :s",
                                   ConditionExpression="#s = :s AND attribute_not_exists(#o)",
                                   ExpressionAttributeNames=names,
                                   ExpressionAttributeValues=serialize({":s": state.value})) is not None:
                n += 1
        return n

    def touch(self, job_id: str) -> None:
        self.jobs.client.update_item(TableName=self.jobs.name, Key=serialize({"job_id": job_id}),
                                     UpdateExpression="SET updated_at = :now",
                                     ExpressionAttributeValues=serialize({":now": self.clock()}))

    def count_requeue(self, job_id: str) -> None:
        try:
            self.jobs.client.update_item(TableName=self.jobs.name, Key=serialize({"job_id": job_id}),
                                         UpdateExpression="ADD requeues :one", ConditionExpression="attribute_exists(job_id)",
                                         ExpressionAttributeValues=serialize({":one": 1}))
        except ClientError as exc:
            if not is_conditional_failure(exc):
                raise

    def advance_fanout(self, job_id: str, from_count: int, to_count: int) -> bool:
        return self.jobs.update_if(
            {"job_id": job_id}, UpdateExpression="SET fanned_out = :to", ConditionExpression="fanned_out = :from",
            ExpressionAttributeValues=serialize({":to": to_count, ":from": from_count})) is not None

    def settle_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                     status: ChunkStatus | None = None) -> Job:
        counted = self.settle_new_chunk(job_id, chunk_id, usage=usage, fence=fence, status=status)
        if counted is not None:
            return counted
        r = self.jobs.client.update_item(  # counted before: only progress (a missing job fails the condition)
            TableName=self.jobs.name, Key=serialize({"job_id": job_id}), UpdateExpression="SET updated_at = :now",
            ConditionExpression="attribute_exists(job_id)", ReturnValues="ALL_NEW",
            ExpressionAttributeValues=serialize({":now": self.clock()}))
        return Job.model_validate(deserialize(r["Attributes"]))

    def settle_new_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                         status: ChunkStatus | None = None, read: Usage | None = None) -> Job | None:
        """One transaction: the chunk record marked `counted` (condition: it exists, unmarked, and still has the
        `fence` and `status` its caller read) and the job's count and usage added to (condition: it exists, and an
        older job's set does not hold the chunk), and, with `read`, on the record's usage still being `read`.
        Neither item grows: the job item's write is billed at its own size, which no longer depends on the
        document's."""
        adds, values = _usage_adds(usage)
        values = {**values, ":one": 1, ":now": self.clock(), ":cid": chunk_id}
        chunk_cond = "attribute_exists(chunk_id) AND (attribute_not_exists(#c) OR #c = :f)"
        chunk_names: dict[str, str] = {"#c": COUNTED}
        chunk_values: dict[str, Any] = {":t": True, ":f": False}
        if fence is not None:  # a redrive since the caller's read moved the fence: not this settle's to count
            chunk_cond += " AND fence = :fence"
            chunk_values[":fence"] = fence
        if status is not None:  # nor a chunk that is pending (or claimed) again
            chunk_cond += " AND #st = :st"
            chunk_names["#st"] = "status"
            chunk_values[":st"] = status.value
        read_cond, read_names, read_values = _usage_is(read)  # nor one an attempt fenced out added to since the read
        chunk_cond += read_cond
        chunk_names.update(read_names)
        chunk_values.update(read_values)
        items = [  # the mark, and the chunk's `chunk.settled` event owed (`record_owed_event` writes it, once)
            {"Update": {"TableName": self.claims.name, "Key": serialize({"job_id": job_id, "chunk_id": chunk_id}),
                        "UpdateExpression": f"SET #c = :t, {EVENT_OWED} = :t", "ConditionExpression": chunk_cond,
                        "ExpressionAttributeNames": chunk_names,
                        "ExpressionAttributeValues": serialize(chunk_values)}},
            {"Update": {"TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
                        "UpdateExpression": "ADD " + ", ".join(["settled_count :one", *adds]) + " SET updated_at = :now",
                        "ConditionExpression": "attribute_exists(job_id) AND NOT contains(#s, :cid)",
                        "ExpressionAttributeNames": {"#s": LEGACY_SETTLED},
                        "ExpressionAttributeValues": serialize(values)}},
        ]
        if self._transact(items) is not None:
            return None
        return self.get(job_id)

    def _transact(self, items: list[dict[str, Any]]) -> list[str] | None:
        """Write `items` in one transaction (dynamo.transact): None when written, else each item's cancellation
        reason."""
        return transact(self.jobs.client, items, SETTLE_ATTEMPTS, "settling a chunk")

    def unsettle_chunks(self, job_id: str, usage_by_chunk: Mapping[str, Usage]) -> Job | None:
        for chunk_id, usage in usage_by_chunk.items():
            adds, values = _usage_adds(usage.scaled(-1))
            if self._transact([  # counted: the mark off, and the count and its usage off the job, together
                {"Update": {"TableName": self.claims.name, "Key": serialize({"job_id": job_id, "chunk_id": chunk_id}),
                            "UpdateExpression": "REMOVE #c", "ConditionExpression": "#c = :t",
                            "ExpressionAttributeNames": {"#c": COUNTED},
                            "ExpressionAttributeValues": serialize({":t": True})}},
                {"Update": {"TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
                            "UpdateExpression": "ADD " + ", ".join(["settled_count :minus", "settled_version :one",
                                                                     *adds]),
                            "ConditionExpression": "attribute_exists(job_id)",
                            "ExpressionAttributeValues": serialize({**values, ":minus": -1, ":one": 1})}},
            ]) is None:
                continue
            # not marked: a job from before the count may hold it in its set (out of the set, usage off, together)
            if self.jobs.update_if(
                    {"job_id": job_id},
                    UpdateExpression="DELETE #s :c ADD " + ", ".join(["settled_version :one", *adds]),
                    ConditionExpression="attribute_exists(job_id) AND contains(#s, :cid)",
                    ExpressionAttributeNames={"#s": LEGACY_SETTLED},
                    ExpressionAttributeValues=serialize({**values, ":c": {chunk_id}, ":cid": chunk_id, ":one": 1})
            ) is not None:
                continue
            # not counted (or no such job): nothing to take off; the version still moves
            if self.jobs.update_if({"job_id": job_id}, UpdateExpression="ADD settled_version :one",
                                   ConditionExpression="attribute_exists(job_id)",
                                   ExpressionAttributeValues=serialize({":one": 1})) is None:
                return None
        return self.get(job_id)

    def _mark_counted(self, job_id: str, counted: Collection[str],
                      guard: tuple[str, dict[str, str], dict[str, Any]]) -> int | None:
        """A reopened job's counted chunks rebuilt: each chunk record marked exactly when its id is in `counted`
        (only the records whose mark differs are written); the number marked. Each write is in a transaction with
        a check of the job's own condition (`guard`: the transition's): once another transition has won (a second
        retry of the same ended job), this writes nothing more and returns None, so it never unmarks a chunk
        counted since under the winner (finding 8 of issue 25: a mark taken off while the count kept it, and the
        chunk counted twice). Up to MARKS_PER_TRANSACTION marks a transaction."""
        cond, names, values = guard
        check = {"ConditionCheck": {"TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
                                    "ConditionExpression": cond, "ExpressionAttributeNames": names,
                                    "ExpressionAttributeValues": serialize(values)}}
        n, writes = 0, []
        for item in self.claims.pages("query", KeyConditionExpression="job_id = :j",
                                      ProjectionExpression="chunk_id, #c", ExpressionAttributeNames={"#c": COUNTED},
                                      ExpressionAttributeValues=serialize({":j": job_id}), ConsistentRead=True):
            want = item["chunk_id"] in counted
            n += want
            if want == bool(item.get(COUNTED)):
                continue
            writes.append({"Update": {
                "TableName": self.claims.name, "Key": serialize({"job_id": job_id, "chunk_id": item["chunk_id"]}),
                "UpdateExpression": "SET #c = :t" if want else "REMOVE #c",
                "ConditionExpression": "attribute_exists(chunk_id)", "ExpressionAttributeNames": {"#c": COUNTED},
                **({"ExpressionAttributeValues": serialize({":t": True})} if want else {})}})
        for i in range(0, len(writes), MARKS_PER_TRANSACTION):
            batch = writes[i:i + MARKS_PER_TRANSACTION]
            while batch:
                failed = self._transact([check, *batch])
                if failed is None:
                    break
                if failed[0] == "ConditionalCheckFailed":
                    return None  # the job is no longer as its caller read it
                # a chunk record gone meanwhile (its TTL): nothing to mark on it; the others again
                batch = [w for w, code in zip(batch, failed[1:], strict=True) if code != "ConditionalCheckFailed"]
        return n

    def set_waiting(self, job_id: str, waiting: Waiting | None) -> bool:
        if waiting is None:
            return self.jobs.update_if({"job_id": job_id}, UpdateExpression="REMOVE #w",
                                       ConditionExpression="attribute_exists(#w)",
                                       ExpressionAttributeNames={"#w": "waiting"}) is not None
        return self.jobs.update_if({"job_id": job_id}, UpdateExpression="SET #w = :w",
                                   ConditionExpression="attribute_exists(job_id) AND attribute_not_exists(#w)",
                                   ExpressionAttributeNames={"#w": "waiting"},
                                   ExpressionAttributeValues=serialize({":w": waiting.model_dump(mode="json")})) \
            is not None

    def add_fenced_out(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats) -> bool:
        key = {"job_id": job_id, "chunk_id": chunk_id}
        for _ in range(SETTLE_ATTEMPTS):
            item = self.claims.get(key)
            if item is None or fence in item.get(FENCED_OUT, set()):
                return False
            record = ChunkRecord.model_validate(item)
            entry = record.spend.get(str(fence))
            # what someone who ended the fence already added of its running spend is not added again
            added = stats.minus(entry) if entry is not None and entry.folded else stats
            parts, values, names = stats_expr(added)
            names.update({"#fo": FENCED_OUT, "#c": COUNTED})
            values.update({":f": fence, ":fs": {fence}})
            counted = record.counted
            cond = "NOT contains(#fo, :f) AND " + ("#c = :mark" if counted else "(attribute_not_exists(#c) OR #c = :mark)")
            expr = "SET " + ", ".join(parts) + " ADD #fo :fs"
            if entry is not None:  # its running-spend entry goes: all it spent is on the record now
                names.update({"#sp": SPEND, "#own": str(fence)})
                expr += " REMOVE #sp.#own"
                cond += " AND attribute_exists(#sp.#own)" + ("" if entry.folded else " AND attribute_not_exists(#sp.#own.folded)")
            else:
                names["#sp"] = SPEND
                cond += " AND attribute_not_exists(#sp.#own)"
                names["#own"] = str(fence)
            chunk = {"TableName": self.claims.name, "Key": serialize(key), "UpdateExpression": expr,
                     "ConditionExpression": cond, "ExpressionAttributeNames": names,
                     "ExpressionAttributeValues": serialize({**values, ":mark": counted})}
            adds, job_values = _usage_adds(added)
            try:
                if counted and adds:  # counted: its usage is on the job, so what is added to it goes there too
                    self.jobs.client.transact_write_items(TransactItems=[{"Update": chunk}, {"Update": {
                        "TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
                        "UpdateExpression": "ADD " + ", ".join(adds), "ConditionExpression": "attribute_exists(job_id)",
                        "ExpressionAttributeValues": serialize(job_values)}}])
                else:
                    self.claims.client.update_item(**chunk)
                return True
            except ClientError as exc:  # counted or uncounted, or its entry folded, meanwhile: read again
                if not is_conditional_failure(exc):
                    raise
        raise RuntimeError(f"chunk {job_id}/{chunk_id}: its counted mark kept changing ({SETTLE_ATTEMPTS} attempts)")

    def mark_on_demand(self, job_id: str) -> bool:
        return self.jobs.update_if({"job_id": job_id}, UpdateExpression="SET #d = :now",
                                   ConditionExpression="attribute_exists(job_id) AND attribute_not_exists(#d)",
                                   ExpressionAttributeNames={"#d": "on_demand_since"},
                                   ExpressionAttributeValues=serialize({":now": self.clock()})) is not None

    def record_side_effect(self, job_id: str, effect: SideEffectDone) -> Job | None:
        """Read, replace the step's entry, write back conditional on the list's own revision
        (`side_effects_rev`, not the job's `version`): concurrent writers retry, none is lost."""
        for _ in range(10):
            item = self.jobs.get({"job_id": job_id})
            if item is None:
                return None
            job = Job.model_validate(item)
            rev = int(item.get("side_effects_rev", 0))
            effects = list(job.side_effects)
            at = next((i for i, e in enumerate(effects) if e.step == effect.step), None)
            if at is None:
                effects.append(effect)
            else:
                effects[at] = effect
            cond = "attribute_not_exists(#r)" if rev == 0 else "#r = :r"
            updated = self.jobs.update_if(
                {"job_id": job_id}, UpdateExpression="SET #fx = :fx, #r = :next",
                ConditionExpression=f"attribute_exists(job_id) AND {cond}",
                ExpressionAttributeNames={"#fx": "side_effects", "#r": "side_effects_rev"},
                ExpressionAttributeValues=serialize({":fx": [e.model_dump(mode="json", exclude_none=True)
                                                             for e in effects], ":next": rev + 1,
                                                     **({":r": rev} if rev else {})}))
            if updated is not None:
                return Job.model_validate(updated)
        raise RuntimeError(f"job {job_id}: its side effects kept changing")

    # ---------------------------------------------------------------- events
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
        adds, values = _usage_adds(usage)
        return self._append(job_id, "batch.unused", detail, also={
            "TableName": self.jobs.name, "Key": serialize({"job_id": job_id}),
            "UpdateExpression": "ADD " + ", ".join([*adds, "#bu :tokens"]),
            "ConditionExpression": "attribute_exists(job_id) AND NOT contains(#bu, :token)",
            "ExpressionAttributeNames": {"#bu": "batch_unused"},
            "ExpressionAttributeValues": serialize({**values, ":tokens": {token}, ":token": token})})

    def _append(self, job_id: str, kind: str, detail: Mapping[str, object],
                also: dict[str, Any] | None = None) -> int:
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
        kwargs: dict[str, Any] = {"KeyConditionExpression": "job_id = :j AND seq > :after", "ConsistentRead": True,
                                  "ExpressionAttributeValues": serialize({":j": job_id, ":after": event_seq(after)})}
        found: list[JobEvent] = []
        for item in self.events_table.pages("query", **kwargs, **({"Limit": limit} if limit is not None else {})):
            found.append(JobEvent.model_validate(item))
            if limit is not None and len(found) >= limit:
                break
        return found
