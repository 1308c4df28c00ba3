"""The `review` CLI as a new user meets it (click's CliRunner), against the in-memory fakes: the
pipeline runs one round per (fake) sleep of the progress loop, so waiting is instant and counted.

Covers the first-hour frictions: the same document twice, watching an unknown job, a stale
.review/local.json, missing AWS credentials or region, AWS errors mid-command, finding a job by
document id, the DLQ listing and its redrive of permanent input errors."""

from __future__ import annotations

import hashlib
import json
import os
import socket

import pytest
from botocore.exceptions import EndpointConnectionError
from click.testing import CliRunner, Result

from contract_review.domain.messages import parse_results_body
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState, job_id_for
from contract_review.pipeline.aggregator import handle_message
from contract_review.pipeline.intake import handle_intake
from contract_review.review.chunking import document_hash
from review_local import progress
from review_local.cli import Ctx, cli, render
from review_local.cli.jobs import WATCH_GRACE_S
from review_local.cli.submit import SUBMIT_GRACE_S

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..scenarios import worker_finishes


class Pipeline:
    """The in-memory pipeline, one round at a time: intake takes its queue, workers finish every
    chunk message, the aggregator counts every result."""

    def __init__(self, world: FakeWorld, lose_intake: bool = False):
        self.world, self.lose_intake = world, lose_intake
        self.intake_handled = 0

    def step(self) -> None:
        w = self.world
        for sent in w.queues.drain(Queue.INTAKE):
            if not self.lose_intake:
                handle_intake(w.deps, sent.body, sent.message_id)
                self.intake_handled += 1
        for m in w.queues.analysis():
            worker_finishes(w, m.job_id, m.chunk_id)
        w.queues.drain(Queue.ANALYSIS)
        for r in w.queues.drain(Queue.RESULTS):
            handle_message(w.deps, parse_results_body(r.body))


class FakeTime:
    """progress' clock: each sleep advances it, and runs a pipeline round once `start_after` sleeps passed."""

    def __init__(self, pipeline: Pipeline | None = None, start_after: int = 0):
        self.now, self.sleeps = 0.0, 0
        self.pipeline, self.start_after = pipeline, start_after

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.pipeline is not None and self.sleeps >= self.start_after:
            self.pipeline.step()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(render.console, "width", 400)  # rich wraps at the terminal width: keep lines whole


def fake_time(monkeypatch, pipeline: Pipeline | None = None, start_after: int = 0) -> FakeTime:
    t = FakeTime(pipeline, start_after)
    monkeypatch.setattr(progress, "_now", t)
    monkeypatch.setattr(progress, "_sleep", t.sleep)
    return t


def run(world: FakeWorld | None, *args: str) -> Result:
    obj = Ctx(None, None, deps=world.deps) if world is not None else None
    return CliRunner().invoke(cli, list(args), obj=obj)


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# --- submit --wait and watch -------------------------------------------------------------------------

def test_submit_wait_of_the_same_document_twice_is_one_job_waited_on_once(tmp_path, monkeypatch):
    # GIVEN one contract given twice (the same file, and a copy of it)
    world = FakeWorld()
    f = tmp_path / "msa.txt"
    f.write_text(LONG_TEXT, encoding="utf-8")
    copy = tmp_path / "msa-copy.txt"
    copy.write_text(LONG_TEXT, encoding="utf-8")
    t = fake_time(monkeypatch, Pipeline(world))
    # WHEN submitted with --wait
    result = run(world, "submit", "--wait", str(f), str(f), str(copy))
    # THEN it is reported as one job: sent once, the duplicates named as such
    job_id = job_id_for(document_hash(LONG_TEXT))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith(job_id)]
    assert lines[0] == f"{job_id}  {f}"
    assert lines[1] == f"{job_id}  {f}  (the same document as {f}: one job, not sent again)"
    assert lines[2] == f"{job_id}  {copy}  (the same document as {f}: one job, not sent again)"
    assert world.jobs.get(job_id) is not None and world.jobs.types(job_id).count("job.queued") == 1
    # AND the wait ends as soon as the job completes, with one progress row for it
    assert world.jobs.items[job_id].state is JobState.COMPLETED
    assert t.now < 2.0 and t.sleeps <= 3
    assert result.stdout.count(f"{job_id} ") == 3 + 1  # three submission lines, one progress row


@pytest.mark.parametrize("wait", [False, True])
def test_submit_with_a_key_another_document_took_is_refused_in_one_line_as_the_api_refuses_it(
        tmp_path, monkeypatch, wait):
    """The key K names a completed job made from another document: `submit` (with or without
    --wait) says input.key_conflict in one line and exits 1; nothing is sent; never the other job's result."""
    world = FakeWorld()
    first, other = tmp_path / "msa.txt", tmp_path / "other.txt"
    first.write_text(LONG_TEXT, encoding="utf-8")
    other.write_text(TEXT, encoding="utf-8")
    fake_time(monkeypatch, Pipeline(world))
    assert run(world, "submit", "--wait", "--idempotency-key", "K", str(first)).exit_code == 0
    assert world.jobs.get(job_id_for("K")).state is JobState.COMPLETED
    sent = len(world.queues.sent[Queue.INTAKE])
    result = run(world, "submit", *(["--wait"] if wait else []), "--idempotency-key", "K", str(other))
    assert result.exit_code == 1 and "completed" not in result.output
    assert error_lines(result) == [f"Error: input.key_conflict: idempotency key 'K' names job {job_id_for('K')}, made "
                                   f"from another document; send {other} with its own key (without --idempotency-key, "
                                   "the document's SHA-256 is its key)"]
    assert len(world.queues.sent[Queue.INTAKE]) == sent


def test_submit_wait_sees_a_key_conflict_that_intake_found_while_its_message_was_on_its_way(tmp_path, monkeypatch):
    """The other document's message reached intake first (no job yet when this one was sent): intake dead-letters
    this one as input.key_conflict, and --wait must not report the other document's job as this one's."""
    world = FakeWorld()
    first, other = tmp_path / "msa.txt", tmp_path / "other.txt"
    first.write_text(LONG_TEXT, encoding="utf-8")
    other.write_text(TEXT, encoding="utf-8")
    assert run(world, "submit", "--idempotency-key", "K", str(first)).exit_code == 0  # sent, not yet taken in
    fake_time(monkeypatch, Pipeline(world))
    result = run(world, "submit", "--wait", "--idempotency-key", "K", str(other))
    assert result.exit_code == 1, result.output
    assert world.jobs.get(job_id_for("K")).state is JobState.COMPLETED  # the first document's job
    assert any(line.startswith("Error: input.key_conflict: ") for line in error_lines(result))
    assert len(world.queues.sent[Queue.INTAKE_DLQ]) == 1  # this one, as input.key_conflict


def test_submit_wait_of_a_submission_nobody_takes_in_ends_after_the_grace_period(tmp_path, monkeypatch):
    # GIVEN an intake that loses the message (the queue empties, no job record ever appears)
    world = FakeWorld()
    f = tmp_path / "nda.txt"
    f.write_text(TEXT, encoding="utf-8")
    t = fake_time(monkeypatch, Pipeline(world, lose_intake=True))
    # WHEN submitted with --wait (timeout 600 s)
    result = run(world, "submit", "--wait", str(f))
    # THEN it does not wait out the timeout: it stops once the grace period passed with intake idle
    job_id = job_id_for(document_hash(TEXT))
    assert result.exit_code == 1
    assert SUBMIT_GRACE_S <= t.now < SUBMIT_GRACE_S + 1
    assert error_lines(result) == [f"Error: no job {job_id}: no record after 10 s and the intake queue is empty, so "
                                   "nothing will create it (a mistyped id? or see `review jobs` and "
                                   "`review dlq list`)"]


def test_watch_of_an_unknown_job_answers_at_once(monkeypatch):
    # GIVEN a stack with nothing in its intake queue
    world = FakeWorld()
    t = fake_time(monkeypatch)
    # WHEN a job id nobody submitted is watched
    result = run(world, "watch", "job-00000000000000000000")
    # THEN one error line after the short grace period, exit 1 (not ten minutes of spinning)
    assert result.exit_code == 1
    assert t.now < WATCH_GRACE_S + 1
    [line] = error_lines(result)
    assert line.startswith("Error: no job job-00000000000000000000: no record after 3 s and the intake queue is empty")


@pytest.mark.parametrize("given", ["job-doesnotexist", "job-0000", "nda.txt"])
def test_watch_of_an_id_no_job_could_have_refuses_at_once_even_while_intake_is_busy(monkeypatch, given: str):
    # GIVEN a busy intake queue (a message nobody takes in yet)
    world = FakeWorld()
    world.queues.send_intake(json.dumps({"schema_version": 1, "document": {"text": TEXT}}))
    t = fake_time(monkeypatch)
    # WHEN an id that is no job id, and the start of none, is watched
    result = run(world, "watch", given)
    # THEN one line at once (no waiting for intake), exit 1
    assert result.exit_code == 1 and t.sleeps == 0
    assert error_lines(result) == [f"Error: no job {given}: not a job id (`job-` and 20 hex digits) and no job's id "
                                   "starts with it (`review jobs` lists them)"]


def test_watch_of_an_unknown_job_while_intake_was_busy_says_how_long_it_waited(monkeypatch):
    # GIVEN an intake queue holding another message, which intake only takes in after 30 polls (9 s)
    world = FakeWorld()
    world.queues.send_intake(json.dumps({"schema_version": 1, "document": {"text": TEXT}}))
    t = fake_time(monkeypatch, Pipeline(world), start_after=30)
    # WHEN a well-formed job id nobody submitted is watched
    result = run(world, "watch", "job-00000000000000000000")
    # THEN it gave up once intake was empty, and says after how long (not the grace period's 3 s)
    assert result.exit_code == 1 and t.now > WATCH_GRACE_S
    [line] = error_lines(result)
    assert line.startswith(f"Error: no job job-00000000000000000000: no record after {t.now:.0f} s and the intake "
                           "queue is empty")


def test_watch_of_a_job_still_in_the_intake_queue_waits_for_intake(monkeypatch):
    # GIVEN a message sent by hand (aws sqs send-message) that intake has not taken yet
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": "by-hand-1"})
    world.queues.send_intake(body)
    # AND an intake that only gets to it after 30 polls (9 s, past the grace period)
    pipeline = Pipeline(world)
    t = fake_time(monkeypatch, pipeline, start_after=30)
    # WHEN its job id (by the formula) is watched
    result = run(world, "watch", job_id_for("by-hand-1"))
    # THEN the missing record is waited for while the intake queue holds the message, and the job completes
    assert result.exit_code == 0, result.output
    assert pipeline.intake_handled == 1 and t.now > WATCH_GRACE_S
    assert world.jobs.items[job_id_for("by-hand-1")].state is JobState.COMPLETED


def test_watch_of_a_failed_job_exits_non_zero_and_says_where_to_look(monkeypatch):
    # GIVEN a job that failed on its input
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": " "}, "idempotency_key": "k"}),
                  "m-1")
    fake_time(monkeypatch)
    # WHEN watched  THEN it answers at once: ended failed, with its code, see status
    result = run(world, "watch", job_id_for("k"))
    assert result.exit_code == 1
    assert error_lines(result) == [f"Error: {job_id_for('k')} ended failed with input.empty_document: see "
                                   f"`review status {job_id_for('k')}`"]
    # AND its progress bar does not count a chunk it never had ("1/1 failed")
    assert "1/1" not in result.output


def test_submit_of_a_file_that_is_not_utf8_is_one_clear_error(tmp_path):
    world = FakeWorld()
    f = tmp_path / "scan.txt"
    f.write_bytes(b"Agreement \xff\xfe between")
    result = run(world, "submit", str(f))
    assert result.exit_code == 1 and world.queues.sent[Queue.INTAKE] == []
    [line] = error_lines(result)
    assert line.startswith(f"Error: input.undecodable: {f}: not UTF-8 text (at byte 10): it is probably a "
                           "single-byte encoding")


def test_submit_turns_a_file_name_into_a_valid_document_id(tmp_path):
    # GIVEN a file whose name is not a valid document_id (spaces, parentheses)
    world = FakeWorld()
    f = tmp_path / "Master Agreement (v2).txt"
    f.write_text(TEXT, encoding="utf-8")
    # WHEN submitted
    assert run(world, "submit", str(f)).exit_code == 0
    # THEN the message carries a valid id derived from the name, and intake takes it in
    body = json.loads(world.queues.sent[Queue.INTAKE][0].body)
    assert body["document_id"] == "Master_Agreement__v2_.txt"
    result = handle_intake(world.deps, world.queues.sent[Queue.INTAKE][0].body, "m-1")
    assert result.state == "running"


def test_submit_priority_bulk_is_recorded_on_the_job_and_the_default_is_interactive(tmp_path):
    # GIVEN two documents, one submitted plainly and one with --priority bulk
    world = FakeWorld()
    plain, bulk = tmp_path / "plain.txt", tmp_path / "bulk.txt"
    plain.write_text(TEXT, encoding="utf-8")
    bulk.write_text(LONG_TEXT, encoding="utf-8")
    assert run(world, "submit", str(plain)).exit_code == 0
    assert run(world, "submit", "--priority", "bulk", str(bulk)).exit_code == 0
    # THEN intake records each job's priority
    ids = [handle_intake(world.deps, s.body, f"m-{n}").job_id for n, s in enumerate(world.queues.sent[Queue.INTAKE])]
    assert [world.jobs.get(str(i)).priority.value for i in ids] == ["interactive", "bulk"]  # type: ignore[union-attr]


# --- finding a job -----------------------------------------------------------------------------------

def test_jobs_filtered_by_document_id(monkeypatch):
    # GIVEN two jobs sent by hand, one of which failed on its input (it shows its document id too)
    world = FakeWorld()
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}, "document_id": "nda-7"}),
                  "m-1")
    handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": TEXT + " "},
                                          "document_id": "msa-8", "colour": "red"}), "m-2")
    # WHEN listed by document id
    nda = run(world, "jobs", "--document-id", "nda-7", "--json")
    msa = run(world, "jobs", "--document-id", "msa-8")
    none = run(world, "jobs", "--document-id", "nope")
    # THEN each shows its own job (the job id of the formula), the failed one with its error
    assert [j["job_id"] for j in json.loads(nda.stdout)] == [job_id_for(document_hash(TEXT))]
    failed = job_id_for(document_hash(TEXT + " "))
    assert msa.exit_code == 0 and failed in msa.stdout and "msa-8" in msa.stdout and "input.invalid" in msa.stdout
    assert none.exit_code == 1 and error_lines(none) == [
        "Error: no job with document id 'nope' (intake may not have taken it yet)"]


# --- a stack that is not there -----------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stale_local_json_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    # GIVEN .review/local.json left by a `review up` that has stopped (nothing listens at its endpoint)
    port = closed_port()
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"endpoint": f"http://127.0.0.1:{port}", "region": "us-east-1",
                                 "outputs": {"IntakeQueueUrl": "x"}}))
    monkeypatch.setenv("REVIEW_LOCAL_JSON", str(local))
    # WHEN any command runs against the local stack
    for args in (["jobs"], ["status", "job-x"], ["dlq", "list"], ["watch", "job-x"]):
        result = run(None, *args)
        # THEN one line says the stack is not running and how to start it; exit 1
        assert result.exit_code == 1, args
        assert error_lines(result) == [f"Error: the local stack at http://127.0.0.1:{port} is not running: start it "
                                       "with `review up` (its .review/local.json is left from an earlier run)"]
        assert "Traceback" not in result.output


def test_no_local_stack_at_all_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("REVIEW_LOCAL_JSON", str(tmp_path / "absent.json"))
    result = run(None, "jobs")
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert line.startswith("Error: ") and "no local stack is running; start one with `review up`" in line


def test_an_aws_error_in_the_middle_of_a_command_is_one_line(monkeypatch):
    # GIVEN a connected local stack that stops answering during the command
    world = FakeWorld()

    def unreachable() -> list:
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:4566/")

    monkeypatch.setattr(world.jobs, "all", unreachable)
    ctx = Ctx(None, None, deps=world.deps)
    ctx.local_endpoint = "http://127.0.0.1:4566"
    # WHEN a command runs  THEN the error is one line naming the stopped local stack
    result = CliRunner().invoke(cli, ["jobs"], obj=ctx)
    assert result.exit_code == 1
    assert error_lines(result) == ["Error: the local stack at http://127.0.0.1:4566 is not running: start it with "
                                   "`review up` (its .review/local.json is left from an earlier run)"]


@pytest.fixture
def no_aws_config(tmp_path, monkeypatch):
    """An environment with no AWS credentials or region anywhere (and no instance metadata to ask)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_stack_without_credentials_is_one_line(no_aws_config):
    result = run(None, "--stack", "ContractReview", "--region", "eu-west-1", "jobs")
    assert result.exit_code == 1
    assert error_lines(result) == ["Error: no AWS credentials for --stack: set AWS_PROFILE (after `aws configure` or "
                                   "`aws sso login`) or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"]


def test_stack_without_a_region_is_one_line(no_aws_config):
    result = run(None, "--stack", "ContractReview", "status", "job-x")
    assert result.exit_code == 1
    assert error_lines(result) == ["Error: no AWS region for --stack: pass --region REGION or set AWS_REGION"]


def test_stack_with_an_unknown_aws_profile_is_one_line(no_aws_config, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "prod-typo")
    result = run(None, "--stack", "ContractReview", "--region", "eu-west-1", "jobs")
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert line.startswith("Error: AWS profile 'prod-typo' not found")


# --- dead letters ------------------------------------------------------------------------------------

def test_dlq_list_show_and_redrive_of_an_intake_message(monkeypatch):
    # GIVEN a hand-written message, no key, naming a document outside the stack's uploads/: intake DLQ
    world = FakeWorld()
    body = json.dumps({"schema_version": 1, "document": {"s3_uri": f"s3://{world.settings.bucket}/late.txt"}})
    assert handle_intake(world.deps, body, "sent-msg-42").state == "rejected"
    [dead] = world.queues.sent[Queue.INTAKE_DLQ]
    # WHEN listed
    listed = run(world, "dlq", "list")
    # THEN the row shows the MessageId send-message returned, the failed step and the attempts
    [row] = [line for line in listed.stdout.splitlines() if dead.message_id in line]
    assert row.startswith(f"{dead.message_id}  intake DLQ  ")  # the id whole, first
    assert "source message sent-msg-42" in row and "input.document_forbidden at intake.load" in row
    assert "after 1 attempt(s)  moved by pipeline" in row
    # AND `dlq show --body` gives the message itself (without --body it is left out)
    assert "body" not in json.loads(run(world, "dlq", "show", dead.message_id).stdout)
    assert json.loads(run(world, "dlq", "show", dead.message_id, "--body").stdout)["body"] == body
    # AND a redrive skips it with a warning (it would fail the same way), unless --force
    skipped = run(world, "dlq", "redrive", "--all")
    assert skipped.exit_code == 1 and "skipped: input.document_forbidden is a permanent input error" in skipped.stdout
    assert world.queues.sent[Queue.INTAKE] == [] and len(world.queues.sent[Queue.INTAKE_DLQ]) == 1
    forced = run(world, "dlq", "redrive", dead.message_id, "--force")
    assert forced.exit_code == 0 and "resent (--force" in forced.stdout
    assert [s.body for s in world.queues.sent[Queue.INTAKE]] == [body]


def test_submit_prints_the_job_id_of_the_formula(tmp_path):
    # The id `review submit` prints is the README's formula: "job-" + 20 hex of SHA-256(idempotency key)
    world = FakeWorld()
    f = tmp_path / "a.txt"
    f.write_text(TEXT, encoding="utf-8")
    result = run(world, "submit", "--idempotency-key", "client-1", str(f))
    assert result.stdout.splitlines() == [f"{job_id_for('client-1')}  {f}"]
    assert job_id_for("client-1") == "job-" + hashlib.sha256(b"client-1").hexdigest()[:20]


# --- quota: the model's runtime control ------------------------------------------------------------------

def test_review_quota_pauses_resumes_and_sets_the_quota_the_workers_read():
    world = FakeWorld()
    shown = run(world, "quota", "show")
    assert shown.exit_code == 0 and "model: running" in shown.output
    assert run(world, "quota", "pause").exit_code == 0 and world.model_control.control.paused
    assert world.model_control.control.by == "cli" and "PAUSED" in run(world, "quota", "show").output
    assert run(world, "quota", "set", "600000").exit_code == 0
    assert world.model_control.control.tokens_per_minute == 600_000 and world.model_control.control.paused
    assert run(world, "quota", "resume").exit_code == 0 and not world.model_control.control.paused
    assert run(world, "quota", "set", "--clear").exit_code == 0 and world.model_control.control.tokens_per_minute is None
    bad = run(world, "quota", "set")
    assert bad.exit_code == 2 and "give TOKENS_PER_MINUTE (e.g. `review quota set 50000`) or --clear" in bad.output
    # both given: said as both, not as if neither was; nothing changed
    both = run(world, "quota", "set", "50000", "--clear")
    assert both.exit_code == 2 and "TOKENS_PER_MINUTE (50000) and --clear both given: give one" in both.output
    assert world.model_control.control.tokens_per_minute is None


def test_review_quota_on_a_stack_without_the_control_is_one_clear_line():
    from dataclasses import replace

    world = FakeWorld()
    world.deps = replace(world.deps, model_control=None)
    r = run(world, "quota", "pause")
    assert r.exit_code == 1 and error_lines(r) == [
        "Error: this stack has no runtime control (no ControlTableName output): redeploy it with this version "
        "(`cdk deploy`, or `review up` locally)"]


def test_backfill_open_jobs_says_how_many_jobs_it_indexed():
    # GIVEN a stack whose jobs table holds 2 open jobs written before the open-jobs index (the adapter's scan is
    # tested on DynamoDB in tests/integration/test_repositories.py)
    world = FakeWorld()
    world.jobs.backfill_open_index = lambda: 2  # type: ignore[method-assign]
    # WHEN the operator runs the one-time backfill
    result = run(world, "backfill-open-jobs")
    # THEN it says so, and exits 0
    assert result.exit_code == 0 and "indexed 2 open job(s)" in result.stdout


def test_review_quota_shows_the_batch_lanes_turned_off_and_turns_one_on_without_touching_the_rest():
    from contract_review.domain.control_records import BatchLaneOff, ModelControl

    world = FakeWorld()
    model = world.settings.effective_model_id
    off = BatchLaneOff(error_code="batch.refused", reason="ValidationException: not offered in batch", at=1.8e9,
                       by="collector")
    other = off.model_copy(update={"reason": "AccessDeniedException: no access"})
    world.model_control.put(ModelControl(paused=True, batch_off={model: off, "model-b": other}))
    shown = run(world, "quota", "show")
    assert shown.exit_code == 0
    assert f"batch lane of {model}: OFF since" in shown.output and "ValidationException: not offered" in shown.output
    assert "batch lane of model-b: OFF" in shown.output and "review quota batch --on --model model-b" in shown.output
    as_json = json.loads(run(world, "quota", "show", "--json").output)
    assert as_json["batch_off"][model]["error_code"] == "batch.refused" and as_json["paused"] is True
    # WHEN the operator turns the stack's model's lane on THEN only its entry goes; the pause and model-b's stay
    on = run(world, "quota", "batch", "--on")
    assert on.exit_code == 0 and f"batch lane of {model}: on" in on.output, on.output
    assert world.model_control.control.batch_off == {"model-b": other} and world.model_control.control.paused
    again = run(world, "quota", "batch", "--on")
    assert again.exit_code == 0 and "is not off; nothing changed (lanes off: model-b)" in again.output
    assert run(world, "quota", "batch", "--on", "--model", "model-b").exit_code == 0
    assert world.model_control.control.batch_off == {} and "batch lane: on" in run(world, "quota", "show").output


def test_review_quota_batch_on_a_stack_without_the_control_is_one_clear_line():
    from dataclasses import replace

    world = FakeWorld()
    world.deps = replace(world.deps, model_control=None)
    r = run(world, "quota", "batch", "--on")
    assert r.exit_code == 1 and error_lines(r) == [
        "Error: this stack has no runtime control (no ControlTableName output): redeploy it with this version "
        "(`cdk deploy`, or `review up` locally)"]


@pytest.mark.parametrize("spec,said", [
    ("nonsense", "unknown batch fault 'nonsense'"),
    ("fail_rate=2", "fail_rate='2': Input should be less than or equal to 1"),
    ("fail_job=foo", "fail_job='foo'"),
    ("seed=x", "seed='x'"),
])
def test_review_up_refuses_a_bad_batch_fault_in_one_line_before_starting_anything(spec, said):
    result = CliRunner().invoke(cli, ["up", "--batch-faults", spec])
    assert result.exit_code == 2 and said in result.output
    assert "Traceback" not in result.output and "errors.pydantic.dev" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1


@pytest.mark.parametrize(("data", "says"), [
    ("Agreement".encode("utf-16"), "it is UTF-16LE (it starts with that byte-order mark): convert it to UTF-8 "
                                   "(`iconv -f UTF-16LE -t UTF-8 FILE > out.txt`)"),
    (b"%PDF-1.7\n\xe2\xe3\xcf\xd3 binary", "it is a PDF: extract its text first (`pdftotext FILE out.txt`)"),
    (b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xdf", "it is a ZIP archive (a .docx or .odt is one)"),
    (b"{\\rtf1\\ansi\\deff0 {\\fonttbl} Agreement between the parties}", "RTF markup, not plain text"),
    (b"<!DOCTYPE html><html><body><p>Agreement</p></body></html>", "HTML markup, not plain text"),
], ids=["utf-16 with a BOM", "pdf", "docx", "rtf", "html"])
def test_submit_names_what_a_file_that_is_not_plain_text_is_and_sends_nothing(tmp_path, data, says):
    world = FakeWorld()
    f = tmp_path / "contract.txt"
    f.write_bytes(data)
    result = run(world, "submit", str(f))
    assert result.exit_code == 1 and world.queues.sent[Queue.INTAKE] == []
    [line] = error_lines(result)
    assert line.startswith(f"Error: input.undecodable: {f}: ") and says in line, line


def test_a_utf8_file_with_a_byte_order_mark_is_taken_without_it(tmp_path):
    world = FakeWorld()
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    result = run(world, "submit", str(f))
    assert result.exit_code == 0, result.output
    [sent] = world.queues.sent[Queue.INTAKE]
    assert json.loads(sent.body)["document"]["text"] == TEXT


def test_submit_metadata_reaches_the_message_and_a_bad_pair_is_refused(tmp_path):
    world = FakeWorld()
    f = tmp_path / "msa.txt"
    f.write_text(TEXT, encoding="utf-8")
    result = run(world, "submit", str(f), "--metadata", "reviewing_party=Acme Ltd", "--metadata", "matter=M-1=2")
    assert result.exit_code == 0, result.output
    [sent] = world.queues.sent[Queue.INTAKE]
    assert json.loads(sent.body)["metadata"] == {"reviewing_party": "Acme Ltd", "matter": "M-1=2"}
    bad = run(world, "submit", str(f), "--metadata", "no-equals-sign")
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output and len(world.queues.sent[Queue.INTAKE]) == 1
