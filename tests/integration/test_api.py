"""The Job API over HTTP against the local stack with its worker processes: the loopback server of
`review up` (the same resolver as the Lambda), real queues and tables.

- events resumed with `Last-Event-ID` (server-sent events) and with `after=SEQ` lose nothing, repeat nothing;
- another principal gets 404 on every route;
- a batch with a bad item: the others complete, the bad one is reported;
- docs/api.md's curl session (submit, watch events, cancel) works as written.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from contract_review.domain.principals import uploads_prefix
from contract_review.domain.records import JobState
from contract_review.review.chunking import document_hash
from review_local.api_server import local_principal
from review_local.stack import LocalStack

LOCAL_USER = local_principal("local-user")

from .conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def http(shared_stack: LocalStack, method: str, path: str, body: object = None, *, token: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    assert shared_stack.api is not None
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(shared_stack.api.url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token or shared_stack.api.token}", "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"null")


def sse(shared_stack: LocalStack, job_id: str, last_event_id: int | None = None, stop_after: int | None = None,
        timeout: float = 120) -> tuple[list[dict[str, Any]], bool]:
    """Read the job's event stream: (events, whether the `end` event came). Disconnects after `stop_after`."""
    assert shared_stack.api is not None
    headers = {"Authorization": f"Bearer {shared_stack.api.token}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    req = urllib.request.Request(f"{shared_stack.api.url}/jobs/{job_id}/events", headers=headers)
    events: list[dict[str, Any]] = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        fields: dict[str, str] = {}
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if fields.get("event") == "end":
                return events, True
            if "data" in fields:
                event = json.loads(fields["data"])
                assert int(fields["id"]) == event["seq"] and fields["event"] == event["type"]
                events.append(event)
                if stop_after is not None and len(events) >= stop_after:
                    return events, False  # the client goes away mid-stream
            fields = {}
    return events, False


def test_events_resumed_with_last_event_id_and_after_lose_nothing_and_repeat_nothing(shared_stack: LocalStack):
    text = (SAMPLES / "supply-agreement.txt").read_text()
    status, _, accepted = http(shared_stack, "POST", "/jobs", {"document": {"text": text}, "document_id": "supply-sse"})
    assert status == 202
    job_id = accepted["jobId"]
    # WHEN a client reads the stream, goes away after 3 events, and comes back with Last-Event-ID, twice
    first, ended = sse(shared_stack, job_id, stop_after=3)
    assert not ended and len(first) == 3
    second, ended = sse(shared_stack, job_id, last_event_id=first[-1]["seq"], stop_after=4)
    rest, ended = sse(shared_stack, job_id, last_event_id=(second or first)[-1]["seq"])
    assert ended
    streamed = first + second + rest
    # AND another client pages through the JSON API with after=SEQ
    paged: list[dict[str, Any]] = []
    while True:
        status, _, page = http(shared_stack, "GET", f"/jobs/{job_id}/events?after={paged[-1]['seq'] if paged else 0}&limit=4")
        assert status == 200
        if not page:
            break
        paged += page
    # THEN both saw every event of the job once, in order: 1, 2, ... with no gap
    seqs = [e["seq"] for e in streamed]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert [e["seq"] for e in paged] == seqs and [e["type"] for e in paged] == [e["type"] for e in streamed]
    status, _, job = http(shared_stack, "GET", f"/jobs/{job_id}")
    assert job["status"] == "completed" and job["result"]["reportJson"].endswith(f"reports/{job_id}/report.json")
    assert streamed[-1]["type"] == "job.completed"


ROUTES = [("GET", "/jobs/{job}", None), ("GET", "/jobs/{job}/events", None), ("GET", "/jobs/{job}/report", None),
          ("POST", "/jobs/{job}/cancel", None),
          ("POST", "/jobs/{job}/approval", {"decision": "reject"}), ("POST", "/jobs/{job}/retry", None),
          ("GET", "/batches/{batch}", None)]


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_another_principal_gets_404_on_every_route(shared_stack: LocalStack, method: str, path: str, body: object):
    assert shared_stack.api is not None
    status, _, batch = http(shared_stack, "POST", "/batches", [{"custom_id": "p1", "document": {"text": "1. Term. "
                                                                                              "Ten years."}}])
    assert status == 202
    job_id, batch_id = batch["items"][0]["jobId"], batch["batchId"]
    wait_for(lambda: shared_stack.deps().jobs.get(job_id), 20, what="intake to record the job")
    url = path.format(job=job_id, batch=batch_id)
    status, _, answer = http(shared_stack, method, url, body, token=shared_stack.api.other_token)
    assert status == 404 and answer["error"]["code"] == "api.not_found"
    job = shared_stack.deps().jobs.get(job_id)
    assert job is not None and job.principal == "arn:aws:iam::123456789012:user/local-user"
    assert job.state not in (JobState.CANCELLING, JobState.CANCELLED)
    assert http(shared_stack, "GET", f"/jobs/{job_id}")[0] == 200  # its owner still reads it
    assert http(shared_stack, "GET", f"/jobs/{job_id}", token="not-a-token")[0] == 401


def test_a_batch_with_one_bad_item_runs_the_others_and_reports_the_bad_one(shared_stack: LocalStack):
    lines = [{"custom_id": "nda", "document": {"text": (SAMPLES / "mutual-nda.txt").read_text()}},
             {"custom_id": "missing", "document": {"s3_uri": f"s3://{shared_stack.outputs['ArtifactBucketName']}/{uploads_prefix(LOCAL_USER)}no.txt"}},
             {"custom_id": "saas", "document": {"text": (SAMPLES / "saas-subscription-agreement.txt").read_text()}}]
    body = "\n".join(json.dumps(line) for line in lines).encode()
    status, headers, batch = http(shared_stack, "POST", "/batches", body, headers={"Content-Type": "application/x-ndjson"})
    assert status == 202 and headers["Location"] == batch["statusUrl"]
    assert (batch["accepted"], batch["rejected"]) == (2, 1)
    assert batch["items"][1]["status"] == "rejected" and batch["items"][1]["error"]["code"] == "input.document_missing"

    def ended() -> dict[str, Any] | None:
        view = http(shared_stack, "GET", f"/batches/{batch['batchId']}")[2]
        return view if view["ended"] else None

    view = wait_for(ended, 120, 0.5, "the batch's jobs to end")
    assert view["counts"] == {"completed": 2, "rejected": 1}
    assert [i["status"] for i in view["items"]] == ["completed", "rejected", "completed"]


def _readme_block(marker: str) -> str:
    """docs/api.md's one ```bash block that has `marker` (the curl session: its event stream; the uploads)."""
    readme = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"^```bash\n(.*?)^```", readme, flags=re.S | re.M) if marker in b]
    assert len(blocks) == 1, f"docs/api.md: one ```bash block with {marker}"
    return blocks[0]


def _readme_session() -> str:
    return _readme_block("text/event-stream")


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_readme_curl_session_submits_watches_and_cancels(shared_stack: LocalStack, tmp_path: Path):
    assert shared_stack.api is not None
    # GIVEN `review up`'s .review/local.json in a working directory with the samples
    shared_stack.write_local_json(tmp_path / ".review" / "local.json")
    (tmp_path / "samples").symlink_to(SAMPLES)
    # WHEN the README's session runs as written
    proc = subprocess.run(["bash", "-c", _readme_session()], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    out = proc.stdout
    # THEN it submitted, showed events, cancelled, and streamed until the job was cancelled
    assert '"status": "cancelling"' in out, (out, proc.stderr)
    assert "event: job.cancelled" in out and "event: end" in out, (out, proc.stderr)
    job_id = re.search(r"job-[0-9a-f]{20}", out)
    assert job_id is not None
    job = shared_stack.deps().jobs.get(job_id.group(0))
    assert job is not None and job.state is JobState.CANCELLED


def presigned_post(upload: dict[str, Any], data: bytes) -> int:
    """Upload `data` with a presigned POST as a browser form would (multipart/form-data, the file last)."""
    boundary = "----review-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in upload["fields"].items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="contract.txt"\r\n'
                 f"Content-Type: text/plain\r\n\r\n".encode() + data + f"\r\n--{boundary}--\r\n".encode())
    req = urllib.request.Request(upload["url"], data=b"".join(parts), method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_two_principals_of_review_up_are_isolated_as_a_user_would_try_it(shared_stack: LocalStack, tmp_path: Path):
    # GIVEN the two principals' tokens, by name, from .review/local.json as `review up` writes it
    local = tmp_path / "local.json"
    shared_stack.write_local_json(local)
    tokens = json.loads(local.read_text())["api_tokens"]
    assert set(tokens) == {"local-user", "local-other"} and len(set(tokens.values())) == 2
    user, other = tokens["local-user"], tokens["local-other"]
    # WHEN local-user uploads a contract through POST /uploads (a real presigned POST to the embedded S3)
    status, _, up = http(shared_stack, "POST", "/uploads", {"name": "isolation"}, token=user)
    assert status == 201, up
    assert presigned_post(up["upload"], b"1. Term. This agreement lasts two years.\n") in (200, 204)
    # THEN local-other cannot submit it (the same code intake would give), and nothing is queued for it
    status, _, refused = http(shared_stack, "POST", "/jobs", {"document": {"s3_uri": up["s3Uri"]}}, token=other)
    assert status == 422 and refused["error"]["code"] == "input.document_forbidden", refused
    # AND local-user can; local-other can neither read, cancel, approve nor retry that job
    status, _, accepted = http(shared_stack, "POST", "/jobs", {"document": {"s3_uri": up["s3Uri"]}}, token=user)
    assert status == 202, accepted
    job_id = accepted["jobId"]
    wait_for(lambda: shared_stack.deps().jobs.get(job_id), 20, what="intake to record the job")
    for method, path, body in ROUTES[:5]:
        status, _, answer = http(shared_stack, method, path.format(job=job_id), body, token=other)
        assert status == 404 and answer["error"]["code"] == "api.not_found", (method, path, answer)
    job = shared_stack.deps().jobs.get(job_id)
    assert job is not None and job.principal.endswith(":user/local-user") and job.document_chars > 0
    assert job.state not in (JobState.CANCELLING, JobState.CANCELLED, JobState.FAILED)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_readme_upload_session_uploads_and_only_its_owner_submits_it_and_reads_its_report(
        shared_stack: LocalStack, tmp_path: Path):
    # GIVEN `review up`'s .review/local.json in a working directory with the samples
    shared_stack.write_local_json(tmp_path / ".review" / "local.json")
    (tmp_path / "samples").symlink_to(SAMPLES)
    # WHEN the README's upload session runs as written
    proc = subprocess.run(["bash", "-c", _readme_block('"$API/uploads"')], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    out = proc.stdout
    # THEN the presigned POST was taken, local-other was refused the upload, and local-user's job completed
    assert re.search(r"upload: HTTP 20[04]", out), (out, proc.stderr)
    assert '"code":"input.document_forbidden"' in out, (out, proc.stderr)
    job_id = re.search(r"# Contract review (job-[0-9a-f]{20})", out)  # the report's first line, read by its owner
    assert job_id is not None, (out, proc.stderr)
    job = shared_stack.deps().jobs.get(job_id.group(1))
    assert job is not None and job.state is JobState.COMPLETED and job.report_md_key
    assert out.count("# Contract review") == 1 and "other: HTTP 404" in out, (out, proc.stderr)
    assert job.principal is not None and job.principal.endswith(":user/local-user")
    assert job.document_sha256 == document_hash((SAMPLES / "master-services-agreement.txt").read_text(encoding="utf-8"))


def test_a_report_link_is_a_presigned_get_that_reads_the_report_without_the_api_token(shared_stack: LocalStack):
    status, _, accepted = http(shared_stack, "POST", "/jobs", {"document": {"text": "1. Term. This agreement runs for one "
                                                                               "year from the effective date."}})
    assert status == 202
    job_id = accepted["jobId"]
    wait_for(lambda: (j := shared_stack.deps().jobs.get(job_id)) is not None and j.state is JobState.COMPLETED, 120,
             what="the job to complete")
    # the API answers a 302 (not followed here) whose Location reads the report from S3 with no API token
    opener = urllib.request.build_opener(_NoRedirect)
    req = urllib.request.Request(f"{shared_stack.api.url}/jobs/{job_id}/report?format=md",  # type: ignore[union-attr]  # up
                                 headers={"Authorization": f"Bearer {shared_stack.api.token}"})  # type: ignore[union-attr]  # up
    with pytest.raises(urllib.error.HTTPError) as redirect:
        opener.open(req, timeout=30)
    assert redirect.value.code == 302
    location = redirect.value.headers["Location"]
    with urllib.request.urlopen(location, timeout=30) as r:
        body = r.read().decode()
    job = shared_stack.deps().jobs.get(job_id)
    assert job is not None and job.report_md_key and body == shared_stack.deps().artifacts.get_text(job.report_md_key)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 302 is the answer under test


def test_a_10_mb_upload_never_becomes_a_job_that_reads_it_all(shared_stack: LocalStack):
    # GIVEN a presigned upload (S3 on AWS refuses a body over the signed content-length-range; moto may not)
    status, _, up = http(shared_stack, "POST", "/uploads", {"name": "huge"})
    assert status == 201 and up["maxBytes"] == 5_000_000
    uploaded = presigned_post(up["upload"], b"1. Term. " + b"x" * (10 * 1024 * 1024))
    # WHEN it is submitted anyway THEN either S3 refused the upload (nothing to read), or the API reads at most
    # maxBytes + 1 of it and answers 422 input.too_large: no job, nothing queued
    status, _, answer = http(shared_stack, "POST", "/jobs", {"document": {"s3_uri": up["s3Uri"]}})
    expected = "input.document_missing" if uploaded >= 400 else "input.too_large"
    assert status == 422 and answer["error"]["code"] == expected, (uploaded, answer)
