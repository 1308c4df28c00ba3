"""Every error code's documented recovery (errors.py `recovery`, docs/error-codes.md), executed.

For each code in the registry: the fault that produces it, the pipeline run in-process (the real
intake, worker, aggregator and sweeper over the fakes: `inprocess.py`), the job as the fault leaves
it, then exactly what the recovery text says to do (often nothing), and then the job must complete
with the findings of a fault-free run of the same document (the offline model is deterministic),
every chunk done and counted, the finding counts in agreement. A code added to the registry without
a recovery here fails `test_every_error_code_has_an_executed_recovery`.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from contract_review.domain.control_records import ModelControl
from contract_review.domain.errors import REGISTRY, ReviewError
from contract_review.domain.messages import MAX_INLINE_CHARS
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState, job_id_for
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.breaker import BreakerModel, CircuitBreaker
from contract_review.model.daily_quota import DailyQuota
from contract_review.pipeline import (
    redrive,  # `redrive.retry`: looked up when used (these tests also run against older code)
)
from contract_review.pipeline.redrive import dlq_redrive
from contract_review.pipeline.worker import Delivery
from contract_review.reliability.chunks import analysis_message
from contract_review.review.analysts import ANALYSTS, analysts_for
from contract_review.wiring import chunk_worker

from ...texts import TEXT
from ..api_recoveries import API_RECOVERIES
from ..fakes import SETTINGS, FakeWorld
from ..inprocess import Crash, Fault, FaultyModel, InProcess, fault_free_findings, on
from ..pipeline.test_batch_lane import BATCH_RECOVERIES
from ..pipeline.test_model_fallback import FALLBACK_RECOVERIES
from ..saga_recoveries import SAGA_RECOVERIES
from ..scenarios import small_chunk_world

KEY = "msa-2026"
OTHER_TEXT = TEXT.replace("New York", "Delaware")
BIG_TEXT = TEXT + "\n\n" + "Schedule of annexes. " * 10_000  # past the 200,000 characters allowed inline
assert len(BIG_TEXT) > 200_000
MANDATORY = "liability"  # a mandatory analyst that finds something in chunk 0
OPTIONAL = "disputes"


# --- faults -----------------------------------------------------------------------------------------

def client_error(code: str, status: int, op: str = "Converse", headers: dict[str, str] | None = None) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "scripted"},
                        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}}}, op)


def raises(exc: BaseException) -> Callable[[ModelRequest], ModelResponse]:
    def act(_request: ModelRequest) -> ModelResponse:
        raise exc
    return act


def answers(stop_reason: str, text: str = "not json") -> Callable[[ModelRequest], ModelResponse]:
    return lambda _r: ModelResponse(text=text, stop_reason=stop_reason)


def fail_repo_call(obj: object, name: str, exc: BaseException, times: int = 1) -> list[int]:
    """The repository method raises `exc` `times` times (-1: until `left[0] = 0`), then works; the counter."""
    real = getattr(obj, name)
    left = [times]

    def wrapped(*a: object, **kw: object) -> object:
        if left[0] != 0:
            left[0] -= 1
            raise exc
        return real(*a, **kw)

    setattr(obj, name, wrapped)
    return left


# --- the run and its oracle -------------------------------------------------------------------------

def big_chunk_world() -> FakeWorld:
    """Chunks of up to 40,000 characters: a document past the inline limit in a few chunks."""
    profile = SETTINGS.profile.with_overrides(**{"chunk_target_chars": 40_000, "chunk_max_chars": 42_000})
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": profile}))


@functools.cache
def _expected(text: str, small: bool = True) -> tuple[str, ...]:
    world = small_chunk_world if small else big_chunk_world
    if len(text) <= MAX_INLINE_CHARS:
        return tuple(json.dumps(f, sort_keys=True) for f in fault_free_findings(world, {"text": text}))
    bucket = SETTINGS.bucket  # a large document goes by s3_uri
    return tuple(json.dumps(f, sort_keys=True) for f in fault_free_findings(
        world, {"s3_uri": f"s3://{bucket}/uploads/ff.txt"},
        setup=lambda w: w.artifacts.put_text("uploads/ff.txt", text)))


def expected(text: str = TEXT, small: bool = True) -> list[dict[str, object]]:
    return [json.loads(f) for f in _expected(text, small)]


class Run:
    """One document through the in-process pipeline, with what happened to it along the way."""

    def __init__(self, world: FakeWorld | None = None):
        self.p = InProcess(world or small_chunk_world())
        self.world = self.p.world
        self.job_id = job_id_for(KEY)
        self.fixes: list[Callable[[], None]] = []  # what fixing the cause also means (beyond the model's faults)

    def submit(self, document: dict[str, object] | None = None, key: str = KEY, **fields: object) -> list[str]:
        """Send the document and let intake take it in; the chunk ids (chunk order)."""
        self.p.send(document or {"text": TEXT}, key=key, **fields)
        self.p.intake()
        return [c.chunk_id for c in self.world.claims.for_job(job_id_for(key))]

    def run(self) -> None:
        self.p.run(self.job_id)

    def state(self) -> tuple[JobState, str | None]:
        job = self.world.jobs.get(self.job_id)
        assert job is not None
        return job.state, job.error_code

    def seen(self) -> str:
        """Everything the job and its chunks recorded (events, records, DLQ attributes), as one text."""
        parts = [e.model_dump_json() for e in self.world.jobs.events(self.job_id)]
        parts += [c.model_dump_json() for c in self.world.claims.for_job(self.job_id)]
        job = self.world.jobs.get(self.job_id)
        parts.append(job.model_dump_json() if job else "")
        parts += [cp.output or "" for cp in self.world.claims.cps.values() if cp.job_id == self.job_id]
        parts += [json.dumps(s.attributes) for q in (Queue.ANALYSIS_DLQ, Queue.INTAKE_DLQ)
                  for s in self.world.queues.sent[q]]
        return "\n".join(parts)

    def completes_as_fault_free(self, text: str = TEXT, small: bool = True) -> None:
        self.p.run(self.job_id)
        assert self.p.assert_complete_and_consistent(self.job_id) == expected(text, small)


# --- recoveries that need nothing: the pipeline gets there by itself --------------------------------

def by_itself(code: str, fault: Callable[[Run, list[str]], None], evidence: str | None = None) -> None:
    r = Run()
    ids = r.submit()
    fault(r, ids)
    r.completes_as_fault_free()
    assert (evidence or f'"{code}"') in r.seen(), f"the fault never produced {code}"


def throttled(r: Run, ids: list[str]) -> None:  # 4 throttles: tier 1 gives up, the chunk is requeued
    r.p.model.faults.append(Fault(on(ids[0], MANDATORY), raises(client_error("ThrottlingException", 429)), 4))


def timeout(r: Run, ids: list[str]) -> None:
    r.p.model.faults.append(Fault(on(ids[1]), raises(ReadTimeoutError(endpoint_url="https://bedrock")), 4))


def repaired(r: Run, ids: list[str]) -> None:  # one malformed answer: the repair attempt fixes it
    r.p.model.faults.append(Fault(on(ids[0], MANDATORY), answers("end_turn"), 1))


def circuit_open(r: Run, ids: list[str]) -> None:  # 4 calls in a row 5xx, over 2 chunks: the breaker opens
    breaker = CircuitBreaker(r.p.model.model_id, failure_threshold=3, open_s=3.0, clock=r.world.clock)
    r.p.use_model(BreakerModel(r.p.model, breaker))
    r.p.model.faults.append(Fault(on(), raises(client_error("ServiceUnavailableException", 503)), 4))


def aws_throttled(r: Run, _ids: list[str]) -> None:  # DynamoDB throttles a checkpoint write past botocore's retries
    fail_repo_call(r.world.claims, "put_checkpoints", client_error("ProvisionedThroughputExceededException", 400,
                                                                   "UpdateItem"))


def aws_unavailable(r: Run, _ids: list[str]) -> None:
    fail_repo_call(r.world.claims, "put_checkpoints", client_error("InternalServerError", 500, "UpdateItem"))


def budget_spent(r: Run, ids: list[str]) -> None:  # a Retry-After longer than the chunk's retry budget
    r.p.model.faults.append(Fault(on(ids[2]), raises(client_error("ServiceUnavailableException", 503,
                                                                  headers={"retry-after": "1000"})), 1))


def out_of_time(r: Run, ids: list[str]) -> None:  # the first invocation runs out of time after a few analysts
    checks = {"n": 0}

    def remaining() -> int:
        checks["n"] += 1
        return 10**9 if checks["n"] <= 6 else 0

    r.p.remaining_ms = lambda m: remaining if m.chunk_id == ids[0] and checks["n"] <= 6 else None


def crashed(r: Run, ids: list[str]) -> None:  # kill -9 in the middle of chunk 1, once
    r.p.model.faults.append(Fault(on(ids[1], "termination"), raises(Crash()), 1))


def lease_stolen(r: Run, ids: list[str]) -> None:
    """The worker freezes in its first call on chunk 0; its lease lapses and another worker takes the
    redelivered message and finishes the chunk; the frozen one wakes up and is fenced out."""
    w = r.world

    def freeze(request: ModelRequest) -> ModelResponse:
        w.clock.advance(SETTINGS.claim_lease_s + 1)
        job, rec = w.jobs.get(r.job_id), w.claims.get(r.job_id, ids[0])
        assert job is not None and rec is not None
        other = chunk_worker(w.deps, FaultyModel(), sleep=lambda _s: None)
        assert other.handle(analysis_message(w.deps, job, rec, "sweeper"),
                            Delivery(message_id="m-2", receipt_handle="", receive_count=2, visibility_s=120)).action == "done"
        return OfflineRuleModel().invoke(request)

    r.p.model.faults.append(Fault(on(ids[0]), freeze, 1))


def checkpoint_lost(r: Run, ids: list[str]) -> None:
    """Chunk 3's first attempt checkpoints three analysts and fails (tier 2); its next attempt cannot load one."""
    r.p.model.faults.append(Fault(on(ids[3], "renewal"), raises(client_error("ServiceUnavailableException", 503)), 3))
    real = r.world.claims.checkpoint_output
    lost = {"n": 0}

    def output(cp: object) -> str:
        if lost["n"] == 0:
            lost["n"] += 1
            raise FileNotFoundError("checkpoint object deleted")
        return real(cp)  # type: ignore[arg-type]  # a Checkpoint, passed through

    r.world.claims.checkpoint_output = output  # type: ignore[method-assign]  # the fake's method, replaced


def receives_burned(r: Run, ids: list[str]) -> None:  # the queue moves chunk 2's message to the DLQ
    r.p.to_dlq.add(ids[2])


# --- recoveries an operator performs ----------------------------------------------------------------

def ends_then(code: str, fault: Callable[[Run, list[str]], None], ended: tuple[JobState, str],
              recover: Callable[[Run], None]) -> None:
    """The fault ends the job as documented; the cause is fixed; the documented step brings it to completion."""
    r = Run()
    ids = r.submit()
    fault(r, ids)
    r.run()
    assert r.state() == ended
    assert f'"{code}"' in r.seen(), f"the fault never produced {code}"
    r.p.model.faults.clear()  # the cause is fixed (access granted, provider back, bug fixed...)
    recover(r)
    r.completes_as_fault_free()


def forever(exc: BaseException, analyst: str | None = None) -> Callable[[Run, list[str]], None]:
    return lambda r, ids: r.p.model.faults.append(Fault(on(ids[1], analyst), raises(exc)))


def answers_forever(stop_reason: str, analyst: str) -> Callable[[Run, list[str]], None]:
    return lambda r, ids: r.p.model.faults.append(Fault(on(ids[0], analyst), answers(stop_reason)))


def repo_fails(exc: ClientError) -> Callable[[Run, list[str]], None]:
    def fault(r: Run, _ids: list[str]) -> None:
        left = fail_repo_call(r.world.claims, "put_checkpoints", exc, -1)
        r.p.model.faults.append(Fault(lambda _r: False, answers("end_turn")))  # so that clear() fixes it too
        r.fixes.append(lambda: left.__setitem__(0, 0))
    return fault


def review_retry(r: Run, then: JobState = JobState.RUNNING) -> None:
    for fix in r.fixes:
        fix()
    done = redrive.retry(r.world.deps, r.job_id)
    assert done.retried and done.state is then, done


def review_dlq_redrive_all(r: Run) -> None:
    assert any(not d.skipped for d in dlq_redrive(r.world.deps))


def crash_forever(r: Run, ids: list[str]) -> None:
    r.p.model.faults.append(Fault(on(ids[1]), raises(Crash())))


def throttled_forever(r: Run, ids: list[str]) -> None:
    r.p.model.faults.append(Fault(on(ids[1]), raises(client_error("ThrottlingException", 429))))


DEAD = (JobState.DEAD_LETTERED, "runtime.dead_lettered")
MISSING = (JobState.FAILED, "job.chunks_missing")


def optional_refusal(code: str) -> None:
    """`model.refused` on an optional analyst: the job completes, the gap listed; everything else as fault-free."""
    r = Run()
    ids = r.submit()
    r.p.model.faults.append(Fault(on(ids[2], OPTIONAL), answers("content_filtered", "")))
    r.run()
    assert r.state() == (JobState.COMPLETED, None) and f'"{code}"' in r.seen()
    job = r.world.jobs.get(r.job_id)
    assert job is not None and job.report_json_key
    report = json.loads(r.world.artifacts.get_text(job.report_json_key))
    assert [(g["chunk_id"], g["analyst"], g["status"]) for g in report["coverage"]["optional_gaps"]] == [
        (ids[2], OPTIONAL, "refused")]

    def other(findings: list[dict[str, object]]) -> list[dict[str, object]]:
        return [f for f in findings if (f["chunk_id"], f["analyst"]) != (ids[2], OPTIONAL)]

    assert other(r.p.findings(job)) == other(expected())


# --- recoveries of input errors: a corrected message with the same idempotency key -------------------

def upload(r: Run, key: str, body: str | bytes) -> str:
    r.world.artifacts.objects[(r.world.artifacts.bucket, key)] = body
    return f"s3://{r.world.artifacts.bucket}/{key}"


def input_error(code: str, bad: Callable[[Run], dict[str, object]], fixed: Callable[[Run], dict[str, object]],
                text: str = TEXT, small: bool = True, **bad_fields: object) -> None:
    r = Run(None if small else big_chunk_world())
    r.submit(bad(r), **bad_fields)
    assert r.state() == (JobState.FAILED, code)
    r.submit(fixed(r))  # the corrected message, the same idempotency key: it replaces the failed job
    r.completes_as_fault_free(text, small)


def key_conflict(code: str) -> None:
    r = Run()
    r.submit()
    r.run()
    assert r.state() == (JobState.COMPLETED, None)
    r.submit({"text": OTHER_TEXT})  # another document under the same key
    r.p.run(r.job_id)
    assert f'"{code}"' in r.seen() and r.state() == (JobState.COMPLETED, None)
    # the recovery: the document with its own key (here: none, the SHA-256 of its text)
    r.p.send({"text": OTHER_TEXT})
    r.p.round()
    (other,) = [j for j in r.world.jobs.all() if j.job_id != r.job_id]
    r.job_id = other.job_id
    r.completes_as_fault_free(OTHER_TEXT)


def intake_exhausted(code: str) -> None:
    """Intake crashes on every delivery after creating the job: the message reaches the intake DLQ, the
    sweeper fails the queued job with the code, and `review retry` queues it again with its message."""
    r = Run()
    crashing = {"on": True}
    real_put = r.world.artifacts.put_text

    def put_text(key: str, body: str, content_type: str = "application/json") -> None:
        if crashing["on"] and key.startswith("documents/"):
            raise Crash()
        real_put(key, body, content_type)

    r.world.artifacts.put_text = put_text  # type: ignore[method-assign]  # the fake's method, replaced
    r.submit()
    for _ in range(12):  # the receive count is used, then the stall period passes
        r.p.round()
    assert r.state() == (JobState.FAILED, code)
    assert r.world.queues.sent[Queue.INTAKE_DLQ][0].attributes["job_id"] == r.job_id
    crashing["on"] = False  # fixed
    review_retry(r, then=JobState.QUEUED)  # queued again, its intake message sent again
    r.completes_as_fault_free()


def cancelled(code: str) -> None:
    """A cancelled job stops: workers settle its chunks `cancelled` without a model call (none is left pending
    under the ended job). The documented recovery: `review retry` resumes it from its checkpoints, and it
    completes as a fault-free run does."""
    r = Run()
    ids = r.submit()
    assert r.world.jobs.transition(r.job_id, (JobState.RUNNING,), JobState.CANCELLED)
    calls = r.p.model.calls
    r.run()
    assert r.state()[0] is JobState.CANCELLED and r.p.model.calls == calls
    assert all(c.status is ChunkStatus.CANCELLED for c in r.world.claims.for_job(r.job_id)) and len(ids) == 4
    assert "review retry" in REGISTRY[code].recovery
    assert redrive.retry(r.world.deps, r.job_id).retried
    r.completes_as_fault_free()


def budget_exceeded(code: str) -> None:
    """A job whose estimate passed its budget but whose calls cost more (an estimate can undershoot: longer
    answers, repairs; here the estimate is made to say $0) is stopped at its first settled chunk: it ends
    `cancelled` with the code, no report and no side effect, and no model call after the stop. The recovery:
    the document again with a larger budget under a new idempotency key."""
    from contract_review.pipeline import admission

    r = Run()
    real = admission.estimate
    admission.estimate = lambda settings, text, **_: real(settings, "")  # type: ignore[assignment]  # an undershooting estimate
    try:
        r.submit(budget_usd=0.000001)
    finally:
        admission.estimate = real  # type: ignore[assignment]
    r.run()
    job = r.world.jobs.get(r.job_id)
    assert job is not None and (job.state, job.error_code) == (JobState.CANCELLED, code)
    assert job.budget_micro_usd == 1 and job.total_micro_usd >= 1 and job.model_micro_usd > 0
    assert job.report_json_key is None and job.side_effects == [] and f'"{code}"' in r.seen()
    calls = r.p.model.calls
    for _ in range(5):
        r.p.round()
    assert r.p.model.calls == calls and r.world.jobs.get(r.job_id) == job  # nothing happens afterwards
    from contract_review.operate import job_view

    view = job_view.job_view(r.world.deps, r.job_id)  # `review status` advises the command run below
    assert view is not None and "`review retry JOB --budget-usd N`" in view.answers.retry_would
    assert "--budget-usd N" in redrive.retry(r.world.deps, r.job_id).action  # without a budget: says what to do
    assert not redrive.retry(r.world.deps, r.job_id, budget_usd=0.000001).retried  # not above what it has cost
    assert redrive.retry(r.world.deps, r.job_id, budget_usd=100.0).retried  # continues from its checkpoints
    assert r.world.jobs.get(r.job_id).budget_micro_usd == 100_000_000
    r.completes_as_fault_free()


def budget_insufficient(code: str) -> None:
    """A budget under the document's estimate is refused before any model call: by intake for a queue message
    (the job ends `failed` with the code and the estimate in its message), as by `review submit` and POST /jobs.
    The recovery: the document again with a budget of at least the estimate, under the same key (it replaces
    the refused job)."""
    r = Run()
    assert r.submit(budget_usd=0.000001) == []  # no chunk record: nothing will run
    job = r.world.jobs.get(r.job_id)
    assert job is not None and (job.state, job.error_code) == (JobState.FAILED, code) and r.p.model.calls == 0
    assert "estimated cost" in (job.error.message if job.error else "") and "at least" in job.error.message
    r.submit(budget_usd=100.0)
    r.completes_as_fault_free()


def paused(code: str) -> None:
    """An operator pauses the model: no call starts, every chunk is held as backpressure (no failure counted, not
    dead-lettered however long the pause lasts); `review quota resume` and the job completes as if never paused."""
    r = Run()
    r.submit()
    r.world.model_control.put(ModelControl(paused=True, by="ops"))
    r.p.run(r.job_id, rounds=8)
    r.world.clock.advance(r.world.settings.profile.recovery.backpressure_deadline_s * 2)  # longer than the deadline
    r.p.run(r.job_id, rounds=8)
    assert r.state()[0] is JobState.RUNNING and r.p.model.calls == 0
    chunks = r.world.claims.for_job(r.job_id)
    assert all(c.failures == 0 and c.status is ChunkStatus.PENDING for c in chunks)
    assert f'"{code}"' in r.seen()
    assert "review quota resume" in REGISTRY[code].recovery
    r.world.model_control.put(ModelControl(paused=False, by="ops"))  # `review quota resume`
    r.completes_as_fault_free()


def spend_capped(code: str) -> None:
    """The day's recorded spend reached the stack's daily spend cap (work admitted earlier spends today): the sweeper
    holds the model; no call starts, every chunk is held as backpressure (no failure counted, not dead-lettered
    however long), `review status` says why; `review quota resume --override-cap` and the job completes as if never
    held."""
    from click.testing import CliRunner

    from contract_review.domain import spend_cap
    from contract_review.operate import job_view
    from contract_review.pipeline import sweeper
    from review_local.cli import Ctx, cli

    r = Run(small_chunk_world(daily_spend_cap_usd=50.0))
    day = spend_cap.utc_day(r.world.clock())
    r.world.token_ledger.take(spend_cap.RECORDED_COUNTER, day, 50_000_000, spend_cap.UNCAPPED, 0)  # spent today
    sweeper.sweep(r.world.deps)
    r.submit()  # admitted (its estimate is far within the cap): the recorded spend is what holds the model
    r.p.run(r.job_id, rounds=8)
    r.world.clock.advance(r.world.settings.profile.recovery.backpressure_deadline_s * 2)  # longer than the deadline
    r.p.run(r.job_id, rounds=8)
    assert r.state()[0] is JobState.RUNNING and r.p.model.calls == 0
    assert all(c.failures == 0 and c.status is ChunkStatus.PENDING for c in r.world.claims.for_job(r.job_id))
    assert f'"{code}"' in r.seen() and "--override-cap" in REGISTRY[code].recovery
    view = job_view.job_view(r.world.deps, r.job_id)
    assert view is not None and view.model_hold is not None and "daily spend cap of $50.00" in view.model_hold
    resumed = CliRunner().invoke(cli, ["quota", "resume", "--override-cap"], obj=Ctx(None, None, deps=r.world.deps))
    assert resumed.exit_code == 0 and "lifted for the rest of today" in resumed.output, resumed.output
    r.completes_as_fault_free()


def daily_quota(code: str) -> None:
    """The model's daily token quota is used up (the shared ledger at 98 % of it): no call starts, every chunk is
    held (no failure counted, not dead-lettered however long it lasts) and the job names what it waits for; the
    next hour's probe call answers (the quota reset or was raised) and the job completes as if never held."""
    r = Run()
    p = r.world.settings.profile
    model_id = r.p.model.inner.model_id
    daily = DailyQuota.for_profile(r.world.token_ledger, model_id, 1_000_000, p, clock=r.world.clock)
    r.p.worker = chunk_worker(r.world.deps, r.p.model, rng=random.Random(7), sleep=lambda _s: None, daily=daily)
    r.world.token_ledger.add(model_id, daily.hour(r.world.clock()), 990_000)
    r.submit()
    r.p.run(r.job_id, rounds=8)
    r.world.clock.advance(p.recovery.backpressure_deadline_s * 2)  # longer than the deadline, within the hour
    r.p.run(r.job_id, rounds=8)
    job = r.world.jobs.get(r.job_id)
    assert job is not None and job.state is JobState.RUNNING and job.waiting is not None and r.p.model.calls == 0
    assert all(c.failures == 0 and c.status is ChunkStatus.PENDING for c in r.world.claims.for_job(r.job_id))
    assert f'"{code}"' in r.seen() and "re-probed hourly" in REGISTRY[code].recovery
    r.world.clock.advance(p.quota.daily_ledger_bucket_s)  # the next hour: one probe call, which answers
    r.completes_as_fault_free()
    ended = r.world.jobs.get(r.job_id)
    assert ended is not None and ended.waiting is None


def control_contended(code: str) -> None:
    """`review quota pause` loses its compare-and-set on every attempt (another writer changes the control between
    each read and write): one line naming the code, nothing written by it; run again, it is written, and the other
    writer's field is kept."""
    from click.testing import CliRunner

    from review_local.cli import Ctx, cli

    world = FakeWorld()
    store, update = world.model_control, world.model_control.update

    def racing(change: Callable[[ModelControl], ModelControl]) -> ModelControl:
        def raced(seen: ModelControl) -> ModelControl:  # another writer, between this read and this write
            store.control = store.control.model_copy(update={"tokens_per_minute": 1_000.0 + store.control.version,
                                                            "version": store.control.version + 1})
            return change(seen)
        return update(raced)

    store.update = racing  # type: ignore[method-assign]  # the interleaving: a writer between every read and write
    lost = CliRunner().invoke(cli, ["quota", "pause"], obj=Ctx(None, None, deps=world.deps))
    assert lost.exit_code == 1 and lost.output.startswith(f"Error: {code}: ") and len(lost.output.splitlines()) == 1
    assert not store.control.paused and "run it again" in REGISTRY[code].recovery
    store.update = update  # type: ignore[method-assign]  # the other writer has stopped
    again = CliRunner().invoke(cli, ["quota", "pause"], obj=Ctx(None, None, deps=world.deps))
    assert again.exit_code == 0 and store.control.paused and store.control.tokens_per_minute is not None


RECOVERIES: dict[str, Callable[[str], None]] = {
    # by itself
    "model.throttled": lambda c: by_itself(c, throttled),
    "model.timeout": lambda c: by_itself(c, timeout),
    "model.circuit_open": lambda c: by_itself(c, circuit_open),
    "aws.throttled": lambda c: by_itself(c, aws_throttled),
    "aws.unavailable": lambda c: by_itself(c, aws_unavailable),
    "runtime.lease_lost": lambda c: by_itself(c, lease_stolen, '"type":"chunk.lease_lost"'),
    "runtime.worker_lost": lambda c: by_itself(c, crashed),
    "runtime.retry_budget_exhausted": lambda c: by_itself(c, budget_spent),
    "runtime.checkpoint_missing": lambda c: by_itself(c, checkpoint_lost),
    "runtime.time_exhausted": lambda c: by_itself(c, out_of_time),
    "runtime.receives_exhausted": lambda c: by_itself(c, receives_burned),
    "model.refused": optional_refusal,
    "model.paused": paused,
    "model.spend_capped": spend_capped,
    "model.daily_quota_exhausted": daily_quota,
    "control.contended": control_contended,
    # the job ends; the cause is fixed; `review retry` / `review dlq redrive`
    "model.output_invalid": lambda c: ends_then(c, answers_forever("end_turn", MANDATORY), MISSING, review_retry),
    "job.chunks_missing": lambda c: ends_then(c, answers_forever("content_filtered", MANDATORY), MISSING,
                                              review_retry),
    "model.unavailable": lambda c: ends_then(c, forever(client_error("ServiceUnavailableException", 503)), DEAD,
                                             review_dlq_redrive_all),
    "model.access_denied": lambda c: ends_then(c, forever(client_error("AccessDeniedException", 403)),
                                               (JobState.FAILED, c), review_retry),
    "model.not_found": lambda c: ends_then(c, forever(client_error("ResourceNotFoundException", 404)),
                                           (JobState.FAILED, c), review_retry),
    "model.id_rejected": lambda c: ends_then(c, forever(ReviewError.of(c, "retired", step="liability")),
                                             (JobState.FAILED, c), review_retry),
    # the deploy no longer grants the job's model: redeployed with it in model_fallbacks (the fault cleared), retried
    "model.not_granted": lambda c: ends_then(c, forever(ReviewError.of(c, "not granted", step="liability")),
                                             (JobState.FAILED, c), review_retry),
    "model.request_invalid": lambda c: ends_then(c, forever(client_error("ValidationException", 400)), MISSING,
                                                 review_retry),
    "runtime.internal": lambda c: ends_then(c, forever(RuntimeError("a bug")), MISSING, review_retry),
    "aws.access_denied": lambda c: ends_then(c, repo_fails(client_error("AccessDeniedException", 403, "UpdateItem")),
                                             (JobState.FAILED, c), review_retry),
    "aws.client_error": lambda c: ends_then(c, repo_fails(client_error("ValidationException", 400, "UpdateItem")),
                                            MISSING, review_retry),
    "runtime.dead_lettered": lambda c: ends_then(c, crash_forever, DEAD, review_retry),
    "runtime.backpressure_exhausted": lambda c: ends_then(c, throttled_forever, DEAD, review_dlq_redrive_all),
    "runtime.intake_exhausted": intake_exhausted,
    "job.cancelled": cancelled,
    "job.budget_exceeded": budget_exceeded,
    "job.budget_insufficient": budget_insufficient,
    # input errors: the corrected message, the same idempotency key
    "input.invalid": lambda c: input_error(c, lambda r: {"text": TEXT}, lambda r: {"text": TEXT}, unknown_field=1),
    "input.empty_document": lambda c: input_error(c, lambda r: {"text": "  \n "}, lambda r: {"text": TEXT}),
    "input.undecodable": lambda c: input_error(c, lambda r: {"s3_uri": upload(r, "uploads/msa.txt", b"\xff\xfe caf\xe9")},
                                               lambda r: {"s3_uri": upload(r, "uploads/msa.txt", TEXT)}),
    "input.document_missing": lambda c: input_error(c, lambda r: {"s3_uri": f"s3://{r.world.artifacts.bucket}/uploads/x.txt"},
                                                    lambda r: {"s3_uri": upload(r, "uploads/x.txt", TEXT)}),
    "input.document_forbidden": lambda c: input_error(c, lambda r: {"s3_uri": upload(r, "elsewhere/x.txt", TEXT)},
                                                      lambda r: {"s3_uri": upload(r, "uploads/x.txt", TEXT)}),
    "input.too_large": lambda c: input_error(c, lambda r: {"text": BIG_TEXT},
                                             lambda r: {"s3_uri": upload(r, "uploads/big.txt", BIG_TEXT)},
                                             BIG_TEXT, small=False),
    "input.key_conflict": key_conflict,
    **BATCH_RECOVERIES,  # the batch lane's codes (test_batch_lane.py)
    **FALLBACK_RECOVERIES,  # a model that disappears, an operator's switch (test_model_fallback.py)
    **SAGA_RECOVERIES,  # the side effects' codes, on the saga's fakes (saga_recoveries.py)
    **API_RECOVERIES,  # the Job API's codes (api_recoveries.py)
}


def test_every_error_code_has_an_executed_recovery():
    assert sorted(RECOVERIES) == sorted(REGISTRY)


@pytest.mark.parametrize("code", sorted(REGISTRY))
def test_the_documented_recovery_works(code: str):
    # GIVEN the fault that produces `code` WHEN its documented recovery is followed
    # THEN the job completes with the findings of a fault-free run (see each recovery above)
    RECOVERIES[code](code)


def test_fault_free_runs_find_something():
    # the oracle is not vacuous: the fault-free run of the contract has findings in several chunks
    findings = expected()
    assert len(findings) >= 4 and len({f["chunk_id"] for f in findings}) >= 3
    assert {f["analyst"] for f in findings} >= {MANDATORY}
    assert analysts_for(SETTINGS.profile.review.analyst_count) == ANALYSTS  # the oracle runs every analyst


def test_a_job_fatal_error_part_way_through_a_paged_fan_out_is_retried_to_a_fault_free_report():
    # GIVEN a job of 4 chunks fanned out 2 at a time, whose chunk 1 fails with a job-fatal access error
    r = Run(small_chunk_world(fanout_window=2, fanout_page=1))
    ids = r.submit()
    assert len(ids) == 2  # the first window: chunks 2 and 3 have no record yet
    r.p.model.faults.append(Fault(on(ids[1]), raises(client_error("AccessDeniedException", 403))))
    r.run()
    job = r.world.jobs.get(r.job_id)
    assert job is not None and (job.state, job.error_code) == (JobState.FAILED, "model.access_denied")
    assert job.fanned_out is not None and job.fanned_out < job.chunk_count == 4  # ended before the last page
    # WHEN access is granted and the job retried
    r.p.model.faults.clear()
    review_retry(r)
    # THEN the rest of the document is fanned out after the reopened chunks, and the report is fault-free's
    r.completes_as_fault_free()
    job = r.world.jobs.get(r.job_id)
    assert job is not None and job.fanned_out == 4 and len(r.world.claims.for_job(r.job_id)) == 4
