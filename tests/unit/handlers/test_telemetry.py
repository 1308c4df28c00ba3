"""The metrics the alarms and the dashboard read (infra/monitoring.py), as the handlers publish them:
Powertools EMF lines on stdout, against the in-memory fakes."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Metrics

from contract_review.config import metrics as M
from contract_review.config.metrics import Metric
from contract_review.domain.keys import document_key
from contract_review.domain.messages import ResultMessage
from contract_review.domain.records import TERMINAL_JOB_STATES, ChunkStatus
from contract_review.handlers import aggregator as aggregator_handler
from contract_review.handlers import sweeper as sweeper_handler
from contract_review.handlers.telemetry import record_attempt
from contract_review.reliability.retry import RetryStats
from review_local.sandbox import LambdaContext, sqs_event

from ..fakes import FakeWorld
from ..scenarios import running_job, settle_done


def _emf(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


def _values(lines: list[dict[str, Any]], metric: Metric) -> list[tuple[dict[str, str], float]]:
    """(dimensions, value) of every datapoint of `metric` (a catalogue row), each published as the row says: its
    namespace, its unit, its dimensions and its publisher's service."""
    out = []
    for line in lines:
        for directive in line["_aws"]["CloudWatchMetrics"]:
            for m in (m for m in directive["Metrics"] if m["Name"] == metric.name):
                dims = {d: line[d] for ds in directive["Dimensions"] for d in ds}
                assert (directive["Namespace"], m["Unit"], sorted(dims)) == (
                    metric.namespace, metric.unit, sorted(metric.dimensions)), metric
                if dims["service"] != metric.service:
                    continue  # the same name of another publisher: another series (BackpressureRequeues)
                value = line[metric.name]
                out += [(dims, v) for v in (value if isinstance(value, list) else [value])]
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
    assert _values(_emf(capsys.readouterr().out), M.STUCK_JOBS) == [({"service": "sweeper"}, 0.0)]
    # GIVEN two running jobs without progress for longer than stall_after_s
    for key, chunks in (("a", 2), ("b", 1)):
        job_id, _ = running_job(world, chunks, key)
        world.artifacts.put_text(document_key(job_id), "x" * 100)  # the reconciler rebuilds messages from it
    world.clock.advance(world.settings.profile.recovery.stall_after_s + 1)
    # WHEN the sweeper runs
    result = sweeper_handler.handler({}, _ctx("SweeperFn"))
    # THEN it publishes how many it found, and says so in its answer
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, M.STUCK_JOBS) == [({"service": "sweeper"}, 2.0)]
    assert _values(lines, M.SWEEPER_BACKPRESSURE_REQUEUES) == [({"service": "sweeper"}, 0.0)]
    assert _values(lines, M.SWEEP_ITEM_FAILURES) == [({"service": "sweeper"}, 0.0)]
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
    assert _values(lines, M.STUCK_JOBS) == [({"service": "sweeper"}, 2.0)]
    assert _values(lines, M.SWEEP_ITEM_FAILURES) == [({"service": "sweeper"}, 0.0)]
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
    assert _values(_emf(capsys.readouterr().out), M.JOB_DURATION) == []
    # WHEN the last one arrives, 90 s after the job was created: the job ends, its duration is published
    event["Records"][0]["body"] = messages[1].model_dump_json()
    aggregator_handler.handler(event, _ctx("AggregatorFn"))
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, M.JOB_DURATION) == [({"service": "aggregator"}, 90.0)]
    state = world.jobs.get(job_id)
    assert state is not None and state.terminal
    assert _values(lines, M.JOBS_ENDED[state.state.value]) == [({"service": "aggregator"}, 1.0)]


def test_worker_metrics_count_retries_by_code_and_tier(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = Metrics(service="worker", namespace="ContractReview")
    stats = RetryStats()
    stats.calls, stats.retries = 7, {"model.throttled": 3, "model.unavailable": 1}
    # WHEN an attempt was requeued under backpressure after tier-1 retries ...
    record_attempt(metrics, stats, action="requeued")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, M.BACKPRESSURE_REQUEUES) == [({"service": "worker"}, 1.0)]
    assert _values(lines, M.TIER1_RETRIES) == [({"service": "worker"}, 4.0)]
    assert sorted(_values(lines, M.RETRIES), key=lambda x: x[0]["code"]) == [
        ({"service": "worker", "tier": "1", "code": "model.throttled"}, 3.0),
        ({"service": "worker", "tier": "1", "code": "model.unavailable"}, 1.0)]
    # ... and one handed to tier 2
    record_attempt(metrics, RetryStats(), tier2_code="model.unavailable")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, M.TIER2_HANDOFFS) == [({"service": "worker"}, 1.0)]
    assert _values(lines, M.RETRIES) == [({"service": "worker", "tier": "2", "code": "model.unavailable"}, 1.0)]
    assert _values(lines, M.BACKPRESSURE_REQUEUES) == []


def test_a_bulk_chunk_that_gives_way_counts_one_priority_deferral(capsys: pytest.CaptureFixture[str]) -> None:
    # the deferrals before a chunk's last one are no job event (pipeline/priority.py): this metric counts them all
    metrics = Metrics(service="worker", namespace="ContractReview")
    record_attempt(metrics, RetryStats(), action="deferred", reason="priority.deferred")
    metrics.flush_metrics()
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, M.PRIORITY_DEFERRALS) == [({"service": "worker"}, 1.0)]
    assert _values(lines, M.BACKPRESSURE_REQUEUES) == []  # giving way is not backpressure



ROOT = Path(__file__).resolve().parents[3]
HANDLERS = ROOT / "functions" / "contract_review" / "handlers"


def _emitted(path: Path) -> list[tuple[Metric, str]]:
    """(row, the service of the module's `Metrics`) of every `emit(metrics, M.ROW, ...)` in a handler module (a row of
    `M.JOBS_ENDED[...]`: each of them). telemetry.py's `record_attempt` is the worker's (the Lambda's and the
    poller's `Metrics(service="worker")`)."""
    tree = ast.parse(path.read_text())
    services = [k.value.value for call in ast.walk(tree) if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name) and call.func.id == "Metrics"
                for k in call.keywords if k.arg == "service" and isinstance(k.value, ast.Constant)]
    service = services[0] if services else {"telemetry.py": "worker"}.get(path.name, "")
    out = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "emit":
            for node in ast.walk(call.args[1]):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "M":
                    row = getattr(M, node.attr)
                    out += [(r, service) for r in (row.values() if isinstance(row, dict) else [row])]
    return out


def test_every_metric_of_ours_in_the_catalogue_is_published_by_its_service() -> None:
    """Each row of ours has an `emit` in the handler of the service it names, and no handler emits a row of another
    service's (its datapoints would carry the wrong `service`: the alarm reading the row's series would see none)."""
    emitted = [e for path in sorted(HANDLERS.glob("*.py")) for e in _emitted(path)]
    assert [(row.name, row.service, service) for row, service in emitted if row.service != service] == []
    assert {row for row, _ in emitted} == {m for m in M.CATALOGUE if m.ours}


def test_metrics_are_published_through_the_catalogue_only() -> None:
    """No metric name written at the call: every datapoint goes through `telemetry.emit`, which takes a row."""
    functions = ROOT / "functions"
    calls = [str(path.relative_to(functions)) for path in functions.rglob("*.py")
             for line in path.read_text().splitlines() if re.search(r"\b(add_metric|single_metric)\(", line)]
    assert calls == ["contract_review/handlers/telemetry.py"] * 2  # in `emit`: one datapoint, or one EMF line


def test_a_job_ending_in_each_terminal_state_has_its_row() -> None:
    assert set(M.JOBS_ENDED) == {s.value for s in TERMINAL_JOB_STATES}
    assert all(row.name == "Jobs" + state.title().replace("_", "") for state, row in M.JOBS_ENDED.items())


def test_the_metrics_page_is_generated_from_the_catalogue() -> None:
    page = ROOT / "docs" / "metrics.md"
    assert page.read_text() == M.render_markdown(), (
        "docs/metrics.md is stale; regenerate: PYTHONPATH=functions python -m contract_review.config.metrics "
        "> docs/metrics.md")


def test_each_function_says_at_cold_start_which_sdk_it_runs_on() -> None:
    """The Lambda runtime brings its own boto3/botocore, not the pinned one the tests ran with;
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
