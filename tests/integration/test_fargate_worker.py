"""`-c worker=fargate`: the same core runs as long-running pollers (the ECS task of the template)."""

from __future__ import annotations

import json
import os
import signal

from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest

from .conftest import ONE_BY_ONE, get_chunk, wait_for, wait_jobs
from .test_recovery import _claimed_with_checkpoints, _doc, _pid


def test_fargate_pollers_review_and_recover_from_kill_9(tmp_path):
    from review_local.embedded import synth
    from review_local.stack import LocalStack

    # analysts one by one: with all 11 at once a chunk takes two call latencies, and there is no "half-way" to kill
    stack = LocalStack(worker="fargate", faults=FaultSpec(latency_ms=100), concurrency={"worker": 2, "sweeper": 0},
                       template=synth("local", {"worker": "fargate"}), state_dir=tmp_path,
                       extra_env={"worker": {"PROFILE_OVERRIDES": json.dumps(ONE_BY_ONE)}})
    stack.start()
    try:
        assert not any(r["Type"] == "AWS::Lambda::EventSourceMapping" and "Analysis" in str(r["Properties"])
                       for r in stack.template["Resources"].values())
        assert [b.spec.handler for b in stack.runtime.sandboxes if b.spec.name == "worker"] == \
            ["contract_review.handlers.poller.main"] * 2
        deps = stack.deps()
        job_id = submission.submit(deps, None, SubmitRequest.inline(_doc(3), document_id="fargate")).job_id
        victim = wait_for(lambda: _claimed_with_checkpoints(deps, job_id, 2), 60, 0.05, "a half-done chunk")
        os.kill(_pid(victim), signal.SIGKILL)
        lapsing = get_chunk(deps, job_id, victim.chunk_id)  # its lease as the killed poller last extended it
        assert lapsing.fence == victim.fence and lapsing.claim_expires_at is not None
        job = wait_jobs(deps, [job_id], timeout=90)[job_id]
        assert job.state == "completed"
        record = get_chunk(deps, job_id, victim.chunk_id)
        assert record.fence >= 2
        # no sweeper Lambda here: the pollers' own sweep found the lease lapsed and requeued the chunk (a lost
        # worker), and a poller claimed it after that. From the records, whatever the machine's load: requeued after
        # the lease expired, claimed after. (Which message the claim came on is not asserted: the poller's visibility
        # is 30 s, and on a loaded machine the killed poller's message can come back before the sweep's arrives;
        # either way the chunk is claimed only once the sweep released it.)
        requeues = [e for e in deps.jobs.events(job_id)
                    if e.type == "chunk.requeued" and e.detail["chunk_id"] == victim.chunk_id]
        assert requeues and requeues[0].detail["reason"] == "runtime.worker_lost", requeues
        assert lapsing.claim_expires_at <= requeues[0].at
        assert record.claimed_at is not None and requeues[0].at <= record.claimed_at
    finally:
        stack.stop()
