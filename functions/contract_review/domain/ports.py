"""Ports: what the use cases need from the outside world, as small Protocols, and `Deps`, the one
dependencies object a process builds once (`wiring.build_deps`) and hands to every use case.

Implementations: `adapters/` (DynamoDB, S3, SQS through boto3) and, for the unit tests,
in-memory fakes (`tests/unit/fakes.py`). A test in `tests/integration/test_repositories.py` runs
the same contract against both, so the fakes cannot drift from the real thing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from contract_review.config.settings import Settings
from contract_review.domain.batch_inference import BatchJobState, BatchRecord, RecordOutcome
from contract_review.domain.chunk_records import (
    Checkpoint,
    CheckpointWrite,
    ChunkOutcome,
    ChunkRecord,
    ClaimResult,
    ReleaseReason,
    Spent,
)
from contract_review.domain.control_records import ModelControl, PublishedQuotas
from contract_review.domain.effects import SideEffects
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, JobControl, ResultMessage
from contract_review.domain.records import (
    AttemptStats,
    ChunkStatus,
    Job,
    JobEvent,
    JobState,
    SideEffectDone,
    Usage,
    Waiting,
)

if TYPE_CHECKING:
    from contract_review.domain.cost import RequestMeter

Clock = Callable[[], float]


class ModelControls(Protocol):
    """The runtime control of the model (adapters/model_control.py)."""

    def get(self) -> ModelControl:
        """The current control, as a worker sees it (cached: a change takes effect within the cache's age)."""
        ...

    def update(self, change: Callable[[ModelControl], ModelControl]) -> ModelControl:
        """Apply `change` to the control as stored now (read consistently, never from the cache) and write the result
        only if nobody wrote since that read (compare-and-set on `version`, which the store increments); a lost race
        reads again and applies `change` again, a bounded number of times (then ReviewError `control.contended`).
        `change` sets only the fields its writer owns, and only the fields it changed are written. Returns what was
        written (and refreshes this reader's cache); a change that changes nothing writes nothing."""
        ...


class QuotaStore(Protocol):
    """The model's Bedrock quotas as the sweeper published them (adapters/published_quotas.py): its own item of the
    runtime control table, beside the operator's control."""

    def get(self) -> PublishedQuotas | None:
        """The quotas as a worker sees them (cached like the control): the last ones read; None before any was read
        (none published yet, or none readable since this process started)."""
        ...

    def publish(self, quotas: PublishedQuotas) -> bool:
        """The sweeper's write: only when a value differs from the stored one (read consistently), conditional on the
        version it read; False when nothing was written (unchanged, or another sweeper wrote first)."""
        ...


@dataclass(frozen=True)
class LedgerWindow:
    """The daily token ledger of one model as read (`TokenLedger.window`): tokens per hour (hour = epoch seconds //
    the bucket's length), the hour it counts from (a probe succeeded then: the quota reset or was raised), and the
    hour of the last hold start or probe (None: no hold since the last lift)."""

    hours: Mapping[int, int]
    since_hour: int = 0
    probe_hour: int | None = None


class TokenLedger(Protocol):
    """The daily token ledger every worker shares (adapters/token_ledger.py: a DynamoDB counter per model per
    hour, and one control item per model)."""

    def add(self, model_id: str, hour: int, tokens: int) -> None:
        """Add `tokens` to the model's counter of `hour` (an atomic ADD: concurrent workers lose nothing)."""

    def window(self, model_id: str, first_hour: int) -> LedgerWindow:
        """The model's hourly counters from `first_hour` on, and its control (one read)."""

    def claim_probe(self, model_id: str, hour: int, seen: int | None) -> bool:
        """Set the control's probe hour to `hour` if it is still `seen` (None: no hold since the last lift):
        True for the one caller that moved it (a hold starts, or this hour's probe is this caller's)."""

    def lift(self, model_id: str, hour: int) -> None:
        """A probe succeeded: count from `hour` on, and no hold is under way."""

    def take(self, counter: str, window: int, amount: int, limit: int, expires_at: int) -> int | None:
        """Add `amount` to `counter`'s count of `window` only if the count stays within `limit` (one conditional
        write: concurrent callers never take more than the limit together): the new count, or None when refused.
        The spend limits' counters (operate/limits.py) live in the same table as the token counters."""

    def count(self, counter: str, window: int) -> int:
        """`counter`'s count of `window` (0 when nothing was taken), read strongly consistent."""

    def take_once(self, charge: Charge, limit: int, now: int) -> Taken:
        """`take` under a charge id: the charge's record and the count's addition in one transaction, conditional on
        no live record of that id (one whose `expires_at` has not passed) and on the limit. A second take of the
        same id takes nothing (`Taken.BEFORE`), whatever the count; `Taken.REFUSED`: over the limit, nothing
        taken."""

    def give_back(self, charge: Charge) -> bool:
        """Undo a `take_once`: its record ended (no record for the next `take_once` of the id) and its amount taken
        off its window's count, in one transaction conditional on the record being this live charge (a second
        give-back gives nothing). Whether this call gave it back."""


@dataclass(frozen=True)
class Charge:
    """What one admission takes from a counter (`TokenLedger.take_once`): `amount` from `counter`'s `window`, under
    `charge_id` (the job it admits: a replay takes nothing again), its record kept until `expires_at`."""

    charge_id: str
    counter: str
    window: int
    amount: int
    expires_at: int


class Taken(StrEnum):
    NOW = "now"  # taken by this call
    BEFORE = "before"  # taken before under the same charge id: nothing taken again
    REFUSED = "refused"  # over the limit: nothing taken


class Compensator(Protocol):
    """Undo a job's recorded side effects, last first (`sideeffects.saga.compensate_job`)."""

    def __call__(self, deps: Deps, job: Job, reason: str) -> None: ...


class BatchInference(Protocol):
    """Bedrock batch inference (domain/batch_inference.py; adapters/batch_inference.py; docs/batch-inference.md): records
    streamed into a job's input, a job id out; the job's state; its output streamed line by line, joined on recordId
    by the caller (whatever the order of the output); a job stopped."""

    def put_input(self, token: str, records: Iterable[BatchRecord]) -> int:
        """Write `records` as the input of the batch job of `token`, streamed (never the whole file in memory):
        the number written. Two records sharing a recordId: `batch.request_invalid`, nothing written."""
        ...

    def submit(self, token: str) -> str:
        """Create the batch job reading the input `put_input` wrote for `token` (at least the account's minimum
        records); `token` is the idempotency token: the same token again returns the same job, none created. Returns
        the job id (its ARN). A refusal raises botocore's ClientError (errors.classify_batch_submit)."""
        ...

    def status(self, job_id: str) -> BatchJobState: ...

    def min_records(self) -> int | None:
        """The account's minimum records per batch job for the model (Service Quotas), read once; None: unreadable."""
        ...

    def results(self, job_id: str) -> Iterator[RecordOutcome]:
        """The outcome of each line of the job's output, as read (a record with no line is the caller's to tell:
        MISSING). Only for a job whose status has an output (HAS_OUTPUT)."""
        ...

    def stop(self, job_id: str) -> None:
        """StopModelInvocationJob: the job goes Stopping, then Stopped."""
        ...


class JobRecords(Protocol):
    """The job records of the jobs table: created, read, moved from state to state, and what they wait for
    and did (adapters/job_records.py)."""

    def create(self, job: Job) -> tuple[Job, bool]:
        """Create the job; or return the existing one and False. A job that failed on bad input
        (`input.*`) is replaced by a corrected submission with the same key."""

    def get(self, job_id: str) -> Job | None: ...

    def all(self) -> list[Job]: ...

    def transition(self, job_id: str, from_states: Collection[JobState], to: JobState, *,
                   started_at: float | None = None, outcome: BaseModel | None = None,
                   settled: set[str] | None = None, if_settled_version: int | None = None,
                   if_version: int | None = None) -> Job | None:
        """Conditional state change; None when the job was not in `from_states` (or, with
        `if_settled_version`, when its `settled_version` is no longer that: a chunk was uncounted;
        with `if_version`, when another transition happened since the caller's read).

        Use `lifecycle.transition`, which checks the transition table and writes the event. The fields
        of `outcome` (e.g. JobOutcome, JobFailure, Cancellation) are written with it; `settled`
        (reopening an ended job) clears the earlier ending and replaces what is counted settled: the job's chunk
        records are marked counted exactly when their id is in `settled` (written before the transition, while
        the job has ended and nothing counts), the job's count set to match, an older job's set removed. Adds 1 to the
        job's `version`; the transition's event is appended after it (`record_event`)."""

    def stalled(self, idle_since: float, state: JobState = JobState.RUNNING) -> Iterator[Job]:
        """Open jobs in `state` (default `running`; a terminal state finds none) not updated since `idle_since`:
        a query of the jobs table's sparse open-jobs index, each job read again (the index lags)."""

    def running(self) -> Iterator[Job]:
        """Every running job, whenever it was last updated (the batch collector's jobs: one settled while it lists
        them is still its): the open-jobs index, each job read again (the index lags)."""

    def running_brief(self) -> Iterator[Job]:
        """The running jobs with only the fields saying whose chunks are open (priority, chunk and settled counts,
        `waiting`; the rest at their defaults: not a job to act on): the open-jobs index, then batched reads."""

    def backfill_open_index(self) -> int:
        """Once, for jobs written before the open-jobs index: index every open job lacking its key (one scan, by
        an operator: `review backfill-open-jobs`); the number indexed."""

    def touch(self, job_id: str) -> None: ...

    def set_waiting(self, job_id: str, waiting: Waiting | None) -> bool:
        """Name what the job's chunks are held for (kept when one is named already: the first hold's `since`
        stays), or end it (None); without touching the job's `version`. True when the job changed."""

    def mark_on_demand(self, job_id: str) -> bool:
        """A batch-mode job's first chunk taken on demand: `on_demand_since` set to now, once (kept when set
        already); without touching the job's `version`. True when this call set it."""

    def switch_model(self, job_id: str, from_model: str, to_model: str) -> bool:
        """The job's calls go to `to_model` from now on (pipeline/fallback.py): its `model_id` set to it and
        `from_model` appended to its `earlier_models`, only while its model is still `from_model` (two workers that
        see the same refusal switch it once); without touching the job's `version`. True when this call switched it."""

    def record_side_effect(self, job_id: str, effect: SideEffectDone) -> Job | None:
        """Upsert the job's side effect of `effect.step` (replaced in place, appended when new), without
        touching the job's `version` (a transition made after it still holds); None when there is no job."""


class JobCounts(Protocol):
    """The counts on a job: its chunks counted settled and their usage, what fenced-out attempts spent, its
    requeues and its fan-out cursor (adapters/job_counts.py; the chunk records' marks are in the claims table)."""

    def settle_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                     status: ChunkStatus | None = None) -> Job:
        """`settle_new_chunk`, and when the chunk was counted already, only the job's `updated_at` (idempotent);
        the job after the update. `usage` is added only by the write that counts the chunk (once)."""

    def settle_new_chunk(self, job_id: str, chunk_id: str, *, usage: Usage | None = None, fence: int | None = None,
                         status: ChunkStatus | None = None, read: Usage | None = None) -> Job | None:
        """Count the chunk settled, only if it is not counted yet: its record marked `counted` and the job's
        `settled_count` (and `usage`, added to the job's) moved up by one, in one transaction conditional on the
        record existing unmarked, still with the `fence` and `status` the caller read (when given: a redrive
        landing after the caller's read moved both, and the chunk is not counted) and (a job from before the
        count) the chunk not in the job's set, and, with `read`, on the record's usage still being `read` (what the
        caller read and adds). The job read after it; None, and nothing written, when it was counted already (or
        there is no such job or chunk record, or the record moved on, or its usage changed since `read`): the
        caller learns whether it was the one that counted it (`lifecycle.count_settled` reads a changed record
        again)."""

    def unsettle_chunks(self, job_id: str, usage_by_chunk: Mapping[str, Usage]) -> Job | None:
        """Take each counted chunk off: its mark (or its id from an older job's set) and its usage (what was
        counted when it settled) off the job's count and usage, in one write conditional on it being counted (a
        chunk not counted is not taken off), and bump `settled_version` either way (a finalize in flight loses);
        the job after the updates, None when there is no such job (nothing is created)."""

    def add_fenced_out(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats) -> bool:
        """What an attempt fenced out of its chunk (its lease lost: none of its fenced writes went through) spent,
        added to the chunk record all the same, and to its job too when the chunk is counted on it already (one
        transaction: a counted chunk's usage is on its job); once per attempt (the chunk record keeps the fences
        whose spend was added: a second call adds nothing). Less what whoever ended its fence already folded in of
        its running spend (`ChunkRecord.spend`), whose entry goes. True when this call added it."""

    def count_requeue(self, job_id: str) -> None:
        """Add one to the job's `requeues` (atomic; `updated_at` untouched: a requeue is not progress).
        Nothing happens when the job does not exist."""

    def advance_fanout(self, job_id: str, from_count: int, to_count: int) -> bool:
        """Move the fan-out cursor from `from_count` to `to_count` (conditional on it being `from_count`);
        False when it had moved (another fan-out got there first)."""


class JobEvents(Protocol):
    """Each job's append-only events, numbered without gaps (adapters/job_events.py)."""

    def record_event(self, job_id: str, kind: str, **detail: object) -> int:
        """Append an event under the job's next number: the number and the event are written together (one
        transaction with the job's counter item, beside its events), so the numbers have no gap; the number, or 0
        when there is no such job (nothing is written)."""

    def record_owed_event(self, job_id: str, chunk_id: str, kind: str, /, **detail: object) -> int:
        """The event the chunk's settle owes (its record's `event_owed`, set by `settle_new_chunk`): appended as
        `record_event` appends, in one transaction with the flag's removal, conditional on the flag. At most once
        per settle, whoever calls it; 0 when nothing is owed (written already, or never counted) or no such job."""

    def record_unused(self, job_id: str, token: str, usage: Usage, /, **detail: object) -> int:
        """Money spent on the job outside its chunks' counted usage: batch job `token`'s answers nobody took. `usage`
        added to the job's (`updated_at` untouched: spending is not progress), `token` to its `batch_unused`, and its
        `batch.unused` event written, in one transaction conditional on the job not holding `token` yet: at most once
        per (batch job, job), however often a collect is retried. The event's number; 0 when recorded before (or
        there is no such job: nothing is created)."""

    def last_event(self, job_id: str) -> JobEvent | None:
        """The job's latest event (None: none yet)."""

    def events(self, job_id: str, after: int = 0, limit: int | None = None) -> list[JobEvent]:
        """The job's events numbered above `after`, in order (at most `limit`)."""


class JobsRepo(JobRecords, JobCounts, JobEvents, Protocol):
    """The jobs table, and each job's append-only events: `Deps.jobs` (adapters/jobs.py joins the three stores)."""


class ClaimsRepo(Protocol):
    """Chunk records (leases with fencing tokens) and their fenced checkpoints.

    Every write after a claim is conditional on the fencing token; the sweeper's writes also on
    the lease still being lapsed at `lapsed_before` (a heartbeat since its read wins)."""

    def create(self, record: ChunkRecord) -> bool: ...

    def get(self, job_id: str, chunk_id: str) -> ChunkRecord | None: ...

    def for_job(self, job_id: str) -> list[ChunkRecord]:
        """All chunk records of a job, in chunk order."""

    def claim(self, job_id: str, chunk_id: str, owner: str, lease_s: float, receive_count: int,
              deadline_at: float | None = None) -> ClaimResult:
        """Take the lease if free or lapsed, bumping the fence. `deadline_at`: when the claiming Lambda
        invocation times out (None: no function timeout), kept with the lease for the sweeper. The claim ends the
        fences before it: the running spend of their attempts that nobody added yet (`ChunkRecord.unfolded`) is
        added to the chunk's totals and marked folded, once (a second write, only when there is any)."""

    def heartbeat(self, job_id: str, chunk_id: str, fence: int, lease_s: float,
                  spent: AttemptStats | None = None) -> float | None:
        """Extend the lease to the clock's now (read as the call starts) + `lease_s`, fenced; the expiry written,
        None when the fence moved on. `spent`: the attempt's running spend, set as the fence's entry of
        `ChunkRecord.spend` in the same write."""

    def release(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, error: ErrorEnvelope | None,
                *, failure: bool, lapsed_before: float | None = None,
                reason: ReleaseReason = ReleaseReason.RETRY,
                fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        """Give a claimed chunk back (pending), recording the attempt, `reason` and `released_at`.
        A `backpressure` release also extends the chunk's backpressure streak (starts it now if none,
        counts one more requeue); `put_checkpoints` ends the streak (progress).

        `fold` None: the fence's owner ends its own attempt: `stats` is all it spent, and its running-spend entry
        is dropped. Otherwise someone else ends a fence whose attempt died (the sweeper, a cancel): `fold` is the
        record's `spend` as read, and the entries nobody added yet are added with `stats` and marked folded, in
        the same write, conditional on them still being unfolded (once)."""

    def finish(self, job_id: str, chunk_id: str, fence: int, status: ChunkStatus, stats: AttemptStats, *,
               outcome: ChunkOutcome | None = None, error: ErrorEnvelope | None = None,
               states: Collection[ChunkStatus] = (ChunkStatus.CLAIMED,),
               lapsed_before: float | None = None, fold: Mapping[str, Spent] | None = None) -> ChunkRecord | None:
        """Settle the chunk (done | failed | dead_lettered), fenced; `fold` as for `release`."""

    def lapsed(self, now: float) -> Iterator[ChunkRecord]:
        """Claimed chunks whose lease expired before `now`."""

    def await_batch(self, job_id: str, chunk_id: str, fence: int, stats: AttemptStats, pending_key: str,
                    records: int) -> ChunkRecord | None:
        """The holder of `fence` parks the chunk `awaiting_batch`: its lease freed, its attempt's stats added, its
        `records` requests waiting under `pending_key` since now (pipeline/batch_inference.py). None: the fence moved on."""
        ...

    def assign_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None,
                     expected: str | None) -> ChunkRecord | None:
        """While the chunk awaits a batch under `fence` and its batch token is `expected` (None: none), set it to
        `token` (None: remove it). None: the condition failed (cancelled, returned or packed by someone else)."""
        ...

    def return_from_batch(self, job_id: str, chunk_id: str, fence: int, token: str | None, *, stats: AttemptStats,
                          answer_key: str | None = None, failed: bool = False, on_demand: str | None = None,
                          error: ErrorEnvelope | None = None) -> ChunkRecord | None:
        """While the chunk awaits batch `token` (None: none yet) under `fence`: make it pending again, its message
        due (release reason `batch`, `released_at` now, `message_sent_at` removed: the collector sends the message,
        then records it with `message_sent`; a chunk returned and not marked sent is sent again by the next
        collect), adding `stats` (the answered records' calls and batch-priced
        usage), `answer_key` to its answers, one batch failure when `failed`, its on-demand reason, `error`. None:
        the condition failed (nothing changed: the caller sends nothing)."""
        ...

    def reset_for_redrive(self, job_id: str, chunk_id: str, forget: Collection[str] = ()) -> ChunkRecord | None:
        """A failed, dead-lettered or cancelled chunk back to pending with a fresh budget (failures and
        backpressure streak) and a new fence. With `forget` (analyst names), a `done` chunk may be
        reset too, and those analysts' checkpoints are dropped so they run again (a retry of their
        coverage gaps). None when the chunk is in none of those states."""

    def message_sent(self, job_id: str, chunk_id: str, fence: int) -> ChunkRecord | None:
        """Record that a fresh message for the pending, unheld chunk is sent now (`message_sent_at`; fenced;
        the stall reconciler writes it before the send, the batch collector after it). None when it was claimed, settled or redriven since the caller's read: then
        the caller sends nothing (its holder or its redrive has it)."""

    def checkpoints(self, record: ChunkRecord) -> dict[str, Checkpoint]:
        """The chunk's committed checkpoints: analyst -> checkpoint."""

    def put_checkpoints(self, job_id: str, chunk_id: str, fence: int, writes: Sequence[CheckpointWrite],
                        lease_s: float | None = None, spent: AttemptStats | None = None) -> float | None:
        """Persist analysts' outputs and commit them all with one fenced write (with `spent`, the attempt's running
        spend, as `heartbeat` sets it), which also ends the chunk's
        backpressure streak (progress) and, with `lease_s`, extends the lease as a heartbeat would, from the
        clock's now read as the call starts (the outputs' writes take time: the expiry is not counted from the
        end); the lease's expiry after the commit (what the heartbeat counts from), None when the fence moved
        on (nothing committed)."""

    def checkpoint_output(self, checkpoint: Checkpoint) -> str:
        """The checkpointed output (JSON), wherever it is stored."""


@dataclass(frozen=True)
class PresignedUpload:
    """An HTML-form style upload S3 checks (POST `url` with `fields`, then the file as the `file` field)."""

    url: str
    fields: dict[str, str]


class Artifacts(Protocol):
    """The artifact bucket (documents, findings, reports, large checkpoints)."""

    bucket: str

    def put_text(self, key: str, body: str, content_type: str = "application/json") -> None: ...

    def get_text(self, key: str) -> str: ...

    def get_text_range(self, key: str, byte_start: int, byte_end: int) -> str:
        """Bytes [byte_start, byte_end) of a UTF-8 object, decoded (the range must fall on character
        boundaries): a page of chunks without reading the whole document."""

    def delete(self, key: str) -> None:
        """Remove an object (gone already: nothing happens)."""

    def list_keys(self, prefix: str) -> list[str]:
        """Every key of the bucket under `prefix` (an operator's look-up: `review batch` by a prefix of its id)."""

    def read_uri(self, bucket: str, key: str, max_bytes: int | None = None) -> bytes:
        """An object anywhere (intake's claim check); raises `input.document_missing` if absent. With
        `max_bytes`, at most `max_bytes + 1` bytes are read (enough to tell that it is too large)."""

    def presign_upload(self, key: str, max_bytes: int, expires_s: int) -> PresignedUpload:
        """A presigned POST that lets its holder upload one object at `key`, of 1..`max_bytes` bytes (S3
        enforces the signed `content-length-range`), until `expires_s` from now."""

    def presign_download(self, key: str, expires_s: int, filename: str) -> str:
        """A presigned GET of the object at `key`, good until `expires_s` from now, downloaded as `filename`
        (its holder reads that one object with the signer's permission, nothing else)."""


class Queue(StrEnum):
    INTAKE = "intake"
    ANALYSIS = "analysis"
    RESULTS = "results"
    INTAKE_DLQ = "intake_dlq"
    ANALYSIS_DLQ = "analysis_dlq"
    RESULTS_DLQ = "results_dlq"


DLQS = {Queue.INTAKE: Queue.INTAKE_DLQ, Queue.ANALYSIS: Queue.ANALYSIS_DLQ, Queue.RESULTS: Queue.RESULTS_DLQ}


@dataclass(frozen=True)
class QueueMessage:
    message_id: str
    receipt_handle: str
    body: str
    attributes: dict[str, str] = field(default_factory=dict)  # our message attributes (string values)
    receive_count: int = 0
    sent_at: float = 0.0  # epoch seconds


class Queues(Protocol):
    def has(self, queue: Queue) -> bool:
        """Whether the queue is configured (DLQs are optional in some settings)."""

    def send_analysis(self, messages: Sequence[AnalysisMessage], delay_s: int = 0) -> None: ...

    def send_result(self, message: ResultMessage | JobControl, dedup_id: str) -> None: ...

    def send_intake(self, body: str) -> None: ...

    def extend_visibility(self, queue: Queue, receipt_handle: str, seconds: int) -> None: ...

    def dead_letter(self, queue: Queue, body: str, envelope: ErrorEnvelope, **attributes: str) -> None:
        """Send `body` to `queue`'s DLQ with the envelope in its message attributes."""

    def peek(self, queue: Queue) -> list[QueueMessage]:
        """Visible messages, without hiding them (for DLQs: people and the sweeper read them)."""

    def take_all(self, queue: Queue, visibility_s: int = 30) -> list[QueueMessage]:
        """Receive every visible message, hidden for `visibility_s` (redrive)."""

    def delete(self, queue: Queue, receipt_handle: str) -> None: ...

    def depth(self, queue: Queue) -> int:
        """Visible + in flight + delayed."""


@dataclass(frozen=True)
class Deps:
    """Everything a use case takes: settings, the repositories, the clock."""

    settings: Settings
    jobs: JobsRepo
    claims: ClaimsRepo
    artifacts: Artifacts
    queues: Queues
    clock: Clock = time.time
    side_effects: SideEffects | None = None  # the saga's adapters (aggregator, sweeper); None: none configured
    # Undoes a job's side effects (the saga's `compensate_job`, provided by wiring with `side_effects`): the
    # port through which the state machine compensates without importing the saga that builds on it.
    compensator: Compensator | None = None
    # The operator's runtime control of the model (`review quota`: pause, quota); None: none configured
    model_control: ModelControls | None = None
    # The model's quotas the sweeper publishes and the workers pace to (`QuotaStore`); None: not configured
    published_quotas: QuotaStore | None = None
    # The sweeper's read of the model's quotas from Service Quotas (wiring.quota_reader: its clients built on first
    # use, so only the sweeper, which calls it, reads Service Quotas); None: the offline model has no quota
    read_quotas: Callable[[], PublishedQuotas] | None = None
    # The daily token ledger the workers share (model/daily_quota.py); None: not configured (no daily-quota hold)
    token_ledger: TokenLedger | None = None
    meter: RequestMeter | None = None  # counts the AWS requests of the clients above (cost.py); None: not counted
    # Bedrock batch inference (adapters/batch_inference.py) for jobs sent with `inference: batch`, in the functions
    # that submit and collect batch jobs (the sweeper); None: not configured (batch-mode chunks go on-demand)
    batch_inference: BatchInference | None = None
