"""The soak's youngest lanes: dead letters that are really redriven, and the batch lane, priority
and the runtime control under chaos, with the counts that must be 0 after them.

Dead letters (`run_dead_letter_phase`): the workers restart with every call of each job's chunk 1 failing (5xx) while
a switch file exists; those chunks spend their poison budget and reach the analysis DLQ, their jobs end
`dead_lettered`; then the fault is fixed (the switch removed) and the DLQ redriven as `review dlq redrive --all` does
(`redrive.dlq_redrive`): every job must complete, as a run without the fault would.

The new lanes (`LaneChaos`, a thread, while batch-mode, interactive and bulk jobs run at once):
- the batch stand-in's faults rotate over the batch jobs created from then on: none, records failed (a partially
  completed job), the job failed in progress, the job expired, a retryable refusal of the create (throttled), and
  once a non-retryable one (ValidationException: the model is not offered in batch), which turns the model's batch
  lane off; some seconds later the operator turns it on again (`review quota batch --on`);
- a second collector runs beside the scheduled one (two collects at once: rare on AWS, where the collector's
  concurrency is 1; kept here on purpose, for the sealed manifests);
- the operator pauses the model and resumes it, sets a quota and clears it (`review quota pause|resume|set|--clear`).

The invariants (`lane_invariants`), over the jobs of the lanes phase:
- no chunk returned from a batch job left without its message (`batch_message_due` on a chunk at the end), none
  pending, claimed or parked under an ended job;
- no bulk chunk deferred while no interactive chunk waited on the workers: each deferral the workers logged fell
  while an interactive job waited for chunks (from its start, or from when one of its chunks went on demand for a
  batch-mode one, to its last chunk settled), give or take the gate's `interactive_check_s` and a second.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import ChunkStatus, Inference, Job, JobState, Priority
from contract_review.operate import model_control, submission
from contract_review.operate.submission import SubmitRequest
from contract_review.pipeline import batch_inference_collect, redrive
from review_local.batch_service import BatchFaults
from review_local.stack import LocalStack

ROTATION: tuple[tuple[str, BatchFaults], ...] = (
    ("none", BatchFaults()),
    ("records failed (partially completed)", BatchFaults(fail_rate=0.3, seed=11)),
    ("job failed in progress", BatchFaults(fail_job="in_progress")),
    ("job expired", BatchFaults(expire_job=True)),
    ("create throttled (retryable)", BatchFaults(refuse_create="ThrottlingException")),
)
REFUSAL = BatchFaults(refuse_create="ValidationException")
SECOND_COLLECTOR_EVERY_S = 1.0
SLACK_S = 1.0  # clocks of the moto server, the workers and this process, and the log line's own time


@dataclass
class LaneChaos:
    """Batch faults, a second collector and quota control while the lanes phase runs (module docstring)."""

    stack: LocalStack
    deps: Deps
    rng: random.Random
    refuse_after_s: float = 40.0  # the non-retryable refusal comes once, this long into the phase
    lane_off_for_s: float = 15.0  # then the operator turns the lane on again
    counts: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> LaneChaos:
        for target, name in ((self._faults_and_control, "lane-chaos"), (self._second_collector, "collector-2")):
            t = threading.Thread(target=self._guard(target), daemon=True, name=name)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        self._set_faults("none (after the phase)", BatchFaults())
        model_control.quota_change(self.deps, "soak", paused=False, clear_quota=True)  # the model as deployed again
        self._lane_on()

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    fn()
                    return
                except Exception as exc:  # the soak goes on; the count says what happened
                    self.counts[f"lane chaos failed: {type(exc).__name__}"] += 1
                    self._stop.wait(1.0)
        return run

    def _set_faults(self, name: str, faults: BatchFaults) -> None:
        assert self.stack.batch_service is not None
        self.stack.batch_service.faults = faults
        self.counts[f"batch faults: {name}"] += 1

    def _lane_on(self) -> None:
        _, removed = model_control.batch_lane_on(self.deps, self.deps.settings.effective_model_id)
        if removed is not None:
            self.counts["batch lane turned on again"] += 1

    def _faults_and_control(self) -> None:
        start = time.monotonic()
        refused_at: float | None = None
        next_faults = next_quota = start
        while not self._stop.wait(0.5):
            now = time.monotonic()
            if refused_at is None and now - start >= self.refuse_after_s:
                self._set_faults("create refused (ValidationException: the lane turns off)", REFUSAL)
                refused_at = now
            elif refused_at is not None and refused_at > 0 and now - refused_at >= self.lane_off_for_s:
                self._set_faults("none (lane on again)", BatchFaults())
                self._lane_on()
                refused_at = -1.0  # done: the rotation goes on
            elif (refused_at is None or refused_at < 0) and now >= next_faults:
                self._set_faults(*self.rng.choice(ROTATION))
                next_faults = now + self.rng.uniform(5.0, 10.0)
            if now >= next_quota:
                self._quota_round()
                next_quota = now + self.rng.uniform(10.0, 20.0)

    def _quota_round(self) -> None:
        """A pause of a few seconds, or a quota set then cleared (generous: the fleet is not made to crawl)."""
        if self.rng.random() < 0.5:
            model_control.quota_change(self.deps, "soak", paused=True)
            self.counts["quota pause"] += 1
            self._stop.wait(self.rng.uniform(2.0, 5.0))
            model_control.quota_change(self.deps, "soak", paused=False)
            self.counts["quota resume"] += 1
        else:
            model_control.quota_change(self.deps, "soak", tokens_per_minute=float(self.rng.choice((2_000_000, 5_000_000))))
            self.counts["quota set"] += 1
            self._stop.wait(self.rng.uniform(3.0, 8.0))
            model_control.quota_change(self.deps, "soak", clear_quota=True)
            self.counts["quota set --clear"] += 1

    def _second_collector(self) -> None:
        while not self._stop.wait(SECOND_COLLECTOR_EVERY_S * self.rng.uniform(0.5, 1.5)):
            report = batch_inference_collect.collect(self.deps, time.time())
            self.counts["second collector runs"] += 1
            self.counts["second collector: batch jobs submitted"] += len(report.submitted)
            self.counts["second collector: batch jobs collected"] += len(report.collected)


def lanes_documents(docs: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    """Each document with how it is sent: bulk on demand, interactive on demand, interactive in batch, bulk in batch
    (some batch-mode ones with a deadline nearer than a batch can answer: they go on demand before packing)."""
    kinds: list[dict[str, Any]] = [
        {"priority": Priority.BULK},
        {"priority": Priority.INTERACTIVE},
        {"priority": Priority.INTERACTIVE, "inference": Inference.BATCH, "deadline_hours": 1.0},
        {"priority": Priority.BULK, "inference": Inference.BATCH, "deadline_hours": 1.0},
        {"priority": Priority.BULK, "inference": Inference.BATCH, "deadline_hours": 0.005},  # 18 s: on demand
    ]
    weights = (4, 2, 2, 3, 1)
    return [(name, text, dict(rng.choices(kinds, weights)[0])) for name, text in docs]


def run_lanes(deps: Deps, docs: list[tuple[str, str, dict[str, Any]]]) -> dict[str, str]:
    """Submit the lanes phase's documents (the bulk ones first, so interactive work arrives behind a backlog)."""
    texts: dict[str, str] = {}
    for name, text, how in sorted(docs, key=lambda d: d[2]["priority"] is not Priority.BULK):
        texts[submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"lanes:{name}", **how)).job_id] = text
    return texts


def run_dead_letter_phase(stack: LocalStack, deps: Deps, docs: list[tuple[str, str]], switch: Path,
                          wait_ended: Callable[[Deps, list[str], float], dict[str, Job]], timeout_s: float
                          ) -> tuple[dict[str, str], dict[str, Any]]:
    """Chunk 1 of every job fails while `switch` exists (the workers must run with `always_fail_chunk="1"` and that
    switch); the jobs dead-letter; the fault is fixed and the analysis DLQ redriven; every job must complete."""
    started = time.monotonic()
    texts = {submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"dlq:{name}")).job_id: text for name, text in docs}
    first = wait_ended(deps, list(texts), timeout_s)  # dead-lettered (terminal), before anything is redriven
    dead_lettered_after_s = round(time.monotonic() - started, 1)
    states = Counter(j.state.value for j in first.values())
    # what kept a job from dead-lettering in time (its state, its chunks' statuses and counted failures)
    not_dead = {job_id: {"state": j.state.value if (j := deps.jobs.get(job_id)) else None,
                         "chunks": sorted(f"{r.chunk_index}:{r.status.value}:{r.failures}"
                                          for r in deps.claims.for_job(job_id))}
                for job_id in texts if job_id not in first or first[job_id].state is not JobState.DEAD_LETTERED}
    dead = [j for j, job in first.items() if job.state is JobState.DEAD_LETTERED]
    deadline = time.monotonic() + 60
    while deps.queues.depth(Queue.ANALYSIS_DLQ) < len(dead) and time.monotonic() < deadline:
        time.sleep(1.0)  # the DLQ copy follows the chunk's settle
    in_dlq = deps.queues.depth(Queue.ANALYSIS_DLQ)
    switch.unlink()  # the fault is fixed
    redriven = redrive.dlq_redrive(deps)
    # the jobs as they were, to wait for their end again: a redriven job is running again
    deadline = time.monotonic() + 30
    while any((j := deps.jobs.get(job_id)) is not None and j.state is JobState.DEAD_LETTERED for job_id in dead) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    after = wait_ended(deps, list(texts), timeout_s)
    return texts, {
        "wall_s": round(time.monotonic() - started, 1), "jobs": len(texts),
        "dead_lettered_after_s": dead_lettered_after_s, "states_before_redrive": dict(states),
        "not_dead_lettered_at_redrive": not_dead, "analysis_dlq_messages_before_redrive": in_dlq,
        "redriven_messages": sum(1 for r in redriven if not r.skipped),
        "states_after_redrive": dict(Counter(j.state.value for j in after.values())),
    }


def _log_time(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S,%f%z").timestamp()


def deferrals(log_dir: Path) -> list[tuple[float, float, str]]:
    """(earliest, logged, job id) of every bulk chunk a worker sent back for interactive work, from the workers' log
    lines (`chunk processed`, outcome `deferred`: each deferral is one, the job's events only keep the last). The
    worker decided when it received the chunk, which its line does not say: some time after the line before it in
    the same log (`earliest`), up to the line's own time (a worker stopped by SIGSTOP between the two, or waiting
    on a slow send, logs its decision seconds after making it)."""
    out: list[tuple[float, float, str]] = []
    for path in sorted(log_dir.glob("*.log")):
        before = float("-inf")
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "timestamp" not in entry:
                continue  # a metrics line (EMF): no time of its own in the logger's format
            at = _log_time(str(entry["timestamp"]))
            if entry.get("message") == "chunk processed" and entry.get("outcome") == "deferred":
                out.append((before, at, str(entry.get("job_id", ""))))
            before = at
    return out


def _waiting_window(deps: Deps, job: Job) -> tuple[float, float] | None:
    """When an interactive job waited for chunks on the workers (priority.waits_for_chunks): from its start (or, sent
    in batch mode, from when a chunk of it went on demand) to its last chunk settled; None: never."""
    start = job.on_demand_since if job.inference is Inference.BATCH else job.created_at
    if start is None:
        return None
    settled = [e.at for e in deps.jobs.events(job.job_id) if e.type == "chunk.settled"]
    end = max(settled) if len(settled) >= job.chunk_count else (job.ended_at or time.time())
    return start, end


def lane_invariants(deps: Deps, job_ids: list[str], log_dir: Path, all_job_ids: list[str]) -> dict[str, Any]:
    """The lanes phase's counts over its jobs (`job_ids`). A bulk chunk of theirs may give way to any interactive job
    of the run waiting on the workers (`all_job_ids`: an earlier phase's job reopened by phase 3's redrive of the
    analysis DLQ runs again during this phase, and the workers rightly give way to it)."""
    jobs = {j: deps.jobs.get(j) for j in job_ids}
    everyone = {**{j: deps.jobs.get(j) for j in all_job_ids}, **jobs}
    bad: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}

    def count(name: str, item: str) -> None:
        bad[name] += 1
        if len(examples.setdefault(name, [])) < 5:
            examples[name].append(item)

    for job_id, job in jobs.items():
        for r in deps.claims.for_job(job_id):
            if r.batch_message_due:
                count("chunks_returned_from_batch_without_their_message", f"{job_id}/{r.chunk_id}")
            if job is not None and job.terminal and r.status in (ChunkStatus.PENDING, ChunkStatus.CLAIMED,
                                                                 ChunkStatus.AWAITING_BATCH):
                count("chunks_open_under_an_ended_job", f"{job_id}/{r.chunk_id}")
    grace = deps.settings.profile.fanout.interactive_check_s + SLACK_S
    windows = [w for j in everyone.values() if j is not None and j.priority is Priority.INTERACTIVE
               and (w := _waiting_window(deps, j)) is not None]
    deferred = [(earliest, at, job_id) for earliest, at, job_id in deferrals(log_dir) if job_id in jobs]
    for earliest, at, job_id in deferred:
        if not any(start - SLACK_S <= at and earliest <= end + grace for start, end in windows):
            near = min(windows, key=lambda w: min(abs(at - w[0]), abs(earliest - w[1])), default=None)
            count("bulk_chunks_deferred_while_no_interactive_chunk_waited",
                  f"{job_id} decided in [{earliest:.1f}, {at:.1f}]; nearest window {near}")
    by_kind = Counter(f"{j.priority.value}/{j.inference.value}" for j in jobs.values() if j is not None)
    batch_events = Counter(e.type for job_id, j in jobs.items() if j is not None and j.inference is Inference.BATCH
                           for e in deps.jobs.events(job_id) if e.type.startswith("batch."))
    return {
        "must_be_zero": {k: bad.get(k, 0) for k in (
            "chunks_returned_from_batch_without_their_message", "chunks_open_under_an_ended_job",
            "bulk_chunks_deferred_while_no_interactive_chunk_waited")},
        "jobs_by_kind": dict(by_kind), "bulk_deferrals_logged": len(deferred),
        "interactive_jobs_that_waited_on_workers": len(windows), "batch_events": dict(batch_events),
        "examples": examples,
    }
