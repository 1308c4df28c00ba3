"""The metrics the alarms and the dashboard read (infra/monitoring.py), as the handlers publish them:
Powertools EMF lines on stdout, against the in-memory fakes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_lambda_powertools import Metrics

from contract_review.domain.keys import document_key
from contract_review.domain.messages import ResultMessage
from contract_review.domain.records import ChunkStatus
from contract_review.handlers import aggregator as aggregator_handler
from contract_review.handlers import sweeper as sweeper_handler
from contract_review.handlers.telemetry import record_attempt
from contract_review.reliability.retry import RetryStats
from review_local.sandbox import LambdaContext, sqs_event

from ..fakes import FakeWorld
from ..scenarios import running_job, settle_done


def _emf(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


def _values(lines: list[dict[str, Any]], name: str) -> list[tuple[dict[str, str], float]]:
    """(dimensions, value) of every datapoint of metric `name`."""
    out = []
    for line in lines:
        for directive in line["_aws"]["CloudWatchMetrics"]:
            if any(m["Name"] == name for m in directive["Metrics"]):
                assert directive["Namespace"] == "ContractReview"
                dims = {d: line[d] for ds in directive["Dimensions"] for d in ds}
                out += [(dims, v) for v in (line[name] if isinstance(line[name], list) else [line[name]])]
    return out


@pytest.fixture
def handlers_read_world(world: FakeWorld, monkeypatch: pytest.MonkeyPatch) -> FakeWorld:
    """The sweeper and aggregator handlers run on `world`, publishing in the namespace they have on AWS."""
    w = world
    # Powertools' Metrics instances of one process share their metric and dimension sets (the class's): what an
    # earlier test left there (its `service`) is not this test's. A Lambda process imports one handler only.
    sweeper_handler.metrics.clear_metrics()
    for module in (sweeper_handler, aggregator_handler):
        monkeypatch.setattr(module, "deps", lambda: w.deps)
        monkeypatch.setattr(module.metrics, "namespace", "ContractReview")  # POWERTOOLS_METRICS_NAMESPACE on AWS
    return w


def _ctx(name: str, timeout_s: int = 60) -> LambdaContext:
    """An invocation of `timeout_s` (the sweeper's and the aggregator's timeout in the profiles)."""
    return LambdaContext(name, 256, timeout_s, "r-1", "us-east-1")


@pytest.mark.usefixtures("handlers_read_world")
def test_sweeper_publishes_stuck_jobs_on_every_run(world: FakeWorld, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN nothing stalled: StuckJobs 0 is still published (silence would mean the sweeper is down)
    sweeper_handler.handler({}, _ctx("SweeperFn"))
    assert _values(_emf(capsys.readouterr().out), "StuckJobs") == [({"service": "sweeper"}, 0.0)]
    # GIVEN two running jobs without progress for longer than stall_after_s
    for key, chunks in (("a", 2), ("b", 1)):
        job_id, _ = running_job(world, chunks, key)
        world.artifacts.put_text(document_key(job_id), "x" * 100)  # the reconciler rebuilds messages from it
    world.clock.advance(world.settings.profile.recovery.stall_after_s + 1)
    # WHEN the sweeper runs
    result = sweeper_handler.handler({}, _ctx("SweeperFn"))
    # THEN it publishes how many it found, and says so in its answer
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "StuckJobs") == [({"service": "sweeper"}, 2.0)]
    assert _values(lines, "BackpressureRequeues") == [({"service": "sweeper"}, 0.0)]
    assert _values(lines, "SweepItemFailures") == [({"service": "sweeper"}, 0.0)]
    assert result["stalled_jobs"] == 2 and result["item_failures"] == [] and result["stopped_at"] is None
    assert result["chunks_resent"] == 3  # with time enough, their pending chunks are sent again


@pytest.mark.usefixtures("handlers_read_world")
def test_a_sweep_that_reaches_its_deadline_still_publishes_what_it_counted(world: FakeWorld,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN two running jobs without progress for longer than stall_after_s
    for key in ("a", "b"):
        job_id, _ = running_job(world, 1, key)
        world.artifacts.put_text(document_key(job_id), "x" * 100)
    world.clock.advance(world.settings.profile.recovery.stall_after_s + 1)
    # WHEN the sweeper runs with less time left than its reserve (a sweep that would otherwise be cut by the
    # function's timeout, its metrics never published)
    reserve_s = world.settings.profile.functions.sweeper_reserve_s
    result = sweeper_handler.handler({}, _ctx("SweeperFn", timeout_s=reserve_s - 1))
    # THEN it reconciled nothing (the next sweep will), yet published StuckJobs with both jobs, and says where it
    # stopped
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "StuckJobs") == [({"service": "sweeper"}, 2.0)]
    assert _values(lines, "SweepItemFailures") == [({"service": "sweeper"}, 0.0)]
    assert result["stalled_jobs"] == 2 and result["chunks_resent"] == 0 and result["stopped_at"], result


@pytest.mark.usefixtures("handlers_read_world")
def test_aggregator_publishes_job_duration_when_a_result_ends_the_job(world: FakeWorld,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    job_id, (first, second) = running_job(world, 2)
    world.clock.advance(90)
    messages = []
    for record in (first, second):
        done = settle_done(world, record)
        messages.append(ResultMessage(job_id=job_id, chunk_id=done.chunk_id, chunk_index=done.chunk_index,
                                      status=ChunkStatus.DONE, fence=done.fence, findings_key=done.findings_key))
    # WHEN the first result arrives: the job goes on, no duration
    event = sqs_event([{"MessageId": "r-0", "ReceiptHandle": "h-0", "Body": messages[0].model_dump_json(),
                        "Attributes": {"MessageGroupId": job_id}}], "arn:aws:sqs:us-east-1:1:r.fifo", "us-east-1")
    aggregator_handler.handler(event, _ctx("AggregatorFn"))
    assert _values(_emf(capsys.readouterr().out), "JobDuration") == []
    # WHEN the last one arrives, 90 s after the job was created: the job ends, its duration is published
    event["Records"][0]["body"] = messages[1].model_dump_json()
    aggregator_handler.handler(event, _ctx("AggregatorFn"))
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "JobDuration") == [({"service": "aggregator"}, 90.0)]
    state = world.jobs.get(job_id)
    assert state is not None and state.terminal
    assert _values(lines, f"Jobs{state.state.value.title().replace('_', '')}") == [({"service": "aggregator"}, 1.0)]


def test_worker_metrics_count_retries_by_code_and_tier(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = Metrics(service="worker", namespace="ContractReview")
    stats = RetryStats()
    stats.calls, stats.retries = 7, {"model.throttled": 3, "model.unavailable": 1}
    # WHEN an attempt was requeued under backpressure after tier-1 retries ...
    record_attempt(metrics, stats, action="requeued")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "BackpressureRequeues") == [({"service": "worker"}, 1.0)]
    assert _values(lines, "Tier1Retries") == [({"service": "worker"}, 4.0)]
    assert sorted(_values(lines, "Retries"), key=lambda x: x[0]["code"]) == [
        ({"service": "worker", "tier": "1", "code": "model.throttled"}, 3.0),
        ({"service": "worker", "tier": "1", "code": "model.unavailable"}, 1.0)]
    # ... and one handed to tier 2
    record_attempt(metrics, RetryStats(), tier2_code="model.unavailable")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "Tier2Handoffs") == [({"service": "worker"}, 1.0)]
    assert _values(lines, "Retries") == [({"service": "worker", "tier": "2", "code": "model.unavailable"}, 1.0)]
    assert _values(lines, "BackpressureRequeues") == []


def test_a_bulk_chunk_that_gives_way_counts_one_priority_deferral(capsys: pytest.CaptureFixture[str]) -> None:
    # the deferrals before a chunk's last one are no job event (pipeline/priority.py): this metric counts them all
    metrics = Metrics(service="worker", namespace="ContractReview")
    record_attempt(metrics, RetryStats(), action="deferred", reason="priority.deferred")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, "PriorityDeferrals") == [({"service": "worker"}, 1.0)]
    assert _values(lines, "BackpressureRequeues") == []  # giving way is not backpressure



def test_each_function_says_at_cold_start_which_sdk_it_runs_on() -> None:
    """Issue 26 item 7: the Lambda runtime brings its own boto3/botocore, not the pinned one the tests ran with;
    a cold start's first line says which it got."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import botocore
    from aws_lambda_powertools.shared.version import VERSION

    functions = Path(__file__).resolve().parents[3] / "functions"
    # a fresh process importing a handler module, as a cold start does
    out = subprocess.run([sys.executable, "-c", "import contract_review.handlers.sweeper"], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(functions)}).stdout
    (line,) = [json.loads(x) for x in out.splitlines() if json.loads(x).get("message") == "runtime"]
    assert (line["service"], line["botocore"], line["powertools"]) == ("sweeper", botocore.__version__, VERSION)
    assert line["boto3"] and line["python"].count(".") == 2
