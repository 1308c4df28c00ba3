"""The counts on a job (`DynamoJobCounts`): its chunks counted settled (each chunk record's `counted` mark and the job's
`settled_count`, written in one transaction, the usage counted with it added to the job's), taken off again, and
rebuilt when an ended job reopens (`mark_counted`); what fenced-out attempts spent; its requeues and its fan-out
cursor. The chunk record's mark lives in the claims table, the count on the job item (job_tables.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from botocore.exceptions import ClientError

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.records import USAGE_FIELDS, AttemptStats, ChunkStatus, Job, Usage

from .claims import FENCED_OUT, SPEND, stats_expr
from .dynamo import TransactItem, Values, deserialize, is_conditional_failure, serialize, transact
from .job_tables import COUNTED, EVENT_OWED, LEGACY_SETTLED, JobTables, usage_adds

MARKS_PER_TRANSACTION = 99  # TransactWriteItems takes 100 items: the job's check and 99 chunk records
SETTLE_ATTEMPTS = 20  # a settle's transaction cancelled by a concurrent one on the same items (not a condition) is retried


def _usage_is(read: Usage | None) -> tuple[str, dict[str, str], Values]:
    """A condition (" AND ...") that a chunk record's usage is still `read` (what the settle adds to its job): an
    attempt fenced out since the read added to it. Empty for None."""
    if read is None:
        return "", {}, {}
    conds: list[str] = []
    names: dict[str, str] = {}
    values: Values = {}
    for f in USAGE_FIELDS:
        names[f"#r_{f}"], values[f":r_{f}"] = f, getattr(read, f)
        conds.append(f"#r_{f} = :r_{f}" if getattr(read, f) else f"(attribute_not_exists(#r_{f}) OR #r_{f} = :r_{f})")
    return " AND " + " AND ".join(conds), names, values



def _transact(tables: JobTables, items: list[TransactItem]) -> list[str] | None:
    """Write `items` in one transaction (dynamo.transact): None when written, else each item's cancellation
    reason."""
    return transact(tables.jobs.client, items, SETTLE_ATTEMPTS, "settling a chunk")



def mark_counted(tables: JobTables, job_id: str, counted: Collection[str],
                 guard: tuple[str, dict[str, str], Values]) -> int | None:
    """A reopened job's counted chunks rebuilt: each chunk record marked exactly when its id is in `counted`
    (only the records whose mark differs are written); the number marked. Each write is in a transaction with
    a check of the job's own condition (`guard`: the transition's): once another transition has won (a second
    retry of the same ended job), this writes nothing more and returns None, so it never unmarks a chunk
    counted since under the winner (a mark taken off while the count kept it, and the
    chunk counted twice). Up to MARKS_PER_TRANSACTION marks a transaction."""
    cond, names, values = guard
    check: TransactItem = {"ConditionCheck": {"TableName": tables.jobs.name, "Key": serialize({"job_id": job_id}),
                                "ConditionExpression": cond, "ExpressionAttributeNames": names,
                                "ExpressionAttributeValues": serialize(values)}}
    n, writes = 0, list[TransactItem]()
    for item in tables.claims.pages("query", KeyConditionExpression="job_id = :j",
                                  ProjectionExpression="chunk_id, #c", ExpressionAttributeNames={"#c": COUNTED},
                                  ExpressionAttributeValues=serialize({":j": job_id}), ConsistentRead=True):
        want = item["chunk_id"] in counted
        n += want
        if want == bool(item.get(COUNTED)):
            continue
        writes.append({"Update": {
            "TableName": tables.claims.name, "Key": serialize({"job_id": job_id, "chunk_id": item["chunk_id"]}),
            "UpdateExpression": "SET #c = :t" if want else "REMOVE #c",
            "ConditionExpression": "attribute_exists(chunk_id)", "ExpressionAttributeNames": {"#c": COUNTED},
            **({"ExpressionAttributeValues": serialize({":t": True})} if want else {})}})
    for i in range(0, len(writes), MARKS_PER_TRANSACTION):
        batch = writes[i:i + MARKS_PER_TRANSACTION]
        while batch:
            failed = _transact(tables, [check, *batch])
            if failed is None:
                break
            if failed[0] == "ConditionalCheckFailed":
                return None  # the job is no longer as its caller read it
            # a chunk record gone meanwhile (its TTL): nothing to mark on it; the others again
            batch = [w for w, code in zip(batch, failed[1:], strict=True) if code != "ConditionalCheckFailed"]
    return n


class DynamoJobCounts(JobTables):
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
        adds, values = usage_adds(usage)
        values = {**values, ":one": 1, ":now": self.clock(), ":cid": chunk_id}
        chunk_cond = "attribute_exists(chunk_id) AND (attribute_not_exists(#c) OR #c = :f)"
        chunk_names: dict[str, str] = {"#c": COUNTED}
        chunk_values: Values = {":t": True, ":f": False}
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
        items: list[TransactItem] = [  # the mark, and the chunk's `chunk.settled` event owed (`record_owed_event` writes it, once)
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
        if _transact(self, items) is not None:
            return None
        return self.get(job_id)

    def unsettle_chunks(self, job_id: str, usage_by_chunk: Mapping[str, Usage]) -> Job | None:
        for chunk_id, usage in usage_by_chunk.items():
            adds, values = usage_adds(usage.scaled(-1))
            if _transact(self, [  # counted: the mark off, and the count and its usage off the job, together
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
            adds, job_values = usage_adds(added)
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

