"""The IAM policy docs/runbook.md gives an operator for `review ui --stack NAME` cannot drift from the code.

The status page's server runs in-process against the local template deployed into moto, with the operator's
session built as `review --stack NAME` builds it (`review_local.connect.connect`: CloudFormation's outputs, the
caller's own credentials), and a botocore hook records every AWS call it makes (tests/infra/aws_calls.py, as the
role-coverage test does for the functions' roles). Every read and every button of the page is used: the jobs list,
a job's detail (grid, findings, cost, events), the dead letters, the activity chart; submit (inline and claim-checked),
cancel, retry, approve, reject, redrive, discard. Then, with the policy's placeholders resolved against the stack:

- every call is allowed by the documented policy, and every call the reads make by its `Read` statement alone
  (the runbook says a read-only page needs only that one);
- every action the policy names is needed by some recorded call on some resource it names (nothing to spare).
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contract_review.domain.messages import MAX_INLINE_CHARS
from contract_review.domain.ports import Queue
from contract_review.domain.records import Approval, Job, JobState, job_id_for
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import handle_message
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.wiring import chunk_worker
from review_local import connect as connect_module
from review_local.connect import connect, local_deps
from review_local.embedded import FAKE_CREDENTIALS, EmbeddedAws
from review_local.ui_server import UiServer

from ..texts import LONG_TEXT, TEXT
from .aws_calls import ACCOUNT, REGION, Call, Need, Recorder, allowed
from .conftest import LOCAL, Synth

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"


def documented_policy() -> dict[str, Any]:
    """The runbook's operator policy: its one ```json block with a `Read` statement."""
    blocks = re.findall(r"^```json\n(.*?)^```", RUNBOOK.read_text(encoding="utf-8"), flags=re.S | re.M)
    [policy] = [json.loads(b) for b in blocks if '"Sid": "Read"' in b]
    return policy


def resolved(policy: dict[str, Any], outputs: dict[str, str], stack: str) -> dict[str, list[dict[str, Any]]]:
    """Each statement by Sid, its placeholders replaced by the stack's names (as an operator fills them in)."""
    names = {"REGION": REGION, "ACCOUNT": ACCOUNT, "STACK": stack, "JOBS_TABLE": outputs["JobsTableName"],
             "CLAIMS_TABLE": outputs["ClaimsTableName"], "EVENTS_TABLE": outputs["EventsTableName"],
             "CHECKPOINTS_TABLE": outputs["CheckpointsTableName"], "CONTROL_TABLE": outputs["ControlTableName"],
             "ARTIFACT_BUCKET": outputs["ArtifactBucketName"]}
    text = json.dumps(policy)
    # the placeholders are read from the policy as written (the names filled in may be upper case themselves: a
    # generated table name ends in random capitals)
    left = set(re.findall(r"\b[A-Z][A-Z_]{3,}\b", text)) - {"Allow"} - set(names)
    assert not left, f"the runbook's policy has placeholders this test cannot fill: {left}"
    for placeholder, value in names.items():
        text = re.sub(rf"\b{placeholder}\b", value, text)
    return {st["Sid"]: [st] for st in json.loads(text)["Statement"]}


@dataclass
class Scenario:
    recorder: Recorder
    outputs: dict[str, str]
    stack: str


def _waiting_job(setup: Any, key: str) -> str:
    """A job waiting for a person's decision on its ticket step (as the saga leaves one whose outcome is unknown)."""
    job_id, now = job_id_for(key), time.time()
    approval = Approval(step="ticket.open", key=f"{job_id}:ticket", reason="the ticket system's answer was lost",
                        evidence={"attempts": 3}, requested_at=now, expires_at=now + 3600)
    setup.jobs.create(Job(job_id=job_id, state=JobState.WAITING_APPROVAL, created_at=now, updated_at=now,
                          idempotency_key=key, document_id=key, chunk_count=1, analyst_count=11, approval=approval))
    return job_id


def _run_one_chunk(setup: Any, job_id: str) -> None:
    """One of the job's chunks through the real worker (offline rule model) and the aggregator: a settled chunk
    with findings in S3, as the page reads them."""
    from contract_review.domain.messages import AnalysisMessage, parse_results_body

    taken = setup.queues.take_all(Queue.ANALYSIS, visibility_s=60)
    msgs = [(m, AnalysisMessage.model_validate_json(m.body)) for m in taken]
    m, msg = next((m, a) for m, a in msgs if a.job_id == job_id)
    chunk_worker(setup, OfflineRuleModel()).handle(msg, Delivery(message_id=m.message_id, receipt_handle=m.receipt_handle,
                                                                receive_count=1, visibility_s=120, remaining_ms=None))
    for r in setup.queues.take_all(Queue.RESULTS, visibility_s=60):
        handle_message(setup, parse_results_body(r.body))
        setup.queues.delete(Queue.RESULTS, r.receipt_handle)


@pytest.fixture(scope="module")
def scenario(synth: Synth) -> Iterator[Scenario]:
    aws = EmbeddedAws().start()
    rec = Recorder()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            aws.deploy(synth.templates[LOCAL])
        setup = local_deps(aws.outputs, aws.region, aws.endpoint)  # the test's own writes: not recorded
        with pytest.MonkeyPatch.context() as mp:
            for k, v in {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": aws.endpoint}.items():
                mp.setenv(k, v)
            real_session = connect_module.boto3.Session

            def session(**kw: Any) -> Any:  # the operator's session, as `connect` makes it, with the recorder on
                made = real_session(**kw)
                rec.attach(made)
                return made

            mp.setattr(connect_module.boto3, "Session", session)
            with rec.acting_as("read"):
                deps = connect(stack=aws.stack_name, region=aws.region, profile="local")
        # GIVEN jobs in every state the page acts on, and dead letters
        body = json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}, "document_id": "operator"})
        running = handle_intake(setup, body, "m-1").job_id
        assert running is not None
        _run_one_chunk(setup, running)
        to_approve, to_reject = _waiting_job(setup, "approve-me"), _waiting_job(setup, "reject-me")
        dlq_url = aws.outputs["IntakeDlqUrl"]
        for n in range(2):
            aws.client("sqs").send_message(QueueUrl=dlq_url, MessageBody=json.dumps(
                {"schema_version": 1, "document": {"s3_uri": f"s3://{setup.settings.bucket}/uploads/gone-{n}.txt"}}))
        ui = UiServer(deps)  # its methods are what its routes call (tests/unit/local/test_ui_server.py covers the routes)
        with rec.acting_as("read"):
            assert {j["jobId"] for j in ui.jobs()} >= {running, to_approve, to_reject}
            detail = ui.detail(running)
            assert detail["findings"] and detail["grid"]["rows"]
            assert ui.events(running, 0)
            letters = ui.dlq()
            assert len(letters) == 2
            activity = ui.activity()
            assert sum(activity["calls"]) > 0
            assert activity["control"] == {"paused": False, "tokensPerMinute": None, "by": "", "at": None,
                                           "hold": None, "batchOff": []}  # the runtime control, beside the chart
        with rec.acting_as("act"):
            small = ui.submit({"text": TEXT})["jobId"]
            big = ui.submit({"text": "Clause. " * (MAX_INLINE_CHARS // 8 + 10)})["jobId"]  # claim-checked
            assert ui.act(to_approve, "approve")["status"] == "running"
            assert ui.act(to_reject, "reject")["status"] in ("compensating", "failed")  # nothing done: nothing to undo
            assert ui.act(running, "cancel")["status"] in ("cancelling", "cancelled")
            handle_intake(setup, setup.queues.take_all(Queue.INTAKE)[0].body, "m-2")  # one of the submitted
            assert ui.dlq_redrive(letters[0]["message_id"])["ok"] is True
            assert ui.dlq_discard(letters[1]["message_id"])["ok"] is True
        # a cancelled job retried (the chunks it kept are reused)
        for _ in range(100):
            job = setup.jobs.get(running)
            if job is not None and job.state is JobState.CANCELLED:
                break
            from contract_review.domain import lifecycle

            if job is not None and job.state is JobState.CANCELLING:
                lifecycle.finish_cancel(setup, job)
            time.sleep(0.05)
        with rec.acting_as("act"):
            assert ui.act(running, "retry")["ok"] is True
        assert small and big
        yield Scenario(rec, aws.outputs, aws.stack_name)
    finally:
        aws.stop()


def _denied(calls: list[Call], statements: list[dict[str, Any]]) -> list[str]:
    return sorted({f"{c.service}:{c.operation} needs {n.action} on {n.resource}" for c in calls for n in c.needs
                   if not allowed(statements, n)})


def test_every_call_of_the_status_page_is_allowed_by_the_documented_operator_policy(scenario: Scenario) -> None:
    statements = resolved(documented_policy(), scenario.outputs, scenario.stack)
    everything = [st for sts in statements.values() for st in sts]
    calls = scenario.recorder.of("read", "act")
    assert {c.operation for c in calls} >= {"DescribeStacks", "Scan", "GetItem", "Query", "GetObject",
                                            "ReceiveMessage", "SendMessage", "DeleteMessage", "UpdateItem"}
    denied = _denied(calls, everything)
    assert not denied, "the runbook's operator policy would get AccessDenied for:\n  " + "\n  ".join(denied)


def test_the_read_statement_alone_serves_every_read_of_the_page(scenario: Scenario) -> None:
    # the runbook: "leave out the second statement for a read-only page"
    statements = resolved(documented_policy(), scenario.outputs, scenario.stack)
    denied = _denied(scenario.recorder.of("read"), statements["Read"])
    assert not denied, "a read-only page (the Read statement only) would get AccessDenied for:\n  " + \
        "\n  ".join(denied)


def test_every_action_the_documented_policy_names_is_needed_by_the_page(scenario: Scenario) -> None:
    import fnmatch

    statements = resolved(documented_policy(), scenario.outputs, scenario.stack)
    needs: set[Need] = {n for c in scenario.recorder.of("read", "act") for n in c.needs}
    unused = []
    for sid, [st] in statements.items():
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        for action in actions:
            if not any(n.action.lower() == action.lower() and any(fnmatch.fnmatchcase(n.resource, r) for r in resources)
                       for n in needs):
                unused.append(f"{sid}: {action}")
        for resource in resources:
            if not any(any(fnmatch.fnmatchcase(n.action.lower(), a.lower()) for a in actions)
                       and fnmatch.fnmatchcase(n.resource, resource) for n in needs):
                unused.append(f"{sid}: {resource}")
    assert not unused, "the runbook's operator policy grants what the page never calls:\n  " + "\n  ".join(unused)
