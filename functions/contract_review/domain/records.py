"""Typed records: the job, its usage and events (a chunk's record and checkpoints: `chunk_records.py`; the
runtime control of the model: `control_records.py`). One place defines each record's fields; the DynamoDB form is the repositories' business (`adapters/`), never the
use cases'.

Items stay far below DynamoDB's 400 KB whatever the document size: a job carries counts and a
bounded sample of its missing chunks and coverage gaps; the full lists live in the report (S3)
and are recomputed from the chunk records on demand.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from contract_review.domain.errors import ErrorEnvelope

LIST_SAMPLE = 20  # at most this many missing chunks / gaps are copied onto a job item


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"  # a side effect's outcome is ambiguous: a person decides
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLING = "cancelling"  # cancel requested: no new work starts; cancelled once every chunk settled
    # failing (its error is written): the side effects it did are being undone; `failed` once they are (or are
    # dead-lettered). Non-terminal, so a crash or a lost message leaves work the sweeper finishes.
    COMPENSATING = "compensating"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


TERMINAL_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.DEAD_LETTERED, JobState.CANCELLED})


class ChunkStatus(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"  # its job was cancelled: stopped (or never started) without a result
    # Its model calls wait in Bedrock batch inference (pipeline/batch_inference.py): nobody holds it and no message is in
    # flight; the batch collector sends it back (pending, with a message) when its batch job ends. Outside the
    # stall reconciler, the backpressure deadline and the visibility timeout.
    AWAITING_BATCH = "awaiting_batch"

    @property
    def settled(self) -> bool:
        return self in SETTLED_CHUNK_STATES


SETTLED_CHUNK_STATES = frozenset({ChunkStatus.DONE, ChunkStatus.FAILED, ChunkStatus.DEAD_LETTERED,
                                  ChunkStatus.CANCELLED})


def job_id_for(idempotency_key: str) -> str:
    """A job's id: a client can compute it before sending (docs/message-schema.md)."""
    return "job-" + hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:20]


class ChunkMark(Protocol):
    """What says whether a chunk is counted settled on its job (`Job.counts`): a `ChunkRecord`
    (chunk_records.py, which builds on this module)."""

    @property
    def chunk_id(self) -> str: ...

    @property
    def counted(self) -> bool: ...


class ChunkTally(Protocol):
    """A chunk's counters a job's `Reliability` sums: a `ChunkRecord`'s."""

    @property
    def n_calls(self) -> int: ...

    @property
    def retries(self) -> dict[str, int]: ...

    @property
    def repairs(self) -> int: ...

    @property
    def redeliveries(self) -> int: ...

    @property
    def receives(self) -> int: ...

    @property
    def failures(self) -> int: ...


class _Record(BaseModel):
    # extra="ignore": an item written by a newer deployment still reads (rolling deploys)
    model_config = ConfigDict(extra="ignore", use_enum_values=False)


# ------------------------------------------------------------------------------ cost (cost.py)
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "aws_requests",
                "model_micro_usd", "aws_micro_usd", "timed_out_calls", "estimated_micro_usd")


class Usage(_Record):
    """What work spent: model tokens (as Bedrock's Converse `usage` reports them: `input_tokens` excludes the
    tokens read from or written to the prompt cache), AWS requests, and their cost in integer micro-dollars
    (USD x 1,000,000) at the profile's price table. The same flat fields on an attempt, a chunk record (summed
    over its attempts) and a job (summed over its settled chunks), so each is one atomic ADD."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    aws_requests: int = 0  # orchestration requests (DynamoDB, SQS, S3, Lambda invocations)
    model_micro_usd: int = 0
    aws_micro_usd: int = 0
    # Model calls that timed out on the client (a read timeout: the request reached Bedrock, no answer came back),
    # which Bedrock may still have run and billed: their count, and their cost as estimated (no usage came back to
    # measure), at its upper bound: the request's estimated input tokens plus its `maxTokens`, at the on-demand
    # prices (docs/cost.md "Estimated spend"). Counted toward the job's budget, shown apart from measured spend.
    timed_out_calls: int = 0
    estimated_micro_usd: int = 0

    @property
    def measured_micro_usd(self) -> int:
        """What was measured: the model's answers (their reported tokens) and the AWS requests."""
        return self.model_micro_usd + self.aws_micro_usd

    @property
    def total_micro_usd(self) -> int:
        """Measured plus estimated: what a budget is checked against."""
        return self.measured_micro_usd + self.estimated_micro_usd

    def usage(self) -> Usage:
        """Only the usage fields (of a chunk record or job that carries them)."""
        return Usage(**{f: getattr(self, f) for f in USAGE_FIELDS})

    def scaled(self, factor: int) -> Usage:
        return Usage(**{f: factor * getattr(self, f) for f in USAGE_FIELDS})

    @classmethod
    def of(cls, items: Iterable[Usage]) -> Usage:
        totals = dict.fromkeys(USAGE_FIELDS, 0)
        for item in items:
            for f in USAGE_FIELDS:
                totals[f] += getattr(item, f)
        return Usage(**totals)


# ------------------------------------------------------------------------------ chunk records
class AttemptStats(Usage):
    """What one chunk attempt spent: model calls, tier-1 retries by code, semantic repairs, and its usage
    (tokens, AWS requests, their cost)."""

    calls: int = 0
    repairs: int = 0
    retries: dict[str, int] = Field(default_factory=dict)

    def plus(self, other: AttemptStats) -> AttemptStats:
        return self._combined(other, 1)

    def minus(self, other: AttemptStats) -> AttemptStats:
        """What this (an attempt's whole spend) adds to `other` (an earlier snapshot of it): never below zero."""
        return self._combined(other, -1)

    def _combined(self, other: AttemptStats, sign: int) -> AttemptStats:
        def num(a: int, b: int) -> int:
            return max(0, a + sign * b)
        retries = {c: num(self.retries.get(c, 0), other.retries.get(c, 0)) for c in {*self.retries, *other.retries}}
        return AttemptStats(calls=num(self.calls, other.calls), repairs=num(self.repairs, other.repairs),
                            retries={c: n for c, n in retries.items() if n},
                            **{f: num(getattr(self, f), getattr(other, f)) for f in USAGE_FIELDS})


# ------------------------------------------------------------------------------ the job
class MissingChunk(_Record):
    chunk_id: str
    chunk_index: int
    status: ChunkStatus
    error: ErrorEnvelope | None = None
    failures: int = 0


class CoverageGap(_Record):
    chunk_id: str
    chunk_index: int
    analyst: str
    status: str  # refused | failed | missing | the chunk's status


class Reliability(_Record):
    model_calls: int = 0
    retries_by_code: dict[str, int] = Field(default_factory=dict)
    repairs: int = 0
    redeliveries: int = 0
    claims: int = 0
    chunk_failures: int = 0

    @classmethod
    def of(cls, chunks: Iterable[ChunkTally]) -> Reliability:
        chunks = list(chunks)
        retries: Counter[str] = Counter()
        for c in chunks:
            retries.update(c.retries)
        return cls(model_calls=sum(c.n_calls for c in chunks), retries_by_code=dict(retries),
                   repairs=sum(c.repairs for c in chunks), redeliveries=sum(c.redeliveries for c in chunks),
                   claims=sum(c.receives for c in chunks), chunk_failures=sum(c.failures for c in chunks))


class CoverageSummary(_Record):
    mandatory_gaps: int = 0
    optional_gaps: int = 0
    missing_chunks: int = 0


class JobOutcome(_Record):
    """What finalize writes onto the job when it ends (bounded: counts plus a sample)."""

    report_json_key: str
    report_md_key: str
    ended_at: float
    n_findings: int
    reliability: Reliability
    coverage_summary: CoverageSummary
    error: ErrorEnvelope | None = None
    error_code: str | None = None
    root_error: ErrorEnvelope | None = None
    missing: list[MissingChunk] = Field(default_factory=list)  # the first LIST_SAMPLE
    mandatory_gaps: list[CoverageGap] = Field(default_factory=list)  # the first LIST_SAMPLE


class JobFailure(_Record):
    """What a job-fatal error writes onto the job."""

    error: ErrorEnvelope
    error_code: str
    ended_at: float


class Cancellation(_Record):
    """What a cancel request writes onto the job (`cancelling`), and its end (`cancelled`)."""

    cancel_requested_at: float
    cancelled_by: str = ""
    cancel_code: str = "job.cancelled"  # the code the job ends with: job.cancelled, or job.budget_exceeded




class Rebudgeted(Usage):
    """A budget-stopped job reopened by `review retry --budget-usd N`: its running cost, and its new budget."""

    budget_micro_usd: int


class StepStatus(StrEnum):
    """What became of one side-effect step (saga.py)."""

    STARTED = "started"  # written ahead, before acting: the outcome is not known yet (compensation looks its key up)
    DONE = "done"  # the external action happened (or was found to have happened by its key)
    SKIPPED = "skipped"  # nothing to do (no high-risk finding) or nowhere to do it (no ticket system configured)
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"  # its compensation exhausted its retries: in the compensation DLQ


class SideEffectDone(_Record):
    """A side effect the job performed (saga.py): what compensation undoes, what `status` shows."""

    step: str  # e.g. ticket.open, report.publish
    key: str  # its idempotency key
    at: float
    result: dict[str, JsonValue] = Field(default_factory=dict)  # e.g. {"ticket_id": ...}
    # the saga's bookkeeping: the step's operation and status, and its compensation
    operation: str = ""
    status: StepStatus = StepStatus.DONE
    reason: str = ""  # why skipped
    compensation_key: str | None = None
    compensation_result: dict[str, JsonValue] = Field(default_factory=dict)
    error: ErrorEnvelope | None = None  # the compensation's last error
    generation: int = 0  # how many times the step was compensated and done again (in its key from 1 on)


class Approval(_Record):
    """Why a job waits for a person (`waiting_approval`): a side effect whose outcome is unknown."""

    step: str
    key: str
    reason: str  # what happened, in words
    error: ErrorEnvelope | None = None
    evidence: dict[str, JsonValue] = Field(default_factory=dict)
    requested_at: float
    expires_at: float
    decision: str | None = None  # approve | reject | expired
    decided_by: str = ""
    decided_at: float | None = None


class AwaitApproval(_Record):
    approval: Approval


# Fields a reopened job sheds (its earlier ending no longer holds).
# What an ending writes (JobOutcome, JobFailure): a reopened job drops them all, so a later ending that writes
# fewer (a failure after waiting for approval) never leaves an earlier ending's report or counts behind
OUTCOME_FIELDS = ("error", "error_code", "root_error", "missing", "mandatory_gaps", "ended_at", "report_json_key",
                  "report_md_key", "n_findings", "reliability", "coverage_summary")


class Waiting(_Record):
    """What a job's chunks are held for, as `review status` and GET /jobs/{id} show it."""

    condition: str  # daily_token_quota | spend_cap (domain/spend_cap.py: held at admission until the next UTC day)
    model_id: str = ""  # daily_token_quota: the model whose quota it waits for
    tokens_per_day: float | None = None  # daily_token_quota: that quota
    since: float  # when a worker first held one of the job's chunks for it (spend_cap: when intake held the job)
    detail: str  # one line for people: "waiting for the daily token quota of MODEL ..., re-probed hourly"


class Submission(BaseModel):
    """What the Job API writes (`keys.submission_key`) before it sends a job's intake message: it answers for the
    job until intake has recorded it, binds the job to its principal, and is what intake trusts a message's
    `principal` on (only the API's role may write it)."""

    job_id: str
    principal: str
    document_sha256: str
    submitted_at: float
    batch_id: str | None = None


class Priority(StrEnum):
    """Which work is served first when both wait (pipeline/priority.py): `interactive` (someone is waiting: `POST
    /jobs`, `review submit`) or `bulk` (batches: `POST /batches`, `review submit --batch`, `--priority bulk`). Our
    own lanes, not Bedrock's service tiers."""

    INTERACTIVE = "interactive"
    BULK = "bulk"


class Inference(StrEnum):
    """How a job's model calls are made: `on_demand` (each call as it comes, the default) or `batch` (Bedrock batch
    inference, at the batch price, within hours: pipeline/batch_inference.py, docs/batch-inference.md)."""

    ON_DEMAND = "on_demand"
    BATCH = "batch"


class Job(Usage):
    """A job, and (Usage) what it spent: a running total the aggregator adds each settled chunk's usage to, in
    the update that settles it (the per-job budget is checked against it)."""

    job_id: str
    state: JobState
    created_at: float
    updated_at: float
    idempotency_key: str
    document_id: str = ""
    document_key: str = ""
    document_chars: int = 0
    document_sha256: str = ""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    chunk_count: int = 0
    # The fan-out cursor (fanout.py): chunks [0, fanned_out) have their records and were sent. None: a job
    # with no cursor (failed on its input, or taken in before fan-out in pages: everything was sent at once).
    fanned_out: int | None = None
    analyst_count: int = 0
    model_id: str = ""  # the model its calls go to: the one recorded at intake, or the one it fell back to
    # the models it ran on before (pipeline/fallback.py), oldest first: checkpoints made under them are kept
    earlier_models: list[str] = Field(default_factory=list)
    model_provider: str = ""
    prompt_version: str = ""
    config_hash: str = ""  # the job's analysis identity, over its analysts' (analysts.py job_config_hash): reporting
    source_message_id: str = ""
    # How many chunks the aggregator counted (`JobsRepo.settle_new_chunk`). Which ones is on their chunk records
    # (`ChunkRecord.counted`), written in one transaction with this count: the job item does not grow with the
    # document (each write to it is billed at its whole size).
    settled_count: int = 0
    # Jobs written before the count: the ids of the chunks counted so far, in a string set on the job item
    # (attribute `settled`). Read, never added to: such a job's counted chunks are these plus the flagged ones.
    legacy_settled: set[str] = Field(default_factory=set, validation_alias="settled", exclude=True)
    # Bumped whenever chunks are uncounted (`JobsRepo.unsettle_chunks`: a reopened chunk, or one
    # finalize found unsettled). Finalize's transition is conditional on the value it read with the job,
    # so a chunk reopened between finalize's read of the chunk records and its transition keeps the job
    # running instead of stranding the chunk `pending` under an ended job.
    settled_version: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    error: ErrorEnvelope | None = None
    error_code: str | None = None
    root_error: ErrorEnvelope | None = None
    missing: list[MissingChunk] = Field(default_factory=list)
    mandatory_gaps: list[CoverageGap] = Field(default_factory=list)
    reliability: Reliability | None = None
    coverage_summary: CoverageSummary | None = None
    report_json_key: str | None = None
    report_md_key: str | None = None
    n_findings: int | None = None
    requeues: int = 0  # backpressure requeues of its chunks (JobsRepo.count_requeue; metric BackpressureRequeues)
    expires_at: int = 0
    # --- lifecycle (lifecycle.py) -------------------------------------------------------------
    version: int = 0  # bumped by every state transition; transitions are conditional on it
    event_seq: int = 0  # the last event number used (events are numbered 1, 2, ... per job)
    principal: str | None = None  # who submitted it through the Job API (None: the intake queue)
    cancel_requested_at: float | None = None
    cancelled_by: str = ""
    cancel_code: str = "job.cancelled"
    # The job's budget (micro-dollars): once its recorded cost reaches it, the job is stopped like a cancel and
    # ends `cancelled` with job.budget_exceeded (aggregator.py). None: no budget.
    budget_micro_usd: int | None = None
    # The document's estimated model cost (admission.estimate), kept with a budget: the fan-out sends no more
    # chunks than the budget left covers at this estimate per chunk (fanout.page_size).
    estimate_micro_usd: int | None = None
    # Interactive chunks are served before bulk ones when both wait (pipeline/priority.py); a job from before
    # priorities is interactive, as `POST /jobs` was.
    priority: Priority = Priority.INTERACTIVE
    # Batch inference (pipeline/batch_inference.py): the job's deadline (epoch s), by which its batch-mode chunks go on
    # demand if their batch jobs have not answered; None for on-demand jobs.
    inference: Inference = Inference.ON_DEMAND
    deadline_at: float | None = None
    # A batch-mode job: when a worker first took one of its chunks on demand (`JobsRepo.mark_on_demand`). Until then
    # its chunks wait in batch jobs, not on the workers, and its priority asks nothing of bulk work (priority.py).
    on_demand_since: float | None = None
    # The batch jobs (tokens) whose answers nobody took are on this job's usage (`JobsRepo.record_unused`: once each).
    batch_unused: set[str] = Field(default_factory=set)
    side_effects: list[SideEffectDone] = Field(default_factory=list)
    approval: Approval | None = None
    # A named condition the job's chunks are held for (the daily token quota), set by the worker that first held
    # one, removed when a chunk of the job makes progress again (JobsRepo.set_waiting). None: not waiting.
    waiting: Waiting | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def undo_pending(self) -> bool:
        """A side effect started or done and not undone (or whose compensation failed): what compensation acts on."""
        return any(e.status in (StepStatus.STARTED, StepStatus.DONE, StepStatus.COMPENSATION_FAILED)
                   for e in self.side_effects)

    @property
    def replaceable(self) -> bool:
        """A job that failed on its input (`input.*`), or whose budget or estimate was refused before it ran
        (`job.budget_insufficient`; `quota.spend_cap`: over the stack's whole daily cap): a corrected submission with
        the same key replaces it."""
        code = self.error_code or ""
        return self.state is JobState.FAILED and (code.startswith("input.")
                                                  or code in ("job.budget_insufficient", "quota.spend_cap"))

    def key_conflict(self, sha: str, same_sender: bool) -> str | None:
        """The one rule for a submission whose idempotency key names this job (intake, and the one submit of the Job
        API, `review submit` and the status page: `operate/submission.py`): refused, `input.key_conflict`, when the
        job is of another document and not `replaceable` ("another document"), or of another sender, a Job API
        principal or none ("another principal"). None: the submission names this job: the same job again (a replay),
        or a corrected document replacing a job that failed on its input."""
        if self.document_sha256 and self.document_sha256 != sha and not self.replaceable:
            return "another document"
        return None if same_sender else "another principal"

    @property
    def n_settled(self) -> int:
        """How many of its chunks are counted settled (the count, plus an older job's set)."""
        return self.settled_count + len(self.legacy_settled)

    def counts(self, chunk: ChunkMark) -> bool:
        """Whether `chunk` (one of this job's records) is counted settled on the job."""
        return chunk.counted or chunk.chunk_id in self.legacy_settled

    @property
    def progress(self) -> float:
        if self.chunk_count:
            return self.n_settled / self.chunk_count
        return 1.0 if self.terminal else 0.0


EVENT_SEQ_DIGITS = 12


def event_seq(number: int) -> str:
    """An event's sort key: its number in the job's sequence, zero-padded (sorts as it counts)."""
    return f"{number:0{EVENT_SEQ_DIGITS}d}"


class JobEvent(_Record):
    job_id: str
    seq: str  # sort key: `event_seq(number)`
    type: str
    at: float
    detail: dict[str, JsonValue] = Field(default_factory=dict)

    @property
    def number(self) -> int:
        """The event's place in its job's sequence (1, 2, ...); 0 for an event without one."""
        return int(self.seq) if self.seq.isdigit() else 0
