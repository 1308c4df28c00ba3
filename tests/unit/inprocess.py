"""The whole pipeline in-process over the in-memory fakes, one round at a time: intake takes its
queue, the real `ChunkWorker` (offline rule model behind a fault switch) takes every analysis
message, the aggregator every result, then the clock moves on and the batch collector and the sweeper run
(each its own scheduled function on AWS: one that dies leaves the other running).

What the queue would do is modelled plainly: a tier-2 hand-off comes back the next round, a
`Crash` (the process died) loses the delivery (the sweeper recovers the lapsed lease), delays are
ignored. `fault_free_findings` runs a document through a fresh world without faults: every recovery
test compares the report of a faulted run with it (the offline model is deterministic).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from contract_review.domain.messages import AnalysisMessage, parse_results_body
from contract_review.domain.model import ModelClient, ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, Job
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.onion import CountedModel, layer
from contract_review.pipeline import collector
from contract_review.pipeline.aggregator import handle_message
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.sweeper import sweep
from contract_review.pipeline.worker import Delivery, Tier2
from contract_review.review.analysts import ChunkFindings
from contract_review.wiring import chunk_worker
from tests.oracle import counted

from .fakes import FakeWorld, Sent

ROUND_S = 2.0  # the clock moves this much per round (local profile: lease 3 s, stall 15 s, deadline 20 s)


class Crash(BaseException):  # noqa: N818 -- not an error the code may catch: the process is gone
    """The worker process died mid-attempt (kill -9): nothing of the attempt runs after it."""


@dataclass
class Fault:
    """Calls matching `match` get `act` (raise, or return a response) while `times` lasts (-1: forever)."""

    match: Callable[[ModelRequest], bool]
    act: Callable[[ModelRequest], ModelResponse]
    times: int = -1


@dataclass
class FaultyModel:
    """The offline rule model, except for the calls a fault matches. `faults.clear()` switches it off."""

    model_id: str = "offline-rules-v1"
    faults: list[Fault] = field(default_factory=list)
    calls: int = 0
    inner: OfflineRuleModel = field(default_factory=OfflineRuleModel)

    def invoke(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        for f in self.faults:
            if f.times != 0 and f.match(request):
                f.times -= 1
                return f.act(request)
        return self.inner.invoke(request)


def on(chunk_id: str | None = None, analyst: str | None = None) -> Callable[[ModelRequest], bool]:
    return lambda r: (chunk_id is None or r.chunk_id == chunk_id) and (analyst is None or r.analyst == analyst)


class InProcess:
    def __init__(self, world: FakeWorld, model: FaultyModel | None = None):
        self.world = world
        self.model = model or FaultyModel()
        self.worker = chunk_worker(world.deps, self.model, rng=random.Random(7), sleep=lambda _s: None)
        # the invocation's remaining time for a delivery (None: no function timeout, as on Fargate)
        self.remaining_ms: Callable[[AnalysisMessage], Callable[[], int] | None] = lambda _m: None
        self.crashes = 0
        self.to_dlq: set[str] = set()  # chunk ids whose next message the queue moves to the DLQ (receives burned)
        self.intake_receives: Counter[str] = Counter()

    def use_model(self, model: ModelClient) -> None:
        """The worker's calls reach `model` from now on, still through its onion (paused, paced, counted)."""
        counted = layer(self.worker.model, CountedModel)
        assert counted is not None
        counted.inner = model

    # ------------------------------------------------------------------ input
    def send(self, document: dict[str, object], key: str | None = None, **fields: object) -> str:
        """Put an intake message on the intake queue; its body."""
        body = json.dumps({"schema_version": 1, "document": document,
                           **({"idempotency_key": key} if key else {}), **fields})
        self.world.queues.send_intake(body)
        return body

    # ------------------------------------------------------------------ one round
    def intake(self) -> None:
        """Intake takes its queue. A `Crash` returns the message (same id) until the queue's receive count
        is used, then the queue moves it to the intake DLQ, as SQS does."""
        w = self.world
        for s in w.queues.drain(Queue.INTAKE):
            try:
                handle_intake(w.deps, s.body, s.message_id)
            except Crash:
                self.intake_receives[s.message_id] += 1
                used = self.intake_receives[s.message_id] >= w.settings.profile.queues.max_receive_count
                w.queues.sent[Queue.INTAKE_DLQ if used else Queue.INTAKE].append(
                    Sent(s.body, message_id=s.message_id, sent_at=s.sent_at))

    def round(self) -> None:
        w = self.world
        self.intake()
        for s in w.queues.drain(Queue.ANALYSIS):
            self.deliver(s)
        for s in w.queues.drain(Queue.RESULTS):
            handle_message(w.deps, parse_results_body(s.body))
        w.clock.advance(ROUND_S)
        try:
            collector.collect(w.deps)
        except Crash:
            self.crashes += 1  # the collector died mid-run; the next one starts afresh
        try:
            sweep(w.deps)
        except Crash:
            self.crashes += 1  # the sweeper died mid-sweep; the next one starts afresh

    def deliver(self, s: Sent) -> None:
        msg = AnalysisMessage.model_validate_json(s.body)
        if msg.chunk_id in self.to_dlq:  # its receives were burned before our code ran: the queue moves it
            self.to_dlq.discard(msg.chunk_id)
            self.world.queues.sent[Queue.ANALYSIS_DLQ].append(Sent(s.body, message_id=s.message_id, sent_at=s.sent_at))
            return
        delivery = Delivery(message_id=s.message_id, receipt_handle="", receive_count=1, visibility_s=120,
                            remaining_ms=self.remaining_ms(msg))
        try:
            self.worker.handle(msg, delivery)
        except Tier2:  # a batch-item failure: the queue delivers the same message again
            self.world.queues.sent[Queue.ANALYSIS].append(Sent(s.body, sent_at=self.world.clock()))
        except Crash:
            self.crashes += 1  # the delivery is lost with the process; the lapsed lease is the sweeper's

    def run(self, job_id: str, rounds: int = 60) -> Job:
        """Rounds until the job has ended and nothing is left in flight; the job."""
        for _ in range(rounds):
            job = self.world.jobs.get(job_id)
            busy = any(self.world.queues.sent[q] for q in (Queue.INTAKE, Queue.ANALYSIS, Queue.RESULTS))
            if job is not None and job.terminal and not busy:
                return job
            self.round()
        job = self.world.jobs.get(job_id)
        assert job is not None, f"no job {job_id}"
        return job

    # ------------------------------------------------------------------ what came out
    def findings(self, job: Job) -> list[dict[str, object]]:
        """The report's findings (JSON), in report order."""
        assert job.report_json_key, f"{job.job_id} has no report ({job.state.value}, {job.error_code})"
        report = json.loads(self.world.artifacts.get_text(job.report_json_key))
        return list(report["findings"])

    def assert_complete_and_consistent(self, job_id: str) -> list[dict[str, object]]:
        """The job completed; every chunk is done and counted once; the finding counts agree. Its findings."""
        job = self.world.jobs.get(job_id)
        assert job is not None and job.state.value == "completed", (job.state if job else None, job and job.error)
        records = self.world.claims.for_job(job_id)
        assert len(records) == job.chunk_count and all(c.status is ChunkStatus.DONE for c in records)
        assert counted(self.world.claims, job) == {c.chunk_id for c in records}
        findings = self.findings(job)
        per_chunk = [len(ChunkFindings.model_validate_json(self.world.artifacts.get_text(c.findings_key or "")).findings)
                     for c in records]
        assert job.n_findings == len(findings) == sum(per_chunk) == sum(c.n_findings for c in records)
        return findings


class CrashOnPut:
    """Every artifact write under `prefix` dies (the process is gone: `Crash`) while `on` is True: a worker that
    dies writing its findings, an intake that dies storing the document. Installed on the world's artifacts."""

    def __init__(self, world: FakeWorld, prefix: str):
        self.on, self.prefix, self._put = True, prefix, world.artifacts.put_text
        world.artifacts.put_text = self  # type: ignore[method-assign]  # the fake's method, wrapped

    def __call__(self, key: str, body: str, content_type: str = "application/json") -> None:
        if self.on and key.startswith(self.prefix):
            raise Crash()
        self._put(key, body, content_type)


def fault_free_findings(world_factory: Callable[[], FakeWorld], document: dict[str, object],
                        setup: Callable[[FakeWorld], None] | None = None) -> list[dict[str, object]]:
    """The report findings of a run of `document` without any fault, in a fresh world."""
    world = world_factory()
    if setup is not None:
        setup(world)
    p = InProcess(world)
    p.send(document, key="fault-free")
    p.round()
    (job,) = world.jobs.all()
    return p.assert_complete_and_consistent(p.run(job.job_id).job_id)
