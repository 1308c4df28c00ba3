"""The full path on embedded AWS: intake queue -> chunk fan-out -> worker processes -> FIFO results -> report.

The cases share one stack as `review up` starts it (`shared_stack`): each submits documents no other case submits and
reads only its own jobs, or counts the stack's jobs before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from contract_review.config.profile import get_profile
from contract_review.domain.messages import MAX_INLINE_CHARS
from contract_review.domain.ports import Queue
from contract_review.domain.records import job_id_for
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.pipeline.admission import MAX_INLINE_BYTES
from contract_review.review.chunking import chunk_document, document_hash

from ..conftest import SAMPLES_DIR, cuad_texts
from .conftest import report_json, wait_for, wait_jobs

LOCAL = get_profile("local")


def _docs(n: int) -> list[tuple[str, str]]:
    docs = [d for d in cuad_texts(max_chars=40_000) if len(d[1]) >= 5_000][:n]
    if len(docs) < n:  # ../shared absent: use our own samples
        docs += [(p.name, p.read_text()) for p in sorted(SAMPLES_DIR.glob("*.txt"))][: n - len(docs)]
    return docs


def test_submitted_documents_become_complete_reports_with_verbatim_quotes(shared_stack):
    # GIVEN the stack deployed from the template, with worker processes
    deps = shared_stack.deps()
    docs = _docs(3)
    # WHEN documents are submitted through the intake queue
    jobs = {submission.submit(deps, None, SubmitRequest.inline(text, document_id=name)).job_id: text for name, text in docs}
    ended = wait_jobs(deps, list(jobs), timeout=90)
    # THEN every job completes with a JSON and a Markdown report in the bucket
    for job_id, text in jobs.items():
        job = ended[job_id]
        assert job.state == "completed", job.error
        assert job.chunk_count == len(chunk_document(text, LOCAL.review))
        report = report_json(deps, job)
        assert job.report_md_key is not None
        md = deps.artifacts.get_text(job.report_md_key)
        assert md.startswith(f"# Contract review {job_id}")
        # findings are assembled in chunk order and quote the document verbatim at their offsets
        indexes = [f["chunk_index"] for f in report["findings"]]
        assert indexes == sorted(indexes)
        assert report["findings"], "a real contract of this size yields findings"
        for f in report["findings"]:
            assert text[f["start"]:f["end"]] == f["quote"]
            assert 0 <= f["score"] <= 1 and f["rationale"]
        # coverage: every analyst ran on every chunk
        assert not report["coverage"]["mandatory_gaps"] and not report["coverage"]["missing_chunks"]
        assert len(report["coverage"]["matrix"]) == job.chunk_count
        assert report["reliability"]["model_calls"] > 0
    # and nothing is left in any queue or DLQ
    for queue in (Queue.ANALYSIS, Queue.RESULTS, Queue.ANALYSIS_DLQ, Queue.INTAKE_DLQ, Queue.RESULTS_DLQ):
        assert deps.queues.depth(queue) == 0


def test_same_document_twice_is_one_job(shared_stack):
    deps = shared_stack.deps()
    name, text = _docs(4)[-1]  # a document the other cases do not submit
    jobs_before = len(deps.jobs.all())
    first = submission.submit(deps, None, SubmitRequest.inline(text, document_id=name)).job_id
    wait_jobs(deps, [first])
    second = submission.submit(deps, None, SubmitRequest.inline(text, document_id=name)).job_id  # same idempotency key (hash of the document)
    assert second == first == job_id_for(document_hash(text))
    wait_for(lambda: deps.queues.depth(Queue.INTAKE) == 0, 20, what="intake drained")
    events = [e.type for e in deps.jobs.events(first)]
    assert events.count("job.queued") == 1 and events.count("job.completed") == 1
    assert len(deps.jobs.all()) == jobs_before + 1


def test_raw_sqs_message_and_cli_report(shared_stack, tmp_path):
    """The queue is the interface: a hand-written message (as `aws sqs send-message` sends it) works,
    and the `review` CLI finds the local stack through .review/local.json."""
    stack = shared_stack
    local_json = tmp_path / "local.json"
    stack.write_local_json(local_json)
    info = json.loads(local_json.read_text())
    assert set(info) >= {"endpoint", "region", "outputs"} and "IntakeQueueUrl" in info["outputs"]
    text = (SAMPLES_DIR / "mutual-nda.txt").read_text() if (SAMPLES_DIR / "mutual-nda.txt").exists() else _docs(1)[0][1]
    body = json.dumps({"schema_version": 1, "document": {"text": text}, "document_id": "nda-by-hand",
                       "idempotency_key": "by-hand-1", "metadata": {"team": "legal"}})
    sqs = stack.aws.client("sqs")
    sqs.send_message(QueueUrl=info["outputs"]["IntakeQueueUrl"], MessageBody=body)
    job_id = job_id_for("by-hand-1")
    deps = stack.deps()
    assert wait_jobs(deps, [job_id])[job_id].state == "completed"
    env = {**os.environ, "REVIEW_LOCAL_JSON": str(local_json)}
    review = [sys.executable, "-m", "review_local.cli"]
    out = subprocess.run(review + ["report", job_id], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"# Contract review {job_id}" in out.stdout
    st = subprocess.run(review + ["status", job_id, "--json"], env=env, capture_output=True, text=True, timeout=60)
    view = json.loads(st.stdout)
    assert view["state"] == "completed" and view["chunks"]["settled"] == view["chunks"]["total"]
    assert view["recent_events"][-1]["type"] == "job.completed"
    assert view["answers"]["retry_would"] == "nothing: the job is complete"
    lst = subprocess.run(review + ["jobs", "--json"], env=env, capture_output=True, text=True, timeout=60)
    listed = [j["job_id"] for j in json.loads(lst.stdout)]
    assert job_id in listed and sorted(listed) == sorted(j.job_id for j in deps.jobs.all())  # every job, once
    # a deployed stack is found by name through CloudFormation's outputs (here: moto's CloudFormation)
    remote = {**os.environ, "REVIEW_LOCAL_JSON": str(tmp_path / "absent.json"), "AWS_ENDPOINT_URL": info["endpoint"],
              "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    by_name = subprocess.run(review + ["--stack", "ContractReview", "--region", "us-east-1", "status", job_id, "--json"],
                             env=remote, capture_output=True, text=True, timeout=60)
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["state"] == "completed"


# The sample's letters in their fullwidth forms (3 UTF-8 bytes each, as in a contract written in CJK script)
FULLWIDTH = {c: c + 0xFEE0 for c in range(0x21, 0x7F) if chr(c).isalpha()}


def test_large_document_goes_through_s3_claim_check(shared_stack):
    deps = shared_stack.deps()
    # a contract over the inline limit in UTF-8 bytes (what a message holds), at 40 % of it in characters: the claim
    # check is the point, not the chunk count (about 20 chunks where English text over the limit is 55)
    source = (SAMPLES_DIR / "master-services-agreement.txt").read_text().translate(FULLWIDTH)
    text = ""
    for paragraph in source.split("\n\n"):
        if len(text.encode("utf-8")) > MAX_INLINE_BYTES:
            break
        text += paragraph + "\n\n"
    assert len(text) < MAX_INLINE_CHARS and len(text.encode("utf-8")) > MAX_INLINE_BYTES  # the CLI must claim-check
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="big")).job_id
    job = wait_jobs(deps, [job_id], timeout=300)[job_id]  # a wait, not a bound
    assert job.state == "completed"
    assert job.chunk_count == len(chunk_document(text, LOCAL.review))
    assert deps.artifacts.get_text(f"uploads/{job_id}.txt") == text
    assert job.document_chars == len(text)
