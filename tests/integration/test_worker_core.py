"""The worker, aggregator and sweeper cores called directly against the deployed template on a
moto server (no worker processes): checkpoint reuse and staleness, Lambda time handoff, refusals,
semantic repair, coverage policy, fencing."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from contract_review.config.profile import get_profile
from contract_review.domain.chunk_records import CheckpointWrite
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import AttemptStats, ChunkStatus, JobFailure, JobState, job_id_for
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.sweeper import sweep
from contract_review.pipeline.worker import ChunkWorker, Delivery
from contract_review.review.analysts import analysis_identities, analysts_for
from contract_review.review.chunking import document_hash
from contract_review.wiring import build_deps, chunk_worker
from review_local.connect import local_deps, local_session
from review_local.embedded import EmbeddedAws

from ..oracle import assert_matches_fault_free, counted
from ..texts import LONG_TEXT, TEXT
from .conftest import get_chunk, get_job, report_json


@pytest.fixture
def deps(aws: EmbeddedAws) -> Deps:
    return local_deps(aws.outputs, aws.region, aws.endpoint, "local")


@pytest.fixture
def sqs(aws: EmbeddedAws) -> Any:
    """A raw SQS client, for what the tests inspect beneath the `Queues` port."""
    return aws.client("sqs")


class ScriptedModel:
    """The offline model, with scripted answers for chosen (analyst, step) calls; counts calls."""

    model_id = "offline-rules-v1"

    def __init__(self, script: dict[tuple[str, str], list[ModelResponse]] | None = None):
        self.inner = OfflineRuleModel()
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: Counter[tuple[str, str]] = Counter()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        key = (request.analyst, request.step)
        self.calls[key] += 1
        queue = self.script.get(key)
        if queue:
            return queue.pop(0)
        return self.inner.invoke(request)


def _start_job(deps: Deps, sqs: Any) -> tuple[str, AnalysisMessage, Delivery]:
    result = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}}), "m-1")
    r = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10,
                            MessageSystemAttributeNames=["All"])
    (m,) = r["Messages"]
    delivery = Delivery(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"], receive_count=1,
                        visibility_s=deps.settings.profile.queues.analysis_visibility_s)
    return result.job_id, AnalysisMessage.model_validate_json(m["Body"]), delivery  # type: ignore[return-value]  # a valid document always names its job


def _worker(deps: Deps, model: Any) -> ChunkWorker:
    return chunk_worker(deps, model, rng=random.Random(1), sleep=lambda s: None, call_safety_s=0.5)


def _aggregate(deps: Deps, sqs: Any) -> list[str]:
    outcomes = []
    r = sqs.receive_message(QueueUrl=deps.settings.results_queue_url, MaxNumberOfMessages=10)
    for m in r.get("Messages", []):
        outcomes.append(handle_result(deps, ResultMessage.model_validate_json(m["Body"])))
        sqs.delete_message(QueueUrl=deps.settings.results_queue_url, ReceiptHandle=m["ReceiptHandle"])
    return outcomes


def _commit_checkpoint(deps: Deps, job_id: str, chunk_id: str, analyst: str, config_hash: str) -> None:
    claim = deps.claims.claim(job_id, chunk_id, "earlier-worker", 30, 1)
    assert claim.won
    out = {"analyst": analyst, "status": "ok", "findings": [], "model_calls": 2}
    assert deps.claims.put_checkpoints(job_id, chunk_id, claim.fence,
                                       [CheckpointWrite(analyst=analyst, config_hash=config_hash,
                                                        status="ok", output_json=json.dumps(out))])
    deps.claims.release(job_id, chunk_id, claim.fence, AttemptStats(), None, failure=False)


def test_checkpointed_analyst_is_loaded_not_rerun(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    identity = analysis_identities(deps.settings, analysts_for(deps.settings.profile.review.analyst_count))["liability"]
    _commit_checkpoint(deps, job_id, msg.chunk_id, "liability", identity)
    model = ScriptedModel()
    assert _worker(deps, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 0  # loaded from the checkpoint
    assert model.calls[("disputes", "locate")] == 1
    assert _aggregate(deps, sqs) == ["completed"]


def test_checkpoint_from_another_model_or_prompt_is_not_reused(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    _commit_checkpoint(deps, job_id, msg.chunk_id, "liability", "hash-of-an-older-deploy")
    model = ScriptedModel()
    assert _worker(deps, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 1  # re-run with the current model/prompt
    stale = [e for e in deps.jobs.events(job_id) if e.type == "checkpoint.stale"]
    assert stale and stale[0].detail["analyst"] == "liability"
    assert _aggregate(deps, sqs) == ["completed"]
    assert_matches_fault_free(deps, job_id, TEXT)  # nothing of the stale (empty) checkpoint in the report


def test_out_of_lambda_time_hands_back_without_a_failure(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    delivery.remaining_ms = lambda: 300  # less than one call needs
    outcome = _worker(deps, ScriptedModel()).handle(msg, delivery)
    assert outcome.action == "requeued" and outcome.detail["reason"] == "runtime.time_exhausted"
    record = get_chunk(deps, job_id, msg.chunk_id)
    assert record.status == "pending" and record.failures == 0
    # nothing was checkpointed, so the fresh message is delayed (whole seconds, never 0), not immediate
    assert 1 <= int(outcome.detail["delay_s"] or 0) <= deps.settings.profile.recovery.throttle_max_delay_s
    assert sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10).get("Messages") is None
    r = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10,
                            WaitTimeSeconds=deps.settings.profile.recovery.throttle_max_delay_s + 1)
    fresh = [AnalysisMessage.model_validate_json(m["Body"]) for m in r.get("Messages", [])]
    assert [(f.chunk_id, f.reason, f.requeues, f.attempt) for f in fresh] == \
        [(msg.chunk_id, "runtime.time_exhausted", 1, 1)]


def test_refusal_of_an_optional_analyst_completes_with_the_gap_listed(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    model = ScriptedModel({("licensing", "locate"): [ModelResponse(text="", stop_reason="content_filtered")]})
    assert _worker(deps, model).handle(msg, delivery).action == "done"
    assert model.calls[("licensing", "locate")] == 1  # policy: fallback, not a retry
    assert _aggregate(deps, sqs) == ["completed"]
    report = report_json(deps, get_job(deps, job_id))
    assert report["coverage"]["optional_gaps"] == [
        {"chunk_id": msg.chunk_id, "chunk_index": 0, "analyst": "licensing", "status": "refused"}]
    # every other analyst's findings are exactly a fault-free run's
    check = assert_matches_fault_free(deps, job_id, TEXT, gaps=True)
    assert check.gaps == [(msg.chunk_id, "licensing", "refused")]


def test_refusal_of_a_mandatory_analyst_fails_the_job_naming_the_gap(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    model = ScriptedModel({("liability", "locate"): [ModelResponse(text="", stop_reason="guardrail_intervened")]})
    _worker(deps, model).handle(msg, delivery)
    assert _aggregate(deps, sqs) == ["failed"]
    job = get_job(deps, job_id)
    assert job.error_code == "job.chunks_missing"
    report = report_json(deps, job)
    assert [g["analyst"] for g in report["coverage"]["mandatory_gaps"]] == ["liability"]
    assert [(g.chunk_id, g.analyst) for g in job.mandatory_gaps] == [(msg.chunk_id, "liability")]


def test_invalid_output_gets_one_repair_with_the_error_fed_back(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    bad = ModelResponse(text='{"clauses": [{"category": "liability_cap", "quote": "not in the text"}]}',
                        stop_reason="end_turn")
    model = ScriptedModel({("liability", "locate"): [bad]})
    assert _worker(deps, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 2
    record = get_chunk(deps, job_id, msg.chunk_id)
    assert record.repairs == 1 and record.retries == {}  # counted apart from transient retries
    assert record.coverage["liability"] == "ok"
    assert _aggregate(deps, sqs) == ["completed"]
    assert_matches_fault_free(deps, job_id, TEXT)  # the repaired answer is the fault-free one


def test_invalid_output_twice_becomes_a_permanent_gap(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    bad = ModelResponse(text="{", stop_reason="end_turn")
    model = ScriptedModel({("indemnity", "locate"): [bad, bad]})
    _worker(deps, model).handle(msg, delivery)
    assert model.calls[("indemnity", "locate")] == 2
    assert get_chunk(deps, job_id, msg.chunk_id).coverage["indemnity"] == "failed"
    assert _aggregate(deps, sqs) == ["failed"]


def test_a_lapsed_claim_is_taken_over_and_the_old_token_is_rejected(deps, sqs):
    job_id, msg, _ = _start_job(deps, sqs)
    first = deps.claims.claim(job_id, msg.chunk_id, "a", lease_s=-1, receive_count=1)  # already lapsed
    second = deps.claims.claim(job_id, msg.chunk_id, "b", lease_s=30, receive_count=2)
    assert first.won and second.won and second.fence == first.fence + 1
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 0}
    assert not deps.claims.put_checkpoints(job_id, msg.chunk_id, first.fence,
                                           [CheckpointWrite(analyst="liability", config_hash="h",
                                                            status="ok", output_json=json.dumps(out))])
    assert deps.claims.checkpoints(get_chunk(deps, job_id, msg.chunk_id)) == {}  # nothing committed for the zombie
    assert deps.claims.finish(job_id, msg.chunk_id, first.fence, ChunkStatus.DONE, AttemptStats()) is None
    assert not deps.claims.heartbeat(job_id, msg.chunk_id, first.fence, 30)
    third = deps.claims.claim(job_id, msg.chunk_id, "c", lease_s=30, receive_count=3)
    assert not third.won and third.record is not None and third.record.claimed_by == "b"  # why it failed, without another read


def test_sweeper_requeues_a_lapsed_claim_and_dead_letters_after_the_poison_budget(deps, sqs):
    job_id, msg, _ = _start_job(deps, sqs)
    budget = get_profile("local").recovery.poison_budget
    for attempt in range(1, budget + 1):
        claim = deps.claims.claim(job_id, msg.chunk_id, f"w{attempt}", lease_s=-1, receive_count=1)
        assert claim.won
        report = sweep(deps)
        if attempt < budget:
            assert report.requeued == [msg.chunk_id]
            assert get_chunk(deps, job_id, msg.chunk_id).failures == attempt
        else:
            assert report.dead_lettered == [msg.chunk_id]
    record = get_chunk(deps, job_id, msg.chunk_id)
    assert record.status == "dead_lettered" and record.last_error is not None \
        and record.last_error.error_code == "runtime.worker_lost"
    assert _aggregate(deps, sqs) == ["dead_lettered"]
    job = get_job(deps, job_id)
    assert job.state == "dead_lettered" and [m.chunk_id for m in job.missing] == [msg.chunk_id]


# --- regressions from the failure-mode review --------------------------------------------------

def _start_long_job(deps: Deps, sqs: Any) -> tuple[str, list[tuple[AnalysisMessage, Delivery]]]:
    result = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}}), "m-long")
    count = get_job(deps, result.job_id).chunk_count
    assert 3 <= count <= 10, "the long text splits into several chunks (one receive takes them all)"
    out = []
    for _ in range(10):
        r = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10)
        for m in r.get("Messages", []):
            out.append((AnalysisMessage.model_validate_json(m["Body"]),
                        Delivery(m["MessageId"], m["ReceiptHandle"], 1, 60)))
        if len(out) == count:
            break
    return result.job_id, sorted(out, key=lambda x: x[0].chunk_index)  # type: ignore[return-value]  # a valid document always names its job


def _results(deps: Deps, sqs: Any) -> list[ResultMessage]:
    r = sqs.receive_message(QueueUrl=deps.settings.results_queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    return [ResultMessage.model_validate_json(m["Body"]) for m in r.get("Messages", [])]


def test_redelivery_of_a_settled_failed_chunk_resends_its_lost_result(deps, sqs):
    job_id, msg, delivery = _start_job(deps, sqs)
    claim = deps.claims.claim(job_id, msg.chunk_id, "crashed-before-send", 30, 1)
    env = ErrorEnvelope.of("model.request_invalid", "bad request")
    assert deps.claims.finish(job_id, msg.chunk_id, claim.fence, ChunkStatus.FAILED, AttemptStats(),
                              error=env)  # ...then the process died
    assert _results(deps, sqs) == []
    outcome = _worker(deps, ScriptedModel()).handle(msg, delivery)  # the message comes back
    assert outcome.action == "duplicate"
    (res,) = _results(deps, sqs)
    assert (res.chunk_id, res.status, res.error and res.error.error_code) == \
        (msg.chunk_id, "failed", "model.request_invalid")


def test_intake_redelivery_after_a_crash_resends_the_page_but_a_second_submission_does_not(deps, monkeypatch):
    body = json.dumps({"schema_version": 1, "document": {"text": TEXT}})
    real_advance = deps.jobs.advance_fanout

    def crash(job_id: str, from_count: int, to_count: int) -> bool:
        raise RuntimeError("killed after sending the page, before moving the fan-out cursor")

    monkeypatch.setattr(deps.jobs, "advance_fanout", crash)
    with pytest.raises(RuntimeError):
        handle_intake(deps, body, "msg-A")
    job = get_job(deps, job_id_for(document_hash(TEXT)))
    assert job.state == "running" and job.fanned_out == 0
    monkeypatch.setattr(deps.jobs, "advance_fanout", real_advance)
    again = handle_intake(deps, body, "msg-A")  # the same SQS message, redelivered after the crash
    assert get_job(deps, again.job_id).fanned_out == job.chunk_count == 1
    other = handle_intake(deps, body, "msg-B")  # a user submitting the same document again
    assert again.state == "running" and other.state == "running" and not other.created
    assert deps.queues.depth(Queue.ANALYSIS) == 2  # 1 chunk, sent by A and re-sent by A's redelivery only


def test_redrive_after_a_job_fatal_error_reopens_every_unfinished_chunk(deps, sqs):
    from contract_review.pipeline import redrive

    job_id, work = _start_long_job(deps, sqs)
    (m0, d0), (m1, _), *rest = work
    # chunk 1 is dead-lettered; chunk 0 then fails the whole job with a permanent access error
    c1 = deps.claims.claim(job_id, m1.chunk_id, "w", 30, 5)
    dead = deps.claims.finish(job_id, m1.chunk_id, c1.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(),
                              error=ErrorEnvelope.of("model.unavailable", "503"))
    deps.queues.dead_letter(Queue.ANALYSIS, m1.model_dump_json(), ErrorEnvelope.of("model.unavailable"))
    assert dead is not None
    denied = ScriptedModel()
    denied.invoke = lambda request: (_ for _ in ()).throw(  # type: ignore[method-assign]  # a scripted failure
        __import__("botocore.exceptions").exceptions.ClientError(
            {"Error": {"Code": "AccessDeniedException"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "Converse"))
    assert _worker(deps, denied).handle(m0, d0).action == "job_failed"
    for m, d in rest:  # the rest are skipped: the job has ended
        assert _worker(deps, ScriptedModel()).handle(m, d).action == "skipped"
    assert get_job(deps, job_id).state == "failed"
    # WHEN the operator fixes the grant and redrives the DLQ
    done = redrive.dlq_redrive(deps)
    assert [d.action for d in done] == [f"redriven ({len(work)} chunk(s) sent)"]
    job = get_job(deps, job_id)
    assert job.state == "running" and not counted(deps.claims, job) and not job.error_code
    # THEN every chunk runs again and the job completes
    r = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10)
    msgs = r["Messages"]
    assert sorted(AnalysisMessage.model_validate_json(m["Body"]).chunk_id for m in msgs) == \
        sorted(m.chunk_id for m, _ in work)
    for m in msgs:
        am = AnalysisMessage.model_validate_json(m["Body"])
        _worker(deps, ScriptedModel()).handle(am, Delivery(m["MessageId"], m["ReceiptHandle"], 1, 60))
    outcomes = []
    for _ in range(3):
        outcomes += _aggregate(deps, sqs)
    assert outcomes[-1] == "completed" and get_job(deps, job_id).state == "completed"
    assert_matches_fault_free(deps, job_id, LONG_TEXT)


def test_finalize_does_not_count_a_chunk_that_was_redriven_meanwhile(deps, sqs):
    from contract_review.pipeline.aggregator import finalize

    job_id, msg, _ = _start_job(deps, sqs)
    deps.jobs.settle_chunk(job_id, msg.chunk_id)  # counted, but the chunk record says pending (redriven)
    assert finalize(deps, get_job(deps, job_id)) == JobState.RUNNING
    job = get_job(deps, job_id)
    assert job.state == "running" and not counted(deps.claims, job)


# The sweeper's three writes on a lapsed lease, each fenced on the lease still being lapsed:
# requeue (release, a failure counted), dead-letter (finish, the poison budget used) and the
# function-timeout requeue (release, no failure).
SWEEPER_WRITES = {"requeue": (0, None), "dead-letter": (get_profile("local").recovery.poison_budget - 1, None),
                  "function-timeout": (0, "past")}


@pytest.mark.parametrize("path", SWEEPER_WRITES)
def test_sweeper_write_loses_to_a_heartbeat_that_landed_after_its_read(deps, sqs, monkeypatch, path):
    failures, deadline = SWEEPER_WRITES[path]
    job_id, msg, _ = _start_job(deps, sqs)
    for _ in range(failures):  # earlier attempts that failed
        lost = deps.claims.claim(job_id, msg.chunk_id, "earlier", lease_s=30, receive_count=1)
        deps.claims.release(job_id, msg.chunk_id, lost.fence, AttemptStats(), ErrorEnvelope.of("model.unavailable"),
                            failure=True)
    # GIVEN the owner's lease has lapsed (it stalled; for a Lambda, past its invocation's deadline)
    lease = deps.settings.profile.recovery.claim_lease_s
    deadline_at = deps.clock() - 1 - lease if deadline else None
    claim = deps.claims.claim(job_id, msg.chunk_id, "alive", lease_s=-1, receive_count=1, deadline_at=deadline_at)
    assert claim.won and claim.record is not None and claim.record.failures == failures
    # AND the owner's heartbeat lands exactly between the sweeper's read of the lapsed claims and its write
    read_lapsed = deps.claims.lapsed
    beats: list[bool] = []

    def lapsed_then_heartbeat(now: float) -> Any:
        seen = list(read_lapsed(now))
        beats.extend(deps.claims.heartbeat(r.job_id, r.chunk_id, r.fence, 30) is not None for r in seen)
        return iter(seen)

    monkeypatch.setattr(deps.claims, "lapsed", lapsed_then_heartbeat)
    # WHEN the sweeper runs
    report = sweep(deps)
    # THEN the heartbeat wins: nothing requeued, timed out or dead-lettered, the owner keeps its lease
    assert beats == [True], "the interleaving did not happen"
    assert (report.requeued, report.timed_out, report.dead_lettered) == ([], [], [])
    record = get_chunk(deps, job_id, msg.chunk_id)
    assert (record.status, record.claimed_by, record.fence, record.failures) == \
        ("claimed", "alive", claim.fence, failures)
    assert (record.claim_expires_at or 0) > deps.clock() + lease
    assert deps.queues.depth(Queue.ANALYSIS) == 1  # only the original, in flight: no second message
    assert deps.queues.depth(Queue.RESULTS) == 0  # nothing settled, nothing announced
    assert not [e for e in deps.jobs.events(job_id) if e.type in ("chunk.requeued", "chunk.dead_lettered")]
    # AND the next sweep (which explains the DLQ: a dead-letter decision writes its DLQ copy first)
    # leaves the live owner alone too
    monkeypatch.undo()
    again = sweep(deps)
    assert (again.requeued, again.timed_out, again.dead_lettered) == ([], [], [])
    assert get_chunk(deps, job_id, msg.chunk_id).status == "claimed"


def test_a_dlq_copy_older_than_a_redrive_does_not_dead_letter_the_chunk_again(deps, sqs):
    from contract_review.operate import dead_letters
    from contract_review.pipeline import redrive

    job_id, msg, _ = _start_job(deps, sqs)
    c = deps.claims.claim(job_id, msg.chunk_id, "w", 30, 5)
    deps.claims.finish(job_id, msg.chunk_id, c.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(),
                       error=ErrorEnvelope.of("model.unavailable"))
    for _ in range(2):  # two copies in the DLQ (e.g. the worker's and the queue's redrive)
        deps.queues.dead_letter(Queue.ANALYSIS, msg.model_dump_json(), ErrorEnvelope.of("model.unavailable"))
    first = dead_letters.dlq_list(deps)[0].message_id
    assert redrive.dlq_redrive(deps, {first})[0].action.startswith("redriven")
    report = sweep(deps)  # the other copy is still in the DLQ
    assert report.dead_lettered == []
    assert get_chunk(deps, job_id, msg.chunk_id).status == "pending"


def test_reconciler_recovers_a_job_whose_results_and_messages_were_lost(deps, sqs):
    job_id, work = _start_long_job(deps, sqs)
    (m0, d0), (m1, _), *_ = work
    # chunk 0 finished but its results message never reached the queue; the other chunks' messages are lost
    # (gone from the queue without a claim: a message still in flight would come back, and is not re-sent)
    _worker(deps, ScriptedModel()).handle(m0, d0)
    sqs.purge_queue(QueueUrl=deps.settings.results_queue_url)
    for _, d in work:
        sqs.delete_message(QueueUrl=deps.settings.analysis_queue_url, ReceiptHandle=d.receipt_handle)
    later = deps.clock() + deps.settings.profile.recovery.stall_after_s + 1
    report = sweep(deps, now=later)
    assert report.reconciled == [job_id]
    assert [r.chunk_id for r in _results(deps, sqs)] == [m0.chunk_id]
    r = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10)
    resent = {AnalysisMessage.model_validate_json(m["Body"]).chunk_id for m in r.get("Messages", [])}
    assert m1.chunk_id in resent and m0.chunk_id not in resent
    assert any(e.type == "job.reconciled" for e in deps.jobs.events(job_id))


def test_a_corrected_resubmission_replaces_a_job_that_failed_on_bad_input(deps):
    bad = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": "  "}, "idempotency_key": "K"}))
    assert bad.state == "failed" and get_job(deps, bad.job_id).error_code == "input.empty_document"
    good = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": "K"}))
    assert good.job_id == bad.job_id and good.created and get_job(deps, good.job_id).state == "running"
    # but a job that failed for another reason is never silently replaced
    job = get_job(deps, good.job_id)
    denied = ErrorEnvelope.of("model.access_denied")
    assert deps.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.FAILED,
                                outcome=JobFailure(error=denied, error_code=denied.error_code, ended_at=deps.clock()))
    again = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": TEXT}, "idempotency_key": "K"}))
    assert not again.created and again.state == "failed" and job.job_id == again.job_id


def test_large_analyst_output_is_checkpointed_in_s3_and_loaded_back(aws, deps, sqs):
    small = deps.settings.model_copy(
        update={"profile": deps.settings.profile.with_overrides(**{"checkpoint_inline_max_bytes": 10})})
    s3_deps = build_deps(small, local_session(aws.region), aws.endpoint)
    job_id, msg, delivery = _start_job(s3_deps, sqs)
    claim = s3_deps.claims.claim(job_id, msg.chunk_id, "w", 30, 1)
    out = {"analyst": "liability", "status": "ok", "findings": [], "model_calls": 2}
    identity = analysis_identities(small, analysts_for(small.profile.review.analyst_count))["liability"]
    assert s3_deps.claims.put_checkpoints(job_id, msg.chunk_id, claim.fence,
                                          [CheckpointWrite(analyst="liability", config_hash=identity,
                                                           status="ok", output_json=json.dumps(out))])
    (cp,) = s3_deps.claims.checkpoints(get_chunk(s3_deps, job_id, msg.chunk_id)).values()
    assert cp.output is None and (cp.output_key or "").startswith(f"checkpoints/{job_id}/")
    assert json.loads(s3_deps.claims.checkpoint_output(cp)) == out
    s3_deps.claims.release(job_id, msg.chunk_id, claim.fence, AttemptStats(), None, failure=False)
    model = ScriptedModel()
    assert _worker(s3_deps, model).handle(msg, delivery).action == "done"
    assert model.calls[("liability", "locate")] == 0  # resumed from the S3 checkpoint
