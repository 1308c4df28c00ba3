"""The soak's lifecycle chaos and the invariants checked after it.

While the mixed phase runs, `Lifecycle` (a thread) does to random jobs what people and integrations do: cancels
(and retries some cancelled jobs: resumed from their checkpoints), approves or rejects jobs waiting for approval
(or lets the sweeper expire them: the expiry is forced by running the sweeper's own `expire_approvals` with a
clock past the approval's TTL), retries failed jobs, redrives the analysis DLQ, and injects ticket-system
faults (a timeout before or after the write, an error before it, a dropped answer, a lookup down). Every
action is counted; `settle_waiting` decides what still waits at the end, so every job ends.

The invariants (`lifecycle_invariants`), over every job of the soak:
- tickets opened = tickets closed + the open tickets of completed jobs, each completed job holding at most one
  open ticket, and no open ticket under a job that did not complete (after `redrive_compensations`: an undo the
  faults exhausted is in the compensation DLQ, with its alarm, until it is redriven);
- a job's model cost (tokens, model micro-dollars, timed-out calls and their estimated cost) = the sum over its
  counted chunks' records, each of which holds every attempt's spend however it ended (done, released, fenced out,
  or killed: folded in from its last heartbeat or commit);
- no chunk pending or claimed under an ended job;
- a reader resuming page by page (after the writers' grace) gets every event number that was written, in order;
  event numbers never written (a process killed between taking a number and writing its event) are counted;
- every failure carries a code (the oracle's check, `failures_without_a_code`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contract_review.domain import lifecycle
from contract_review.domain.records import ChunkStatus, Job, JobState
from contract_review.pipeline import redrive
from contract_review.sideeffects import approvals, saga
from review_local.ticket_service import FaultKind, TicketServiceFake

MODEL_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "model_micro_usd",
                "timed_out_calls", "estimated_micro_usd")
TICKET_FAULTS: tuple[FaultKind, ...] = ("timeout_before_write", "timeout_after_write", "error_before_write", "drop_after_write")
EVENTS_PAGE = 25  # a reader that resumes after every 25 events


@dataclass
class Lifecycle:
    """Random cancels, retries, decisions, expiries, redrives and ticket faults while jobs run (a thread)."""

    deps: Any
    tickets: TicketServiceFake
    rng: random.Random
    every_s: float = 0.5
    cancel_share: float = 0.25  # of the actions on a running job
    counts: Counter[str] = field(default_factory=Counter)
    job_ids: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # jobs an action changed
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, job_id: str) -> None:
        with self._lock:
            self.job_ids.append(job_id)

    def __enter__(self) -> Lifecycle:
        self._thread = threading.Thread(target=self._run, daemon=True, name="lifecycle")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        next_fault = next_redrive = time.monotonic()
        next_expiry = next_fault + 45.0
        while not self._stop.wait(self.every_s * self.rng.uniform(0.5, 1.5)):
            now = time.monotonic()
            try:
                if now >= next_fault:
                    self._ticket_fault()
                    next_fault = now + self.rng.uniform(2.0, 6.0)
                if now >= next_redrive:
                    self.counts["dlq redrives"] += len(redrive.dlq_redrive(self.deps))
                    next_redrive = now + 30.0
                if now >= next_expiry:
                    self._expire_some()
                    next_expiry = now + self.rng.uniform(45.0, 75.0)  # people decide first, mostly
                self._act_on_one()
            except Exception as exc:  # the soak goes on; the count says what happened
                self.counts[f"action failed: {type(exc).__name__}"] += 1

    def _ticket_fault(self) -> None:
        roll = self.rng.random()
        if roll < 0.2:  # written, its answer lost, and the lookup down for longer than the saga's attempts: the
            # job waits for a person with a ticket open that it cannot name (a reject or expiry must close it)
            self.tickets.inject("lookup_unavailable", op="lookup", times=6)
            self.tickets.inject(self.rng.choice(("timeout_after_write", "drop_after_write")))
            self.counts["ticket faults: written, answer lost, lookup down"] += 1
        elif roll < 0.25:
            self.tickets.inject(self.rng.choice(TICKET_FAULTS), op="close")
            self.counts["ticket faults: on close"] += 1
        else:
            kind = self.rng.choice(TICKET_FAULTS)
            self.tickets.inject(kind)
            self.counts[f"ticket faults: {kind}"] += 1

    def _pick(self) -> Job | None:
        """A job still under way mostly (a few reads), any job (an ended one to retry) otherwise."""
        with self._lock:
            ids = list(self.job_ids)
        job = None
        for _ in range(6 if ids and self.rng.random() < 0.8 else 1 if ids else 0):
            job = self.deps.jobs.get(self.rng.choice(ids))
            if job is not None and not job.terminal:
                break
        return job

    def _act_on_one(self) -> None:
        job = self._pick()
        if job is None:
            return
        if job.state is JobState.WAITING_APPROVAL:
            decision = "approve" if self.rng.random() < 0.6 else "reject"
            if approvals.decide_approval(self.deps, job.job_id, decision, by="soak").changed:
                self.counts[decision] += 1
                self.touched.add(job.job_id)
        elif job.state in (JobState.QUEUED, JobState.RUNNING) and self.rng.random() < self.cancel_share:
            if lifecycle.request_cancel(self.deps, job.job_id, by="soak").changed:
                self.counts["cancel"] += 1
                self.touched.add(job.job_id)
        elif job.state is JobState.CANCELLED and self.rng.random() < 0.5:
            if redrive.retry(self.deps, job.job_id).retried:
                self.counts["retry of a cancelled job"] += 1
        elif job.state in (JobState.FAILED, JobState.DEAD_LETTERED) and self.rng.random() < 0.5:
            if redrive.retry(self.deps, job.job_id).retried:
                self.counts[f"retry of a {job.state.value} job"] += 1
                self.touched.add(job.job_id)

    def _expire_some(self) -> None:
        """The sweeper's expiry, with its clock past the approval TTL: every job waiting now expires."""
        ttl = self.deps.settings.profile.side_effects.approval_ttl_s
        expired = saga.expire_approvals(self.deps, now=time.time() + ttl + 1)
        self.counts["expired"] += len(expired)
        self.touched.update(expired)

    def settle_waiting(self) -> None:
        """At the end: every job still waiting for a person is decided (so every job ends)."""
        for job_id in list(self.job_ids):
            job = self.deps.jobs.get(job_id)
            if job is not None and job.state is JobState.WAITING_APPROVAL:
                decision = self.rng.choice(("approve", "reject"))
                if approvals.decide_approval(self.deps, job_id, decision, by="soak-end").changed:
                    self.counts[f"{decision} (at the end)"] += 1


def redrive_compensations(stack: Any, deps: Any) -> dict[str, int]:
    """The documented recovery of `sideeffect.compensation_failed` (`review compensations --redrive`), once the
    ticket faults are over: the compensations the faults exhausted run again. Counts before and after."""
    from contract_review.domain.records import StepStatus

    local = stack.deps()  # the CLI's view of the stack: its ticket system from the outputs, as on AWS
    assert local.side_effects is not None and local.settings.ticket_url == stack.tickets.url
    out = saga.redrive_compensations(local, local.side_effects)
    return {"redriven": len(out.compensated), "still_failing": len(out.dead_lettered),
            "steps_compensation_failed_after": sum(
                1 for j in deps.jobs.all() for e in j.side_effects if e.status is StepStatus.COMPENSATION_FAILED)}


def _ticket_story(deps: Any, job_id: str, all_tickets: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A job's state, side-effect steps, tickets and event types: why a ticket of it is still open."""
    job = deps.jobs.get(job_id)
    return None if job is None else {
        "state": job.state.value, "error_code": job.error_code,
        "steps": [f"{e.step}:{e.operation}:{e.status.value}:g{e.generation}:{e.result}:{e.key[:12]}"
                  for e in job.side_effects],
        "tickets": [{k: t.get(k) for k in ("id", "status", "idempotency_key")}
                    for t in all_tickets if str(t["fields"].get("job_id")) == job_id],
        "events": [e.type for e in deps.jobs.events(job_id)]}


def lifecycle_invariants(deps: Any, job_ids: list[str], tickets: TicketServiceFake) -> dict[str, Any]:
    """The counts that must be 0, and what they were counted over."""
    jobs = {j: deps.jobs.get(j) for j in job_ids}
    bad: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}

    def count(name: str, job_id: str, n: int = 1) -> None:
        bad[name] += n
        examples.setdefault(name, [])
        if len(examples[name]) < 5:
            examples[name].append(job_id)

    # tickets
    all_tickets = tickets.all()
    open_by_job: Counter[str] = Counter()
    for t in all_tickets:
        if t["status"] != "closed":
            open_by_job[str(t["fields"].get("job_id"))] += 1
    opened, closed = len(all_tickets), sum(1 for t in all_tickets if t["status"] == "closed")
    open_of_completed = 0
    for job_id, n in open_by_job.items():
        job = jobs.get(job_id)
        if job is None or job.state is not JobState.COMPLETED:
            count("tickets_open_under_a_job_not_completed", job_id, n)
        else:
            open_of_completed += n
            if n > 1:
                count("completed_jobs_with_more_than_one_open_ticket", job_id)
    # what each such job went through, so a failed run explains itself
    explained = {j: _ticket_story(deps, j, all_tickets) for j in examples.get("tickets_open_under_a_job_not_completed", [])}
    # cost, chunks, events
    events_written = events_never_written = 0
    reader = deps
    for job_id, job in jobs.items():
        if job is None or not job.terminal:
            continue
        records = deps.claims.for_job(job_id)
        if any(r.status in (ChunkStatus.PENDING, ChunkStatus.CLAIMED) for r in records):
            count("chunks_pending_under_an_ended_job", job_id)
        settled = [r for r in records if job.counts(r)]
        for f in MODEL_FIELDS:
            if getattr(job, f) != sum(getattr(r, f) for r in settled):
                count("jobs_whose_cost_is_not_the_sum_of_their_settled_chunks", job_id)
                break
        stored = {e.number for e in deps.jobs.events(job_id)}
        delivered: list[int] = []
        after = 0
        while page := lifecycle.read_events(reader, job_id, after=after, limit=EVENTS_PAGE):
            delivered += [e.number for e in page]
            after = page[-1].number
        events_written += len(stored)
        events_never_written += len(set(range(1, max(stored, default=0) + 1)) - stored)  # gaps (none)
        if delivered != sorted(stored):
            count("jobs_whose_resuming_reader_missed_a_written_event", job_id)
    must_be_zero = {k: bad.get(k, 0) for k in (
        "tickets_open_under_a_job_not_completed", "completed_jobs_with_more_than_one_open_ticket",
        "jobs_whose_cost_is_not_the_sum_of_their_settled_chunks", "chunks_pending_under_an_ended_job",
        "jobs_whose_resuming_reader_missed_a_written_event")}
    return {
        "must_be_zero": must_be_zero,
        "tickets": {"opened": opened, "closed": closed, "open_of_completed_jobs": open_of_completed,
                    "opened_equals_closed_plus_open_of_completed": opened == closed + open_of_completed},
        "events": {"written": events_written, "numbers_never_written": events_never_written},
        "examples": examples, "tickets_open_under_a_job_not_completed": explained,
    }
