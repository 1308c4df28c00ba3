"""The job's state machine: the one table of legal transitions, every transition, and cancellation.

`TRANSITIONS` is the state machine, written once: `python -m contract_review.domain.lifecycle >
docs/job-states.md` (`make docs`) renders it with the reason for each move (`WHY`), and a test keeps the
committed page equal to it.

`transition` checks the table (an illegal transition raises `IllegalTransition`: a bug, never an
operational outcome), makes one conditional write on the job's `version` as the caller read it,
and appends the transition's event under the job's next event number (after the write: a crash between the
two loses the event, never leaves a hole in the numbers). It returns None when the job
changed since that read: the caller re-reads and decides again (`move` does that for callers that
only know which states they accept).

Cancellation (`request_cancel`, `finish_cancel`; docs/runbook.md "Cancelling a job"): the job goes to
`cancelling` at once; no stage starts new work for a `cancelling` job (intake does not fan it out,
a worker stops before its next model call, the saga starts no side effect); chunks nobody holds are
settled `cancelled` here; when every chunk has settled, side effects already done are compensated
and the job is `cancelled`. The aggregator finishes it (a control message in the job's FIFO group,
so it is ordered with the job's results); the sweeper does for a cancelling job without progress.

Failing with side effects done (`fail_compensating`, `finish_compensation`): the job's error is written with
the move to `compensating`, the side effects are undone, and only then is the job `failed`. A lost control
message or a crash half-way leaves a `compensating` job, which the sweeper finishes; so the terminal state
never stands over a ticket left open.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from pydantic import BaseModel

from contract_review.domain import spend_cap
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.messages import JobControl
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    AttemptStats,
    Cancellation,
    ChunkStatus,
    Job,
    JobEvent,
    JobFailure,
    JobState,
    Usage,
)

S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.RUNNING, S.FAILED, S.CANCELLING}),
    S.RUNNING: frozenset({S.WAITING_APPROVAL, S.COMPLETED, S.FAILED, S.DEAD_LETTERED, S.CANCELLING, S.COMPENSATING}),
    S.WAITING_APPROVAL: frozenset({S.RUNNING, S.FAILED, S.COMPENSATING, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.COMPENSATING: frozenset({S.FAILED}),
    S.FAILED: frozenset({S.RUNNING, S.QUEUED}),
    S.DEAD_LETTERED: frozenset({S.RUNNING}),
    S.COMPLETED: frozenset(),
    S.CANCELLED: frozenset({S.RUNNING}),  # `review retry`: resumed from its checkpoints
}
# Why a job takes each move of `TRANSITIONS` (rendered into docs/job-states.md; a test keeps the keys equal).
WHY: dict[tuple[JobState, JobState], str] = {
    (S.QUEUED, S.RUNNING): "intake stored the document and its fan-out plan; the first page of chunks goes out",
    (S.QUEUED, S.FAILED): "invalid input, or intake never finished its message (`runtime.intake_exhausted`)",
    (S.QUEUED, S.CANCELLING): "`review cancel`, `POST /jobs/{id}/cancel`: no new work starts",
    (S.RUNNING, S.CANCELLING): "`review cancel`, `POST /jobs/{id}/cancel`, or its budget reached (`job.budget_exceeded`)",
    (S.WAITING_APPROVAL, S.CANCELLING): "`review cancel`, `POST /jobs/{id}/cancel`",
    (S.RUNNING, S.WAITING_APPROVAL): "a side effect's outcome is unknown: a person approves or rejects",
    (S.RUNNING, S.COMPLETED): "every mandatory analyst ran on every chunk; the report is written",
    (S.RUNNING, S.FAILED): "a job-fatal error, or a mandatory gap (`job.chunks_missing`), nothing left to undo",
    (S.RUNNING, S.DEAD_LETTERED): "a chunk used its whole attempt budget",
    (S.RUNNING, S.COMPENSATING): "failing with side effects done: they are undone first",
    (S.WAITING_APPROVAL, S.RUNNING): "`review approve`: the step is retried with the same key",
    (S.WAITING_APPROVAL, S.COMPENSATING): "`review reject`, or no decision before the approval expired",
    (S.WAITING_APPROVAL, S.FAILED): "rejected or expired with nothing left to undo",
    (S.CANCELLING, S.CANCELLED): "every chunk in flight stopped and done side effects were compensated",
    (S.COMPENSATING, S.FAILED): "every compensation ran or went to the compensation DLQ",
    (S.FAILED, S.RUNNING): "reopened: `review retry`, `review dlq redrive`, or the same document again",
    (S.FAILED, S.QUEUED): "a job failed in intake sent again, or an input error replaced under its key",
    (S.DEAD_LETTERED, S.RUNNING): "reopened: `review retry`, `review dlq redrive`",
    (S.CANCELLED, S.RUNNING): "`review retry` (a budget-stopped job with `--budget-usd`): resumed from its checkpoints",
}
CANCELLABLE = (S.QUEUED, S.RUNNING, S.WAITING_APPROVAL)
MOVE_ATTEMPTS = 5
COUNT_READS = 10  # a settle that found the chunk's usage changed since its read (an attempt fenced out) reads it again
_NO_STATS = AttemptStats()


class IllegalTransition(ReviewError):
    def __init__(self, job_id: str, from_state: JobState, to: JobState):
        super().__init__(ErrorEnvelope.of("runtime.internal", f"illegal transition of {job_id}: {from_state.value} -> "
                                                              f"{to.value}", step="lifecycle"))
        self.from_state, self.to = from_state, to


def check(from_state: JobState, to: JobState, job_id: str = "") -> None:
    if to not in TRANSITIONS[from_state]:
        raise IllegalTransition(job_id, from_state, to)


def transition(deps: Deps, job: Job, to: JobState, *, event: str | None = None,
               detail: dict[str, object] | None = None, started_at: float | None = None,
               outcome: BaseModel | None = None, settled: set[str] | None = None,
               if_settled_version: int | None = None) -> Job | None:
    """`job` (as the caller read it) -> `to`: checked against the table, conditional on the job's
    version, its event (`event`, default `job.<to>`) appended. The new job, or None when the job
    changed since the read."""
    check(job.state, to, job.job_id)
    new = deps.jobs.transition(job.job_id, (job.state,), to, started_at=started_at, outcome=outcome,
                               settled=settled, if_settled_version=if_settled_version,
                               if_version=job.version)
    if new is None:
        return None
    deps.jobs.record_event(job.job_id, event or f"job.{to.value}", **{"from_state": job.state.value, **(detail or {})})
    return new


def move(deps: Deps, job_id: str, from_states: Collection[JobState], to: JobState, *, event: str | None = None,
         detail: dict[str, object] | None = None, started_at: float | None = None, outcome: BaseModel | None = None,
         settled: set[str] | None = None) -> Job | None:
    """Read the job and make the transition if it is in `from_states`, again while it keeps changing
    within them. None when it is (or becomes) in another state."""
    for _ in range(MOVE_ATTEMPTS):
        job = deps.jobs.get(job_id)
        if job is None or job.state not in from_states:
            return None
        new = transition(deps, job, to, event=event, detail=detail, started_at=started_at, outcome=outcome,
                         settled=settled)
        if new is not None:
            return new
    return None


# ------------------------------------------------------------------------------ events
def read_events(deps: Deps, job_id: str, after: int = 0, limit: int | None = None) -> list[JobEvent]:
    """The job's events after number `after`, in order: every one (however many pages the store reads), or the
    first `limit` of them (fewer only when there are no more).

    An event and its number are written together (`JobsRepo.record_event`: one transaction with the job's counter),
    so a reader never sees number n+1 before n, and resuming after the last event read loses nothing. (Numbers
    used to be taken before the event was written, and a reader waited out a 260 s grace at every gap in case
    its writer was still under way; a gap left by an older version's writer that died is simply passed.)"""
    return deps.jobs.events(job_id, after=after, limit=limit)


def settled_event(deps: Deps, chunk: ChunkRecord, job: Job, **extra: object) -> int:
    """The `chunk.settled` event the settle that counted `chunk` owes (`JobsRepo.record_owed_event`): written once,
    by the writer that counted the chunk or, if that one stopped before writing it, by whoever finds it owed next
    (a redelivered result, finalize, finish-cancel). `job`: as counted (its progress goes in the event). The event's
    number, 0 when it was not owed (any more)."""
    return deps.jobs.record_owed_event(chunk.job_id, chunk.chunk_id, "chunk.settled", chunk_id=chunk.chunk_id,
                                       chunk_index=chunk.chunk_index, status=chunk.status.value,
                                       settled=job.n_settled, total=job.chunk_count, **extra)


# ------------------------------------------------------------------------------ cancellation
class CancelOutcome(BaseModel):
    job_id: str
    state: JobState | None  # the job's state afterwards (None: no such job)
    changed: bool  # this request moved the job to `cancelling`
    message: str


def request_cancel(deps: Deps, job_id: str, by: str = "", code: str = "job.cancelled") -> CancelOutcome:
    """Cancel a job. One defined outcome per state: queued / running / waiting_approval -> `cancelling`
    (then `cancelled` once every chunk settled); cancelling or cancelled -> unchanged (cancelling twice
    is cancelling once); completed / failed / dead_lettered -> unchanged, "already ended". A cancel
    racing the job's completion: both are conditional on the job's version, exactly one wins. `code`: the
    code the job ends with (`job.cancelled`; `job.budget_exceeded` when its budget stops it)."""
    for _ in range(MOVE_ATTEMPTS):
        job = deps.jobs.get(job_id)
        if job is None:
            return CancelOutcome(job_id=job_id, state=None, changed=False, message="no such job")
        if job.state in (S.CANCELLING, S.CANCELLED):
            return CancelOutcome(job_id=job_id, state=job.state, changed=False,
                                 message=f"already {job.state.value} (requested by {job.cancelled_by or 'someone'})")
        if job.state is S.COMPENSATING:
            return CancelOutcome(job_id=job_id, state=job.state, changed=False, message=(
                f"the job is failing ({job.error_code}): what it did is being undone; there is nothing to cancel"))
        if job.state not in CANCELLABLE:
            return CancelOutcome(job_id=job_id, state=job.state, changed=False,
                                 message=f"the job already ended {job.state.value}: there is nothing to cancel")
        new = transition(deps, job, S.CANCELLING, event="job.cancelling", detail={"by": by, "code": code},
                         outcome=Cancellation(cancel_requested_at=deps.clock(), cancelled_by=by, cancel_code=code))
        if new is not None:
            control = JobControl(job_id=job_id, control="cancel", by=by)
            deps.queues.send_result(control, control.dedup_id(str(new.version)))
            return CancelOutcome(job_id=job_id, state=new.state, changed=True,
                                 message="cancelling: no new work starts; cancelled once the chunks in flight stop")
    now = deps.jobs.get(job_id)
    return CancelOutcome(job_id=job_id, state=now.state if now else None, changed=False,
                         message="the job kept changing; ask again")


def stop(deps: Deps, job: Job, *, by: str, code: str, detail: dict[str, object] | None = None) -> JobState:
    """Stop a running job from inside the pipeline (the aggregator: its budget is spent) the way a cancel does,
    ending with `code`: `cancelling` at once, then `cancelled` once every chunk settled (`finish_cancel`). No
    control message: the caller is the aggregator, and each later result of the job finishes the cancel. The
    job's state afterwards."""
    new = transition(deps, job, S.CANCELLING, event="job.cancelling", detail={"by": by, "code": code, **(detail or {})},
                     outcome=Cancellation(cancel_requested_at=deps.clock(), cancelled_by=by, cancel_code=code))
    now = new or deps.jobs.get(job.job_id)
    if now is None:
        return S.CANCELLED
    return finish_cancel(deps, now) if now.state is S.CANCELLING else now.state


def cancel_envelope(stage: str) -> ErrorEnvelope:
    return ErrorEnvelope.of("job.cancelled", "the job was cancelled", step=stage)


class JobCancelled(ReviewError):
    """Raised before a model call when the job is being cancelled; `stage` is where work stopped."""

    def __init__(self, stage: str):
        super().__init__(cancel_envelope(stage))
        self.stage = stage


# How long one read of the job's state answers the cancellation check: every model call of every analyst of a
# chunk asks, and a strongly consistent read of the job item before each one made the job item the hottest read
# of the table. A worker stops within one model call and about this long of a cancel.
CANCEL_CHECK_MAX_AGE_S = 1.0


class CancelWatch:
    """Before every model call (`Retrier.check`), the job's state as read at most `max_age_s` ago (a strongly
    consistent read when the last one is older): a worker stops within one model call (and `max_age_s`) of a
    cancel. Shared by the chunk's analyst threads: one read answers all of them. `stage` is kept up to date by
    the caller (the analyst under way)."""

    def __init__(self, deps: Deps, job_id: str, max_age_s: float = CANCEL_CHECK_MAX_AGE_S):
        self.deps, self.job_id, self.max_age_s = deps, job_id, max_age_s
        self.stage = "claim"
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._cancelled = False

    def check(self) -> None:
        with self._lock:  # the analysts' threads wait for the one read under way instead of each reading
            now = self.deps.clock()
            if not self._cancelled and now - self._read_at >= self.max_age_s:
                job = self.deps.jobs.get(self.job_id)
                self._cancelled = job is None or job.state in (S.CANCELLING, S.CANCELLED)
                self._read_at = now
            cancelled = self._cancelled
        if cancelled:
            raise JobCancelled(self.stage)


def count_settled(deps: Deps, chunk: ChunkRecord, extra: Usage | None = None) -> Job | None:
    """Count a settled chunk on its job with what it spent (`chunk`'s usage as read, plus `extra`: the counter's own
    requests), once (`JobsRepo.settle_new_chunk`). The settle is conditional on the record's usage still being what
    was read: an attempt fenced out of the chunk may add its spend in between (`add_fenced_out`, to the uncounted
    record only), and would be on no job. Then the record is read again and counted with it. Conditional too on the
    record's fence and status as the caller read them (a redrive since moved them: not this settle's to count). The
    job after the count; None when this call did not count it (counted already, or the chunk moved on)."""
    fence, status = chunk.fence, chunk.status
    for _ in range(COUNT_READS):
        read = chunk.usage()
        usage = Usage.of([read, extra or Usage()])
        counted = deps.jobs.settle_new_chunk(chunk.job_id, chunk.chunk_id, usage=usage, fence=fence, status=status,
                                             read=read)
        if counted is not None:
            spend_cap.record(deps, usage.total_micro_usd)  # the stack's recorded spend of the day (after the count)
            return counted
        fresh = deps.claims.get(chunk.job_id, chunk.chunk_id)
        if fresh is None or fresh.counted or (fresh.fence, fresh.status) != (fence, status) or fresh.usage() == read:
            return None  # counted (by another, or before), or moved on: not for lack of the usage read
        chunk = fresh
    raise RuntimeError(f"chunk {chunk.job_id}/{chunk.chunk_id}: its usage kept changing ({COUNT_READS} reads)")


def cancel_chunk(deps: Deps, r: ChunkRecord, stage: str, now: float) -> ChunkRecord | None:
    """Settle a chunk nobody holds `cancelled` (fenced, and only while its lease is lapsed or absent), with what an
    attempt that died holding it had spent folded in."""
    return deps.claims.finish(r.job_id, r.chunk_id, r.fence, ChunkStatus.CANCELLED, _NO_STATS,
                              error=cancel_envelope(stage),
                              states=(ChunkStatus.PENDING, ChunkStatus.CLAIMED, ChunkStatus.AWAITING_BATCH),
                              lapsed_before=now, fold=r.spend)


def _lease_live(r: ChunkRecord, now: float) -> bool:
    return r.claimed_by is not None and (r.claim_expires_at or 0.0) >= now


def finish_cancel(deps: Deps, job: Job) -> JobState:
    """Settle a cancelling job's chunks nobody holds; when every chunk has settled, compensate the side
    effects already done and end the job `cancelled`. The job's state afterwards."""
    if job.state is not S.CANCELLING:
        return job.state
    now = deps.clock()
    records = deps.claims.for_job(job.job_id)
    for r in records:
        if not r.settled and not _lease_live(r, now):  # fenced: a worker claiming it meanwhile wins
            cancel_chunk(deps, r, "not started", now)
    records = deps.claims.for_job(job.job_id)
    held = [r.chunk_id for r in records if not r.settled]
    if held:
        return S.CANCELLING  # their workers stop before their next model call and announce it
    compensate_side_effects(deps, job, "job.cancelled")
    # what the job spent: each settled chunk the aggregator has not counted yet is counted here, by the same
    # write that counts it (conditional on it not being counted: whichever of the aggregator and this comes first
    # counts it, once); the job's total is only ever added to, never written whole
    for r in records:
        if not job.counts(r):  # counted here: its `chunk.settled` event too (the aggregator's is skipped)
            counted = count_settled(deps, r)
            if counted is not None:
                settled_event(deps, r, counted, by="cancel")
        elif r.event_owed:  # counted by an aggregator that stopped before its event: written now, once
            settled_event(deps, r, job, by="cancel")
    done = sum(1 for r in records if r.status is ChunkStatus.DONE)
    cancelled = sum(1 for r in records if r.status is ChunkStatus.CANCELLED)
    code = job.cancel_code or "job.cancelled"
    error = cancel_envelope("job") if code == "job.cancelled" else ErrorEnvelope.of(code, f"stopped by {job.cancelled_by or 'someone'}",
                                                                                          step="job")
    counted_now = deps.jobs.get(job.job_id)  # progress counts one number, the chunks settled: the event says it too
    settled_n = (counted_now or job).n_settled
    ended = transition(deps, job, S.CANCELLED, detail={"settled": settled_n, "total": job.chunk_count,
                                                       "chunks_done": done, "chunks_cancelled": cancelled,
                                                       "chunks_never_sent": job.chunk_count - len(records),
                                                       "side_effects_compensated": len(job.side_effects),
                                                       "error_code": code},
                       outcome=JobFailure(error=error, error_code=code, ended_at=now))
    if ended is None:
        again = deps.jobs.get(job.job_id)
        return again.state if again else S.CANCELLED
    return ended.state


def fail_compensating(deps: Deps, job: Job, outcome: BaseModel, *, event: str,
                      detail: dict[str, object] | None = None) -> Job | None:
    """`job` (running or waiting for approval) fails: its error (`outcome`) is written now, with the move to
    `compensating` (`finish_compensation` undoes its side effects, then ends it `failed`), or straight to
    `failed` when it has nothing to undo. The job moved, or None when it changed since the read."""
    fresh = deps.jobs.get(job.job_id) or job  # its steps are recorded apart from its version: read them now
    to = S.COMPENSATING if fresh.undo_pending else S.FAILED
    return transition(deps, job, to, event=event, detail=detail, outcome=outcome)


def finish_compensation(deps: Deps, job: Job) -> JobState:
    """A compensating job: undo its side effects (idempotent: what was undone before is skipped; a compensation
    that exhausts its retries goes to the compensation DLQ and its step says so), then end it `failed`. Raises
    when the compensation could not run at all: the job stays `compensating` and the sweeper tries again. The
    job's state afterwards."""
    if job.state is not S.COMPENSATING:
        return job.state
    compensate_side_effects(deps, job, job.error_code or "job.failed")
    now = deps.jobs.get(job.job_id) or job
    ended = transition(deps, now, S.FAILED, event="job.failed", detail={
        "error_code": job.error_code, "side_effects": {e.step: e.status.value for e in now.side_effects}})
    if ended is None:
        again = deps.jobs.get(job.job_id)
        return again.state if again else S.FAILED
    return ended.state


def compensate_side_effects(deps: Deps, job: Job, reason: str) -> None:
    """Undo the job's side effects in reverse order, through the compensation port (`Deps.compensator`: the
    saga's, which wiring provides). Nothing to do for a job without any."""
    if not job.side_effects and job.approval is None:
        return
    if deps.side_effects is None or deps.compensator is None:  # done, and nothing here can undo them: say so
        raise ReviewError.of("sideeffect.compensation_failed", "the job has side effects but no side-effect "
                             "adapters are configured (IDEMPOTENCY_TABLE)", step="cancel")
    deps.compensator(deps, job, reason)


def render_markdown() -> str:
    """docs/job-states.md: `TRANSITIONS` as a diagram and a table (every legal move, with `WHY`)."""
    lines = [
        "# Job states",
        "",
        "Generated from `TRANSITIONS` and `WHY` (`functions/contract_review/domain/lifecycle.py`) by "
        "`python -m contract_review.domain.lifecycle > docs/job-states.md` (`make docs`). Do not edit by hand.",
        "",
        f"A job is in one of {len(JobState)} states; the ended ones are "
        + ", ".join(f"`{s.value}`" for s in JobState if s.terminal)
        + ". Any move not listed here raises `IllegalTransition`: a bug, never an operational outcome. "
        "Every move is one conditional write on the job's `version` and appends the event `job.<state>`.",
        "",
        "```mermaid",
        "stateDiagram-v2",
        f"  [*] --> {S.QUEUED.value}",
    ]
    lines += [f"  {frm.value} --> {to.value}" for frm in JobState for to in JobState if to in TRANSITIONS[frm]]
    lines += [f"  {s.value} --> [*]" for s in JobState if s.terminal]
    lines += ["```", "", "| from | to | when |", "|---|---|---|"]
    for frm in JobState:
        for to in JobState:
            if to in TRANSITIONS[frm]:
                lines.append(f"| `{frm.value}` | `{to.value}` | {WHY[frm, to]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
