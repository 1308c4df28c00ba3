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


# ------------------------------------------------------------------ an operator can act from the page
def _live_details(ui: UiServer, job_id: str) -> list[dict]:
    """The `job` events of an ended job's live stream (it ends by itself)."""
    _, stream, _ = request(ui, "GET", f"/api/jobs/{job_id}/live")
    lines = str(stream).splitlines()
    return [json.loads(lines[n + 1].split(": ", 1)[1]) for n, line in enumerate(lines) if line == "event: job"]


def test_the_page_shows_one_progress_number_the_one_review_status_and_get_jobs_show(world, operator):
    from contract_review.domain.messages import parse_results_body
    from contract_review.domain.ports import Queue
    from contract_review.pipeline.aggregator import handle_message

    # GIVEN a running job two of whose chunks have been analysed and counted, the others not yet
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    run = InProcess(world)
    run.intake()
    for s in world.queues.drain(Queue.ANALYSIS)[:2]:
        run.deliver(s)
    for s in world.queues.drain(Queue.RESULTS):
        handle_message(world.deps, parse_results_body(s.body))
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and 0 < job.n_settled < job.chunk_count
    # WHEN the page reads the job's detail and the job list
    d = request(operator, "GET", f"/api/jobs/{job_id}")[1]
    [row] = [j for j in request(operator, "GET", "/api/jobs")[1]["jobs"] if j["jobId"] == job_id]  # type: ignore[index]
    # THEN its progress line is `review status`'s, and it, the job list and GET /jobs/{id} count the same chunks
    view = job_view.job_view(world.deps, job_id)
    assert view is not None
    steps = job_view.job_status(world.deps, job)["progress"]
    assert d["progress"] == job_view.chunk_counts(view)  # type: ignore[index]
    assert d["progress"].startswith(f"{job.n_settled} of {job.chunk_count} chunks settled")  # type: ignore[index]
    assert (row["settled"], row["total"]) == (steps["currentStep"], steps["totalSteps"]) == (  # type: ignore[index]
        job.n_settled, job.chunk_count)
    # AND the grid carries no count of its own: the page shows the detail's progress line, and no settled count of
    # the grid's rows
    page = str(request(operator, "GET", "/")[1])
    assert "progress: ${d.progress}" in page and "settled`" not in page and "rows.filter" not in page
    # AND once it ran, the live stream's detail says what `review status` says
    InProcess(world).run(job_id)
    view = job_view.job_view(world.deps, job_id)
    assert view is not None and _live_details(operator, job_id)[-1]["progress"] == job_view.chunk_counts(view)


def test_the_job_pane_loads_with_its_buttons_off_and_enables_only_what_the_job_allows(world, operator):
    # GIVEN the page as served: every action button off until a job's detail says it applies, and a loading line
    page = str(request(operator, "GET", "/")[1])
    for button in ("cancel-btn", "retry-btn", "approve-btn", "reject-btn"):
        assert f'<button id="{button}" disabled>' in page, button
    assert 'id="job-loading"' in page
    assert 'for (const id of ["cancel-btn", "retry-btn", "approve-btn", "reject-btn"]) $(id).disabled = true' in page
    # AND the detail of a running job allows Cancel, not Retry; of a completed one, neither
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).intake()
    d = request(operator, "GET", f"/api/jobs/{job_id}")[1]
    assert (d["canCancel"], d["canRetry"]) == (True, False)  # type: ignore[index]
    InProcess(world).run(job_id)
    d = request(operator, "GET", f"/api/jobs/{job_id}")[1]
    assert (d["canCancel"], d["canRetry"]) == (False, False)  # type: ignore[index]


def test_findings_are_listed_by_risk_with_their_category_titles_and_the_report_is_one_click_away(world, operator):
    from contract_review.operate import actions

    # GIVEN a completed job with findings
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    job = InProcess(world).run(job_id)
    assert job.state is JobState.COMPLETED and job.n_findings > 1
    # WHEN the page reads its detail
    d = request(operator, "GET", f"/api/jobs/{job_id}")[1]
    found = d["findings"]  # type: ignore[index]
    # THEN its findings come highest risk first, each with its category's title, not its key
    scores = [f["score"] for f in found]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    assert all(f["title"] == actions.category_title(f["category"]) != f["category"] for f in found)
    assert "f.title" in str(request(operator, "GET", "/")[1])  # the page shows the title
    # AND its reports are linked, and served as written, read with the page's own credentials
    assert d["report"] == {"markdown": f"/api/jobs/{job_id}/report?format=md",  # type: ignore[index]
                           "json": f"/api/jobs/{job_id}/report?format=json"}
    status, md, ctype = request(operator, "GET", d["report"]["markdown"])  # type: ignore[index]
    assert status == 200 and ctype.startswith("text/plain") and md == world.artifacts.get_text(str(job.report_md_key))
    status, body, ctype = request(operator, "GET", d["report"]["json"])  # type: ignore[index]
    assert status == 200 and body == json.loads(world.artifacts.get_text(str(job.report_json_key)))
    # AND a job with no report yet answers why, as `review report` does; another principal's is not found
    other = request(operator, "POST", "/api/submit", {"text": RISKY})[1]["jobId"]  # type: ignore[index]
    InProcess(world).intake()
    status, body, _ = request(operator, "GET", f"/api/jobs/{other}/report")
    running = world.jobs.get(other)
    assert running is not None and (status, body["error"]["message"]) == (  # type: ignore[index]
        409, job_view.no_report(running))
    assert request(operator, "GET", f"/api/jobs/{other}")[1]["report"] is None  # type: ignore[index]
    with UiServer(world.deps, principal=ALICE) as ui:
        status, body, _ = request(ui, "GET", f"/api/jobs/{job_id}/report?format=md")
        assert (status, body["error"]["code"]) == (404, "api.not_found")  # type: ignore[index]


def test_a_failed_job_shows_its_remedy_as_review_status_prints_it(world, operator):
    from contract_review.domain.records import job_id_for
    from contract_review.pipeline.intake import handle_intake

    # GIVEN a job that failed on its input at intake
    handle_intake(world.deps, json.dumps({"schema_version": 9, "idempotency_key": "k-bad"}), "m-1")
    job_id = job_id_for("k-bad")
    # WHEN the page reads it
    d = request(operator, "GET", f"/api/jobs/{job_id}")[1]
    # THEN it shows what `review status` says a retry would do, with its id, and why it has no report
    view = job_view.job_view(world.deps, job_id)
    job = world.jobs.get(job_id)
    assert view is not None and job is not None and view.state is JobState.FAILED
    assert d["remedy"] == view.answers.retry_would.replace("JOB", job_id)  # type: ignore[index]
    assert "Fix the input" in d["remedy"] and d["report"] is None  # type: ignore[index]
    assert d["noReport"] == job_view.no_report(job)  # type: ignore[index]
    assert '"What to do: " + d.remedy' in str(request(operator, "GET", "/")[1])
    # AND a completed job has no remedy to show
    done = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).run(done)
    assert request(operator, "GET", f"/api/jobs/{done}")[1]["remedy"] is None  # type: ignore[index]


def test_a_dead_letter_row_has_its_id_time_and_reason_and_its_body_on_demand():
    from ..operate.test_ops import dead_letter_chunk
    from ..scenarios import intake

    # GIVEN a running job whose chunk 1 a worker dead-lettered
    world = small_chunk_world()
    with UiServer(world.deps) as ui:
        job_id, records = intake(world)
        _, env, chunk_text = dead_letter_chunk(world, records[1])
        # WHEN the page lists the dead letters
        [row] = request(ui, "GET", "/api/dlq")[1]  # type: ignore[misc]
        # THEN the row names the message, when it was dead-lettered and why (the envelope's code and message)
        [entry] = dead_letters_list(world)
        assert row["message_id"] == entry.message_id and row["at"] == job_view.api_time(entry.sent_at)
        assert row["reason"] == {"code": env.error_code, "message": env.message}
        page = str(request(ui, "GET", "/")[1])
        assert "i.reason.code" in page and "Show body" in page and "i.message_id)" in page
        # AND "show body" reads the message as it was sent (the chunk's text with it), the list never does
        status, body, _ = request(ui, "GET", f"/api/dlq/{row['message_id']}/body")
        assert status == 200 and body["messageId"] == row["message_id"]  # type: ignore[index]
        assert json.loads(body["body"])["text"] == chunk_text  # type: ignore[index]
        assert chunk_text[:60] not in json.dumps(row)
        status, body, _ = request(ui, "GET", "/api/dlq/no-such-letter/body")
        assert (status, body["error"]["code"]) == (404, "api.not_found")  # type: ignore[index]
    # AND a principal's page may not read a body (the dead letters are an operator's view)
    with UiServer(world.deps, principal=ALICE) as ui:
        status, body, _ = request(ui, "GET", f"/api/dlq/{row['message_id']}/body")
        assert (status, body["error"]["code"]) == (404, "api.not_found")  # type: ignore[index]


def dead_letters_list(world: FakeWorld) -> list:
    from contract_review.operate import dead_letters

    return dead_letters.dlq_list(world.deps)


def test_a_skipped_redrive_offers_the_page_s_own_redrive_anyway():
    from contract_review.domain.ports import Queue
    from contract_review.pipeline.intake import handle_intake

    # GIVEN an intake message dead-lettered for a permanent input error (a body that is not JSON)
    world = small_chunk_world()
    assert handle_intake(world.deps, "{not json", "m-bad").state == "rejected"
    with UiServer(world.deps) as ui:
        [letter] = request(ui, "GET", "/api/dlq")[1]  # type: ignore[misc]
        message_id = letter["message_id"]
        assert letter["reason"]["code"] == "input.invalid"
        # WHEN it is redriven from the page  THEN it is skipped, and the page may force it
        status, body, _ = request(ui, "POST", f"/api/dlq/{message_id}/redrive")
        assert status == 202 and body["ok"] is False and body["canForce"] is True, body  # type: ignore[index]
        assert world.queues.depth(Queue.INTAKE_DLQ) == 1
        assert "redrive(id, true)" in str(request(ui, "GET", "/")[1])  # the page's Redrive anyway
        # AND forcing it resends it, as `review dlq redrive ID --force` does
        status, body, _ = request(ui, "POST", f"/api/dlq/{message_id}/redrive?force=1")
        assert status == 202 and body["ok"] is True, body  # type: ignore[index]
        assert world.queues.depth(Queue.INTAKE_DLQ) == 0 and world.queues.depth(Queue.INTAKE) == 1


def test_a_large_job_s_grid_is_folded_into_counts_per_analyst_and_its_findings_come_first(world, operator):
    from contract_review.operate.actions import GRID_FOLD

    from ..scenarios import running_job

    # GIVEN a running job of more chunks than the page draws a row for
    job_id, records = running_job(world, GRID_FOLD + 1)
    job = world.jobs.get(job_id)
    assert job is not None
    # WHEN the page reads its detail
    g = request(operator, "GET", f"/api/jobs/{job_id}")[1]["grid"]  # type: ignore[index]
    # THEN the grid is folded: no rows, each analyst's chunks counted per state
    assert g["folded"] is True and g["rows"] == [] and g["chunks"] == GRID_FOLD + 1
    assert set(g["summary"]) == set(g["analysts"]) and len(g["analysts"]) == job.analyst_count
    assert all(sum(counts.values()) == GRID_FOLD + 1 for counts in g["summary"].values())
    assert g["byStatus"] == {"pending": GRID_FOLD + 1}
    # AND a small job's grid is not folded
    small = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).intake()
    g = request(operator, "GET", f"/api/jobs/{small}")[1]["grid"]  # type: ignore[index]
    assert g["folded"] is False and len(g["rows"]) > 1
    # AND the page lists the findings before the grid
    page = str(request(operator, "GET", "/")[1])
    assert page.index('id="findings"') < page.index('id="grid"') and "g.folded" in page


def test_the_activity_chart_has_axes_and_a_one_line_caption(world, operator):
    # GIVEN a job that ran
    job_id = request(operator, "POST", "/api/submit", {"text": LONG_TEXT})[1]["jobId"]  # type: ignore[index]
    InProcess(world).run(job_id)
    # WHEN the page reads the chart's data
    a = request(operator, "GET", "/api/activity")[1]
    # THEN its axes span its buckets in time and its tallest bar in count, and its caption is one short line
    assert a["axes"]["start"] == a["start"]  # type: ignore[index]
    assert a["axes"]["end"] == a["start"] + a["bucket_s"] * len(a["calls"])  # type: ignore[index]
    assert a["axes"]["countMax"] == max(a["calls"] + a["throttles"]) > 0  # type: ignore[index]
    assert a["axes"]["countLabel"] == f"per {a['bucket_s']:g} s"  # type: ignore[index]
    caption = a["caption"]  # type: ignore[index]
    assert caption.startswith(f"{sum(a['calls'])} model calls, 0 throttled in the last ")  # type: ignore[index]
    assert "\n" not in caption and len(caption) <= 100
    # AND the page draws both axes' labels from them, and the caption
    page = str(request(operator, "GET", "/")[1])
    for label in ("activity-ymax", "activity-ylabel", "activity-from", "activity-to"):
        assert f'id="{label}"' in page, label
    assert '$("activity-summary").textContent = a.caption' in page
