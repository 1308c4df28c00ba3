"""The status page's server (review_local/ui_server.py) over HTTP on loopback, against the in-memory fakes: what it
reads comes from the cores the CLI and the Job API use, a principal sees only its jobs, and only the page itself
can act. GIVEN / WHEN / THEN. The page in a real browser: tests/integration/test_ui_browser.py."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from contract_review.domain.principals import Caller
from contract_review.domain.records import JobState, Priority
from contract_review.operate import activity, api, job_view
from contract_review.operate.submission import SubmitRequest, submit
from review_local.api_server import local_principal
from review_local.ui_server import ACTION_HEADER, UiServer

from ...texts import LONG_TEXT, RISKY
from ..fakes import FakeWorld
from ..inprocess import InProcess
from ..scenarios import small_chunk_world

ALICE = local_principal("alice")
BOB = local_principal("bob")

pytestmark = pytest.mark.small_chunks()  # the `world` fixture: every clause of TEXT is a chunk


def request(ui: UiServer, method: str, path: str, body: object = None, *, act: bool = True,
            host: str | None = None) -> tuple[int, object, str]:
    url = urlsplit(ui.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    headers = {"Host": host or url.netloc}
    if act and method == "POST":
        headers[ACTION_HEADER] = "1"
    raw = json.dumps(body).encode() if body is not None else b""
    conn.request(method, path, raw, headers)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    ctype = r.getheader("Content-Type") or ""
    return r.status, json.loads(text) if ctype.startswith("application/json") else text, ctype


@pytest.fixture
def operator(world: FakeWorld) -> Iterator[UiServer]:
    with UiServer(world.deps) as ui:
        yield ui


def test_a_contract_submitted_from_the_page_shows_its_grid_findings_cost_and_timeline(world, operator):
    # GIVEN the page (an operator's view)
    status, page, ctype = request(operator, "GET", "/")
    assert status == 200 and ctype.startswith("text/html") and 'id="grid"' in str(page)
    # WHEN a contract is submitted from it and the pipeline runs it
    status, body, _ = request(operator, "POST", "/api/submit", {"text": LONG_TEXT, "documentId": "msa-ui"})
    assert status == 202, body
    job_id = body["jobId"]  # type: ignore[index]
    run = InProcess(world)
    job = run.run(job_id)
    assert job.state is JobState.COMPLETED
    # THEN the list finds it by state, by document id and by id, and not under another state
    for query in ("?state=completed", "?q=msa-ui", f"?q={job_id[:10]}"):
        assert [j["jobId"] for j in request(operator, "GET", "/api/jobs" + query)[1]["jobs"]] == [job_id], query
    assert request(operator, "GET", "/api/jobs?state=failed")[1]["jobs"] == []
    # AND its detail: every chunk x analyst cell ok, the report's findings in chunk order, its cost, the Job API's view
    status, d, _ = request(operator, "GET", f"/api/jobs/{job_id}")
    assert status == 200
    grid = d["grid"]
    assert len(grid["rows"]) == job.chunk_count > 1 and len(grid["analysts"]) == job.analyst_count
    assert all(cell == "ok" for row in grid["rows"] for cell in row["cells"])
    report = run.findings(job)
    shown = [(f["chunk_index"], f["analyst"], f["category"], f["quote"]) for f in d["findings"]]
    assert [s[0] for s in shown] == sorted(s[0] for s in shown)  # chunk order
    assert sorted(shown) == sorted((f["chunk_index"], f["analyst"], f["category"], f["quote"]) for f in report)
    assert d["job"] == job_view.job_status(world.deps, job) and d["cost"]["line"] and d["cost"]["microUsd"] > 0
    assert d["canCancel"] is False and d["canRetry"] is False
    # AND its events, labelled as the Job API labels them
    status, events, _ = request(operator, "GET", f"/api/jobs/{job_id}/events")
    assert events == api.job_events(world.deps, job_id, 0, api.MAX_EVENTS_LIMIT) and events
    # AND its live stream sends the events and the detail, then ends (the job has ended)
    status, stream, ctype = request(operator, "GET", f"/api/jobs/{job_id}/live")
    assert ctype == "text/event-stream"
    kinds = [line.split(": ", 1)[1] for line in str(stream).splitlines() if line.startswith("event: ")]
    assert kinds[0] == "events" and "job" in kinds and kinds[-1] == "end"


def test_cancel_and_retry_from_the_page_use_the_cores(world, operator):
    # GIVEN a running job
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).intake()
    assert request(operator, "GET", f"/api/jobs/{job_id}")[1]["canCancel"] is True
    # WHEN it is cancelled from the page
    status, body, _ = request(operator, "POST", f"/api/jobs/{job_id}/cancel")
    # THEN it is cancelling, as `review cancel` leaves it, and its audit event names the page
    assert status == 202 and body["status"] == "cancelling", body
    assert [e.detail.get("by") for e in world.jobs.events(job_id) if e.type == "job.cancelling"] == ["ui"]
    job = InProcess(world).run(job_id)
    assert job.state is JobState.CANCELLED
    # AND approving a job that does not wait is refused with the core's message
    status, body, _ = request(operator, "POST", f"/api/jobs/{job_id}/approve")
    assert status == 409 and body["error"]["code"] == "api.conflict"  # type: ignore[index]
    # AND a retry puts it back to work
    assert request(operator, "GET", f"/api/jobs/{job_id}")[1]["canRetry"] is True
    status, body, _ = request(operator, "POST", f"/api/jobs/{job_id}/retry")
    assert status == 202 and body["ok"], body
    assert InProcess(world).run(job_id).state is JobState.COMPLETED


def test_acting_as_a_principal_shows_and_acts_on_its_own_jobs_only(world: FakeWorld):
    # GIVEN a job of alice's and one of bob's, submitted through the Job API
    mine = submit(world.deps, Caller(ALICE), SubmitRequest.inline(LONG_TEXT, priority=Priority.INTERACTIVE)).job_id
    theirs = submit(world.deps, Caller(BOB), SubmitRequest.inline(RISKY, priority=Priority.INTERACTIVE)).job_id
    InProcess(world).intake()
    with UiServer(world.deps, principal=ALICE) as ui:
        # WHEN the page acts as alice
        listed = request(ui, "GET", "/api/jobs")[1]
        # THEN it lists her job only, and bob's is not found (read, cancel) as the Job API answers it
        assert [j["jobId"] for j in listed["jobs"]] == [mine] and listed["mode"]["operator"] is False
        for method, path in (("GET", f"/api/jobs/{theirs}"), ("GET", f"/api/jobs/{theirs}/events"),
                             ("POST", f"/api/jobs/{theirs}/cancel"), ("GET", "/api/dlq")):
            status, body, _ = request(ui, method, path)
            assert (status, body["error"]["code"]) == (404, "api.not_found"), path  # type: ignore[index]
        assert world.jobs.get(theirs).state is JobState.RUNNING  # type: ignore[union-attr]
        # AND a submission from the page is hers (through the Job API's submit: bound to her)
        new = request(ui, "POST", "/api/submit", {"text": LONG_TEXT + "\n\nSchedule A."})[1]["jobId"]  # type: ignore[index]
        InProcess(world).intake()
        assert world.jobs.get(new).principal == ALICE  # type: ignore[union-attr]
        assert request(ui, "POST", f"/api/jobs/{mine}/cancel")[0] == 202


def test_only_the_page_itself_can_act(world, operator):
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).intake()
    # a cross-site form (no X-Review-UI header) cannot cancel
    status, body, _ = request(operator, "POST", f"/api/jobs/{job_id}/cancel", act=False)
    assert status == 403 and body["error"]["code"] == "api.invalid_request"  # type: ignore[index]
    # a rebound host name cannot read
    status, body, _ = request(operator, "GET", "/api/jobs", host="attacker.example:80")
    assert status == 403
    # an empty document is refused before anything is sent
    status, body, _ = request(operator, "POST", "/api/submit", {"text": "  \n"})
    assert status == 400 and body["error"]["code"] == "input.invalid"  # type: ignore[index]
    assert world.jobs.get(job_id).state is JobState.RUNNING  # type: ignore[union-attr]


def test_review_ui_as_refuses_a_name_that_is_not_a_local_principal_and_any_name_against_a_stack(world, tmp_path,
                                                                                                  monkeypatch):
    from click.testing import CliRunner

    from review_local.cli import Ctx, cli

    local = tmp_path / "local.json"
    local.write_text(json.dumps({"endpoint": "http://127.0.0.1:1", "region": "us-east-1", "outputs": {},
                                 "api_tokens": {"local-user": "t1", "local-other": "t2"}}))
    monkeypatch.setenv("REVIEW_LOCAL_JSON", str(local))
    r = CliRunner().invoke(cli, ["ui", "--as", "mallory"], obj=Ctx(None, None, deps=world.deps))
    assert r.exit_code == 2 and "not one of the local stack's principals (local-other, local-user)" in r.stderr
    r = CliRunner().invoke(cli, ["ui", "--as", "local-user"], obj=Ctx("ContractReview", "us-east-1", deps=world.deps))
    assert r.exit_code == 2 and "against --stack the page is an operator's view" in r.stderr


def test_the_dead_letters_are_listed_with_their_envelope_and_redriven_from_the_page():
    from contract_review.domain.ports import Queue

    from ..operate.test_ops import dead_letter_chunk
    from ..scenarios import intake

    # GIVEN a running job whose chunk 1 a worker dead-lettered
    world = small_chunk_world()
    with UiServer(world.deps) as ui:
        job_id, records = intake(world)
        _, env, chunk_text = dead_letter_chunk(world, records[1])
        # WHEN the page lists the dead letters
        status, listed, _ = request(ui, "GET", "/api/dlq")
        # THEN it is `review dlq list`'s entry: the job, the chunk, the envelope, never the chunk's text
        assert status == 200 and [(e["job_id"], e["chunk"]["chunk_index"], e["envelope"]["error_code"])
                                  for e in listed] == [(job_id, 1, env.error_code)]  # type: ignore[union-attr]
        assert chunk_text[:60] not in json.dumps(listed)
        # AND Redrive sends it back to work (`review dlq redrive ID`): the DLQ is empty, the chunk pending again
        status, body, _ = request(ui, "POST", f"/api/dlq/{listed[0]['message_id']}/redrive")  # type: ignore[index]
        assert status == 202 and body["ok"] is True, body  # type: ignore[index]
        assert world.queues.depth(Queue.ANALYSIS_DLQ) == 0
        assert [c.status.value for c in world.claims.for_job(job_id) if c.chunk_index == 1] == ["pending"]


def test_a_dead_letter_is_discarded_from_the_page_as_review_dlq_discard_does():
    from contract_review.domain.ports import Queue

    from ..operate.test_ops import dead_letter_chunk
    from ..scenarios import intake

    # GIVEN a running job whose chunk 1 a worker dead-lettered
    world = small_chunk_world()
    with UiServer(world.deps) as ui:
        job_id, records = intake(world)
        dead_letter_chunk(world, records[1])
        [letter] = request(ui, "GET", "/api/dlq")[1]  # type: ignore[misc]
        message_id = letter["message_id"]
        # WHEN a cross-site form tries to discard it  THEN nothing happens
        status, body, _ = request(ui, "POST", f"/api/dlq/{message_id}/discard", act=False)
        assert status == 403 and world.queues.depth(Queue.ANALYSIS_DLQ) == 1
        # WHEN the page's Discard is used
        status, body, _ = request(ui, "POST", f"/api/dlq/{message_id}/discard")
        # THEN the letter is gone (the DLQ alarm stops counting it), the chunk is left dead-lettered, and its job
        # records who discarded what, as `review dlq discard` (dead_letters.dlq_discard) leaves it
        assert status == 202 and body["ok"] is True and message_id in body["message"], body  # type: ignore[index]
        assert world.queues.depth(Queue.ANALYSIS_DLQ) == 0 and request(ui, "GET", "/api/dlq")[1] == []
        assert [c.status.value for c in world.claims.for_job(job_id) if c.chunk_index == 1] == ["dead_lettered"]
        [event] = [e for e in world.jobs.events(job_id) if e.type == "dlq.discarded"]
        assert event.detail["dlq_message_id"] == message_id and event.detail["by"] == "ui"
        assert event.detail["error_code"] == "model.request_invalid"
        # AND discarding it again is refused as redriving an unknown letter is: 404 api.not_found
        status, body, _ = request(ui, "POST", f"/api/dlq/{message_id}/discard")
        assert (status, body["error"]["code"]) == (404, "api.not_found")  # type: ignore[index]
    # AND a principal's page may not discard (the dead letters are an operator's view)
    with UiServer(world.deps, principal=ALICE) as ui:
        status, body, _ = request(ui, "POST", "/api/dlq/anything/discard")
        assert (status, body["error"]["code"]) == (404, "api.not_found")  # type: ignore[index]


def test_the_activity_chart_counts_the_model_calls_throttles_and_quota_tokens_of_the_chunks_as_they_settled():
    from contract_review.domain.model import quota_tokens

    from ..inprocess import Fault, FaultyModel, on
    from ..reliability.test_recoveries import client_error, raises

    # GIVEN a stack that paces to 60,000 tokens a minute, and a job two of whose calls were throttled
    world = small_chunk_world(model_tokens_per_minute=60_000)
    model = FaultyModel(faults=[Fault(on(analyst="liability"), raises(client_error("ThrottlingException", 429)), 2)])
    with UiServer(world.deps) as ui:
        job_id = request(ui, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
        job = InProcess(world, model).run(job_id)
        assert job.state is JobState.COMPLETED
        # WHEN the page reads the chart's data
        status, a, _ = request(ui, "GET", "/api/activity")
    # THEN its buckets add up to what the job's chunk records counted: every model call, both throttles, and the
    # tokens the calls counted against the quota (input + cache writes + 5 x output)
    chunks = world.claims.for_job(job_id)
    assert status == 200 and len(a["calls"]) == activity.ACTIVITY_BUCKETS  # type: ignore[index]
    assert sum(a["calls"]) == sum(c.n_calls for c in chunks) > 0  # type: ignore[index]
    assert sum(a["throttles"]) == 2  # type: ignore[index]
    tokens = sum(quota_tokens(job.model_id or world.settings.effective_model_id, c.input_tokens,
                              c.cache_write_tokens, c.output_tokens) for c in chunks)
    assert sum(a["quota_tokens"]) == tokens > 0  # type: ignore[index]
    # AND quota use is each bucket's tokens per minute over the quota the workers pace to
    assert a["tokens_per_minute"] == 60_000  # type: ignore[index]
    assert a["quota_use"] == [round(t * 60 / a["bucket_s"] / 60_000, 4) for t in a["quota_tokens"]]  # type: ignore[index]


def test_the_activity_chart_buckets_by_the_time_each_chunk_settled_within_the_last_hour():
    from contract_review.operate.activity import ChunkActivity, activity

    now = 10_000.0
    points = [ChunkActivity(at=now - 5_000, calls=99, throttles=9, quota_tokens=999),  # over an hour ago: left out
              ChunkActivity(at=now - 300, calls=3, throttles=1, quota_tokens=600),
              ChunkActivity(at=now - 150, calls=4, throttles=0, quota_tokens=400),
              ChunkActivity(at=now, calls=5, throttles=2, quota_tokens=500)]
    a = activity(points, now, tokens_per_minute=None, buckets=30)
    # the chart starts at the first chunk within the hour and splits the time to now in 30 buckets of 10 s
    assert (a.start, a.bucket_s) == (now - 300, 10)
    assert a.calls[0] == 3 and a.calls[15] == 4 and a.calls[29] == 5 and sum(a.calls) == 12
    assert a.throttles[0] == 1 and a.throttles[29] == 2 and sum(a.throttles) == 3
    assert sum(a.quota_tokens) == 1_500 and a.quota_use is None  # no quota known: no share of it
    # and with nothing settled, 30 empty buckets
    empty = activity([], now, 1_000.0)
    assert sum(empty.calls) == 0 and len(empty.calls) == 30 and empty.quota_use == [0.0] * 30


def test_the_page_shows_the_runtime_control_and_the_batch_lanes_turned_off_to_an_operator_only():
    from contract_review.domain.control_records import BatchLaneOff, ModelControl

    # GIVEN a paused model, a quota set, and a model whose batch lane a refused batch job turned off
    world = FakeWorld()
    off = BatchLaneOff(error_code="batch.refused", reason="ValidationException: not offered in batch", at=1.8e9,
                       by="collector")
    world.model_control.put(ModelControl(paused=True, tokens_per_minute=500_000, by="cli", at=1.8e9,
                                         batch_off={"model-a": off}))
    with UiServer(world.deps) as ui:
        status, a, _ = request(ui, "GET", "/api/activity")
    # THEN the operator's page has it beside the model activity, as `review quota show` says it
    assert status == 200 and a["control"] == {  # type: ignore[index]
        "paused": True, "tokensPerMinute": 500_000, "by": "cli", "at": job_view.api_time(1.8e9),
        "hold": "the model is paused by cli: `review quota resume` lets it go on",
        "batchOff": [{"model": "model-a", "errorCode": "batch.refused",
                      "reason": "ValidationException: not offered in batch", "at": job_view.api_time(1.8e9), "by": "collector"}]}
    # AND a principal's page does not (an operator's view)
    with UiServer(world.deps, principal=local_principal("owner")) as ui:
        status, a, _ = request(ui, "GET", "/api/activity")
    assert status == 200 and a["control"] is None  # type: ignore[index]
