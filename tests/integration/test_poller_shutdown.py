"""The Fargate poller as ECS runs it: a real process, a fake ECS agent for scale-in protection, and a
real SIGTERM in the middle of a chunk (what a deployment or a task retirement sends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from contract_review.domain.ports import Deps
from contract_review.domain.records import ChunkStatus
from contract_review.pipeline.intake import handle_intake
from review_local.connect import local_deps
from review_local.embedded import FAKE_CREDENTIALS, EmbeddedAws
from review_local.runtime import function_specs

from ..fake_ecs_agent import FakeEcsAgent
from ..texts import LONG_TEXT
from .conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _poller(aws: EmbeddedAws, agent_uri: str, log: Path) -> subprocess.Popen[bytes]:
    (worker,) = [s for s in function_specs(aws, 1.0) if s.name == "worker"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({**worker.env, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": aws.endpoint, "AWS_DEFAULT_REGION": aws.region,
                "ECS_AGENT_URI": agent_uri, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT)])})
    with open(log, "wb") as out:  # the Dockerfile's CMD
        return subprocess.Popen([sys.executable, "-m", "contract_review.handlers.poller"], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)


def _claimed(deps: Deps, job_id: str) -> list[str]:
    return [c.chunk_id for c in deps.claims.for_job(job_id) if c.status is ChunkStatus.CLAIMED]


def test_sigterm_mid_chunk_releases_it_within_the_stop_timeout_and_nothing_is_lost(aws, tmp_path):
    deps = local_deps(aws.outputs, aws.region, aws.endpoint)
    text = "\n\n".join([LONG_TEXT] * 3)  # several chunks, processed one at a time
    job_id = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": text}}), "m-1").job_id
    assert job_id is not None
    chunks = len(deps.claims.for_job(job_id))
    assert chunks >= 4
    with FakeEcsAgent() as agent:
        proc = _poller(aws, agent.uri, tmp_path / "poller.log")
        try:
            # GIVEN the poller in the middle of a chunk (claimed, not settled)
            victim = wait_for(lambda: _claimed(deps, job_id), 60, 0.01, "a claimed chunk")[0]
            # WHEN ECS stops the task
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            code = proc.wait(timeout=deps.settings.profile.fargate.fargate_stop_timeout_s)  # else ECS SIGKILLs it
        finally:
            if proc.poll() is None:
                proc.kill()
        # THEN it exited cleanly, well within the stop timeout (no SIGKILL needed)
        log = (tmp_path / "poller.log").read_text()
        assert code == 0, log[-3000:]
        # ... holding nothing: no chunk is left claimed, and no attempt was counted as a failure
        records = deps.claims.for_job(job_id)
        assert not [c for c in records if c.status is ChunkStatus.CLAIMED]
        assert all(c.failures == 0 for c in records), [(c.chunk_id, c.failures) for c in records]
        # ... the chunk in hand was finished, or released through its checkpoints and requeued
        record = next(c for c in records if c.chunk_id == victim)
        if record.status is ChunkStatus.PENDING:
            released = [e for e in deps.jobs.events(job_id)
                        if e.type == "chunk.requeued" and e.detail.get("chunk_id") == victim]
            assert released and released[-1].detail.get("reason") == "runtime.time_exhausted", released
        else:
            assert record.status is ChunkStatus.DONE
        # ... and every unfinished chunk still has exactly one message waiting: nothing lost, nothing doubled
        pending = [c for c in records if c.status is ChunkStatus.PENDING]
        attrs = aws.client("sqs").get_queue_attributes(QueueUrl=deps.settings.analysis_queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        assert sum(int(v) for v in attrs.values()) == len(pending) > 0
        # ... and the task was protected from scale-in while busy, and gave the protection back on the way out
        assert agent.bodies[0] == {"ProtectionEnabled": True,
                                   "ExpiresInMinutes": deps.settings.profile.fargate.fargate_protection_minutes}
        assert agent.bodies[-1] == {"ProtectionEnabled": False}
        assert agent.requests[0][0] < sent  # protected before the signal, i.e. while the chunk was in hand
