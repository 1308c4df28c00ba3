"""The saga inside the pipeline, in-process on the fakes: the real intake, worker, aggregator (finalize,
control messages) and sweeper, with the side effects' fakes in `Deps.side_effects`. Counts what the
outside world saw: tickets opened and closed, events published."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract_review.domain import lifecycle
from contract_review.domain.messages import parse_results_body
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState, StepStatus, job_id_for
from contract_review.operate import job_view
from contract_review.pipeline import redrive
from contract_review.pipeline.aggregator import handle_message
from contract_review.sideeffects import approvals, saga
from contract_review.sideeffects.saga import COMPLETED_DETAIL, PUBLISH, TICKET, WITHDRAWN_DETAIL

from ...texts import RISKY
from ..fake_side_effects import FakeSideEffects
from ..fakes import SETTINGS, FakeWorld
from ..inprocess import Crash, InProcess
from ..scenarios import events_of, small_chunk_world

STEP_ATTEMPTS = SETTINGS.profile.side_effects.side_effect_attempts  # the saga's tier-1 attempts of one step call

KEY = "risky-msa"


def pipeline(fx: FakeSideEffects) -> tuple[FakeWorld, InProcess, str]:
    world = small_chunk_world()
    world.deps = replace(world.deps, side_effects=fx.fx, compensator=saga.compensate_job)
    p = InProcess(world)
    p.send({"text": RISKY}, key=KEY)
    p.intake()
    return world, p, job_id_for(KEY)


def state_of(world: FakeWorld, job_id: str) -> tuple[JobState, str | None]:
    job = world.jobs.get(job_id)
    assert job is not None
    return job.state, job.error_code


def run_until(p: InProcess, job_id: str, state: JobState, rounds: int = 40) -> None:
    for _ in range(rounds):
        job = p.world.jobs.get(job_id)
        if job is not None and job.state is state:
            return
        p.round()
    raise AssertionError(f"{job_id} never reached {state.value}: {state_of(p.world, job_id)}")


def test_a_job_with_a_high_risk_finding_completes_after_one_ticket_and_one_publish():
    fx = FakeSideEffects()
    world, p, job_id = pipeline(fx)
    job = p.run(job_id)
    assert job.state is JobState.COMPLETED, job.error
    assert fx.tickets.opened == 1 and fx.tickets.closed == 0 and len(fx.notifier.of(COMPLETED_DETAIL)) == 1
    assert {e.step: e.status for e in job.side_effects} == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.DONE}
    types = [e.type for e in world.jobs.events(job_id)]
    assert types.index("sideeffect.done") < types.index("job.completed")  # side effects before `completed`


def test_a_timeout_after_the_write_resolves_by_lookup_and_the_job_completes_with_one_ticket():
    fx = FakeSideEffects()
    fx.tickets.inject("timeout_after_write", "open")
    _, p, job_id = pipeline(fx)
    assert p.run(job_id).state is JobState.COMPLETED
    assert fx.tickets.opened == 1 and fx.tickets.calls.count("find") == 1


def waiting(fx: FakeSideEffects) -> tuple[FakeWorld, InProcess, str]:
    """The ticket is written but its answer lost, and the lookup is down: the job waits for approval."""
    fx.tickets.inject("timeout_after_write", "open")
    fx.tickets.inject("lookup_unavailable", "find", times=STEP_ATTEMPTS)
    world, p, job_id = pipeline(fx)
    run_until(p, job_id, JobState.WAITING_APPROVAL)
    assert fx.tickets.opened == 1 and fx.notifier.calls == 0
    return world, p, job_id


def test_approve_resumes_through_the_aggregator_with_the_same_key_and_one_ticket():
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    decided = approvals.decide_approval(world.deps, job_id, "approve", by="ops")
    assert decided.changed and decided.state is JobState.RUNNING
    job = p.run(job_id)  # the `resume` control message: finalize again, the step retried with its key
    assert job.state is JobState.COMPLETED, job.error
    assert fx.tickets.opened == 1 and fx.tickets.calls.count("open") == 2 and len(fx.notifier.of(COMPLETED_DETAIL)) == 1
    assert job.approval is not None and job.approval.decision == "approve" and job.approval.decided_by == "ops"


def test_reject_fails_the_job_and_the_aggregator_closes_the_ticket_it_opened():
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    assert approvals.decide_approval(world.deps, job_id, "reject", by="ops").changed
    p.run(job_id)  # the `reject` control message: compensation
    assert state_of(world, job_id) == (JobState.FAILED, "job.approval_rejected")
    assert fx.tickets.opened == fx.tickets.closed == 1 and fx.notifier.calls == 0


def test_no_decision_before_expiry_the_sweeper_fails_the_job_and_compensates():
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    world.clock.advance(world.settings.profile.side_effects.approval_ttl_s + 1)
    p.round()  # one sweep
    assert state_of(world, job_id) == (JobState.FAILED, "job.approval_expired")
    assert fx.tickets.opened == fx.tickets.closed == 1
    assert events_of(world, job_id, "job.approval_expired")


def test_cancel_after_the_ticket_compensates_tickets_opened_equal_tickets_closed():
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    assert lifecycle.request_cancel(world.deps, job_id, by="ops").changed
    job = p.run(job_id)
    assert job.state is JobState.CANCELLED
    assert fx.tickets.opened == fx.tickets.closed == 1


def test_cancel_after_both_steps_of_a_completed_job_is_refused_and_nothing_is_undone():
    fx = FakeSideEffects()
    world, p, job_id = pipeline(fx)
    p.run(job_id)
    assert not lifecycle.request_cancel(world.deps, job_id, by="ops").changed  # completed: already ended
    assert fx.tickets.closed == 0 and not fx.notifier.of(WITHDRAWN_DETAIL)


def test_a_publish_that_keeps_failing_fails_the_job_and_closes_its_ticket():
    fx = FakeSideEffects()
    fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)
    world, p, job_id = pipeline(fx)
    job = p.run(job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "sideeffect.failed")
    assert job.report_json_key  # the report was written: only the side effects failed
    assert fx.tickets.opened == fx.tickets.closed == 1


def test_retry_of_a_job_that_failed_only_in_its_side_effects_finalizes_at_once():
    """Every chunk is done, so `review retry` has nothing to send; it used to wait for the stall
    reconciler (20 minutes in prod). Now a done chunk's result goes to the aggregator, which finalizes at once."""
    fx = FakeSideEffects()
    fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)
    world, p, job_id = pipeline(fx)
    assert (p.run(job_id).state, world.jobs.get(job_id).error_code) == (JobState.FAILED, "sideeffect.failed")
    fx.notifier.clear()  # the publisher is back
    retried = redrive.retry(world.deps, job_id)
    assert retried.retried and "every chunk done: finalizing" in retried.action
    # WHEN the aggregator takes the one message retry sent (no time passes: no sweep, no stall reconciler)
    (sent,) = world.queues.drain(Queue.RESULTS)
    handle_message(world.deps, parse_results_body(sent.body))
    # THEN the job completed, its side effects done: the ticket its findings call for is open again
    assert state_of(world, job_id) == (JobState.COMPLETED, None)
    steps = {e.step: e.status for e in world.jobs.get(job_id).side_effects}
    assert steps == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.DONE}
    assert fx.tickets.opened - fx.tickets.closed == 1


def test_waiting_for_a_person_is_visible_and_watch_returns_at_once_with_its_own_exit_status(monkeypatch):
    """`--wait`/`watch` return as soon as a job waits for approval, with the commands to decide
    and exit status 3 (0: completed, 1: did not complete), and `review status` shows step, reason, evidence and
    the expiry as a date."""
    from click.testing import CliRunner

    from review_local import progress
    from review_local.cli import Ctx, cli
    from review_local.cli.jobs import EXIT_WAITING_APPROVAL

    fx = FakeSideEffects()
    world, _, job_id = waiting(fx)
    job = world.jobs.get(job_id)
    sleeps: list[float] = []
    monkeypatch.setattr(progress, "_sleep", sleeps.append)  # nothing would change: the watch must not wait

    def run(*args: str):
        return CliRunner().invoke(cli, list(args), obj=Ctx(None, None, deps=world.deps))
    watched = run("watch", job_id, "--timeout", "600")
    assert watched.exit_code == EXIT_WAITING_APPROVAL == 3 and sleeps == []
    assert f"`review approve {job_id}` or `review reject {job_id}`" in watched.output
    assert f"at step {job.approval.step}" in watched.output and "until 20" in watched.output
    shown = run("status", job_id)
    assert shown.exit_code == 0 and f"waits for approval: step {job.approval.step}" in shown.output
    assert "expires 20" in shown.output and "\n    evidence " in shown.output  # one line per piece of evidence
    # AND the decision commands it prints work
    assert run("approve", job_id).exit_code == 0 and world.jobs.get(job_id).state is JobState.RUNNING


def test_a_step_compensated_by_a_reject_runs_again_on_retry_when_the_findings_still_call_for_it():
    """Reject closes the ticket; a later `review retry` finalizes at once and opens it again (the
    high-risk finding is still there), so the job completes with one open ticket."""
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    assert approvals.decide_approval(world.deps, job_id, "reject", by="ops").changed
    job = p.run(job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "job.approval_rejected")
    assert fx.tickets.opened == fx.tickets.closed == 1
    assert redrive.retry(world.deps, job_id).retried
    job = p.run(job_id)
    assert job.state is JobState.COMPLETED, job.error
    assert {e.step: e.status for e in job.side_effects} == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.DONE}
    assert fx.tickets.opened - fx.tickets.closed == 1


def test_a_cancel_that_finishes_while_a_ticket_step_runs_leaves_no_ticket_open():
    """A slow ticket step while the sweeper finishes a cancel recorded its ticket on the
    cancelled job, and nobody closed it. The saga re-checks the job after each step and undoes what it just did."""
    fx = FakeSideEffects()
    world, p, job_id = pipeline(fx)
    real_open = fx.tickets.open
    cancelled: list[JobState] = []

    def open_while_cancelled(key, fields):
        answer = real_open(key, fields)  # the ticket is written ...
        lifecycle.request_cancel(world.deps, job_id, by="ops")  # ... and the cancel lands and finishes meanwhile
        cancelled.append(lifecycle.finish_cancel(world.deps, world.jobs.get(job_id)))
        return answer
    fx.tickets.open = open_while_cancelled  # type: ignore[method-assign]  # one call made slow
    job = p.run(job_id)
    assert cancelled == [JobState.CANCELLED] and job.state is JobState.CANCELLED
    assert fx.tickets.opened == fx.tickets.closed == 1  # opened, then closed by the saga itself
    assert {e.step: e.status for e in job.side_effects} == {TICKET: StepStatus.COMPENSATED}
    assert fx.notifier.calls == 0


def test_repeating_reject_finishes_a_compensation_whose_control_message_was_lost():
    """The reject's control message is lost, so the ticket stays open under the failed job;
    repeating `review reject` was refused ("not waiting"). Now it sends the compensation again."""
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    assert approvals.decide_approval(world.deps, job_id, "reject", by="ops").changed
    world.queues.drain(Queue.RESULTS)  # the control message is lost
    assert fx.tickets.opened == 1 and fx.tickets.closed == 0
    again = approvals.decide_approval(world.deps, job_id, "reject", by="ops")
    assert again.changed and "sent again" in again.message
    job = p.run(job_id)
    assert (job.state, job.error_code) == (JobState.FAILED, "job.approval_rejected")
    assert fx.tickets.opened == fx.tickets.closed == 1
    # AND once all is undone, a third reject is refused as before
    assert not approvals.decide_approval(world.deps, job_id, "reject", by="ops").changed


# --- written ahead, compensated before the job ends -------------------------------------------

def test_a_ticket_written_just_before_the_aggregator_died_is_closed_when_a_cancel_lands_before_the_redelivery():
    """The ticket system writes, the aggregator dies before the step is recorded, a cancel
    lands before the result's redelivery. Compensation used to undo only the steps recorded done, so the ticket
    stayed open; the step is now recorded `started` before it acts, and compensation looks its key up."""
    fx = FakeSideEffects()
    world, p, job_id = pipeline(fx)
    record = world.jobs.record_side_effect

    def die_recording_the_ticket(jid, effect):
        if effect.step == TICKET and effect.status is StepStatus.DONE:
            raise Crash()  # the aggregator is gone: the ticket exists, its `done` is never written
        return record(jid, effect)
    world.jobs.record_side_effect = die_recording_the_ticket  # type: ignore[method-assign]  # one call wrapped
    with pytest.raises(Crash):
        for _ in range(40):
            p.round()
    world.jobs.record_side_effect = record  # type: ignore[method-assign]
    assert fx.tickets.opened == 1 and state_of(world, job_id) == (JobState.RUNNING, None)
    assert lifecycle.request_cancel(world.deps, job_id, by="ops").changed  # before the result comes again
    job = p.run(job_id)
    assert job.state is JobState.CANCELLED
    assert fx.tickets.opened == fx.tickets.closed == 1 and fx.notifier.calls == 0
    assert {e.step: e.status for e in job.side_effects} == {TICKET: StepStatus.COMPENSATED}


def test_a_reject_whose_control_message_is_lost_is_compensated_by_the_sweeper_before_the_job_fails():
    """Reject wrote `failed` and sent the compensation in a control message; lost, the ticket
    stayed open under a failed job, with no DLQ message and no alarm. Now the job is `compensating` until what it
    did is undone, and the sweeper finishes a compensating job nobody is finishing."""
    fx = FakeSideEffects()
    world, p, job_id = waiting(fx)
    assert approvals.decide_approval(world.deps, job_id, "reject", by="ops").changed
    world.queues.drain(Queue.RESULTS)  # the control message is lost
    assert state_of(world, job_id) == (JobState.COMPENSATING, "job.approval_rejected")  # not terminal: work left
    # meanwhile a retry and a cancel say what is going on, and change nothing
    retried, cancel = redrive.retry(world.deps, job_id), lifecycle.request_cancel(world.deps, job_id, by="ops")
    assert not retried.retried and "being undone" in retried.action
    assert not cancel.changed and "being undone" in cancel.message
    view = job_view.job_view(world.deps, job_id)
    assert view is not None
    answers = view.answers
    assert "being undone" in answers.retry_would and "ends `failed`" in answers.if_cancelled_now
    assert "compensation DLQ" in answers.if_it_fails_again
    world.clock.advance(world.settings.claim_lease_s + 1)
    p.round()  # a sweep once it was idle a lease long (as for a cancelling job): finished here
    assert state_of(world, job_id) == (JobState.FAILED, "job.approval_rejected")
    assert fx.tickets.opened == fx.tickets.closed == 1


@pytest.mark.parametrize("how", ["expiry", "saga_failed"])
def test_a_compensation_that_dies_half_way_is_finished_by_the_next_sweep(how: str):
    """The expiry sweeper (or the aggregator failing a saga) died after writing `failed` and
    before closing the ticket: nothing retried it. Now it dies with the job `compensating`, and a later sweep
    closes the ticket, once, then fails the job."""
    fx = FakeSideEffects()
    if how == "expiry":
        world, p, job_id = waiting(fx)
        world.clock.advance(world.settings.profile.side_effects.approval_ttl_s + 1)
    else:
        fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)  # the publish fails for good
        world, p, job_id = pipeline(fx)
    real_close = fx.tickets.close
    died: list[str] = []

    def close_and_die(ticket_id, comment, key):
        if not died:
            died.append(ticket_id)
            raise Crash()  # the process is gone before the close is sent
        return real_close(ticket_id, comment, key)
    fx.tickets.close = close_and_die  # type: ignore[method-assign]  # one call wrapped
    for _ in range(40):
        try:
            p.round()
        except Crash:
            pass  # the aggregator died: its message is lost with it
        if died:
            break
    code = "job.approval_expired" if how == "expiry" else "sideeffect.failed"
    assert died and state_of(world, job_id) == (JobState.COMPENSATING, code) and fx.tickets.closed == 0
    world.clock.advance(world.settings.claim_lease_s + 1)
    fx.persistence.lapse_in_progress()  # the dead invocation's in-progress record of the close timed out with it
    p.round()
    assert state_of(world, job_id) == (JobState.FAILED, code)
    assert fx.tickets.opened == fx.tickets.closed == 1


def test_a_reopened_job_keeps_nothing_of_its_earlier_ending():
    """Found by the lifecycle soak: a failed job retried kept its first ending's `n_findings` and report key; when
    the retry then ended in a way that writes no report fields (waiting for approval, then rejected or expired), the
    job named a report its counts disagreed with (11 findings on the job, 23 in the report)."""
    fx = FakeSideEffects()
    fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)
    world, p, job_id = pipeline(fx)
    failed = p.run(job_id)
    assert failed.state is JobState.FAILED and failed.n_findings and failed.report_json_key and failed.reliability
    assert redrive.retry(world.deps, job_id).retried
    reopened = world.jobs.get(job_id)
    assert reopened is not None and reopened.state is JobState.RUNNING
    assert (reopened.n_findings, reopened.report_json_key, reopened.reliability, reopened.ended_at) == (
        None, None, None, None)
