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

Admission. A submission takes the intake message's fields (`api_requests.JobRequest`) and goes through the one
submit (`submission.submit`, which `review submit` and the status page call too): the document checks intake makes
(the same `input.*` codes), the key rule intake applies (`Job.key_conflict`), the spend limits (`limits.py`), and the
intake message. Submission batches (`POST /batches`) are `api_batches.py`; a job's view (`GET /jobs/{id}`) is a
projection of `job_view.JobView`.

This module: the routes, the errors, the caller.

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
from typing import Literal

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from contract_review.domain import lifecycle
from contract_review.domain.errors import REGISTRY, ReviewError, classify
from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller, uploads_prefix
from contract_review.domain.records import Job, JobState, Submission
from contract_review.operate import api_batches, limits
from contract_review.operate.api_batches import MAX_BATCH_ITEMS
from contract_review.operate.api_requests import JobRequest, check_unicode, parse_request, validation_message
from contract_review.operate.job_view import api_time, job_status, links, no_report
from contract_review.operate.narration import event_label
from contract_review.operate.submission import Refused, submit
from contract_review.pipeline import admission, redrive
from contract_review.sideeffects import approvals

app = APIGatewayHttpResolver()
log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY = 255
DEFAULT_EVENTS_LIMIT = 100
MAX_EVENTS_LIMIT = 1000
_JOB_ID = re.compile(r"^job-[0-9a-f]{20}$")
_KEY = re.compile(r"^[!-~]([ -~]{0,253}[!-~])?$")  # visible ASCII, inner spaces, at most 255 (MAX_IDEMPOTENCY_KEY)



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


def refusal(exc: ReviewError) -> ApiError:
    """A refused submission (`submission.Refused`: the codes intake would record): 400 for a request that breaks
    the schema (`input.invalid`), 409 for a key that names another job (`input.key_conflict`), 422 for a well-formed
    one whose document cannot be processed; a spend limit
    (`quota.spend_exceeded`, the stack's `quota.spend_cap`) is 429 with Retry-After."""
    env = exc.envelope
    if env.error_code == "input.key_conflict":  # the key names another job (`Job.key_conflict`)
        return ApiError(409, env.error_code, env.message)
    if env.error_code in ("quota.spend_exceeded", "quota.spend_cap") and env.retry_after_s is not None:
        return ApiError(429, env.error_code, env.message, {"Retry-After": str(int(env.retry_after_s or 3600))})
    return ApiError(400 if env.error_code == "input.invalid" else 422, env.error_code, env.message)


@contextmanager
def _answered() -> Iterator[None]:
    """A refused submission (`submission.Refused`: the checks intake makes, the key rule, the spend limits, the
    request's own checks) as the caller's answer; anything else is `_unexpected`'s."""
    try:
        yield
    except Refused as exc:
        raise refusal(exc) from exc


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
    with _answered():
        check_unicode(parsed)
    return parsed



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



def _idempotency_key() -> str | None:
    key = app.current_event.headers.get("idempotency-key")
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise ApiError(400, "api.invalid_request", f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} visible ASCII "
                                                   "characters (inner spaces allowed)")
    return key



@app.post("/jobs")
def post_job() -> Response[str]:
    who = caller()
    header = _idempotency_key()
    with _answered():
        req = parse_request(JobRequest, _body_json())
    if header is not None and req.idempotency_key is not None and header != req.idempotency_key:
        raise ApiError(409, "api.conflict", "the Idempotency-Key header and the body's idempotency_key differ: send "
                                            "one of them, or the same key in both")
    with _answered():
        done = submit(_deps(), who, req.submit_request(header or req.idempotency_key))
    urls = links(done.job_id, _base_url())
    headers = {"Location": urls["statusUrl"]}
    if done.replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, {"jobId": done.job_id, "status": done.status, **urls}, headers)


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
    body: object = None
    try:
        body = json.loads(raw) if raw else {}
        req = UploadRequest.model_validate(body)
    except ValueError as exc:  # not JSON, or a ValidationError
        detail = validation_message(exc, body) if isinstance(exc, ValidationError) else "the body is not JSON"
        raise ApiError(400, "api.invalid_request", detail) from exc
    deps = _deps()
    key = f"{uploads_prefix(who.principal)}{secrets.token_hex(16)}-{req.name or 'document'}.txt"
    upload = deps.artifacts.presign_upload(key, MAX_DOCUMENT_BYTES, UPLOAD_EXPIRY_S)
    return _json(201, {"s3Uri": f"s3://{deps.artifacts.bucket}/{key}", "maxBytes": MAX_DOCUMENT_BYTES,
                       "expiresAt": api_time(deps.clock() + UPLOAD_EXPIRY_S),
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
    pending = admission.submission(deps, job_id)
    if pending is None or not who.owns(pending.principal):
        raise not_found("job", job_id)
    return pending



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
        raise ApiError(409, "api.conflict", f"job {found.job_id} has no report yet (it is {JobState.QUEUED.value}): a "
                                            "report is written when the job ends" if isinstance(found, Submission)
                       else no_report(found))
    return deps.artifacts.presign_download(key, REPORT_URL_EXPIRY_S, f"{found.job_id}-report.{fmt}")


@app.get("/jobs/<job_id>/report")
def get_report(job_id: str) -> Response[str]:
    """The owner's report: 302 to a presigned GET good for REPORT_URL_EXPIRY_S (`?format=json`, the default, or `md`);
    404 to anyone else, as every job route."""
    deps = _deps()
    found = owned_job(deps, caller(), job_id)
    url = report_url(deps, found, app.current_event.get_query_string_value("format", "json") or "json")
    return _json(302, {"reportUrl": url, "expiresAt": api_time(deps.clock() + REPORT_URL_EXPIRY_S)}, {"Location": url})


def job_events(deps: Deps, job_id: str, after: int, limit: int) -> list[JsonValue]:
    """The job's events numbered above `after`, in order (at most `limit`), stopping before a gap a writer
    may still fill (`lifecycle.read_events`): a reader resuming after the last number it saw loses nothing."""
    return [{"seq": e.number, "type": e.type, "at": api_time(e.at), "detail": e.detail, "label": event_label(e)}
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
    body = _body_json()
    try:
        req = ApprovalRequest.model_validate(body)
    except ValidationError as exc:
        raise ApiError(400, "api.invalid_request", validation_message(exc, body)) from exc
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



_NOT_JSON = object()


def _batch_items() -> list[api_batches.RawItem]:
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
            return api_batches.numbered(parsed)
        if parsed is not _NOT_JSON:  # one JSON value that is no list of items (`null` too)
            raise ApiError(400, "input.invalid", 'a batch is a JSON list of items, {"items": [...]}, or JSON Lines '
                                                 "(Content-Type: application/x-ndjson)")
    return api_batches.parse_jsonl(raw)



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
    manifest, replayed = api_batches.submit_batch(deps, who, items, body_key)
    view = api_batches.batch_view(deps, manifest, _base_url())
    view["accepted"] = sum(1 for line in manifest.items if line.job_id)
    view["rejected"] = sum(1 for line in manifest.items if not line.job_id)
    headers = {"Location": str(view["statusUrl"])}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, view, headers)


@app.get("/batches/<batch_id>")
def get_batch(batch_id: str) -> Response[str]:
    deps = _deps()
    manifest = api_batches.batch_manifest(deps, caller(), batch_id)
    if manifest is None:
        raise not_found("batch", batch_id)
    return _json(200, api_batches.batch_view(deps, manifest, _base_url()))


def resolve(event: object, context: object, deps: Deps) -> object:
    """Answer one HTTP API v2 event with `deps` (the Lambda handler and the local server both call this)."""
    app.append_context(deps=deps)
    return app.resolve(event, context)  # type: ignore[arg-type]  # a v2 event dict, a Lambda context

