"""The batch collector's own function (handlers/collector.py -> pipeline/collector.py): one
item that raises is logged and counted (`CollectorItemFailures`, alarmed) and the run goes on with the others; the
metrics are published on every run. The recovery sweep does no batch work any more."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from contract_review.config import metrics
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, job_id_for
from contract_review.handlers import collector as collector_handler
from contract_review.pipeline.sweeper import sweep
from review_local.sandbox import LambdaContext

from ...texts import TEXT
from ..fakes import FakeBatchInference
from ..inprocess import InProcess
from ..scenarios import small_chunk_world
from .test_telemetry import _emf, _values


def _world() -> tuple[InProcess, FakeBatchInference]:
    world = small_chunk_world(batch_min_records=2)
    svc = FakeBatchInference(world.clock, min_records=2, end_after_s=1_000.0)  # batch jobs that run a long while
    world.deps = dataclasses.replace(world.deps, batch_inference=svc)
    return InProcess(world), svc


def _parked(p: InProcess, key: str) -> str:
    """A batch-mode job taken in, its chunks run by the workers until they wait for a batch (no collector, no sweep)."""
    p.send({"text": TEXT}, key=key, inference="batch")
    p.intake()
    for s in p.world.queues.drain(Queue.ANALYSIS):
        p.deliver(s)
    job_id = job_id_for(key)
    assert all(c.status is ChunkStatus.AWAITING_BATCH for c in p.world.claims.for_job(job_id))
    return job_id


@pytest.fixture
def collector_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    collector_handler.metrics.clear_metrics()  # Powertools' Metrics instances of one process share their sets
    monkeypatch.setattr(collector_handler.metrics, "namespace", "ContractReview")


def test_a_batch_job_the_collector_cannot_read_is_counted_and_the_run_goes_on(
        collector_metrics: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    p, svc = _world()
    monkeypatch.setattr(collector_handler, "deps", lambda: p.world.deps)
    # GIVEN a job whose chunks are packed into a batch job that Bedrock will not describe any more (every
    # GetModelInvocationJob of it raises), and another job whose chunks wait to be packed
    first = _parked(p, "first")
    run = collector_handler.handler({}, LambdaContext("CollectorFn", 1024, 60, "r-1", "us-east-1"))
    assert run["submitted"] and run["item_failures"] == []
    (token,) = run["submitted"]
    (arn,) = svc.jobs
    real = svc.status

    def refuses(job_id: str):  # type: ignore[no-untyped-def]  # the fake's method, wrapped
        if job_id == arn:
            raise RuntimeError("throttled")
        return real(job_id)
    monkeypatch.setattr(svc, "status", refuses)
    second = _parked(p, "second")
    capsys.readouterr()
    # WHEN the collector runs
    with caplog.at_level(logging.WARNING):
        run = collector_handler.handler({}, LambdaContext("CollectorFn", 1024, 60, "r-2", "us-east-1"))
    # THEN the bad batch job is logged and counted, and the waiting chunks were still packed and submitted
    assert run["item_failures"] == [f"collect:batch:{token}"]
    assert len(run["submitted"]) == 1 and run["submitted"] != [token]
    assert [r for r in caplog.records if r.getMessage() == "collector item failed"]
    assert all(c.batch_token == token for c in p.world.claims.for_job(first))
    assert all(c.batch_token == run["submitted"][0] for c in p.world.claims.for_job(second))
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, metrics.COLLECTOR_ITEM_FAILURES) == [({"service": "collector"}, 1.0)]
    assert _values(lines, metrics.BATCH_JOBS_SUBMITTED) == [({"service": "collector"}, 1.0)]
    assert _values(lines, metrics.BATCH_JOBS_COLLECTED) == [({"service": "collector"}, 0.0)]


def test_the_sweep_does_no_batch_work() -> None:
    # GIVEN a batch-mode job whose chunks wait to be packed
    p, svc = _world()
    job_id = _parked(p, "only")
    # WHEN sweeps run, and no collector
    for _ in range(3):
        p.world.clock.advance(2.0)
        report = sweep(p.world.deps)
    # THEN nothing was packed nor submitted: the batch lane is the collector's alone
    assert not svc.jobs and svc.submits == 0 and report.item_failures == []
    assert all(c.batch_token is None and c.status is ChunkStatus.AWAITING_BATCH
               for c in p.world.claims.for_job(job_id))
