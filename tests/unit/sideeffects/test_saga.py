"""The job's side effects as a saga (`contract_review/sideeffects/saga.py`), on the in-memory fakes: the real
Powertools `@idempotent_function` over an in-memory persistence layer, a fake ticket system with the
`Idempotency-Key` contract and scripted failures, a fake notifier, a fake compensation DLQ. Every test
counts the side effects themselves: tickets opened and closed, events published."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pydantic import JsonValue

from contract_review.domain import lifecycle
from contract_review.domain.keys import report_keys
from contract_review.domain.messages import JobControl
from contract_review.domain.ports import Queue
from contract_review.domain.records import Job, JobState, Reliability, SideEffectDone, StepStatus, job_id_for
from contract_review.pipeline import aggregator
from contract_review.review.analysts import Finding
from contract_review.review.report import Report, coverage_of
from contract_review.sideeffects import saga
from contract_review.sideeffects.saga import COMPLETED_DETAIL, PUBLISH, TICKET, WITHDRAWN_DETAIL, SagaStatus, step_key

from ..fake_side_effects import FakeSideEffects
from ..fakes import SETTINGS, FakeWorld
from ..scenarios import events_of

STEP_ATTEMPTS = SETTINGS.profile.side_effects.side_effect_attempts  # the saga's tier-1 attempts of one step call


def finding(score: float, category: str = "liability_cap", index: int = 0) -> Finding:
    return Finding(category=category, score=score, quote="each party's aggregate liability", start=index * 100,
                   end=index * 100 + 30, rationale="raises risk", analyst="liability", chunk_id=f"c{index:05d}-x",
                   chunk_index=index)


def finished_job(world: FakeWorld, scores: tuple[float, ...] = (0.9, 0.3), key: str = "nda-1") -> Job:
    """A running job whose report is written (the aggregator's finalize is where the saga runs)."""
    job_id, now = job_id_for(key), world.clock()
    job, _ = world.jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now,
                                   idempotency_key=key, document_id="nda-acme", chunk_count=len(scores),
                                   analyst_count=11, model_id="offline-rules-v1"))
    findings = [finding(s, index=i) for i, s in enumerate(scores)]
    report = Report(job_id=job_id, state=JobState.COMPLETED, document_id="nda-acme", document_sha256="0" * 64,
                    model_id="offline-rules-v1", prompt_version="p", chunk_count=len(scores), findings=findings,
                    coverage=coverage_of(11, []), reliability=Reliability())
    world.artifacts.put_text(report_keys(job_id)[0], report.model_dump_json())
    return job


def job(world: FakeWorld, job_id: str) -> Job:
    j = world.jobs.get(job_id)
    assert j is not None
    return j


def steps(j: Job) -> dict[str, StepStatus]:
    return {r.step: r.status for r in j.side_effects}


# --- the happy path and what "high risk" means ------------------------------------------------------

def test_a_report_with_high_risk_findings_opens_one_ticket_and_publishes_once():
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    # WHEN the saga runs
    result = saga.run_side_effects(world.deps, fx.fx, j)
    # THEN one ticket (for the one finding scored >= 0.7) naming the report, and one "Review completed" event with
    # the job's id and state only: the topic is every principal's, so no report location, document id or count
    assert result.status is SagaStatus.DONE
    assert fx.tickets.opened == 1 and fx.tickets.closed == 0
    [event] = fx.notifier.of(COMPLETED_DETAIL)
    assert event == {"job_id": j.job_id, "state": "completed"}
    [ticket_fields] = [t["fields"] for t in fx.tickets.tickets.values()]
    assert ticket_fields["report"] == f"s3://{world.artifacts.bucket}/{report_keys(j.job_id)[0]}"  # type: ignore[index]  # a dict of JSON
    assert steps(job(world, j.job_id)) == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.DONE}
    # AND the ticket carries our key, the key is the step's hash, and no document text went out
    [ticket] = fx.tickets.tickets.values()
    rec = next(r for r in job(world, j.job_id).side_effects if r.step == TICKET)
    assert ticket["idempotency_key"] == rec.key == step_key(j.job_id, TICKET, "create", ticket["fields"])  # type: ignore[arg-type]  # a dict of JSON
    assert "aggregate liability" not in json.dumps(ticket) + json.dumps(fx.notifier.published)
    assert [e["step"] for e in events_of(world, j.job_id, "sideeffect.done")] == [TICKET, PUBLISH]


def test_a_report_without_high_risk_findings_only_publishes():
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world, scores=(0.69, 0.3))
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.DONE
    assert fx.tickets.opened == 0 and len(fx.notifier.of(COMPLETED_DETAIL)) == 1
    assert steps(job(world, j.job_id)) == {PUBLISH: StepStatus.DONE}


def test_without_a_ticket_system_the_ticket_step_is_skipped_with_an_event():
    world, fx = FakeWorld(), FakeSideEffects(with_tickets=False)
    j = finished_job(world)
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.DONE
    assert steps(job(world, j.job_id)) == {TICKET: StepStatus.SKIPPED, PUBLISH: StepStatus.DONE}
    [skipped] = events_of(world, j.job_id, "sideeffect.skipped")
    assert skipped["step"] == TICKET and "ticket_url" in str(skipped["reason"])


def test_keys_are_deterministic_and_distinct():
    args = {"b": 1, "a": [1, 2]}
    assert step_key("job-1", TICKET, "create", args) == step_key("job-1", TICKET, "create", {"a": [1, 2], "b": 1})
    assert len({step_key("job-1", TICKET, "create", args), step_key("job-2", TICKET, "create", args),
                step_key("job-1", PUBLISH, "create", args), step_key("job-1", TICKET, "close", args),
                step_key("job-1", TICKET, "create", {"b": 2, "a": [1, 2]})}) == 5


# --- a job in flight across the upgrade that took the report out of the published event ------------------

def _recorded_by_the_previous_version(world: FakeWorld, fx: FakeSideEffects, j: Job, *, published: bool,
                                      status: StepStatus) -> str:
    """The publish step as the version before wrote it: its arguments named the report, the document and counts
    (so its key, the hash of them, is not the key those of today derive). `published`: its publish went out (its
    outcome stored under that key) before the job's record was written or the invocation ended."""
    json_key, md_key = report_keys(j.job_id)
    bucket = world.artifacts.bucket
    old_args: dict[str, JsonValue] = {
        "job_id": j.job_id, "document_id": j.document_id, "report": f"s3://{bucket}/{json_key}",
        "report_md": f"s3://{bucket}/{md_key}", "state": "completed", "findings": 1, "high_risk_findings": 0}
    old_key = step_key(j.job_id, PUBLISH, "publish", old_args)
    world.jobs.record_side_effect(j.job_id, SideEffectDone(step=PUBLISH, operation="publish", key=old_key,
                                                           status=status, at=world.clock()))
    if published:
        fx.fx.outcomes.once(old_key, lambda: fx.notifier.publish(old_key, COMPLETED_DETAIL, old_args), lambda: 60_000)
    return old_key


@pytest.mark.parametrize("status", [StepStatus.STARTED, StepStatus.DONE])
def test_a_publish_the_previous_version_made_is_not_made_again(status: StepStatus):
    # GIVEN a job whose "Review completed" the previous version published, recorded `started` (the invocation ended
    # before `done`) or `done` (the saga's message is delivered again)
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world, scores=(0.3,))
    old_key = _recorded_by_the_previous_version(world, fx, j, published=True, status=status)
    assert old_key != saga.plan(world.deps, j, saga.load_report(world.deps, j))[0].key
    # WHEN this version runs the job's saga
    result = saga.run_side_effects(world.deps, fx.fx, j)
    # THEN nothing is published again: the step is done under the key it was recorded with
    assert result.status is SagaStatus.DONE
    assert len(fx.notifier.of(COMPLETED_DETAIL)) == 1 and fx.notifier.calls == 1
    [rec] = job(world, j.job_id).side_effects
    assert (rec.step, rec.key, rec.status) == (PUBLISH, old_key, StepStatus.DONE)


def test_a_publish_the_previous_version_started_but_never_made_is_made_once_under_its_recorded_key():
    # GIVEN a job whose publish the previous version recorded `started`, then crashed before publishing
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world, scores=(0.3,))
    old_key = _recorded_by_the_previous_version(world, fx, j, published=False, status=StepStatus.STARTED)
    # WHEN this version runs the job's saga, twice (a redelivered message)
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.DONE
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.DONE
    # THEN the event went out once, today's body under the recorded key (a subscriber that saw an earlier attempt
    # drops it by that key), and a compensation would withdraw that key
    assert fx.notifier.published == [(old_key, COMPLETED_DETAIL, {"job_id": j.job_id, "state": "completed"})]
    [rec] = job(world, j.job_id).side_effects
    assert (rec.key, rec.status) == (old_key, StepStatus.DONE)
    assert saga.compensation_of(job(world, j.job_id), rec, "job.cancelled").args == {"withdrawn_key": old_key}


# --- retries: the stored outcome, never a second action ---------------------------------------------

def test_the_same_steps_retried_return_the_stored_outcome():
    # GIVEN a saga that ran to the end, but whose writes to the job record were lost (a crash after acting)
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    first = saga.run_side_effects(world.deps, fx.fx, j)
    world.jobs.items[j.job_id] = world.jobs.items[j.job_id].model_copy(update={"side_effects": []})
    calls = (list(fx.tickets.calls), fx.notifier.calls)
    # WHEN the saga runs again (a redelivered message, the sweeper's finalize)
    second = saga.run_side_effects(world.deps, fx.fx, j)
    # THEN the outcome store answers: the ticket system and the notifier are not called again
    assert second.status is SagaStatus.DONE
    assert (fx.tickets.calls, fx.notifier.calls) == calls
    assert fx.tickets.opened == 1 and len(fx.notifier.of(COMPLETED_DETAIL)) == 1
    assert [r.result for r in second.steps] == [r.result for r in first.steps]
    assert fx.persistence.completed() == 2


def test_a_5xx_before_the_write_is_retried_with_the_same_key():
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    fx.tickets.inject("error_before_write", "open", times=2)
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.DONE
    assert fx.tickets.calls.count("open") == 3 and fx.tickets.opened == 1 and len(fx.sleeps) == 2


def test_a_step_that_keeps_failing_fails_the_saga_and_what_was_done_is_compensated():
    # GIVEN the ticket is opened, then the notifier fails on every attempt
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    fx.notifier.inject("error_before_write", COMPLETED_DETAIL, times=-1)
    result = saga.run_side_effects(world.deps, fx.fx, j)
    # THEN the saga fails with sideeffect.failed after its tier-1 attempts
    assert result.status is SagaStatus.FAILED and result.error is not None
    assert result.error.error_code == "sideeffect.failed" and fx.notifier.calls == STEP_ATTEMPTS
    assert events_of(world, j.job_id, "sideeffect.failed")[0]["step"] == PUBLISH
    # the publish was written ahead: started, its outcome not known (an earlier attempt may have gone out)
    assert steps(job(world, j.job_id)) == {TICKET: StepStatus.DONE, PUBLISH: StepStatus.STARTED}
    # WHEN the caller compensates THEN the ticket is closed (tickets opened = tickets closed) and, the publish
    # having maybe gone out, a withdrawal follows it under its own key (a subscriber drops one it never saw)
    fx.notifier.clear()
    out = saga.compensate(world.deps, fx.fx, job(world, j.job_id), reason="sideeffect.failed")
    assert out.complete and out.compensated == [PUBLISH, TICKET]
    assert fx.tickets.opened == fx.tickets.closed == 1 and len(fx.notifier.of(WITHDRAWN_DETAIL)) == 1
    assert steps(job(world, j.job_id)) == {TICKET: StepStatus.COMPENSATED, PUBLISH: StepStatus.COMPENSATED}


# --- ambiguous outcomes ------------------------------------------------------------------------------

def test_a_timeout_after_the_write_is_looked_up_and_resumed_without_a_second_ticket():
    # GIVEN the ticket system writes the ticket, then the answer never comes (read timeout)
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    fx.tickets.inject("timeout_after_write", "open")
    # WHEN the saga runs
    result = saga.run_side_effects(world.deps, fx.fx, j)
    # THEN it looks the key up, finds the ticket, and goes on: one ticket, one publish, job still running
    assert result.status is SagaStatus.DONE
    assert fx.tickets.calls == ["open", "find"] and fx.tickets.opened == 1
    rec = next(r for r in result.steps if r.step == TICKET)
    assert rec.result["resolved_by"] == "lookup" and rec.result["ticket_id"] == "TCK-00001"
    assert len(fx.notifier.of(COMPLETED_DETAIL)) == 1 and job(world, j.job_id).state is JobState.RUNNING


def unknown_outcome(world: FakeWorld, fx: FakeSideEffects, *, written: bool) -> Job:
    """The ticket call times out; the lookup cannot tell (not found, or the lookup fails): the job waits."""
    world.deps = replace(world.deps, side_effects=fx.fx, compensator=saga.compensate_job)
    j = finished_job(world)
    if written:  # the write happened, but the lookup is down
        fx.tickets.inject("timeout_after_write", "open")
        fx.tickets.inject("lookup_unavailable", "find", times=STEP_ATTEMPTS)
    else:
        fx.tickets.inject("timeout_before_write", "open")
    result = saga.run_side_effects(world.deps, fx.fx, j)
    assert result.status is SagaStatus.WAITING_APPROVAL
    waiting = job(world, j.job_id)
    assert waiting.state is JobState.WAITING_APPROVAL and waiting.approval is not None
    return waiting


def test_an_outcome_that_stays_unknown_waits_for_approval_with_the_evidence():
    world, fx = FakeWorld(), FakeSideEffects()
    waiting = unknown_outcome(world, fx, written=False)
    ev = waiting.approval
    assert ev is not None
    assert ev.error is not None
    assert (ev.step, ev.evidence["lookup"], ev.error.error_code) == (TICKET, "not_found", "sideeffect.ambiguous")
    assert ev.key == step_key(waiting.job_id, TICKET, "create", saga.plan(
        world.deps, waiting, saga.load_report(world.deps, waiting))[0].args)
    assert ev.expires_at == ev.requested_at + world.settings.profile.side_effects.approval_ttl_s
    # nothing after the unknown step started, nothing was recorded as its outcome: the step was written ahead
    # (started, its key), which is what compensation looks up
    assert fx.notifier.calls == 0 and fx.persistence.completed() == 0
    assert [(r.step, r.key, r.status) for r in waiting.side_effects] == [(TICKET, ev.key, StepStatus.STARTED)]


@pytest.mark.parametrize("code", ["job.approval_rejected", "job.approval_expired"])
@pytest.mark.parametrize("written", [True, False])
def test_reject_or_expiry_fails_the_job_with_its_code_and_compensates(code: str, written: bool):
    world, fx = FakeWorld(), FakeSideEffects()
    waiting = unknown_outcome(world, fx, written=written)
    if code == "job.approval_expired":
        assert not saga.approval_expired(waiting, waiting.approval.requested_at + 1)  # type: ignore[union-attr]  # set
        world.clock.advance(world.settings.profile.side_effects.approval_ttl_s + 1)
        assert saga.approval_expired(waiting, world.clock())
    # WHEN the approval is rejected (or expires)
    ended = saga.end_waiting(world.deps, waiting, code)
    # THEN the job fails with the code, and the ticket (if it was written after all) is closed
    assert ended is not None and (ended.state, ended.error_code) == (JobState.FAILED, code)
    assert [r.status for r in ended.side_effects] == [StepStatus.COMPENSATED]
    assert ended.side_effects[0].compensation_result["status"] == ("closed" if written else "never_created")
    assert fx.tickets.opened == fx.tickets.closed == (1 if written else 0)
    assert fx.notifier.calls == 0  # nothing was published, so nothing is withdrawn


# --- compensation -----------------------------------------------------------------------------------

def test_compensation_after_cancel_closes_every_ticket_and_withdraws_in_reverse_order():
    # GIVEN both steps done, then the job is cancelled
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    saga.run_side_effects(world.deps, fx.fx, j)
    cancelling = lifecycle.transition(world.deps, job(world, j.job_id), JobState.CANCELLING, event="job.cancelling")
    assert cancelling is not None
    # WHEN the saga is asked to run again THEN no step starts
    calls = (list(fx.tickets.calls), fx.notifier.calls)
    assert saga.run_side_effects(world.deps, fx.fx, cancelling).status is SagaStatus.CANCELLED
    assert (fx.tickets.calls, fx.notifier.calls) == calls
    # WHEN compensation runs (twice: it is idempotent)
    out = saga.compensate(world.deps, fx.fx, cancelling, reason="job.cancelled")
    again = saga.compensate(world.deps, fx.fx, cancelling, reason="job.cancelled")
    # THEN tickets opened = tickets closed, one withdrawal, publish undone first (reverse order)
    assert out.compensated == [PUBLISH, TICKET] and again.compensated == [PUBLISH, TICKET]
    assert fx.tickets.opened == fx.tickets.closed == 1 and fx.tickets.calls.count("close") == 1
    [withdrawn] = fx.notifier.of(WITHDRAWN_DETAIL)
    assert withdrawn["reason"] == "job.cancelled"
    assert steps(job(world, j.job_id)) == {TICKET: StepStatus.COMPENSATED, PUBLISH: StepStatus.COMPENSATED}
    assert "job.cancelled" in str(next(iter(fx.tickets.tickets.values()))["close_comment"])


def test_a_cancel_before_the_saga_starts_no_step():
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world)
    assert lifecycle.transition(world.deps, j, JobState.CANCELLING, event="job.cancelling") is not None
    assert saga.run_side_effects(world.deps, fx.fx, j).status is SagaStatus.CANCELLED
    assert fx.tickets.calls == [] and fx.notifier.calls == 0


def test_a_compensation_that_keeps_failing_lands_in_the_compensation_dlq_with_its_envelope():
    # GIVEN a done ticket step, and a ticket system that fails every close
    world, fx = FakeWorld(), FakeSideEffects()
    j = finished_job(world, scores=(0.95,))
    saga.run_side_effects(world.deps, fx.fx, j)
    fx.tickets.inject("error_before_write", "close", times=-1)
    # WHEN compensation runs
    out = saga.compensate(world.deps, fx.fx, j, reason="job.cancelled")
    # THEN the publish is withdrawn, the ticket's close was retried and then dead-lettered, not dropped
    assert out.compensated == [PUBLISH] and out.dead_lettered == [TICKET] and not out.complete
    assert fx.tickets.calls.count("close") == SETTINGS.profile.side_effects.compensation_attempts and fx.tickets.closed == 0
    [letter] = fx.dlq.messages.values()
    assert letter.attributes["error_code"] == "sideeffect.compensation_failed"
    envelope = json.loads(letter.attributes["envelope"])
    assert (envelope["cause_code"], envelope["http_status"], envelope["step"]) == ("sideeffect.failed", 503, TICKET)
    order = json.loads(letter.body)
    assert (order["job_id"], order["operation"], order["args"]["ticket_id"]) == (j.job_id, "close", "TCK-00001")
    rec = next(r for r in job(world, j.job_id).side_effects if r.step == TICKET)
    assert rec.status is StepStatus.COMPENSATION_FAILED and rec.error is not None
    assert events_of(world, j.job_id, "sideeffect.compensation_failed")
    # AND compensating again does not dead-letter it twice
    saga.compensate(world.deps, fx.fx, j, reason="job.cancelled")
    assert len(fx.dlq.messages) == 1
    # WHEN the ticket system is fixed and the DLQ redriven THEN the ticket is closed and the DLQ empty
    fx.tickets.clear()
    redriven = saga.redrive_compensations(world.deps, fx.fx)
    assert redriven.compensated == [TICKET] and not fx.dlq.messages
    assert fx.tickets.opened == fx.tickets.closed == 1
    assert steps(job(world, j.job_id))[TICKET] is StepStatus.COMPENSATED


# --- review approve / review reject -----------------------------------------------------------------

def test_review_approve_and_reject_decide_a_waiting_job_and_refuse_any_other():
    from ..local.test_cli import run

    world, fx = FakeWorld(), FakeSideEffects()
    waiting = unknown_outcome(world, fx, written=True)
    # approve: running again, a `resume` control message for the aggregator in the job's FIFO group
    approved = run(world, "approve", waiting.job_id)
    assert approved.exit_code == 0, approved.output
    assert job(world, waiting.job_id).state is JobState.RUNNING
    [control] = [json.loads(s.body) for s in world.queues.sent[Queue.RESULTS] if "control" in json.loads(s.body)]
    assert (control["job_id"], control["control"]) == (waiting.job_id, "resume")
    # a second decision: the job is not waiting any more (exit 1, one line saying so)
    again = run(world, "reject", waiting.job_id)
    assert again.exit_code == 1 and "not waiting for approval" in again.output
    assert again.output.count("not waiting for approval") == 1 and not again.stdout  # said once, as the error
    # reject on another waiting job: failed with job.approval_rejected
    other_world, other_fx = FakeWorld(), FakeSideEffects()
    other = unknown_outcome(other_world, other_fx, written=False)
    rejected = run(other_world, "reject", other.job_id, "--no-wait")  # nothing here runs the aggregator: not waited
    assert rejected.exit_code == 0, rejected.output
    # failing, its error written; what it did is undone (the aggregator, on the control message) before `failed`
    assert (job(other_world, other.job_id).state, job(other_world, other.job_id).error_code) == (
        JobState.COMPENSATING, "job.approval_rejected")
    [reject] = [json.loads(s.body) for s in other_world.queues.sent[Queue.RESULTS] if "control" in json.loads(s.body)]
    assert aggregator.handle_message(other_world.deps, JobControl.model_validate(reject)) == "failed"
    ended = job(other_world, other.job_id)
    assert (ended.state, ended.error_code) == (JobState.FAILED, "job.approval_rejected")
    assert ended.side_effects[0].compensation_result["status"] == "never_created" and other_fx.tickets.opened == 0


def test_review_compensations_lists_the_dead_letters_and_redrives_them():

    from ..local.test_cli import run

    world, fx = FakeWorld(), FakeSideEffects()
    world.deps = replace(world.deps, side_effects=fx.fx, compensator=saga.compensate_job)
    j = finished_job(world, scores=(0.95,))
    saga.run_side_effects(world.deps, fx.fx, j)
    fx.tickets.inject("error_before_write", "close", times=-1)
    saga.compensate(world.deps, fx.fx, j, reason="job.cancelled")
    listed = run(world, "compensations")
    assert listed.exit_code == 0 and j.job_id in listed.output and "sideeffect.compensation_failed" in listed.output
    assert "cause sideeffect.failed" in listed.output
    [letter] = json.loads(run(world, "compensations", "--json").stdout)  # the same, as records
    assert (letter["job_id"], letter["error_code"]) == (j.job_id, "sideeffect.compensation_failed")
    assert letter["envelope"]["cause_code"] == "sideeffect.failed"
    still = run(world, "compensations", "--redrive")
    assert still.exit_code == 1 and len(fx.dlq.messages) == 1  # still failing: stays, one message
    assert "compensated: 0  still failing: 1  in flight: 0" in still.stdout
    assert f"still failing: ticket.open of {j.job_id}" in still.stderr
    assert "`review compensations --redrive --wait`" in still.stderr
    # AND the failed one is back at once: the next redrive tries it again (not hidden as if in flight)
    again = run(world, "compensations", "--redrive")
    assert again.exit_code == 1 and "still failing: 1  in flight: 0" in again.stdout
    fx.tickets.clear()
    # WHEN another redrive holds the message (taken, not back yet)
    [held] = fx.dlq.take_all(visibility_s=30)
    busy = run(world, "compensations", "--redrive")
    # THEN it is in flight: neither compensated nor failing, and not a success (exit 1, what to run)
    assert busy.exit_code == 1, busy.output
    assert "compensated: 0  still failing: 0  in flight: 1" in busy.stdout
    assert "1 in flight" in busy.stderr and "--redrive --wait" in busy.stderr
    assert fx.tickets.closed == 0
    as_json = json.loads(run(world, "compensations", "--redrive", "--json").stdout)
    assert as_json == {"compensated": [], "still_failing": [], "in_flight": 1}
    fx.dlq.release(held.receipt_handle)
    fixed = run(world, "compensations", "--redrive")
    assert fixed.exit_code == 0, fixed.output
    assert "compensated: 1  still failing: 0  in flight: 0" in fixed.stdout
    assert not fx.dlq.messages and fx.tickets.opened == fx.tickets.closed == 1


def test_a_steps_in_progress_record_expires_with_the_invocations_remaining_time():
    # Powertools' trap: without a registered Lambda context an in-progress record never expires early and a
    # crashed invocation blocks its key; the saga registers the invocation's remaining time (handlers.invocation)
    import time as _time

    from contract_review.adapters.outcomes import PowertoolsOutcomes
    from contract_review.domain.effects import JsonObject
    from contract_review.handlers import InvocationClock

    from ..fake_side_effects import MemoryPersistence

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 4_000

    clock = InvocationClock()
    clock.context = Context()
    layer = MemoryPersistence()
    seen: list[int | None] = []

    def act() -> JsonObject:
        (record,) = layer.records.values()
        seen.append(record.in_progress_expiry_timestamp)
        return {"ok": True}

    before = int(_time.time() * 1000)
    assert PowertoolsOutcomes(layer, expires_after_s=60).once("k", act, clock) == {"ok": True}
    assert seen[0] is not None and before + 4_000 <= seen[0] <= int(_time.time() * 1000) + 4_000


def test_a_retried_jobs_second_unknown_ticket_is_closed_too_not_answered_by_the_first_ones_undo():
    """Found by the soak: a job whose ticket outcome was unknown, rejected (its ticket closed by its key), retried, and
    whose new ticket (the next generation, another key) was unknown again and rejected. Both undos asked for "the
    ticket of an unknown outcome" (`ticket_id` None), so they shared one compensation key, and the second was
    answered by the first one's stored outcome: the new ticket stayed open under a failed job."""
    world, fx = FakeWorld(), FakeSideEffects()
    waiting = unknown_outcome(world, fx, written=True)
    first = saga.end_waiting(world.deps, waiting, "job.approval_rejected")
    assert first is not None and fx.tickets.opened == fx.tickets.closed == 1
    # WHEN the job is reopened (`review retry`) and its new ticket's outcome is unknown again, and rejected
    again = lifecycle.transition(world.deps, first, JobState.RUNNING, event="job.reopened")
    assert again is not None
    fx.tickets.inject("timeout_after_write", "open")
    fx.tickets.inject("lookup_unavailable", "find", times=STEP_ATTEMPTS)
    assert saga.run_side_effects(world.deps, fx.fx, again).status is SagaStatus.WAITING_APPROVAL
    second = saga.end_waiting(world.deps, job(world, again.job_id), "job.approval_rejected")
    # THEN both tickets are closed: nothing stays open under the failed job
    assert second is not None and second.state is JobState.FAILED
    assert fx.tickets.opened == fx.tickets.closed == 2
