"""Time and outages on embedded AWS with real worker processes (local profile, whose numbers are
the prod ones scaled to seconds): a chunk slower than its Lambda completes across invocations; the
sweeper tells a Lambda killed at its timeout from a crash; a 5xx burst shorter than the poison
budget's span dead-letters nothing. (Throttling past the backpressure deadline is tested against
the fakes in tests/unit/pipeline/test_worker.py, with the local and prod numbers; the repositories' part of
it, the streak on the chunk record, in test_repositories.py.)"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract_review.config.profile import get_profile
from contract_review.domain.ports import Queue
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.review.analysts import analysts_for
from review_local.stack import LocalStack

from ..oracle import assert_matches_fault_free
from .conftest import ONE_BY_ONE, calls_by, get_chunk, ledger, wait_for, wait_jobs
from .test_recovery import _doc

LOCAL = get_profile("local")
WORKER_HANDLER = "contract_review.handlers.worker.handler"


def with_worker_timeout(template: dict[str, Any], seconds: int) -> dict[str, Any]:
    """The local template with a shorter worker function timeout (the sandboxes read it from there)."""
    patched = copy.deepcopy(template)
    (fn,) = [r for r in patched["Resources"].values()
             if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == WORKER_HANDLER]
    fn["Properties"]["Timeout"] = seconds
    return patched


@pytest.fixture
def short_lambda_stack(local_template: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., LocalStack]]:
    """A fresh local stack whose worker Lambda times out after `timeout_s`."""
    stacks: list[LocalStack] = []

    def _make(timeout_s: int, faults: FaultSpec) -> LocalStack:
        # analysts one by one: a chunk slower than its Lambda (all at once, it takes two call latencies)
        stack = LocalStack(faults=faults, concurrency={"worker": 1},
                           template=with_worker_timeout(local_template, timeout_s),
                           state_dir=tmp_path / f"stack{len(stacks)}",
                           extra_env={"worker": {"PROFILE_OVERRIDES": json.dumps(ONE_BY_ONE)}})
        stacks.append(stack)
        return stack.start()

    yield _make
    for s in stacks:
        s.stop()


def _events(stack: LocalStack, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in stack.deps().jobs.events(job_id) if e.type == kind]


def test_a_chunk_slower_than_its_lambda_completes_across_invocations_without_a_failure(short_lambda_stack, tmp_path):
    # GIVEN a 4 s worker Lambda (room for about three analysts: each needs 2 x 1 s + 0.5 s before it
    # starts) and model calls of 0.3 s: one chunk needs ~6 s of calls
    log = tmp_path / "calls.jsonl"
    stack = short_lambda_stack(4, FaultSpec(latency_ms=300, call_log=str(log)))
    deps = stack.deps()
    text = _doc(1, 1)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="slow-chunk")).job_id
    # WHEN the job runs
    job = wait_jobs(deps, [job_id], timeout=60)[job_id]
    # THEN it completed; the chunk was handed back through its checkpoints several times, never failed
    assert job.state == "completed"
    (chunk,) = deps.claims.for_job(job_id)
    assert chunk.status == "done" and chunk.failures == 0
    handoffs = _events(stack, job_id, "chunk.requeued")
    assert len(handoffs) >= 2 and {d["reason"] for d in handoffs} == {"runtime.time_exhausted"}
    # the worker hands the chunk back itself; on a starved CPU an invocation can still reach its timeout
    # between its last time check and the handback, and then the sweeper releases it as timed out, not
    # failed (as Lambda's kill at the timeout is on AWS): at least one handback is the worker's own
    killed = [d for d in handoffs if d.get("by") == "sweeper"]
    assert len(killed) < len(handoffs)
    assert chunk.receives == len(handoffs) + 1
    # AND every analyst step was called across the invocations: exactly once unless an invocation was
    # killed at its timeout, which may repeat the one step it was in (its checkpoint not yet written)
    calls = calls_by(ledger(log), "analyst", "step")
    assert {a for a, _ in calls} == {s.name for s in analysts_for(LOCAL.review.analyst_count)}
    repeated = [step for step, n in calls.items() if n > 1]
    assert len(repeated) <= len(killed), repeated
    assert deps.jobs.get(job_id).requeues == len(handoffs)  # type: ignore[union-attr]
    assert_matches_fault_free(deps, job_id, text)  # the handoffs changed nothing in the report


def test_the_sweeper_tells_a_function_timeout_from_a_crash(make_stack):
    # GIVEN two chunks held by Lambda invocations that vanished (no worker runs here, only the
    # sweeper): chunk 0's invocation heartbeat up to its deadline (Lambda killed it at its timeout;
    # with the worker's time checks no call outlives an invocation, so the stack cannot produce
    # this by itself), chunk 1's stopped heartbeating long before its deadline (a crash)
    stack = make_stack(None, {"worker": 0})
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(_doc(2, 3), document_id="vanished")).job_id
    # intake makes the job `running`, then writes its first page of chunk records: wait for those
    wait_for(lambda: len(deps.claims.for_job(job_id)) >= 2, 20, 0.2, "intake to write the chunk records")
    first, second = deps.claims.for_job(job_id)[:2]
    lease = LOCAL.recovery.claim_lease_s
    now = deps.clock()
    timed_out = deps.claims.claim(job_id, first.chunk_id, "lambda-a", lease, 1, deadline_at=now + 1.0)
    crashed = deps.claims.claim(job_id, second.chunk_id, "lambda-b", lease, 1, deadline_at=now + 60.0)
    assert timed_out.won and crashed.won
    time.sleep(1.0)
    assert deps.claims.heartbeat(job_id, first.chunk_id, timed_out.fence, lease)  # its last beat, at the deadline
    # WHEN the sweeper finds both leases lapsed
    by_sweeper = lambda: [d for d in _events(stack, job_id, "chunk.requeued") if d.get("by") == "sweeper"]  # noqa: E731
    wait_for(lambda: len(by_sweeper()) == 2, 20, 0.2, "the sweeper to requeue both chunks")
    # THEN the timed-out chunk is released without a failure (a delayed fresh message), the crashed
    # one with a failed attempt
    reasons = {d["chunk_id"]: (d["reason"], d.get("delay_s")) for d in by_sweeper()}
    assert reasons[first.chunk_id][0] == "runtime.time_exhausted" and reasons[first.chunk_id][1] >= 1
    assert reasons[second.chunk_id] == ("runtime.worker_lost", None)
    a, b = get_chunk(deps, job_id, first.chunk_id), get_chunk(deps, job_id, second.chunk_id)
    assert (a.status, a.failures, a.backpressure_requeues) == ("pending", 0, 1)
    assert (b.status, b.failures) == ("pending", 1)
    assert deps.jobs.get(job_id).requeues == 1  # type: ignore[union-attr]


def test_a_5xx_burst_shorter_than_the_poison_budget_dead_letters_nothing(make_stack, tmp_path):
    # GIVEN a model failing every call with 5xx for 4 s: the local poison budget spans at least
    # 1 + 1 + 2 + 4 = 8 s of tier-2 backoff (prod: a two-minute burst against 225 s)
    switch = tmp_path / "outage"
    switch.touch()
    stack = make_stack(FaultSpec(always_fail_chunk="0", switch_file=str(switch)), {"worker": 1})
    deps = stack.deps()
    text = _doc(1, 1)
    job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id="outage")).job_id
    wait_for(lambda: _events(stack, job_id, "chunk.retry"), 60, 0.1, "the first failed attempt")  # a wait, not a bound
    time.sleep(4.0)
    switch.unlink()  # the outage is over, 4 s after the first failed attempt
    # WHEN the job runs on
    job = wait_jobs(deps, [job_id], timeout=60)[job_id]
    # THEN it completed: the burst cost failed attempts within the budget, nothing was dead-lettered
    assert job.state == "completed"
    (chunk,) = deps.claims.for_job(job_id)
    assert 1 <= chunk.failures < LOCAL.recovery.poison_budget and chunk.status == "done"
    retries = _events(stack, job_id, "chunk.retry")
    assert [r["failures"] for r in retries] == list(range(1, len(retries) + 1)) == list(range(1, chunk.failures + 1))
    assert all(r["backoff_s"] >= 1 for r in retries)
    assert deps.queues.depth(Queue.ANALYSIS_DLQ) == 0
    assert_matches_fault_free(deps, job_id, text)
