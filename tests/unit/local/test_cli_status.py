"""`review status` and `review explain` as a person reads them (click's CliRunner on the in-memory fakes):
sentences and tables, no Python reprs, each fact once, mandatory gaps summarised; `--json` carries every field.
And ids given by a unique prefix."""

from __future__ import annotations

import json
import re

import pytest

from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.operate import api, job_view
from contract_review.pipeline.intake import handle_intake

from ...texts import TEXT
from ..fakes import FakeWorld
from ..scenarios import small_chunk_world, worker_finishes
from .test_cli import Pipeline, error_lines, fake_time, run, wide_console  # noqa: F401 -- wide_console: autouse fixture
from .test_cli_retry import failed_by_access_denied

REPR = re.compile(r"\[\s*'|\[\s*\{|\{'|': |\bNone\b|JobState\.|ChunkStatus\.")  # a list/dict/enum repr


def cancelled_after_one_chunk(world: FakeWorld, monkeypatch) -> str:
    """A 4-chunk job: chunk 1 done, then cancelled (the other three settle `cancelled`)."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    job_id = result.job_id
    assert job_id is not None
    world.queues.drain(Queue.ANALYSIS)
    first = min(world.claims.for_job(job_id), key=lambda c: c.chunk_index)
    worker_finishes(world, job_id, first.chunk_id)
    fake_time(monkeypatch, Pipeline(world))
    assert run(world, "cancel", "--wait", job_id).exit_code == 0
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED and job.chunk_count == 4
    return job_id


def test_status_of_a_cancelled_job_is_sentences_and_tables_each_fact_once(monkeypatch):
    # GIVEN a job cancelled after its first chunk: three chunks cancelled, each missing every mandatory analyst
    world = small_chunk_world()
    job_id = cancelled_after_one_chunk(world, monkeypatch)
    view = job_view.job_view(world.deps, job_id)
    assert view is not None and len(view.mandatory_gaps) > 3  # one per (chunk, analyst): what used to be listed
    # WHEN its status is read
    out = run(world, "status", job_id)
    assert out.exit_code == 0, out.output
    text = out.stdout
    # THEN no Python repr anywhere
    assert not REPR.search(text), text
    # AND each fact once: the state, the error, the cost, the gaps (one summary line, not one line per pair)
    assert text.count("cancelled: job.cancelled") == 1 and "state:" not in text
    assert text.count("cost:") == 1
    assert "mandatory gap:" not in text
    [gaps] = [line for line in text.splitlines() if "mandatory gaps" in line]
    assert gaps.endswith(f"chunks 2-4 cancelled: all {len(view.mandatory_gaps) // 3} mandatory analysts")
    # AND progress is the one number, the chunks settled, with what they settled as
    assert "progress: 4 of 4 chunks settled; its chunks: 1 done, 3 cancelled;" in text
    # AND the job.cancelled event counts the same settled chunks, as does the Job API's currentStep
    assert "job cancelled: 4/4 chunks settled (1 done, 3 cancelled)" in text
    [ended] = [e for e in world.jobs.events(job_id) if e.type == "job.cancelled"]
    job = world.jobs.get(job_id)
    assert job is not None and ended.detail["settled"] == job_view.job_progress(world.deps, job).current_step == 4


def test_status_json_carries_every_field(monkeypatch):
    world = small_chunk_world()
    job_id = cancelled_after_one_chunk(world, monkeypatch)
    data = json.loads(run(world, "status", "--json", job_id).stdout)
    assert set(data) == {n for n, f in job_view.JobView.model_fields.items() if not f.exclude}  # API-only fields out
    assert data["answers"]["side_effects_done"] == [] and data["chunks"] == {"total": 4, "settled": 4, "done": 1,
                                                                              "cancelled": 3}
    assert len(data["mandatory_gaps"]) == len(job_view.job_view(world.deps, job_id).mandatory_gaps)  # type: ignore[union-attr]


def test_status_of_a_completed_job_names_its_reports_in_words(monkeypatch):
    world = small_chunk_world()
    fake_time(monkeypatch, Pipeline(world))
    job_id = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    assert job_id is not None
    Pipeline(world).step()
    text = run(world, "status", job_id).stdout
    assert not REPR.search(text), text
    assert "side effects done: the JSON and Markdown reports written" in text
    assert "report_json_key" not in text and text.count(f"{job_id} is completed") == 1


def test_status_and_explain_of_a_failed_job_say_what_a_retry_does_in_plain_words(monkeypatch):
    # GIVEN a job failed by model.access_denied, with nothing in a DLQ
    world = small_chunk_world()
    job_id, _ = failed_by_access_denied(world)
    status = run(world, "status", job_id).stdout
    # THEN the retry sentence reads (it used to say "failed chunks and chunks and checkpoints are reused")
    assert "chunks and chunks" not in status
    assert ("its failed chunks run again, so do the analysts with a mandatory gap, the chunks never started are "
            "sent, and the chunks already done are kept") in status
    # WHEN explained
    out = run(world, "explain", job_id)
    assert out.exit_code == 0, out.output
    paragraphs = [p for p in out.stdout.split("\n\n") if p.strip()]
    # THEN six short paragraphs, the six answers, in order
    assert [p.split(":", 1)[0].strip() for p in paragraphs] == [
        "What happened", "Where it is", "What it cost", "What failed and why", "What to do next",
        "If it fails again"]
    assert not REPR.search(out.stdout), out.stdout
    assert "ended `failed`" in paragraphs[0]
    assert "Where it is: 0 of 4 chunks settled; its chunks: 1 done, 1 failed, 2 pending;" in paragraphs[1]
    # AND the failure is said once: the chunk that failed, not again as its seven analysts' gaps
    assert paragraphs[3] == ("What failed and why: it ended with model.access_denied: AccessDeniedException; "
                             "chunk 2 failed (model.access_denied).")
    assert f"`review retry {job_id}`" in paragraphs[4]  # the command itself, with the job's id
    assert "model.access_denied (job-fatal)" in paragraphs[5]
    # AND --json gives the same six answers by name
    answers = json.loads(run(world, "explain", "--json", job_id).stdout)
    assert list(answers) == ["what_happened", "where_it_is", "what_it_cost", "what_failed", "what_next",
                             "if_it_fails_again"]


def test_a_job_id_is_accepted_by_a_unique_prefix_and_an_ambiguous_one_is_one_line(monkeypatch):
    world = small_chunk_world()
    fake_time(monkeypatch, Pipeline(world))
    ids = [handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": t}}), f"m-{i}").job_id
           for i, t in enumerate((TEXT, TEXT + " more", TEXT + " and more"))]
    assert all(ids)
    job_id = str(ids[0])
    # a prefix no other job shares (with or without `job-`)
    n = next(n for n in range(5, 24) if sum(str(j).startswith(job_id[:n]) for j in ids) == 1)
    for given in (job_id[:n], job_id[4:n]):
        out = run(world, "status", given)
        assert out.exit_code == 0 and out.stdout.startswith(f"{job_id} is "), out.output
    assert run(world, "report", job_id[:n]).exit_code == 1  # resolved, then: no report yet (not "no job")
    assert "has no report yet" in run(world, "report", job_id[:n]).output
    # `job-` alone names them all: refused in one line that names them whole
    amb = run(world, "status", "job-")
    assert amb.exit_code == 1 and len(error_lines(amb)) == 1 and "is the start of 3 job ids" in amb.output
    assert all(str(j) in amb.output for j in ids)


def test_status_and_explain_of_a_job_waiting_for_approval_say_a_person_decides():
    from ..fake_side_effects import FakeSideEffects
    from ..sideeffects.test_saga_pipeline import waiting

    world, _, job_id = waiting(FakeSideEffects())
    status = run(world, "status", job_id)
    assert status.exit_code == 0 and not REPR.search(status.stdout), status.stdout
    # the retry and failure answers fit a waiting job (not "resume unsettled chunks", not "the analysis DLQ")
    assert "a retry would: nothing by itself: the job waits for a person's decision" in status.stdout
    assert "analysis DLQ" not in status.stdout and "null" not in status.stdout
    story = run(world, "explain", job_id).stdout
    assert "What to do next: a person decides before " in story and f"`review approve {job_id}`" in story
    assert "makes the job wait for a decision again" in story


def test_a_failed_job_with_no_report_says_its_code_and_what_to_do_in_the_cli_and_the_api():
    # GIVEN a job failed by a job-fatal error before any report was written
    world = small_chunk_world()
    job_id, _ = failed_by_access_denied(world)
    # WHEN its report is asked for
    out = run(world, "report", job_id)
    # THEN one line names the ending, its code and the remedy (review retry), not "no report yet"
    assert out.exit_code == 1 and len(error_lines(out)) == 1, out.output
    assert f"job {job_id} has no report: it ended failed with model.access_denied" in out.output
    assert "`review retry JOB`" in out.output and "no report yet" not in out.output
    # AND the Job API's report route says the same (one function)
    job = world.jobs.get(job_id)
    assert job is not None
    with pytest.raises(api.ApiError) as refused:
        api.report_url(world.deps, job, "md")
    assert refused.value.status == 409 and refused.value.message == job_view.no_report(job)


def test_status_of_a_job_failed_on_its_input_prints_no_empty_model_fields():
    # GIVEN a job that failed on its input (no model, no prompts recorded)
    world = FakeWorld()
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": " \n "},
                                                   "idempotency_key": "blank-1"}), "m-1")
    job = world.jobs.get(result.job_id or "")
    assert job is not None and job.state is JobState.FAILED
    # WHEN its status is printed THEN the header has no empty "model , prompts ;"
    out = run(world, "status", job.job_id)
    header = out.stdout.splitlines()[1]
    assert header.startswith("  document (no id); created ") and "model" not in header, out.stdout


def test_review_jobs_filters_by_state():
    world = small_chunk_world()
    done = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    failed = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": " "},
                                                   "idempotency_key": "blank"}), "m-2").job_id
    out = run(world, "jobs", "--state", "failed")
    assert out.exit_code == 0 and str(failed) in out.stdout and str(done) not in out.stdout
    both = run(world, "jobs", "--state", "failed", "--state", "running")
    assert str(failed) in both.stdout and str(done) in both.stdout
    assert run(world, "jobs", "--state", "finished").exit_code == 2  # a state that does not exist: refused


def test_explain_of_a_job_rejected_then_retried_says_what_failed_before():
    # GIVEN a job whose ticket step a person rejected, retried since (its ending cleared, the decision kept)
    from contract_review.domain.records import Approval

    from ..scenarios import running_job
    world = FakeWorld()
    job_id, _ = running_job(world, 1)
    at = world.clock()
    decided = Approval(step="ticket", key="k" * 16, reason="the ticket may exist: its lookup failed", requested_at=at,
                       expires_at=at + 3600, decision="reject", decided_by="alice", decided_at=at + 60)
    world.jobs.items[job_id] = world.jobs.items[job_id].model_copy(update={"approval": decided})
    # WHEN it is explained THEN the rejection is named, not "nothing"
    story = job_view.explain(job_view.view_of(world.deps, world.jobs.items[job_id]))
    failed = next(line for line in story if line.startswith("What failed and why:"))
    assert failed.startswith("What failed and why: earlier, step ticket's approval was rejected by alice at "), failed
    assert failed.endswith("(the ticket may exist: its lookup failed); the job was retried after it."), failed
