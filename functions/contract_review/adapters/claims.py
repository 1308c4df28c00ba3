"""The claims table (one record per chunk: lease, fencing token, counters) and the checkpoints
table (`ClaimsRepo`).

Checkpoints are write-then-commit: the analysts that finish together (the worker's group commit) are
written as one checkpoint item, under a sort key that starts with the writer's fencing token
(`000007#liability`: the fence, then the group's first analyst), then committed by one fenced update of
the chunk record's `checkpoints` map (analyst -> fence): two writes for the whole group. A zombie can
leave orphan items behind, never a committed one. (No transactions: a single-item condition is the
whole fence.) Loading reads the items of each committed fence (one Query per fence, usually one) and
takes each committed analyst's output from them: an analyst runs once per attempt, so it is in one
item of its fence. (The sort key attribute is still named `analyst`: the table is not replaced.)

Running spend: each heartbeat and checkpoint commit of an attempt also sets `spend.<fence>` (what the attempt has
spent so far, set, not added: a retried write changes nothing). The write that ends the fence either adds all the
attempt spent and drops the entry (its owner), or, when someone else ends it (the sweeper, a later claim, a cancel),
adds the entries nobody has added yet and marks them `folded`, conditional on them still being unfolded: once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from contract_review.domain.chunk_records import (
    Checkpoint,
    CheckpointWrite,
    ChunkOutcome,
    ChunkRecord,
    ClaimResult,
    ReleaseReason,
    Spent,
)
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import checkpoint_key
from contract_review.domain.ports import Artifacts, Clock
from contract_review.domain.records import USAGE_FIELDS, AttemptStats, ChunkStatus

from .dynamo import Table, Values, deserialize, is_conditional_failure, model_values, old_item, serialize, to_item

OPEN = "open"  # value of the sparse `lease_bucket` attribute while a chunk is claimed
LEASE_INDEX = "by-lease"  # infra/tables.py: CLAIMS_LEASE_INDEX
_LEASE_ATTRS = "claimed_by, claim_expires_at, lease_bucket, deadline_at"


def _key(job_id: str, chunk_id: str) -> dict[str, str]:
    return {"job_id": job_id, "chunk_id": chunk_id}


def stats_expr(stats: AttemptStats) -> tuple[list[str], Values, dict[str, str]]:
    parts = ["n_calls = if_not_exists(n_calls, :z) + :calls", "repairs = if_not_exists(repairs, :z) + :rep"]
    values: Values = {":z": 0, ":calls": stats.calls, ":rep": stats.repairs}
    names: dict[str, str] = {}
    for i, (code, n) in enumerate(sorted(stats.retries.items())):
        names[f"#rc{i}"] = code
        values[f":rc{i}"] = n
        parts.append(f"retries.#rc{i} = if_not_exists(retries.#rc{i}, :z) + :rc{i}")
    for f in USAGE_FIELDS:  # the attempt's tokens, requests and their cost (cost.py), added to the chunk's
        if getattr(stats, f):
            values[f":u_{f}"] = getattr(stats, f)
            parts.append(f"{f} = if_not_exists({f}, :z) + :u_{f}")
    return parts, values, names


SPEND = "spend"  # the running spend of its attempts, by fence (records.Spent)
# the fences whose attempt's whole spend is on the record: added by the owner's own ending write, or by
# `JobsRepo.add_fenced_out` for an attempt fenced out (which adds nothing for a fence already here)
FENCED_OUT = "fenced_out"
FOLD_ATTEMPTS = 5  # a fold that lost to a fenced-out attempt adding its own spend is read and tried again


def spent_value(stats: AttemptStats) -> Values:
    """An attempt's running spend as a map entry (only what is not zero)."""
    return stats.model_dump(mode="json", exclude_defaults=True)


def fold_expr(fold: Mapping[str, Spent], stats: AttemptStats
              ) -> tuple[AttemptStats, list[str], str, Values, dict[str, str]]:
    """Fold the entries of `fold` (as read) nobody has added yet into `stats`: the total to add, the SET clauses
    marking them folded, the condition that they still are not, and their values and names."""
    parts: list[str] = []
    conds: list[str] = []
    names: dict[str, str] = {}
    for i, (fence, entry) in enumerate(sorted(fold.items())):
        if entry.folded:
            continue
        stats = stats.plus(entry)
        names.update({"#sp": SPEND, f"#sf{i}": fence})
        parts.append(f"#sp.#sf{i}.folded = :folded")
        conds.append(f"attribute_exists(#sp.#sf{i}) AND attribute_not_exists(#sp.#sf{i}.folded)")
    return stats, parts, " AND ".join(conds), ({":folded": True} if parts else {}), names


def _awaiting_batch(fence: int, token: str | None, values: Values, placeholder: str) -> str:
    """The condition of a batch update: the chunk awaits a batch under `fence` with batch token `token` (None: not
    packed yet); its values added to `values`."""
    values.update({":awaiting": ChunkStatus.AWAITING_BATCH.value, ":fence": fence})
    if token is None:
        return "fence = :fence AND #st = :awaiting AND attribute_not_exists(batch_token)"
    values[placeholder] = token
    return f"fence = :fence AND #st = :awaiting AND batch_token = {placeholder}"


def _owner_add(fold: Mapping[str, Spent] | None) -> str:
    """The owner's ending write (`fold` None) marks its fence's spend as on the record (`_ending`'s `:own_fo`)."""
    return " ADD #fo :own_fo" if fold is None else ""


class DynamoClaims:
    def __init__(self, client: Any, claims_table: str, checkpoints_table: str, artifacts: Artifacts,
                 ttl_s: int, inline_max_bytes: int, clock: Clock):
        self.claims = Table(client, claims_table)
        self.cps = Table(client, checkpoints_table)
        self.artifacts = artifacts
        self.ttl_s = ttl_s
        self.inline_max_bytes = inline_max_bytes
        self.clock = clock

    # ---------------------------------------------------------------- records
    def create(self, record: ChunkRecord) -> bool:
        record = record.model_copy(update={"expires_at": int(self.clock()) + self.ttl_s})
        # (`counted` and `event_owed` are written only by the job's settle: adapters/job_counts.py settle_new_chunk)
        created, _ = self.claims.put_if(to_item(record, exclude={"counted", "event_owed"}),
                                        "attribute_not_exists(chunk_id)")
        return created

    def get(self, job_id: str, chunk_id: str) -> ChunkRecord | None:
        item = self.claims.get(_key(job_id, chunk_id))
        return ChunkRecord.model_validate(item) if item else None

    def for_job(self, job_id: str) -> list[ChunkRecord]:
        items = self.claims.pages("query", KeyConditionExpression="job_id = :j",
                                  ExpressionAttributeValues=serialize({":j": job_id}), ConsistentRead=True)
        return sorted((ChunkRecord.model_validate(i) for i in items), key=lambda c: c.chunk_index)

    def lapsed(self, now: float) -> Iterator[ChunkRecord]:
        for item in self.claims.pages("query", IndexName=LEASE_INDEX,
                                      KeyConditionExpression="lease_bucket = :open AND claim_expires_at < :now",
                                      ExpressionAttributeValues=serialize({":open": OPEN, ":now": now})):
            yield ChunkRecord.model_validate(item)

    # ---------------------------------------------------------------- leases
    def claim(self, job_id: str, chunk_id: str, owner: str, lease_s: float, receive_count: int,
              deadline_at: float | None = None) -> ClaimResult:
        """One conditional update: take the lease if free or lapsed, bump the fencing token."""
        now = self.clock()
        values: Values = {
            ":me": owner, ":exp": now + lease_s, ":open": OPEN, ":claimed": ChunkStatus.CLAIMED.value,
            ":pending": ChunkStatus.PENDING.value, ":zero": 0, ":one": 1, ":now": now, ":rc": receive_count}
        deadline = ", deadline_at = :dl " if deadline_at is not None else " "
        if deadline_at is not None:
            values[":dl"] = deadline_at
        try:
            r = self.claims.client.update_item(
                TableName=self.claims.name, Key=serialize(_key(job_id, chunk_id)),
                UpdateExpression=("SET claimed_by = :me, claim_expires_at = :exp, lease_bucket = :open, #st = :claimed, "
                                  "fence = if_not_exists(fence, :zero) + :one, claimed_at = :now, "
                                  "receives = if_not_exists(receives, :zero) + :one, last_receive_count = :rc, "
                                  "#sp = if_not_exists(#sp, :nospend)"
                                  + deadline
                                  + ("ADD redeliveries :one " if receive_count > 1 else "")
                                  + ("REMOVE deadline_at" if deadline_at is None else "")),
                ConditionExpression=("attribute_exists(chunk_id) AND #st IN (:pending, :claimed) AND "
                                     "(attribute_not_exists(claimed_by) OR claim_expires_at < :now)"),
                ExpressionAttributeNames={"#st": "status", "#sp": SPEND},
                ExpressionAttributeValues=serialize({**values, ":nospend": {}}),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as exc:
            if not is_conditional_failure(exc):
                raise
            old = old_item(exc)
            return ClaimResult(won=False, fence=0, record=ChunkRecord.model_validate(old) if old else None)
        record = self._fold_ended(ChunkRecord.model_validate(deserialize(r["Attributes"])))
        return ClaimResult(won=True, fence=record.fence, record=record)

    def _fold_ended(self, record: ChunkRecord) -> ChunkRecord:
        """This claim ended the fences before it: the running spend of those whose attempts died without anyone
        adding it (a lease taken over before the sweeper saw it lapse) goes into the totals now, once."""
        for _ in range(FOLD_ATTEMPTS):
            fold = record.unfolded(below=record.fence)
            if not fold:
                return record
            stats, parts, cond, values, names = fold_expr(fold, AttemptStats())
            adds, add_values, add_names = stats_expr(stats)
            item = self.claims.update_if(
                _key(record.job_id, record.chunk_id), UpdateExpression="SET " + ", ".join(adds + parts),
                ConditionExpression=cond, ExpressionAttributeNames={**names, **add_names},
                ExpressionAttributeValues=serialize({**values, **add_values}))
            if item is not None:
                return ChunkRecord.model_validate(item)
            record = self.get(record.job_id, record.chunk_id) or record  # a fenced-out owner added its own: again
        raise RuntimeError(f"chunk {record.job_id}/{record.chunk_id}: its running spend kept changing")

    def _fenced_update(self, job_id: str, chunk_id: str, fence: int, expr: str, values: Values,
                       names: dict[str, str] | None = None,
                       states: Collection[ChunkStatus] = (ChunkStatus.CLAIMED,),
                       lapsed_before: float | None = None, also: str = "") -> ChunkRecord | None:
        """An update that applies only while `fence` is current and the chunk is in `states`
        (and, for the sweeper, only while the lease is still lapsed at `lapsed_before`; and `also`)."""
        names = {**(names or {}), "#st": "status"}
        state_values: Values = {f":fs{i}": st.value for i, st in enumerate(states)}
        cond = "fence = :fence AND #st IN (" + ", ".join(state_values) + ")" + (f" AND {also}" if also else "")
        if lapsed_before is not None:  # a heartbeat that landed since the sweeper's read wins
            cond += " AND (attribute_not_exists(claim_expires_at) OR claim_expires_at < :lapsed)"
            state_values[":lapsed"] = lapsed_before
        item = self.claims.update_if(
            _key(job_id, chunk_id), UpdateExpression=expr, ConditionExpression=cond, ExpressionAttributeNames=names,
            ExpressionAttributeValues=serialize({**values, **state_values, ":fence": fence}))
        return ChunkRecord.model_validate(item) if item else None

    def heartbeat(self, job_id: str, chunk_id: str, fence: int, lease_s: float,
                  spent: AttemptStats | None = None) -> float | None:
        until = self.clock() + lease_s
        expr = "SET claim_expires_at = :exp"
        values: Values = {":exp": until}
        names: dict[str, str] = {}
        if spent is not None:
            expr += ", #sp.#own = :spent"
            values[":spent"] = spent_value(spent)
            names = {"#sp": SPEND, "#own": str(fence)}
        done = self._fenced_update(job_id, chunk_id, fence, expr, values, names)
        return until if done is not None else None

    def _ending(self, fence: int, stats: AttemptStats, fold: Mapping[str, Spent] | None
                ) -> tuple[list[str], Values, dict[str, str], str, str]:
        """What a write that ends `fence` adds (stats_expr's clauses), and how it treats the running spend: its owner
        (`fold` None) drops its own entry (`stats` is all it spent); anyone else folds in the entries it read. The SET
        clauses, values, names, a REMOVE clause and a condition."""
        if fold is None:  # (its fence marked as added: a retry of this write that fails adds nothing fenced out)
            parts, values, names = stats_expr(stats)
            return parts, {**values, ":own_fo": {fence}}, {**names, "#sp": SPEND, "#own": str(fence),
                                                           "#fo": FENCED_OUT}, "#sp.#own", ""
        total, marks, cond, mark_values, mark_names = fold_expr(fold, stats)
        parts, values, names = stats_expr(total)
        return parts + marks, {**values, **mark_values}, {**names, **mark_names}, "", cond

    def release(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, error: ErrorEnvelope | None,
                *, failure: bool, lapsed_before: float | None = None,
                reason: ReleaseReason = ReleaseReason.RETRY,
                fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        parts, values, names, drop, also = self._ending(fence, stats, fold)
        parts += ["#st = :pending", "release_reason = :reason", "released_at = :now"]
        values.update({":pending": ChunkStatus.PENDING.value, ":reason": reason.value, ":now": self.clock()})
        if reason.sends_message:  # a fresh message follows the release: the record says when it was sent
            parts.append("message_sent_at = :now")
        if reason is ReleaseReason.BACKPRESSURE:  # the streak starts now unless one is running
            parts += ["backpressure_since = if_not_exists(backpressure_since, :now)",
                      "backpressure_requeues = if_not_exists(backpressure_requeues, :z) + :one"]
            values[":one"] = 1
        removed = _LEASE_ATTRS + (f", {drop}" if drop else "")
        if reason is ReleaseReason.HELD:  # a hold is outside the streak: it ends it (the deadline counts after it)
            parts.append("backpressure_requeues = :z")
            removed += ", backpressure_since"
        if error is not None:
            parts.append("last_error = :err")
            values[":err"] = error.model_dump(mode="json")
        if failure:
            parts.append("failures = if_not_exists(failures, :z) + :one")
            values[":one"] = 1
        expr = "SET " + ", ".join(parts) + " REMOVE " + removed + _owner_add(fold)
        return self._fenced_update(job_id, chunk_id, fence, expr, values, names, lapsed_before=lapsed_before,
                                   also=also)

    def finish(self, job_id: str, chunk_id: str, fence: int, status: ChunkStatus, stats: AttemptStats, *,
               outcome: ChunkOutcome | None = None, error: ErrorEnvelope | None = None,
               states: Collection[ChunkStatus] = (ChunkStatus.CLAIMED,),
               lapsed_before: float | None = None, fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        parts, values, names, drop, also = self._ending(fence, stats, fold)
        parts += ["#st = :status", "settled_at = :now"]
        values.update({":status": status.value, ":now": self.clock()})
        for i, (k, v) in enumerate(model_values(outcome).items() if outcome else ()):
            names[f"#x{i}"] = k
            values[f":x{i}"] = v
            parts.append(f"#x{i} = :x{i}")
        if error is not None:
            parts.append("last_error = :err")
            values[":err"] = error.model_dump(mode="json")
        if status is ChunkStatus.DEAD_LETTERED:
            parts.append("failures = if_not_exists(failures, :z) + :one")
            values[":one"] = 1
        expr = "SET " + ", ".join(parts) + " REMOVE " + _LEASE_ATTRS + (f", {drop}" if drop else "") + _owner_add(fold)
        return self._fenced_update(job_id, chunk_id, fence, expr, values, names, states, lapsed_before, also)

    # ---------------------------------------------------------------- batch inference (pipeline/batch_inference.py)
    def await_batch(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, pending_key: str,
                    records: int) -> ChunkRecord | None:
        parts, values, names, drop, _ = self._ending(fence, stats, None)
        parts += ["#st = :awaiting", "batch_pending_key = :key", "batch_records = :n", "batch_since = :now",
                  "released_at = :now"]
        values.update({":awaiting": ChunkStatus.AWAITING_BATCH.value, ":key": pending_key, ":n": records,
                       ":now": self.clock()})
        expr = "SET " + ", ".join(parts) + " REMOVE " + _LEASE_ATTRS + ", batch_token, " + drop + _owner_add(None)
        return self._fenced_update(job_id, chunk_id, fence, expr, values, names)

    def assign_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None,
                     expected: str | None) -> ChunkRecord | None:
        values: Values = {}
        cond = _awaiting_batch(fence, expected, values, ":expected")
        if token is None:
            expr = "REMOVE batch_token"
        else:
            expr = "SET batch_token = :token"
            values[":token"] = token
        item = self.claims.update_if(_key(job_id, chunk_id), UpdateExpression=expr, ConditionExpression=cond,
                                     ExpressionAttributeNames={"#st": "status"},
                                     ExpressionAttributeValues=serialize(values))
        return ChunkRecord.model_validate(item) if item else None

    def return_from_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None, *, stats: AttemptStats,
                          answer_key: str | None = None, failed: bool = False, on_demand: str | None = None,
                          error: ErrorEnvelope | None = None) -> ChunkRecord | None:
        parts, values, names = stats_expr(stats)
        now = self.clock()
        # its message is due, not sent: `message_sent_at` is removed, and set when the collector has sent it
        parts += ["#st = :pending", "release_reason = :reason", "released_at = :now"]
        values.update({":pending": ChunkStatus.PENDING.value, ":reason": ReleaseReason.BATCH.value, ":now": now})
        if answer_key is not None:
            parts.append("batch_answer_keys = list_append(if_not_exists(batch_answer_keys, :empty), :answer)")
            values.update({":empty": [], ":answer": [answer_key]})
        if failed:
            parts.append("batch_failures = if_not_exists(batch_failures, :z) + :one")
            values[":one"] = 1
        if on_demand is not None:
            parts.append("batch_on_demand = :od")
            values[":od"] = on_demand
        if error is not None:
            parts.append("last_error = :err")
            values[":err"] = error.model_dump(mode="json")
        cond = _awaiting_batch(fence, token, values, ":token")
        item = self.claims.update_if(
            _key(job_id, chunk_id),
            UpdateExpression="SET " + ", ".join(parts)
                             + " REMOVE batch_token, batch_pending_key, batch_since, message_sent_at",
            ConditionExpression=cond, ExpressionAttributeNames={**names, "#st": "status"},
            ExpressionAttributeValues=serialize(values))
        return ChunkRecord.model_validate(item) if item else None

    def reset_for_redrive(self, job_id: str, chunk_id: str, forget: Collection[str] = ()) -> ChunkRecord | None:
        names = {"#st": "status", **{f"#fg{i}": a for i, a in enumerate(sorted(forget))}}
        dropped = "".join(f", checkpoints.#fg{i}" for i in range(len(forget)))
        values: Values = {":pending": ChunkStatus.PENDING.value, ":z": 0, ":one": 1, ":now": self.clock(),
                                  ":dead": ChunkStatus.DEAD_LETTERED.value, ":failed": ChunkStatus.FAILED.value,
                                  ":cancelled": ChunkStatus.CANCELLED.value}
        states = ":dead, :failed, :cancelled"  # a cancelled chunk too: `review retry` of a cancelled job
        if forget:  # a done chunk whose analysts are to run again
            values[":done"] = ChunkStatus.DONE.value
            states += ", :done"
        item = self.claims.update_if(
            _key(job_id, chunk_id),
            # the fence moves on, so nothing still holding the old token (a sweep in flight) can settle it
            UpdateExpression="SET #st = :pending, failures = :z, redriven = if_not_exists(redriven, :z) + :one, "
                             "fence = fence + :one, redriven_at = :now, message_sent_at = :now, "
                             "backpressure_requeues = :z "
                             f"REMOVE {_LEASE_ATTRS}, settled_at, backpressure_since{dropped}",
            ConditionExpression=f"#st IN ({states})", ExpressionAttributeNames=names,
            ExpressionAttributeValues=serialize(values))
        return ChunkRecord.model_validate(item) if item else None

    def message_sent(self, job_id: str, chunk_id: str, fence: int) -> ChunkRecord | None:
        values: Values = {":now": self.clock(), ":pending": ChunkStatus.PENDING.value, ":fence": fence}
        item = self.claims.update_if(
            _key(job_id, chunk_id), UpdateExpression="SET message_sent_at = :now",
            ConditionExpression="fence = :fence AND #st = :pending AND attribute_not_exists(claimed_by)",
            ExpressionAttributeNames={"#st": "status"}, ExpressionAttributeValues=serialize(values))
        return ChunkRecord.model_validate(item) if item else None

    # ---------------------------------------------------------------- checkpoints
    def checkpoints(self, record: ChunkRecord) -> dict[str, Checkpoint]:
        found: dict[str, Checkpoint] = {}
        for fence in sorted(set(record.checkpoints.values())):
            committed = {a for a, f in record.checkpoints.items() if f == fence}
            for item in self.cps.pages("query", KeyConditionExpression="pk = :pk AND begins_with(analyst, :fence)",
                                       ExpressionAttributeValues=serialize({":pk": f"{record.job_id}#{record.chunk_id}",
                                                                            ":fence": f"{fence:06d}#"}),
                                       ConsistentRead=True):
                for analyst, saved in item.get("outputs", {}).items():
                    if analyst in committed:
                        found[analyst] = Checkpoint.model_validate({
                            **saved, "job_id": record.job_id, "chunk_id": record.chunk_id, "analyst": analyst,
                            "fence": fence})
        return found

    def put_checkpoints(self, job_id: str, chunk_id: str, fence: int, writes: Sequence[CheckpointWrite],
                        lease_s: float | None = None, spent: AttemptStats | None = None) -> float | None:
        now = self.clock()  # the lease is counted from here, before the outputs' writes
        if not writes:
            current = self.get(job_id, chunk_id)
            return (current.claim_expires_at or now) if current is not None else None
        outputs: Values = {}
        for w in writes:
            saved: Values = {"config_hash": w.config_hash, "status": w.status, "created_at": now}
            if len(w.output_json.encode()) > self.inline_max_bytes:
                key = checkpoint_key(job_id, chunk_id, w.analyst, fence)
                self.artifacts.put_text(key, w.output_json)
                saved["output_key"] = key
            else:
                saved["output"] = w.output_json
            outputs[w.analyst] = saved
        self.cps.client.put_item(TableName=self.cps.name, Item=serialize({
            "pk": f"{job_id}#{chunk_id}", "analyst": f"{fence:06d}#{writes[0].analyst}", "fence": fence,
            "outputs": outputs, "expires_at": int(now) + self.ttl_s}))
        # progress: the commit also ends the chunk's backpressure streak (and is a heartbeat, with lease_s)
        commits = ", ".join(f"checkpoints.#a{i} = :f" for i in range(len(writes)))
        values: Values = {":f": fence, ":z": 0}
        if lease_s is not None:
            commits += ", claim_expires_at = :exp"
            values[":exp"] = now + lease_s
        names = {f"#a{i}": w.analyst for i, w in enumerate(writes)}
        if spent is not None:  # the attempt's running spend rides on the commit
            commits += ", #sp.#own = :spent"
            values[":spent"] = spent_value(spent)
            names.update({"#sp": SPEND, "#own": str(fence)})
        done = self._fenced_update(job_id, chunk_id, fence,
                                   f"SET {commits}, backpressure_requeues = :z REMOVE backpressure_since", values,
                                   names)
        return (done.claim_expires_at or now) if done is not None else None

    def checkpoint_output(self, checkpoint: Checkpoint) -> str:
        if checkpoint.output is not None:
            return checkpoint.output
        if checkpoint.output_key is None:
            raise ValueError("checkpoint has neither an inline output nor an output key")
        return self.artifacts.get_text(checkpoint.output_key)
