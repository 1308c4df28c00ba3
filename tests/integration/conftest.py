from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract_review.config import FaultSpec
from contract_review.store import TERMINAL_JOB_STATES, Store
from review_local.embedded import synth
from review_local.stack import LocalStack


@pytest.fixture(scope="session")
def local_template() -> dict[str, Any]:
    return synth("local")  # cached on disk by the hash of infra/ + config


@pytest.fixture
def make_stack(local_template: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., LocalStack]]:
    """Start a fresh embedded stack (own moto server, own worker processes) per call."""
    stacks: list[LocalStack] = []

    def _make(faults: FaultSpec | None = None, concurrency: dict[str, int] | None = None) -> LocalStack:
        stack = LocalStack(faults=faults, concurrency=concurrency or {}, template=local_template,
                           state_dir=tmp_path / f"stack{len(stacks)}")
        stacks.append(stack)
        return stack.start()

    yield _make
    for s in stacks:
        s.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_jobs(store: Store, job_ids: list[str], timeout: float = 90) -> dict[str, dict[str, Any]]:
    def ended() -> dict[str, dict[str, Any]] | None:
        jobs = {j: store.get_job(j) for j in job_ids}
        if all(v is not None and v.get("state") in TERMINAL_JOB_STATES for v in jobs.values()):
            return jobs  # type: ignore[return-value]
        return None

    return wait_for(ended, timeout, 0.3, f"jobs {job_ids} to end")


def ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def queue_depth(store: Store, url: str) -> int:
    a = store.aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    return sum(int(v) for v in a.values())


def calls_by(entries: list[dict[str, Any]], *keys: str) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(e[k] for k in keys) for e in entries)
