"""The job records of the jobs table (`DynamoJobRecords`): a job's creation (and replacement), its state transitions,
what it waits for, and its side effects; and the reads of the sparse open-jobs index (`DynamoOpenJobs`). Every write is
conditional (the state, the version, a revision) as it was when one class held the whole table (job_tables.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Iterator

from pydantic import BaseModel

from contract_review.domain.errors import ReviewError
from contract_review.domain.records import OUTCOME_FIELDS, Job, JobState, SideEffectDone, Waiting

from .dynamo import Item, PlainItem, Values, deserialize, model_values, serialize, set_clause, to_item
from .job_counts import mark_counted
from .job_tables import LEGACY_SETTLED, OPEN_INDEX, OPEN_STATE, JobTables, open_state

LIST_FIELDS = ("job_id, #s, created_at, updated_at, idempotency_key, chunk_count, document_id, error_code, "
               "principal")  # principal: the status page acting as one lists that principal's jobs only
# `running_brief`: what says whether a running job's chunks are open and who for (Job's required fields too)
BRIEF_NAMES = {"#s": "state", "#st": "settled", "#w": "waiting"}
BRIEF_FIELDS = ("job_id, #s, created_at, updated_at, idempotency_key, priority, chunk_count, settled_count, #st, "
                "#w, inference, on_demand_since")
BATCH_GET_KEYS = 100  # BatchGetItem's most keys per request
BATCH_GET_ATTEMPTS = 5


class DynamoJobRecords(JobTables):
    @staticmethod
    def _item(job: Job) -> Item:
        item = to_item(job)
        if (state := open_state(job.state)) is not None:
            item[OPEN_STATE] = {"S": state}
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

    def all(self) -> list[Job]:
        items = self.jobs.pages("scan", ProjectionExpression=LIST_FIELDS, ExpressionAttributeNames={"#s": "state"})
        return sorted((Job.model_validate(i) for i in items), key=lambda j: j.created_at)

    def touch(self, job_id: str) -> None:
        self.jobs.client.update_item(TableName=self.jobs.name, Key=serialize({"job_id": job_id}),
                                     UpdateExpression="SET updated_at = :now",
                                     ExpressionAttributeValues=serialize({":now": self.clock()}))


    def transition(self, job_id: str, from_states: Collection[JobState], to: JobState, *,
                   started_at: float | None = None, outcome: BaseModel | None = None,
                   settled: set[str] | None = None, if_settled_version: int | None = None,
                   if_version: int | None = None) -> Job | None:
        names: dict[str, str] = {"#state": "state"}
        conds: Values = {f":from{i}": s.value for i, s in enumerate(from_states)}
        cond = f"#state IN ({', '.join(conds)})"
        if if_settled_version is not None:  # no chunk was uncounted since the caller's read
            names["#sv"] = "settled_version"
            conds[":sv"] = if_settled_version
            cond += " AND (#sv = :sv" + (" OR attribute_not_exists(#sv))" if if_settled_version == 0 else ")")
        if if_version is not None:  # nothing else changed the job's state since the caller's read
            names["#v"] = "version"
            conds[":v"] = if_version
            cond += " AND (#v = :v" + (" OR attribute_not_exists(#v))" if if_version == 0 else ")")
        fields: Values = model_values(outcome) if outcome is not None else {}
        if started_at is not None:
            fields["started_at"] = started_at
        remove: list[str] = []
        if settled is not None:  # what is counted is rebuilt: the records' marks first, each under the job's condition
            marked = mark_counted(self, job_id, settled, (cond, names, conds))
            if marked is None:
                return None  # the job changed meanwhile (another retry won): nothing more is written
            remove += [f for f in OUTCOME_FIELDS if f not in fields]
            fields["settled_count"] = marked
            remove.append(LEGACY_SETTLED)
        fields.update({"state": to.value, "updated_at": self.clock()})
        if (state := open_state(to)) is not None:  # in the open-jobs index while open, out once ended
            fields[OPEN_STATE] = state
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

    def mark_on_demand(self, job_id: str) -> bool:
        return self.jobs.update_if({"job_id": job_id}, UpdateExpression="SET #d = :now",
                                   ConditionExpression="attribute_exists(job_id) AND attribute_not_exists(#d)",
                                   ExpressionAttributeNames={"#d": "on_demand_since"},
                                   ExpressionAttributeValues=serialize({":now": self.clock()})) is not None

    def switch_model(self, job_id: str, from_model: str, to_model: str) -> bool:
        return self.jobs.update_if(
            {"job_id": job_id},
            UpdateExpression="SET #m = :to, #e = list_append(if_not_exists(#e, :none), :from)",
            ConditionExpression="attribute_exists(job_id) AND #m = :was",
            ExpressionAttributeNames={"#m": "model_id", "#e": "earlier_models"},
            ExpressionAttributeValues=serialize({":to": to_model, ":was": from_model, ":from": [from_model],
                                                 ":none": []})) is not None

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


class DynamoOpenJobs(JobTables):
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
        cond, values = "#o = :state", Values({":state": state.value})
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

    def _batch_get(self, keys: list[dict[str, str]], projection: str) -> Iterator[PlainItem]:
        """BatchGetItem of up to 100 keys; the keys DynamoDB leaves unprocessed (throttling, size) are asked
        again after a short jittered pause, a bounded number of times (then `aws.throttled`)."""
        request = {self.jobs.name: {"Keys": [serialize(k) for k in keys], "ConsistentRead": True,
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

