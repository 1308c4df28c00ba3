"""Aggregator: record each settled chunk; when all are settled, write the report and end the job
under the coverage policy (`report.py`)."""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor

from contract_review.domain import lifecycle, log_fields
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.cost import RequestCounter, aggregator_usage, metered, over_budget
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import report_keys
from contract_review.domain.messages import JobControl, ResultMessage
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    LIST_SAMPLE,
    ChunkStatus,
    CoverageSummary,
    Job,
    JobOutcome,
    JobState,
    Reliability,
)
from contract_review.pipeline import admission, fanout
from contract_review.review.analysts import ChunkFindings, Finding
from contract_review.review.report import (
    REPORT_SCHEMA_VERSION,
    Report,
    clauses_of,
    cost_report,
    coverage_of,
    is_offline,
    markdown,
    reviewing_party,
)
from contract_review.sideeffects import saga

BUDGET_EXCEEDED = "job.budget_exceeded"


def handle_message(deps: Deps, msg: ResultMessage | JobControl) -> str:
    """One results-queue message: a chunk's result, or a job control message."""
    if isinstance(msg, JobControl):
        return handle_control(deps, msg)
    return handle_result(deps, msg)


def handle_control(deps: Deps, msg: JobControl) -> str:
    job = deps.jobs.get(msg.job_id)
    if job is None:
        return "ignored"
    log_fields.bind(log_fields.of_job(job))
    if job.state is JobState.CANCELLING:  # whatever the control said: a cancel overrides it
        return lifecycle.finish_cancel(deps, job).value
    if job.state is JobState.COMPENSATING:  # a reject (or any control) of a failing job: finish undoing it
        return lifecycle.finish_compensation(deps, job).value
    if msg.control == "cancel":
        return job.state.value  # finished already (or the job ended before the cancel)
    return saga_decision(deps, job, msg)


def saga_decision(deps: Deps, job: Job, msg: JobControl) -> str:
    """An approval (`resume`) for a job that waited on an ambiguous side effect and is `running` again: finalize
    again: the same report, the unknown step retried with its key, then the job ends. (A reject moved the job
    to `compensating`: `handle_control` finishes it.)"""
    if deps.side_effects is not None and msg.control == "resume" and job.state is JobState.RUNNING:
        return finalize(deps, job).value
    return job.state.value


def handle_result(deps: Deps, msg: ResultMessage) -> str:
    """One chunk's result: counted once on the job, with its usage (cost.py), in the update that settles it."""
    with metered(deps.meter) as counter:  # this result's requests: part of the chunk's cost
        return _handle_result(deps, msg, counter)


def _handle_result(deps: Deps, msg: ResultMessage, counter: RequestCounter) -> str:
    job = deps.jobs.get(msg.job_id)
    if job is not None:
        log_fields.bind(log_fields.of_job(job))
    if job is None:
        return "ignored"
    if job.terminal:
        return _count_after_the_end(deps, job, msg, counter)
    chunk = deps.claims.get(msg.job_id, msg.chunk_id)
    if chunk is not None:
        log_fields.bind(log_fields.job_fields(checkpoint_version=chunk.fence))
    if chunk is None or chunk.status != msg.status:
        return "stale"  # the chunk moved on (redrive, newer owner); its own message will settle it
    counted = job.counts(chunk)  # a second copy of a result already counted (at-least-once)
    fanout.refill(deps, job, settling=None if counted else msg.chunk_id)  # the next page, if the window has room
    # settled once, in the log too: its event is written by whoever counted it
    # (conditional on the chunk not being counted yet: a finish-cancel that counted it meanwhile wrote its event)
    # counted only while the chunk is as read: a redrive landing since (fence moved, pending again) is not counted,
    # and an attempt fenced out since (its spend added to the record) is read again and counted with it
    fence, status = chunk.fence, chunk.status
    now_counted = None if counted else \
        lifecycle.count_settled(deps, chunk, aggregator_usage(deps.settings.profile.prices, counter))
    if now_counted is not None:
        job = now_counted
        lifecycle.settled_event(deps, chunk, job)
    else:
        # counted before (or moved on since the read): progress only
        job = deps.jobs.settle_chunk(msg.job_id, msg.chunk_id, fence=fence, status=status)
        if counted and chunk.event_owed:  # counted by an aggregator that stopped before its event: written now, once
            lifecycle.settled_event(deps, chunk, job)
    if job.state is JobState.CANCELLING:
        return lifecycle.finish_cancel(deps, job).value
    if job.state is JobState.RUNNING and over_budget(job, job.budget_micro_usd):  # stop spending: its own code
        return lifecycle.stop(deps, job, by="budget", code=BUDGET_EXCEEDED, detail={
            "cost_micro_usd": job.total_micro_usd, "budget_micro_usd": job.budget_micro_usd}).value
    if job.state is JobState.RUNNING and fanout.stalled_by_budget(job):  # the rest would pass it: stop before
        return lifecycle.stop(deps, job, by="budget", code=BUDGET_EXCEEDED, detail={
            "cost_micro_usd": job.total_micro_usd, "budget_micro_usd": job.budget_micro_usd,
            "estimate_micro_usd": job.estimate_micro_usd, "before_spending": True}).value
    if job.n_settled >= job.chunk_count and job.state is JobState.RUNNING:
        state = finalize(deps, job)
        return "recorded" if state is JobState.RUNNING else state.value
    return "recorded"


def _count_after_the_end(deps: Deps, job: Job, msg: ResultMessage, counter: RequestCounter) -> str:
    """A chunk that settled after its job ended (a job-fatal error ended it while the chunk's attempt was under way):
    the job's state and report stay as they are, but what the chunk spent is the job's: counted once, as any settle
    (conditional on it not being counted yet)."""
    chunk = deps.claims.get(msg.job_id, msg.chunk_id)
    if chunk is None or chunk.status != msg.status or not chunk.settled or job.counts(chunk):
        return "ignored"
    counted = lifecycle.count_settled(deps, chunk, aggregator_usage(deps.settings.profile.prices, counter))
    if counted is not None:
        lifecycle.settled_event(deps, chunk, counted, after_job_ended=job.state.value)
    return "ignored"


FINDINGS_READERS = 8  # parallel reads of the findings objects (botocore pools 10 connections per client)


def _document(deps: Deps, job: Job) -> str:
    """The document's text, for the section each clause is in (`report.clauses_of`): one GET of what intake stored."""
    return deps.artifacts.get_text(job.document_key) if job.document_key else ""


def read_findings(deps: Deps, chunks: list[ChunkRecord]) -> list[Finding]:
    """Every done chunk's findings, in chunk order. A 5 MB document has ~1,500 findings objects: read
    in parallel (boto3 clients are thread-safe), finalize takes seconds instead of a minute."""
    keys = [c.findings_key for c in chunks if c.status is ChunkStatus.DONE and c.findings_key]
    with ThreadPoolExecutor(max_workers=FINDINGS_READERS) as pool:
        # each read in a copy of the caller's context (log fields, trace segment); results in the keys' order
        futures = [pool.submit(contextvars.copy_context().run, deps.artifacts.get_text, key) for key in keys]
        texts = [f.result() for f in futures]
    return [f for text in texts for f in ChunkFindings.model_validate_json(text).findings]


def finalize(deps: Deps, job: Job) -> JobState:
    """Write the report and end the job; `running` when a chunk turns out not to be settled.

    `job` must have been read before this reads the chunk records: the transition is conditional on
    its `settled_version`, so a chunk reopened after that read (a redrive racing this finalize) keeps
    the job running; its own result settles it later."""
    chunks = deps.claims.for_job(job.job_id)
    # The settled count is a counter, the chunk records are the truth: a chunk redriven after its
    # result was counted is not settled any more, and its own result will come.
    unsettled = [c for c in chunks if not c.settled]
    if unsettled:  # their usage comes off the running total: each adds it again when it settles again
        deps.jobs.unsettle_chunks(job.job_id, {c.chunk_id: c.usage() for c in unsettled})
        return JobState.RUNNING
    for c in chunks:  # every chunk's `chunk.settled` event before the job's end (an aggregator may have stopped
        if c.event_owed:  # between counting a chunk and writing its event): a reader sees every chunk settled
            lifecycle.settled_event(deps, c, job)
    # a finalize under way is progress: the reconciler leaves the job alone meanwhile (a large job's
    # finalize reads ~1,500 findings objects; two at once would only slow both)
    deps.jobs.touch(job.job_id)
    coverage = coverage_of(job.analyst_count, chunks)
    findings = read_findings(deps, chunks)
    state, code = coverage.verdict()
    rel = Reliability.of(chunks)
    usage = job.usage()  # every chunk counted once when it settled (its attempts + the aggregator's requests)
    text = _document(deps, job)  # each clause's section; the offline model's jobs: the estimate at LLM-like answers
    llm_like = admission.estimate(deps.settings, text).model_micro_usd if is_offline(job) and text else None
    report = Report(job_id=job.job_id, state=state, document_id=job.document_id, document_sha256=job.document_sha256,
                    model_id=job.model_id, model_provider=job.model_provider, prompt_version=job.prompt_version,
                    chunk_count=job.chunk_count, metadata=job.metadata, findings=findings, coverage=coverage,
                    reliability=rel, cost=cost_report(deps.settings.profile.prices, job, usage, llm_like),
                    schema_version=REPORT_SCHEMA_VERSION, reviewed_at=deps.clock(), inference=job.inference.value,
                    reviewing_party=reviewing_party(job.metadata),
                    clauses=clauses_of(findings, text))
    json_key, md_key = report_keys(job.job_id)
    deps.artifacts.put_text(json_key, report.model_dump_json(indent=1))
    deps.artifacts.put_text(md_key, markdown(job, report, deps.clock()), "text/markdown; charset=utf-8")
    missing = coverage.missing_chunks
    outcome = JobOutcome(
        report_json_key=json_key, report_md_key=md_key, ended_at=deps.clock(), n_findings=len(findings),
        reliability=rel, coverage_summary=CoverageSummary(mandatory_gaps=len(coverage.mandatory_gaps),
                                                          optional_gaps=len(coverage.optional_gaps),
                                                          missing_chunks=len(missing)))
    if code:
        env = ErrorEnvelope.of(code, f"{len(missing)} chunk(s) missing, {len(coverage.mandatory_gaps)} mandatory "
                                     "gap(s)", step="aggregate")
        outcome = outcome.model_copy(update={
            "error": env, "error_code": code, "root_error": next((m.error for m in missing if m.error), None),
            # bounded: the report holds the full lists, `review status` recomputes them from the chunks
            "missing": missing[:LIST_SAMPLE], "mandatory_gaps": coverage.mandatory_gaps[:LIST_SAMPLE]})
    if state is JobState.COMPLETED and deps.side_effects is not None:  # the side effects, before `completed`
        ran = saga.run_side_effects(deps, deps.side_effects, job, report)
        if ran.status is not saga.SagaStatus.DONE:
            return _saga_stopped(deps, job, ran, outcome)
    ended = lifecycle.transition(deps, job, state, outcome=outcome, if_settled_version=job.settled_version,
                                 detail={"findings": len(findings), "error_code": code, "missing_chunks": len(missing)})
    if ended is None:
        now = deps.jobs.get(job.job_id)  # it changed meanwhile (ended by another path, a chunk reopened, a cancel)
        if now is not None and now.state is JobState.CANCELLING:
            return lifecycle.finish_cancel(deps, now)  # the cancel won the race: finished, never completed
        return now.state if now else state
    return state


def _saga_stopped(deps: Deps, job: Job, ran: saga.SagaResult, outcome: JobOutcome) -> JobState:
    """The saga did not get to the end: a step failed for good (the job fails with its code: `compensating`
    while what was done is undone, then `failed`), the job waits for approval, or it is being cancelled (the
    cancel finishes it)."""
    if ran.status is saga.SagaStatus.FAILED and ran.error is not None:
        code = ran.error.error_code
        failing = lifecycle.fail_compensating(deps, job, outcome.model_copy(update={
            "error": ran.error, "error_code": code}), event="job.compensating",
            detail={"error_code": code, "step": ran.error.step})
        if failing is not None:
            return lifecycle.finish_compensation(deps, failing)
    now = deps.jobs.get(job.job_id)
    if now is not None and now.state is JobState.CANCELLING:
        return lifecycle.finish_cancel(deps, now)
    return now.state if now else JobState.RUNNING
