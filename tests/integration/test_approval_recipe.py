"""The approval recipe of docs/cli.md, run as written on the local stack, and what `review reject` and `review
compensations --redrive` say when an undo fails or is still in flight. The stack is the `stack` fixture as `review up`
runs it (the ticket system's local fake on loopback, the real aggregator and sweeper in worker processes); the
commands are the `review` CLI's, on that stack's resources (CliRunner, or a real process where a line must be read
while the command still runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from contract_review.domain.records import JobState, StepStatus
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.sideeffects.saga import TICKET
from review_local.cli import Ctx, cli, render
from review_local.stack import LocalStack
from review_local.ticket_service import TicketFaults, TicketServiceFake

from ..conftest import ROOT
from ..texts import RISKY
from .conftest import get_job, wait_for

pytestmark = pytest.mark.stack(ticket_faults=TicketFaults())  # the `stack` fixture, with the ticket fake
CLI_DOC = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render.console, "width", 400)


@pytest.fixture
def tickets(stack: LocalStack) -> TicketServiceFake:
    assert stack.tickets is not None
    return stack.tickets


def review(stack: LocalStack, *args: str):  # type: ignore[no-untyped-def]  # click's Result
    return CliRunner().invoke(cli, list(args), obj=Ctx(None, None, deps=stack.deps()))


def test_the_documented_approval_recipe_runs_as_written_and_a_reject_after_it_closes_the_ticket(
        stack: LocalStack, tickets: TicketServiceFake):
    # GIVEN the recipe docs/cli.md gives for seeing a job wait: `review up --ticket-faults SPEC`, then
    # `review submit --wait SAMPLE`
    [spec] = set(re.findall(r"`review up --ticket-faults ([^`\s]+)`", CLI_DOC))
    [sample] = set(re.findall(r"`review submit --wait (samples/[^`\s]+)`", CLI_DOC))
    tickets.set_faults(TicketFaults.parse(spec))  # what `review up --ticket-faults SPEC` starts the fake with
    # WHEN the document is submitted as written
    submitted = review(stack, "submit", "--wait", str(ROOT / sample))
    # THEN exit 3: the job waits for a person, its ticket written and the outcome unknown
    assert submitted.exit_code == 3, submitted.output
    job_id = submitted.stdout.split()[0]
    waiting = get_job(stack.deps(), job_id)
    assert waiting.state is JobState.WAITING_APPROVAL and waiting.approval is not None
    assert tickets.stats()["open"] == 1
    # AND the faults ended once it waited (the recipe's lookups are the ticket step's, no more)
    assert tickets.take_fault("lookup") is None
    # WHEN it is rejected, as the line says, with nothing else done
    rejected = review(stack, "reject", job_id)
    # THEN the reject waited for the undo and says the ticket was closed; the job failed with the decision's code
    assert rejected.exit_code == 0, rejected.output
    [ticket] = tickets.all()
    assert f"{job_id} failed (job.approval_rejected); undone: ticket.open compensated ({ticket['id']} closed)" \
        in rejected.stdout
    assert tickets.stats()["open"] == 0 and tickets.stats()["closed"] == 1
    ended = get_job(stack.deps(), job_id)
    assert (ended.state, ended.error_code) == (JobState.FAILED, "job.approval_rejected")
    assert {r.step: r.status for r in ended.side_effects} == {TICKET: StepStatus.COMPENSATED}


def test_a_reject_whose_undo_fails_says_so_and_the_redrive_reports_in_flight_and_waits_for_the_outcome(
        stack: LocalStack, tickets: TicketServiceFake, tmp_path: Path):
    # GIVEN a job waiting for approval (its ticket written, the answer lost, the lookups down), then every close
    # failing
    tickets.set_faults(TicketFaults.parse("timeout_after_write=x1,lookup_unavailable=x4"))
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(RISKY, document_id="risky-undo")).job_id
    wait_for(lambda: (j := deps.jobs.get(job_id)) is not None and j.state is JobState.WAITING_APPROVAL, 120,
             what="waiting_approval")
    tickets.inject("error_before_write", op="close", times=1000)
    # WHEN it is rejected
    rejected = review(stack, "reject", job_id)
    # THEN exit 1 and one line: the job failed, the undo of its ticket did not, the cause, and what to run next
    assert rejected.exit_code == 1, rejected.output
    [line] = [x for x in rejected.stderr.splitlines() if x.strip()]
    assert line == (f"Error: {job_id} is failed (job.approval_rejected), but undoing ticket.open (sideeffect.failed, "
                    "HTTP 503) failed on every attempt (sideeffect.compensation_failed; what it did stays: a ticket "
                    "open): fix the cause, then `review compensations --redrive --wait`")
    assert tickets.stats()["open"] == 1
    # WHEN the cause is fixed while another redrive holds the dead letter (taken, not back)
    tickets.reset_faults()
    dlq = deps.side_effects.dlq if deps.side_effects else None
    assert dlq is not None
    [held] = dlq.take_all(visibility_s=600)
    busy = review(stack, "compensations", "--redrive")
    # THEN it is reported in flight, not as a success: exit 1, nothing closed
    assert busy.exit_code == 1, busy.output
    assert "compensated: 0  still failing: 0  in flight: 1" in busy.stdout
    assert "1 in flight: taken by another redrive" in busy.stderr
    assert tickets.stats()["closed"] == 0
    # WHEN `--redrive --wait` runs (a real process: its progress lines are read while it waits) and the other
    # redrive lets go of the message
    local_json = tmp_path / "local.json"
    stack.write_local_json(local_json)
    proc = subprocess.Popen([sys.executable, "-m", "review_local.cli", "compensations", "--redrive", "--wait"],
                            env={**os.environ, "REVIEW_LOCAL_JSON": str(local_json), "PYTHONUNBUFFERED": "1",
                                 "COLUMNS": "400"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]  # piped
    reader.start()
    wait_for(lambda: any("in flight: 1" in x for x in lines), 60, what="a progress line saying it is in flight")
    dlq.release(held.receipt_handle)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()  # type: ignore[union-attr]  # piped
    reader.join(10)
    # THEN it waited for the outcome: one progress line per round, then the ticket closed, once
    assert lines[0].startswith("compensated: 0  still failing: 0  in flight: 1: 1 in flight"), lines
    assert lines[-1].strip() == "compensated: 1  still failing: 0  in flight: 0", lines
    assert tickets.stats()["opened"] == tickets.stats()["closed"] == 1
    assert {r.step: r.status for r in get_job(deps, job_id).side_effects} == {TICKET: StepStatus.COMPENSATED}
