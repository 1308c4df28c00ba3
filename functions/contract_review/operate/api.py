"""The Job API: a Powertools `APIGatewayHttpResolver` app (docs/openapi.yaml describes it).

On AWS it runs behind an HTTP API with IAM authorization (`handlers/api.py`); locally `review up` serves
the very same `app` on loopback (`review_local/api_server.py`), turning each request into an HTTP API v2
event. Whoever calls it hands the app its `Deps` per request: `app.append_context(deps=...)`.

Principals. Every job is bound to the principal that submitted it: the caller's IAM ARN
(`requestContext.authorizer.iam.userArn`; locally the bearer token's principal, put in the same place).
The API sends it in the intake message (`principal`, a field only the API sets: a body that names it is a
400) and intake records it on the job. Any other principal gets 404 on every job and batch route, exactly as
for an id that does not exist. Jobs submitted through the queue have no principal and are not visible through
the API at all.

Admission. A submission takes the intake message's fields and goes through admission
(`pipeline/admission.py`): the document checks intake makes (the same `input.*` codes) and the intake message
`review submit` sends.

Job ids. A job's idempotency key is scoped to its principal: `api:` + SHA-256(principal, key), where the key
is the `Idempotency-Key` header, else the SHA-256 of the document (the same document twice is one job, as
with `review submit`). So two principals never share a job, and the same `POST /jobs` twice with one key is
one job. Until intake has taken the message in, a small submission record (`submissions/<job>.json`)
answers for the job (`queued`, waiting for intake) so its `statusUrl` works at once.

Errors are data: every error response is `{"error": {"code", "message", "retryable"}}` with a code of the
one registry (`errors.py`: `api.*`, `input.*`, `runtime.internal`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from contract_review.domain import lifecycle, spend_cap
from contract_review.domain.errors import REGISTRY, ReviewError, classify
from contract_review.domain.keys import batch_key, submission_key
from contract_review.domain.messages import (
    MAX_DOCUMENT_BYTES,
    IntakeMessage,
    MetaKey,
    MetaValue,
    S3Document,
    parse_intake,
)
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller, uploads_prefix
from contract_review.domain.records import Inference, Job, JobState, Priority, Submission, job_id_for
from contract_review.operate import ops
from contract_review.pipeline import admission, batch_inference, limits, redrive
from contract_review.pipeline.admission import TextDocument
from contract_review.review.chunking import document_hash
from contract_review.sideeffects import approvals

app = APIGatewayHttpResolver()
log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY = 255
MAX_BATCH_ITEMS = 100  # an HTTP API request must be answered within 29 s: each item is a few AWS calls
DEFAULT_EVENTS_LIMIT = 100
MAX_EVENTS_LIMIT = 1000
_JOB_ID = re.compile(r"^job-[0-9a-f]{20}$")
_BATCH_ID = re.compile(r"^batch-[0-9a-f]{20}$")
_KEY = re.compile(r"^[!-~]([ -~]{0,253}[!-~])?$")  # visible ASCII, inner spaces, at most 255 (MAX_IDEMPOTENCY_KEY)
_CUSTOM_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,64}$")


# ------------------------------------------------------------------------------ errors
class ApiError(Exception):
    """An error answer: HTTP status + a registry code."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(f"{code}: {message}")
        assert code in REGISTRY, code
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def body(self) -> dict[str, JsonValue]:
        return {"code": self.code, "message": self.message, "retryable": REGISTRY[self.code].retryable}


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, "api.not_found", f"no {what} {ident} (or it is not yours)")


def _review_error(exc: ReviewError) -> ApiError:
    """An input error of the submitted document (the codes intake would record): 400 for a request that breaks
    the schema (`input.invalid`), 422 for a well-formed one whose document cannot be processed; a spend limit
    (`quota.spend_exceeded`, the stack's `quota.spend_cap`) is 429 with Retry-After."""
    env = exc.envelope
    if env.error_code in ("quota.spend_exceeded", "quota.spend_cap") and env.retry_after_s is not None:
        return ApiError(429, env.error_code, env.message, {"Retry-After": str(int(env.retry_after_s or 3600))})
    return ApiError(400 if env.error_code == "input.invalid" else 422, env.error_code, env.message)


@contextmanager
def _answered() -> Iterator[None]:
    """Admission's errors (`pipeline/admission.py`, the checks intake makes) as the caller's answer."""
    try:
        yield
    except ReviewError as exc:
        raise _review_error(exc) from exc


def _json(status: int, body: object, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=json.dumps(body, separators=(",", ":")), headers=headers)


@app.exception_handler(ApiError)
def _api_error(exc: ApiError) -> Response[str]:
    return _json(exc.status, {"error": exc.body()}, exc.headers)


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Response[str]:
    """Anything else: an AWS error (503 when it is transient: try again) or a bug (500), as an envelope."""
    env = classify(exc, step="api")
    status = 503 if env.retryable else 500
    code = env.error_code if env.error_code in REGISTRY else "runtime.internal"
    log.exception("the Job API answered %s", status, extra={"error_code": code, "path": app.current_event.path})
    return _json(status, {"error": {"code": code, "message": env.message, "retryable": env.retryable}},
                 {"Retry-After": "1"} if env.retryable else None)


# Every route (method, path template); docs/openapi.yaml documents each (a test keeps the two equal). A known
# path with another method answers 405, anything else 404.
ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/jobs"), ("GET", "/jobs/{jobId}"), ("GET", "/jobs/{jobId}/events"), ("GET", "/jobs/{jobId}/report"),
    ("POST", "/jobs/{jobId}/cancel"),
    ("POST", "/jobs/{jobId}/approval"), ("POST", "/jobs/{jobId}/retry"), ("POST", "/batches"),
    ("GET", "/batches/{batchId}"), ("POST", "/uploads"),
)


def _matches(template: str, path: str) -> bool:
    return re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path) is not None


@app.not_found
def _no_route(_: NotFoundError) -> Response[str]:
    path = app.current_event.path
    allowed = sorted({m for m, t in ROUTES if _matches(t, path)})
    if allowed:
        return _api_error(ApiError(405, "api.invalid_request", f"{app.current_event.http_method} is not allowed on "
                                   f"{path} (allowed: {', '.join(allowed)})", {"Allow": ", ".join(allowed)}))
    return _api_error(ApiError(404, "api.not_found", f"no route {path}: see docs/openapi.yaml"))


# ------------------------------------------------------------------------------ request context
def _deps() -> Deps:
    deps = app.context.get("deps")
    if not isinstance(deps, Deps):
        raise RuntimeError("the caller did not give the app its Deps (app.append_context(deps=...))")
    return deps


def caller() -> Caller:
    """The caller: its IAM ARN (HTTP API IAM authorization; the local server puts its token's principal
    there too). None there means the request was not authorized, which the HTTP API never lets through."""
    arn = app.current_event.request_context.authorizer.iam.user_arn
    if not arn:
        raise ApiError(401, "api.unauthenticated", "the request carries no authenticated principal: sign it "
                                                   "with SigV4 (AWS) or send `Authorization: Bearer <api_token>` "
                                                   "(local: .review/local.json)")
    who = Caller(arn)
    wait = limits.request_wait(_deps(), who.principal)  # every request counts against its principal's rate
    if wait is not None:
        raise ApiError(429, "api.rate_limited", f"more than {_deps().settings.profile.limits.api_requests_per_minute} "
                                                f"requests a minute from this principal: send it again in {wait} s",
                       {"Retry-After": str(wait)})
    return who


def _base_url() -> str:
    """The API's own base URL, from the request (so answers carry absolute URLs)."""
    ev = app.current_event
    proto = ev.headers.get("x-forwarded-proto") or "https"
    host = ev.request_context.domain_name or ev.headers.get("host", "")
    stage = ev.request_context.stage
    prefix = f"/{stage}" if stage and stage != "$default" and ev.raw_path.startswith(f"/{stage}/") else ""
    return f"{proto}://{host}{prefix}"


def _raw_body() -> str:
    try:
        return app.current_event.decoded_body or ""
    except UnicodeDecodeError as exc:  # a binary body (the HTTP API sends it base64-encoded)
        raise ApiError(400, "input.invalid", f"the body is not UTF-8 text (at byte {exc.start})") from exc


def _body_json() -> object:
    raw = _raw_body()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "input.invalid", f"the body is not JSON ({exc.msg} at character {exc.pos})") from exc
    _check_unicode(parsed)
    return parsed


def _check_unicode(value: object) -> None:
    """JSON may escape a lone surrogate (\\ud800), which no UTF-8 text (nor DynamoDB) can hold: a 400."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, "input.invalid", "the body holds a string that is not valid Unicode (a lone "
                                             "surrogate escape)") from exc


def _uint_param(name: str, default: int, maximum: int | None = None, minimum: int = 0) -> int:
    raw = app.current_event.get_query_string_value(name, default_value="")
    if raw in (None, ""):
        return default
    if not re.fullmatch(r"[0-9]{1,15}", raw):
        raise ApiError(400, "api.invalid_request", f"query parameter {name} must be a non-negative integer")
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        raise ApiError(400, "api.invalid_request", f"query parameter {name} must be within {minimum}.."
                                                   f"{maximum if maximum is not None else ''}")
    return value


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ------------------------------------------------------------------------------ submission
def _as_in_the_intake_message(name: str) -> Any:
    """The intake message's own definition of its field `name` (constraints, default, description)."""
    return IntakeMessage.model_fields[name]


class JobRequest(BaseModel):
    """`POST /jobs` (and one batch item, with its `custom_id`): the intake message's fields, each as the message
    defines it, but `principal` (always the caller: a body that names it is refused, `PRINCIPAL_REFUSED`).
    `idempotency_key` in the body is the Idempotency-Key header's equivalent (both given: they must agree). Inline text may be larger than a message takes inline (up to
    MAX_DOCUMENT_BYTES: admission sends it on by claim check). JSON types only (`strict`): "1" is no number."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: Literal[1] = 1  # optional: 1 (a queue message pasted as it is)
    document: TextDocument | S3Document
    document_id: str | None = _as_in_the_intake_message("document_id")
    idempotency_key: str | None = _as_in_the_intake_message("idempotency_key")
    metadata: dict[MetaKey, MetaValue] = _as_in_the_intake_message("metadata")
    budget_usd: float | None = _as_in_the_intake_message("budget_usd")
    # left out: interactive; a batch's items: bulk. Not strict: JSON names the enum by its string
    priority: Priority | None = Field(default=None, strict=False,
                                      description=_as_in_the_intake_message("priority").description)
    inference: Inference | None = Field(default=None, strict=False,
                                        description=_as_in_the_intake_message("inference").description)
    deadline_hours: float | None = _as_in_the_intake_message("deadline_hours")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_version(cls, v: Any) -> Any:
        return IntakeMessage._integer_version(v)  # the message's own check: JSON `true` is not the integer 1


PRINCIPAL_REFUSED = ("principal: the API sets it to the caller (the principal that signed the request), never "
                     "the body: leave it out")


class BatchItem(JobRequest):
    custom_id: str = Field(pattern=_CUSTOM_ID.pattern)


def _validation_message(exc: ValidationError) -> str:
    shown = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"] if x not in ("TextDocument", "S3Document"))
        shown.append(f"{loc or '<body>'}: {e['msg']}")
    return "; ".join(shown)


def _parse(model: type[JobRequest], raw: object) -> JobRequest:
    if isinstance(raw, dict) and "principal" in raw:
        raise ApiError(400, "input.invalid", PRINCIPAL_REFUSED)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(400, "input.invalid", _validation_message(exc)) from exc


def scoped_key(who: str, key: str) -> str:
    """The intake idempotency key of `key` submitted by `who`: two principals never share a job."""
    return "api:" + hashlib.sha256(f"{who}\n{key}".encode()).hexdigest()


def job_id_of(who: str, key: str) -> str:
    return job_id_for(scoped_key(who, key))


def _get_json(deps: Deps, key: str) -> str | None:
    """An object of the bucket, or None when there is none."""
    try:
        return deps.artifacts.read_uri(deps.artifacts.bucket, key).decode("utf-8")
    except ReviewError as exc:
        if exc.envelope.error_code == "input.document_missing":
            return None
        raise


def submission(deps: Deps, job_id: str) -> Submission | None:
    return admission.submission(deps, job_id)


class Submitted(BaseModel):
    job_id: str
    status: str
    replayed: bool  # the same submission (key) again: the job it names


def submit(deps: Deps, caller: Caller, req: JobRequest, key: str | None, batch_id: str | None = None) -> Submitted:
    """One document to the intake queue, bound to `who`. Idempotent: the same key (default: the document's
    SHA-256) from the same principal is one job; the key with another document is `input.key_conflict`."""
    who = caller.principal
    with _answered():
        text = admission.document_text(deps, req.document, who)  # an s3_uri only in the caller's own uploads
        expected = admission.check_budget(deps.settings, text, req.budget_usd)  # before anything is sent
    sha = document_hash(text)
    job_id = job_id_of(who, key or sha)
    job = deps.jobs.get(job_id)
    pending = submission(deps, job_id) if job is None else None
    known_sha = job.document_sha256 if job is not None else (pending.document_sha256 if pending else "")
    if job is not None and not caller.owns(job.principal):
        raise ApiError(409, "input.key_conflict", "this idempotency key names another job: use another key")
    if known_sha and known_sha != sha and not (job is not None and job.replaceable):  # as intake decides
        raise ApiError(409, "input.key_conflict", f"idempotency key {key!r} was used for another document "
                                                  "(another SHA-256): send this document with its own key")
    if job is not None and not job.replaceable:
        return Submitted(job_id=job_id, status=job.state.value, replayed=True)
    # a batch's items are bulk unless they say otherwise; a single job is interactive
    body = _intake_body(deps, who, scoped_key(who, key or sha), text, req,
                        Priority.BULK if batch_id is not None else Priority.INTERACTIVE)
    replayed = pending is not None
    # its estimate from the principal's daily allowance, once per admission (a replay, or the client's retry of a
    # request that failed after taking it, takes nothing again; a replacement of a job failed on its input is an
    # admission of its own)
    # and from the stack's daily spend cap (domain/spend_cap.py), under the same admission (intake sees it taken)
    estimate = expected if expected is not None else admission.estimate(deps.settings, text).model_micro_usd
    admission_id = limits.spend_charge_id(job_id, job)
    with _answered():
        if (too_large := spend_cap.never_fits(deps, estimate)) is not None:  # never under the cap: 422, not 429
            raise too_large
        charge = limits.take_spend(deps, who, estimate, admission_id)
        try:
            stack_charge = spend_cap.admit(deps, estimate, admission_id)
        except BaseException:
            spend_cap.give_back(deps, charge)
            raise
    try:
        if pending is None:  # before the message: the job is the caller's from the moment it can exist
            pending = Submission(job_id=job_id, principal=who, document_sha256=sha, submitted_at=deps.clock(),
                                 batch_id=batch_id)
            deps.artifacts.put_text(submission_key(job_id), pending.model_dump_json())
        # Sent again while intake has not recorded the job (the first send may have been lost with a 5xx the
        # client is retrying): intake takes the same job once.
        deps.queues.send_intake(body)
    except BaseException:
        for taken in (charge, stack_charge):  # nothing queued: the allowances get it back (the error is the answer)
            spend_cap.give_back(deps, taken)
        raise
    return Submitted(job_id=job_id, status=JobState.QUEUED.value, replayed=replayed)


def _intake_body(deps: Deps, who: str, key: str, text: str, req: JobRequest,
                 default_priority: Priority = Priority.INTERACTIVE) -> str:
    """Admission's intake message, with `principal`; validated as intake will: an invalid message is the caller's
    400, never a failed job."""
    with _answered():
        body = admission.intake_body(
            deps, text, key=key, upload=req.document if isinstance(req.document, S3Document) else None,
            document_id=req.document_id, metadata=req.model_dump(mode="json")["metadata"], budget_usd=req.budget_usd,
            principal=who, priority=req.priority or default_priority, inference=req.inference,
            deadline_hours=req.deadline_hours)
        parse_intake(body)
    return body


def _idempotency_key() -> str | None:
    key = app.current_event.headers.get("idempotency-key")
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise ApiError(400, "api.invalid_request", f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} visible ASCII "
                                                   "characters (inner spaces allowed)")
    return key


def _links(job_id: str, base_url: str) -> dict[str, str]:
    base = f"{base_url}/jobs/{job_id}"
    return {"statusUrl": base, "eventsUrl": f"{base}/events", "cancelUrl": f"{base}/cancel"}


@app.post("/jobs")
def post_job() -> Response[str]:
    who = caller()
    header = _idempotency_key()
    req = _parse(JobRequest, _body_json())
    if header is not None and req.idempotency_key is not None and header != req.idempotency_key:
        raise ApiError(409, "api.conflict", "the Idempotency-Key header and the body's idempotency_key differ: send "
                                            "one of them, or the same key in both")
    done = submit(_deps(), who, req, header or req.idempotency_key)
    links = _links(done.job_id, _base_url())
    headers = {"Location": links["statusUrl"]}
    if done.replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, {"jobId": done.job_id, "status": done.status, **links}, headers)


# ------------------------------------------------------------------------------ uploads
UPLOAD_EXPIRY_S = 900  # a presigned upload is good for 15 minutes


class UploadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,100}$",
                             description="A name to recognise the upload by (its key ends with it).")


@app.post("/uploads")
def post_upload() -> Response[str]:
    """A presigned POST into the caller's own uploads (`principals.uploads_prefix`): S3 takes 1..MAX_DOCUMENT_BYTES
    bytes (the signed `content-length-range`; intake checks the size again), for UPLOAD_EXPIRY_S. Send the
    `s3Uri` it answers as the document of `POST /jobs`: only this principal's jobs may read it."""
    who = caller()
    raw = _raw_body().strip()
    try:
        req = UploadRequest.model_validate(json.loads(raw) if raw else {})
    except ValueError as exc:  # not JSON, or a ValidationError
        detail = _validation_message(exc) if isinstance(exc, ValidationError) else "the body is not JSON"
        raise ApiError(400, "api.invalid_request", detail) from exc
    deps = _deps()
    key = f"{uploads_prefix(who.principal)}{secrets.token_hex(16)}-{req.name or 'document'}.txt"
    upload = deps.artifacts.presign_upload(key, MAX_DOCUMENT_BYTES, UPLOAD_EXPIRY_S)
    return _json(201, {"s3Uri": f"s3://{deps.artifacts.bucket}/{key}", "maxBytes": MAX_DOCUMENT_BYTES,
                       "expiresAt": iso(deps.clock() + UPLOAD_EXPIRY_S),
                       "upload": {"method": "POST", "url": upload.url, "fields": upload.fields}})


# ------------------------------------------------------------------------------ reading a job
def owned_job(deps: Deps, who: Caller, job_id: str) -> Job | Submission:
    """The caller's job, or its submission while intake has not recorded it yet; 404 otherwise (also for
    another principal's job: its existence is not revealed)."""
    if not _JOB_ID.fullmatch(job_id):
        raise not_found("job", job_id)
    job = deps.jobs.get(job_id)
    if job is not None:
        if not who.owns(job.principal):
            raise not_found("job", job_id)
        return job
    pending = submission(deps, job_id)
    if pending is None or not who.owns(pending.principal):
        raise not_found("job", job_id)
    return pending


def _progress(deps: Deps, job: Job) -> dict[str, JsonValue]:
    """From durable state only (as `review watch` shows it): settled chunks of the chunk count, and the
    label of the latest event."""
    p = ops.job_progress(deps, job)
    return {"currentStep": p.current_step, "totalSteps": p.total_steps, "label": p.label}


def _retryable(job: Job) -> bool:
    """Whether `POST /jobs/{id}/retry` can put the job back to work."""
    return redrive.retryable(job)


def job_status(deps: Deps, found: Job | Submission, base_url: str = "") -> dict[str, JsonValue]:
    """`GET /jobs/{id}` (URLs under `base_url`)."""
    if isinstance(found, Submission):
        return {"jobId": found.job_id, "status": JobState.QUEUED.value, "documentId": None,
                "progress": {"currentStep": 0, "totalSteps": 0, "label": "waiting for intake"},
                "result": None, "error": None, "createdAt": iso(found.submitted_at), "updatedAt": iso(found.submitted_at),
                **_links(found.job_id, base_url)}
    job = found
    result: JsonValue = None
    if job.report_json_key:
        bucket = deps.artifacts.bucket
        result = {"reportUrl": f"{base_url}/jobs/{job.job_id}/report",  # what the caller can read (a 302 to it)
                  "reportJson": f"s3://{bucket}/{job.report_json_key}",
                  "reportMarkdown": f"s3://{bucket}/{job.report_md_key}" if job.report_md_key else None,
                  "findings": job.n_findings}
    error: JsonValue = None
    if job.error_code or job.error:
        code = job.error_code or (job.error.error_code if job.error else "runtime.internal")
        error = {"code": code, "message": job.error.message if job.error else "", "retryable": _retryable(job)}
    view: dict[str, JsonValue] = {
        "jobId": job.job_id, "status": job.state.value, "documentId": job.document_id or None,
        "progress": _progress(deps, job), "result": result, "error": error, "createdAt": iso(job.created_at),
        "updatedAt": iso(job.updated_at), **_links(job.job_id, base_url)}
    if job.inference is Inference.BATCH:  # batch inference: its deadline, and the batch jobs holding its calls
        view["inference"] = job.inference.value
        view["deadline"] = iso(job.deadline_at) if job.deadline_at else None
        if not job.terminal:
            view["batches"] = [{"batchJobArn": b.batch_job_arn, "status": b.status, "records": b.records,
                                "batchRecords": b.batch_records,
                                "submittedAt": iso(b.submitted_at) if b.submitted_at else None,
                                "expectedBy": iso(b.expected_by) if b.expected_by else None}
                               for b in batch_inference.batches_of(deps, deps.claims.for_job(job.job_id),
                                                         deps.settings.profile.batch.batch_expected_s)]
    if job.waiting is not None and not job.terminal:  # what its chunks are held for (the daily token quota)
        w = job.waiting
        view["waiting"] = {"condition": w.condition, "modelId": w.model_id, "tokensPerDay": w.tokens_per_day,
                           "since": iso(w.since), "message": w.detail}
    if job.approval is not None:  # a side effect whose outcome is unknown: what a person decides on
        a = job.approval
        view["approval"] = {"step": a.step, "key": a.key, "reason": a.reason, "evidence": a.evidence,
                            "requestedAt": iso(a.requested_at),
                            "expiresAt": iso(a.expires_at), "decision": a.decision, "decidedBy": a.decided_by or None,
                            "approvalUrl": f"{base_url}/jobs/{job.job_id}/approval"}
    return view


@app.get("/jobs/<job_id>")
def get_job(job_id: str) -> Response[str]:
    deps = _deps()
    return _json(200, job_status(deps, owned_job(deps, caller(), job_id), _base_url()))


REPORT_URL_EXPIRY_S = 300  # a report's presigned GET is good for 5 minutes
REPORT_FORMATS = ("json", "md")


def report_url(deps: Deps, found: Job | Submission, fmt: str) -> str:
    """A presigned GET of the job's report (`json` or `md`); 409 while it has none (a report is written when the job
    completes). Presigned, not returned: a Lambda behind the HTTP API answers at most 6 MB and a 5 MB contract's report
    can be larger; the caller's own credentials cannot read the bucket, which holds every principal's reports."""
    if fmt not in REPORT_FORMATS:
        raise ApiError(400, "api.invalid_request", f"format must be one of {', '.join(REPORT_FORMATS)}, not {fmt!r}")
    key = None if isinstance(found, Submission) else (found.report_json_key if fmt == "json" else found.report_md_key)
    if key is None:
        state = JobState.QUEUED.value if isinstance(found, Submission) else found.state.value
        raise ApiError(409, "api.conflict", f"job {found.job_id} has no report yet (it is {state}): a report is "
                                            "written when the job completes")
    return deps.artifacts.presign_download(key, REPORT_URL_EXPIRY_S, f"{found.job_id}-report.{fmt}")


@app.get("/jobs/<job_id>/report")
def get_report(job_id: str) -> Response[str]:
    """The owner's report: 302 to a presigned GET good for REPORT_URL_EXPIRY_S (`?format=json`, the default, or `md`);
    404 to anyone else, as every job route."""
    deps = _deps()
    found = owned_job(deps, caller(), job_id)
    url = report_url(deps, found, app.current_event.get_query_string_value("format", "json") or "json")
    return _json(302, {"reportUrl": url, "expiresAt": iso(deps.clock() + REPORT_URL_EXPIRY_S)}, {"Location": url})


def job_events(deps: Deps, job_id: str, after: int, limit: int) -> list[JsonValue]:
    """The job's events numbered above `after`, in order (at most `limit`), stopping before a gap a writer
    may still fill (`lifecycle.read_events`): a reader resuming after the last number it saw loses nothing."""
    return [{"seq": e.number, "type": e.type, "at": iso(e.at), "detail": e.detail, "label": ops.event_label(e)}
            for e in lifecycle.read_events(deps, job_id, after=after, limit=limit)]


@app.get("/jobs/<job_id>/events")
def get_events(job_id: str) -> Response[str]:
    deps = _deps()
    found = owned_job(deps, caller(), job_id)
    after = _uint_param("after", 0)
    limit = _uint_param("limit", DEFAULT_EVENTS_LIMIT, MAX_EVENTS_LIMIT, minimum=1)
    if isinstance(found, Submission):
        return _json(200, [])
    return _json(200, job_events(deps, job_id, after, limit))


# ------------------------------------------------------------------------------ acting on a job
def _recorded(deps: Deps, who: Caller, job_id: str, action: str) -> Job:
    found = owned_job(deps, who, job_id)
    if isinstance(found, Submission):
        raise ApiError(409, "api.conflict", f"intake has not taken the job in yet: {action} it in a few seconds",
                       {"Retry-After": "2"})
    return found


@app.post("/jobs/<job_id>/cancel")
def cancel(job_id: str) -> Response[str]:
    deps, who = _deps(), caller()
    _recorded(deps, who, job_id, "cancel")
    outcome = lifecycle.request_cancel(deps, job_id, by=who.arn)
    state = outcome.state
    if state is None:
        raise not_found("job", job_id)
    if state not in (JobState.CANCELLING, JobState.CANCELLED):  # ended otherwise, or kept changing
        raise ApiError(409, "api.conflict", outcome.message)
    return _json(202, {"jobId": job_id, "status": state.value, "changed": outcome.changed, "message": outcome.message})


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject"]


@app.post("/jobs/<job_id>/approval")
def approval(job_id: str) -> Response[str]:
    deps, who = _deps(), caller()
    _recorded(deps, who, job_id, "decide")
    try:
        req = ApprovalRequest.model_validate(_body_json())
    except ValidationError as exc:
        raise ApiError(400, "api.invalid_request", _validation_message(exc)) from exc
    outcome = approvals.decide_approval(deps, job_id, req.decision, who.arn)
    if outcome.state is None:
        raise not_found("job", job_id)
    if not outcome.changed:  # not waiting for approval (or it kept changing)
        raise ApiError(409, "api.conflict", outcome.message)
    return _json(202, {"jobId": job_id, "status": outcome.state.value, "decision": req.decision, "changed": True,
                       "message": outcome.message})


@app.post("/jobs/<job_id>/retry")
def retry(job_id: str) -> Response[str]:
    deps = _deps()
    _recorded(deps, caller(), job_id, "retry")
    r = redrive.retry(deps, job_id)
    if not r.retried:
        raise ApiError(409, "api.conflict", r.action)
    return _json(202, {"jobId": job_id, "status": r.state.value if r.state else None, "action": r.action})


# ------------------------------------------------------------------------------ batches
class BatchLine(BaseModel):
    custom_id: str | None
    job_id: str | None = None
    error: dict[str, JsonValue] | None = None


class BatchManifest(BaseModel):
    batch_id: str
    principal: str
    created_at: float
    items: list[BatchLine]


_NOT_JSON = object()


def _batch_items() -> list[object]:
    """The body: a JSON list, `{"items": [...]}`, or JSON Lines (one item per line)."""
    raw = _raw_body().strip()
    ctype = (app.current_event.headers.get("content-type") or "").lower()
    if not any(t in ctype for t in ("ndjson", "jsonl", "json-seq")):
        parsed: object = _NOT_JSON
        try:
            parsed = json.loads(raw)
        except ValueError:
            if "json" in ctype:  # declared JSON: it must be (JSON Lines say application/x-ndjson)
                _body_json()
            # no content type and not one JSON value: JSON Lines
        if isinstance(parsed, dict) and isinstance(parsed.get("items"), list):
            parsed = parsed["items"]
        if isinstance(parsed, list):
            return list(parsed)
        if parsed is not _NOT_JSON:  # one JSON value that is no list of items (`null` too)
            raise ApiError(400, "input.invalid", 'a batch is a JSON list of items, {"items": [...]}, or JSON Lines '
                                                 "(Content-Type: application/x-ndjson)")
    return parse_jsonl(raw)


def parse_jsonl(raw: str) -> list[object]:
    """JSON Lines: one item per non-blank line; a line that is no JSON stays an item (reported as rejected)."""
    items: list[object] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except ValueError:
            items.append(_BadLine(n))
    return items


class _BadLine:
    def __init__(self, line: int):
        self.line = line


def _item_error(code: str, message: str) -> dict[str, JsonValue]:
    return {"code": code, "message": message, "retryable": REGISTRY[code].retryable}


def _submit_item(deps: Deps, who: Caller, batch_id: str, n: int, raw: object, seen: set[str]) -> BatchLine:
    """One item: its own job, or its error. Never raises for the item's own fault."""
    custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
    custom_id = custom_id if isinstance(custom_id, str) else None
    if isinstance(raw, _BadLine):
        return BatchLine(custom_id=None, error=_item_error("input.invalid", f"item {n}: not JSON"))
    if custom_id is not None and custom_id in seen:
        return BatchLine(custom_id=custom_id, error=_item_error("input.invalid", f"item {n}: custom_id {custom_id!r} "
                                                                                "appears twice in the batch"))
    try:
        _check_unicode(raw)
        req = _parse(BatchItem, raw)
        assert isinstance(req, BatchItem)
        seen.add(req.custom_id)
        done = submit(deps, who, req, req.idempotency_key, batch_id)  # without one: keyed by its document
    except ApiError as exc:
        return BatchLine(custom_id=custom_id, error=_item_error(exc.code, f"item {n}: {exc.message}"))
    return BatchLine(custom_id=req.custom_id, job_id=done.job_id)


def batch_manifest(deps: Deps, who: Caller, batch_id: str) -> BatchManifest:
    raw = _get_json(deps, batch_key(batch_id)) if _BATCH_ID.fullmatch(batch_id) else None
    manifest = BatchManifest.model_validate_json(raw) if raw else None
    if manifest is None or not who.owns(manifest.principal):
        raise not_found("batch", batch_id)
    return manifest


def batch_view(deps: Deps, manifest: BatchManifest, base_url: str = "") -> dict[str, JsonValue]:
    """`GET /batches/{id}`: each item's state (URLs under `base_url`)."""
    counts: dict[str, int] = {}
    items: list[JsonValue] = []
    for line in manifest.items:
        if line.job_id is None:
            status, error = "rejected", line.error
        else:
            found: Job | Submission | None = deps.jobs.get(line.job_id) or submission(deps, line.job_id)
            view = job_status(deps, found, base_url) if found is not None else None
            status = str(view["status"]) if view else JobState.QUEUED.value
            error = view["error"] if view and isinstance(view["error"], dict) else None
        counts[status] = counts.get(status, 0) + 1
        items.append({"customId": line.custom_id, "jobId": line.job_id, "status": status, "error": error,
                      "statusUrl": f"{base_url}/jobs/{line.job_id}" if line.job_id else None})
    ended = all(s == "rejected" or JobState(s).terminal for s in counts)
    return {"batchId": manifest.batch_id, "createdAt": iso(manifest.created_at), "total": len(manifest.items),
            "counts": dict(counts), "ended": ended, "items": items,
            "statusUrl": f"{base_url}/batches/{manifest.batch_id}"}


def submit_batch(deps: Deps, who: Caller, raw_items: list[object], key: str) -> tuple[BatchManifest, bool]:
    """Each item its own job; one bad item is reported, never fails the batch. The same batch (key) again
    answers with the manifest already stored."""
    batch_id = "batch-" + hashlib.sha256(f"{who.principal}\n{key}".encode()).hexdigest()[:20]
    manifest_key = batch_key(batch_id)
    stored = _get_json(deps, manifest_key)
    if stored:
        manifest = BatchManifest.model_validate_json(stored)
        if who.owns(manifest.principal):
            return manifest, True
    seen: set[str] = set()
    lines = [_submit_item(deps, who, batch_id, n, raw, seen) for n, raw in enumerate(raw_items, 1)]
    manifest = BatchManifest(batch_id=batch_id, principal=who.principal, created_at=deps.clock(), items=lines)
    deps.artifacts.put_text(manifest_key, manifest.model_dump_json())
    return manifest, False


@app.post("/batches")
def post_batch() -> Response[str]:
    who = caller()
    key = _idempotency_key()
    items = _batch_items()
    if not items:
        raise ApiError(400, "input.invalid", "the batch has no items")
    if len(items) > MAX_BATCH_ITEMS:
        raise ApiError(400, "input.invalid", f"{len(items)} items: a batch takes at most {MAX_BATCH_ITEMS} (send "
                                             "several batches)")
    deps = _deps()
    body_key = key or hashlib.sha256(_raw_body().encode()).hexdigest()
    manifest, replayed = submit_batch(deps, who, items, body_key)
    view = batch_view(deps, manifest, _base_url())
    view["accepted"] = sum(1 for line in manifest.items if line.job_id)
    view["rejected"] = sum(1 for line in manifest.items if not line.job_id)
    headers = {"Location": str(view["statusUrl"])}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, view, headers)


@app.get("/batches/<batch_id>")
def get_batch(batch_id: str) -> Response[str]:
    deps = _deps()
    return _json(200, batch_view(deps, batch_manifest(deps, caller(), batch_id), _base_url()))


def resolve(event: object, context: object, deps: Deps) -> object:
    """Answer one HTTP API v2 event with `deps` (the Lambda handler and the local server both call this)."""
    app.append_context(deps=deps)
    return app.resolve(event, context)  # type: ignore[arg-type]  # a v2 event dict, a Lambda context

