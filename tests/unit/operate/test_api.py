"""The Job API (contract_review/operate/api.py) against the in-memory fakes: HTTP API v2 events built exactly as the
local server builds them (`review_local.api_server.http_api_event`), answered by the very resolver the
Lambda runs. GIVEN / WHEN / THEN."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from contract_review.domain import cost
from contract_review.domain.errors import ReviewError
from contract_review.domain.messages import MAX_DOCUMENT_BYTES, IntakeMessage
from contract_review.domain.ports import Queue
from contract_review.domain.principals import owner, uploads_prefix
from contract_review.domain.records import JobState, job_id_for
from contract_review.operate import api, api_batches, api_requests, job_view, submission
from contract_review.operate.submission import SubmitRequest
from contract_review.pipeline import admission
from contract_review.pipeline.intake import handle_intake
from contract_review.review.chunking import document_hash
from review_local.api_server import http_api_event, local_principal

from ...texts import LONG_TEXT, TEXT
from ..fakes import SETTINGS, FakeWorld
from ..inprocess import InProcess
from ..scenarios import small_chunk_world

ALICE = local_principal("alice")
BOB = local_principal("bob")


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: object

    @property
    def json(self) -> dict[str, object]:
        assert isinstance(self.body, dict), self.body
        return self.body

    @property
    def code(self) -> object:
        error = self.json.get("error")
        return error.get("code") if isinstance(error, dict) else None


def call(world: FakeWorld, method: str, path: str, body: object = None, *, who: str | None = ALICE,
         headers: Mapping[str, str] | None = None, query: str = "") -> Answer:
    raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
    event = http_api_event(method, path, query, {"Content-Type": "application/json", **(headers or {})}, raw, who,
                           "api.test", "127.0.0.1")
    answer = api.resolve(event, SimpleNamespace(function_name="test"), world.deps)
    assert isinstance(answer, Mapping)
    text = str(answer.get("body") or "")
    return Answer(int(answer["statusCode"]), dict(answer.get("headers") or {}), json.loads(text) if text else None)


def submit(world: FakeWorld, text: str = TEXT, *, who: str = ALICE, key: str | None = None, **fields: object) -> Answer:
    return call(world, "POST", "/jobs", {"document": {"text": text}, **fields}, who=who,
                headers={"Idempotency-Key": key} if key else None)


def intake_messages(world: FakeWorld) -> list[dict[str, object]]:
    return [json.loads(s.body) for s in world.queues.sent[Queue.INTAKE]]


# ------------------------------------------------------------------------------ POST /jobs
def test_the_same_post_twice_with_one_idempotency_key_is_one_job():
    world = FakeWorld()
    # GIVEN a document submitted with an Idempotency-Key
    first = submit(world, key="order-17")
    assert first.status == 202 and first.json["status"] == "queued"
    job_id = first.json["jobId"]
    assert first.json["statusUrl"] == f"http://api.test/jobs/{job_id}" == first.headers["Location"]
    assert first.json["eventsUrl"].endswith(f"/jobs/{job_id}/events")
    assert first.json["cancelUrl"].endswith(f"/jobs/{job_id}/cancel")
    # WHEN the same request comes again (a client retry), before and after intake took the first in
    again = submit(world, key="order-17")
    InProcess(world).intake()
    third = submit(world, key="order-17")
    # THEN it is one job: the same id each time, the replays say so, and intake got one job
    assert again.status == third.status == 202
    assert again.json["jobId"] == third.json["jobId"] == job_id
    assert again.headers.get("Idempotent-Replayed") == third.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert [j.job_id for j in world.jobs.all()] == [job_id]  # (the replay before intake sent it again: harmless)
    assert third.json["status"] == "running"
    assert len(world.queues.sent[Queue.ANALYSIS]) >= 1  # the job runs, once


def test_an_idempotency_key_reused_for_another_document_is_a_conflict():
    world = FakeWorld()
    submit(world, key="k1")
    # WHEN the key comes with another document (before intake, and after)
    before = submit(world, text=TEXT + "\nAnnex A.", key="k1")
    InProcess(world).intake()
    after = submit(world, text=TEXT + "\nAnnex A.", key="k1")
    # THEN 409 input.key_conflict, and nothing more was sent
    assert before.status == after.status == 409
    assert before.code == after.code == "input.key_conflict"
    assert len(world.jobs.all()) == 1


def test_a_corrected_document_under_the_key_of_a_job_that_failed_on_its_input_replaces_it_as_intake_does():
    """The API refuses what intake and the CLI refuse, and accepts what they accept: a job that failed on its
    input (`input.*`) is replaced by a corrected document under its key (the error's own advice)."""
    world = FakeWorld()
    job_id = submit(world, key="k2").json["jobId"]
    InProcess(world).intake()
    world.jobs.items[job_id] = world.jobs.items[job_id].model_copy(
        update={"state": JobState.FAILED, "error_code": "input.invalid"})
    corrected = submit(world, text=TEXT + "\nAnnex A.", key="k2")
    assert corrected.status == 202 and corrected.json["jobId"] == job_id
    InProcess(world).intake()
    job = world.jobs.get(job_id)
    assert job.state is JobState.RUNNING and job.document_sha256 == document_hash(TEXT + "\nAnnex A.")


def test_without_a_key_the_same_document_is_one_job_per_principal():
    world = FakeWorld()
    a1, a2, b = submit(world), submit(world), submit(world, who=BOB)
    assert a1.json["jobId"] == a2.json["jobId"] != b.json["jobId"]


def test_the_intake_message_is_bound_to_the_principal_and_valid():
    world = FakeWorld()
    answer = submit(world, document_id="nda-1", metadata={"matter": "M-1"})
    [message] = intake_messages(world)
    assert message["principal"] == ALICE and message["document_id"] == "nda-1"
    assert message["metadata"] == {"matter": "M-1"} and message["document"] == {"text": TEXT}
    InProcess(world).intake()
    job = world.jobs.get(str(answer.json["jobId"]))
    assert job is not None and job.principal == ALICE


def test_a_large_text_goes_by_claim_check_as_review_submit_sends_it():
    world = FakeWorld()
    big = (LONG_TEXT + "\n") * (250_000 // len(LONG_TEXT) + 1)
    answer = submit(world, text=big)
    assert answer.status == 202
    [message] = intake_messages(world)
    uri = str(message["document"]["s3_uri"])  # type: ignore[index]  # a JSON object
    # in Alice's own uploads: no other principal's job may read it
    assert uri == f"s3://{world.artifacts.bucket}/{uploads_prefix(ALICE)}{answer.json['jobId']}.txt"
    assert world.artifacts.get_text(uri.split("/", 3)[3]) == big


@pytest.mark.parametrize("body,status,code", [
    (b"{not json", 400, "input.invalid"),
    ({"document": {"text": TEXT}, "surprise": 1}, 400, "input.invalid"),
    ({"document": {"text": TEXT}, "metadata": {"k": {"nested": True}}}, 400, "input.invalid"),
    (b'{"document": {"text": "\\ud800"}}', 400, "input.invalid"),
    ({"document": {"text": "   "}}, 422, "input.empty_document"),
    ({"document": {"s3_uri": "s3://elsewhere/uploads/x.txt"}}, 422, "input.document_forbidden"),
    ({"document": {"s3_uri": f"s3://artifacts/{uploads_prefix(ALICE)}missing.txt"}}, 422, "input.document_missing"),
    ({"document": {"s3_uri": "s3://artifacts/uploads/queue-senders.txt"}}, 422, "input.document_forbidden"),
])
def test_a_bad_request_is_answered_with_its_code_and_sends_nothing(body: object, status: int, code: str):
    world = FakeWorld()
    answer = call(world, "POST", "/jobs", body)
    assert answer.status == status and answer.code == code, answer.body
    assert answer.json["error"]["retryable"] is False  # type: ignore[index]  # a JSON object
    assert not intake_messages(world) and not world.jobs.all()


@pytest.mark.parametrize("fields,sentences", [
    ({"metadata": {"a": 1e200}}, "metadata.a: a number must be 0 or of a magnitude from 1e-130 to under 1e+126 "
                                 "(what DynamoDB holds)."),
    ({"metadata": {"a": {"nested": True}}}, "metadata.a must be a string, true or false, a whole number, a number or "
                                            "a list, not an object."),
    ({"metadata": {"tags": ["a", 3]}}, "metadata.tags[1] must be a string, not a number."),
    ({"budget_usd": -1, "surprise": 1}, "budget_usd must be greater than 0, not -1. surprise is not a field here: leave "
                                        "it out (a misspelling?)."),
    ({"document": {"txt": TEXT}}, "document.text is required. document.txt is not a field here: leave it out "
                                  "(a misspelling?)."),
], ids=["number-out-of-range", "nested-object", "list-with-a-number", "two-mistakes", "misspelt-text"])
def test_a_schema_error_is_one_sentence_per_mistake_in_the_bodys_terms_and_the_queue_says_the_same(
        fields: dict[str, object], sentences: str):
    # GIVEN a body with one or two mistakes
    world = FakeWorld()
    body = {"document": {"text": TEXT}, **fields}
    # WHEN it is posted to the Job API, sent as a batch's item, and sent to the intake queue as a message
    answer = call(world, "POST", "/jobs", body)
    batch = call(world, "POST", "/batches", [{"custom_id": "c", **body}])
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, **body}), "m-1")
    # THEN the same code and the same sentences, naming the caller's fields, none of pydantic's internals
    assert (answer.status, answer.code) == (400, "input.invalid")
    message = answer.json["error"]["message"]  # type: ignore[index]  # a JSON object
    assert message == sentences
    [item] = batch.json["items"]  # type: ignore[misc]  # a JSON list
    assert item["error"] == {"code": "input.invalid", "message": f"item 1: {sentences}", "retryable": False}
    assert result.error is not None and (result.error.error_code, result.error.message) == ("input.invalid", sentences)
    for internal in ("function-after", "_dynamo_number", "constrained-str", "TextDocument", "Field required",
                     "Input should"):
        assert internal not in message


def upload(world: FakeWorld, text: str, *, who: str = ALICE) -> str:
    """POST /uploads, then the upload itself as S3 would take it; the s3_uri to submit."""
    answer = call(world, "POST", "/uploads", {"name": "msa"}, who=who)
    assert answer.status == 201, answer.body
    uri = str(answer.json["s3Uri"])
    world.artifacts.put_text(uri.split("/", 3)[3], text)
    return uri


def test_an_upload_is_presigned_into_the_callers_own_prefix_and_bounded_in_size():
    world = FakeWorld()
    answer = call(world, "POST", "/uploads", {"name": "msa"})
    assert answer.status == 201
    key = str(answer.json["s3Uri"]).split("/", 3)[3]
    assert key.startswith(uploads_prefix(ALICE)) and key.endswith("-msa.txt")
    assert world.artifacts.presigned == [(key, MAX_DOCUMENT_BYTES, api.UPLOAD_EXPIRY_S)]
    assert answer.json["maxBytes"] == MAX_DOCUMENT_BYTES and answer.json["upload"]["method"] == "POST"  # type: ignore[index]
    # two uploads never share a key, and Bob's go elsewhere
    again = str(call(world, "POST", "/uploads").json["s3Uri"])
    bobs = str(call(world, "POST", "/uploads", who=BOB).json["s3Uri"])
    assert again != answer.json["s3Uri"] and uploads_prefix(BOB) in bobs and uploads_prefix(ALICE) not in bobs


@pytest.mark.parametrize("body", [{"name": "../x"}, {"surprise": 1}, b"{no"])
def test_a_bad_upload_request_is_a_400_and_presigns_nothing(body: object):
    world = FakeWorld()
    answer = call(world, "POST", "/uploads", body)
    assert answer.status == 400 and answer.code == "api.invalid_request", answer.body
    assert not world.artifacts.presigned


def test_an_uploaded_document_is_read_hashed_and_passed_on():
    world = FakeWorld()
    uri = upload(world, LONG_TEXT)
    answer = call(world, "POST", "/jobs", {"document": {"s3_uri": uri}})
    assert answer.status == 202
    assert intake_messages(world)[0]["document"] == {"s3_uri": uri}
    run = InProcess(world)
    job = run.run(str(answer.json["jobId"]))
    assert job.state is JobState.COMPLETED


def test_another_principals_upload_is_forbidden_through_the_api_and_through_a_forged_queue_message():
    world = FakeWorld()
    alices = upload(world, LONG_TEXT)
    # WHEN Bob names Alice's upload THEN 422 input.document_forbidden, nothing is read or sent
    answer = call(world, "POST", "/jobs", {"document": {"s3_uri": alices}}, who=BOB)
    assert answer.status == 422 and answer.code == "input.document_forbidden", answer.body
    assert not intake_messages(world) and not world.jobs.all()
    # AND a sender to the intake queue that names it (without a principal) gets a failed job with the same code
    run = InProcess(world)
    run.send({"s3_uri": alices}, key="steal")
    run.intake()
    [job] = world.jobs.all()
    assert job.state is JobState.FAILED and job.error_code == "input.document_forbidden" and job.model_micro_usd == 0
    # AND one that also forges Bob's... or Alice's principal is refused before anything is read: no job, the DLQ
    forged = json.dumps({"schema_version": 1, "document": {"s3_uri": alices}, "idempotency_key": "steal-2",
                         "principal": ALICE})
    result = handle_intake(world.deps, forged, "m-forged")
    assert result.job_id is None and result.error is not None and result.error.error_code == "input.invalid"
    assert len(world.jobs.all()) == 1 and len(world.queues.sent[Queue.INTAKE_DLQ]) == 1


def test_a_queue_message_with_a_principal_is_taken_only_as_the_api_sent_it():
    world = FakeWorld()
    # GIVEN Alice's job through the API: its intake message carries her principal, vouched by its submission
    answer = submit(world, key="k1")
    [message] = intake_messages(world)
    # WHEN the same message is replayed with another document, or with Bob as its principal
    for forged in ({**message, "document": {"text": LONG_TEXT}}, {**message, "principal": BOB}):
        result = handle_intake(world.deps, json.dumps(forged), "m-forged")
        # THEN intake refuses it, records no job, and explains it in the intake DLQ
        assert result.job_id is None and result.error is not None and result.error.error_code == "input.invalid"
    assert not world.jobs.all() and len(world.queues.sent[Queue.INTAKE_DLQ]) == 2
    # AND the API's own message is taken, bound to Alice
    InProcess(world).intake()
    job = world.jobs.get(str(answer.json["jobId"]))
    assert job is not None and job.principal == ALICE and job.state is JobState.RUNNING


# ------------------------------------------------------------------------------ one admission path
def test_the_request_takes_every_field_of_the_intake_message_but_the_principal():
    # GIVEN the request of POST /jobs and the intake message of the queue
    request = api_requests.JobRequest.model_json_schema()["properties"]
    message = IntakeMessage.model_json_schema()["properties"]
    # THEN the request has the message's fields, less principal (the caller)
    assert set(request) == set(message) - {"principal"}
    # AND each field the two share past the document is the message's own definition
    for field in ("document_id", "idempotency_key", "metadata", "budget_usd"):
        assert request[field] == message[field], field


def test_an_idempotency_key_in_the_body_is_the_headers_and_the_two_must_agree():
    world = FakeWorld()
    by_header = submit(world, key="k-1")
    by_body = submit(world, idempotency_key="k-1")
    assert by_header.status == by_body.status == 202 and by_body.json["jobId"] == by_header.json["jobId"]
    assert by_body.headers.get("Idempotent-Replayed") == "true"
    differ = submit(world, key="k-1", idempotency_key="k-2")
    assert (differ.status, differ.code) == (409, "api.conflict") and len(intake_messages(world)) == 2


def test_a_queue_message_posted_as_it_is_is_taken_with_every_field():
    world = FakeWorld()
    # GIVEN an intake message as one sends it to the queue
    message = {"schema_version": 1, "document": {"text": TEXT}, "document_id": "nda-7", "idempotency_key": "nda-7-v1",
               "metadata": {"matter": "M-7", "pages": 3, "tags": ["nda"]}, "budget_usd": 2.5}
    # WHEN it is posted to /jobs
    answer = call(world, "POST", "/jobs", message)
    # THEN it is taken, and the message queued carries every field, with the caller as principal
    assert answer.status == 202, answer.body
    [queued] = intake_messages(world)
    # (the key scoped to the caller: two principals never share a job)
    # (and the Job API's default priority, interactive: the message named none)
    assert {k: v for k, v in queued.items() if k not in ("idempotency_key", "principal", "priority")} == {
        k: v for k, v in message.items() if k != "idempotency_key"}
    assert queued["priority"] == "interactive" and queued["principal"] == ALICE and queued["idempotency_key"] == submission.scoped_key(ALICE, "nda-7-v1")
    InProcess(world).intake()
    job = world.jobs.get(str(answer.json["jobId"]))
    assert job is not None and (job.document_id, job.budget_micro_usd) == ("nda-7", 2_500_000)


@pytest.mark.parametrize("version,status", [(1, 202), (2, 400), (True, 400), ("1", 400), (None, 400)],
                         ids=["1", "2", "true", "string", "null"])
def test_schema_version_1_is_taken_and_any_other_value_refused(version: object, status: int):
    world = FakeWorld()
    # WHEN a request names a schema_version
    answer = submit(world, schema_version=version)
    # THEN 1 is taken; anything else is 400 input.invalid naming the field, and nothing is queued
    assert answer.status == status, answer.body
    if status == 400:
        assert answer.code == "input.invalid" and "schema_version" in str(answer.json["error"])
        assert not intake_messages(world) and not world.artifacts.objects


def test_a_body_that_names_a_principal_is_refused_and_nothing_is_queued():
    world = FakeWorld()
    # WHEN Alice posts a job, and a batch, claiming to be Bob
    job = submit(world, principal=BOB)
    batch = call(world, "POST", "/batches", [{"custom_id": "a", "document": {"text": TEXT}, "principal": BOB},
                                             {"custom_id": "b", "document": {"text": LONG_TEXT}}])
    # THEN the job is 400 input.invalid, one message saying the API sets the principal; nothing of it is queued
    assert job.status == 400 and job.code == "input.invalid"
    assert job.json["error"]["message"] == api_requests.PRINCIPAL_REFUSED  # type: ignore[index]  # a JSON object
    # AND the batch item is rejected alone, the other item is queued, as Alice's
    items = batch.json["items"]
    assert [(i["customId"], i["status"], (i["error"] or {}).get("code")) for i in items] == [  # type: ignore[union-attr]
        ("a", "rejected", "input.invalid"), ("b", "queued", None)]
    assert [(m["document"], m["principal"]) for m in intake_messages(world)] == [({"text": LONG_TEXT}, ALICE)]


def test_a_budget_under_the_estimate_is_refused_alike_by_the_api_the_cli_and_intake_before_any_call():
    """One estimator (cost.estimate_document), one check (admission.check_budget): POST /jobs
    answers 422 job.budget_insufficient, `review submit --budget-usd` (submission.submit) raises it, and a message sent
    straight to the queue ends its job `failed` with it; nothing runs and no model call is made."""
    from contract_review.domain.errors import ReviewError
    from contract_review.pipeline import admission

    expected = admission.estimate(SETTINGS, TEXT).model_micro_usd
    assert expected > 0
    by_api, by_cli, by_queue = small_chunk_world(), small_chunk_world(), small_chunk_world()
    refused = submit(by_api, budget_usd=0.000001)
    assert (refused.status, refused.code) == (422, "job.budget_insufficient") and by_api.queues.sent[Queue.INTAKE] == []
    with pytest.raises(ReviewError) as caught:
        submission.submit(by_cli.deps, None, SubmitRequest.inline(TEXT, budget_usd=0.000001))
    assert caught.value.envelope.error_code == "job.budget_insufficient" and by_cli.queues.sent[Queue.INTAKE] == []
    p = InProcess(by_queue)
    p.send({"text": TEXT}, budget_usd=0.000001)
    p.intake()
    (job,) = by_queue.jobs.all()
    assert (job.state, job.error_code) == (JobState.FAILED, "job.budget_insufficient")
    assert p.model.calls == 0 and by_queue.queues.sent[Queue.ANALYSIS] == []
    # AND a budget at its estimate is accepted (the estimate as the caller's stack computes it)
    enough = float(cost.usd(admission.estimate(by_cli.settings, TEXT).model_micro_usd)) + 0.000001
    assert submission.submit(by_cli.deps, None, SubmitRequest.inline(TEXT, budget_usd=enough)).job_id
    assert submit(by_api, budget_usd=100.0).status == 202


def test_post_jobs_with_a_budget_stops_the_job_as_review_submit_with_a_budget_does(monkeypatch):
    # GIVEN one document whose estimate passes its budget but whose calls cost more (an estimate can undershoot:
    # here it is made to say $0), sent to POST /jobs (budget_usd) and by `review submit --budget-usd` (submission.submit)
    from contract_review.pipeline import admission

    real = admission.estimate
    monkeypatch.setattr(admission, "estimate", lambda settings, text, **_: real(settings, ""))
    by_api, by_cli = small_chunk_world(), small_chunk_world()
    api_job = str(submit(by_api, budget_usd=0.000001).json["jobId"])
    cli_job = submission.submit(by_cli.deps, None, SubmitRequest.inline(TEXT, budget_usd=0.000001)).job_id
    # WHEN the pipeline runs each
    jobs = [InProcess(by_api).run(api_job), InProcess(by_cli).run(cli_job)]
    # THEN both are stopped alike: cancelled with job.budget_exceeded, over their budget, without a report
    for job in jobs:
        assert (job.state, job.error_code, job.budget_micro_usd) == (JobState.CANCELLED, "job.budget_exceeded", 1)
        assert job.total_micro_usd >= 1 and job.report_json_key is None and job.side_effects == []
    # AND the API says so
    view = call(by_api, "GET", f"/jobs/{api_job}").json
    assert view["status"] == "cancelled" and view["result"] is None
    assert view["error"]["code"] == "job.budget_exceeded"  # type: ignore[index]  # a JSON object


UPLOAD = "s3://artifacts/uploads/doc.txt"  # a queue sender's upload; the API's caller sends its own (ALICES)
ALICES = f"s3://artifacts/{uploads_prefix(ALICE)}doc.txt"
BAD_DOCUMENTS = [  # admission's checks: the document sent, the object it names in the upload area, the check's code
    pytest.param({"s3_uri": "s3://elsewhere/uploads/doc.txt"}, None, "input.document_forbidden", id="not-uploads"),
    pytest.param({"s3_uri": UPLOAD}, None, "input.document_missing", id="missing"),
    pytest.param({"s3_uri": UPLOAD}, b"a" * (MAX_DOCUMENT_BYTES + 1), "input.too_large", id="too-large"),
    pytest.param({"s3_uri": UPLOAD}, b"\xff\xfe not UTF-8 \xc3\x28", "input.undecodable", id="not-utf8"),
    pytest.param({"text": " \n\t "}, None, "input.empty_document", id="blank-text"),
    pytest.param({"s3_uri": UPLOAD}, b"  \n ", "input.empty_document", id="blank-upload"),
]


def _world(upload: bytes | None) -> FakeWorld:
    world = FakeWorld()
    if upload is not None:
        for uri in (UPLOAD, ALICES):
            world.artifacts.objects[(world.artifacts.bucket, uri.split("/", 3)[3])] = upload
    return world


@pytest.mark.parametrize("document,upload,code", BAD_DOCUMENTS)
def test_a_bad_document_gets_the_same_answer_from_the_api_as_from_the_queue(document: dict[str, object],
                                                                              upload: bytes | None, code: str):
    # GIVEN a document that fails one of admission's checks (an upload: in each sender's own upload area)
    api_world, queue_world = _world(upload), _world(upload)
    api_document = {"s3_uri": ALICES} if document.get("s3_uri") == UPLOAD else document
    # WHEN it is posted to /jobs, and sent to the intake queue
    answer = call(api_world, "POST", "/jobs", {"document": api_document})
    handle_intake(queue_world.deps, json.dumps({"schema_version": 1, "document": document, "idempotency_key": "k"}))
    # THEN the API answers 422 with the check's code and message, sending nothing; the queue's job fails with both
    failed = queue_world.jobs.get(job_id_for("k"))
    assert failed is not None and failed.error is not None
    assert (answer.status, answer.code) == (422, code) and failed.error_code == code
    if code != "input.document_forbidden":  # (that one names each sender's own upload area)
        assert str(answer.json["error"]["message"]).replace(ALICES, UPLOAD) == failed.error.message  # type: ignore[index]
    assert not intake_messages(api_world) and not api_world.jobs.all()


@pytest.mark.parametrize("text,code", [
    ("", "input.empty_document"),
    (" \n\t ", "input.empty_document"),
    ("a" * (MAX_DOCUMENT_BYTES + 1), "input.too_large"),
    ("é" * (MAX_DOCUMENT_BYTES // 2 + 1), "input.too_large"),  # fewer characters than bytes
], ids=["empty", "blank", "too-large", "too-large-in-bytes"])
def test_a_bad_text_gets_the_same_code_from_the_api_the_queue_and_review_submit(text: str, code: str):
    # GIVEN a text that fails one of admission's checks
    api_world, cli_world, queue_world = FakeWorld(), FakeWorld(), FakeWorld()
    # WHEN it is posted to /jobs, given to `review submit` (submission.submit), and sent inline to the intake queue
    answer = submit(api_world, text)
    cli_job = submission.submit(cli_world.deps, None, SubmitRequest.inline(text)).job_id
    InProcess(cli_world).intake()
    queued = handle_intake(queue_world.deps, json.dumps({"schema_version": 1, "document": {"text": text}}))
    # THEN each way ends with the same code: the API's answer (422, nothing sent), and the job of each queue message
    codes = {"POST /jobs": answer.code, "review submit": getattr(cli_world.jobs.get(cli_job), "error_code", None),
             "queue": queued.error.error_code if queued.error else None}
    assert codes == dict.fromkeys(codes, code) and answer.status == 422
    assert not intake_messages(api_world)


# ------------------------------------------------------------------------------ GET /jobs/{id}
def test_a_job_reads_queued_at_once_then_running_then_completed_with_its_report():
    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    # before intake: queued, waiting for intake
    queued = call(world, "GET", f"/jobs/{job_id}")
    assert queued.status == 200 and queued.json["status"] == "queued"
    assert queued.json["progress"] == {"currentStep": 0, "totalSteps": 0, "label": "waiting for intake"}
    assert queued.json["result"] is None and queued.json["error"] is None
    run = InProcess(world)
    run.intake()
    running = call(world, "GET", f"/jobs/{job_id}").json
    job = world.jobs.get(job_id)
    assert job is not None
    assert running["status"] == "running" and running["progress"]["totalSteps"] == job.chunk_count > 1  # type: ignore[index]
    run.run(job_id)
    done = call(world, "GET", f"/jobs/{job_id}").json
    assert done["status"] == "completed" and done["error"] is None
    result = done["result"]
    assert isinstance(result, dict) and result["reportJson"] == f"s3://artifacts/reports/{job_id}/report.json"
    progress = done["progress"]
    assert isinstance(progress, dict) and progress["currentStep"] == progress["totalSteps"]
    assert progress["label"].startswith("job.completed") or progress["label"]  # the latest event's label
    assert done["updatedAt"].endswith("Z")  # type: ignore[union-attr]


def test_the_owner_gets_its_report_through_a_short_lived_presigned_get_and_nobody_else_learns_of_it():
    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    # before the report is written: 409 (queued, then running), and nothing is presigned
    assert (call(world, "GET", f"/jobs/{job_id}/report").status, world.artifacts.presigned) == (409, [])
    run = InProcess(world)
    run.intake()
    early = call(world, "GET", f"/jobs/{job_id}/report")
    assert (early.status, early.code) == (409, "api.conflict") and "running" in str(early.json["error"])
    run.run(job_id)
    done = call(world, "GET", f"/jobs/{job_id}").json["result"]
    assert isinstance(done, dict) and done["reportUrl"].endswith(f"/jobs/{job_id}/report")  # type: ignore[union-attr]
    # the owner: 302 to a presigned GET of report.json (the default) or report.md, good for 5 minutes
    for query, key in (("", f"reports/{job_id}/report.json"), ("format=md", f"reports/{job_id}/report.md")):
        answer = call(world, "GET", f"/jobs/{job_id}/report", query=query)
        assert answer.status == 302 and answer.headers["Location"] == answer.json["reportUrl"]
        assert world.artifacts.presigned[-1] == (key, 0, api.REPORT_URL_EXPIRY_S) and key in answer.headers["Location"]
        assert world.artifacts.get_text(key)  # the object the URL names exists
    presigned = len(world.artifacts.presigned)
    # another principal: 404, as for a job that does not exist; a bad format: 400; neither presigns anything
    other = call(world, "GET", f"/jobs/{job_id}/report", who=BOB)
    assert (other.status, other.code) == (404, "api.not_found")
    assert call(world, "GET", "/jobs/job-00000000000000000000/report").status == 404
    bad = call(world, "GET", f"/jobs/{job_id}/report", query="format=pdf")
    assert (bad.status, bad.code) == (400, "api.invalid_request")
    assert len(world.artifacts.presigned) == presigned


def test_a_failed_job_carries_its_error_code_and_whether_retry_can_help():
    world = FakeWorld()
    job_id = str(submit(world).json["jobId"])
    InProcess(world).intake()
    job = world.jobs.get(job_id)
    assert job is not None
    from contract_review.domain.errors import ErrorEnvelope
    from contract_review.domain.records import JobFailure

    env = ErrorEnvelope.of("model.access_denied", "no access")
    world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED,
                          outcome=JobFailure(error=env, error_code=env.error_code, ended_at=world.clock()))
    body = call(world, "GET", f"/jobs/{job_id}").json
    assert body["status"] == "failed"
    assert body["error"] == {"code": "model.access_denied", "message": "no access", "retryable": True}


# ------------------------------------------------------------------------------ events
def test_events_read_after_seq_across_reconnects_lose_nothing_and_repeat_nothing():
    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    run = InProcess(world)
    seen: list[int] = []
    after = 0
    # WHEN a client reads a page at a time (limit 3), reconnecting between pages while the job makes progress
    for _ in range(200):
        page = call(world, "GET", f"/jobs/{job_id}/events", query=f"after={after}&limit=3")
        assert page.status == 200
        assert isinstance(page.body, list) and len(page.body) <= 3
        seen += [int(e["seq"]) for e in page.body]
        if page.body:
            after = int(page.body[-1]["seq"])
        job = world.jobs.get(job_id)
        if not page.body and job is not None and job.terminal:
            break
        run.round()
    # THEN the concatenation is every event the job has, in order, each once
    everything = [e.number for e in world.jobs.events(job_id, after=0, limit=10_000)]
    assert seen == everything and len(set(seen)) == len(seen) and len(seen) > 5
    assert seen == sorted(seen)


def test_events_of_a_job_not_yet_taken_in_are_an_empty_list():
    world = FakeWorld()
    job_id = submit(world).json["jobId"]
    assert call(world, "GET", f"/jobs/{job_id}/events").body == []


@pytest.mark.parametrize("query", ["after=-1", "after=x", "limit=0", "limit=1001", "after=1.5"])
def test_bad_event_parameters_are_400(query: str):
    world = FakeWorld()
    job_id = submit(world).json["jobId"]
    answer = call(world, "GET", f"/jobs/{job_id}/events", query=query)
    assert answer.status == 400 and answer.code == "api.invalid_request"


# ------------------------------------------------------------------------------ principals
def _routes(job_id: str, batch_id: str) -> list[tuple[str, str, object]]:
    return [("GET", f"/jobs/{job_id}", None), ("GET", f"/jobs/{job_id}/events", None),
            ("POST", f"/jobs/{job_id}/cancel", None), ("POST", f"/jobs/{job_id}/approval", {"decision": "approve"}),
            ("POST", f"/jobs/{job_id}/retry", None), ("GET", f"/batches/{batch_id}", None)]


ROUTE_NAMES = ["get-job", "events", "cancel", "approval", "retry", "get-batch"]


@pytest.mark.parametrize("taken_in", [False, True], ids=["before-intake", "after-intake"])
@pytest.mark.parametrize("route", range(len(ROUTE_NAMES)), ids=ROUTE_NAMES)
def test_another_principal_gets_404_on_every_route(route: int, taken_in: bool):
    world = FakeWorld()
    # GIVEN Alice's batch of one job (before and after intake recorded it)
    batch = call(world, "POST", "/batches", [{"custom_id": "a", "document": {"text": TEXT}}])
    assert batch.status == 202
    job_id, batch_id = batch.json["items"][0]["jobId"], batch.json["batchId"]  # type: ignore[index]
    if taken_in:
        InProcess(world).intake()
    method, path, body = _routes(str(job_id), str(batch_id))[route]
    sent_before = {q: len(v) for q, v in world.queues.sent.items()}
    # WHEN Bob calls the route
    answer = call(world, method, path, body, who=BOB)
    # THEN 404, worded as for a job that does not exist, and nothing changed
    assert answer.status == 404 and answer.code == "api.not_found", answer.body
    missing = call(world, method, path.replace(str(job_id), "job-" + "0" * 20).replace(str(batch_id),
                                                                                     "batch-" + "0" * 20), body, who=BOB)
    assert missing.status == 404 and str(answer.json["error"]["message"]).replace(  # type: ignore[index]
        str(job_id), "X").replace(str(batch_id), "X") == str(missing.json["error"]["message"]).replace(  # type: ignore[index]
        "job-" + "0" * 20, "X").replace("batch-" + "0" * 20, "X")
    assert {q: len(v) for q, v in world.queues.sent.items()} == sent_before
    job = world.jobs.get(str(job_id))
    assert job is None or job.state in (JobState.QUEUED, JobState.RUNNING)
    # and Alice still can
    assert call(world, "GET", f"/jobs/{job_id}").status == 200


@pytest.mark.parametrize("route", range(len(ROUTE_NAMES)), ids=ROUTE_NAMES)
def test_a_job_sent_through_the_queue_is_not_visible_through_the_api(route: int):
    world = FakeWorld()
    run = InProcess(world)
    run.send({"text": TEXT}, key="queue-job")
    run.intake()
    [job] = world.jobs.all()
    method, path, body = _routes(job.job_id, "batch-" + "0" * 20)[route]
    assert call(world, method, path, body).status == 404


def test_a_restarted_session_of_the_same_role_still_sees_and_acts_on_its_jobs_and_another_role_does_not():
    world = FakeWorld()
    task = "arn:aws:sts::123456789012:assumed-role/IngestTask/{}"
    # GIVEN a job submitted by an ECS task's session
    answer = submit(world, who=task.format("5f0c7e9a"))
    job_id = str(answer.json["jobId"])
    InProcess(world).intake()
    # WHEN the task restarts (a new session of the same role) THEN it reads and cancels its job
    restarted = task.format("8d1b2c3e")
    assert call(world, "GET", f"/jobs/{job_id}", who=restarted).status == 200
    assert call(world, "POST", f"/jobs/{job_id}/cancel", who=restarted).status == 202
    # AND the same document again from the new session is the same job
    assert submit(world, who=restarted).json["jobId"] == job_id
    # AND another role's session does not see it
    assert call(world, "GET", f"/jobs/{job_id}", who="arn:aws:sts::123456789012:assumed-role/Other/x").status == 404


def test_a_job_bound_to_a_full_session_arn_before_stays_readable_by_that_session_only():
    world = FakeWorld()
    session = "arn:aws:sts::123456789012:assumed-role/IngestTask/old-session"
    InProcess(world).send({"text": TEXT}, key="legacy")
    InProcess(world).intake()
    [job] = world.jobs.all()
    world.jobs.items[job.job_id] = job.model_copy(update={"principal": session})  # as a job bound before the rule
    assert call(world, "GET", f"/jobs/{job.job_id}", who=session).status == 200
    assert call(world, "GET", f"/jobs/{job.job_id}",
                who="arn:aws:sts::123456789012:assumed-role/IngestTask/new-session").status == 404


def test_a_request_without_a_principal_is_401():
    world = FakeWorld()
    for method, path in (("POST", "/jobs"), ("GET", "/jobs/job-" + "0" * 20), ("POST", "/batches")):
        answer = call(world, method, path, {"document": {"text": TEXT}}, who=None)
        assert answer.status == 401 and answer.code == "api.unauthenticated"
    assert not intake_messages(world)


def test_unknown_routes_are_404_and_wrong_methods_405():
    world = FakeWorld()
    assert call(world, "GET", "/nowhere").status == 404
    answer = call(world, "DELETE", "/jobs/job-" + "0" * 20)
    assert answer.status == 405 and answer.headers["Allow"] == "GET" and answer.code == "api.invalid_request"


# ------------------------------------------------------------------------------ batches
def test_a_batch_with_one_bad_item_submits_the_others_and_reports_the_bad_one():
    world = FakeWorld()
    lines = [json.dumps({"custom_id": "nda", "document": {"text": TEXT}}),
             json.dumps({"custom_id": "bad", "document": {"text": "  "}}),
             "{this is not json",
             json.dumps({"custom_id": "msa", "document": {"text": LONG_TEXT}, "metadata": {"matter": "M-2"}}),
             json.dumps({"custom_id": "nda", "document": {"text": LONG_TEXT}})]
    # WHEN a JSONL batch of five items, three of them bad, is posted
    answer = call(world, "POST", "/batches", "\n".join(lines).encode(),
                  headers={"Content-Type": "application/x-ndjson"})
    # THEN 202: two jobs, three items reported with their error
    assert answer.status == 202, answer.body
    body = answer.json
    assert body["accepted"] == 2 and body["rejected"] == 3 and body["total"] == 5
    items = body["items"]
    assert isinstance(items, list)
    by_status = [(i["customId"], i["status"], (i["error"] or {}).get("code")) for i in items]
    assert by_status == [("nda", "queued", None), ("bad", "rejected", "input.empty_document"),
                         (None, "rejected", "input.invalid"), ("msa", "queued", None),
                         ("nda", "rejected", "input.invalid")]
    InProcess(world).intake()
    assert len(world.jobs.all()) == 2
    # AND the good ones run to completion, each tracked on its own
    run = InProcess(world)
    for item in items:
        if item["jobId"]:
            run.run(str(item["jobId"]))
    later = call(world, "GET", f"/batches/{body['batchId']}").json
    assert later["counts"] == {"completed": 2, "rejected": 3} and later["ended"] is True
    assert [i["status"] for i in later["items"]] == ["completed", "rejected", "rejected", "completed",  # type: ignore[union-attr]
                                                     "rejected"]


def test_the_same_batch_twice_is_one_batch_and_its_jobs_once():
    world = FakeWorld()
    items = [{"custom_id": "a", "document": {"text": TEXT}}, {"custom_id": "b", "document": {"text": LONG_TEXT}}]
    first = call(world, "POST", "/batches", items)
    second = call(world, "POST", "/batches", {"items": items})  # the same items, the other accepted form
    third = call(world, "POST", "/batches", items)
    assert first.json["batchId"] == third.json["batchId"]
    assert third.headers.get("Idempotent-Replayed") == "true"
    # another body with the same documents is another batch, but its jobs are the same (keyed by document)
    assert second.status == 202 and second.json["batchId"] != first.json["batchId"]
    assert [i["jobId"] for i in second.json["items"]] == [i["jobId"] for i in first.json["items"]]  # type: ignore[union-attr]
    InProcess(world).intake()
    assert len(world.jobs.all()) == 2


@pytest.mark.parametrize("body", [b"", b"[]", b"42", b"null", b" null ", json.dumps([{"custom_id": str(i), "document": {"text": TEXT}}
                                                               for i in range(api_batches.MAX_BATCH_ITEMS + 1)]).encode()])
def test_an_empty_or_oversized_batch_is_a_400(body: bytes):
    world = FakeWorld()
    answer = call(world, "POST", "/batches", body)
    assert answer.status == 400 and answer.code == "input.invalid"
    assert not intake_messages(world)


# ------------------------------------------------------------------------------ cancel, retry, approval
def test_cancel_moves_a_running_job_to_cancelling_once_and_an_ended_job_is_a_conflict():
    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    # before intake took it in there is nothing to cancel yet: 409, with Retry-After
    early = call(world, "POST", f"/jobs/{job_id}/cancel")
    assert early.status == 409 and early.code == "api.conflict" and early.headers.get("Retry-After")
    run = InProcess(world)
    run.intake()
    first = call(world, "POST", f"/jobs/{job_id}/cancel")
    second = call(world, "POST", f"/jobs/{job_id}/cancel")
    assert first.status == second.status == 202
    assert first.json["status"] == second.json["status"] == "cancelling"
    assert first.json["changed"] is True and second.json["changed"] is False
    job = run.run(job_id)
    assert job.state is JobState.CANCELLED and job.cancelled_by == ALICE
    assert call(world, "POST", f"/jobs/{job_id}/cancel").json["status"] == "cancelled"
    # a job that completed cannot be cancelled
    done_id = str(submit(world).json["jobId"])
    assert run.run(done_id).state is JobState.COMPLETED
    ended = call(world, "POST", f"/jobs/{done_id}/cancel")
    assert ended.status == 409 and ended.code == "api.conflict" and "already ended" in str(ended.json["error"])


def test_retry_reopens_a_failed_job_and_refuses_a_completed_one():
    from contract_review.domain.errors import ErrorEnvelope
    from contract_review.domain.records import JobFailure

    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    run = InProcess(world)
    run.intake()
    env = ErrorEnvelope.of("model.access_denied", "no access")
    job = world.jobs.get(job_id)
    assert job is not None
    world.jobs.transition(job_id, (JobState.RUNNING,), JobState.FAILED,
                          outcome=JobFailure(error=env, error_code=env.error_code, ended_at=world.clock()))
    answer = call(world, "POST", f"/jobs/{job_id}/retry")
    assert answer.status == 202 and answer.json["status"] == "running" and answer.json["action"]
    assert run.run(job_id).state is JobState.COMPLETED
    again = call(world, "POST", f"/jobs/{job_id}/retry")
    assert again.status == 409 and again.code == "api.conflict"


def test_retry_of_a_job_being_cancelled_is_a_conflict_not_a_server_error():
    # the walk the stateful schemathesis run found: submit, intake takes it in, cancel, retry (was a 500)
    world = FakeWorld()
    job_id = str(submit(world, text=LONG_TEXT).json["jobId"])
    InProcess(world).intake()
    assert call(world, "POST", f"/jobs/{job_id}/cancel").status == 202
    answer = call(world, "POST", f"/jobs/{job_id}/retry")
    assert answer.status == 409 and answer.code == "api.conflict" and "cancelling" in str(answer.json["error"])
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.CANCELLING
    assert call(world, "GET", f"/jobs/{job_id}").json["status"] == "cancelling"


def test_an_approval_needs_a_job_waiting_for_one_and_a_valid_decision():
    world = FakeWorld()
    job_id = str(submit(world).json["jobId"])
    InProcess(world).intake()
    bad = call(world, "POST", f"/jobs/{job_id}/approval", {"decision": "maybe"})
    assert bad.status == 400 and bad.code == "api.invalid_request"
    running = call(world, "POST", f"/jobs/{job_id}/approval", {"decision": "approve"})
    assert running.status == 409 and running.code == "api.conflict"


def test_a_job_waiting_for_approval_shows_what_to_decide():
    from contract_review.domain import lifecycle
    from contract_review.domain.records import Approval, AwaitApproval

    world = FakeWorld()
    job_id = str(submit(world).json["jobId"])
    InProcess(world).intake()
    now = world.clock()
    approval = Approval(step="ticket.open", key="k", reason="timed out after the write may have happened",
                        requested_at=now, expires_at=now + 3600, evidence={"lookup": "unavailable"})
    assert lifecycle.move(world.deps, job_id, (JobState.RUNNING,), JobState.WAITING_APPROVAL,
                          outcome=AwaitApproval(approval=approval))
    body = call(world, "GET", f"/jobs/{job_id}").json
    assert body["status"] == "waiting_approval"
    assert body["approval"] == {"step": "ticket.open", "key": "k", "evidence": {"lookup": "unavailable"},
                                "reason": "timed out after the write may have happened",
                                "requestedAt": job_view.api_time(now), "expiresAt": job_view.api_time(now + 3600), "decision": None,
                                "decidedBy": None, "approvalUrl": f"http://api.test/jobs/{job_id}/approval"}


@pytest.mark.parametrize("decision,after", [("approve", "running"), ("reject", "compensating")])
def test_an_approval_decides_a_waiting_job_once(decision: str, after: str):
    from contract_review.domain import lifecycle
    from contract_review.domain.records import Approval, AwaitApproval, SideEffectDone, StepStatus

    world = FakeWorld()
    job_id = str(submit(world).json["jobId"])
    InProcess(world).intake()
    now = world.clock()
    approval = Approval(step="ticket.open", key="k", reason="ambiguous", requested_at=now, expires_at=now + 3600)
    world.jobs.record_side_effect(job_id, SideEffectDone(step="ticket.open", key="k", at=now,
                                                         status=StepStatus.STARTED))  # the saga writes ahead
    assert lifecycle.move(world.deps, job_id, (JobState.RUNNING,), JobState.WAITING_APPROVAL,
                          outcome=AwaitApproval(approval=approval))
    # another principal cannot decide; the owner decides once; a second decision is a conflict
    assert call(world, "POST", f"/jobs/{job_id}/approval", {"decision": decision}, who=BOB).status == 404
    first = call(world, "POST", f"/jobs/{job_id}/approval", {"decision": decision})
    assert first.status == 202 and first.json["status"] == after and first.json["decision"] == decision
    again = call(world, "POST", f"/jobs/{job_id}/approval", {"decision": decision})
    if decision == "approve":
        assert again.status == 409 and again.code == "api.conflict"
    else:  # its compensation has not run yet (lost, or still on its way): sent again, harmless
        assert again.status == 202 and "sent again" in again.json["message"] and again.json["status"] == "compensating"
    job = world.jobs.get(job_id)
    assert job is not None and job.approval is not None and job.approval.decided_by == ALICE


# ------------------------------------------------------------------------------ spend limits
def _limited(**limits: object) -> FakeWorld:
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": SETTINGS.profile.with_overrides(**limits)}))


def test_a_job_over_the_default_budget_is_refused_alike_by_the_api_and_the_queue_before_any_call():
    estimate = admission.estimate(SETTINGS, LONG_TEXT).model_micro_usd
    world = _limited(default_budget_usd=estimate / 2e6)  # half this document's estimate
    # WHEN it is sent without a budget THEN the API refuses it (422) and intake fails it, both naming the default
    answer = submit(world, text=LONG_TEXT)
    assert answer.status == 422 and answer.code == "job.budget_insufficient"
    assert "default per-job budget" in str(answer.json["error"]["message"])  # type: ignore[index]  # a JSON object
    assert not intake_messages(world)
    run = InProcess(world)
    run.send({"text": LONG_TEXT}, key="queued-no-budget")
    run.intake()
    failed = world.jobs.get(job_id_for("queued-no-budget"))
    assert failed is not None and failed.error_code == "job.budget_insufficient" and failed.model_micro_usd == 0
    # AND with its own budget over the estimate it is taken, under that budget
    taken = submit(world, text=LONG_TEXT, budget_usd=2 * estimate / 1e6)
    assert taken.status == 202
    run.intake()
    job = world.jobs.get(str(taken.json["jobId"]))
    assert job is not None and job.budget_micro_usd == 2 * estimate


def test_a_job_sent_without_a_budget_gets_the_default_one():
    world = _limited(default_budget_usd=50.0)
    run = InProcess(world)
    run.send({"text": TEXT}, key="default-budget")
    run.intake()
    job = world.jobs.get(job_id_for("default-budget"))
    assert job is not None and job.budget_micro_usd == 50_000_000 and job.estimate_micro_usd


def test_the_daily_spend_cap_is_per_principal_and_refuses_before_anything_is_queued():
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = _limited(principal_daily_spend_usd=1.5 * estimate / 1e6)
    assert submit(world).status == 202
    refused = submit(world, text=TEXT.replace("York", "Jersey"))
    assert refused.status == 429 and refused.code == "quota.spend_exceeded" and refused.headers["Retry-After"]
    assert len(intake_messages(world)) == 1
    assert submit(world, who=BOB).status == 202  # Bob's allowance is his own
    # a batch item over the cap is that item's error; the others are not affected
    batch = call(world, "POST", "/batches", [{"custom_id": "over", "document": {"text": TEXT.replace("York", "Amsterdam")}}])
    assert batch.status == 202 and batch.json["items"][0]["error"]["code"] == "quota.spend_exceeded"  # type: ignore[index]


def _spent(world: FakeWorld, who: str = ALICE) -> int:
    """What the principal's admissions took from today's allowance."""
    day = int(world.clock() // 86400)
    return world.token_ledger.counters.get((f"spend#{owner(who)}", day), 0)


def test_a_replacement_under_a_failed_jobs_key_is_a_new_admission_and_is_charged():
    """A replacement submitted under the key of a job that failed on its input was never
    charged (blank the upload before intake reads it, then submit an over-cap document under that key: 202, where a
    new key got 429)."""
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = _limited(principal_daily_spend_usd=1.5 * estimate / 1e6)  # room for one such job a day
    # GIVEN a document uploaded and submitted under key k (charged), then blanked before intake reads it
    uri = str(call(world, "POST", "/uploads", {}).json["s3Uri"])
    key = uri.removeprefix(f"s3://{world.artifacts.bucket}/")
    world.artifacts.put_text(key, TEXT)
    assert call(world, "POST", "/jobs", {"document": {"s3_uri": uri}}, headers={"Idempotency-Key": "k"}).status == 202
    world.artifacts.put_text(key, " \n ")
    InProcess(world).intake()
    failed = world.jobs.get(job_id_for(submission.scoped_key(ALICE, "k")))
    assert failed is not None and failed.error_code == "input.empty_document" and failed.replaceable
    assert _spent(world) == estimate
    # WHEN another document is submitted under the same key, over what is left of the day's cap
    again = submit(world, text=TEXT.replace("York", "Jersey"), key="k")
    # THEN it is refused as a new key would be, and nothing is queued
    assert again.status == 429 and again.code == "quota.spend_exceeded", again.json
    assert submit(world, text=TEXT.replace("York", "Jersey"), key="other").status == 429
    assert not intake_messages(world) and _spent(world) == estimate  # (intake took the first one)


def test_a_retry_after_a_failed_submission_write_takes_the_allowance_once():
    """The allowance was taken before the submission record was written; when that write failed
    (503, Retry-After) the client's retry with the same key took the estimate again: near the cap, 429 until 00:00 UTC
    for a request that queued nothing. Now a failed admission gives back what it took, and the charge is keyed by
    the job: a retry or a replay takes it once."""
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = _limited(principal_daily_spend_usd=1.5 * estimate / 1e6)
    real = world.artifacts.put_text
    failures = [ReviewError.of("aws.throttled", "SlowDown", step="api")]

    def put_text(key: str, body: str, content_type: str = "application/json") -> None:
        if key.startswith("submissions/") and failures:
            raise failures.pop()
        real(key, body, content_type)

    world.artifacts.put_text = put_text  # type: ignore[method-assign]  # one call of the repository wrapped
    first = submit(world, key="order-9")
    assert first.status == 503 and first.headers["Retry-After"] and not intake_messages(world)
    assert _spent(world) == 0  # given back: nothing was queued
    # WHEN the client retries the same request THEN it is taken, charged once
    retried = submit(world, key="order-9")
    assert retried.status == 202 and _spent(world) == estimate
    # AND a replay (intake has not recorded the job yet) takes nothing again
    assert submit(world, key="order-9").status == 202 and _spent(world) == estimate
    assert len(intake_messages(world)) == 2  # the message again (intake takes one job)


def test_a_charge_whose_give_back_failed_is_not_taken_again_by_the_retry():
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = _limited(principal_daily_spend_usd=1.5 * estimate / 1e6)
    sends = world.queues.send_intake
    gives = world.token_ledger.give_back

    def send_fails(body: str) -> None:
        raise ReviewError.of("aws.throttled", "the queue throttled", step="api")

    def give_back_fails(charge: object) -> bool:
        raise ReviewError.of("aws.throttled", "the ledger throttled", step="api")

    world.queues.send_intake = send_fails  # type: ignore[method-assign]  # the send fails,
    world.token_ledger.give_back = give_back_fails  # type: ignore[method-assign]  # and so does the give-back
    assert submit(world, key="order-10").status == 503 and _spent(world) == estimate
    world.queues.send_intake = sends  # type: ignore[method-assign]  # restored
    world.token_ledger.give_back = gives  # type: ignore[method-assign]  # restored
    # WHEN the client retries THEN the charge taken by the first attempt stands, and nothing more is taken
    assert submit(world, key="order-10").status == 202 and _spent(world) == estimate


def test_requests_over_a_principals_rate_are_429_and_another_principal_is_not_slowed():
    world = _limited(api_requests_per_minute=3)
    world.clock.now = 60.0 * 1000 + 30  # half-way through a minute
    answers = [call(world, "GET", "/jobs/job-" + "0" * 20) for _ in range(4)]
    assert [a.status for a in answers] == [404, 404, 404, 429]
    assert answers[-1].code == "api.rate_limited" and answers[-1].headers["Retry-After"] == "30"
    assert answers[-1].json["error"]["retryable"] is True  # type: ignore[index]  # a JSON object
    assert call(world, "GET", "/jobs/job-" + "0" * 20, who=BOB).status == 404
    world.clock.advance(30)
    assert call(world, "GET", "/jobs/job-" + "0" * 20).status == 404


# ------------------------------------------------------------------------------ priority
def test_a_job_is_interactive_and_a_batch_item_bulk_unless_they_say_otherwise():
    world = FakeWorld()
    # WHEN a job is posted without a priority, one with `bulk`, and a batch with an item of each kind
    plain = call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    bulk = call(world, "POST", "/jobs", {"document": {"text": LONG_TEXT}, "priority": "bulk"})
    batch = call(world, "POST", "/batches", [{"custom_id": "a", "document": {"text": TEXT + "\n\nA."}},
                                             {"custom_id": "b", "document": {"text": TEXT + "\n\nB."},
                                              "priority": "interactive"}])
    assert {plain.status, bulk.status, batch.status} == {202}, (plain.body, bulk.body, batch.body)
    InProcess(world).intake()
    items = batch.json["items"]
    assert isinstance(items, list)
    ids = [plain.json["jobId"], bulk.json["jobId"], items[0]["jobId"], items[1]["jobId"]]
    # THEN each job records its priority: interactive by default, bulk for a batch's items unless said
    assert [world.jobs.get(str(i)).priority.value for i in ids] == [  # type: ignore[union-attr]
        "interactive", "bulk", "bulk", "interactive"]
    # AND an unknown priority is the caller's 400
    assert call(world, "POST", "/jobs", {"document": {"text": TEXT}, "priority": "flex"}).status == 400
