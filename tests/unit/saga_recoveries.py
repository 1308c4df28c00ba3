"""The documented recoveries of the side-effect codes (errors.py), executed on the fakes: the fault
that produces the code, the job as it leaves it, then exactly what the recovery text says to do, and
then the side effects must stand as if no fault had happened: each done exactly once, or each undone.
`tests/unit/reliability/test_recoveries.py` runs these with every other code's recovery."""

from __future__ import annotations

from collections.abc import Callable

from contract_review.domain.errors import REGISTRY
from contract_review.domain.records import JobState, StepStatus
from contract_review.pipeline import redrive
from contract_review.sideeffects import approvals, saga
from contract_review.sideeffects.saga import COMPLETED_DETAIL, PUBLISH, TICKET

from .fake_side_effects import FakeSideEffects
from .fakes import FakeWorld
from .sideeffects.test_saga import finished_job, job, unknown_outcome
from .sideeffects.test_saga_pipeline import pipeline, waiting


def _recovery(code: str) -> str:
    return REGISTRY[code].recovery


def sideeffect_failed(code: str) -> None:
    """The notifier fails on every attempt after the ticket was opened: the job fails with the code and the
    ticket is closed; once the cause is fixed, `review retry JOB` runs the side effects again: a new ticket
    (the closed one stays closed), one "Review completed", the job completed."""
    fx = FakeSideEffects()
    fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)
    world, p, job_id = pipeline(fx)
    assert (p.run(job_id).state, p.world.jobs.get(job_id).error_code) == (JobState.FAILED, code)  # type: ignore[union-attr]  # the job exists
    assert fx.tickets.opened == fx.tickets.closed == 1
    fx.notifier.clear()  # fixed
    assert redrive.retry(world.deps, job_id).retried
    job = p.run(job_id)
    assert job.state is JobState.COMPLETED, job.error
    assert (fx.tickets.opened, fx.tickets.closed, len(fx.notifier.of(COMPLETED_DETAIL))) == (2, 1, 1)
    [ticket] = [r for r in job.side_effects if r.step == TICKET]
    assert ticket.generation == 1 and fx.tickets.tickets[str(ticket.result["ticket_id"])]["status"] == "open"
    assert "review retry" in _recovery(code)


def sideeffect_unauthorized(code: str) -> None:
    """The ticket system refuses our credentials: the job fails with the code, nothing was written; once a valid
    credential is in the secret, `review retry JOB` opens the one ticket and completes the job."""
    fx = FakeSideEffects()
    fx.tickets.inject("unauthorized", "open", times=-1)
    world, p, job_id = pipeline(fx)
    assert (p.run(job_id).state, p.world.jobs.get(job_id).error_code) == (JobState.FAILED, code)  # type: ignore[union-attr]  # the job exists
    assert fx.tickets.opened == 0 and not fx.notifier.of(COMPLETED_DETAIL)
    fx.tickets.clear()  # `aws secretsmanager put-secret-value ...`: the credential is valid again
    assert redrive.retry(world.deps, job_id).retried
    job = p.run(job_id)
    assert job.state is JobState.COMPLETED, job.error
    assert (fx.tickets.opened, fx.tickets.closed, len(fx.notifier.of(COMPLETED_DETAIL))) == (1, 0, 1)
    assert "put-secret-value" in _recovery(code) and "review retry" in _recovery(code)


def sideeffect_ambiguous(code: str) -> None:
    """The outcome stays unknown: the job waits with the evidence; `review approve` retries with the same key."""
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    job = world.jobs.get(job_id)
    assert job is not None and job.approval is not None and job.approval.error is not None
    assert job.approval.error.error_code == code
    assert approvals.decide_approval(world.deps, job_id, "approve", by="ops").changed
    assert p.run(job_id).state is JobState.COMPLETED  # the aggregator takes the resume: the step, its key again
    assert fx.tickets.opened == 1 and len(fx.notifier.of(COMPLETED_DETAIL)) == 1
    assert "review approve" in _recovery(code)


def compensation_failed(code: str) -> None:
    """Every close fails: the compensation is dead-lettered with the code; fixed, the DLQ is redriven."""
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    saga.run_side_effects(world.deps, fx.fx, j)
    fx.tickets.inject("error_before_write", "close", times=-1)
    out = saga.compensate(world.deps, fx.fx, j, reason="job.cancelled")
    assert out.dead_lettered == [TICKET]
    [letter] = fx.dlq.messages.values()
    assert letter.attributes["error_code"] == code
    fx.tickets.clear()
    assert saga.redrive_compensations(world.deps, fx.fx).compensated == [TICKET]
    assert fx.tickets.opened == fx.tickets.closed == 1 and not fx.dlq.messages
    assert {r.step: r.status for r in job(world, j.job_id).side_effects} == {
        TICKET: StepStatus.COMPENSATED, PUBLISH: StepStatus.COMPENSATED}
    assert "redrive" in _recovery(code)


def approval_ended(code: str) -> None:
    """Rejected or expired: the job fails with the code and what happened is undone (nothing else to do)."""
    world, fx = FakeWorld(), FakeSideEffects()
    waiting = unknown_outcome(world, fx, written=True)
    if code == "job.approval_expired":
        world.clock.advance(world.settings.profile.side_effects.approval_ttl_s + 1)
        assert saga.approval_expired(waiting, world.clock())
    ended = saga.end_waiting(world.deps, waiting, code)
    assert ended is not None and (ended.state, ended.error_code) == (JobState.FAILED, code)
    assert [r.status for r in ended.side_effects] == [StepStatus.COMPENSATED]
    assert fx.tickets.opened == fx.tickets.closed == 1 and fx.notifier.calls == 0
    assert "compensated" in _recovery(code)


SAGA_RECOVERIES: dict[str, Callable[[str], None]] = {
    "sideeffect.failed": sideeffect_failed,
    "sideeffect.unauthorized": sideeffect_unauthorized,
    "sideeffect.ambiguous": sideeffect_ambiguous,
    "sideeffect.compensation_failed": compensation_failed,
    "job.approval_rejected": approval_ended,
    "job.approval_expired": approval_ended,
}
