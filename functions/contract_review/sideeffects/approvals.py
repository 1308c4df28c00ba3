"""Human approval of an ambiguous side effect: `review approve|reject JOB`, `POST /jobs/{id}/approval`."""

from __future__ import annotations

from pydantic import BaseModel

from contract_review.domain import lifecycle
from contract_review.domain.messages import JobControl
from contract_review.domain.ports import Deps
from contract_review.domain.records import AwaitApproval, JobState
from contract_review.sideeffects.saga import fail_waiting


class ApprovalOutcome(BaseModel):
    job_id: str
    state: JobState | None  # the job's state afterwards (None: no such job)
    changed: bool  # this decision was taken (False: the job was not waiting)
    message: str


def decide_approval(deps: Deps, job_id: str, decision: str, by: str = "") -> ApprovalOutcome:
    """`review approve|reject JOB`, `POST /jobs/{id}/approval`: the decision is recorded with the job's
    transition (approve: `running`; reject: `compensating` with `job.approval_rejected`), then a control message
    (`resume` / `reject`) in the job's FIFO group makes the aggregator, which owns the saga, go on: retry
    the unknown step with its key, or compensate what was done and end the job `failed`."""
    if decision not in ("approve", "reject"):
        raise ValueError(f"decision must be approve or reject, not {decision!r}")
    for _ in range(lifecycle.MOVE_ATTEMPTS):
        job = deps.jobs.get(job_id)
        if job is None:
            return ApprovalOutcome(job_id=job_id, state=None, changed=False, message="no such job")
        if decision == "reject" and job.state is JobState.COMPENSATING:
            # failing, and its compensation not finished (the control message lost, the aggregator died half-way;
            # the sweeper would finish it too): the reject is sent again, and the aggregator finishes it
            control = JobControl(job_id=job_id, control="reject", by=by)
            deps.queues.send_result(control, control.dedup_id(f"{job.version}-again-{deps.clock():.0f}"))
            return ApprovalOutcome(job_id=job_id, state=job.state, changed=True, message=(
                f"already failing ({job.error_code}), but what was done is not all undone yet: the compensation "
                "is sent again"))
        if job.state is not JobState.WAITING_APPROVAL or job.approval is None:
            return ApprovalOutcome(job_id=job_id, state=job.state, changed=False,
                                   message=f"the job is {job.state.value}, not waiting for approval")
        if decision == "approve":
            approved = job.approval.model_copy(update={"decision": "approve", "decided_by": by,
                                                       "decided_at": deps.clock()})
            new = lifecycle.transition(deps, job, JobState.RUNNING, event="job.approved",
                                       detail={"by": by, "step": approved.step, "key": approved.key},
                                       outcome=AwaitApproval(approval=approved))
        else:
            new = fail_waiting(deps, job, "job.approval_rejected", by)
        if new is not None:
            control = JobControl(job_id=job_id, control="resume" if decision == "approve" else "reject", by=by)
            deps.queues.send_result(control, control.dedup_id(str(new.version)))
            return ApprovalOutcome(job_id=job_id, state=new.state, changed=True, message=(
                f"approved: {job.approval.step} is retried with the same key, then the job goes on"
                if decision == "approve" else "rejected: the job fails with job.approval_rejected once what was "
                                              "done is compensated"))
    now_job = deps.jobs.get(job_id)
    return ApprovalOutcome(job_id=job_id, state=now_job.state if now_job else None, changed=False,
                           message="the job kept changing; ask again")
