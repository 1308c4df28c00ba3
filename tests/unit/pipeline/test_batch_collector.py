"""The batch collector (pipeline/batch_inference_collect.py `collect`) under forced interleavings, refusals, deadlines, a pause and
batch jobs nobody wants any more. Each race wraps ONE repository or service call of the
in-memory world, as the other race tests do; tests/integration/test_batch_races_on_moto.py runs races 1 and 2 on the
real adapters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from contract_review.domain.batch_inference import BatchManifest, BatchRecord
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.control_records import BatchLaneOff, ModelControl
from contract_review.domain.cost import batch_usage
from contract_review.domain.keys import BATCH_OPEN_PREFIX, batch_manifest_key
from contract_review.domain.lifecycle import request_cancel
from contract_review.domain.messages import parse_results_body
from contract_review.domain.ports import Queue
from contract_review.domain.principals import owner
from contract_review.domain.records import ChunkStatus, Inference, Usage, job_id_for
from contract_review.domain.spend_cap import DAY_S
from contract_review.operate import job_view, model_control, narration
from contract_review.pipeline import batch_inference_collect, batch_inference_run
from contract_review.pipeline.aggregator import handle_message
from contract_review.pipeline.collector import collect as collector_run
from contract_review.pipeline.sweeper import sweep

from ...texts import TEXT
from ..fakes import FakeBatchInference
from ..inprocess import Crash, InProcess
from .test_batch_lane import JOB_ID, batch_world, completes_as_on_demand, events, submit

ALL_FOUR = 44  # the first round of this document: 4 chunks x 11 analysts' locate requests


def parked(p: InProcess) -> list[ChunkRecord]:
    """Intake, then every analysis message worked once (no sweep, no clock move): the chunks parked."""
    p.intake()
    for s in p.world.queues.drain(Queue.ANALYSIS):
        p.deliver(s)
    chunks = p.world.claims.for_job(JOB_ID)
    assert chunks and all(c.status is ChunkStatus.AWAITING_BATCH for c in chunks)
    return chunks


def collect(p: InProcess) -> batch_inference_run.CollectReport:
    return batch_inference_collect.collect(p.world.deps, p.world.clock())


def analysis_chunks(p: InProcess) -> list[str]:
    return [m.chunk_id for m in p.world.queues.analysis()]


def manifest(p: InProcess, token: str) -> BatchManifest:
    return BatchManifest.model_validate_json(p.world.artifacts.get_text(batch_manifest_key(token)))


def ended_batch_job(**profile: object) -> tuple[InProcess, FakeBatchInference]:
    """A batch-mode job whose chunks were packed into a batch job that has just ended (Completed), not collected."""
    p, svc = batch_world(**profile)
    svc.end_after_s = 1_000.0
    submit(p)
    parked(p)
    assert collect(p).submitted
    svc.end_after_s = 0.0
    return p, svc


# --- finding 1: the collector owns its returns -----------------------------------------------------------------
def test_a_returned_chunk_whose_send_failed_is_sent_by_the_next_collect():
    # GIVEN a batch job that ended, and an analysis queue that refuses the collector's first send
    p, _ = ended_batch_job()
    queues = p.world.queues
    real = queues.send_analysis
    failed: list[int] = []

    def send_fails_once(messages: Any, delay_s: int = 0) -> None:
        if not failed:
            failed.append(len(messages))
            raise ConnectionError("SQS unreachable")
        real(messages, delay_s)
    queues.send_analysis = send_fails_once  # type: ignore[method-assign]  # one call of the fake, wrapped
    # WHEN the collector returns the chunks, and its send fails (after the conditional write made one pending)
    try:
        collect(p)
    except ConnectionError:
        pass
    queues.send_analysis = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    assert failed
    stranded = [c for c in p.world.claims.for_job(JOB_ID) if c.status is ChunkStatus.PENDING]
    assert stranded and all(c.batch_message_due for c in stranded)
    assert not set(analysis_chunks(p)) & {c.chunk_id for c in stranded}
    # THEN the next collect sends each of them (and says so), and nothing is left due
    report = collect(p)
    assert report.resent >= len(stranded)
    assert {c.chunk_id for c in stranded} <= set(analysis_chunks(p))
    assert not any(c.batch_message_due for c in p.world.claims.for_job(JOB_ID))
    assert events(p, "batch.resent")
    # AND the job completes with the on-demand report, every answer from batch
    completes_as_on_demand(p)
    assert p.model.calls == 0


def test_a_collector_that_dies_between_returning_a_chunk_and_its_send_leaves_it_to_the_next():
    # GIVEN a batch job that ended, and a collector that dies right after the first chunk's conditional return
    p, _ = ended_batch_job()
    claims = p.world.claims
    real = claims.return_from_batch
    died: list[str] = []

    def return_then_die(job_id: str, chunk_id: str, *a: Any, **kw: Any) -> ChunkRecord | None:
        back = real(job_id, chunk_id, *a, **kw)
        if not died:
            died.append(chunk_id)
            raise Crash()
        return back
    claims.return_from_batch = return_then_die  # type: ignore[method-assign]  # one call of the fake, wrapped
    try:
        collect(p)
    except Crash:
        pass
    claims.return_from_batch = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    (chunk_id,) = died
    record = claims.get(JOB_ID, chunk_id)
    assert record is not None and record.status is ChunkStatus.PENDING and chunk_id not in analysis_chunks(p)
    # WHEN the next collect runs THEN it sends the chunk's message, and returns the others
    collect(p)
    sent = analysis_chunks(p)
    assert sent.count(chunk_id) == 1 and len(sent) == len(claims.for_job(JOB_ID))
    completes_as_on_demand(p)


def test_the_collector_reads_a_jobs_document_once_per_collect_not_once_per_chunk():
    p, _ = ended_batch_job()
    artifacts = p.world.artifacts
    real = artifacts.get_text
    job = p.world.jobs.get(JOB_ID)
    assert job is not None
    reads: list[str] = []

    def counting(key: str) -> str:
        reads.append(key)
        return real(key)
    artifacts.get_text = counting  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    collect(p)
    artifacts.get_text = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    assert len(analysis_chunks(p)) == job.chunk_count > 1
    assert reads.count(job.document_key) == 1


# --- finding 2: sealed manifests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("minimum", [ALL_FOUR, 22], ids=["B-waits", "B-packs-the-rest"])
def test_two_collects_at_once_never_submit_a_partial_batch_job(minimum: int):
    # GIVEN parked chunks (11 records each) and a minimum of records per batch job
    p, svc = batch_world(batch_min_records=minimum)
    svc.minimum = minimum
    submit(p)
    chunks = parked(p)
    assert sum(c.batch_records for c in chunks) == ALL_FOUR
    # AND collect B runs whole while collect A has tagged its first chunk (and not the others)
    claims = p.world.claims
    real = claims.assign_batch
    b_reports: list[batch_inference_run.CollectReport] = []

    def assign_then_b(job_id: str, chunk_id: str, fence: int, token: str | None, expected: str | None) -> Any:
        won = real(job_id, chunk_id, fence, token, expected)
        if not b_reports and token is not None:
            claims.assign_batch = real  # type: ignore[method-assign]  # B runs with the plain call
            b_reports.append(collect(p))
            claims.assign_batch = assign_then_b  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
        return won
    claims.assign_batch = assign_then_b  # type: ignore[method-assign]  # one call of the fake, wrapped
    a_report = collect(p)
    claims.assign_batch = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    (b_report,) = b_reports
    # THEN B did not take A's manifest for one that stopped before its submit: A's token was submitted by A alone, if
    # at all; every batch job submitted holds at least the minimum, and exactly the records of the chunks naming it
    assert not set(b_report.submitted) & set(a_report.submitted)
    assert all(len(j["records"]) >= minimum for j in svc.jobs.values())
    for c in claims.for_job(JOB_ID):
        if c.batch_token is not None:
            job = svc.jobs[svc.by_token[c.batch_token]]
            ids = {r.record_id for r in job["records"]}
            pending = p.world.artifacts.get_text(c.batch_pending_key or "").splitlines()
            assert {json.loads(line)["recordId"] for line in pending} <= ids
    # AND the job completes with the on-demand report, no record of it missing from a batch job
    completes_as_on_demand(p)
    assert not any(e.get("error_code") for e in events(p, "batch.returned"))


def test_a_manifest_left_unsealed_is_untagged_after_the_collectors_timeout_and_packed_again():
    # GIVEN a collector that died after tagging its chunks, before sealing the manifest
    p, svc = batch_world()
    submit(p)
    parked(p)
    svc_put = svc.put_input

    def die(token: str, records: Any) -> int:
        raise Crash()
    svc.put_input = die  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    try:
        collect(p)
    except Crash:
        pass
    svc.put_input = svc_put  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    tokens = {c.batch_token for c in p.world.claims.for_job(JOB_ID)}
    (token,) = tokens
    assert token is not None and not manifest(p, token).sealed
    # WHEN collects run within the collector's timeout THEN nothing of it is submitted nor untagged
    assert collect(p).submitted == [] and not svc.jobs
    # AND once the timeout has passed it is abandoned, its chunks untagged and packed again into a sealed one
    p.world.clock.advance(p.world.settings.profile.functions.collector_timeout_s + 1)
    report = collect(p)
    assert report.released == [token] and manifest(p, token).status == "Abandoned"
    assert len(collect(p).submitted) == 1
    completes_as_on_demand(p)
    assert p.model.calls == 0
    assert p.world.artifacts.list_keys(BATCH_OPEN_PREFIX) == []  # every batch job followed to its end


def test_a_sealed_manifest_names_exactly_the_records_of_its_chunks():
    p, svc = batch_world()
    submit(p)
    chunks = parked(p)
    (token,) = collect(p).submitted
    m = manifest(p, token)
    assert m.sealed and m.job_arn and m.records == sum(c.batch_records for c in chunks)
    (job,) = svc.jobs.values()
    assert sorted(r.record_id for r in job["records"]) == sorted(rid for mc in m.chunks for rid in mc.record_ids)


# --- finding 3: refusals are outcomes ------------------------------------------------------------------------------
def test_a_refused_batch_job_sends_its_chunks_on_demand_with_the_reason_and_turns_the_lane_off():
    # GIVEN Bedrock refuses every batch job (the model is not offered in batch)
    p, svc = batch_world()
    svc.refuse_create = "ValidationException"
    submit(p)
    # WHEN the pipeline runs THEN the job completes with the on-demand report, its calls made on demand
    completes_as_on_demand(p)
    assert p.model.calls > 0 and svc.submits == 1 and not svc.jobs
    (refused,) = events(p, "batch.refused")
    assert refused["error_code"] == "batch.refused" and refused["provider_code"] == "ValidationException"
    assert "ValidationException" in str(refused["reason"])
    assert {e["reason"] for e in events(p, "batch.on_demand")} == {"refused"}
    # AND the batch lane is off for the model, with its reason, written by the collector
    off = p.world.model_control.get().batch_lane_off(p.world.settings.effective_model_id)
    assert off is not None and (off.error_code, off.by) == ("batch.refused", "collector")
    token = str(refused["batch"])
    assert manifest(p, token).status == "Refused" and manifest(p, token).ended_at


def test_while_the_lane_is_off_a_batch_mode_job_is_admitted_and_runs_on_demand_and_says_so():
    p, svc = batch_world()
    svc.refuse_create = "AccessDeniedException"
    submit(p)
    completes_as_on_demand(p)
    # GIVEN the lane turned off; WHEN another batch-mode job is sent
    key2 = "msa-batch-2"
    p.send({"text": TEXT + " "}, key=key2, inference="batch")
    p.intake()
    job_id = job_id_for(key2)
    job = p.world.jobs.get(job_id)
    assert job is not None and job.inference is Inference.BATCH  # admitted in batch mode
    calls = p.model.calls
    job = p.run(job_id, rounds=40)
    # THEN it completes on demand: nothing parked, nothing submitted, one `batch.unavailable` event
    assert job.state.value == "completed" and p.model.calls > calls and svc.submits == 1
    kinds = [e.type for e in p.world.jobs.events(job_id)]
    assert kinds.count("batch.unavailable") == 1 and "chunk.awaiting_batch" not in kinds


def test_review_status_says_why_a_batch_mode_job_ran_on_demand_after_it_ended_and_the_lane_is_on_again():
    # GIVEN a batch-mode job whose batch job Bedrock refused: it completed on demand
    p, svc = batch_world()
    svc.refuse_create = "ValidationException"
    submit(p)
    completes_as_on_demand(p)
    # WHEN the operator turns the lane on again, and status is asked of the ended job
    model_control.batch_lane_on(p.world.deps, p.world.settings.effective_model_id)
    view = job_view.job_view(p.world.deps, JOB_ID)
    # THEN one line still says why, from the job's own events (not the lane's state now)
    assert view is not None and view.batch_off is None
    assert view.batch_note is not None and "Bedrock refused its batch job (ValidationException)" in view.batch_note
    assert "Bedrock refused its batch job" in view.batch_note.split("; ")[1]  # its chunks, counted by reason
    assert view.batch_note.count("\n") == 0


def test_a_paused_models_unpacked_requests_are_said_to_be_held_by_the_pause():
    # GIVEN a batch-mode job parked, the model paused before anything was packed
    p, svc = batch_world()
    p.world.model_control.put(ModelControl(paused=True, by="ops"))
    submit(p)
    parked(p)
    collect(p)
    view = job_view.job_view(p.world.deps, JOB_ID)
    assert view is not None and view.model_paused and not svc.jobs
    [waiting] = [b for b in view.batches if b.batch is None]
    # THEN its requests are said to be held by the pause, not waiting for a minimum
    assert "the model is paused" in narration.batch_line(waiting, view.model_paused)
    assert "paused" not in narration.batch_line(waiting)


def test_a_retryable_refusal_backs_off_and_the_job_is_batched_once_it_passes():
    # GIVEN Bedrock throttles CreateModelInvocationJob for a while
    p, svc = batch_world()
    svc.refuse_create = "ThrottlingException"
    submit(p)
    for _ in range(20):  # 40 s of sweeps
        p.round()
    # THEN the submit was tried again after its backoff, not every sweep, and the lane stays on
    assert 1 <= svc.submits <= 2 and not svc.jobs
    assert p.world.model_control.get().batch_lane_off(p.world.settings.effective_model_id) is None
    # AND once it passes, the same sealed manifest is submitted and the job completes in batch
    svc.refuse_create = ""
    completes_as_on_demand(p)
    assert p.model.calls == 0 and len(svc.jobs) >= 2


def test_a_submit_over_the_accounts_batch_job_quota_backs_off_and_keeps_the_lane_on():
    # GIVEN Bedrock answers CreateModelInvocationJob with ServiceQuotaExceededException for a while (too many batch
    # jobs in flight: it frees as they end)
    p, svc = batch_world()
    svc.refuse_create = "ServiceQuotaExceededException"
    submit(p)
    for _ in range(20):  # 40 s of rounds
        p.round()
    # THEN the submit was tried again after its backoff, nothing was refused, and the lane stays on
    assert 1 <= svc.submits <= 2 and not svc.jobs and not events(p, "batch.refused")
    assert p.world.model_control.get().batch_lane_off(p.world.settings.effective_model_id) is None
    # AND once it passes, the same sealed manifest is submitted and the job completes in batch
    svc.refuse_create = ""
    completes_as_on_demand(p)
    assert p.model.calls == 0


def test_a_submit_throttled_until_the_deadline_nears_sends_the_chunks_on_demand():
    # GIVEN Bedrock throttles every submit, and a job whose deadline is 108 s away (a batch is expected in 30 s)
    p, svc = batch_world()
    svc.refuse_create = "ThrottlingException"
    submit(p, deadline_hours=0.03)
    # WHEN the pipeline runs THEN before the deadline its chunks go on demand, and the job completes
    completes_as_on_demand(p)
    assert not svc.jobs and {e["reason"] for e in events(p, "batch.on_demand")} == {"deadline"}


def test_a_job_whose_batch_job_cannot_be_followed_is_left_for_the_stuck_jobs_alarm():
    # GIVEN chunks parked in a batch job whose status can no longer be read (every GetModelInvocationJob fails)
    p, svc = batch_world()
    svc.end_after_s = 1_000.0
    submit(p)
    parked(p)
    collect(p)

    def unreadable(job_id: str) -> Any:
        raise ConnectionError("bedrock unreachable")
    svc.status = unreadable  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    # WHEN collector runs and sweeps go on past the stall period THEN the sweeper finds the job stalled (StuckJobs),
    # and the collector says why (an item of each run failed: CollectorItemFailures)
    stall_s = p.world.settings.profile.recovery.stall_after_s
    stalled = failures = 0
    for _ in range(int(2 * stall_s / 2.0) + 2):
        p.world.clock.advance(2.0)
        failures += len(collector_run(p.world.deps).item_failures)
        report = sweep(p.world.deps)
        stalled += report.stalled_jobs
    assert stalled >= 1 and failures > 0


# --- finding 5: deadlines before packing; no paid answer lost from view -----------------------------------------
def test_a_chunk_whose_deadline_is_nearer_than_a_batch_can_answer_goes_on_demand_instead_of_into_a_batch():
    # GIVEN a job taken in batch mode 36 s before its deadline (a batch is expected to take 30 s)
    p, svc = batch_world()
    submit(p, deadline_hours=0.01)
    parked(p)
    # WHEN the collector first sees its chunks, 10 s later
    p.world.clock.advance(10.0)
    report = collect(p)
    # THEN none is packed: each goes on demand, with the reason
    assert report.submitted == [] and not svc.jobs
    assert {e["reason"] for e in events(p, "batch.on_demand")} == {"deadline"}
    completes_as_on_demand(p)


def test_a_batch_job_none_of_whose_records_is_wanted_is_stopped_and_followed_to_its_end():
    # GIVEN a batch-mode job whose chunks wait in a long batch job
    p, svc = batch_world()
    svc.end_after_s = 1_000.0
    submit(p)
    parked(p)
    (token,) = collect(p).submitted
    (arn,) = svc.jobs
    # WHEN the job is cancelled (its chunks settled cancelled)
    request_cancel(p.world.deps, JOB_ID, by="test")
    p.run(JOB_ID)
    # THEN the collector stops the batch job, follows it until it has ended, then forgets it
    assert svc.stops == [arn]
    assert events(p, "batch.stopped")
    for _ in range(3):
        p.round()
    assert manifest(p, token).ended_at is not None and manifest(p, token).status == "Stopped"
    assert p.world.artifacts.list_keys(BATCH_OPEN_PREFIX) == []
    assert not events(p, "batch.returned")


PRINCIPAL = "arn:aws:iam::123456789012:user/alice"


@dataclass
class Unused:
    """Two jobs of one principal in one batch job, the first gone on demand (its deadline) and completed: the batch
    job has just ended, not collected; what the first job and its principal had spent before."""

    p: InProcess
    svc: FakeBatchInference
    token: str
    chunks_usage: int
    spent_before: int

    def spent(self) -> int:
        day = int(self.p.world.clock() // DAY_S)
        return self.p.world.token_ledger.counters.get((f"spend#{owner(PRINCIPAL)}", day), 0)


def unused_world() -> Unused:
    p, svc = batch_world(principal_daily_spend_usd=100.0)
    svc.end_after_s = 1_000.0
    first = submit(p, deadline_hours=0.03)
    p.world.jobs.items[JOB_ID] = first.model_copy(update={"principal": PRINCIPAL})  # as the Job API admits it
    p.send({"text": TEXT + "  "}, key="msa-batch-late", inference="batch")
    p.intake()
    for s in p.world.queues.drain(Queue.ANALYSIS):
        p.deliver(s)
    (token,) = collect(p).submitted
    assert p.run(JOB_ID, rounds=80).state.value == "completed"
    chunks_usage = Usage.of(c.usage() for c in p.world.claims.for_job(JOB_ID)).model_micro_usd
    svc.end_after_s = 0.0
    u = Unused(p, svc, token, chunks_usage, 0)
    u.spent_before = u.spent()
    return u


def test_unused_answers_nobody_takes_are_spend_on_the_job_and_its_principals_daily_cap():
    # GIVEN two jobs of one principal in one batch job, the first with a deadline the batch job outlasts
    # WHEN the first job's deadline passes (its chunks go on demand and complete), then the batch job completes
    u = unused_world()
    p = u.p
    report = collect(p)
    # THEN the first job's answers nobody took are on its cost (batch.unused), beyond what its chunks counted, and
    # on the principal's spend of the day
    assert u.token in report.collected and report.unused_micro_usd > 0
    (unused,) = events(p, "batch.unused")
    job = p.world.jobs.get(JOB_ID)
    assert job is not None and job.model_micro_usd == u.chunks_usage + int(str(unused["model_micro_usd"]))
    assert u.spent() == u.spent_before + int(str(unused["model_micro_usd"]))


def test_unused_answers_are_charged_once_when_the_collect_that_recorded_them_dies_before_the_end():
    # GIVEN answers nobody takes, and a collect that dies after recording them, before the manifest's end (its
    # write times out)
    u = unused_world()
    p = u.p
    artifacts = p.world.artifacts
    real = artifacts.put_text
    died: list[str] = []

    def end_dies_once(key: str, body: str, content_type: str = "application/json") -> None:
        if key == batch_manifest_key(u.token) and json.loads(body)["ended_at"] is not None and not died:
            died.append(key)
            raise Crash()
        real(key, body, content_type)
    artifacts.put_text = end_dies_once  # type: ignore[method-assign]  # one call of the fake, wrapped
    try:
        collect(p)
    except Crash:
        pass
    artifacts.put_text = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    assert died
    # WHEN the next collect follows the batch job again (its marker still open), and another after it
    collect(p)
    collect(p)
    # THEN the answers are on the job's cost, its events and the principal's spend once
    (unused,) = events(p, "batch.unused")
    once = int(str(unused["model_micro_usd"]))
    job = p.world.jobs.get(JOB_ID)
    assert job is not None and job.model_micro_usd == u.chunks_usage + once
    assert u.spent() == u.spent_before + once
    assert p.world.artifacts.list_keys(BATCH_OPEN_PREFIX) == []


def test_unused_answers_are_charged_once_when_the_ledger_fails_after_the_job_took_them():
    # GIVEN answers nobody takes, and a token ledger that fails the first write of the collect (throttled)
    u = unused_world()
    p = u.p
    ledger = p.world.token_ledger
    failed: list[str] = []
    calls = ("take", "take_once")
    real = {name: getattr(ledger, name) for name in calls}

    def failing(name: str) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            if not failed:
                failed.append(name)
                raise ConnectionError("ledger throttled")
            return real[name](*a, **kw)
        return call
    for name in calls:  # whichever of the two the collect calls (one call of the fake, wrapped)
        setattr(ledger, name, failing(name))
    try:
        collect(p)
    except ConnectionError:
        pass
    for name in calls:
        setattr(ledger, name, real[name])
    assert failed
    # WHEN the next collect runs THEN the job holds the answers once, and the principal's spend has them once
    collect(p)
    (unused,) = events(p, "batch.unused")
    once = int(str(unused["model_micro_usd"]))
    job = p.world.jobs.get(JOB_ID)
    assert job is not None and job.model_micro_usd == u.chunks_usage + once
    assert u.spent() == u.spent_before + once


# --- finding 6: pause means pause ---------------------------------------------------------------------------------
def test_while_the_model_is_paused_the_collector_submits_nothing_and_goes_on_collecting():
    # GIVEN a job whose chunks wait in a batch job, and an operator's pause
    p, svc = batch_world()
    svc.end_after_s = 5.0
    submit(p)
    parked(p)
    assert collect(p).submitted
    p.world.model_control.put(ModelControl(paused=True, by="operator"))
    # WHEN the batch job ends and the chunks park again with their next round (assess)
    p.world.clock.advance(6.0)
    assert collect(p).collected  # collecting goes on
    for s in p.world.queues.drain(Queue.ANALYSIS):
        p.deliver(s)
    assert any(c.status is ChunkStatus.AWAITING_BATCH for c in p.world.claims.for_job(JOB_ID))
    # THEN nothing new is submitted while paused (they wait, tracked)
    for _ in range(5):
        p.world.clock.advance(2.0)
        report = collect(p)
        assert report.paused and report.submitted == []
    assert len(svc.jobs) == 1
    # AND after `review quota resume` they are packed again
    p.world.model_control.put(ModelControl(paused=False))
    assert collect(p).submitted
    completes_as_on_demand(p)


# --- finding 4: streaming, tags --------------------------------------------------------------------------------
def test_a_batch_record_carries_its_request_and_the_manifest_keeps_the_ids():
    p, svc = batch_world()
    submit(p)
    parked(p)
    (token,) = collect(p).submitted
    (job,) = svc.jobs.values()
    assert all(isinstance(r, BatchRecord) for r in job["records"])
    assert all(mc.record_ids for mc in manifest(p, token).chunks)



# --- the review of the merged change ---------------------------------------------------------------------------
def test_a_job_updated_after_the_run_started_is_still_followed_not_its_answers_dropped():
    # GIVEN a batch job that ended, and a collector run that starts (its `now`) just before the aggregator settles
    # something of the job (its updated_at moves on, 2 s later)
    p, _ = ended_batch_job()
    now = p.world.clock()
    p.world.clock.advance(2.0)
    p.world.jobs.touch(JOB_ID)
    # WHEN that run collects
    report = batch_inference_collect.collect(p.world.deps, now)
    # THEN the job's chunks took their answers: none is recorded unused, none stays parked under an ended batch job
    assert report.collected and report.unused_micro_usd == 0 and not events(p, "batch.unused")
    assert not any(c.status is ChunkStatus.AWAITING_BATCH for c in p.world.claims.for_job(JOB_ID))
    completes_as_on_demand(p)
    assert p.model.calls == 0


def test_a_batch_job_packed_by_another_collect_after_this_ones_snapshot_is_not_stopped():
    # GIVEN parked chunks, and a collect (A) whose snapshot of them was read before another collect (B) packed and
    # submitted them (B's open marker listed by A afterwards)
    p, svc = batch_world()
    svc.end_after_s = 1_000.0
    submit(p)
    parked(p)
    claims = p.world.claims
    real = claims.for_job
    b_reports: list[batch_inference_run.CollectReport] = []

    def read_then_b(job_id: str) -> list[ChunkRecord]:
        records = real(job_id)
        if not b_reports:
            claims.for_job = real  # type: ignore[method-assign]  # B runs with the plain call
            b_reports.append(collect(p))
        return records
    claims.for_job = read_then_b  # type: ignore[method-assign]  # one call of the fake, wrapped
    a_report = collect(p)
    claims.for_job = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    (b_report,) = b_reports
    (token,) = b_report.submitted
    # THEN A did not stop B's batch job (its chunks wait for it), and the job completes from batch
    assert a_report.stopped == [] and svc.stops == [] and not events(p, "batch.stopped")
    assert all(c.batch_token == token for c in claims.for_job(JOB_ID))
    svc.end_after_s = 0.0
    completes_as_on_demand(p)
    assert p.model.calls == 0


def test_answers_of_a_chunk_a_cancel_settled_while_it_was_being_returned_are_unused_spend():
    # GIVEN a batch job that ended, and a cancel that lands (and is settled by the aggregator) just before the
    # collector's first conditional return of one of its chunks
    p, svc = ended_batch_job()
    claims = p.world.claims
    real = claims.return_from_batch
    cancelled: list[str] = []

    def cancel_then_return(job_id: str, chunk_id: str, *a: Any, **kw: Any) -> ChunkRecord | None:
        if not cancelled:
            cancelled.append(chunk_id)
            request_cancel(p.world.deps, JOB_ID, by="test")
            for s in p.world.queues.drain(Queue.RESULTS):
                handle_message(p.world.deps, parse_results_body(s.body))
        return real(job_id, chunk_id, *a, **kw)
    claims.return_from_batch = cancel_then_return  # type: ignore[method-assign]  # one call of the fake, wrapped
    report = collect(p)
    claims.return_from_batch = real  # type: ignore[method-assign]  # the fake's method, wrapped (restored)
    assert cancelled and all(c.status is ChunkStatus.CANCELLED for c in claims.for_job(JOB_ID))
    # THEN the answers no chunk took (every record of the batch job was this job's) are its `batch.unused` spend
    (unused,) = events(p, "batch.unused")
    assert (unused["input_tokens"], unused["output_tokens"]) == (svc.tokens_in, svc.tokens_out) != (0, 0)
    assert report.unused_micro_usd == unused["model_micro_usd"]
    job = p.world.jobs.get(JOB_ID)
    chunks = Usage.of(c.usage() for c in claims.for_job(JOB_ID)).model_micro_usd
    assert job is not None and job.model_micro_usd == chunks + int(str(unused["model_micro_usd"]))


def test_a_manifest_packed_late_in_a_long_run_is_not_abandoned_by_another_collect_while_it_is_tagged():
    # GIVEN parked chunks, and a collect (A) that spent longer than the collector's timeout before packing (its
    # follows took that long: the clock moves on while it lists the open batch jobs); a batch job takes all four,
    # and a chunk below the minimum waits for others as long as it takes
    p, svc = batch_world(batch_min_records=ALL_FOUR, batch_max_wait_s=None)
    svc.minimum = ALL_FOUR
    submit(p)
    parked(p)
    world = p.world
    timeout_s = world.settings.profile.functions.collector_timeout_s
    artifacts, claims = world.artifacts, world.claims
    real_list, real_assign = artifacts.list_keys, claims.assign_batch

    def slow_list(prefix: str) -> list[str]:
        world.clock.advance(timeout_s + 1)
        return real_list(prefix)
    b_reports: list[batch_inference_run.CollectReport] = []

    def assign_then_b(job_id: str, chunk_id: str, fence: int, token: str | None, expected: str | None) -> Any:
        won = real_assign(job_id, chunk_id, fence, token, expected)
        if not b_reports and token is not None:  # AND another collect (B) runs whole once A has tagged one chunk
            artifacts.list_keys, claims.assign_batch = real_list, real_assign  # type: ignore[method-assign]  # B: plain calls
            b_reports.append(collect(p))
        return won
    artifacts.list_keys = slow_list  # type: ignore[method-assign]  # one call of the fake, wrapped
    claims.assign_batch = assign_then_b  # type: ignore[method-assign]  # (the interleaving's second point)
    a_report = batch_inference_collect.collect(world.deps, world.clock())
    artifacts.list_keys, claims.assign_batch = real_list, real_assign  # type: ignore[method-assign]  # restored
    # THEN B left A's manifest alone (A is tagging it right now), and A submitted it whole
    (b_report,) = b_reports
    assert b_report.released == [] and len(a_report.submitted) == 1
    (token,) = a_report.submitted
    assert manifest(p, token).status == "Submitted"
    assert all(c.batch_token == token for c in claims.for_job(JOB_ID))
    assert len(svc.jobs[svc.by_token[token]]["records"]) == ALL_FOUR


def test_a_stopped_batch_jobs_records_answered_before_the_stop_are_unused_spend():
    # GIVEN a batch-mode job whose chunks wait in a batch job (answering its records over 10 s)
    p, svc = batch_world()
    svc.end_after_s = 10.0
    submit(p)
    parked(p)
    (token,) = collect(p).submitted
    # WHEN the job is cancelled 5 s in and the collector stops the batch job (half its records answered by then)
    p.world.clock.advance(5.0)
    request_cancel(p.world.deps, JOB_ID, by="test")
    for s in p.world.queues.drain(Queue.RESULTS):
        handle_message(p.world.deps, parse_results_body(s.body))
    assert collect(p).stopped == [token]
    p.world.clock.advance(1.0)
    report = collect(p)
    # THEN the answers it wrote before the stop (billed) are the job's `batch.unused` spend, and it is forgotten
    assert token in report.collected and manifest(p, token).status == "Stopped"
    (unused,) = events(p, "batch.unused")
    assert (unused["input_tokens"], unused["output_tokens"]) == (svc.tokens_in, svc.tokens_out) != (0, 0)
    job = p.world.jobs.get(JOB_ID)
    assert job is not None and job.model_micro_usd >= int(str(unused["model_micro_usd"])) > 0


# --- one model rule: the stack's batch model ---------------------------------------------------------------------
OTHER_MODEL = "anthropic.claude-haiku-4-5-20251001-v1:0"  # priced, batch price a third of the stack's model's


def test_a_job_admitted_under_another_model_is_not_parked_while_the_stacks_batch_lane_is_off():
    # GIVEN a batch-mode job admitted under another model (an earlier deploy's), and the batch lane off for the
    # stack's batch model (the model every batch job is created with)
    p, svc = batch_world()
    job = submit(p)
    p.world.jobs.items[JOB_ID] = job.model_copy(update={"model_id": OTHER_MODEL})
    model_id = p.world.settings.effective_model_id
    assert model_id != OTHER_MODEL
    p.world.model_control.update(lambda c: c.model_copy(update={"batch_off": {model_id: BatchLaneOff(
        error_code="batch.refused", reason="ValidationException: not offered in batch", at=0.0, by="collector")}}))
    # WHEN its chunks are worked THEN none is parked for a batch job: they run on demand
    for s in p.world.queues.drain(Queue.ANALYSIS):
        p.deliver(s)
    assert not any(c.status is ChunkStatus.AWAITING_BATCH for c in p.world.claims.for_job(JOB_ID))
    assert "chunk.awaiting_batch" not in p.world.jobs.types(JOB_ID)
    assert p.run(JOB_ID, rounds=80).state.value == "completed" and not svc.jobs


def test_a_batch_jobs_answers_are_priced_with_the_model_its_manifest_names():
    # GIVEN a batch job created with another model than the stack's today (its manifest says which)
    p, svc = ended_batch_job()
    (token,) = {c.batch_token for c in p.world.claims.for_job(JOB_ID)}
    assert token is not None
    key = batch_manifest_key(token)
    m = BatchManifest.model_validate_json(p.world.artifacts.get_text(key))
    p.world.artifacts.put_text(key, m.model_copy(update={"model_id": OTHER_MODEL}).model_dump_json())
    # WHEN it is collected THEN its answers are priced at that model's batch price
    collect(p)
    tokens = Usage(input_tokens=svc.tokens_in, output_tokens=svc.tokens_out)
    expected = batch_usage(p.world.settings.profile.prices, OTHER_MODEL, tokens)
    assert expected is not None
    chunks = p.world.claims.for_job(JOB_ID)
    assert sum(c.model_micro_usd for c in chunks) == pytest.approx(expected.model_micro_usd, abs=len(chunks))
