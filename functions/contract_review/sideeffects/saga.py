"""The job's side effects, run as a saga when the report is written (docs/lifecycle.md, "Side effects").

Steps, in order:
1. `ticket.open`: a review ticket in the external ticket system, only when the report has high-risk
   findings (score >= `HIGH_RISK_SCORE`, the band the report's "Highest-risk clauses" leads with);
2. `report.publish`: an event on the job-events SNS topic and on EventBridge ("Review completed")
   carrying the job's id and state only. The topic is one for every principal: an event names no report
   location, no document id and no counts (another tenant's); the job's owner reads the rest through the
   Job API (`GET /jobs/{id}`, `GET /jobs/{id}/report`).

Each step has a key = sha256(job id, step, operation, canonical JSON of its arguments). It is the
`Idempotency-Key` the external system dedups on, and the key of the step's outcome in the outcome
store (Powertools idempotency): a retry of the step returns the stored result instead of acting.
Once a step is recorded `started` or `done`, its recorded key is its key for that generation, whatever
the arguments derive now: a job in flight across an upgrade that changes a step's arguments (the
publish's did: it named the report before) neither acts again under a new key nor loses the action.
The job keeps its steps (`Job.side_effects`) for status and compensation, each written ahead: recorded
`started` (with its key) before it acts, `done` after. Compensation undoes every step it finds started or
done, so a crash between acting and recording leaves a key to look up, never a ticket nobody knows of.

Failures are data. A step's call that certainly did nothing (5xx, refused connection) is retried in
place (tier 1, full-jitter backoff); when the retries are spent the saga ends `failed` with
`sideeffect.failed` (the caller fails the job and compensates). A call whose outcome is unknown (a
timeout after the request was sent): the ticket is looked up by its key; found -> done; still
unknown -> the job waits in `waiting_approval` with the evidence (`Job.approval`). Publishing again
with the same key is harmless (subscribers drop a repeat by its key), so an unknown publish is retried.

Compensations, in reverse order, before the job ends (in `cancelling`, or `compensating` on a failure,
a reject or an expiry: domain/lifecycle.py): a ticket is closed with a comment (a `started` ticket is
looked up by its key first: not found, nothing to close); a publish is followed by a "Review withdrawn"
notice. Each is idempotent (its own key),
retried, and when its retries are spent it goes to the compensation DLQ with its envelope (an alarm
fires) and the step is marked `compensation_failed`: never silently successful.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError
from pydantic import BaseModel, JsonValue

from contract_review.domain import lifecycle
from contract_review.domain.effects import DeadLetter, JsonObject, SideEffectError, SideEffects
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.keys import report_keys
from contract_review.domain.policy import recovery, tier1_policy
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    Approval,
    AwaitApproval,
    Job,
    JobFailure,
    JobState,
    SideEffectDone,
    StepStatus,
)
from contract_review.reliability.retry import backoff_delay
from contract_review.review.analysts import Finding
from contract_review.review.report import Report

# What a step call and a compensation call fail with: their rows in the recovery policy say how they are retried.
STEP_RETRY = "sideeffect.failed"
COMPENSATION_RETRY = "sideeffect.compensation_failed"
HIGH_RISK_SCORE = 0.7  # a finding at or above this score is high risk (report.md lists the highest first)
TICKET, PUBLISH = "ticket.open", "report.publish"
STEP_ORDER = (TICKET, PUBLISH)  # the saga's order; compensations run in reverse
COMPLETED_DETAIL, WITHDRAWN_DETAIL = "Review completed", "Review withdrawn"


class SagaStatus(StrEnum):
    DONE = "done"  # every step done or skipped: the caller completes the job
    WAITING_APPROVAL = "waiting_approval"  # a step's outcome stayed unknown: the job waits (the saga moved it)
    CANCELLED = "cancelled"  # the job is cancelling: no step started (the cancel finishes it)
    FAILED = "failed"  # a step failed for good (`error`): the caller fails the job and compensates
    NOT_RUNNING = "not_running"  # the job is in no state to act (ended, or changed meanwhile): nothing done
    IN_PROGRESS = "in_progress"  # another invocation is performing a step now: it goes on from there


@dataclass
class SagaResult:
    status: SagaStatus
    steps: list[SideEffectDone] = field(default_factory=list)
    evidence: Approval | None = None
    error: ErrorEnvelope | None = None
    job: Job | None = None


@dataclass
class CompensationResult:
    compensated: list[str] = field(default_factory=list)  # steps compensated now or before
    dead_lettered: list[str] = field(default_factory=list)  # steps whose compensation went to the DLQ
    # a redrive: the dead letters' jobs (one per entry of `dead_lettered`), and the messages it could not take
    # because another run holds them (their outcome is not known yet: not compensated, not failed)
    failing_jobs: list[str] = field(default_factory=list)
    in_flight: int = 0

    @property
    def complete(self) -> bool:
        return not self.dead_lettered and not self.in_flight


@dataclass(frozen=True)
class Step:
    job_id: str
    name: str
    operation: str
    args: JsonObject

    recorded_key: str | None = None  # the key this step was recorded with (started or done): it stays the key

    @property
    def key(self) -> str:
        return self.recorded_key or step_key(self.job_id, self.name, self.operation, self.args)


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def step_key(job_id: str, step: str, operation: str, args: Mapping[str, JsonValue]) -> str:
    """sha256(job id, step, operation, canonical JSON of the arguments)."""
    return hashlib.sha256(canonical_json([job_id, step, operation, dict(args)]).encode("utf-8")).hexdigest()


class Unresolved(Exception):
    """A step whose outcome stayed unknown after looking its key up."""

    def __init__(self, error: ErrorEnvelope, lookup: str):
        super().__init__(error.error_code)
        self.error, self.lookup = error, lookup


# ------------------------------------------------------------------------------ the plan
def high_risk(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == "ok" and f.score >= HIGH_RISK_SCORE]


def plan(deps: Deps, job: Job, report: Report) -> list[Step]:
    """The steps of this job's saga. No document text goes out: the ticket (the operator's own system) gets counts,
    categories, offsets and the report's location; the job-events topic, which every principal's integrator may
    subscribe to, the job's id and state only."""
    json_key, md_key = report_keys(job.job_id)
    bucket = deps.artifacts.bucket
    common: JsonObject = {"job_id": job.job_id, "document_id": job.document_id,
                          "report": f"s3://{bucket}/{json_key}", "report_md": f"s3://{bucket}/{md_key}"}
    risky = high_risk(report.findings)
    steps = []
    if risky:
        by_cat: dict[str, int] = {}
        for f in risky:
            by_cat[f.category] = by_cat.get(f.category, 0) + 1
        cats: JsonObject = dict(sorted(by_cat.items()))  # every category with a high-risk finding
        steps.append(Step(job.job_id, TICKET, "create", {
            **common, "title": f"Contract review: {len(risky)} high-risk finding(s) in {job.document_id or job.job_id}",
            "high_risk_findings": len(risky), "max_score": max(f.score for f in risky), "categories": cats,
            "locations": [[f.chunk_index, f.start, f.end] for f in risky[:20]]}))
    steps.append(Step(job.job_id, PUBLISH, "publish", {"job_id": job.job_id, "state": JobState.COMPLETED.value}))
    return steps


def load_report(deps: Deps, job: Job) -> Report:
    return Report.model_validate_json(deps.artifacts.get_text(report_keys(job.job_id)[0]))


# ------------------------------------------------------------------------------ acting
def _remaining(deps: Deps, fx: SideEffects) -> Callable[[], int]:
    if fx.remaining_ms is not None:
        return fx.remaining_ms
    deadline = time.monotonic() + deps.settings.profile.functions.aggregator_timeout_s
    return lambda: max(1, int((deadline - time.monotonic()) * 1000))


def _with_retries(deps: Deps, fx: SideEffects, call: Callable[[], JsonObject], code: str, *,
                  retry_unknown: bool) -> JsonObject:
    """Tier 1, as the recovery policy's row of `code` (what the saga fails with when this call does) says:
    retry a call that certainly did nothing (and, with `retry_unknown`, one that may have: only for
    idempotent calls); the last error is raised."""
    rng = random.Random()
    kind = recovery(code).tier1
    policy = tier1_policy(deps.settings.profile, kind) if kind else None
    attempts = policy.max_attempts if policy else 1
    for attempt in range(attempts):
        try:
            return call()
        except SideEffectError as e:
            again = e.retryable and (e.written == "no" or retry_unknown) and attempt + 1 < attempts
            if not again:
                raise
            assert policy is not None  # more than one attempt only with a policy
            fx.sleep(backoff_delay(policy, attempt, rng, e.envelope.retry_after_s))
    raise AssertionError("unreachable")  # pragma: no cover


def _open_ticket(deps: Deps, fx: SideEffects, step: Step) -> JsonObject:
    tickets = fx.tickets
    assert tickets is not None
    try:
        ticket = _with_retries(deps, fx, lambda: tickets.open(step.key, step.args), STEP_RETRY,
                               retry_unknown=False)
        return {"ticket_id": ticket.get("id"), "resolved_by": "answer"}
    except SideEffectError as e:
        if e.written != "unknown":
            raise
        ambiguous = e.envelope
    try:  # the outcome is unknown: ask the system about our key
        found = _with_retries(deps, fx, lambda: tickets.find(step.key) or {}, STEP_RETRY, retry_unknown=True)
    except SideEffectError as lookup_error:
        raise Unresolved(ambiguous, lookup_error.envelope.error_code) from lookup_error
    if not found:
        raise Unresolved(ambiguous, "not_found")
    return {"ticket_id": found.get("id"), "resolved_by": "lookup"}


def _publish(deps: Deps, fx: SideEffects, step: Step) -> JsonObject:
    notifier = fx.notifier
    assert notifier is not None
    return _with_retries(deps, fx, lambda: notifier.publish(step.key, COMPLETED_DETAIL, step.args), STEP_RETRY,
                         retry_unknown=True)


ACTIONS: dict[str, Callable[[Deps, SideEffects, Step], JsonObject]] = {TICKET: _open_ticket, PUBLISH: _publish}


def _action(deps: Deps, fx: SideEffects, step: Step) -> Callable[[], JsonObject]:
    return lambda: ACTIONS[step.name](deps, fx, step)


def _target_missing(fx: SideEffects, step: str) -> str | None:
    if step == TICKET and fx.tickets is None:
        return "no ticket system configured (ticket_url)"
    if step == PUBLISH and fx.notifier is None:
        return "no job-events topic configured"
    return None


# ------------------------------------------------------------------------------ the saga
def run_side_effects(deps: Deps, fx: SideEffects, job: Job, report: Report | None = None) -> SagaResult:
    """Run the job's side-effect steps not done yet (a running job whose report is written).

    Safe to repeat at any point: a done step is skipped (the job's record) or returns its stored
    outcome (the outcome store), and the external system dedups its key."""
    report = report or load_report(deps, job)
    remaining = _remaining(deps, fx)
    done: list[SideEffectDone] = []
    for step in plan(deps, job, report):
        current = deps.jobs.get(job.job_id)
        if current is None or current.state in (JobState.CANCELLING, JobState.CANCELLED):
            return SagaResult(SagaStatus.CANCELLED, done, job=current)
        if current.state is not JobState.RUNNING:
            return SagaResult(SagaStatus.NOT_RUNNING, done, job=current)
        job = current
        kept = next((r for r in job.side_effects if r.step == step.name), None)
        step, generation = _this_generation(step, kept)
        if kept is not None and kept.key == step.key and kept.status in (StepStatus.DONE, StepStatus.SKIPPED):
            done.append(kept)
            continue
        missing = _target_missing(fx, step.name)
        if missing:
            rec = SideEffectDone(step=step.name, operation=step.operation, key=step.key, status=StepStatus.SKIPPED,
                                   at=deps.clock(), reason=missing, generation=generation)
            _save(deps, job, rec, "sideeffect.skipped", reason=missing)
            done.append(rec)
            continue
        if kept is None or kept.key != step.key or kept.status is not StepStatus.STARTED:  # written ahead
            _save(deps, job, SideEffectDone(step=step.name, operation=step.operation, key=step.key,
                                            status=StepStatus.STARTED, at=deps.clock(), generation=generation),
                  "sideeffect.started")
        try:
            result = fx.outcomes.once(step.key, _action(deps, fx, step), remaining)
        except Unresolved as u:
            return _wait_for_approval(deps, job, step, u, done)
        except IdempotencyAlreadyInProgressError:
            deps.jobs.record_event(job.job_id, "sideeffect.in_progress", step=step.name, key=step.key)
            return SagaResult(SagaStatus.IN_PROGRESS, done, job=job)
        except SideEffectError as e:
            deps.jobs.record_event(job.job_id, "sideeffect.failed", step=step.name, key=step.key,
                                   error_code=e.envelope.error_code, http_status=e.envelope.http_status,
                                   provider_code=e.envelope.provider_code)
            return SagaResult(SagaStatus.FAILED, done, error=e.envelope, job=job)
        rec = SideEffectDone(step=step.name, operation=step.operation, key=step.key, status=StepStatus.DONE,
                               at=deps.clock(), result=result, generation=generation)
        _save(deps, job, rec, "sideeffect.done", **{k: v for k, v in result.items() if isinstance(v, str)})
        done.append(rec)
        after = deps.jobs.get(job.job_id)
        if after is not None and after.state in (JobState.CANCELLING, JobState.CANCELLED):
            # a cancel landed while the step ran (and may have finished, compensating what it saw before this
            # step was recorded): what the step just did is undone here, so nothing stays open under the job
            compensate(deps, fx, after, "job.cancelled")
            return SagaResult(SagaStatus.CANCELLED, done, job=deps.jobs.get(job.job_id))
    return SagaResult(SagaStatus.DONE, done, job=deps.jobs.get(job.job_id))


def _this_generation(step: Step, kept: SideEffectDone | None) -> tuple[Step, int]:
    """A step compensated (or sent to be) and now run again (`review retry` of a failed job) is a new action:
    a new ticket, a new "Review completed". Its key carries the generation, so it is not answered by the
    outcome of the step it replaces; retries of this run keep this key (the generation is on the record).
    A step of this generation recorded `started` or `done` keeps the key it was recorded with, even when its
    arguments derive another now (written by an older version): what it did, or may have done, is under that key."""
    if kept is None:
        return step, 0
    generation = kept.generation + (1 if kept.status in (StepStatus.COMPENSATED,
                                                         StepStatus.COMPENSATION_FAILED) else 0)
    if generation > 0:
        step = Step(step.job_id, step.name, step.operation, {**step.args, "generation": generation})
    if kept.generation == generation and kept.status in (StepStatus.STARTED, StepStatus.DONE):
        step = Step(step.job_id, step.name, step.operation, step.args, recorded_key=kept.key)
    return step, generation


def _save(deps: Deps, job: Job, rec: SideEffectDone, event: str, **detail: object) -> None:
    deps.jobs.record_side_effect(job.job_id, rec)  # never the job's version: a transition after this still holds
    deps.jobs.record_event(job.job_id, event, step=rec.step, key=rec.key, **detail)


def _wait_for_approval(deps: Deps, job: Job, step: Step, u: Unresolved, done: list[SideEffectDone]) -> SagaResult:
    now = deps.clock()
    approval = Approval(step=step.name, key=step.key, error=u.error, requested_at=now,
                        expires_at=now + deps.settings.profile.side_effects.approval_ttl_s,
                        reason=f"{step.name}: the request was sent but no answer came ({u.error.provider_code}); "
                               f"looking its key up said: {u.lookup}",
                        evidence={"operation": step.operation, "lookup": u.lookup,
                                  "http_status": u.error.http_status, "provider_code": u.error.provider_code})
    moved = lifecycle.transition(deps, job, JobState.WAITING_APPROVAL, event="job.waiting_approval",
                                 detail={"step": step.name, "key": step.key, "lookup": u.lookup,
                                         "expires_at": approval.expires_at},
                                 outcome=AwaitApproval(approval=approval))
    if moved is None:  # the job changed meanwhile (a cancel): nothing was decided here
        now_job = deps.jobs.get(job.job_id)
        status = SagaStatus.CANCELLED if now_job and now_job.state in (JobState.CANCELLING, JobState.CANCELLED) \
            else SagaStatus.NOT_RUNNING
        return SagaResult(status, done, evidence=approval, job=now_job)
    return SagaResult(SagaStatus.WAITING_APPROVAL, done, evidence=approval, error=u.error, job=moved)


# ------------------------------------------------------------------------------ compensation
class CompensationOrder(BaseModel):
    """What one compensation does; the compensation DLQ's message body (enough to run it again)."""

    job_id: str
    step: str
    key: str  # the step's key
    compensation_key: str
    operation: str  # close | withdraw
    args: JsonObject
    reason: str


def compensation_of(job: Job, rec: SideEffectDone, reason: str) -> CompensationOrder:
    if rec.step == TICKET:
        # the step's key too: a ticket whose outcome was unknown has no id, and without its key every such undo of
        # the job (a retried job's next generation) would share one compensation key, answered by the first's outcome
        args: JsonObject = {"ticket_id": rec.result.get("ticket_id"), "step_key": rec.key}
        op = "close"
    else:
        args = {"withdrawn_key": rec.key}
        op = "withdraw"
    return CompensationOrder(job_id=job.job_id, step=rec.step, key=rec.key,
                             compensation_key=step_key(job.job_id, rec.step, "compensate:" + op, args),
                             operation=op, args=args, reason=reason)


def _run_compensation(deps: Deps, fx: SideEffects, order: CompensationOrder) -> JsonObject:
    def act() -> JsonObject:
        if order.operation == "close":
            tickets = fx.tickets
            if tickets is None:
                raise SideEffectError(ErrorEnvelope.of("sideeffect.failed", "no ticket system configured: the "
                                                       "ticket cannot be closed", step=order.step), written="no",
                                      retryable=False)
            comment = (f"Withdrawn by the contract-review pipeline: job {order.job_id} ({order.reason}). "
                       "Its side effects are being undone.")
            ticket_id = order.args.get("ticket_id")
            if not ticket_id:  # the step's outcome was unknown: ask by its key
                found = _with_retries(deps, fx, lambda: tickets.find(order.key) or {}, COMPENSATION_RETRY,
                                      retry_unknown=True)
                if not found:
                    return {"ticket_id": None, "status": "never_created"}
                ticket_id = found.get("id")
            t = _with_retries(deps, fx, lambda: tickets.close(str(ticket_id), comment, order.compensation_key),
                              COMPENSATION_RETRY, retry_unknown=True)
            return {"ticket_id": t.get("id"), "status": t.get("status")}
        notifier = fx.notifier
        if notifier is None:
            raise SideEffectError(ErrorEnvelope.of("sideeffect.failed", "no job-events topic configured: the "
                                                   "withdrawal cannot be published", step=order.step), written="no",
                                  retryable=False)
        detail: JsonObject = {"job_id": order.job_id, "withdrawn_key": order.key, "reason": order.reason}
        return _with_retries(deps, fx, lambda: notifier.publish(order.compensation_key, WITHDRAWN_DETAIL, detail),
                             COMPENSATION_RETRY, retry_unknown=True)

    return fx.outcomes.once(order.compensation_key, act, _remaining(deps, fx))


def _step_order(rec: SideEffectDone) -> int:
    return STEP_ORDER.index(rec.step) if rec.step in STEP_ORDER else len(STEP_ORDER)


def compensate(deps: Deps, fx: SideEffects, job: Job, reason: str) -> CompensationResult:
    """Undo the job's done steps, last first (`reason`: `job.cancelled`, `job.approval_rejected`...).
    Idempotent: a compensated step is skipped, a compensation's outcome is kept under its own key. A
    step recorded `started` (its outcome unknown: it was acting, or the job waited for approval on it) is
    undone by its key: a ticket is looked up first and closed when it exists."""
    out = CompensationResult()
    fresh = deps.jobs.get(job.job_id) or job
    for rec in sorted(fresh.side_effects, key=_step_order, reverse=True):
        if rec.status is StepStatus.COMPENSATED:
            out.compensated.append(rec.step)
            continue
        if rec.status not in (StepStatus.STARTED, StepStatus.DONE, StepStatus.COMPENSATION_FAILED):
            continue  # skipped: nothing happened outside
        order = compensation_of(fresh, rec, reason)
        try:
            result = _run_compensation(deps, fx, order)
        except SideEffectError as e:
            env = ErrorEnvelope.of("sideeffect.compensation_failed",
                                   f"compensation of {rec.step} ({order.operation}) failed after its retries",
                                   step=rec.step, http_status=e.envelope.http_status,
                                   provider_code=e.envelope.provider_code, cause_code=e.envelope.error_code)
            _dead_letter(deps, fx, fresh, rec, order, env)
            out.dead_lettered.append(rec.step)
            continue
        done = rec.model_copy(update={"status": StepStatus.COMPENSATED, "compensation_key": order.compensation_key,
                                      "compensation_result": result, "error": None})
        _save(deps, fresh, done, "sideeffect.compensated", operation=order.operation, reason=reason)
        out.compensated.append(rec.step)
    return out


def compensate_job(deps: Deps, job: Job, reason: str) -> None:
    """The compensation port (`domain.ports.Compensator`) that wiring gives the state machine."""
    if deps.side_effects is None:
        raise ReviewError.of("sideeffect.compensation_failed", "the job has side effects but no side-effect "
                             "adapters are configured (IDEMPOTENCY_TABLE)", step="cancel")
    compensate(deps, deps.side_effects, job, reason)


def _dead_letter(deps: Deps, fx: SideEffects, job: Job, rec: SideEffectDone, order: CompensationOrder,
                 env: ErrorEnvelope) -> None:
    failed = rec.model_copy(update={"status": StepStatus.COMPENSATION_FAILED,
                                    "compensation_key": order.compensation_key, "error": env})
    if rec.status is not StepStatus.COMPENSATION_FAILED:  # dead-lettered once per step, not per attempt
        if fx.dlq is None:
            raise ReviewError(env.model_copy(update={"message": env.message + "; no compensation DLQ configured"}))
        fx.dlq.send(order.model_dump_json(), env, job_id=job.job_id, step=rec.step)
    _save(deps, job, failed, "sideeffect.compensation_failed", error_code=env.error_code, cause_code=env.cause_code)


def redrive_compensations(deps: Deps, fx: SideEffects) -> CompensationResult:
    """Run the dead-lettered compensations again (after the cause is fixed); each one that succeeds
    leaves the DLQ and marks its step `compensated`; one that fails again stays (one message, visible again at
    once). Messages another run holds are counted `in_flight`: neither compensated nor failing yet."""
    assert fx.dlq is not None, "no compensation DLQ configured"
    out = CompensationResult()
    for letter in fx.dlq.take_all():
        if _redrive_one(deps, fx, letter):
            fx.dlq.delete(letter.receipt_handle)
            out.compensated.append(letter.attributes.get("step", ""))
        else:  # back at once: the next redrive sees it (not hidden for the visibility timeout as if in flight)
            fx.dlq.release(letter.receipt_handle)
            out.dead_lettered.append(letter.attributes.get("step", ""))
            out.failing_jobs.append(letter.attributes.get("job_id", ""))
    out.in_flight = fx.dlq.in_flight()  # taken by another run (or one that stopped): their outcome is not known
    return out


def _redrive_one(deps: Deps, fx: SideEffects, letter: DeadLetter) -> bool:
    order = CompensationOrder.model_validate_json(letter.body)
    job = deps.jobs.get(order.job_id)
    try:
        result = _run_compensation(deps, fx, order)
    except SideEffectError as e:
        if job is not None:
            deps.jobs.record_event(job.job_id, "sideeffect.compensation_failed", step=order.step,
                                   error_code="sideeffect.compensation_failed", cause_code=e.envelope.error_code)
        return False
    if job is not None:
        rec = next((r for r in job.side_effects if r.step == order.step and r.key == order.key), None)
        if rec is not None:
            _save(deps, job, rec.model_copy(update={"status": StepStatus.COMPENSATED, "compensation_result": result,
                                                    "error": None}),
                  "sideeffect.compensated", operation=order.operation, reason=order.reason, redriven=True)
        else:  # the step has run again since (a newer generation is on the job): the event says what was undone
            deps.jobs.record_event(job.job_id, "sideeffect.compensated", step=order.step, key=order.key,
                                   operation=order.operation, reason=order.reason, redriven=True)
    return True


# ------------------------------------------------------------------------------ approval decided
def approval_expired(job: Job, now: float) -> bool:
    """A job waiting for approval past its `expires_at` (the sweeper ends it with `job.approval_expired`)."""
    return job.state is JobState.WAITING_APPROVAL and job.approval is not None and now >= job.approval.expires_at


class ApprovalEnded(JobFailure):
    """What ending a waiting job writes: the failure, and the approval with its decision."""

    approval: Approval


def fail_waiting(deps: Deps, job: Job, code: str, by: str = "") -> Job | None:
    """`waiting_approval -> compensating` with `job.approval_rejected` or `job.approval_expired`, the decision
    kept on the approval (`lifecycle.finish_compensation` undoes what was done, then the job is `failed`). None
    when the job was no longer waiting (decided or cancelled meanwhile)."""
    now = deps.clock()
    ev = job.approval
    step = ev.step if ev else ""
    env = ErrorEnvelope.of(code, f"the outcome of {step or 'a side effect'} stayed unknown and the job was "
                                 f"{'rejected' if code == 'job.approval_rejected' else 'not approved in time'}",
                           step=step)
    decided = ev.model_copy(update={"decision": "reject" if code == "job.approval_rejected" else "expired",
                                    "decided_by": by, "decided_at": now}) if ev else None
    outcome: JobFailure = (ApprovalEnded(error=env, error_code=code, ended_at=now, approval=decided) if decided
                           else JobFailure(error=env, error_code=code, ended_at=now))
    return lifecycle.fail_compensating(deps, job, outcome, event=code, detail={"by": by, "step": step})


def end_waiting(deps: Deps, job: Job, code: str, by: str = "") -> Job | None:
    """Reject or expiry in one go: `fail_waiting`, then what was done (the unknown step too, looked up by its
    key) is compensated and the job ends `failed`. None when the job was no longer waiting."""
    failing = fail_waiting(deps, job, code, by)
    if failing is None:
        return None
    lifecycle.finish_compensation(deps, failing)
    return deps.jobs.get(job.job_id)


def expire_approvals(deps: Deps, now: float | None = None) -> list[str]:
    """The sweeper: jobs waiting for approval past their `expires_at` fail with `job.approval_expired`, their
    side effects compensated before they end. The ids of the jobs ended now (a crash half-way leaves the job
    `compensating`: the sweeper's next run finishes it)."""
    now = deps.clock() if now is None else now
    ended = []
    for job in deps.jobs.stalled(now, state=JobState.WAITING_APPROVAL):
        if approval_expired(job, now) and end_waiting(deps, job, "job.approval_expired", by="sweeper"):
            ended.append(job.job_id)
    return ended
