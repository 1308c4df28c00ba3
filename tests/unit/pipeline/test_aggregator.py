"""Aggregator (`contract_review.pipeline.aggregator.handle_result` / `finalize`) against the in-memory fakes:
counting settled chunks, the report, the coverage policy, bounded job items, unsettled chunks
found at finalize, and duplicate results."""

from __future__ import annotations

import pytest

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import report_keys
from contract_review.domain.records import (
    LIST_SAMPLE,
    AttemptStats,
    ChunkStatus,
    CoverageGap,
    Job,
    JobState,
    Reliability,
)
from contract_review.pipeline.aggregator import finalize, handle_result
from contract_review.reliability.chunks import settled_result
from contract_review.review.analysts import ANALYSTS, Finding
from contract_review.review.report import Report
from tests.oracle import counted

from ...texts import TEXT
from ..fakes import FakeWorld
from ..scenarios import ALL_OK, claim, deliver, intake, running_job, settle_done

MANDATORY = [a.name for a in ANALYSTS if a.mandatory]
OPTIONAL = [a.name for a in ANALYSTS if not a.mandatory]


# --- helpers -----------------------------------------------------------------------------------------

def finding(record: ChunkRecord, quote: str, analyst: str = "liability", category: str = "liability_cap",
            score: float = 0.6) -> Finding:
    return Finding(category=category, score=score, quote=quote, start=record.start, end=record.start + len(quote),
                   rationale="caps liability", analyst=analyst, chunk_id=record.chunk_id,
                   chunk_index=record.chunk_index)


def settle_dead(world: FakeWorld, record: ChunkRecord, code: str = "model.request_invalid") -> ChunkRecord:
    """Claim the chunk and finish it `dead_lettered` with an envelope."""
    fence = claim(world, record)
    env = ErrorEnvelope.of(code, "provider rejected the request", step="analyst.locate")
    dead = world.claims.finish(record.job_id, record.chunk_id, fence, ChunkStatus.DEAD_LETTERED,
                               AttemptStats(calls=1), error=env)
    assert dead is not None
    return dead


def report_of(world: FakeWorld, job_id: str) -> Report:
    return Report.model_validate_json(world.artifacts.get_text(report_keys(job_id)[0]))


def the_job(world: FakeWorld, job_id: str) -> Job:
    job = world.jobs.get(job_id)
    assert job is not None
    return job


# --- what is ignored ---------------------------------------------------------------------------------

def test_result_for_an_unknown_job_is_ignored():
    # GIVEN a world without that job
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    done = settle_done(world, records[0])
    msg = settled_result(done).model_copy(update={"job_id": "job-unknown"})
    # WHEN its result arrives
    outcome = handle_result(world.deps, msg)
    # THEN it is ignored: no job appears, no event
    assert outcome == "ignored"
    assert world.jobs.get("job-unknown") is None
    assert world.jobs.events("job-unknown") == []
    assert counted(world.claims, the_job(world, job_id)) == set()


@pytest.mark.parametrize("ended", [JobState.COMPLETED, JobState.FAILED, JobState.DEAD_LETTERED, JobState.CANCELLED])
def test_result_for_an_ended_job_changes_nothing_but_what_the_job_spent(ended):
    # GIVEN a job that has ended, and one of its chunks settled done (after the job ended: a job-fatal error)
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    done = settle_done(world, records[0], stats=AttemptStats(calls=22, input_tokens=900, output_tokens=90))
    assert world.jobs.transition(job_id, (JobState.RUNNING,), ended)
    # WHEN the chunk's result arrives (twice: at least once)
    outcome = deliver(world, done)
    assert deliver(world, done) == outcome == "ignored"
    # THEN the job stays as it ended (its state; no report is written), but what the chunk spent is on it, once
    # (a chunk that settled after its job ended was on no job), its count with its event
    job = the_job(world, job_id)
    assert job.state is ended and (world.settings.bucket, report_keys(job_id)[0]) not in world.artifacts.objects
    assert counted(world.claims, job) == {done.chunk_id} and job.input_tokens == done.input_tokens
    assert world.jobs.types(job_id) == ["chunk.settled"]


def test_result_whose_chunk_status_differs_from_the_record_is_stale():
    # GIVEN a chunk that was dead-lettered, then redriven (pending again, fence moved on)
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    dead = settle_dead(world, records[0])
    assert world.claims.reset_for_redrive(job_id, dead.chunk_id) is not None
    # WHEN the old dead_lettered result arrives
    outcome = deliver(world, dead)
    # THEN it is stale: not counted, no event
    assert outcome == "stale"
    assert counted(world.claims, the_job(world, job_id)) == set()
    assert world.jobs.types(job_id) == []


def test_result_claiming_done_for_a_dead_lettered_chunk_is_stale():
    # GIVEN a chunk record that is dead_lettered
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    dead = settle_dead(world, records[0])
    # WHEN a result says the chunk is done
    msg = settled_result(dead).model_copy(update={"status": ChunkStatus.DONE, "findings_key": "findings/x.json"})
    outcome = handle_result(world.deps, msg)
    # THEN it is stale and the job keeps running
    assert outcome == "stale"
    job = the_job(world, job_id)
    assert job.state is JobState.RUNNING and counted(world.claims, job) == set()


def test_result_for_an_unknown_chunk_is_stale():
    # GIVEN a running job
    world = FakeWorld()
    job_id, records = running_job(world, 1)
    done = settle_done(world, records[0])
    msg = settled_result(done).model_copy(update={"chunk_id": "c99999-nope"})
    # WHEN a result names a chunk the job does not have
    # THEN it is stale
    assert handle_result(world.deps, msg) == "stale"
    assert counted(world.claims, the_job(world, job_id)) == set()


# --- a clean job -------------------------------------------------------------------------------------

def test_all_chunks_done_completes_the_job_with_a_report():
    # GIVEN a 4-chunk job; each chunk done with every analyst ok and one finding of its own,
    #       chunk 0 after a failed first attempt and a redelivery
    world = FakeWorld()
    job_id, records = intake(world)
    assert len(records) == 4
    r0 = records[0]
    fence = claim(world, r0)
    released = world.claims.release(job_id, r0.chunk_id, fence, AttemptStats(calls=3, retries={"model.throttled": 2}),
                                    ErrorEnvelope.of("model.unavailable", "503"), failure=True)
    assert released is not None
    settled = [settle_done(world, released, findings=[finding(r0, "quote-0")], receive_count=2,
                           stats=AttemptStats(calls=22, repairs=1, retries={"model.unavailable": 1}))]
    for r in records[1:]:
        settled.append(settle_done(world, r, findings=[finding(r, f"quote-{r.chunk_index}")],
                                   stats=AttemptStats(calls=22, retries={"model.throttled": 1})))
    world.clock.advance(10)
    # WHEN their results arrive out of order
    outcomes = [deliver(world, settled[i]) for i in (2, 0, 3, 1)]
    # THEN the last one completes the job
    assert outcomes == ["recorded", "recorded", "recorded", "completed"]
    job = the_job(world, job_id)
    assert job.state is JobState.COMPLETED
    assert counted(world.claims, job) == {r.chunk_id for r in records}
    assert job.error is None and job.error_code is None and job.missing == [] and job.mandatory_gaps == []
    assert job.ended_at == world.clock.now and job.n_findings == 4
    # AND report.json and report.md are written where the job says
    json_key, md_key = report_keys(job_id)
    assert (job.report_json_key, job.report_md_key) == (json_key, md_key)
    report = report_of(world, job_id)
    assert report.state is JobState.COMPLETED and report.chunk_count == 4
    assert report.document_id == "msa-1" and report.model_id == "offline-rules-v1"
    # AND findings are in chunk order, not arrival order
    assert [f.quote for f in report.findings] == ["quote-0", "quote-1", "quote-2", "quote-3"]
    assert report.coverage.mandatory_gaps == [] and report.coverage.optional_gaps == []
    assert report.coverage.missing_chunks == []
    assert report.coverage.matrix[records[2].chunk_id] == ALL_OK
    # AND reliability counters are the sums over the chunk records
    expected = Reliability(model_calls=3 + 22 * 4, retries_by_code={"model.throttled": 2 + 3, "model.unavailable": 1},
                           repairs=1, redeliveries=1, claims=5, chunk_failures=1)
    assert report.reliability == expected
    assert job.reliability == expected
    assert job.coverage_summary is not None
    assert (job.coverage_summary.mandatory_gaps, job.coverage_summary.optional_gaps,
            job.coverage_summary.missing_chunks) == (0, 0, 0)
    md = world.artifacts.get_text(md_key)
    assert md.startswith(f"# Contract review {job_id}\n")
    assert "- state: **completed**" in md and "- findings: 4" in md and "## Coverage gaps" not in md
    # AND the events: one chunk.settled per result, then job.completed
    types = world.jobs.types(job_id)
    assert types == ["job.queued", "job.running"] + ["chunk.settled"] * 4 + ["job.completed"]
    last = world.jobs.events(job_id)[-1]
    assert last.detail == {"from_state": "running", "findings": 4, "error_code": None, "missing_chunks": 0}
    settled_events = [e.detail for e in world.jobs.events(job_id) if e.type == "chunk.settled"]
    assert [d["settled"] for d in settled_events] == [1, 2, 3, 4]
    assert all(d["total"] == 4 and d["status"] == "done" for d in settled_events)


def test_job_is_not_finalized_before_every_chunk_is_counted():
    # GIVEN a 4-chunk job with three chunks done
    world = FakeWorld()
    job_id, records = intake(world)
    settled = [settle_done(world, r) for r in records[:3]]
    # WHEN their results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job is still running with 3 of 4 counted and no report
    assert outcomes == ["recorded"] * 3
    job = the_job(world, job_id)
    assert job.state is JobState.RUNNING and len(counted(world.claims, job)) == 3 and job.progress == 0.75
    assert job.report_json_key is None
    assert (world.settings.bucket, report_keys(job_id)[0]) not in world.artifacts.objects


def test_a_job_in_flight_with_a_settled_set_on_its_item_finishes_each_chunk_counted_once():
    # GIVEN a 4-chunk job written before the settled count: chunks 0 and 1 counted in the set on its job item (with
    #       their usage on the job), chunks 2 and 3 still to come
    world = FakeWorld()
    job_id, records = intake(world)
    settled = [settle_done(world, r, stats=AttemptStats(calls=1, model_micro_usd=100 + r.chunk_index))
               for r in records]
    old = the_job(world, job_id)
    world.jobs.items[job_id] = old.model_copy(update={
        "legacy_settled": {records[0].chunk_id, records[1].chunk_id},
        "model_micro_usd": settled[0].model_micro_usd + settled[1].model_micro_usd})
    assert the_job(world, job_id).progress == 0.5
    # WHEN chunk 0's result comes again (at-least-once), then chunks 2 and 3's
    outcomes = [deliver(world, r) for r in (settled[0], settled[2], settled[3])]
    # THEN the job completes, each chunk counted once: the old ones by the set, the new ones by their marks
    assert outcomes == ["recorded", "recorded", "completed"]
    job = the_job(world, job_id)
    assert job.state is JobState.COMPLETED and counted(world.claims, job) == {r.chunk_id for r in records}
    assert job.settled_count == 2 and [r.counted for r in world.claims.for_job(job_id)] == [False, False, True, True]
    # AND its model cost is the sum of its chunks' (a chunk of the set was not added again)
    assert job.model_micro_usd == sum(c.model_micro_usd for c in settled) == 406
    assert world.jobs.types(job_id).count("chunk.settled") == 2


# --- coverage policy ---------------------------------------------------------------------------------

def test_optional_analyst_refused_still_completes_listing_the_optional_gap():
    # GIVEN a 4-chunk job where the optional `licensing` analyst refused on chunk 1
    world = FakeWorld()
    job_id, records = intake(world)
    refused = {**ALL_OK, "licensing": "refused"}
    settled = [settle_done(world, r, coverage=refused if r.chunk_index == 1 else None) for r in records]
    # WHEN all results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job completes, with the optional gap in the report and counted on the job
    assert outcomes[-1] == "completed"
    job = the_job(world, job_id)
    assert job.state is JobState.COMPLETED and job.error_code is None
    assert job.coverage_summary is not None
    assert (job.coverage_summary.optional_gaps, job.coverage_summary.mandatory_gaps) == (1, 0)
    report = report_of(world, job_id)
    assert report.coverage.optional_gaps == [CoverageGap(chunk_id=records[1].chunk_id, chunk_index=1,
                                                         analyst="licensing", status="refused")]
    assert report.coverage.mandatory_gaps == []
    assert report.coverage.matrix[records[1].chunk_id]["licensing"] == "refused"
    assert "- chunk 1 analyst licensing: refused" in world.artifacts.get_text(report_keys(job_id)[1])


def test_mandatory_analyst_refused_fails_the_job_naming_the_gap():
    # GIVEN a 4-chunk job where the mandatory `liability` analyst refused on chunk 2
    world = FakeWorld()
    job_id, records = intake(world)
    refused = {**ALL_OK, "liability": "refused"}
    settled = [settle_done(world, r, coverage=refused if r.chunk_index == 2 else None) for r in records]
    # WHEN all results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job fails with job.chunks_missing and names the gap on the job
    assert outcomes[-1] == "failed"
    job = the_job(world, job_id)
    assert job.state is JobState.FAILED and job.error_code == "job.chunks_missing"
    assert job.error is not None and job.error.error_code == "job.chunks_missing" and job.error.step == "aggregate"
    gap = CoverageGap(chunk_id=records[2].chunk_id, chunk_index=2, analyst="liability", status="refused")
    assert job.mandatory_gaps == [gap]
    assert job.missing == [] and job.root_error is None
    assert job.coverage_summary is not None and job.coverage_summary.mandatory_gaps == 1
    # AND the report is still written, with the gap, and the event says failed
    report = report_of(world, job_id)
    assert report.state is JobState.FAILED and report.coverage.mandatory_gaps == [gap]
    assert world.jobs.types(job_id)[-1] == "job.failed"
    assert world.jobs.events(job_id)[-1].detail["error_code"] == "job.chunks_missing"


def test_dead_lettered_chunk_dead_letters_the_job_listing_it():
    # GIVEN a 4-chunk job whose chunk 3 was dead-lettered, the others done
    world = FakeWorld()
    job_id, records = intake(world)
    settled = [settle_done(world, r) for r in records[:3]] + [settle_dead(world, records[3])]
    # WHEN all results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job ends dead_lettered, listing the missing chunk and the root error
    assert outcomes[-1] == "dead_lettered"
    job = the_job(world, job_id)
    assert job.state is JobState.DEAD_LETTERED and job.error_code == "runtime.dead_lettered"
    [missing] = job.missing
    assert (missing.chunk_id, missing.chunk_index, missing.status) == (records[3].chunk_id, 3,
                                                                      ChunkStatus.DEAD_LETTERED)
    assert missing.error is not None and missing.error.error_code == "model.request_invalid"
    assert missing.failures == 1
    assert job.root_error is not None and job.root_error.error_code == "model.request_invalid"
    assert job.root_error.step == "analyst.locate"
    assert job.coverage_summary is not None and job.coverage_summary.missing_chunks == 1
    # AND the report's matrix shows the chunk's status for every analyst
    report = report_of(world, job_id)
    assert report.state is JobState.DEAD_LETTERED
    assert set(report.coverage.matrix[records[3].chunk_id].values()) == {"dead_lettered"}
    md = world.artifacts.get_text(report_keys(job_id)[1])
    assert f"- chunk 3 ({records[3].chunk_id}): dead_lettered — model.request_invalid" in md
    assert world.jobs.types(job_id)[-1] == "job.dead_lettered"


def test_dead_letter_wins_over_a_mandatory_gap():
    # GIVEN one chunk with a mandatory refusal and another dead-lettered
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    settled = [settle_done(world, records[0], coverage={**ALL_OK, "indemnity": "failed"}),
               settle_dead(world, records[1])]
    # WHEN both results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job is dead_lettered (not merely failed), with both facts recorded
    assert outcomes == ["recorded", "dead_lettered"]
    job = the_job(world, job_id)
    assert job.error_code == "runtime.dead_lettered"
    assert [m.chunk_index for m in job.missing] == [1]
    assert CoverageGap(chunk_id=records[0].chunk_id, chunk_index=0, analyst="indemnity",
                       status="failed") in job.mandatory_gaps


# --- bounded job item --------------------------------------------------------------------------------

def test_job_item_holds_a_bounded_sample_while_the_report_lists_everything():
    # GIVEN a job with LIST_SAMPLE + 5 chunks, all dead-lettered
    n = LIST_SAMPLE + 5
    world = FakeWorld()
    job_id, records = running_job(world, n)
    settled = [settle_dead(world, r) for r in records]
    # WHEN all results arrive
    outcomes = [deliver(world, r) for r in settled]
    # THEN the job item keeps exactly LIST_SAMPLE missing chunks (the first, in chunk order) and gaps
    assert outcomes[-1] == "dead_lettered"
    job = the_job(world, job_id)
    assert len(job.missing) == LIST_SAMPLE
    assert [m.chunk_index for m in job.missing] == list(range(LIST_SAMPLE))
    assert len(job.mandatory_gaps) == LIST_SAMPLE
    # AND the counts and the report hold all of them
    assert job.coverage_summary is not None
    assert job.coverage_summary.missing_chunks == n
    assert job.coverage_summary.mandatory_gaps == n * len(MANDATORY)
    assert job.coverage_summary.optional_gaps == n * len(OPTIONAL)
    report = report_of(world, job_id)
    assert [m.chunk_index for m in report.coverage.missing_chunks] == list(range(n))
    assert len(report.coverage.mandatory_gaps) == n * len(MANDATORY)
    assert job.error is not None and job.error.message.startswith(f"{n} chunk(s) missing")


# --- finalize meets an unsettled chunk ---------------------------------------------------------------

def test_finalize_unsettles_a_counted_chunk_that_was_redriven():
    # GIVEN a 2-chunk job: chunk 0 dead-lettered and counted, then redriven (pending again)
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    dead = settle_dead(world, records[0])
    assert deliver(world, dead) == "recorded"
    redriven = world.claims.reset_for_redrive(job_id, dead.chunk_id)
    assert redriven is not None and redriven.status is ChunkStatus.PENDING
    done1 = settle_done(world, records[1])
    # WHEN the result of chunk 1 fills the settled count
    outcome = deliver(world, done1)
    # THEN finalize finds chunk 0 unsettled: it is un-counted and the job keeps running, no report
    assert outcome == "recorded"
    job = the_job(world, job_id)
    assert job.state is JobState.RUNNING
    assert counted(world.claims, job) == {records[1].chunk_id}
    assert job.report_json_key is None
    assert (world.settings.bucket, report_keys(job_id)[0]) not in world.artifacts.objects
    assert "job.completed" not in world.jobs.types(job_id) and "job.dead_lettered" not in world.jobs.types(job_id)
    # AND when chunk 0's own (new) result comes, the job completes
    done0 = settle_done(world, redriven)
    assert done0.fence == 3  # claim 1, redrive 2, claim 3
    assert deliver(world, done0) == "completed"
    assert the_job(world, job_id).state is JobState.COMPLETED


def test_finalize_called_directly_returns_running_when_a_chunk_is_not_settled():
    # GIVEN a job whose settled set counts both chunks but chunk 1's record is still claimed
    world = FakeWorld()
    job_id, records = running_job(world, 2)
    settle_done(world, records[0])
    claim(world, records[1])
    world.jobs.settle_chunk(job_id, records[0].chunk_id)
    job = world.jobs.settle_chunk(job_id, records[1].chunk_id)
    # WHEN finalize runs
    state = finalize(world.deps, job)
    # THEN it answers RUNNING, drops chunk 1 from the settled set and writes nothing
    assert state is JobState.RUNNING
    after = the_job(world, job_id)
    assert after.state is JobState.RUNNING and counted(world.claims, after) == {records[0].chunk_id}
    assert not any(k[1].startswith("reports/") for k in world.artifacts.objects)


# --- duplicates --------------------------------------------------------------------------------------

def test_duplicate_results_are_idempotent():
    # GIVEN a 2-chunk job with chunk 0 done and its result already counted
    world = FakeWorld()
    job_id, records = intake(world, TEXT + "\n\n" + "5. Notices. " + "All notices shall be in writing. " * 180)
    assert len(records) == 2
    done0 = settle_done(world, records[0], findings=[finding(records[0], "q0")])
    assert deliver(world, done0) == "recorded"
    # WHEN the same result is delivered again
    again = deliver(world, done0)
    # THEN the settled set is unchanged and the job keeps running; the chunk was settled once (one event)
    assert again == "recorded"
    job = the_job(world, job_id)
    assert counted(world.claims, job) == {records[0].chunk_id} and job.state is JobState.RUNNING
    assert world.jobs.types(job_id).count("chunk.settled") == 1
    # AND when the last chunk completes the job, further duplicates are ignored: one finalize only
    done1 = settle_done(world, records[1], findings=[finding(records[1], "q1")])
    assert deliver(world, done1) == "completed"
    report_before = world.artifacts.get_text(report_keys(job_id)[0])
    world.clock.advance(30)
    assert deliver(world, done1) == "ignored"
    assert deliver(world, done0) == "ignored"
    assert world.jobs.types(job_id).count("job.completed") == 1
    assert world.artifacts.get_text(report_keys(job_id)[0]) == report_before
    final = the_job(world, job_id)
    assert counted(world.claims, final) == {r.chunk_id for r in records} and final.n_findings == 2
    assert final.ended_at == world.clock.now - 30


def test_finalize_that_loses_the_race_to_a_job_fatal_failure_reports_the_real_state():
    # GIVEN a one-chunk job whose only chunk is done, and a job-fatal failure that lands between
    # finalize's read of the chunk records and its job transition
    world = FakeWorld()
    job_id, (record,) = running_job(world, 1)
    done = settle_done(world, record)
    real_for_job = world.claims.for_job

    def read_then_fail_the_job(jid: str) -> list[ChunkRecord]:
        out = real_for_job(jid)
        world.jobs.transition(jid, (JobState.RUNNING,), JobState.FAILED)
        return out

    world.claims.for_job = read_then_fail_the_job  # type: ignore[method-assign]
    # WHEN the chunk's result arrives
    outcome = deliver(world, done)
    # THEN the aggregator says what the job is, and no completion is announced
    assert outcome == "failed" and the_job(world, job_id).state is JobState.FAILED
    assert "job.completed" not in world.jobs.types(job_id)
