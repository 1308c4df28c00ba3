"""Failure recovery on embedded AWS with real worker processes: crashes, zombies, duplicates,
faults, sustained throttling, permanent errors, dead letters and redrive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract_review.config.profile import get_profile
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import job_id_for
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import dead_letters, submission
from contract_review.operate.submission import SubmitRequest
from contract_review.review.chunking import chunk_document
from review_local.stack import LocalStack

from ..conftest import SAMPLES_DIR, cuad_texts
from ..oracle import assert_matches_fault_free, check_job, oracle_for
from .conftest import ONE_BY_ONE, calls_by, get_chunk, ledger, report_json, running_stack, wait_for, wait_jobs

LOCAL = get_profile("local")


def _doc(min_chunks: int, max_chunks: int = 8) -> str:
    """A document (CUAD if present, else our samples, whole or their first clauses) that splits into
    min..max chunks. Without ../shared (a bare clone) the samples alone must serve every size."""
    samples = [p.read_text() for p in sorted(SAMPLES_DIR.glob("*.txt"))]
    leading = [lead for t in samples for k in range(2, 60, 2)
               if len(lead := "\n\n".join(t.split("\n\n")[:k])) >= 2000]
    candidates = [t for _, t in cuad_texts()] + samples + leading
    for text in candidates:
        if min_chunks <= len(chunk_document(text, LOCAL.review)) <= max_chunks:
            return text
    raise AssertionError("no document of the wanted size")


def _claimed_with_checkpoints(deps: Deps, job_id: str, at_least: int) -> ChunkRecord | None:
    for c in deps.claims.for_job(job_id):
        if c.status == "claimed":
            cps = deps.claims.checkpoints(c)
            if len(cps) >= at_least:
                return c
    return None


def _pid(claim: ChunkRecord) -> int:
    assert claim.claimed_by is not None
    return int(claim.claimed_by.split(":")[1])


def _victim(make_stack: Callable[..., LocalStack], log: Path, latency_ms: int, min_chunks: int, checkpointed: int,
            name: str) -> tuple[LocalStack, Deps, str, str, ChunkRecord]:
    """Start 2 slowed-down workers on a document; return (stack, deps, job_id, the document, a claimed
    chunk with checkpoints)."""
    stack = make_stack(FaultSpec(latency_ms=latency_ms, call_log=str(log)), {"worker": 2}, ONE_BY_ONE)
    deps = stack.deps()
    text = _doc(min_chunks)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=name)).job_id
    victim = wait_for(lambda: _claimed_with_checkpoints(deps, job_id, checkpointed), 60, 0.05,
                      f"a claimed chunk with {checkpointed} checkpoints")
    return stack, deps, job_id, text, victim


def test_kill_9_mid_chunk_resumes_from_checkpoints_within_lease_plus_sweep(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    _, deps, job_id, text, victim = _victim(make_stack, log, 120, 3, 3, "kill")
    pid = _pid(victim)
    os.kill(pid, signal.SIGKILL)
    chunk_id = victim.chunk_id
    # what the killed attempt had written of its running spend (its last heartbeat or commit): all that survives it
    (killed,) = [c for c in deps.claims.for_job(job_id)
                 if c.status == "claimed" and (c.claimed_by or "").count(":") == 2 and _pid(c) == pid]
    survives = killed.spend[str(killed.fence)]
    done_before_kill = set(deps.claims.checkpoints(get_chunk(deps, job_id, chunk_id)))
    assert len(done_before_kill) >= 3

    job = wait_jobs(deps, [job_id], timeout=90)[job_id]
    assert job.state == "completed"
    record = get_chunk(deps, job_id, chunk_id)
    assert record.status == "done" and record.fence >= 2 and record.failures >= 1
    # analysts checkpointed before the crash were loaded, not called again
    after = [e for e in ledger(log) if e["chunk_id"] == chunk_id and e["pid"] != pid]
    rerun = {e["analyst"] for e in after} & done_before_kill
    assert not rerun, f"checkpointed analysts re-run after the crash: {rerun}"
    assert {e["analyst"] for e in after}, "the remaining analysts ran on the new owner"
    # recovery came from lease + sweep, not from the visibility timeout, read from the records whatever the
    # machine's load: the sweeper requeued the chunk as a lost worker's once its lease (as the killed attempt last
    # extended it) had lapsed, and a worker claimed it on that fresh message, not on the killed attempt's message
    # back after its visibility timeout (how long a sweep takes on this machine is bench/'s to measure)
    requeues = [e for e in deps.jobs.events(job_id) if e.type == "chunk.requeued" and e.detail["chunk_id"] == chunk_id]
    assert requeues and requeues[0].detail["reason"] == "runtime.worker_lost"
    assert killed.claim_expires_at is not None and killed.claim_expires_at <= requeues[0].at
    assert record.claimed_at is not None and requeues[0].at <= record.claimed_at
    assert record.last_receive_count == 1
    # and the report is exactly that of a run without the crash
    assert_matches_fault_free(deps, job_id, text)
    # the job's tokens are the tokens the model answered (the double's usage log), but for those the killed attempt
    # answered after its last write of its running spend (it used to lose all of its attempt's)
    assert survives.input_tokens > 0
    answered = [e for e in ledger(log) if e["outcome"] == "ok"]
    killed_attempt = [e for e in answered if e["pid"] == pid and e["chunk_id"] == killed.chunk_id
                      and e["started_at"] >= (killed.claimed_at or 0)]
    final = deps.jobs.get(job_id)
    assert final is not None
    for f in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        rest = sum(e[f] for e in answered) - sum(e[f] for e in killed_attempt)
        assert getattr(final, f) == rest + getattr(survives, f), f


def _partly_checkpointed(deps: Deps, job_id: str) -> ChunkRecord | None:
    """A claimed chunk some of whose analysts are checkpointed and some not (others still mid-call)."""
    for c in deps.claims.for_job(job_id):
        if c.status == "claimed" and 1 <= len(deps.claims.checkpoints(c)) < LOCAL.review.analyst_count:
            return c
    return None


def test_kill_9_with_every_analyst_at_once_resumes_from_checkpoints(make_stack, tmp_path):
    """The deployed analyst concurrency (all 11 at once, not one by one): a worker killed while some of a chunk's
    analysts are checkpointed and the others are mid-call. The new owner loads the checkpointed ones and runs only
    the rest; the report is the fault-free one. A lognormal latency spreads the analysts' ends apart."""
    assert LOCAL.review.analyst_concurrency == LOCAL.review.analyst_count == 11  # the workers' own profile
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_median_ms=300, latency_p99_ms=2000, call_log=str(log)), {"worker": 2})
    deps = stack.deps()
    text = _doc(3)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="kill-11")).job_id
    victim = wait_for(lambda: _partly_checkpointed(deps, job_id), 90, 0.02, "a chunk half-way through its analysts")
    pid = _pid(victim)
    os.kill(pid, signal.SIGKILL)
    done_before_kill = set(deps.claims.checkpoints(get_chunk(deps, job_id, victim.chunk_id)))
    assert 1 <= len(done_before_kill) < LOCAL.review.analyst_count

    job = wait_jobs(deps, [job_id], timeout=120)[job_id]
    assert job.state == "completed"
    record = get_chunk(deps, job_id, victim.chunk_id)
    assert record.status == "done" and record.fence >= 2 and record.failures >= 1
    after = [e for e in ledger(log) if e["chunk_id"] == victim.chunk_id and e["pid"] != pid]
    assert not {e["analyst"] for e in after} & done_before_kill, "checkpointed analysts ran again after the kill"
    rest = set(deps.claims.checkpoints(record)) - done_before_kill
    assert {e["analyst"] for e in after} and {e["analyst"] for e in after} <= rest, "the new owner ran the rest"
    assert_matches_fault_free(deps, job_id, text)


def test_zombie_worker_cannot_write_after_losing_its_lease(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    stack, deps, job_id, text, victim = _victim(make_stack, log, 150, 2, 1, "zombie")
    pid, chunk_id, old_fence = _pid(victim), victim.chunk_id, victim.fence
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        wait_for(lambda: (c := deps.claims.get(job_id, chunk_id)) is not None and c.status == "done", 60, 0.1,
                 "the new owner to finish the chunk")
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    job = wait_jobs(deps, [job_id], timeout=60)[job_id]
    assert job.state == "completed"
    # a wait, not a bound: a resumed process on a machine running two suites took over 60 s to get there
    wait_for(lambda: any(e.type == "chunk.lease_lost" for e in deps.jobs.events(job_id)), 180, 0.2,
             "the zombie to notice it lost the lease")
    record = get_chunk(deps, job_id, chunk_id)
    assert record.fence > old_fence
    assert record.findings_key is not None and record.findings_key.endswith(f"/{record.fence}.json")
    # nothing the zombie did after resuming reached the results or the checkpoints
    s3 = stack.aws.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=deps.settings.bucket,
                                                 Prefix=f"findings/{job_id}/").get("Contents", [])]
    assert not [k for k in keys if chunk_id in k and k.endswith(f"/{old_fence}.json")]
    for cp in deps.claims.checkpoints(get_chunk(deps, job_id, chunk_id)).values():
        assert cp.fence > old_fence or cp.created_at < stopped_at
    lost = [e for e in deps.jobs.events(job_id) if e.type == "chunk.lease_lost"]
    assert lost[0].detail["fence"] == old_fence and lost[0].at >= resumed_at - 0.5
    report = report_json(deps, job)
    winner = json.loads(deps.artifacts.get_text(record.findings_key))["findings"]
    assert [f for f in report["findings"] if f["chunk_id"] == chunk_id] == winner
    assert_matches_fault_free(deps, job_id, text)


def test_same_message_delivered_twice_at_once_has_one_claim_winner(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_ms=40, call_log=str(log)), {"worker": 0})
    deps = stack.deps()
    text = _doc(1, 1)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="dup")).job_id
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == 1, 30, what="the chunk message")
    sqs = stack.aws.client("sqs")
    msg = sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, VisibilityTimeout=0)["Messages"][0]
    sqs.send_message(QueueUrl=deps.settings.analysis_queue_url, MessageBody=msg["Body"])  # the duplicate
    stack.runtime.scale("worker", 2)
    job = wait_jobs(deps, [job_id], timeout=60)[job_id]
    assert job.state == "completed"
    (record,) = deps.claims.for_job(job_id)
    assert record.receives == 1 and record.fence == 1  # exactly one claim won
    # model calls equal the calls one clean run of the chunk needs
    (clean,) = oracle_for(text, LOCAL)
    assert len(ledger(log)) == clean.model_calls == record.n_calls
    assert [e.type for e in deps.jobs.events(job_id)].count("job.completed") == 1
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == 0, 20, what="both messages acknowledged")
    assert_matches_fault_free(deps, job_id, text)


def test_every_chunk_message_delivered_twice_settles_each_chunk_once(make_stack, tmp_path):
    # GIVEN a several-chunk document whose every analysis message is in the queue twice
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(latency_ms=20, call_log=str(log)), {"worker": 0})
    deps = stack.deps()
    text = _doc(3, 5)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="dup-all")).job_id
    n = len(oracle_for(text, LOCAL))
    assert n <= LOCAL.fanout.fanout_window  # the whole document is fanned out at once
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == n, 30, what="the chunk messages")
    sqs = stack.aws.client("sqs")
    bodies: dict[str, str] = {}
    while len(bodies) < n:
        for m in sqs.receive_message(QueueUrl=deps.settings.analysis_queue_url, MaxNumberOfMessages=10,
                                     VisibilityTimeout=0).get("Messages", []):
            bodies[m["MessageId"]] = m["Body"]
    for body in bodies.values():
        sqs.send_message(QueueUrl=deps.settings.analysis_queue_url, MessageBody=body)
    # WHEN two workers take them (a copy arrives while its chunk is claimed, or after it settled)
    stack.runtime.scale("worker", 2)
    job = wait_jobs(deps, [job_id], timeout=90)[job_id]
    # THEN each chunk was claimed and run once, and the report is exactly a fault-free run's
    assert job.state == "completed"
    assert [c.fence for c in deps.claims.for_job(job_id)] == [1] * n
    assert len(ledger(log)) == sum(c.model_calls for c in oracle_for(text, LOCAL))
    assert_matches_fault_free(deps, job_id, text)
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS) == 0, 20, what="every copy acknowledged")


def test_five_percent_transient_faults_over_ten_documents_all_complete(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(seed=11, transient_rate=0.05, call_log=str(log)), {"worker": 4})
    deps = stack.deps()
    # ten documents of about 3.5 KB each: every 40th paragraph of our samples (a quarter of them in all), twelve
    # chunks, over 250 model calls: about 13 of them fail (none at all: a chance of about one in a million)
    paras = "\n\n".join(p.read_text() for p in sorted(SAMPLES_DIR.glob("*.txt"))).split("\n\n")
    docs = ["\n\n".join(paras[i::40]) for i in range(10)]
    jobs = [submission.submit(deps, None, SubmitRequest.inline(t, document_id=f"doc{i}")).job_id for i, t in enumerate(docs)]
    ended = wait_jobs(deps, jobs, timeout=240)
    assert {j.state for j in ended.values()} == {"completed"}
    for job_id, text in zip(jobs, docs):
        assert_matches_fault_free(deps, job_id, text)
    retries: Counter[str] = Counter()
    for j in ended.values():
        assert j.reliability is not None
        retries.update(j.reliability.retries_by_code)
    failed_calls = Counter(e["outcome"] for e in ledger(log) if e["outcome"] != "ok")
    assert sum(failed_calls.values()) > 0, "5 % of calls should have failed"
    assert set(retries) <= {"model.throttled", "model.unavailable", "model.timeout"}
    assert sum(retries.values()) > 0
    # every failed call was either retried in tier 1 or handed to tier 2 (never lost)
    assert sum(retries.values()) <= sum(failed_calls.values())
    assert deps.queues.depth(Queue.ANALYSIS_DLQ) == 0


def test_sustained_throttling_never_dead_letters(make_stack, tmp_path):
    quota_dir = tmp_path / "quota"
    # analysts one by one: 44 analysts at once against 2 calls/s can leave a chunk without a checkpoint for
    # the local profile's 20 s backpressure deadline on a loaded machine (a deadline test, not this one)
    stack = make_stack(FaultSpec(throttle_quota_per_s=2, throttle_state_dir=str(quota_dir)),
                       {"worker": 4}, worker_profile={"analyst_concurrency": 1})
    deps = stack.deps()
    text = _doc(2, 3)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="throttled")).job_id
    job = wait_jobs(deps, [job_id], timeout=180)[job_id]
    assert job.state == "completed"
    requeues = Counter(e.detail["chunk_id"] for e in deps.jobs.events(job_id)
                       if e.type == "chunk.requeued" and e.detail["reason"] == "model.throttled")
    # a chunk was throttled more often than the receive count allows (tier-1 retries plus requeues), yet nothing
    # was dead-lettered: throttling is backpressure, not failure. (At least one chunk, not each: how often each is
    # throttled depends on how fast this machine lets the workers call; a loaded one throttles fewer of them.)
    throttled = {c.chunk_id: c.retries.get("model.throttled", 0) + requeues[c.chunk_id]
                 for c in deps.claims.for_job(job_id)}
    assert max(throttled.values()) > LOCAL.queues.max_receive_count, throttled
    assert sum(requeues.values()) >= 1, "tier 1 gave up at least once and the chunk was requeued with a delay"
    for queue in (Queue.ANALYSIS_DLQ, Queue.RESULTS_DLQ):
        assert deps.queues.depth(queue) == 0
    for c in deps.claims.for_job(job_id):
        assert c.failures == 0 and c.status == "done"
    assert_matches_fault_free(deps, job_id, text)


def test_permanent_model_error_fails_the_job_on_first_attempt(make_stack, tmp_path):
    log = tmp_path / "calls.jsonl"
    stack = make_stack(FaultSpec(permanent_code="AccessDeniedException", call_log=str(log)), {"worker": 2})
    deps = stack.deps()
    text = _doc(3)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="denied")).job_id
    job = wait_jobs(deps, [job_id], timeout=60)[job_id]
    assert job.state == "failed" and job.error_code == "model.access_denied"
    # ended by a job-fatal error: no report, nothing silently lost, the code says why
    check = check_job(deps, job_id, text)
    assert (check.state, check.error_code, check.problems) == ("failed", "model.access_denied", [])
    time.sleep(2)  # give any (wrong) retry a chance to show up
    # each call made once (the analysts of a chunk start at once, so each chunk has several first calls)
    calls = calls_by(ledger(log), "chunk_id", "analyst", "step")
    assert calls and max(calls.values()) == 1, f"a permanent error was retried: {calls}"
    assert all(c.receives <= 1 for c in deps.claims.for_job(job_id))
    types = [e.type for e in deps.jobs.events(job_id)]
    assert "job.completed" not in types and types.count("job.failed") == 1
    assert deps.queues.depth(Queue.ANALYSIS_DLQ) == 0


def test_always_failing_chunk_dead_letters_then_redrive_completes(make_stack, tmp_path):
    switch = tmp_path / "faults-on"
    switch.touch()
    # tier 2 backs off one second after each failed attempt (the local profile's 1, 1-2, 2-4, 4-8 s: 8-15 s until the
    # budget is spent): the dead letter and its redrive are the point here, not the backoff's growth
    stack = make_stack(FaultSpec(always_fail_chunk="1", switch_file=str(switch)), {"worker": 2},
                       worker_profile={"tier2_backoff_base_s": 1.0, "tier2_backoff_max_s": 1.0})
    local_json = tmp_path / "local.json"
    stack.write_local_json(local_json)
    deps = stack.deps()
    text = _doc(3)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="poison-chunk")).job_id
    job = wait_jobs(deps, [job_id], timeout=120)[job_id]
    assert job.state == "dead_lettered"
    # the report holds every other chunk's findings exactly, and lists chunk 1 as missing with its code
    check = check_job(deps, job_id, text)
    assert check.problems == [] and check.missing_listed == [(job.missing[0].chunk_id, "model.unavailable")]
    assert 0 < check.findings == check.expected
    assert [m.chunk_index for m in job.missing] == [1]
    error = job.missing[0].error
    assert error is not None and error.error_code == "model.unavailable"
    bad = next(c for c in deps.claims.for_job(job_id) if c.chunk_index == 1)
    assert bad.status == "dead_lettered" and bad.failures == LOCAL.recovery.poison_budget
    assert bad.receives == LOCAL.queues.max_receive_count  # one claim per receive until the budget ran out
    wait_for(lambda: deps.queues.depth(Queue.ANALYSIS_DLQ) == 1, 10, what="the DLQ message")

    env = {**os.environ, "REVIEW_LOCAL_JSON": str(local_json)}
    review = [sys.executable, "-m", "review_local.cli"]
    listed = json.loads(subprocess.run(review + ["dlq", "list", "--json"], env=env, capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    (entry,) = listed
    assert entry["job_id"] == job_id and entry["chunk"]["chunk_index"] == 1
    shown = subprocess.run(review + ["dlq", "show", entry["message_id"]], env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    envelope = json.loads(shown)["envelope"]
    assert envelope["error_code"] == "model.unavailable" and envelope["error_class"] == "transient"
    assert envelope["http_status"] == 503 and envelope["provider_code"] == "ServiceUnavailableException"
    assert envelope["step"] and envelope["attempt"] >= 1

    switch.unlink()  # the fault is fixed
    out = subprocess.run(review + ["dlq", "redrive", "--all"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = wait_for(lambda: (j := deps.jobs.get(job_id)) and j.state == "completed" and j, 60, 0.3,
                   "the redriven job to complete")
    assert not job.missing
    assert deps.queues.depth(Queue.ANALYSIS_DLQ) == 0
    assert any(e.type == "dlq.redriven" for e in deps.jobs.events(job_id))
    assert_matches_fault_free(deps, job_id, text)


@pytest.fixture(scope="class")
def intake_stack(request: pytest.FixtureRequest, local_template: dict[str, Any],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One stack, as `review up` starts it, for the poison-intake cases: each sends its own message (its own key)
    and reads only what that message left (the dead letters there before it are counted first)."""
    with running_stack(request, local_template, tmp_path_factory.mktemp("intake-stack")) as s:
        yield s


class TestPoisonIntake:
    @pytest.mark.parametrize("body,code", [
        ("{not json", "input.invalid"),
        # no key to be told: no idempotency_key, no inline text to hash, no document_id
        (json.dumps({"schema_version": 2, "document": {"s3_uri": "s3://bucket/uploads/x.txt"}}), "input.invalid"),
    ])
    def test_poison_intake_without_job_goes_to_dlq_on_first_attempt(self, intake_stack, body, code):
        deps = intake_stack.deps()
        before = dead_letters.dlq_list(deps)
        deps.queues.send_intake(body)
        wait_for(lambda: deps.queues.depth(Queue.INTAKE_DLQ) == len(before) + 1, 20,
                 what="the envelope in the intake DLQ")
        # acknowledged, not retried (the sandbox deletes it just after the handler returns)
        wait_for(lambda: deps.queues.depth(Queue.INTAKE) == 0, 5, 0.05, "the poison message to be acknowledged")
        listed = dead_letters.dlq_list(deps)
        (item,) = [i for i in listed if i not in before]
        assert len(listed) == len(before) + 1
        assert item.queue == "intake" and item.error_code == code
        assert item.envelope is not None and item.envelope.error_class == "permanent"
        # the listing can be matched to the sent message, and looking again changes nothing
        assert item.source_message_id and item.source_message_id != item.message_id
        assert (item.attempts, item.failed_step, item.moved_by) == (1, "intake.parse", "pipeline")
        assert dead_letters.dlq_list(deps) == listed

    @pytest.mark.parametrize("document,code", [
        ({"text": "   \n  "}, "input.empty_document"),
        ({"s3_uri": "s3://{bucket}/uploads/never-uploaded.txt"}, "input.document_missing"),
        ({"s3_uri": "s3://no-such-bucket-here/uploads/contract.txt"}, "input.document_forbidden"),
        ({"text": "fine", "extra": 1}, "input.invalid"),
    ])
    def test_poison_intake_with_a_key_fails_its_job_in_one_attempt(self, intake_stack, document, code):
        deps = intake_stack.deps()
        dead_before = deps.queues.depth(Queue.INTAKE_DLQ)
        body = json.dumps({"schema_version": 1, "document": document, "idempotency_key": f"key-{code}"})
        body = body.replace("{bucket}", deps.artifacts.bucket)  # the stack's own bucket
        deps.queues.send_intake(body)
        job = wait_jobs(deps, [job_id_for(f"key-{code}")], timeout=20)[job_id_for(f"key-{code}")]
        assert job.state == "failed" and job.error_code == code
        wait_for(lambda: deps.queues.depth(Queue.INTAKE) == 0, 5, 0.05, "the poison message to be acknowledged")
        assert deps.queues.depth(Queue.INTAKE_DLQ) == dead_before


def test_heartbeat_keeps_a_chunk_longer_than_its_lease(make_stack, tmp_path):
    # every chunk takes several leases to finish (>= 13 calls x 0.4 s vs a 3 s lease)
    stack = make_stack(FaultSpec(latency_ms=400), {"worker": 2}, ONE_BY_ONE)
    deps = stack.deps()
    text = _doc(2, 2)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="slow")).job_id
    wait_jobs(deps, [job_id], timeout=90)
    assert_matches_fault_free(deps, job_id, text)  # completed, and its report is a fault-free run's
    for c in deps.claims.for_job(job_id):
        assert c.fence == 1 and c.receives == 1, c  # nobody took it over
        assert c.settled_at is not None and c.claimed_at is not None, c
        assert c.settled_at - c.claimed_at > LOCAL.recovery.claim_lease_s
    assert not [e for e in deps.jobs.events(job_id) if e.type in ("chunk.requeued", "chunk.lease_lost")]
