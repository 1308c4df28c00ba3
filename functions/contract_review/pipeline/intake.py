"""Intake: validate, create the job (idempotently), chunk, and send the first page of chunks.

The whole document is split at once, so the job knows its `chunk_count` before any chunk is analysed;
the chunks go out in pages under a per-job window (`fanout.py`): intake stores the document and the
fan-out plan, makes the job `running`, and sends the first page; the aggregator sends the rest as
chunks settle. A 5 MB document leaves `queued` within seconds.

Bad input fails in one attempt with a permanent code: recorded on a `failed` job when a job id can be
derived (from the idempotency key, else the inline text's SHA-256, else the document id: the job id
a client computes), otherwise sent to the intake DLQ with its envelope. The document checks are admission's
(`admission.document_text`, the same for the Job API): claim-checked documents are read only from the
stack's own bucket, in the sender's upload area. A message that names a `principal` (as only the Job API may)
is taken only when the API's submission record vouches for it (`admission.check_principal`), else it goes to
the intake DLQ (`input.invalid`) without a job, before anything of that principal is read. A job never mixes
two documents: a key that names a job of another document is `input.key_conflict` (intake DLQ, and an event on
that job).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal

from contract_review.config.profile import Profile
from contract_review.domain import lifecycle, log_fields, spend_cap
from contract_review.domain.cost import micro_usd
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.keys import document_key
from contract_review.domain.messages import InlineDocument, IntakeMessage, parse_intake
from contract_review.domain.ports import Charge, Deps, Queue
from contract_review.domain.records import Inference, Job, JobState, Priority, job_id_for
from contract_review.pipeline import admission, batch_inference, fallback, fanout
from contract_review.pipeline.admission import check_budget, check_principal, document_text, effective_budget
from contract_review.review.analysts import job_config_hash
from contract_review.review.chunking import Chunk, chunk_document, document_hash


@dataclass(frozen=True)
class IntakeResult:
    job_id: str | None
    created: bool
    state: str
    error: ErrorEnvelope | None = None


def failure_key(body: str) -> tuple[str | None, str]:
    """For a message that failed validation: the key to record the failure under (None: there is none),
    and the document id it names (shown on the failed job). The key is the one a valid message
    would have had where it can be told: the idempotency key, else the SHA-256 of the inline text,
    else the document id. A string that is no Unicode text (JSON may escape a lone surrogate, `\\ud800`,
    which no valid message holds and no store can keep) is no key and no document id."""
    try:
        raw = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(raw, dict):
        return None, ""
    document_id = _text(raw.get("document_id"))
    document_id = document_id[:256] if document_id else ""
    key = raw.get("idempotency_key")
    if isinstance(key, str) and key:
        return _text(key), document_id  # a key no valid message can have names no job: the DLQ
    document = raw.get("document")
    if isinstance(document, dict) and isinstance(document.get("text"), str):
        text = _text(document["text"])
        return (document_hash(text) if text is not None else None), document_id
    return document_id or None, document_id


def _text(value: object) -> str | None:
    """`value` when it is a string UTF-8 can encode, else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _record_failure(deps: Deps, body: str, env: ErrorEnvelope, message_id: str, key: str | None,
                    document_id: str = "", principal: str | None = None) -> IntakeResult:
    """A permanent input error: a failed job when there is a key to name it by, else the DLQ."""
    if key is None:
        if not deps.queues.has(Queue.INTAKE_DLQ):
            raise ReviewError(env)  # no DLQ configured: let the queue's redrive take it
        deps.queues.dead_letter(Queue.INTAKE, body, env, source_message_id=message_id)
        return IntakeResult(None, False, "rejected", env)
    job_id = job_id_for(key)
    now = deps.clock()
    job, created = deps.jobs.create(Job(job_id=job_id, state=JobState.FAILED, created_at=now, updated_at=now,
                                        idempotency_key=key, document_id=document_id, error=env,
                                        error_code=env.error_code, source_message_id=message_id, ended_at=now,
                                        principal=principal))
    log_fields.bind(log_fields.of_job(job))
    if created:
        deps.jobs.record_event(job_id, "job.failed", error_code=env.error_code, reason="invalid input")
    return IntakeResult(job_id, created, job.state.value, env)


def batch_lane(profile: Profile, msg: IntakeMessage, now: float) -> tuple[Inference, float | None]:
    """A job's inference mode and deadline (pipeline/batch_inference.py): `batch` with its deadline, unless that
    deadline is nearer than a batch job is expected to take (`batch_expected_s`): then on demand from the start (and
    said)."""
    if msg.inference is not Inference.BATCH:
        return Inference.ON_DEMAND, None
    hours = msg.deadline_hours if msg.deadline_hours is not None else profile.batch.batch_default_deadline_hours
    if hours * 3600 < profile.batch.batch_expected_s:
        return Inference.ON_DEMAND, None
    return Inference.BATCH, now + hours * 3600


def handle_intake(deps: Deps, body: str, message_id: str = "") -> IntakeResult:
    """Process one intake message. Raises only for transient (retryable) failures."""
    try:
        msg = parse_intake(body)
    except ReviewError as exc:
        return _record_failure(deps, body, exc.envelope, message_id, *failure_key(body))

    text = _admitted_text(deps, body, msg, message_id)
    if isinstance(text, IntakeResult):
        return text
    s = deps.settings
    key = msg.idempotency_key or document_hash(text)
    job_id = job_id_for(key)
    sha = document_hash(text)
    chunks = chunk_document(text, s.profile.review)
    try:  # a budget the document's estimate is over: refused before any model call, as the API and the CLI do
        estimate = _estimate(deps, text, msg.budget_usd, chunks)
    except ReviewError as exc:
        return _record_failure(deps, body, exc.envelope, message_id, key, msg.document_id or "", msg.principal)
    budget = effective_budget(s, msg.budget_usd)  # its own, else the stack's default per-job budget
    now = deps.clock()
    inference, deadline_at = batch_lane(s.profile, msg, now)
    model_id = fallback.intake_model(deps)  # the deploy's, or the one an operator switched the stack to
    job = Job(job_id=job_id, state=JobState.QUEUED, created_at=now, updated_at=now, idempotency_key=key,
              document_id=msg.document_id or "", document_key=document_key(job_id), document_chars=len(text),
              document_sha256=sha, metadata=msg.model_dump(mode="json")["metadata"], chunk_count=len(chunks),
              fanned_out=0, analyst_count=s.profile.review.analyst_count, model_id=model_id,
              model_provider=s.model_provider, prompt_version=s.profile.review.prompt_version,
              config_hash=job_config_hash(s, model_id), source_message_id=message_id, principal=msg.principal,
              budget_micro_usd=micro_usd(Decimal(str(budget))) if budget is not None else None,
              estimate_micro_usd=estimate, priority=msg.priority or Priority.INTERACTIVE,
              inference=inference, deadline_at=deadline_at)
    existing, created = deps.jobs.create(job)
    log_fields.bind(log_fields.of_job(existing))  # the job's key (hashed), state, source message on its lines
    if created:
        job = existing  # as stored: a replacement of a job failed on its input is a version on (its admission's id)
        batch_mode = {"inference": job.inference.value, "deadline_at": job.deadline_at} if job.deadline_at else {}
        deps.jobs.record_event(job_id, "job.queued", chunk_count=len(chunks), document_chars=len(text), **batch_mode)
        off = batch_inference.lane_off(deps) if job.inference is Inference.BATCH else None
        if off is not None:  # admitted in batch mode; its chunks run on demand while the lane is off (worker)
            deps.jobs.record_event(job_id, "batch.unavailable", reason=off.reason, error_code=off.error_code,
                                   detail="the batch lane is off for the model: its calls go on demand")
        if msg.inference is Inference.BATCH and job.inference is Inference.ON_DEMAND:
            deps.jobs.record_event(job_id, "job.batch_declined", deadline_hours=msg.deadline_hours,
                                   expected_hours=round(s.profile.batch.batch_expected_s / 3600, 2),
                                   detail="its deadline is nearer than a batch job is expected to take: on demand")
    elif conflict := existing.key_conflict(sha, same_sender=existing.principal == msg.principal):
        return _key_conflict(deps, body, existing, sha, message_id, conflict)
    elif existing.state is JobState.RUNNING:
        # the same document again (or this message redelivered, or redriven from the intake DLQ): the job
        # is under way. A fan-out that stalled (its trigger lost) is moved on, from the text at hand;
        # otherwise this sends nothing.
        plan = fanout.FanoutPlan.of(text, sha, chunks)
        if len(plan) == existing.chunk_count:  # (not when the profile's chunking changed since)
            fanout.refill(deps, existing, plan=plan, text=text)
        return IntakeResult(job_id, False, existing.state.value)
    elif existing.state is not JobState.QUEUED:
        return IntakeResult(job_id, False, existing.state.value)  # duplicate submission of an ended job
    else:
        job = existing  # left `queued` by a crash: finish it under its own pinned configuration

    # Idempotent from here on: a crash is finished by this message's redelivery (or the same document
    # sent again). The job is `running` before the first chunk message exists, so no result can arrive
    # for a job that is still `queued`.
    plan = fanout.FanoutPlan.of(text, sha, chunks)
    deps.artifacts.put_text(job.document_key, text, "text/plain; charset=utf-8")
    fanout.store_plan(deps, job_id, plan)
    if admitted(deps, job) is False:  # over the stack's daily spend cap: `queued`, waiting; the sweeper starts it
        return IntakeResult(job_id, created, JobState.QUEUED.value)
    running = lifecycle.move(deps, job_id, (JobState.QUEUED,), JobState.RUNNING, started_at=deps.clock(),
                             detail={"chunks": len(chunks)})
    _leave_waiting(deps, job)  # held before, started now (a redelivery, the document sent again the next day)
    if running is None:
        running = deps.jobs.get(job_id)  # another intake of the same document got there first, or a cancel did
    if running is not None and running.state is JobState.RUNNING:
        fanout.refill(deps, running, plan=plan, text=text)  # the first page (all of a small document)
    return IntakeResult(job_id, created, running.state.value if running else JobState.RUNNING.value)


def _estimate(deps: Deps, text: str, budget_usd: float | None, chunks: list[Chunk]) -> int:
    """The document's estimate (the chunks just cut), refused (`ReviewError`) when a budget is under it
    (`job.budget_insufficient`) or when it alone is over the stack's daily spend cap (`quota.spend_cap`: it could never
    start). Without a budget the cap takes the estimate all the same."""
    estimate = check_budget(deps.settings, text, budget_usd, chunks=chunks)
    if estimate is None:
        estimate = admission.estimate(deps.settings, text, chunks=chunks).model_micro_usd
    if (too_large := spend_cap.never_fits(deps, estimate)) is not None:
        raise too_large
    return estimate


def admitted(deps: Deps, job: Job) -> Charge | bool:
    """The stack's daily spend cap (domain/spend_cap.py), taken once per admission (the Job API's charge of the same
    job is seen, not taken again). Over it, the job stays `queued`, waiting with condition `spend_cap` (its document
    and plan stored: the sweeper starts it after 00:00 UTC, or after an operator's override), never failed: False.
    Else the charge this call took (True: none, taken before or no cap)."""
    try:
        charge = spend_cap.admit(deps, job.estimate_micro_usd, spend_cap.admission_id(job))
    except ReviewError as exc:
        if exc.envelope.error_code != "quota.spend_cap":
            raise
        if job.waiting is None and deps.jobs.set_waiting(job.job_id, spend_cap.held(exc, deps.clock())):
            deps.jobs.record_event(job.job_id, "job.waiting_spend_cap", detail=exc.envelope.message)
        return False
    return charge if charge is not None else True


def _leave_waiting(deps: Deps, job: Job) -> None:
    """A job started after it waited for the cap no longer says it waits (the worker's own conditions come after)."""
    if job.waiting is not None and job.waiting.condition == spend_cap.CONDITION and deps.jobs.set_waiting(job.job_id,
                                                                                                         None):
        deps.jobs.record_event(job.job_id, "job.waiting_ended", condition=spend_cap.CONDITION)


def start_held(deps: Deps, job: Job) -> str:
    """A job intake held for the stack's daily spend cap (`admitted`), tried again (the sweeper, each sweep): once
    admitted (a new UTC day, an operator's override, the cap turned off), it leaves `waiting`, becomes `running` and
    its fan-out starts from the stored plan, as intake would have: "started"; "refused" (still over the cap), or
    "skipped" (not such a job any more). A cancel since wins (`queued` only; the charge is given back); a sweeper that
    dies after the move leaves a running job with no chunk sent, which the stalled-job reconcile starts."""
    if job.state is not JobState.QUEUED or job.waiting is None or job.waiting.condition != spend_cap.CONDITION:
        return "skipped"
    taken = admitted(deps, job)
    if taken is False:
        return "refused"
    running = lifecycle.move(deps, job.job_id, (JobState.QUEUED,), JobState.RUNNING, started_at=deps.clock(),
                             detail={"chunks": job.chunk_count, "after": spend_cap.CONDITION})
    if running is None or running.state is not JobState.RUNNING:
        spend_cap.give_back(deps, taken if isinstance(taken, Charge) else None)  # cancelled meanwhile: not admitted
        return "skipped"
    _leave_waiting(deps, job)
    fanout.refill(deps, running)
    return "started"


def _admitted_text(deps: Deps, body: str, msg: IntakeMessage, message_id: str) -> str | IntakeResult:
    """The document's text, or the refusal recorded. A message naming a principal is checked against the Job
    API's submission record before anything is read from that principal's uploads, and after, against the
    document read; refused, it goes to the intake DLQ without a job (its key is not the sender's to name)."""
    try:
        if msg.principal is not None:
            check_principal(deps, msg.principal, msg.idempotency_key)
        text = document_text(deps, msg.document, msg.principal)
    except ReviewError as exc:
        if exc.envelope.retryable:
            raise
        if exc.envelope.error_code == "input.invalid":  # the principal check: no job
            return _record_failure(deps, body, exc.envelope, message_id, None)
        key = msg.idempotency_key or (document_hash(msg.document.text) if isinstance(msg.document, InlineDocument)
                                      else msg.document_id)
        return _record_failure(deps, body, exc.envelope, message_id, key, msg.document_id or "", msg.principal)
    if msg.principal is not None:
        try:
            check_principal(deps, msg.principal, msg.idempotency_key, document_hash(text))
        except ReviewError as exc:
            if exc.envelope.retryable:
                raise
            return _record_failure(deps, body, exc.envelope, message_id, None)
    return text


def _key_conflict(deps: Deps, body: str, existing: Job, sha: str, message_id: str, conflict: str) -> IntakeResult:
    """The key names a job of another document or sender (`Job.key_conflict`): reject this message, touch nothing
    of the job."""
    whose = (f"a job for another document (SHA-256 {existing.document_sha256[:16]}..., this one {sha[:16]}...)"
             if conflict == "another document" else "a job submitted by another principal")
    env = ErrorEnvelope.of(
        "input.key_conflict",
        f"idempotency key {existing.idempotency_key[:80]!r} is the key of {existing.job_id} "
        f"({existing.state.value}), {whose}: send this document with its own idempotency key",
        step="intake.create")
    deps.jobs.record_event(existing.job_id, "intake.key_conflict", error_code=env.error_code,
                           source_message_id=message_id, document_sha256=sha)
    if deps.queues.has(Queue.INTAKE_DLQ):
        deps.queues.dead_letter(Queue.INTAKE, body, env, source_message_id=message_id, job_id=existing.job_id)
    return IntakeResult(existing.job_id, False, "rejected", env)
