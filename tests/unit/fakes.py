"""In-memory fakes of the ports (`contract_review.domain.ports`), for unit tests of the use cases.

They keep the semantics the use cases rely on — conditional writes, fencing tokens, lapsed-lease
checks, FIFO dedup ids, DLQ attributes — and nothing else. `tests/integration/test_repositories.py`
runs one contract against these fakes and against the DynamoDB/S3/SQS adapters on moto, so the
two cannot drift apart. `FakeClock` makes time explicit.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from botocore.exceptions import ClientError
from pydantic import BaseModel

from contract_review.adapters.model_control import CONTROL_WRITE_ATTEMPTS, contended
from contract_review.config.profile import get_profile
from contract_review.config.settings import Settings
from contract_review.domain.batch_inference import (
    ENDED_EARLY,
    HAS_OUTPUT,
    MISSING,
    BatchJobState,
    BatchJobStatus,
    BatchRecord,
    RecordOutcome,
)
from contract_review.domain.chunk_records import (
    Checkpoint,
    CheckpointWrite,
    ChunkOutcome,
    ChunkRecord,
    ClaimResult,
    ReleaseReason,
    Spent,
)
from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.keys import checkpoint_key
from contract_review.domain.messages import AnalysisMessage, JobControl, ResultMessage, size_batches
from contract_review.domain.ports import DLQS, Charge, Deps, LedgerWindow, PresignedUpload, Queue, QueueMessage, Taken
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
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel
from review_local.batch_service import offline_answer  # the stand-in's own answering of a record

F = TypeVar("F", bound=Callable[..., Any])
_LOCK = threading.RLock()  # a chunk's analysts run in threads: what they call is atomic, as in DynamoDB


def _atomic(fn: F) -> F:
    @functools.wraps(fn)
    def locked(*args: object, **kwargs: object) -> object:
        with _LOCK:
            return fn(*args, **kwargs)
    return cast(F, locked)


@dataclass
class FakeClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeJobs:
    def __init__(self, clock: FakeClock, ttl_s: int = 86400):
        self.clock, self.ttl_s = clock, ttl_s
        self.items: dict[str, Job] = {}
        self.log: list[JobEvent] = []
        self.counters: dict[str, int] = {}  # each job's event counter (the counter item in the events table)
        # the chunk records a settle marks `counted` (the claims table, written in one transaction with the job)
        self.claims: FakeClaims | None = None

    def create(self, job: Job) -> tuple[Job, bool]:
        old = self.items.get(job.job_id)
        if old is not None and not old.replaceable:
            return old.model_copy(deep=True), False
        job = job.model_copy(update={"expires_at": int(self.clock()) + self.ttl_s}, deep=True)
        if old is not None:  # the replacement of a job failed on its input: its event numbers go on
            job = job.model_copy(update={"version": old.version + 1})
        self.items[job.job_id] = job
        return job.model_copy(deep=True), True

    def get(self, job_id: str) -> Job | None:
        job = self.items.get(job_id)
        return job.model_copy(deep=True) if job else None

    def all(self) -> list[Job]:
        return sorted((j.model_copy(deep=True) for j in self.items.values()), key=lambda j: j.created_at)

    def transition(self, job_id: str, from_states: Collection[JobState], to: JobState, *,
                   started_at: float | None = None, outcome: BaseModel | None = None,
                   settled: set[str] | None = None, if_settled_version: int | None = None,
                   if_version: int | None = None) -> Job | None:
        def holds() -> Job | None:  # the transition's condition, checked by each write that carries it
            job = self.items.get(job_id)
            if job is None or job.state not in from_states:
                return None
            if if_settled_version is not None and job.settled_version != if_settled_version:
                return None
            if if_version is not None and job.version != if_version:
                return None
            return job

        update: dict[str, object] = {}
        if settled is not None:  # as the adapter: the records' marks first, each write checking the job's condition
            marked = 0
            for r in self._records().for_job(job_id):
                want = r.chunk_id in settled
                marked += want
                if want == r.counted:
                    continue
                if holds() is None:
                    return None  # another transition won: nothing more is written
                self._records().items[(job_id, r.chunk_id)] = r.model_copy(update={"counted": want})
            # then the job (its condition checked by its own write): the count set to match, an older job's set gone
            update.update({f: Job.model_fields[f].get_default(call_default_factory=True) for f in OUTCOME_FIELDS})
            update.update({"settled_count": marked, "legacy_settled": set()})
        job = holds()
        if job is None:
            return None
        if outcome is not None:
            update.update({k: getattr(outcome, k) for k in outcome.model_dump(exclude_none=True)})
        if started_at is not None:
            update["started_at"] = started_at
        update.update({"state": to, "updated_at": self.clock(), "version": job.version + 1})
        job = job.model_copy(update=update, deep=True)
        self.items[job_id] = job
        return job.model_copy(deep=True)

    def stalled(self, idle_since: float, state: JobState = JobState.RUNNING) -> Iterator[Job]:
        for job in list(self.items.values()):
            if job.state is state and not state.terminal and job.updated_at < idle_since:  # open jobs only
                yield job.model_copy(deep=True)

    def running(self) -> Iterator[Job]:
        yield from self.stalled(float("inf"))

    def running_brief(self) -> Iterator[Job]:
        yield from self.running()

    def backfill_open_index(self) -> int:
        return 0  # the fake's `stalled` needs no index

    def touch(self, job_id: str) -> None:
        self.items[job_id] = self.items[job_id].model_copy(update={"updated_at": self.clock()})

    def count_requeue(self, job_id: str) -> None:
        job = self.items.get(job_id)
        if job is not None:
            self.items[job_id] = job.model_copy(update={"requeues": job.requeues + 1})

    def advance_fanout(self, job_id: str, from_count: int, to_count: int) -> bool:
        job = self.items.get(job_id)
        if job is None or job.fanned_out != from_count:
            return False
        self.items[job_id] = job.model_copy(update={"fanned_out": to_count})
        return True

    def _records(self) -> FakeClaims:
        assert self.claims is not None, "FakeJobs.claims: the FakeClaims whose records a settle marks"
        return self.claims

    def settle_new_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                         status: ChunkStatus | None = None, read: Usage | None = None) -> Job | None:
        job, record = self.items.get(job_id), self._records().items.get((job_id, chunk_id))
        if job is None or record is None or job.counts(record):  # the transaction's conditions
            return None
        if (fence is not None and record.fence != fence) or (status is not None and record.status is not status):
            return None
        if read is not None and record.usage() != read:  # (and the record's usage is still the one read)
            return None
        self._records().items[(job_id, chunk_id)] = record.model_copy(update={"counted": True, "event_owed": True})
        added = usage or Usage()
        job = job.model_copy(update={"settled_count": job.settled_count + 1, "updated_at": self.clock(),
                                     **{f: getattr(job, f) + getattr(added, f) for f in USAGE_FIELDS}})
        self.items[job_id] = job
        return job.model_copy(deep=True)

    def settle_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                     status: ChunkStatus | None = None) -> Job:
        counted = self.settle_new_chunk(job_id, chunk_id, usage=usage, fence=fence, status=status)
        if counted is not None:
            return counted
        job = self.items[job_id]  # KeyError as DynamoDB's condition `attribute_exists(job_id)` fails
        self.items[job_id] = job.model_copy(update={"updated_at": self.clock()})
        return self.items[job_id].model_copy(deep=True)

    def unsettle_chunks(self, job_id: str, usage_by_chunk: Mapping[str, Usage]) -> Job | None:
        job = self.items.get(job_id)
        if job is None:
            return None
        for chunk_id, usage in usage_by_chunk.items():
            record = self._records().items.get((job_id, chunk_id))
            update: dict[str, object] = {"settled_version": job.settled_version + 1}
            if record is not None and record.counted:  # only what was counted comes off
                self._records().items[(job_id, chunk_id)] = record.model_copy(update={"counted": False})
                update["settled_count"] = job.settled_count - 1
            elif chunk_id in job.legacy_settled:  # a job from before the count: out of its set
                update["legacy_settled"] = job.legacy_settled - {chunk_id}
            else:
                usage = Usage()
            update.update({f: getattr(job, f) - getattr(usage, f) for f in USAGE_FIELDS})
            job = job.model_copy(update=update)
        self.items[job_id] = job
        return job.model_copy(deep=True)

    @_atomic
    def set_waiting(self, job_id: str, waiting: Waiting | None) -> bool:
        job = self.items.get(job_id)
        if job is None or (waiting is None) == (job.waiting is None):
            return False
        self.items[job_id] = job.model_copy(update={"waiting": waiting}, deep=True)
        return True

    @_atomic
    def add_fenced_out(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats) -> bool:
        records = self._records()
        record = records.items.get((job_id, chunk_id))
        if record is None or fence in records.fenced_out.setdefault((job_id, chunk_id), set()):
            return False
        records.fenced_out[(job_id, chunk_id)].add(fence)
        entry = record.spend.get(str(fence))
        added = stats.minus(entry) if entry is not None and entry.folded else stats  # folded: added already
        spend = {k: e for k, e in record.spend.items() if k != str(fence)}  # its entry goes
        records.items[(job_id, chunk_id)] = record.model_copy(
            update={**records._with_stats(record, added), "spend": spend}, deep=True)
        job = self.items.get(job_id)
        if job is not None and record.counted:  # the transaction's second item
            self.items[job_id] = job.model_copy(update={f: getattr(job, f) + getattr(added, f) for f in USAGE_FIELDS})
        return True

    @_atomic
    def switch_model(self, job_id: str, from_model: str, to_model: str) -> bool:
        job = self.items.get(job_id)
        if job is None or job.model_id != from_model:
            return False
        self.items[job_id] = job.model_copy(
            update={"model_id": to_model, "earlier_models": [*job.earlier_models, from_model]}, deep=True)
        return True

    @_atomic
    def mark_on_demand(self, job_id: str) -> bool:
        job = self.items.get(job_id)
        if job is None or job.on_demand_since is not None:
            return False
        self.items[job_id] = job.model_copy(update={"on_demand_since": self.clock()}, deep=True)
        return True

    def record_side_effect(self, job_id: str, effect: SideEffectDone) -> Job | None:
        job = self.items.get(job_id)
        if job is None:
            return None
        effects = [effect if e.step == effect.step else e for e in job.side_effects]
        if effect.step not in {e.step for e in job.side_effects}:
            effects.append(effect)
        self.items[job_id] = job.model_copy(update={"side_effects": effects}, deep=True)
        return self.items[job_id].model_copy(deep=True)

    @_atomic
    def record_event(self, job_id: str, kind: str, **detail: object) -> int:
        job = self.items.get(job_id)
        if job is None:
            return 0
        number = self.counters.get(job_id, job.event_seq) + 1  # the counter item (a legacy job: its event_seq)
        self.counters[job_id] = number
        self.log.append(JobEvent(job_id=job_id, seq=event_seq(number), type=kind, at=self.clock(),
                                 detail=json.loads(json.dumps(detail, default=str))))
        return number

    @_atomic
    def record_owed_event(self, job_id: str, chunk_id: str, kind: str, /, **detail: object) -> int:
        record = self._records().items.get((job_id, chunk_id))
        if record is None or not record.event_owed or job_id not in self.items:  # the transaction's conditions
            return 0
        self._records().items[(job_id, chunk_id)] = record.model_copy(update={"event_owed": False})
        return self.record_event(job_id, kind, **detail)

    @_atomic
    def record_unused(self, job_id: str, token: str, usage: Usage, /, **detail: object) -> int:
        job = self.items.get(job_id)
        if job is None or token in job.batch_unused:  # the transaction's condition, before any write
            return 0
        number = self.record_event(job_id, "batch.unused", **detail)  # (first: one that fails writes nothing)
        self.items[job_id] = job.model_copy(update={"batch_unused": job.batch_unused | {token},
                                                    **{f: getattr(job, f) + getattr(usage, f) for f in USAGE_FIELDS}})
        return number

    def last_event(self, job_id: str) -> JobEvent | None:
        found = self.events(job_id)
        return found[-1] if found else None

    def events(self, job_id: str, after: int = 0, limit: int | None = None) -> list[JobEvent]:
        found = sorted((e for e in self.log if e.job_id == job_id and e.number > after), key=lambda e: e.seq)
        return found if limit is None else found[:limit]

    # test helpers
    def types(self, job_id: str) -> list[str]:
        return [e.type for e in self.events(job_id)]


class _EntryFolded(Exception):  # noqa: N818 -- a failed condition, as DynamoDB's
    """A fold's condition failed: an entry it read is folded (or gone) since."""


def _spent(r: ChunkRecord, spent: AttemptStats | None) -> dict[str, object]:
    """The update setting the owner's running spend (set, not added), as heartbeats and commits write it."""
    if spent is None:
        return {}
    return {"spend": {**r.spend, str(r.fence): Spent(**spent.model_dump())}}


class FakeClaims:
    def __init__(self, clock: FakeClock, artifacts: FakeArtifacts, inline_max_bytes: int = 30_000):
        self.clock, self.artifacts, self.inline_max_bytes = clock, artifacts, inline_max_bytes
        self.items: dict[tuple[str, str], ChunkRecord] = {}
        self.cps: dict[tuple[str, str, str, int], Checkpoint] = {}
        # each chunk record's `fenced_out`: the fences whose attempt's spend is on it (its owner's ending write, or
        # `FakeJobs.add_fenced_out`)
        self.fenced_out: dict[tuple[str, str], set[int]] = {}

    def create(self, record: ChunkRecord) -> bool:
        key = (record.job_id, record.chunk_id)
        if key in self.items:
            return False
        self.items[key] = record.model_copy(deep=True)
        return True

    def get(self, job_id: str, chunk_id: str) -> ChunkRecord | None:
        r = self.items.get((job_id, chunk_id))
        return r.model_copy(deep=True) if r else None

    def for_job(self, job_id: str) -> list[ChunkRecord]:
        return sorted((r.model_copy(deep=True) for (j, _), r in self.items.items() if j == job_id),
                      key=lambda r: r.chunk_index)

    def lapsed(self, now: float) -> Iterator[ChunkRecord]:
        for r in list(self.items.values()):
            if r.claimed_by is not None and (r.claim_expires_at or 0.0) < now:
                yield r.model_copy(deep=True)

    def claim(self, job_id: str, chunk_id: str, owner: str, lease_s: float, receive_count: int,
              deadline_at: float | None = None) -> ClaimResult:
        now = self.clock()
        r = self.items.get((job_id, chunk_id))
        if r is None:
            return ClaimResult(won=False, fence=0, record=None)
        free = r.claimed_by is None or (r.claim_expires_at or 0.0) < now
        if r.status not in (ChunkStatus.PENDING, ChunkStatus.CLAIMED) or not free:
            return ClaimResult(won=False, fence=0, record=r.model_copy(deep=True))
        r = r.model_copy(update={"claimed_by": owner, "claim_expires_at": now + lease_s, "status": ChunkStatus.CLAIMED,
                                 "fence": r.fence + 1, "claimed_at": now, "receives": r.receives + 1,
                                 "last_receive_count": receive_count, "deadline_at": deadline_at,
                                 "redeliveries": r.redeliveries + (1 if receive_count > 1 else 0)})
        self.items[(job_id, chunk_id)] = r
        # (a second write, as the adapter's: the running spend of the fences it ended that nobody added yet)
        r = self._store_as_is(r, self._folded(r, r.unfolded(below=r.fence), AttemptStats()))
        return ClaimResult(won=True, fence=r.fence, record=r.model_copy(deep=True))

    def _fenced(self, job_id: str, chunk_id: str, fence: int, states: Collection[ChunkStatus],
                lapsed_before: float | None) -> ChunkRecord | None:
        r = self.items.get((job_id, chunk_id))
        if r is None or r.fence != fence or r.status not in states:
            return None
        if lapsed_before is not None and r.claim_expires_at is not None and r.claim_expires_at >= lapsed_before:
            return None
        return r

    def _store_as_is(self, r: ChunkRecord, update: dict[str, object]) -> ChunkRecord:
        new = r.model_copy(update=update, deep=True)
        self.items[(r.job_id, r.chunk_id)] = new
        return new

    def _ending(self, r: ChunkRecord, stats: AttemptStats, fold: Mapping[str, Spent] | None) -> dict[str, object]:
        """As the adapter's: the owner (`fold` None) adds `stats` and drops its running-spend entry; anyone else
        folds in the entries read that nobody added yet. None: the condition failed (an entry folded since)."""
        if fold is None:  # (written by each caller right after: its fence marked as added)
            self.fenced_out.setdefault((r.job_id, r.chunk_id), set()).add(r.fence)
            return {**self._with_stats(r, stats), "spend": {k: e for k, e in r.spend.items() if k != str(r.fence)}}
        return self._folded(r, fold, stats)

    def _folded(self, r: ChunkRecord, fold: Mapping[str, Spent], stats: AttemptStats) -> dict[str, object]:
        spend = dict(r.spend)
        for k, entry in fold.items():
            if entry.folded:
                continue
            if k not in spend or spend[k].folded:
                raise _EntryFolded()
            stats = stats.plus(entry)
            spend[k] = entry.model_copy(update={"folded": True})
        return {**self._with_stats(r, stats), "spend": spend}

    @staticmethod
    def _with_stats(r: ChunkRecord, stats: AttemptStats) -> dict[str, object]:
        retries = dict(r.retries)
        for code, n in stats.retries.items():
            retries[code] = retries.get(code, 0) + n
        return {"n_calls": r.n_calls + stats.calls, "repairs": r.repairs + stats.repairs, "retries": retries,
                **{f: getattr(r, f) + getattr(stats, f) for f in USAGE_FIELDS}}

    def _store(self, r: ChunkRecord, update: dict[str, object]) -> ChunkRecord:
        new = r.model_copy(update={**update, "claimed_by": None, "claim_expires_at": None, "deadline_at": None},
                           deep=True)
        self.items[(r.job_id, r.chunk_id)] = new
        return new.model_copy(deep=True)

    def heartbeat(self, job_id: str, chunk_id: str, fence: int, lease_s: float,
                  spent: AttemptStats | None = None) -> float | None:
        until = self.clock() + lease_s  # as the adapter: counted from the call's start
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.CLAIMED,), None)
        if r is None:
            return None
        self.items[(job_id, chunk_id)] = r.model_copy(update={"claim_expires_at": until, **_spent(r, spent)}, deep=True)
        return until

    def release(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, error: ErrorEnvelope | None,
                *, failure: bool, lapsed_before: float | None = None,
                reason: ReleaseReason = ReleaseReason.RETRY,
                fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.CLAIMED,), lapsed_before)
        if r is None:
            return None
        try:
            ending = self._ending(r, stats, fold)
        except _EntryFolded:
            return None
        update = {**ending, "status": ChunkStatus.PENDING, "failures": r.failures + int(failure),
                  "release_reason": reason, "released_at": self.clock()}
        if reason.sends_message:
            update["message_sent_at"] = self.clock()
        if reason is ReleaseReason.BACKPRESSURE:
            update["backpressure_since"] = r.backpressure_since if r.backpressure_since is not None else self.clock()
            update["backpressure_requeues"] = r.backpressure_requeues + 1
        if reason is ReleaseReason.HELD:  # a hold ends the streak (the deadline counts from after it)
            update["backpressure_since"], update["backpressure_requeues"] = None, 0
        if error is not None:
            update["last_error"] = error
        return self._store(r, update)

    def await_batch(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, pending_key: str,
                    records: int) -> ChunkRecord | None:
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.CLAIMED,), None)
        if r is None:
            return None
        return self._store(r, {**self._ending(r, stats, None), "status": ChunkStatus.AWAITING_BATCH,
                               "batch_pending_key": pending_key, "batch_records": records,
                               "batch_since": self.clock(), "released_at": self.clock(), "batch_token": None})

    def _awaiting(self, job_id: str, chunk_id: str, fence: int, token: str | None) -> ChunkRecord | None:
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.AWAITING_BATCH,), None)
        return r if r is not None and r.batch_token == token else None

    def assign_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None,
                     expected: str | None) -> ChunkRecord | None:
        r = self._awaiting(job_id, chunk_id, fence, expected)
        return None if r is None else self._store(r, {"batch_token": token})

    def return_from_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None, *, stats: AttemptStats,
                          answer_key: str | None = None, failed: bool = False, on_demand: str | None = None,
                          error: ErrorEnvelope | None = None) -> ChunkRecord | None:
        r = self._awaiting(job_id, chunk_id, fence, token)
        if r is None:
            return None
        now = self.clock()
        update: dict[str, object] = {
            **self._with_stats(r, stats), "status": ChunkStatus.PENDING, "release_reason": ReleaseReason.BATCH,
            "released_at": now, "message_sent_at": None, "batch_token": None, "batch_pending_key": None,
            "batch_since": None, "batch_failures": r.batch_failures + int(failed),
            "batch_answer_keys": [*r.batch_answer_keys, *([answer_key] if answer_key else [])]}
        if on_demand is not None:
            update["batch_on_demand"] = on_demand
        if error is not None:
            update["last_error"] = error
        return self._store(r, update)

    def finish(self, job_id: str, chunk_id: str, fence: int, status: ChunkStatus, stats: AttemptStats, *,
               outcome: ChunkOutcome | None = None, error: ErrorEnvelope | None = None,
               states: Collection[ChunkStatus] = (ChunkStatus.CLAIMED,),
               lapsed_before: float | None = None, fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        r = self._fenced(job_id, chunk_id, fence, states, lapsed_before)
        if r is None:
            return None
        try:
            ending = self._ending(r, stats, fold)
        except _EntryFolded:
            return None
        update = {**ending, "status": status, "settled_at": self.clock()}
        if outcome is not None:
            update.update(outcome.model_dump())
        if error is not None:
            update["last_error"] = error
        if status is ChunkStatus.DEAD_LETTERED:
            update["failures"] = r.failures + 1
        return self._store(r, update)

    def reset_for_redrive(self, job_id: str, chunk_id: str, forget: Collection[str] = ()) -> ChunkRecord | None:
        r = self.items.get((job_id, chunk_id))
        states = (ChunkStatus.DEAD_LETTERED, ChunkStatus.FAILED, ChunkStatus.CANCELLED) + \
            ((ChunkStatus.DONE,) if forget else ())
        if r is None or r.status not in states:
            return None
        return self._store(r, {"status": ChunkStatus.PENDING, "failures": 0, "redriven": r.redriven + 1,
                               "fence": r.fence + 1, "redriven_at": self.clock(), "message_sent_at": self.clock(),
                               "settled_at": None,
                               "backpressure_since": None, "backpressure_requeues": 0,
                               "checkpoints": {a: f for a, f in r.checkpoints.items() if a not in forget}})

    def message_sent(self, job_id: str, chunk_id: str, fence: int) -> ChunkRecord | None:
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.PENDING,), None)
        if r is None or r.claimed_by is not None:
            return None
        self.items[(job_id, chunk_id)] = r.model_copy(update={"message_sent_at": self.clock()})
        return self.items[(job_id, chunk_id)].model_copy(deep=True)

    def checkpoints(self, record: ChunkRecord) -> dict[str, Checkpoint]:
        out = {}
        for analyst, fence in record.checkpoints.items():
            cp = self.cps.get((record.job_id, record.chunk_id, analyst, fence))
            if cp is not None:
                out[analyst] = cp.model_copy()
        return out

    @_atomic
    def put_checkpoints(self, job_id: str, chunk_id: str, fence: int, writes: Sequence[CheckpointWrite],
                        lease_s: float | None = None, spent: AttemptStats | None = None) -> float | None:
        now = self.clock()  # as the adapter: the lease is counted from the call's start, not its end
        if not writes:
            current = self.items.get((job_id, chunk_id))
            return (current.claim_expires_at or now) if current is not None else None
        for w in writes:
            cp = Checkpoint(job_id=job_id, chunk_id=chunk_id, analyst=w.analyst, fence=fence,
                            config_hash=w.config_hash, status=w.status, created_at=now)
            if len(w.output_json.encode()) > self.inline_max_bytes:
                key = checkpoint_key(job_id, chunk_id, w.analyst, fence)
                self.artifacts.put_text(key, w.output_json)
                cp = cp.model_copy(update={"output_key": key})
            else:
                cp = cp.model_copy(update={"output": w.output_json})
            self.cps[(job_id, chunk_id, w.analyst, fence)] = cp  # written first, committed below (or orphaned)
        r = self._fenced(job_id, chunk_id, fence, (ChunkStatus.CLAIMED,), None)
        if r is None:
            return None
        committed = {**r.checkpoints, **{w.analyst: fence for w in writes}}
        lease = {"claim_expires_at": now + lease_s} if lease_s is not None else {}
        new = r.model_copy(update={"checkpoints": committed, **lease, "backpressure_since": None,
                                   "backpressure_requeues": 0, **_spent(r, spent)}, deep=True)
        self.items[(job_id, chunk_id)] = new
        return new.claim_expires_at or now

    def checkpoint_output(self, checkpoint: Checkpoint) -> str:
        if checkpoint.output is not None:
            return checkpoint.output
        assert checkpoint.output_key is not None
        return self.artifacts.get_text(checkpoint.output_key)


class FakeArtifacts:
    def __init__(self, bucket: str = "artifacts"):
        self.bucket = bucket
        self.objects: dict[tuple[str, str], str | bytes] = {}  # bytes: a raw (e.g. non-UTF-8) upload
        self.presigned: list[tuple[str, int, int]] = []  # (key, max bytes (0: a GET), expiry) of each presigned URL

    def put_text(self, key: str, body: str, content_type: str = "application/json") -> None:
        self.objects[(self.bucket, key)] = body

    def get_text(self, key: str) -> str:
        body = self.objects[(self.bucket, key)]
        return body.decode("utf-8") if isinstance(body, bytes) else body

    def get_text_range(self, key: str, byte_start: int, byte_end: int) -> str:
        body = self.objects[(self.bucket, key)]
        data = body if isinstance(body, bytes) else body.encode("utf-8")
        return data[byte_start:max(byte_start, byte_end)].decode("utf-8")

    def delete(self, key: str) -> None:
        self.objects.pop((self.bucket, key), None)

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(k for b, k in self.objects if b == self.bucket and k.startswith(prefix))

    def read_uri(self, bucket: str, key: str, max_bytes: int | None = None) -> bytes:
        if (bucket, key) not in self.objects:
            raise ReviewError.of("input.document_missing", "NoSuchKey for the referenced object",
                                 provider_code="NoSuchKey", http_status=404, step="intake.load")
        body = self.objects[(bucket, key)]
        data = body if isinstance(body, bytes) else body.encode()
        return data if max_bytes is None else data[:max_bytes + 1]

    def presign_upload(self, key: str, max_bytes: int, expires_s: int) -> PresignedUpload:
        self.presigned.append((key, max_bytes, expires_s))
        return PresignedUpload(url=f"https://{self.bucket}.s3.example", fields={"key": key})

    def presign_download(self, key: str, expires_s: int, filename: str) -> str:
        self.presigned.append((key, 0, expires_s))
        return f"https://{self.bucket}.s3.example/{key}?expires={expires_s}&filename={filename}"


@dataclass
class Sent:
    body: str
    delay_s: int = 0
    dedup_id: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    message_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sent_at: float = 0.0
    hidden: bool = False


@dataclass
class _ControlItem:
    control: ModelControl = field(default_factory=ModelControl)


class FakeModelControl:
    """The runtime control of the model (adapters/model_control.py) in memory: one record, written by compare-and-set
    on its version (the condition checked first, then the write, as DynamoDB does). `max_age_s` > 0 caches reads as
    the adapter does, on `clock` (uncached by default: a test's `put` is seen at once); `another()` is a second
    process's reader of the same record, with its own cache."""

    def __init__(self, max_age_s: float = 0.0, clock: Callable[[], float] | None = None,
                 item: _ControlItem | None = None) -> None:
        self.item = item or _ControlItem()
        self.reads = self.writes = 0
        self.max_age_s, self.clock = max_age_s, clock or FakeClock()
        self._cached: tuple[float, ModelControl] | None = None

    @property
    def control(self) -> ModelControl:
        return self.item.control

    @control.setter
    def control(self, control: ModelControl) -> None:
        self.item.control = control

    def another(self) -> FakeModelControl:
        return FakeModelControl(self.max_age_s, self.clock, self.item)

    def get(self) -> ModelControl:
        now = self.clock()
        if self._cached is not None and now - self._cached[0] < self.max_age_s:
            return self._cached[1]
        self.reads += 1
        self._cached = (now, self.control)
        return self.control

    def put(self, control: ModelControl) -> None:
        """A test's setup: the control as an operator left it (the product writes through `update` only)."""
        self.control = control

    def update(self, change: Callable[[ModelControl], ModelControl]) -> ModelControl:
        for _ in range(CONTROL_WRITE_ATTEMPTS):
            seen = self.control
            wanted = change(seen)
            if wanted.model_dump(exclude={"version"}) == seen.model_dump(exclude={"version"}):
                return seen  # nothing changed: nothing written
            if self.control.version != seen.version:  # the condition: nobody wrote since the read
                continue
            self.control = wanted.model_copy(update={"version": seen.version + 1})
            self.writes += 1
            self._cached = (self.clock(), self.control)
            return self.control
        raise contended(CONTROL_WRITE_ATTEMPTS)


class FakeTokenLedger:
    """The daily token ledger (adapters/token_ledger.py) in memory: hourly counters and one control per model."""

    def __init__(self) -> None:
        self.counters: dict[tuple[str, int], int] = {}
        self.control: dict[str, dict[str, int]] = {}
        self.charges: dict[str, Charge] = {}  # the spend charges' records, by charge id
        self.adds = self.reads = 0

    @_atomic
    def add(self, model_id: str, hour: int, tokens: int) -> None:
        self.adds += 1
        self.counters[(model_id, hour)] = self.counters.get((model_id, hour), 0) + tokens

    @_atomic
    def window(self, model_id: str, first_hour: int) -> LedgerWindow:
        self.reads += 1
        control = self.control.get(model_id, {})
        return LedgerWindow(hours={h: n for (m, h), n in self.counters.items() if m == model_id and h >= first_hour},
                            since_hour=control.get("since_hour", 0), probe_hour=control.get("probe_hour"))

    @_atomic
    def claim_probe(self, model_id: str, hour: int, seen: int | None) -> bool:
        control = self.control.setdefault(model_id, {})
        if control.get("probe_hour") != seen:
            return False
        control["probe_hour"] = hour
        return True

    @_atomic
    def take(self, counter: str, window: int, amount: int, limit: int, expires_at: int) -> int | None:
        count = self.counters.get((counter, window), 0)
        if count + amount > limit:
            return None
        self.counters[(counter, window)] = count + amount
        return count + amount

    @_atomic
    def count(self, counter: str, window: int) -> int:
        return self.counters.get((counter, window), 0)

    @_atomic
    def take_once(self, charge: Charge, limit: int, now: int) -> Taken:
        held = self.charges.get(charge.charge_id)
        if held is not None and held.expires_at >= now:  # the transaction's conditions: the record first
            return Taken.BEFORE
        if self.take(charge.counter, charge.window, charge.amount, limit, charge.expires_at) is None:
            return Taken.REFUSED
        self.charges[charge.charge_id] = charge
        return Taken.NOW

    @_atomic
    def give_back(self, charge: Charge) -> bool:
        held = self.charges.get(charge.charge_id)
        if held != charge:  # the transaction's conditions: this charge's live record
            return False
        del self.charges[charge.charge_id]
        self.counters[(charge.counter, charge.window)] -= charge.amount
        return True

    @_atomic
    def lift(self, model_id: str, hour: int) -> None:
        control = self.control.setdefault(model_id, {})
        control["since_hour"] = hour
        control.pop("probe_hour", None)


class FakeQueues:
    """Queues as lists. FIFO dedup on the results queue, as SQS does within its window."""

    def __init__(self, clock: FakeClock, configured: Collection[Queue] = tuple(Queue)):
        self.clock = clock
        self.configured = set(configured)
        self.sent: dict[Queue, list[Sent]] = {q: [] for q in Queue}
        self.visibility: list[tuple[Queue, str, int]] = []  # (queue, receipt handle, seconds)
        self.deleted: list[tuple[Queue, str]] = []
        self.batches: list[list[int]] = []  # analysis batches as sent: the size in bytes of each message

    def has(self, queue: Queue) -> bool:
        return queue in self.configured

    def _put(self, queue: Queue, sent: Sent) -> None:
        if queue not in self.configured:
            raise ValueError(f"queue {queue.value} is not configured")
        sent.sent_at = self.clock()
        self.sent[queue].append(sent)

    def send_analysis(self, messages: Sequence[AnalysisMessage], delay_s: int = 0) -> None:
        for batch in size_batches([m.model_dump_json() for m in messages]):  # SQS's limits, as the adapter
            self.batches.append([len(b.encode()) for b in batch])
            for body in batch:
                self._put(Queue.ANALYSIS, Sent(body, delay_s=delay_s))

    def send_result(self, message: ResultMessage | JobControl, dedup_id: str) -> None:
        if any(s.dedup_id == dedup_id[:128] for s in self.sent[Queue.RESULTS]):
            return  # deduplicated
        self._put(Queue.RESULTS, Sent(message.model_dump_json(), dedup_id=dedup_id[:128]))

    def send_intake(self, body: str) -> None:
        self._put(Queue.INTAKE, Sent(body))

    def extend_visibility(self, queue: Queue, receipt_handle: str, seconds: int) -> None:
        self.visibility.append((queue, receipt_handle, seconds))

    def dead_letter(self, queue: Queue, body: str, envelope: ErrorEnvelope, **attributes: str) -> None:
        attrs = {"error_code": envelope.error_code, "error_class": envelope.error_class.value,
                 "envelope": envelope.model_dump_json(), **attributes}
        self._put(DLQS[queue], Sent(body, attributes={k: v for k, v in attrs.items() if v}))

    def _messages(self, queue: Queue) -> list[QueueMessage]:
        return [QueueMessage(message_id=s.message_id, receipt_handle=s.message_id, body=s.body,
                             attributes=dict(s.attributes), receive_count=1, sent_at=s.sent_at)
                for s in self.sent[queue] if not s.hidden]

    def peek(self, queue: Queue) -> list[QueueMessage]:
        return self._messages(queue)

    def take_all(self, queue: Queue, visibility_s: int = 30) -> list[QueueMessage]:
        return self._messages(queue)

    def delete(self, queue: Queue, receipt_handle: str) -> None:
        self.deleted.append((queue, receipt_handle))
        self.sent[queue] = [s for s in self.sent[queue] if s.message_id != receipt_handle]

    def depth(self, queue: Queue) -> int:
        return len(self.sent[queue])

    # test helpers
    def analysis(self) -> list[AnalysisMessage]:
        return [AnalysisMessage.model_validate_json(s.body) for s in self.sent[Queue.ANALYSIS]]

    def results(self) -> list[ResultMessage]:
        return [ResultMessage.model_validate_json(s.body) for s in self.sent[Queue.RESULTS]]

    def drain(self, queue: Queue) -> list[Sent]:
        out, self.sent[queue] = self.sent[queue], []
        return out


# Analysts one by one: unit tests place faults at the n-th model call, which needs a deterministic order.
# Concurrent analysts have their own tests (pipeline/test_analyst_pool.py) and run in the integration tests.
SETTINGS = Settings(profile=get_profile("local").with_overrides(**{"analyst_concurrency": 1}), jobs_table="jobs", claims_table="claims",
                    checkpoints_table="checkpoints", events_table="events", bucket="artifacts",
                    intake_queue_url="intake", analysis_queue_url="analysis", results_queue_url="results",
                    intake_dlq_url="intake-dlq", analysis_dlq_url="analysis-dlq", results_dlq_url="results-dlq")


@dataclass
class FakeWorld:
    """A `Deps` over in-memory fakes, with the fakes reachable for GIVEN and THEN."""

    settings: Settings = SETTINGS
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.artifacts = FakeArtifacts(self.settings.bucket)
        self.jobs = FakeJobs(self.clock, self.settings.profile.record_ttl_s)
        self.claims = FakeClaims(self.clock, self.artifacts, self.settings.profile.review.checkpoint_inline_max_bytes)
        self.jobs.claims = self.claims
        self.queues = FakeQueues(self.clock)
        self.model_control = FakeModelControl(clock=self.clock)
        self.token_ledger = FakeTokenLedger()
        self.deps = Deps(settings=self.settings, jobs=self.jobs, claims=self.claims, artifacts=self.artifacts,
                         queues=self.queues, clock=self.clock, model_control=self.model_control,
                         token_ledger=self.token_ledger)


class FakeBatchInference:
    """Bedrock batch inference in memory, behind the `BatchInference` port (the HTTP stand-in that boto3 reaches is
    review_local/batch_service.py; this is its in-process twin for the unit worlds). A job answers after
    `end_after_s` of the world's clock, each record by the offline rule model exactly as the stand-in answers it;
    the same token returns the same job (`clientRequestToken`: "If this token matches a previous request, Amazon Bedrock
    ignores the request", CreateModelInvocationJob API reference); a job under `min_records` fails as Bedrock's
    validation fails it (the "Minimum number of records per batch inference job" quota, docs.aws.amazon.com/bedrock/
    latest/userguide/batch-inference-data.html); records sharing a recordId are refused as the boto3 adapter refuses
    them (adapters/batch_inference.py), before anything is written; a stopped job goes Stopping then Stopped, a job
    that has ended refuses a stop (ValidationException, as the stand-in does). A job answers its records evenly over
    `end_after_s`: one stopped has the output of those it answered before the stop, one that ends Stopped or Expired
    by a fault the output of its first half (Bedrock writes and bills the records processed before); a Failed job
    has no output to read (`results` raises, as the adapter does).
    Faults: `record_faults(record_id)` -> None (answered), an error code (answered with an error) or MISSING (no
    line); `job_faults`: the statuses the next jobs end in instead (Failed, Stopped, Expired), one per job;
    `refuse_create`: the botocore error code every CreateModelInvocationJob is answered with (e.g.
    ValidationException: the model is not offered in batch; ThrottlingException), nothing created."""

    def __init__(self, clock: FakeClock, min_records: int = 10, end_after_s: float = 3.0):
        self.clock, self.minimum, self.end_after_s = clock, min_records, end_after_s  # `minimum`: what validation takes
        self.answer = offline_answer(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)))
        self.inputs: dict[str, list[BatchRecord]] = {}  # token -> the input written for it
        self.jobs: dict[str, dict[str, Any]] = {}  # arn -> token, records, created_at, status
        self.by_token: dict[str, str] = {}
        self.record_faults: Callable[[str], str | None] = lambda _rid: None
        self.job_faults: list[str] = []
        self.refuse_create: str = ""
        self.submits = 0  # submit calls, a repeated token included
        self.stops: list[str] = []
        self.min_records_quota: int | None = min_records  # what Service Quotas would say
        self.tokens_in = self.tokens_out = 0  # what the answered records used

    def put_input(self, token: str, records: Iterable[BatchRecord]) -> int:
        written = list(records)
        ids = [r.record_id for r in written]
        if len(set(ids)) != len(ids):
            raise ReviewError.of("batch.request_invalid", "two records share a recordId")
        self.inputs[token] = written
        return len(written)

    def submit(self, token: str) -> str:
        self.submits += 1
        if token in self.by_token:
            return self.by_token[token]
        if self.refuse_create:
            status = 503 if self.refuse_create in ("ServiceUnavailableException", "InternalServerException") else \
                429 if self.refuse_create == "ThrottlingException" else 400
            raise ClientError({"Error": {"Code": self.refuse_create, "Message": "refused (injected)"},
                               "ResponseMetadata": {"HTTPStatusCode": status}}, "CreateModelInvocationJob")
        records = self.inputs[token]  # no input: the real service fails the job in validation; ours never does that
        arn = f"arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/{uuid.uuid4().hex[:12]}"
        status = "Failed" if len(records) < self.minimum else (self.job_faults.pop(0) if self.job_faults else "")
        self.jobs[arn] = {"token": token, "records": list(records), "created_at": self.clock(), "ends": status}
        self.by_token[token] = arn
        return arn

    def min_records(self) -> int | None:
        return self.min_records_quota

    def stop(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if self.status(job_id).terminal:
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "the job has ended"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "StopModelInvocationJob")
        self.stops.append(job_id)
        job["ends"], job["stopped_at"] = "Stopped", self.clock()

    def status(self, job_id: str) -> BatchJobState:
        job = self.jobs[job_id]
        if job["ends"] == "Failed" and len(job["records"]) < self.minimum:
            return BatchJobState(job_id, BatchJobStatus.FAILED, f"fewer than {self.minimum} records")
        if "stopped_at" in job:
            return BatchJobState(job_id, BatchJobStatus.STOPPED if self.clock() > job["stopped_at"]
                                 else BatchJobStatus.STOPPING)
        if self.clock() - job["created_at"] < self.end_after_s:
            return BatchJobState(job_id, BatchJobStatus.IN_PROGRESS)
        if job["ends"]:
            return BatchJobState(job_id, BatchJobStatus(job["ends"]), f"the job ended {job['ends']}")
        faulted = any(self._faults(job).values())
        return BatchJobState(job_id, BatchJobStatus.PARTIALLY_COMPLETED if faulted else BatchJobStatus.COMPLETED)

    def _faults(self, job: dict[str, Any]) -> dict[str, str | None]:
        """Each record's fault, decided once when the job ends."""
        if "faults" not in job:
            job["faults"] = {r.record_id: self.record_faults(r.record_id) for r in job["records"]}
        return dict(job["faults"])

    def _processed(self, job_id: str) -> list[BatchRecord]:
        """The records the job answered (in input order): all, or those before it was stopped or expired."""
        job, state = self.jobs[job_id], self.status(job_id)
        records: list[BatchRecord] = job["records"]
        if state.status not in ENDED_EARLY:
            return records
        if "stopped_at" in job:
            share = min(1.0, (job["stopped_at"] - job["created_at"]) / self.end_after_s) if self.end_after_s else 1.0
        else:
            share = 0.5
        return records[:int(len(records) * share)]

    def results(self, job_id: str) -> Iterator[RecordOutcome]:
        state = self.status(job_id)
        if state.status not in HAS_OUTPUT:
            raise ReviewError.of("batch.job_failed", f"batch job status {state.status.value}",
                                 provider_code=state.status.value)
        faults = self._faults(self.jobs[job_id])
        for r in self._processed(job_id):
            fault = faults[r.record_id]
            if fault == MISSING:
                continue  # no line at all
            if fault:
                yield RecordOutcome(r.record_id, error_code=fault, error_message="injected")
            else:
                body, tokens_in, tokens_out = self.answer(r.model_input, "Converse")
                self.tokens_in += tokens_in
                self.tokens_out += tokens_out
                yield RecordOutcome(r.record_id, output=body)
