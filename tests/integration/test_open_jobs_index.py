"""The sweeper finds open jobs through the sparse `by-open-state` index of the jobs table, never a
scan. A sweep on moto, with every DynamoDB request counted at the client (botocore's parameter hook)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from contract_review.config.settings import Settings
from contract_review.domain.records import Job, JobState
from contract_review.pipeline.sweeper import sweep, sweep_claims
from contract_review.wiring import build_deps
from review_local.connect import local_session
from review_local.embedded import EmbeddedAws

from ..texts import TEXT


def _counted(aws: EmbeddedAws) -> tuple[Any, list[tuple[str, str | None, str | None]]]:
    """Deps whose DynamoDB requests are recorded: (operation, index, the state its key condition names)."""
    seen: list[tuple[str, str | None, str | None]] = []
    session = local_session(aws.region)

    def hook(params: dict[str, Any], model: Any, **_: Any) -> None:
        state = (params.get("ExpressionAttributeValues") or {}).get(":state", {}).get("S")
        seen.append((model.name, params.get("IndexName"), state))

    session.events.register("before-parameter-build.dynamodb", hook)
    return build_deps(Settings.from_outputs(aws.outputs, "local"), session, aws.endpoint), seen


def test_a_sweep_queries_the_open_jobs_index_for_each_open_state_and_never_scans(aws: EmbeddedAws):
    deps, seen = _counted(aws)
    # GIVEN an idle job in each state the sweeper looks for, and a message in the intake DLQ, as SQS moves one (the
    # queued jobs are looked for only then)
    for state in (JobState.RUNNING, JobState.CANCELLING, JobState.COMPENSATING, JobState.WAITING_APPROVAL,
                  JobState.QUEUED):
        deps.jobs.create(Job(job_id=f"job-idle-{state.value}", state=state, created_at=1.0, updated_at=1.0,
                             idempotency_key=state.value, chunk_count=1))
    deps.jobs.create(Job(job_id="job-done", state=JobState.COMPLETED, created_at=1.0, updated_at=1.0,
                         idempotency_key="done"))
    aws.client("sqs").send_message(QueueUrl=deps.settings.intake_dlq_url, MessageBody=json.dumps(
        {"schema_version": 1, "idempotency_key": "someone-else", "document": {"text": TEXT}}))
    seen.clear()
    # WHEN the sweeper Lambda's sweep runs
    report = sweep(deps)
    # THEN every open state was asked of the index, nothing was scanned, and the jobs it found were acted on
    ops = Counter(op for op, _, _ in seen)
    assert ops["Scan"] == 0, ops
    asked = {state for op, index, state in seen if op == "Query" and index == "by-open-state"}
    assert asked == {"running", "cancelling", "compensating", "waiting_approval", "queued"}, seen
    assert report.stalled_jobs == 1 and not report.item_failures, report
    assert sorted(report.finalized) == ["job-idle-cancelling", "job-idle-compensating"]
    assert deps.jobs.get("job-idle-cancelling").state is JobState.CANCELLED  # type: ignore[union-attr]
    # AND a Fargate poller's sweep (lapsed claims) reads no jobs index and no DLQ at all
    seen.clear()
    sweep_claims(deps)
    assert {(op, index) for op, index, _ in seen} == {("Query", "by-lease")}, seen
