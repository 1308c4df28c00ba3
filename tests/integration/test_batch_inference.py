"""The batch inference adapter (adapters/batch_inference.py) against the local stand-in for the service
(review_local/batch_service.py) over real HTTP, with S3 from a moto server: boto3's own `bedrock` client, the
records the analysts build (Converse bodies), idempotent submits, partial completion, failures, and outcomes joined
on recordId whatever the output order (docs/batch-inference.md). The port's contract (the last section) holds the
in-memory double of the unit tests (`FakeBatchInference`) and the adapter to the same cases."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from contract_review.adapters.batch_inference import BedrockBatchInference, job_id_of
from contract_review.domain.batch_inference import BatchJobState, BatchJobStatus, BatchRecord, RecordOutcome
from contract_review.domain.errors import ReviewError, classify_batch_submit
from contract_review.domain.ports import BatchInference
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.bedrock import BedrockConverseModel
from contract_review.review.analysts import ANALYSTS, build_request
from contract_review.review.chunking import split_into_chunks
from review_local.batch_service import BatchFaults, BedrockBatchStandIn, analyst_request
from tests.texts import LONG_TEXT, RISKY_CLAUSE
from tests.unit.fakes import FakeBatchInference, FakeClock

SAMPLE_CONTRACT = LONG_TEXT + RISKY_CLAUSE

BUCKET = "batch-bucket"
ROLE = "arn:aws:iam::123456789012:role/bedrock-batch"
MODEL = "anthropic.claude-sonnet-4-6"
MIN_RECORDS = 4


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
    try:
        yield endpoint
    finally:
        server.stop()


def _session() -> boto3.Session:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    client = _session().client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def fake(s3: Any) -> Iterator[BedrockBatchStandIn]:
    with BedrockBatchStandIn(s3, step_s=0.01, min_records=MIN_RECORDS) as service:
        yield service


@pytest.fixture
def bedrock(fake: BedrockBatchStandIn) -> Any:
    return _session().client("bedrock", endpoint_url=fake.url)


@pytest.fixture
def batch(bedrock: Any, s3: Any, request: pytest.FixtureRequest) -> BedrockBatchInference:
    prefix = "batch/" + request.node.name.replace("[", "-").rstrip("]")
    return BedrockBatchInference(bedrock, s3, bucket=BUCKET, prefix=prefix, role_arn=ROLE, model_id=MODEL)


def analyst_records(n: int) -> tuple[list[BatchRecord], dict[str, dict[str, Any]]]:
    """`n` locate requests of the analysts about the sample contract's chunks, as Converse bodies, and what the
    offline model answers each on demand (by recordId)."""
    chunks = split_into_chunks(SAMPLE_CONTRACT, 600, 900)
    converse = BedrockConverseModel(client=None, model_id=MODEL)
    model = OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9))
    records, expected = [], {}
    for i in range(n):
        chunk, spec = chunks[i % len(chunks)], ANALYSTS[i % len(ANALYSTS)]
        request = build_request(spec, "locate", chunk, None, None)
        rid = f"{chunk.chunk_id}:{spec.name}:locate:{i}"
        records.append(BatchRecord(rid, converse.converse_request(request)))
        expected[rid] = json.loads(model.invoke(request).text)
    return records, expected


def submitted(batch: BedrockBatchInference, records: list[BatchRecord], token: str) -> str:
    """The records streamed into the job's input, then the job created."""
    assert batch.put_input(token, records) == len(records)
    return batch.submit(token)


def outcomes_of(batch: BedrockBatchInference, job_id: str) -> dict[str, RecordOutcome]:
    return {o.record_id: o for o in batch.results(job_id)}


def wait_until(batch: BedrockBatchInference, job_id: str, done: Callable[[BatchJobState], bool] = lambda s: s.terminal,
               timeout: float = 20) -> BatchJobState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = batch.status(job_id)
        if done(state):
            return state
        time.sleep(0.02)
    raise AssertionError(f"batch job {job_id} did not get there in {timeout} s (last {state.status})")


def tool_input(output: dict[str, Any]) -> dict[str, Any]:
    return dict(output["output"]["message"]["content"][0]["toolUse"]["input"])


def test_a_job_walks_the_statuses_and_every_record_is_answered_by_the_offline_model(
        batch: BedrockBatchInference, fake: BedrockBatchStandIn, s3: Any) -> None:
    records, expected = analyst_records(8)
    job_id = submitted(batch, records, "tok-complete")
    state = wait_until(batch, job_id)
    assert state.status is BatchJobStatus.COMPLETED
    assert (state.total, state.processed, state.succeeded, state.errored) == (8, 8, 8, 0)
    assert fake.job(job_id).statuses == ["Submitted", "Validating", "Scheduled", "InProgress", "Completed"]
    outcomes = outcomes_of(batch, job_id)
    assert set(outcomes) == set(expected)
    assert {rid: tool_input(o.output or {}) for rid, o in outcomes.items()} == expected
    # what Bedrock writes beside the records: the manifest, under <output prefix>/<job id>/
    folder = f"{batch.prefix}/output/tok-complete/{job_id_of(job_id)}/"
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=folder + "manifest.json.out")["Body"].read())
    assert manifest["totalRecordCount"] == manifest["successRecordCount"] == 8
    assert manifest["inputTokenCount"] > 0 and manifest["outputTokenCount"] > 0


def test_outcomes_are_joined_on_record_id_whatever_the_output_order(
        batch: BedrockBatchInference, s3: Any) -> None:
    records, expected = analyst_records(12)
    job_id = submitted(batch, records, "tok-order")
    assert wait_until(batch, job_id).status is BatchJobStatus.COMPLETED
    folder = f"{batch.prefix}/output/tok-order/{job_id_of(job_id)}/"
    out = s3.get_object(Bucket=BUCKET, Key=folder + "records.jsonl.out")["Body"].read().decode()
    order = [json.loads(line)["recordId"] for line in out.splitlines()]
    assert order != [r.record_id for r in records]  # the stand-in shuffles, as Bedrock may
    # and a reversed file changes nothing: every answer lands on its own record
    s3.put_object(Bucket=BUCKET, Key=folder + "records.jsonl.out", Body="\n".join(reversed(out.splitlines())))
    outcomes = outcomes_of(batch, job_id)
    assert {rid: tool_input(o.output or {}) for rid, o in outcomes.items()} == expected


def test_the_same_client_token_returns_the_same_job_and_creates_none(
        batch: BedrockBatchInference, bedrock: Any, fake: BedrockBatchStandIn) -> None:
    records, _ = analyst_records(MIN_RECORDS)
    first = submitted(batch, records, "tok-same")
    again = batch.submit("tok-same")
    assert again == first
    assert len(fake.jobs) == 1
    other = submitted(batch, records, "tok-other")
    assert other != first and len(fake.jobs) == 2
    listed = bedrock.list_model_invocation_jobs(nameContains="tok-same")["invocationJobSummaries"]
    assert [j["jobArn"] for j in listed] == [first]
    assert listed[0]["clientRequestToken"] == "tok-same"


def test_a_partially_completed_job_names_its_failed_and_missing_records(
        batch: BedrockBatchInference, fake: BedrockBatchStandIn) -> None:
    records, expected = analyst_records(6)
    failed, dropped = records[1].record_id, records[4].record_id
    fake.faults = BatchFaults(fail_records=[failed], drop_records=[dropped])
    job_id = submitted(batch, records, "tok-partial")
    state = wait_until(batch, job_id)
    assert state.status is BatchJobStatus.PARTIALLY_COMPLETED
    assert (state.total, state.processed, state.succeeded, state.errored) == (6, 5, 4, 1)
    outcomes = outcomes_of(batch, job_id)
    assert set(outcomes) == set(expected) - {dropped}  # the dropped record has no line (the collector's manifest
    assert outcomes[failed].error_code == "500" and not outcomes[failed].ok  # knows it was submitted: MISSING)
    ok = {rid for rid, o in outcomes.items() if o.ok}
    assert ok == set(expected) - {failed, dropped}
    assert all(tool_input(outcomes[rid].output or {}) == expected[rid] for rid in ok)


@pytest.mark.parametrize("faults, status", [
    (BatchFaults(fail_job="validating"), BatchJobStatus.FAILED),
    (BatchFaults(fail_job="in_progress"), BatchJobStatus.FAILED),
])
def test_a_failed_job_has_no_results_but_a_coded_failure(
        batch: BedrockBatchInference, fake: BedrockBatchStandIn, faults: BatchFaults, status: BatchJobStatus) -> None:
    fake.faults = faults
    records, _ = analyst_records(MIN_RECORDS)
    job_id = submitted(batch, records, "tok-fail")
    assert wait_until(batch, job_id).status is status
    with pytest.raises(ReviewError) as err:
        list(batch.results(job_id))
    assert err.value.envelope.error_code == "batch.job_failed"
    assert err.value.envelope.provider_code == status.value


def test_an_expired_job_has_the_output_of_the_records_it_answered_before_its_timeout(
        batch: BedrockBatchInference, fake: BedrockBatchStandIn) -> None:
    fake.faults = BatchFaults(expire_job=True)
    records, expected = analyst_records(MIN_RECORDS)
    job_id = submitted(batch, records, "tok-expire")
    state = wait_until(batch, job_id)
    assert state.status is BatchJobStatus.EXPIRED and state.processed == len(records) // 2
    outcomes = outcomes_of(batch, job_id)  # the first half (Bedrock bills them): answered; the rest have no line
    assert set(outcomes) == {r.record_id for r in records[:len(records) // 2]}
    assert all(o.ok and tool_input(o.output or {}) == expected[rid] for rid, o in outcomes.items())


def test_a_job_under_the_minimum_record_count_fails_in_validation(batch: BedrockBatchInference) -> None:
    records, _ = analyst_records(MIN_RECORDS - 1)
    job_id = submitted(batch, records, "tok-small")
    state = wait_until(batch, job_id)
    assert state.status is BatchJobStatus.FAILED
    assert "minimum" in state.message  # the stand-in's wording, for people; nothing classifies by it


def test_a_stopped_job_ends_stopped_with_the_output_of_the_records_answered_before_the_stop(s3: Any) -> None:
    with BedrockBatchStandIn(s3, step_s=0.5, min_records=1, faults=BatchFaults(hold_after_records=1)) as slow:
        bedrock = _session().client("bedrock", endpoint_url=slow.url)
        batch = BedrockBatchInference(bedrock, s3, bucket=BUCKET, prefix="batch/stop", role_arn=ROLE, model_id=MODEL)
        records, _ = analyst_records(2)
        job_id = submitted(batch, records, "tok-stop")
        assert wait_until(batch, job_id, lambda s: s.processed == 1).status is BatchJobStatus.IN_PROGRESS
        batch.stop(job_id)
        assert wait_until(batch, job_id).status is BatchJobStatus.STOPPED
        assert [o.record_id for o in batch.results(job_id) if o.ok] == [records[0].record_id]  # billed: read
        with pytest.raises(ClientError) as err:  # a job that has ended cannot be stopped
            bedrock.stop_model_invocation_job(jobIdentifier=job_id)
        assert err.value.response["Error"]["Code"] == "ValidationException"


def test_the_service_checks_what_create_model_invocation_job_checks(bedrock: Any, fake: BedrockBatchStandIn) -> None:
    from botocore.config import Config

    unchecked = _session().client("bedrock", endpoint_url=fake.url, config=Config(parameter_validation=False))
    good: dict[str, Any] = {
        "jobName": "j1", "roleArn": ROLE, "modelId": MODEL, "timeoutDurationInHours": 24,
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/in/"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/out/"}}}
    for bad in ({"timeoutDurationInHours": 12}, {"timeoutDurationInHours": 169}, {"roleArn": "not-a-role"}):
        with pytest.raises(ClientError) as err:
            unchecked.create_model_invocation_job(**{**good, **bad})  # what botocore would refuse, sent
        assert err.value.response["Error"]["Code"] == "ValidationException"
    bedrock.create_model_invocation_job(**good)
    with pytest.raises(ClientError) as err:  # another job of the same name
        bedrock.create_model_invocation_job(**good)
    assert err.value.response["Error"]["Code"] == "ConflictException"
    with pytest.raises(ClientError) as err:
        bedrock.get_model_invocation_job(jobIdentifier="arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/x")
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_records_in_the_anthropic_messages_format_are_answered_too(
        bedrock: Any, s3: Any, fake: BedrockBatchStandIn) -> None:
    records, expected = analyst_records(MIN_RECORDS)
    messages = [BatchRecord(r.record_id, {
        "anthropic_version": "bedrock-2023-05-31", "max_tokens": 1024, "system": r.model_input["system"][0]["text"],
        "messages": [{"role": "user", "content": [{"type": "text", "text": b["text"]}
                                                  for b in r.model_input["messages"][0]["content"] if "text" in b]}],
        "tools": [{"name": "record_answer",
                   "input_schema": r.model_input["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]}],
    }) for r in records]
    batch = BedrockBatchInference(bedrock, s3, bucket=BUCKET, prefix="batch/messages", role_arn=ROLE,
                                  model_id=MODEL, invocation_type="InvokeModel")
    job_id = submitted(batch, messages, "tok-messages")
    assert wait_until(batch, job_id).status is BatchJobStatus.COMPLETED
    outcomes = outcomes_of(batch, job_id)
    assert {rid: o.output["content"][0]["input"] for rid, o in outcomes.items() if o.output} == expected


def test_the_stand_in_reads_back_the_request_an_analyst_built() -> None:
    chunk = split_into_chunks(SAMPLE_CONTRACT, 600, 900)[0]
    converse = BedrockConverseModel(client=None, model_id=MODEL)
    located = build_request(ANALYSTS[0], "locate", chunk, None, None)
    back = analyst_request(converse.converse_request(located))
    assert back is not None
    assert (back.step, back.analyst, back.payload["chunk_text"]) == ("locate", ANALYSTS[0].name, chunk.text)
    assert [c["key"] for c in back.payload["categories"]] == list(ANALYSTS[0].categories)
    assert analyst_request({"messages": [{"role": "user", "content": [{"text": "hello"}]}]}) is None


def test_a_batch_job_is_tagged_with_the_stacks_tag_at_create(bedrock: Any, s3: Any, fake: BedrockBatchStandIn) -> None:
    batch = BedrockBatchInference(bedrock, s3, bucket=BUCKET, prefix="batch/tagged", role_arn=ROLE, model_id=MODEL,
                                  stack_tag="ContractReview-prod")
    records, _ = analyst_records(MIN_RECORDS)
    job_id = submitted(batch, records, "tok-tagged")
    assert fake.job(job_id).request["tags"] == [{"key": "review-stack", "value": "ContractReview-prod"}]
    untagged = submitted(BedrockBatchInference(bedrock, s3, bucket=BUCKET, prefix="batch/untagged", role_arn=ROLE,
                                               model_id=MODEL), records, "tok-untagged")
    assert "tags" not in fake.job(untagged).request


@pytest.mark.parametrize("code, expected, retryable", [
    ("ValidationException", "batch.refused", False), ("AccessDeniedException", "batch.refused", False),
    ("ResourceNotFoundException", "batch.refused", False), ("ServiceQuotaExceededException", "aws.throttled", True),
    ("ThrottlingException", "aws.throttled", True), ("InternalServerException", "aws.unavailable", True),
])
def test_a_refused_create_is_classified_from_its_error_code(batch: BedrockBatchInference, fake: BedrockBatchStandIn,
                                                           code: str, expected: str, retryable: bool) -> None:
    fake.faults = BatchFaults(refuse_create=code)
    records, _ = analyst_records(MIN_RECORDS)
    batch.put_input("tok-refused", records)
    with pytest.raises(ClientError) as err:
        batch.submit("tok-refused")
    env = classify_batch_submit(err.value)
    assert (env.error_code, env.retryable, env.provider_code) == (expected, retryable, code)
    if code in ("ValidationException", "ServiceQuotaExceededException"):  # the service's own words, said once
        assert env.message == f"{code}: {err.value.response['Error']['Message']}"
        assert "An error occurred" not in env.message
    assert not fake.jobs  # nothing created


def test_the_input_is_streamed_in_multipart_parts_and_the_output_read_line_by_line(
        batch: BedrockBatchInference, fake: BedrockBatchStandIn, s3: Any) -> None:
    # records whose input is larger than one part (8 MiB): the managed transfer uploads it in parts
    records, expected = analyst_records(MIN_RECORDS)
    pad = "x" * (3 * 1024 * 1024)
    padded = [BatchRecord(r.record_id, {**r.model_input, "additionalModelRequestFields": {"pad": pad}})
              for r in records]
    job_id = submitted(batch, padded, "tok-big")
    key = f"{batch.prefix}/input/tok-big/records.jsonl"
    head = s3.head_object(Bucket=BUCKET, Key=key, PartNumber=1)
    assert head["PartsCount"] >= 2 and head["ContentLength"] >= 5 * 1024 * 1024  # multipart, parts of >= 5 MiB
    assert wait_until(batch, job_id).status is BatchJobStatus.COMPLETED
    outcomes = batch.results(job_id)
    assert iter(outcomes) is outcomes  # a generator: one line at a time
    assert {o.record_id: tool_input(o.output or {}) for o in outcomes} == expected


# ------------------------------------------------------------------------------ the port's contract
# The `BatchInference` port (domain/ports.py) as the collector relies on it, held by both its implementations: the
# in-memory double the unit worlds use (tests/unit/fakes.py `FakeBatchInference`) and the boto3 adapter. moto has no
# model invocation jobs, so the adapter's leg runs against the local stand-in for the service (review_local/
# batch_service.py `BedrockBatchStandIn`, S3 on the moto server), the same service the local stack gives the
# collector.
@dataclass
class Leg:
    """One implementation of the port, and how a case drives its jobs to their end and injects what goes wrong."""

    port: BatchInference
    finish: Callable[[str], BatchJobState]  # the job's state once it has ended
    fail_records: Callable[[list[str]], None]  # the jobs created from now on answer these records with error 500
    refuse_creates: Callable[[str], None]  # every create from now on is refused with this botocore error code
    hold: Callable[[], None]  # the jobs created from now on run until they are stopped


@pytest.fixture(params=["fake", "aws"])
def leg(request: pytest.FixtureRequest) -> Leg:
    if request.param == "fake":
        clock = FakeClock()
        double = FakeBatchInference(clock, min_records=MIN_RECORDS, end_after_s=60.0)

        def finish(job_id: str) -> BatchJobState:
            clock.advance(61.0)
            return double.status(job_id)

        def fail(ids: list[str]) -> None:
            double.record_faults = lambda rid: "500" if rid in ids else None

        def refuse(code: str) -> None:
            double.refuse_create = code

        return Leg(double, finish, fail, refuse, lambda: None)  # its jobs run a minute of its clock
    stand_in: BedrockBatchStandIn = request.getfixturevalue("fake")
    adapter = BedrockBatchInference(request.getfixturevalue("bedrock"), request.getfixturevalue("s3"), bucket=BUCKET,
                                    prefix="batch/" + request.node.name.replace("[", "-").rstrip("]"), role_arn=ROLE,
                                    model_id=MODEL, read_min_records=lambda: MIN_RECORDS)

    def faults(**kw: Any) -> None:
        stand_in.faults = BatchFaults(**kw)

    return Leg(adapter, lambda job_id: wait_until(adapter, job_id), lambda ids: faults(fail_records=ids),
               lambda code: faults(refuse_create=code), lambda: faults(hold_after_records=1))


def test_contract_every_record_is_answered_as_the_model_answers_it_on_demand(leg: Leg) -> None:
    records, expected = analyst_records(MIN_RECORDS + 2)
    assert leg.port.put_input("tok-c-all", records) == len(records)
    job_id = leg.port.submit("tok-c-all")
    assert leg.finish(job_id).status is BatchJobStatus.COMPLETED
    outcomes = {o.record_id: o for o in leg.port.results(job_id)}
    assert {rid: tool_input(o.output or {}) for rid, o in outcomes.items() if o.ok} == expected


def test_contract_the_same_token_is_the_same_job(leg: Leg) -> None:
    records, _ = analyst_records(MIN_RECORDS)
    leg.port.put_input("tok-c-same", records)
    first = leg.port.submit("tok-c-same")
    assert leg.port.submit("tok-c-same") == first
    leg.port.put_input("tok-c-other", records)
    assert leg.port.submit("tok-c-other") != first


def test_contract_records_sharing_a_record_id_are_refused_before_anything_is_written(leg: Leg) -> None:
    records, _ = analyst_records(2)
    with pytest.raises(ReviewError) as err:
        leg.port.put_input("tok-c-twice", [records[0], records[1], records[0]])
    assert err.value.envelope.error_code == "batch.request_invalid"


def test_contract_a_job_under_the_minimum_fails_and_has_no_results(leg: Leg) -> None:
    assert leg.port.min_records() == MIN_RECORDS
    records, _ = analyst_records(MIN_RECORDS - 1)
    leg.port.put_input("tok-c-small", records)
    job_id = leg.port.submit("tok-c-small")
    assert leg.finish(job_id).status is BatchJobStatus.FAILED
    with pytest.raises(ReviewError) as err:
        list(leg.port.results(job_id))
    assert (err.value.envelope.error_code, err.value.envelope.provider_code) == ("batch.job_failed", "Failed")


def test_contract_a_failed_record_makes_the_job_partially_completed(leg: Leg) -> None:
    records, expected = analyst_records(MIN_RECORDS)
    failed = records[1].record_id
    leg.fail_records([failed])
    leg.port.put_input("tok-c-partial", records)
    job_id = leg.port.submit("tok-c-partial")
    assert leg.finish(job_id).status is BatchJobStatus.PARTIALLY_COMPLETED
    outcomes = {o.record_id: o for o in leg.port.results(job_id)}
    assert (outcomes[failed].ok, outcomes[failed].error_code) == (False, "500")
    assert {rid for rid, o in outcomes.items() if o.ok} == set(expected) - {failed}


@pytest.mark.parametrize("code, expected, retryable", [
    ("ValidationException", "batch.refused", False), ("ThrottlingException", "aws.throttled", True),
])
def test_contract_a_refused_create_raises_the_client_error_the_collector_classifies(
        leg: Leg, code: str, expected: str, retryable: bool) -> None:
    records, _ = analyst_records(MIN_RECORDS)
    leg.refuse_creates(code)
    leg.port.put_input("tok-c-refused", records)
    with pytest.raises(ClientError) as err:
        leg.port.submit("tok-c-refused")
    env = classify_batch_submit(err.value)
    assert (env.error_code, env.retryable, env.provider_code) == (expected, retryable, code)


def test_contract_a_stopped_job_ends_stopped_with_only_answers_it_gave_and_refuses_another_stop(leg: Leg) -> None:
    records, expected = analyst_records(MIN_RECORDS)
    leg.hold()
    leg.port.put_input("tok-c-stop", records)
    job_id = leg.port.submit("tok-c-stop")
    assert not leg.port.status(job_id).terminal
    leg.port.stop(job_id)
    assert leg.finish(job_id).status is BatchJobStatus.STOPPED
    answered = {o.record_id: o for o in leg.port.results(job_id)}  # those answered before the stop (billed): read
    assert all(o.ok and tool_input(o.output or {}) == expected[rid] for rid, o in answered.items())
    with pytest.raises(ClientError) as err:
        leg.port.stop(job_id)
    assert err.value.response["Error"]["Code"] == "ValidationException"
