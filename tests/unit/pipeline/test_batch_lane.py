"""The batch lane (pipeline/batch_inference*.py) through the whole in-process pipeline: a job sent with `inference:
batch` is answered by batch jobs (FakeBatchInference: the in-memory double of the port, held to the adapter's
contract, answering each record as the offline model answers it on demand), and every outcome is compared with the
on-demand run of the same document."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from contract_review.adapters.batch_inference import BedrockBatchInference
from contract_review.domain.batch_inference import MISSING, BatchRecord
from contract_review.domain.cost import batch_cost_usd, micro_usd, model_price
from contract_review.domain.errors import ReviewError
from contract_review.domain.lifecycle import request_cancel
from contract_review.domain.records import ChunkStatus, Inference, Job, JobState, Usage, job_id_for
from contract_review.operate import job_view, narration
from contract_review.pipeline import batch_inference, collector
from contract_review.pipeline.sweeper import sweep
from contract_review.review.analysts import ANALYSTS, build_request
from contract_review.review.chunking import Chunk

from ...oracle import counted
from ...texts import TEXT
from ..fakes import FakeBatchInference
from ..inprocess import Crash, InProcess, fault_free_findings
from ..scenarios import small_chunk_world

KEY = "msa-batch"
JOB_ID = job_id_for(KEY)


def batch_world(service: bool = True, **profile: object) -> tuple[InProcess, FakeBatchInference]:
    """A world whose batch jobs take records from 2 up (a round of this small document has fewer than the local
    profile's 10: those tests set their own), and its batch service."""
    world = small_chunk_world(**{"batch_min_records": 2, **profile})
    svc = FakeBatchInference(world.clock, min_records=world.settings.profile.batch.batch_min_records or 100)
    if service:
        world.deps = dataclasses.replace(world.deps, batch_inference=svc)
    return InProcess(world), svc


def submit(p: InProcess, **fields: object) -> Job:
    p.send({"text": TEXT}, key=KEY, inference="batch", **fields)
    p.intake()
    job = p.world.jobs.get(JOB_ID)
    assert job is not None
    return job


def parked_in_a_long_batch_job() -> tuple[InProcess, FakeBatchInference]:
    """A batch-mode job whose chunks have been packed into a batch job that will not end for a long while."""
    p, svc = batch_world()
    svc.end_after_s = 1_000.0
    submit(p)
    for _ in range(3):
        p.round()
    return p, svc


def on_demand_findings() -> list[dict[str, object]]:
    return fault_free_findings(small_chunk_world, {"text": TEXT})


def events(p: InProcess, kind: str) -> list[dict[str, object]]:
    return [e.detail for e in p.world.jobs.events(JOB_ID) if e.type == kind]


def completes_as_on_demand(p: InProcess) -> Job:
    """The job completes with the on-demand report; every chunk done and counted once; its model tokens and cost
    the sum of its chunks' and of its `batch.unused` spend (answers of its batch jobs no chunk took)."""
    job = p.run(JOB_ID, rounds=80)
    assert p.assert_complete_and_consistent(JOB_ID) == on_demand_findings()
    records = p.world.claims.for_job(JOB_ID)
    assert counted(p.world.claims, job) == {c.chunk_id for c in records}
    unused = [Usage(input_tokens=int(str(e["input_tokens"])), output_tokens=int(str(e["output_tokens"])),
                    model_micro_usd=int(str(e["model_micro_usd"]))) for e in events(p, "batch.unused")]
    total = Usage.of([*(c.usage() for c in records), *unused])
    assert (job.input_tokens, job.output_tokens, job.model_micro_usd) == (
        total.input_tokens, total.output_tokens, total.model_micro_usd)
    return job


def test_a_batch_mode_job_ends_with_the_on_demand_report_at_the_batch_price_and_no_on_demand_call():
    # GIVEN a batch service and a job sent with inference: batch
    p, svc = batch_world()
    job = submit(p)
    assert job.inference is Inference.BATCH and job.deadline_at is not None
    # WHEN the pipeline runs
    job = completes_as_on_demand(p)
    # THEN no call went on demand: every answer came from batch jobs, two rounds at least (locate, then assess)
    assert p.model.calls == 0
    assert len(svc.jobs) >= 2 and len(events(p, "batch.submitted")) == len(svc.jobs)
    assert events(p, "chunk.awaiting_batch") and not events(p, "batch.on_demand")
    # AND the model cost is what the answered tokens cost at the batch price (one micro-dollar of rounding per
    # chunk return at most), less than the same document on demand
    priced = batch_cost_usd(model_price(p.world.settings.profile.prices, p.world.settings.effective_model_id),
                            Usage(input_tokens=svc.tokens_in, output_tokens=svc.tokens_out))
    assert priced is not None
    assert abs(job.model_micro_usd - micro_usd(priced)) <= len(events(p, "batch.returned"))
    assert (job.input_tokens, job.output_tokens) == (svc.tokens_in, svc.tokens_out)
    on_demand = InProcess(small_chunk_world())
    on_demand.send({"text": TEXT}, key=KEY)
    on_demand_job = on_demand.run(JOB_ID)
    assert 0 < job.model_micro_usd < on_demand_job.model_micro_usd
    # AND the calls counted on the chunks are the records answered, each once
    assert sum(c.n_calls for c in p.world.claims.for_job(JOB_ID)) == sum(
        int(e["answered"]) for e in events(p, "batch.returned"))  # type: ignore[call-overload]


def test_records_that_failed_or_went_missing_are_asked_again_in_the_next_batch_and_nothing_is_lost():
    # GIVEN a batch job that answers some records with an error and leaves others out, once each (one batch failure
    # per chunk: under batch_max_failures, so nothing goes on demand; a lone record left behind is batched too)
    p, svc = batch_world(batch_min_records=1)
    faulted: Counter[str] = Counter()

    def once(record_id: str) -> str | None:
        if record_id.startswith(("liability.locate", "indemnity.locate")) and not faulted[record_id]:
            faulted[record_id] += 1
            return "500" if record_id.startswith("liability") else MISSING
        return None
    svc.record_faults = once
    submit(p)
    # WHEN the pipeline runs THEN the job completes with the on-demand report, every chunk settled once
    completes_as_on_demand(p)
    assert faulted and p.model.calls == 0
    # AND the partial batch was recorded, with the unanswered records named by their code
    returned = events(p, "batch.returned")
    assert any(e.get("error_code") == "batch.record_failed" and e["unanswered"] for e in returned)
    assert any(e["batch_status"] == "PartiallyCompleted" for e in returned)


def test_a_failed_batch_job_sends_its_chunks_back_to_be_batched_again():
    # GIVEN the first batch job fails
    p, svc = batch_world()
    svc.job_faults = ["Failed"]
    submit(p)
    # WHEN the pipeline runs THEN the job completes with the on-demand report, in batch
    completes_as_on_demand(p)
    assert p.model.calls == 0
    failed = [e for e in events(p, "batch.returned") if e.get("error_code") == "batch.job_failed"]
    assert failed and all(e["answered"] == 0 for e in failed)
    assert len({e["batch"] for e in events(p, "batch.submitted")}) == len(svc.jobs) >= 3


def test_a_chunk_whose_batches_keep_failing_goes_on_demand_after_batch_max_failures():
    # GIVEN every batch job fails
    p, svc = batch_world()
    svc.job_faults = ["Failed"] * 50
    submit(p)
    # WHEN the pipeline runs THEN after two failed batches each chunk goes on demand, and the report is the same
    completes_as_on_demand(p)
    assert p.model.calls > 0
    assert {e.get("on_demand") for e in events(p, "batch.returned") if e.get("on_demand")} == {"failures"}
    assert all(c.batch_failures == 2 and c.batch_on_demand == "failures" for c in p.world.claims.for_job(JOB_ID))


def test_records_below_the_minimum_wait_batch_max_wait_s_then_go_on_demand():
    # GIVEN a minimum no job of ours reaches
    p, svc = batch_world(batch_min_records=10_000)
    submit(p)
    # WHEN the pipeline runs THEN nothing is submitted; after the wait the chunks go on demand, same report
    completes_as_on_demand(p)
    assert not svc.jobs and p.model.calls > 0
    assert {e["reason"] for e in events(p, "batch.on_demand")} == {"min_records"}


def test_without_a_profile_minimum_the_accounts_service_quota_is_the_minimum():
    # GIVEN a profile that leaves the minimum to Service Quotas, and an account whose quota no job of ours reaches
    p, svc = batch_world(batch_min_records=None)
    svc.min_records_quota = 10_000
    submit(p)
    # WHEN the pipeline runs THEN nothing is packed below it: the chunks wait, then go on demand
    completes_as_on_demand(p)
    assert not svc.jobs and {e["reason"] for e in events(p, "batch.on_demand")} == {"min_records"}
    # AND with a quota they reach, they are batched
    p, svc = batch_world(batch_min_records=None)
    svc.min_records_quota = svc.minimum = 2  # (what its validation takes too)
    submit(p)
    completes_as_on_demand(p)
    assert svc.jobs and p.model.calls == 0


def test_without_a_batch_service_the_chunks_go_on_demand_and_say_why():
    p, _ = batch_world(service=False)
    submit(p)
    completes_as_on_demand(p)
    assert {e["reason"] for e in events(p, "batch.on_demand")} == {"unavailable"}


def test_a_deadline_nearer_than_a_batch_takes_runs_the_job_on_demand_and_says_so():
    p, svc = batch_world()
    job = submit(p, deadline_hours=0.001)  # 3.6 s: the local profile expects a batch to take 30 s
    assert job.inference is Inference.ON_DEMAND and job.deadline_at is None
    assert events(p, "job.batch_declined")
    completes_as_on_demand(p)
    assert not svc.jobs and p.model.calls > 0


def test_a_sweep_that_dies_after_creating_the_batch_job_is_finished_by_the_next_with_the_same_job():
    # GIVEN the sweeper dies right after CreateModelInvocationJob, once (before it records the job's ARN)
    p, svc = batch_world()
    real = svc.submit
    died: list[str] = []

    def submit_then_die(token: str) -> str:
        arn = real(token)
        if not died:
            died.append(token)
            raise Crash()
        return arn
    svc.submit = submit_then_die  # type: ignore[method-assign]  # the fake's method, wrapped
    submit(p)
    # WHEN the pipeline runs THEN the next sweep submits the same token: one batch job, none twice
    completes_as_on_demand(p)
    assert died and p.crashes >= 1
    assert svc.submits == len(svc.jobs) + 1
    assert sum(1 for j in svc.jobs.values() if j["token"] == died[0]) == 1


def test_a_job_cancelled_while_its_chunks_wait_in_a_batch_settles_them_cancelled_and_drops_the_answers():
    # GIVEN a batch-mode job whose chunks are parked in a running batch job
    p, svc = parked_in_a_long_batch_job()
    parked = [c for c in p.world.claims.for_job(JOB_ID) if c.status is ChunkStatus.AWAITING_BATCH]
    assert parked and all(c.batch_token for c in parked)
    # WHEN it is cancelled, and the batch job ends later
    request_cancel(p.world.deps, JOB_ID, by="test")
    job = p.run(JOB_ID)
    svc.end_after_s = 0.0
    for _ in range(3):
        p.round()
    # THEN it ended cancelled with every chunk settled cancelled, once, and no answer was sent back to a worker
    assert job.state is JobState.CANCELLED
    records = p.world.claims.for_job(JOB_ID)
    assert all(c.status is ChunkStatus.CANCELLED for c in records)
    assert not events(p, "batch.returned") and p.model.calls == 0
    assert counted(p.world.claims, p.world.jobs.get(JOB_ID)) == {c.chunk_id for c in records}  # type: ignore[arg-type]


def test_a_chunk_still_in_a_batch_job_at_its_jobs_deadline_goes_on_demand_and_its_late_answers_are_dropped():
    # GIVEN a batch-mode job whose chunks wait in a batch job that outlasts the job's deadline
    p, svc = batch_world()
    svc.end_after_s = 1_000.0
    submit(p, deadline_hours=0.03)  # 108 s: over the local profile's expected 30 s, so it is taken in batch
    # WHEN the deadline passes THEN its chunks go on demand and the job ends with the on-demand report
    completes_as_on_demand(p)
    assert {e["reason"] for e in events(p, "batch.on_demand")} == {"deadline"} and p.model.calls > 0
    # AND the batch job, ending later, sends nothing back
    svc.end_after_s = 0.0
    for _ in range(3):
        p.round()
    assert not events(p, "batch.returned")


def test_status_names_the_batch_jobs_holding_a_jobs_calls_and_when_they_are_expected():
    p, svc = parked_in_a_long_batch_job()
    shown = batch_inference.batches_of(p.world.deps, p.world.claims.for_job(JOB_ID),
                             p.world.settings.profile.batch.batch_expected_s)
    [arn] = list(svc.jobs)
    assert [(b.batch_job_arn, b.status) for b in shown] == [(arn, "InProgress")]
    assert shown[0].records == sum(c.batch_records for c in p.world.claims.for_job(JOB_ID))
    assert shown[0].expected_by == pytest.approx(shown[0].submitted_at + 30.0)  # type: ignore[operator]


def test_review_status_and_the_job_api_show_the_batch_jobs_holding_a_jobs_calls():
    p, svc = parked_in_a_long_batch_job()
    [arn] = list(svc.jobs)
    # `review watch` says each batch event in words
    said = {e.type: narration.event_label(e) for e in p.world.jobs.events(JOB_ID) if "batch" in e.type}
    assert {"chunk.awaiting_batch", "batch.submitted"} <= set(said)
    assert all(kind.replace("_", " ") not in line for kind, line in said.items()), said  # not the raw type
    view = job_view.job_view(p.world.deps, JOB_ID)
    assert view is not None and view.inference is Inference.BATCH and view.deadline_at
    [shown] = view.batches
    line = narration.batch_line(shown)
    assert arn in line and "InProgress" in line and "expected by" in line
    job = p.world.jobs.get(JOB_ID)
    assert job is not None
    status = job_view.job_status(p.world.deps, job)
    assert status["inference"] == "batch" and status["deadline"]
    assert status["batches"] == [{"batchJobArn": arn, "status": "InProgress", "records": shown.records,
                                  "batchRecords": shown.batch_records, "submittedAt": job_view.api_time(shown.submitted_at or 0),
                                  "expectedBy": job_view.api_time(shown.expected_by or 0)}]


def test_a_record_id_names_the_analyst_and_step_and_changes_with_the_request():
    chunk = Chunk(index=0, chunk_id="c0", start=0, end=len(TEXT[:300]), text=TEXT[:300])
    first = build_request(ANALYSTS[0], "locate", chunk, None, None)
    repair = build_request(ANALYSTS[0], "locate", chunk, None, "quotes must be verbatim")
    model = "global.anthropic.claude-sonnet-4-6"
    a, b = batch_inference.record_for("job-1", "c0", first, model), batch_inference.record_for("job-1", "c0", first, model)
    assert a == b and a.record_id.startswith("liability.locate.")
    assert batch_inference.record_for("job-1", "c0", repair, model).record_id != a.record_id
    assert batch_inference.record_for("job-2", "c0", first, model).record_id != a.record_id
    # a batch record reads no prompt cache: its body has no cache point
    assert "cachePoint" not in json.dumps(a.model_input)


class _Refuses:
    """A client that fails the test if the adapter calls it at all."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} was called")


def test_a_batch_of_records_sharing_an_id_is_refused_before_anything_is_submitted():
    # the boto3 adapter itself: nothing is written to S3 nor sent to Bedrock
    adapter = BedrockBatchInference(_Refuses(), _Refuses(), bucket="b", prefix="batch", role_arn="arn:role",
                                    model_id="anthropic.claude-sonnet-4-6")
    record = BatchRecord("liability.locate.x", {"messages": []})
    with pytest.raises(ReviewError) as raised:
        adapter.put_input("t1", [record, record])
    assert raised.value.envelope.error_code == "batch.request_invalid"


def test_a_job_whose_chunks_wait_in_a_long_batch_job_is_tracked_not_stalled():
    # GIVEN a batch job that runs far longer than the stall period
    p, svc = parked_in_a_long_batch_job()
    stall_s = p.world.settings.profile.recovery.stall_after_s
    # WHEN collector runs and sweeps go on past it (each its own function)
    stalled = running = 0
    for _ in range(int(3 * stall_s / 2.0) + 3):
        p.world.clock.advance(2.0)
        run = collector.collect(p.world.deps)
        report = sweep(p.world.deps)
        stalled, running = stalled + report.stalled_jobs, running + run.batch.running
    # THEN no sweep took it for stalled: the collector follows its batch job, and nothing was re-sent
    assert stalled == 0 and running > 0
    assert not events(p, "job.reconciled") and len(svc.jobs) == 1
    assert all(c.status is ChunkStatus.AWAITING_BATCH for c in p.world.claims.for_job(JOB_ID))


# --- the batch codes' documented recoveries, executed (test_recoveries.py runs them with every other code's) -----
def _record_failed(code: str) -> None:
    """Records answered with an error or missing from a partially completed batch job are asked again in the next
    batch job, by themselves: the job ends with the on-demand report."""
    p, svc = batch_world(batch_min_records=1)
    failed: set[str] = set()

    def once(record_id: str) -> str | None:
        if record_id.startswith("liability.locate") and record_id not in failed:
            failed.add(record_id)
            return "500"
        return None
    svc.record_faults = once
    submit(p)
    completes_as_on_demand(p)
    assert any(e.get("error_code") == code for e in events(p, "batch.returned")) and p.model.calls == 0


def _job_failed(code: str) -> None:
    """A batch job that fails (or is stopped, or expires) sends its chunks back to be batched again, by themselves;
    a chunk whose batches failed `batch_max_failures` times goes on demand: the job ends with the on-demand
    report either way."""
    for faults in (["Stopped"], ["Expired"] * 50):
        p, svc = batch_world()
        svc.job_faults = list(faults)
        submit(p)
        completes_as_on_demand(p)
        assert any(e.get("error_code") == code for e in events(p, "batch.returned"))


def _request_invalid(code: str) -> None:
    """Records sharing a recordId are refused before anything is submitted; ours never share one (a recordId is a
    digest of its job, chunk and request), so a batch-mode job's batch jobs always take: shown end to end."""
    test_a_batch_of_records_sharing_an_id_is_refused_before_anything_is_submitted()
    p, svc = batch_world()
    submit(p)
    completes_as_on_demand(p)
    for job in svc.jobs.values():
        ids = [r.record_id for r in job["records"]]
        assert len(ids) == len(set(ids))


def _refused(code: str) -> None:
    """Bedrock refuses the batch job: its chunks go on demand at once with the reason and the lane is turned off for
    the model; once the cause is fixed, an operator turns it on again (`review quota batch --on`: the control's
    `batch_off` entry removed) and the next batch-mode job runs in batch."""
    p, svc = batch_world()
    svc.refuse_create = "ValidationException"
    submit(p)
    completes_as_on_demand(p)
    assert [e["error_code"] for e in events(p, "batch.refused")] == [code] and p.model.calls > 0
    model_id = p.world.settings.effective_model_id
    assert p.world.model_control.get().batch_lane_off(model_id) is not None
    # the fix, then the operator's switch
    svc.refuse_create = ""
    p.world.model_control.update(lambda c: c.model_copy(
        update={"batch_off": {m: off for m, off in c.batch_off.items() if m != model_id}}))
    calls = p.model.calls
    p.send({"text": TEXT + " "}, key="after-the-fix", inference="batch")
    job = p.run(job_id_for("after-the-fix"), rounds=80)
    assert job.state is JobState.COMPLETED and p.model.calls == calls and svc.jobs


BATCH_RECOVERIES = {"batch.record_failed": _record_failed, "batch.job_failed": _job_failed,
                    "batch.request_invalid": _request_invalid, "batch.refused": _refused}


def test_an_expired_batch_jobs_answered_records_are_taken_and_the_rest_asked_again():
    # GIVEN the first batch job expires after answering half its records (Bedrock writes and bills those)
    p, svc = batch_world()
    svc.job_faults = ["Expired"]
    submit(p)
    # WHEN the pipeline runs THEN the job completes with the on-demand report, every answer from batch
    completes_as_on_demand(p)
    assert p.model.calls == 0
    # AND the expired batch job's answers were taken by their chunks; its unanswered records failed, asked again
    expired = {str(e["batch"]) for e in events(p, "batch.returned") if e.get("batch_status") == "Expired"}
    assert len(expired) == 1
    returned = [e for e in events(p, "batch.returned") if e["batch"] in expired]
    assert sum(int(str(e["answered"])) for e in returned) > 0
    assert any(e.get("error_code") == "batch.job_failed" for e in returned)
    assert not events(p, "batch.unused")
