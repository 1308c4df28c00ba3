from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from contract_review import handlers
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import Job
from contract_review.doubles.spec import FaultSpec
from review_local.batch_service import BatchFaults
from review_local.connect import local_deps
from review_local.embedded import FAKE_CREDENTIALS, EmbeddedAws, synth
from review_local.runtime import function_specs
from review_local.stack import LocalStack


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stack(start={...}, **fields): how the `stack` / `shared_stack` fixture starts")


@pytest.fixture(scope="session")
def local_template() -> dict[str, Any]:
    return synth("local")  # cached on disk by the hash of infra/ + config


@contextmanager
def deployed(template: dict[str, Any]) -> Iterator[EmbeddedAws]:
    """A moto server of its own with the template deployed (no worker processes)."""
    aws = EmbeddedAws().start()
    try:
        aws.deploy(template)
        yield aws
    finally:
        aws.stop()


@pytest.fixture
def aws(local_template: dict[str, Any]) -> Iterator[EmbeddedAws]:
    """Embedded AWS with the local template deployed, for tests that call the cores directly."""
    with deployed(local_template) as aws:
        yield aws


@pytest.fixture(scope="module")
def embedded(local_template: dict[str, Any]) -> Iterator[EmbeddedAws]:
    """The template deployed once for a test module whose cases leave nothing behind (or clean up: `emptied`)."""
    with deployed(local_template) as aws:
        yield aws


def emptied(aws: EmbeddedAws) -> Deps:
    """The stack's repositories and queues, every queue emptied first (each case starts with empty queues)."""
    deps = local_deps(aws.outputs, aws.region, aws.endpoint, "local")
    for q in Queue:
        for m in deps.queues.take_all(q):
            deps.queues.delete(q, m.receipt_handle)
    return deps


@pytest.fixture
def lambda_env(local_template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedAws]:
    """The template deployed in embedded AWS and the process's environment set as the worker function's: the
    handlers run here as Lambda would run them."""
    aws = EmbeddedAws().start()
    try:
        aws.deploy(local_template)
        (worker,) = [s for s in function_specs(aws, 1.0) if s.name == "worker"]
        for k, v in {**worker.env, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": aws.endpoint,
                     "AWS_DEFAULT_REGION": aws.region}.items():
            monkeypatch.setenv(k, v)
        handlers.reset()
        yield aws
    finally:
        handlers.reset()
        aws.stop()


# Scenarios that need a chunk slower than its lease, or a chunk half-way through its analysts to kill, run the
# analysts one by one: with all 11 at once a chunk takes two call latencies and there is no "half-way".
ONE_BY_ONE = {"analyst_concurrency": 1}


@pytest.fixture
def make_stack(local_template: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., LocalStack]]:
    """Start a fresh embedded stack (own moto server, own worker processes) per call."""
    stacks: list[LocalStack] = []

    def _make(faults: FaultSpec | None = None, concurrency: dict[str, int] | None = None,
              worker_profile: dict[str, Any] | None = None, batch_faults: BatchFaults | None = None) -> LocalStack:
        """`worker_profile`: profile fields the workers run with (PROFILE_OVERRIDES), e.g. one-by-one analysts;
        `batch_faults`: what the batch inference stand-in does wrong (review_local/batch_service.py)."""
        env = {"worker": {"PROFILE_OVERRIDES": json.dumps(worker_profile)}} if worker_profile else {}
        stack = LocalStack(faults=faults, concurrency=concurrency or {}, template=local_template,
                           state_dir=tmp_path / f"stack{len(stacks)}", extra_env=env,
                           batch_faults=batch_faults or BatchFaults())
        stacks.append(stack)
        return stack.start()

    yield _make
    for s in stacks:
        s.stop()


@contextmanager
def running_stack(request: pytest.FixtureRequest, template: dict[str, Any], state_dir: Path) -> Iterator[LocalStack]:
    """A LocalStack started as the module or test marked `@pytest.mark.stack(start={...}, **fields)` asks
    (`fields`: LocalStack's, e.g. `ticket_faults=TicketFaults(hang_s=4.0)`; `start`: LocalStack.start's, e.g.
    `{"workers": False}`), else as `review up` starts it; stopped after."""
    marker = request.node.get_closest_marker("stack")
    fields = dict(marker.kwargs) if marker is not None else {}
    start = fields.pop("start", {})
    s = LocalStack(template=template, state_dir=state_dir, **fields)
    s.start(**start)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stack(request: pytest.FixtureRequest, local_template: dict[str, Any], tmp_path: Path) -> Iterator[LocalStack]:
    """A stack of its own per test (own moto server, worker processes, ticket fake, Job API): `running_stack`."""
    with running_stack(request, local_template, tmp_path / "stack") as s:
        yield s


@pytest.fixture(scope="module")
def shared_stack(request: pytest.FixtureRequest, local_template: dict[str, Any],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One stack for a test module whose cases leave nothing another case reads (`running_stack`)."""
    with running_stack(request, local_template, tmp_path_factory.mktemp("stack")) as s:
        yield s


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_jobs(deps: Deps, job_ids: list[str], timeout: float = 90) -> dict[str, Job]:
    def ended() -> dict[str, Job] | None:
        jobs = {j: deps.jobs.get(j) for j in job_ids}
        ended = {j: v for j, v in jobs.items() if v is not None and v.terminal}
        return ended if len(ended) == len(jobs) else None

    return wait_for(ended, timeout, 0.3, f"jobs {job_ids} to end")


def ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_by(entries: list[dict[str, Any]], *keys: str) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(e[k] for k in keys) for e in entries)


# Reads that the old dict records failed on (KeyError / TypeError) when the record was missing.
def get_job(deps: Deps, job_id: str | None) -> Job:
    """The job, which must exist."""
    assert job_id is not None
    job = deps.jobs.get(job_id)
    assert job is not None, job_id
    return job


def get_chunk(deps: Deps, job_id: str, chunk_id: str) -> ChunkRecord:
    """The chunk record, which must exist."""
    record = deps.claims.get(job_id, chunk_id)
    assert record is not None, (job_id, chunk_id)
    return record


def report_json(deps: Deps, job: Job) -> dict[str, Any]:
    """The job's report.json, which must have been written."""
    assert job.report_json_key is not None, job.job_id
    report: dict[str, Any] = json.loads(deps.artifacts.get_text(job.report_json_key))
    return report
