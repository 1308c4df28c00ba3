"""Side effects on the local stack: the template deployed into moto (idempotency table, job-events
topic, compensation DLQ), the real aggregator and sweeper in worker processes, and the local fake of
the external ticket system (`review_local/ticket_service.py`, a third party's stand-in) over HTTP on
loopback, its URL handed to the functions as `TICKET_URL` the way `review up` does."""

from __future__ import annotations

import json

import pytest

from contract_review.domain.ports import Deps
from contract_review.domain.records import JobState, StepStatus
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.sideeffects import approvals
from contract_review.sideeffects.saga import PUBLISH, TICKET
from review_local.stack import LocalStack
from review_local.ticket_service import TicketFaults, TicketServiceFake

from ..texts import RISKY
from .conftest import get_job, wait_for, wait_jobs

pytestmark = pytest.mark.integration


# the `stack` fixture as `review up` runs it: the ticket fake on loopback, its URL in the aggregator's and sweeper's
# TICKET_URL; an answer it holds outlasts the functions' read timeout (local profile: ticket_read_timeout_s)
pytestmark = pytest.mark.stack(ticket_faults=TicketFaults(hang_s=4.0))


@pytest.fixture
def tickets(stack: LocalStack) -> TicketServiceFake:
    assert stack.tickets is not None
    return stack.tickets


def test_a_timeout_after_the_ticket_write_is_looked_up_and_resumed_without_a_second_ticket(
        stack: LocalStack, tickets: TicketServiceFake):
    # GIVEN the ticket system writes the first ticket, then holds its answer past the client's timeout,
    # and an integrator's queue subscribed to the job-events topic
    tickets.inject("timeout_after_write")
    deps = stack.deps()
    sqs, sns = stack.aws.client("sqs"), stack.aws.client("sns")
    inbox = sqs.create_queue(QueueName="integrator-inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=stack.outputs["JobEventsTopicArn"], Protocol="sqs", Endpoint=inbox_arn,
                  Attributes={"RawMessageDelivery": "true"})
    # WHEN a document with a high-risk clause is reviewed by the stack's processes
    job_id = submission.submit(deps, None, SubmitRequest.inline(RISKY, document_id="risky-msa")).job_id
    ended = wait_jobs(deps, [job_id], timeout=120)[job_id]
    # THEN the job completes with one ticket, found by its key after the timeout, and one publish
    assert ended.state is JobState.COMPLETED, ended.error
    stats = tickets.stats()
    assert stats["opened"] == 1 and stats["faults_injected"] == {"timeout_after_write": 1}
    assert stats["requests"].get("lookup", 0) >= 1
    steps = {r.step: r for r in ended.side_effects}
    assert steps[TICKET].status is StepStatus.DONE and steps[TICKET].result["resolved_by"] == "lookup"
    assert steps[TICKET].result["ticket_id"] == tickets.all()[0]["id"]
    assert tickets.all()[0]["idempotency_key"] == steps[TICKET].key
    assert steps[PUBLISH].status is StepStatus.DONE and steps[PUBLISH].result["sns_message_id"]
    # AND the outcomes are in the idempotency table (Powertools records, COMPLETED)
    ddb = stack.aws.client("dynamodb")
    items = ddb.scan(TableName=stack.outputs["IdempotencyTableName"])["Items"]
    assert sorted(i["status"]["S"] for i in items) == ["COMPLETED", "COMPLETED"]
    events = [e.type for e in deps.jobs.events(job_id)]
    assert events.count("sideeffect.done") == 2
    # AND the integrator heard of the job once, with its key (to drop a repeat), its id and state and nothing else
    # (the topic is every principal's: no report location, no document id, no counts)
    got = sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", [])
    [event] = [json.loads(m["Body"]) for m in got]
    assert event == {"detail-type": "Review completed", "idempotency_key": steps[PUBLISH].key, "job_id": job_id,
                     "state": "completed"}


def waiting_for_approval(stack: LocalStack, tickets: TicketServiceFake, document_id: str) -> tuple[Deps, str]:
    """A risky document's job waiting for approval: its ticket written, the answer lost, the lookup down (the
    ticket faults are cleared once it waits)."""
    # more lookup faults than docs/cli.md's recipe (which tests/integration/test_approval_recipe.py runs as written)
    tickets.set_faults(TicketFaults.parse("timeout_after_write=x1,lookup_unavailable=x50,hang=4"))
    deps = stack.deps()
    job_id = submission.submit(deps, None, SubmitRequest.inline(RISKY, document_id=document_id)).job_id
    wait_for(lambda: (j := deps.jobs.get(job_id)) is not None and j.state is JobState.WAITING_APPROVAL, 120,
             what="waiting_approval")
    tickets.reset_faults()
    return deps, job_id


def test_approve_in_real_processes_retries_with_the_same_key_and_completes_with_one_ticket(
        stack: LocalStack, tickets: TicketServiceFake):
    # GIVEN a job waiting for approval: its ticket written, the answer lost, the lookup down
    deps, job_id = waiting_for_approval(stack, tickets, "risky-approve")
    # WHEN a person approves (the aggregator gets the `resume` control message)
    assert approvals.decide_approval(deps, job_id, "approve", by="test").changed
    ended = wait_jobs(deps, [job_id], timeout=60)[job_id]
    # THEN the step was retried with the same key: still one ticket, and the job completed
    assert ended.state is JobState.COMPLETED, ended.error
    assert tickets.stats()["opened"] == 1 and tickets.stats()["requests"]["create"] == 2
    assert {r.step: r.status for r in ended.side_effects} == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.DONE}


def test_cancel_after_the_ticket_closes_every_ticket_it_opened(stack: LocalStack, tickets: TicketServiceFake):
    # GIVEN a job whose ticket was written but whose answer never came, and the lookup is down: the job
    # waits for approval, a ticket open in the ticket system that the job does not know the id of
    deps, job_id = waiting_for_approval(stack, tickets, "risky-cancel")
    waiting = get_job(deps, job_id)
    assert waiting.approval is not None and waiting.approval.step == TICKET
    assert tickets.stats()["opened"] == 1
    # WHEN it is cancelled
    from contract_review.domain import lifecycle

    lifecycle.request_cancel(deps, job_id, by="test")
    ended = wait_jobs(deps, [job_id], timeout=60)[job_id]
    # THEN it ends cancelled, and tickets opened = tickets closed
    assert ended.state is JobState.CANCELLED
    wait_for(lambda: tickets.stats()["closed"] == 1, 30, what="the ticket closed")
    stats = tickets.stats()
    assert stats["opened"] == stats["closed"] == 1
    assert json.dumps(tickets.all()[0]["close_comment"]).count(job_id) == 1


def test_a_reject_whose_control_message_is_lost_is_compensated_by_the_stacks_sweeper(
        stack: LocalStack, tickets: TicketServiceFake):
    """On DynamoDB: the reject is written (the job `compensating`, the ticket still open) and its
    control message never sent; the stack's own sweeper finds the compensating job in the jobs table, looks the
    written-ahead ticket step up by its key, closes the ticket, and only then is the job `failed`."""
    from contract_review.sideeffects import saga

    deps, job_id = waiting_for_approval(stack, tickets, "risky-lost-reject")
    waiting = get_job(deps, job_id)
    assert [(r.step, r.status) for r in waiting.side_effects] == [(TICKET, StepStatus.STARTED)]  # written ahead
    failing = saga.fail_waiting(deps, waiting, "job.approval_rejected", by="test")  # the reject; no control sent
    assert failing is not None and failing.state is JobState.COMPENSATING
    ended = wait_jobs(deps, [job_id], timeout=60)[job_id]
    assert (ended.state, ended.error_code) == (JobState.FAILED, "job.approval_rejected")
    assert tickets.stats()["opened"] == tickets.stats()["closed"] == 1
    assert {r.step: r.status for r in ended.side_effects} == {TICKET: StepStatus.COMPENSATED}


def test_review_compensations_redrive_reaches_the_stacks_ticket_system_and_closes_what_a_cancel_could_not(
        stack: LocalStack, tickets: TicketServiceFake):
    from click.testing import CliRunner

    from contract_review.domain import lifecycle
    from review_local.cli import Ctx, cli

    # GIVEN a job waiting for approval with its ticket written, and every close failing while it is cancelled
    deps, job_id = waiting_for_approval(stack, tickets, "risky-redrive")
    tickets.inject("error_before_write", op="close", times=1000)
    lifecycle.request_cancel(deps, job_id, by="test")
    assert wait_jobs(deps, [job_id], timeout=60)[job_id].state is JobState.CANCELLED
    cli_deps = stack.deps()  # the CLI's view of the stack: from its outputs, as `review --stack NAME` builds it
    assert cli_deps.side_effects is not None and cli_deps.side_effects.dlq is not None
    wait_for(lambda: cli_deps.side_effects.dlq.take_all(visibility_s=0), 60,  # type: ignore[union-attr]  # asserted
             what="the compensation dead-lettered")
    assert tickets.stats()["closed"] == 0
    # WHEN the cause is fixed and the documented recovery runs from the command line
    tickets.reset_faults()
    result = CliRunner().invoke(cli, ["compensations", "--redrive"], obj=Ctx(None, None, deps=cli_deps))
    # THEN it reached the same ticket system (with the secret's credentials) and closed the ticket, once
    assert result.exit_code == 0, result.output
    assert "compensated: 1  still failing: 0  in flight: 0" in result.output
    assert tickets.stats()["opened"] == tickets.stats()["closed"] == 1
