"""Submission: the one way a document is sent for review from the operator surface: `POST /jobs` and each item of
`POST /batches` (a Job API principal), `review submit` and the status page (the operator, no principal). Intake,
which takes the message, is the one way in on the other side (`pipeline/admission.py` holds what both share).

`submit(deps, caller, SubmitRequest)`:
1. The document checks intake makes (`admission.document_text`: `input.*`; the operator's inline text is intake's to
   check, `review submit` calls `check_document` first) and its budget (`job.budget_insufficient`), before anything
   is sent.
2. The job the key names (`Job.key_conflict`, the rule intake applies too): another document under a key whose job
   is not replaceable, or another sender's job, is `KeyConflict` (`input.key_conflict`); a job that failed on its
   input is replaced by the corrected document.
3. A job that exists and is not replaced: a Job API caller gets it back (a replay: nothing is sent or charged). The
   operator's message is sent all the same and intake decides (a duplicate of an ended job; a running job's stalled
   fan-out moved on), unless `retry_ended` (what `review submit` asks: the same document again, for a job that ended
   without completing, retries it as `review retry` does, instead of returning the failed job unchanged).
4. A Job API caller's admission: its estimate taken from the principal's daily allowance (`operate/limits.py`) and
   the stack's daily spend cap (`domain/spend_cap.py`), once per admission; the submission record that binds the job
   to the caller (`submissions/<job>.json`) before the message; an intake message validated as intake will.

Refusals are `Refused` (a `ReviewError` with the stable code): the Job API answers them (4xx), the CLI prints them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict

from contract_review.domain import spend_cap
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.keys import submission_key
from contract_review.domain.messages import InlineDocument, S3Document, parse_intake
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller
from contract_review.domain.records import Job, JobState, Submission, job_id_for
from contract_review.operate import limits
from contract_review.pipeline import admission, redrive
from contract_review.pipeline.admission import JobOptions, TextDocument
from contract_review.review.chunking import document_hash


class SubmitRequest(JobOptions):
    """One submission: the document, its idempotency key (default: the document's SHA-256) and the job's options
    (`JobOptions`), and how it is made: `batch_id`, the Job API submission batch it is an item of; `retry_ended`,
    `review submit`'s rule that the same document again retries a job that ended without completing."""

    document: TextDocument | S3Document
    idempotency_key: str | None = None
    batch_id: str | None = None
    retry_ended: bool = False

    @classmethod
    def inline(cls, text: str, **options: object) -> SubmitRequest:
        """A request for a document at hand (`review submit`, the status page, tests)."""
        return cls.model_validate({"document": TextDocument(text=text), **options})


class Submitted(BaseModel):
    model_config = ConfigDict(frozen=True)
    job_id: str
    status: str
    replayed: bool  # the same submission (key) again: the job it names
    document_sha256: str
    note: str | None = None  # what a resubmission did (`retry_ended`): shown after the job id


class Refused(ReviewError):
    """A submission refused before anything was sent: the document checks, its budget, a spend limit, an invalid
    message, or `KeyConflict`. Its envelope carries the code; anything else (an AWS error) is not a refusal."""


class KeyConflict(Refused):
    """The key names another job (`Job.key_conflict`): `job_id`, and `conflict`, "another document" or "another
    principal". The message is the Job API's; `review submit` says it with the file's name."""

    def __init__(self, job_id: str, conflict: str, key: str | None):
        message = ("this idempotency key names another job: use another key" if conflict == "another principal" else
                   f"idempotency key {key!r} was used for another document (another SHA-256): send this document with "
                   "its own key")
        super().__init__(ErrorEnvelope.of("input.key_conflict", message, step="admission"))
        self.job_id, self.conflict = job_id, conflict


def scoped_key(who: str, key: str) -> str:
    """The intake idempotency key of `key` submitted by Job API principal `who`: two principals never share a job."""
    return "api:" + hashlib.sha256(f"{who}\n{key}".encode()).hexdigest()


def job_id_of(text: str, idempotency_key: str | None = None) -> str:
    """The job id an operator's submission of `text` gets: from the idempotency key, by default the text's SHA-256."""
    return job_id_for(idempotency_key or document_hash(text))


def check_document(deps: Deps, text: str) -> None:
    """The checks intake makes first on a document's text (admission's): raises `input.empty_document` or
    `input.too_large` at once, so a client refuses it before sending anything."""
    admission.document_text(deps, InlineDocument.model_construct(text=text))  # no inline limit: large is claim-checked


def submit(deps: Deps, caller: Caller | None, req: SubmitRequest) -> Submitted:
    """Send one document to the intake queue (inline, or claim-checked via S3 when large), as `caller` (a Job API
    principal; None: the operator, a sender to the queue). Idempotent: the same key from the same sender is one job.
    Raises `Refused` (nothing sent) for what the caller must change; see the module's docstring for the steps."""
    who = caller.principal if caller is not None else None
    with _refusals():
        # a Job API caller's document is checked as intake will (an s3_uri only in its own uploads); the operator's
        # text goes as it is, and intake records what it rejects under the job id returned (`check_document` first)
        text = (req.document.text if caller is None and isinstance(req.document, TextDocument)
                else admission.document_text(deps, req.document, who))
        expected = admission.check_budget(deps.settings, text, req.budget_usd)  # before anything is sent
    sha = document_hash(text)
    key = req.idempotency_key or sha
    intake_key = scoped_key(who, key) if who is not None else key
    job_id = job_id_for(intake_key)
    job = deps.jobs.get(job_id)
    pending = admission.submission(deps, job_id) if job is None and caller is not None else None
    if job is not None and (conflict := job.key_conflict(sha, _sent_by(caller, job))):
        raise KeyConflict(job_id, conflict, req.idempotency_key)
    if pending is not None and pending.document_sha256 != sha:  # the API's record, before intake made the job
        raise KeyConflict(job_id, "another document", req.idempotency_key)
    done = Submitted(job_id=job_id, status=JobState.QUEUED.value, replayed=pending is not None, document_sha256=sha)
    if job is not None and not job.replaceable:
        done = done.model_copy(update={"status": job.state.value, "replayed": True})
        if caller is not None:
            return done  # a replay: nothing sent, nothing charged
        if req.retry_ended and redrive.retryable(job):
            note, send = _retry(deps, job)
            done = done.model_copy(update={"note": note})
            if not send:
                return done
    if caller is None:  # the operator: intake decides a duplicate (and moves a stalled fan-out on)
        deps.queues.send_intake(_intake_body(deps, None, req, text, intake_key))
        return done
    _admit(deps, caller, _intake_body(deps, who, req, text, intake_key), text, job_id, sha, expected, job, pending,
           req.batch_id)
    return done


@contextmanager
def _refusals() -> Iterator[None]:
    """Admission's errors (the checks intake makes, the spend limits) as a refusal of this submission."""
    try:
        yield
    except Refused:
        raise
    except ReviewError as exc:
        raise Refused(exc.envelope) from exc


def _sent_by(caller: Caller | None, job: Job) -> bool:
    """Whether `job` was submitted by this sender: the caller's principal (or session), or none for the operator."""
    return caller.owns(job.principal) if caller is not None else job.principal is None


def _retry(deps: Deps, job: Job) -> tuple[str, bool]:
    """`review submit` of a document whose job ended without completing (not on its input: that is replaced): the
    job retried (`review retry`). What was done, in words, and whether its intake message is still to be sent."""
    if redrive.requeue_failed_intake(deps, job.job_id):  # failed in intake: queued again, intake takes the message
        return f"it had failed in intake with {job.error_code}: queued again", True
    r = redrive.retry(deps, job.job_id)
    ended = f"it had ended {job.state.value}" + (f" with {job.error_code}" if job.error_code else "")
    return (f"{ended}: {r.action}" if r.retried else f"{ended}; not retried: {r.action}"), False


def _intake_body(deps: Deps, who: str | None, req: SubmitRequest, text: str, key: str) -> str:
    """Admission's intake message; a Job API caller's (`who`) validated as intake will first: an invalid message is
    the caller's refusal, never a failed job (the operator's is intake's to record)."""
    upload = req.document if isinstance(req.document, S3Document) else None
    if who is None:
        return admission.intake_body(deps, text, req, key=key, upload=upload)
    with _refusals():
        body = admission.intake_body(deps, text, req, key=key, upload=upload, principal=who)
        parse_intake(body)
    return body


def _admit(deps: Deps, caller: Caller, body: str, text: str, job_id: str, sha: str, expected: int | None,
           job: Job | None, pending: Submission | None, batch_id: str | None) -> None:
    """A Job API caller's admission, then its message: its estimate from the principal's daily allowance, once per
    admission (a replay, or the client's retry of a request that failed after taking it, takes nothing again; a
    replacement of a job that failed on its input is an admission of its own), and from the stack's daily spend cap,
    under the same admission (intake sees it taken); the submission record (the job is the caller's from the moment
    it can exist); the message. Sent again while intake has not recorded the job (the first send may have been lost
    with a 5xx the client is retrying): intake takes the same job once. Nothing queued: the allowances get it back."""
    estimate = expected if expected is not None else admission.estimate(deps.settings, text).model_micro_usd
    admission_id = spend_cap.spend_charge_id(job_id, job)
    with _refusals():
        if (too_large := spend_cap.never_fits(deps, estimate)) is not None:  # never under the cap: 422, not 429
            raise too_large
        charge = limits.take_spend(deps, caller.principal, estimate, admission_id)
        try:
            stack_charge = spend_cap.admit(deps, estimate, admission_id)
        except BaseException:
            spend_cap.give_back(deps, charge)
            raise
    try:
        if pending is None:
            record = Submission(job_id=job_id, principal=caller.principal, document_sha256=sha,
                                submitted_at=deps.clock(), batch_id=batch_id)
            deps.artifacts.put_text(submission_key(job_id), record.model_dump_json())
        deps.queues.send_intake(body)
    except BaseException:
        for taken in (charge, stack_charge):  # nothing queued: the allowances get it back (the error is the answer)
            spend_cap.give_back(deps, taken)
        raise
