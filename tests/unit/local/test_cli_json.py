"""`--json` on `review up` and `review demo` (click's CliRunner): each prints exactly one JSON document on stdout,
whatever else it says going to stderr. The local stack is a stand-in here (`FakeStack`: the in-memory fakes, no
moto, no worker process); `review preflight --json` is in test_preflight.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from contract_review.domain.records import JobState
from review_local import demo as demo_module
from review_local import embedded
from review_local import stack as stack_module
from review_local.cli import cli
from review_local.cli import stack as cli_stack

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..inprocess import InProcess

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:contract-review/ticket-credentials-AbCdEf"


@dataclass
class _BatchService:
    url: str
    min_records: int = 10
    step_s: float = 0.5


@dataclass
class _Served:
    url: str
    token: str = "t0ken"
    tokens_by_name: dict[str, str] = field(default_factory=lambda: {"local-user": "t0ken"})


@dataclass
class _Aws:
    endpoint: str = "http://127.0.0.1:5999"
    region: str = "us-east-1"


class FakeStack:
    """Stands in for review_local.stack.LocalStack: what `review up` and `review demo` read of it, over a FakeWorld."""

    made: list[FakeStack] = []

    def __init__(self, world: FakeWorld, **fields: Any):
        self.world, self.aws, self.profile = world, _Aws(), "local"
        self.faults = fields.get("faults")  # as `review up` asked for them
        self.outputs = {"IntakeQueueUrl": "http://127.0.0.1:5999/queue/intake", "JobsTableName": "jobs"}
        self.api, self.ui = _Served("http://127.0.0.1:6001/"), _Served("http://127.0.0.1:6002/")
        self.tickets, self.ticket_token = _Served("http://127.0.0.1:6003/"), "tk"
        self.ticket_secret_arn = SECRET_ARN
        self.batch_service = _BatchService("http://127.0.0.1:6004/")
        self.runtime = None
        self.started = self.stopped = False
        self.wrote: list[Path] = []
        FakeStack.made.append(self)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def write_local_json(self, path: Path | None = None) -> None:
        self.wrote.append(path or Path(".review/local.json"))

    def deps(self) -> Any:
        return self.world.deps


@pytest.fixture(autouse=True)
def stack_on_world(world: FakeWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeWorld:
    """`review up` and `review demo` start a FakeStack on `world` instead of a LocalStack."""
    w = world
    FakeStack.made.clear()
    monkeypatch.setattr(stack_module, "LocalStack", lambda **kw: FakeStack(w, **kw))
    monkeypatch.setattr(demo_module, "LocalStack", lambda **kw: FakeStack(w, **kw))
    monkeypatch.setattr(embedded, "LOCAL_JSON", tmp_path / ".review" / "local.json")  # its lock beside it: not the checkout's
    return w


def test_review_up_json_prints_one_document_of_the_running_stack_then_serves(world, monkeypatch):
    served: list[bool] = []
    monkeypatch.setattr(cli_stack, "_serve_until_stopped", lambda: served.append(True))
    # WHEN `review up --json` has the stack up
    result = CliRunner().invoke(cli, ["up", "--json"])
    # THEN stdout is one JSON document: what .review/local.json records, plus the ticket fake and the paths
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [stack] = FakeStack.made
    assert (doc["endpoint"], doc["region"], doc["profile"]) == (stack.aws.endpoint, "us-east-1", "local")
    assert doc["outputs"] == stack.outputs and doc["ui"] == stack.ui.url and doc["api"] == stack.api.url
    assert doc["api_token"] == "t0ken" and doc["api_tokens"] == {"local-user": "t0ken"}
    assert doc["tickets"] == {"url": stack.tickets.url, "secret_arn": SECRET_ARN, "token": "tk"}
    assert doc["batch_service"] == stack.batch_service.url
    assert doc["local_json"].endswith("local.json") and doc["logs"] == ".review/logs/"
    # AND the human lines went to stderr; the stack was served, then stopped
    assert "status page:" in result.stderr and "model faults: none (--faults R injects them)" in result.stderr
    assert f"stopping the local stack (pid {os.getpid()}): the status page, the Job API, the ticket system's fake, " \
           "the batch inference stand-in, embedded AWS at http://127.0.0.1:5999" in result.stderr
    assert "stopped in " in result.stderr
    assert SECRET_ARN in result.stderr  # as it is: rich would print its `:secret:` as an emoji
    assert served == [True] and stack.stopped and stack.wrote


def test_review_demo_json_prints_one_document_of_the_results(world, monkeypatch, tmp_path):
    (tmp_path / "a-nda.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "b-msa.txt").write_text(LONG_TEXT, encoding="utf-8")

    def run_the_jobs(_console: Any, _jobs: Any, job_ids: list[str], _timeout: float, **_: Any) -> dict[str, str]:
        run = InProcess(world)  # the pipeline in-process stands in for the workers of the local stack
        return {j: run.run(j).state.value for j in job_ids}

    monkeypatch.setattr(demo_module, "watch_jobs", run_the_jobs)
    monkeypatch.setattr(demo_module, "REPORTS_DIR", tmp_path / "reports")
    # WHEN `review demo --json` reviews two samples
    result = CliRunner().invoke(cli, ["demo", "--json", "--samples", str(tmp_path)])
    # THEN stdout is one JSON document: each job with its state, reports, findings and coverage, and the summary
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and (doc["completed"], doc["total"]) == (2, 2) and doc["seconds"] >= 0
    assert [j["sample"] for j in doc["jobs"]] == ["a-nda.txt", "b-msa.txt"]
    for j in doc["jobs"]:
        job = world.jobs.get(j["job_id"])
        assert job is not None and job.state is JobState.COMPLETED and j["state"] == "completed"
        # its reports kept on disk (the embedded S3 is gone once the demo exits), as the stack wrote them
        stem = j["sample"].removesuffix(".txt")
        assert (j["report_json"], j["report_md"]) == (str(tmp_path / "reports" / f"{stem}.json"),
                                                      str(tmp_path / "reports" / f"{stem}.md"))
        assert Path(j["report_md"]).read_text() == world.artifacts.get_text(str(job.report_md_key))
        assert Path(j["report_json"]).read_text() == world.artifacts.get_text(str(job.report_json_key))
        assert j["findings"] == job.n_findings and j["coverage"]["missing_chunks"] == 0
        assert j["cost_estimate"] is True and float(j["cost_usd"]) > 0
    assert doc["reliability"]["model_calls"] > 0 and doc["reliability"]["dlq_depth"] == {
        "intake": 0, "analysis": 0, "results": 0}
    # AND the progress went to stderr
    assert "4/4" in result.stderr and "jobs completed in" in result.stderr
    assert "s3://" not in result.stderr + result.stdout and "(kept after the demo stops)" in result.stderr


def test_review_demo_json_without_samples_is_one_document_too(world, tmp_path):
    result = CliRunner().invoke(cli, ["demo", "--json", "--samples", str(tmp_path)])
    assert result.exit_code == 2 and json.loads(result.stdout) == {"ok": False, "error": "no samples/*.txt found"}


def test_review_up_says_which_faults_it_injects(monkeypatch):
    monkeypatch.setattr(cli_stack, "_serve_until_stopped", lambda: None)
    result = CliRunner().invoke(cli, ["up", "--json", "--faults", "0.05", "--seed", "3", "--ticket-faults",
                                      "error=0.1", "--batch-faults", "expire_job"])
    assert result.exit_code == 0, result.output
    assert "model faults: 5% transient (throttles, 5xx, timeouts; seed 3); ticket system faults: error=0.1" \
        in result.stderr
    assert "; faults: expire_job" in result.stderr  # on the batch stand-in's line
