"""Typed records of one chunk of a job: its record (lease with fencing token, counters, outcome, usage), why it was
given back, the running spend of its attempts, and its analysts' checkpoints. Split from `records.py`, which holds
the job and the records both share (`Usage`, `AttemptStats`, `ChunkStatus`); the DynamoDB form is the
repositories' business (`adapters/claims.py`)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.records import AttemptStats, ChunkStatus, Usage, _Record


class ReleaseReason(StrEnum):
    """Why a claimed chunk was given back (pending). Every reason but `job_ended` leaves a message
    for the chunk on its way: a fresh (maybe delayed) one, or the same one after its tier-2 backoff."""

    BACKPRESSURE = "backpressure"  # throttled, out of time, function timeout: requeued fresh, no failure
    RETRY = "retry"  # a failed attempt (tier 2): the same message comes back after its backoff
    WORKER_LOST = "worker_lost"  # the sweeper found the lease lapsed (a crash): requeued, failure counted
    JOB_ENDED = "job_ended"  # the job ended meanwhile: only the lease is freed
    # held for a cause the backpressure deadline does not bound (an operator's pause, the daily token quota):
    # requeued fresh, no failure, and the chunk's backpressure streak is ended, not extended (the deadline counts
    # from the first backpressure after the hold)
    HELD = "held"
    # its batch job ended (pipeline/batch_inference.py): sent back with its answers, or to be batched again, or on demand
    BATCH = "batch"

    @property
    def sends_message(self) -> bool:
        """The release is followed by a fresh message for the chunk (its `message_sent_at` moves); a tier-2
        retry's message is the same one coming back, and a job that ended gets none."""
        return self in (ReleaseReason.BACKPRESSURE, ReleaseReason.WORKER_LOST, ReleaseReason.HELD, ReleaseReason.BATCH)


class Spent(AttemptStats):
    """An attempt's running spend, as it last wrote it under its fence (`ChunkRecord.spend`): set, not added, by its
    heartbeats and checkpoint commits, so an attempt that dies (a kill -9, a Lambda timeout, out of memory) leaves
    what it had spent up to its last write. `folded`: whoever ended that fence without its owner (the sweeper, a
    later claim, a cancel) added it to the chunk's totals, once; kept so that an owner that was only frozen and
    comes back fenced out adds the rest (`JobsRepo.add_fenced_out`)."""

    folded: bool = False


class ChunkOutcome(_Record):
    """What a chunk that finished `done` leaves on its record."""

    findings_key: str
    coverage: dict[str, str]  # analyst -> ok | refused | failed
    n_findings: int
    models: dict[str, str] = Field(default_factory=dict)  # analyst -> the model its answer came from


class ChunkRecord(Usage):
    """One chunk of a job: its lease (claim + fencing token), counters and outcome; its usage summed over
    its attempts: each ended by its owner adds all it spent; one that died adds what it last wrote of its running
    spend (`spend`), folded in by whoever ended its fence; one fenced out adds its spend when it finds out."""

    job_id: str
    chunk_id: str
    chunk_index: int
    start: int
    end: int
    status: ChunkStatus = ChunkStatus.PENDING
    fence: int = 0  # fencing token: bumped by every claim and redrive
    failures: int = 0  # real failed attempts (the poison budget counts these)
    receives: int = 0  # claims taken
    redeliveries: int = 0  # claims taken on a queue redelivery (receive count > 1)
    last_receive_count: int = 0
    n_calls: int = 0
    retries: dict[str, int] = Field(default_factory=dict)
    repairs: int = 0
    checkpoints: dict[str, int] = Field(default_factory=dict)  # analyst -> fence of its committed checkpoint
    claimed_by: str | None = None
    claimed_at: float | None = None
    claim_expires_at: float | None = None
    last_error: ErrorEnvelope | None = None
    settled_at: float | None = None
    findings_key: str | None = None
    coverage: dict[str, str] = Field(default_factory=dict)
    n_findings: int = 0
    models: dict[str, str] = Field(default_factory=dict)  # analyst -> the model its answer came from (done chunks)
    redriven: int = 0
    redriven_at: float = 0.0
    expires_at: int = 0
    # the claiming Lambda invocation's deadline (epoch s): a lease that lapsed after it timed out, not crashed
    deadline_at: float | None = None
    release_reason: ReleaseReason | None = None  # why the last holder gave it back
    released_at: float | None = None
    # The current backpressure streak: since the first backpressure release after the last progress
    # (a committed checkpoint ends it), and how many requeues it has seen. Bounded by the profile's
    # `backpressure_deadline_s`.
    backpressure_since: float | None = None
    backpressure_requeues: int = 0
    # When the chunk's current analysis message was sent (fan-out, a requeue, a redrive, the reconciler's
    # re-send), written with the record write that precedes the send. A tier-2 retry keeps the same message
    # (and its SQS retention clock). None: a record from before this field (the reconciler's old rule).
    message_sent_at: float | None = None
    # Counted settled on its job (`JobsRepo.settle_new_chunk`: set in one transaction with the job's
    # `settled_count`, taken off with it by `unsettle_chunks`; a reopened job's are rebuilt from the records).
    counted: bool = False
    # Counted, and its `chunk.settled` event not written yet: set by the transaction that counts it, removed by the
    # one that writes the event (`JobsRepo.record_owed_event`), so an aggregator that dies between the two leaves
    # the event owed, and whoever reads the chunk next (a redelivery, finalize, finish-cancel) writes it, once.
    event_owed: bool = False
    # Batch inference (pipeline/batch_inference.py; a job sent with `inference: batch`). The chunk's model requests that
    # have no answer yet wait in S3 (`batch_pending_key`, `batch_records` of them, since `batch_since`) until they
    # are packed into a batch job (`batch_token`, its idempotency token); each ended batch job's answers are
    # stored apart (`batch_answer_keys`) and replayed by the worker. `batch_failures`: batch jobs in which some of
    # its records failed or went missing. `batch_on_demand`: why its remaining calls go on demand instead
    # (`deadline`, `min_records`, `failures`, `unavailable`); None while it stays in the batch lane.
    batch_pending_key: str | None = None
    batch_records: int = 0
    batch_since: float | None = None
    batch_token: str | None = None
    batch_answer_keys: list[str] = Field(default_factory=list)
    batch_failures: int = 0
    batch_on_demand: str | None = None
    # The running spend of its attempts, by fence (as a string: a map key): the current owner's, and those of
    # attempts that died, folded into the totals above by whoever ended their fence (`Spent`). An attempt that
    # ends its own fence drops its entry in the write that adds all it spent.
    spend: dict[str, Spent] = Field(default_factory=dict)

    def unfolded(self, below: int | None = None) -> dict[str, Spent]:
        """The running-spend entries nobody has added to the totals yet (of fences below `below`, when given)."""
        return {k: e for k, e in self.spend.items() if not e.folded and (below is None or int(k) < below)}

    @property
    def settled(self) -> bool:
        return self.status.settled

    @property
    def cancelled_at_stage(self) -> str | None:
        """Where a cancelled chunk stopped: `claim`, `not started`, or the analyst under way."""
        return self.last_error.step if self.status is ChunkStatus.CANCELLED and self.last_error else None

    def message_on_its_way(self, now: float, window_s: float) -> bool:
        """Released within `window_s` for a reason that sends (or returns) its message: not lost."""
        return (self.release_reason not in (None, ReleaseReason.JOB_ENDED)
                and (self.released_at or 0.0) >= now - window_s)

    @property
    def batch_message_due(self) -> bool:
        """Returned from batch (pending, unheld, release reason `batch`) and its message not recorded as sent since:
        the collector that returned it died or failed before its send (pipeline/batch_inference.py sends it again)."""
        return (self.status is ChunkStatus.PENDING and self.claimed_by is None
                and self.release_reason is ReleaseReason.BATCH
                and self.message_sent_at is None)

    def lease_live(self, now: float) -> bool:
        return self.status is ChunkStatus.CLAIMED and (self.claim_expires_at or 0.0) > now


class ClaimResult(BaseModel):
    won: bool
    fence: int
    record: ChunkRecord | None  # the record after the claim when won; the winner's record when lost


class Checkpoint(_Record):
    """One analyst's committed output for a chunk, written under the writer's fencing token."""

    job_id: str
    chunk_id: str
    analyst: str
    fence: int
    config_hash: str  # the analyst's analysis identity when it was made (review/analysts.py analyst_identity)
    status: str
    created_at: float
    output: str | None = None  # JSON of AnalystOutput, inline when small
    output_key: str | None = None  # else in S3
    expires_at: int = 0


class CheckpointWrite(BaseModel):
    """An analyst's output to checkpoint (`ClaimsRepo.put_checkpoints`: several are committed at once)."""

    model_config = ConfigDict(frozen=True)
    analyst: str
    config_hash: str  # the analyst's analysis identity: the checkpoint is reused only under the same one
    status: str
    output_json: str
