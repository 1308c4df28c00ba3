"""The first hour with `review`, without dead ends (click's CliRunner on the in-memory fakes): ids printed whole
at 80 columns and accepted by a unique prefix, `--json` on the commands that print records, `review dlq discard`,
empty files refused before anything is sent, a batch with an unreadable file, `review watch --progress/--since`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState, job_id_for
from contract_review.pipeline.intake import handle_intake
from contract_review.review.chunking import document_hash
from review_local.cli import render

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..operate.test_ops import dead_letter_chunk
from ..scenarios import intake, small_chunk_world
from .test_cli import Pipeline, error_lines, fake_time, run


@pytest.fixture(autouse=True)
def narrow_console(monkeypatch):
    monkeypatch.setattr(render.console, "width", 80)  # a new user's terminal


def dead_intake_letter(world: FakeWorld, name: str = "late.txt") -> str:
    """A hand-written intake message naming a document outside the uploads area: intake dead-letters it."""
    body = {"schema_version": 1, "document": {"s3_uri": f"s3://{world.settings.bucket}/{name}"}}
    before = len(world.queues.sent[Queue.INTAKE_DLQ])
    assert handle_intake(world.deps, json.dumps(body), f"sent-{name}").state in ("rejected", "failed")
    assert len(world.queues.sent[Queue.INTAKE_DLQ]) == before + 1
    return world.queues.sent[Queue.INTAKE_DLQ][-1].message_id


def test_jobs_prints_ids_whole_at_80_columns():
    world = FakeWorld()
    for i, text in enumerate((TEXT, LONG_TEXT)):
        handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": text},
                                              "document_id": f"a-rather-long-document-name-{i}.txt"}), f"m-{i}")
    out = run(world, "jobs")
    assert out.exit_code == 0
    for text in (TEXT, LONG_TEXT):
        assert job_id_for(document_hash(text)) in out.stdout  # whole, on one line


def test_dlq_list_prints_ids_whole_at_80_columns_and_show_takes_a_prefix():
    world = FakeWorld()
    message_id = dead_intake_letter(world)
    listed = run(world, "dlq", "list")
    assert message_id in listed.stdout and "source message sent-late.txt" in listed.stdout
    shown = run(world, "dlq", "show", message_id[:8])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["message_id"] == message_id
    as_json = json.loads(run(world, "dlq", "list", "--json").stdout)
    assert [m["message_id"] for m in as_json] == [message_id]


def test_dlq_discard_asks_first_removes_the_letter_and_records_it_on_its_job():
    # GIVEN two dead letters: an intake message of no job, and a chunk of a job its worker dead-lettered
    world = FakeWorld()
    keep = dead_intake_letter(world, "a.txt")
    job_id, records = intake(world)
    dead_letter_chunk(world, records[1])
    [gone] = [m.message_id for m in world.queues.peek(Queue.ANALYSIS_DLQ)]
    # WHEN discarded without --yes and the question is answered no  THEN nothing is removed
    refused = run(world, "dlq", "discard", gone)
    assert refused.exit_code == 1 and "for good?" in refused.output
    assert len(world.queues.peek(Queue.ANALYSIS_DLQ)) == 1
    # WHEN discarded with --yes, by a prefix of its id
    done = run(world, "dlq", "discard", gone[:12], "--yes")
    # THEN that letter is gone, the other is still there (and visible), and its job records who discarded it
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"discarded {gone} (analysis DLQ, job {job_id}, chunk {records[1].chunk_id}")
    assert world.queues.peek(Queue.ANALYSIS_DLQ) == []
    assert [m.message_id for m in world.queues.peek(Queue.INTAKE_DLQ)] == [keep]
    [event] = [e for e in world.jobs.events(job_id) if e.type == "dlq.discarded"]
    assert event.detail["dlq_message_id"] == gone and event.detail["by"] == "cli"
    assert event.detail["error_code"] == "model.request_invalid"
    # AND discarding it again is one line
    again = run(world, "dlq", "discard", gone, "--yes")
    assert again.exit_code == 1 and error_lines(again) == [
        f"Error: no DLQ message {gone} (`review dlq list` shows their ids)"]
    # AND the one without a job is discarded too (no event to record)
    assert run(world, "dlq", "discard", keep, "--yes").exit_code == 0 and world.queues.peek(Queue.INTAKE_DLQ) == []


@pytest.mark.parametrize("content", ["", "  \n\t\n", "\u200b\ufeff"])
def test_submit_of_an_empty_file_is_refused_locally_in_one_line(tmp_path: Path, content: str):
    world = FakeWorld()
    good, empty = tmp_path / "good.txt", tmp_path / "empty.txt"
    good.write_text(TEXT, encoding="utf-8")
    empty.write_text(content, encoding="utf-8")
    result = run(world, "submit", str(good), str(empty))
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert line.startswith(f"Error: {empty}: input.empty_document: document has no text")
    assert world.queues.sent[Queue.INTAKE] == []  # refused before anything was sent


def test_submit_json_prints_each_submission(tmp_path: Path):
    world = FakeWorld()
    f = tmp_path / "a.txt"
    f.write_text(TEXT, encoding="utf-8")
    result = run(world, "submit", "--json", str(f), str(f))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"job_id": job_id_for(document_hash(TEXT)), "file": str(f), "note": None},
        {"job_id": job_id_for(document_hash(TEXT)), "file": str(f),
         "note": f"the same document as {f}: one job, not sent again"}]


def test_a_batch_with_an_unreadable_file_submits_the_good_items_and_names_the_bad(tmp_path: Path):
    world = FakeWorld()
    (tmp_path / "nda.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "scan.txt").write_bytes(b"Agreement \xff\xfe")
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [
        {"custom_id": "nda", "file": "nda.txt"}, {"custom_id": "gone", "file": "absent.txt"},
        {"custom_id": "scan", "file": "scan.txt"}]), encoding="utf-8")
    result = run(world, "submit", "--batch", str(path))
    # THEN the good item is sent, each bad one named with its reason, exit 1 naming them
    assert result.exit_code == 1
    assert len(world.queues.sent[Queue.INTAKE]) == 1
    assert "  nda  job-" in result.stdout
    assert f"{path} line 2 (gone): input.document_missing: {tmp_path / 'absent.txt'}:" in result.stdout
    assert f"{path} line 3 (scan): input.undecodable: {tmp_path / 'scan.txt'}: not UTF-8 text" in result.stdout
    assert f"2 of 3 item(s) of {path} rejected (the other 1 submitted): line 2 (gone), line 3 (scan)" in result.stderr
    # AND --json gives the same as records
    fixed = json.loads(run(world, "submit", "--batch", str(path), "--json").stdout)
    assert [(i["customId"], (i["error"] or {}).get("code")) for i in fixed["items"]] == [
        ("nda", None), ("gone", "input.document_missing"), ("scan", "input.undecodable")]
    # AND once the file is fixed, the batch is sent again (a new batch; the good item is the same job)
    (tmp_path / "absent.txt").write_text(LONG_TEXT, encoding="utf-8")
    (tmp_path / "scan.txt").write_text(TEXT + " scanned", encoding="utf-8")
    again = run(world, "submit", "--batch", str(path))
    assert again.exit_code == 0, again.output and "submitted before" not in again.stdout


def test_watch_progress_is_one_line_and_since_skips_the_events_seen(monkeypatch):
    # GIVEN a 4-chunk job that completes
    world = small_chunk_world()
    job_id = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    assert job_id is not None
    Pipeline(world).step()
    assert world.jobs.items[job_id].state is JobState.COMPLETED
    fake_time(monkeypatch)
    every = run(world, "watch", job_id)
    numbered = [line for line in every.stdout.splitlines() if f"{job_id} #" in line]
    assert len(numbered) > 4
    # WHEN watched with --progress  THEN one line: the job, its settled count, its latest event
    progress = run(world, "watch", job_id[:10], "--progress")
    assert progress.exit_code == 0, progress.output
    [line] = [x for x in progress.stdout.splitlines() if x.strip()]
    assert line.startswith(job_id) and "4/4" in line and "completed" in line and "job completed" in line
    # WHEN watched --since N  THEN only the events after N
    since = run(world, "watch", job_id, "--since", "3")
    shown = [int(x.split("#")[1].split()[0]) for x in since.stdout.splitlines() if f"{job_id} #" in x]
    assert shown and min(shown) == 4 and len(shown) == len(numbered) - 3


@pytest.mark.parametrize("since", [0, 150])
def test_watch_of_an_ended_job_prints_every_event_however_many_pages(monkeypatch, since):
    """On a job that had ended, `review watch` printed events 1-100, then "completed", exit 0.
    A job of 267 events (a retried job's approval, compensation, reopening and completion come after the first 100):
    every one is printed, in order, before the watch ends, and `--since N` resumes after event N."""
    # GIVEN a job that completed, with 267 events in its log
    world = small_chunk_world()
    job_id = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    assert job_id is not None
    Pipeline(world).step()
    assert world.jobs.items[job_id].state is JobState.COMPLETED
    while len(world.jobs.events(job_id)) < 267:
        world.jobs.record_event(job_id, "chunk.requeued", chunk_id="c", reason="model.throttled", by="worker")
    fake_time(monkeypatch)
    # WHEN it is watched (from the start, or resuming after event 150)
    watched = run(world, "watch", job_id, *(["--since", str(since)] if since else []))
    # THEN every event after `since` is printed, once and in order, and the watch ends completed
    assert watched.exit_code == 0, watched.output
    shown = [int(x.split("#")[1].split()[0]) for x in watched.stdout.splitlines() if f"{job_id} #" in x]
    assert shown == list(range(since + 1, 268))


def test_retry_cancel_and_dlq_redrive_print_their_outcomes_as_json(monkeypatch):
    world = small_chunk_world()
    job_id = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    assert job_id is not None
    fake_time(monkeypatch)
    cancelled = run(world, "cancel", "--json", job_id)
    assert cancelled.exit_code == 0, cancelled.output
    [c] = json.loads(cancelled.stdout)
    assert (c["job_id"], c["state"], c["changed"]) == (job_id, "cancelling", True)
    retried = run(world, "retry", "--json", job_id, "job-00000000000000000000")
    assert retried.exit_code == 1  # one of them was not retried: its object says why
    outcomes = json.loads(retried.stdout)
    assert [o["job_id"] for o in outcomes] == [job_id, "job-00000000000000000000"]
    assert outcomes[1]["retried"] is False and outcomes[1]["action"]
    message_id = dead_intake_letter(world)
    redriven = run(world, "dlq", "redrive", "--json", message_id)
    [r] = json.loads(redriven.stdout)
    assert r["message_id"] == message_id and r["skipped"] is True


def test_progress_labels_never_read_as_a_count_other_than_chunks_settled():
    from contract_review.domain.records import JobEvent
    from contract_review.operate.narration import event_label

    done = JobEvent(job_id="j", seq="", type="analyst.done", at=0.0, detail={
        "chunk_index": 4, "chunk_count": 29, "analysts": [{"analyst": "indemnity", "status": "ok"}]})
    settled = JobEvent(job_id="j", seq="", type="chunk.settled", at=0.0, detail={
        "chunk_index": 4, "status": "done", "settled": 2, "total": 29})
    cancelled = JobEvent(job_id="j", seq="", type="job.cancelled", at=0.0, detail={
        "settled": 8, "total": 29, "chunks_done": 2, "chunks_cancelled": 6, "chunks_never_sent": 21})
    assert event_label(done) == "chunk 5 of 29: indemnity done"  # which chunk, not "5/29"
    assert event_label(settled) == "2/29 chunks settled (chunk 5 done)"
    assert event_label(cancelled) == "job cancelled: 8/29 chunks settled (2 done, 6 cancelled, 21 never sent)"


def test_submit_json_with_wait_keeps_stdout_json_alone(tmp_path: Path, monkeypatch):
    world = small_chunk_world()
    f = tmp_path / "a.txt"
    f.write_text(TEXT, encoding="utf-8")
    fake_time(monkeypatch, Pipeline(world))
    result = run(world, "submit", "--json", "--wait", str(f))
    assert result.exit_code == 0, result.output
    assert [r["job_id"] for r in json.loads(result.stdout)] == [job_id_for(document_hash(TEXT))]


def test_quota_show_and_approve_print_their_records_as_json():
    world = FakeWorld()
    assert run(world, "quota", "pause").exit_code == 0
    control = json.loads(run(world, "quota", "show", "--json").stdout)
    assert control["paused"] is True and control["by"] == "cli"
    job_id = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1").job_id
    refused = run(world, "approve", "--json", str(job_id))
    assert refused.exit_code == 1  # not waiting: the outcome says so
    outcome = json.loads(refused.stdout)
    assert (outcome["job_id"], outcome["changed"]) == (job_id, False) and "not waiting" in outcome["message"]
