"""The Job API on loopback: the same Powertools app the Lambda runs (`contract_review.operate.api`), behind a
stdlib `ThreadingHTTPServer` that turns each request into an HTTP API v2 event.

Authentication stands in for the HTTP API's IAM authorization: `Authorization: Bearer <token>`, where
each token (generated at start with `secrets.token_urlsafe`) maps to a principal, an IAM-user-like ARN
that the server puts where API Gateway puts the caller's ARN (`requestContext.authorizer.iam.userArn`).
A request without a known token reaches the app without a principal and is answered 401 by the app.
`review up` prints the token of the first principal and writes every principal's token to `.review/local.json`
(`api_tokens`, by name: `local-user` and `local-other`; `api_token` is `local-user`'s), so isolation between
principals can be tried as a user would: one principal cannot read, cancel, approve, retry or submit from
another's uploads.

Server-sent events (only here: an HTTP API cannot stream): `GET /jobs/{id}/events` with
`Accept: text/event-stream` streams the job's events as they are recorded (`id:` is the event's sequence
number), resuming after `Last-Event-ID` (or `?after=`), and ends with an `end` event once the job has
ended and every event was sent. Each poll is one call of the same app route, so the stream and the JSON
API can never disagree.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

from contract_review.domain.ports import Deps
from contract_review.domain.records import JobState
from contract_review.operate import api

from .loopback import Loopback

LOCAL_ACCOUNT = "123456789012"  # the embedded stack's account (review_local.embedded)
LOCAL_PRINCIPALS = ("local-user", "local-other")  # the local API's principals, by name (IAM users of LOCAL_ACCOUNT)
MAX_BODY_BYTES = 10 * 1024 * 1024  # an HTTP API takes request bodies up to 10 MB
SSE_POLL_S = 0.3
SSE_KEEPALIVE_S = 15.0
_RESOLVE = threading.Lock()  # Powertools keeps the current event on the router class: one request at a time


def local_principal(name: str) -> str:
    return f"arn:aws:iam::{LOCAL_ACCOUNT}:user/{name}"


@dataclass
class ApiServer:
    """`start()` serves on 127.0.0.1 (a free port unless given); `url`, `token`, `other_token`."""

    deps: Deps
    port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)  # token -> principal
    loop: Loopback = field(default_factory=Loopback)  # the server on 127.0.0.1 (loopback.py)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = {secrets.token_urlsafe(32): local_principal(name) for name in LOCAL_PRINCIPALS}

    @property
    def token(self) -> str:
        """The first principal's token (the one `review up` prints)."""
        return next(iter(self.tokens))

    @property
    def other_token(self) -> str:
        return list(self.tokens)[1]

    @property
    def tokens_by_name(self) -> dict[str, str]:
        """Principal name (the IAM user name of its ARN) -> its bearer token: `api_tokens` in .review/local.json."""
        return {principal.rsplit("/", 1)[-1]: token for token, principal in self.tokens.items()}

    @property
    def url(self) -> str:
        return self.loop.address + ""

    def start(self) -> ApiServer:
        server = self

        class Handler(_Handler):
            api_server = server

        self.loop.serve(Handler, self.port, "api-server")
        return self

    def stop(self) -> None:
        self.loop.close()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, event: Mapping[str, object]) -> Mapping[str, object]:
        with _RESOLVE:
            answer = api.resolve(event, SimpleNamespace(function_name="api-local", aws_request_id="local"), self.deps)
        assert isinstance(answer, Mapping)
        return answer


def http_api_event(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes,
                   principal: str | None, host: str, source_ip: str) -> dict[str, object]:
    """An API Gateway HTTP API (payload format 2.0) event, as API Gateway builds it for an IAM-authorized route."""
    now = time.time()
    lowered: dict[str, str] = {}
    for k, v in headers.items():
        lowered[k.lower()] = f"{lowered[k.lower()]},{v}" if k.lower() in lowered else v
    lowered.setdefault("x-forwarded-proto", "http")
    params: dict[str, str] = {}
    for k, v in parse_qsl(query, keep_blank_values=True):
        params[k] = f"{params[k]},{v}" if k in params else v
    context: dict[str, object] = {
        "accountId": LOCAL_ACCOUNT, "apiId": "local", "domainName": host, "domainPrefix": host.split(".")[0],
        "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": source_ip,
                 "userAgent": lowered.get("user-agent", "")},
        "requestId": uuid.uuid4().hex, "routeKey": "$default", "stage": "$default",
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)), "timeEpoch": int(now * 1000),
    }
    if principal is not None:
        context["authorizer"] = {"iam": {"accessKey": "LOCAL", "accountId": LOCAL_ACCOUNT, "callerId": principal,
                                         "principalOrgId": None, "userArn": principal, "userId": principal}}
    event: dict[str, object] = {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": query,
                                "headers": lowered, "requestContext": context, "isBase64Encoded": False}
    if params:
        event["queryStringParameters"] = params
    if body:
        try:
            event["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode("ascii"), True
    return event


class _Handler(BaseHTTPRequestHandler):
    api_server: ApiServer
    protocol_version = "HTTP/1.1"
    server_version = "review-api/1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's signature)
        pass  # no access log on the terminal of `review up`

    def _principal(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.api_server.tokens.get(token.strip())

    def _event(self, method: str, body: bytes, path: str | None = None, query: str | None = None) -> dict[str, object]:
        url = urlsplit(self.path)
        return http_api_event(method, path or url.path, url.query if query is None else query,
                              {k: v for k, v in self.headers.items()}, body, self._principal(),
                              self.headers.get("Host", "127.0.0.1"), self.client_address[0])

    def _send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _answer(self, answer: Mapping[str, object]) -> None:
        raw = answer.get("body") or ""
        body = base64.b64decode(str(raw)) if answer.get("isBase64Encoded") else str(raw).encode("utf-8")
        headers = answer.get("headers")
        status = answer.get("statusCode")
        self._send(status if isinstance(status, int) else 500,
                   {str(k): str(v) for k, v in headers.items()} if isinstance(headers, Mapping) else {}, body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": {"code": code, "message": message, "retryable": False}}).encode()
        self._send(status, {"Content-Type": "application/json"}, body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, "api.invalid_request", f"the body is over {MAX_BODY_BYTES:,} bytes (the HTTP API's limit)")
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        wants_stream = "text/event-stream" in self.headers.get("Accept", "")
        if self.command == "GET" and wants_stream and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "events":
            self._stream(parts[1], url.path, url.query)
            return
        self._answer(self.api_server.call(self._event(self.command, body)))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = _handle  # others: 405

    # ------------------------------------------------------------------ server-sent events
    def _stream(self, job_id: str, path: str, query: str) -> None:
        params = dict(parse_qsl(query))
        last = self.headers.get("Last-Event-ID") or params.get("after") or "0"
        after = int(last) if last.isdigit() else 0
        first = self.api_server.call(self._event("GET", b"", path, f"after={after}"))
        if first.get("statusCode") != 200:
            self._answer(first)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        answer, quiet_since = first, time.monotonic()
        try:
            while not self.api_server.loop.stopping.is_set():
                page = json.loads(str(answer.get("body") or "[]")) if answer.get("statusCode") == 200 else None
                if not isinstance(page, list):
                    return  # the job is gone (or no longer readable): end the stream
                events = page
                for e in events:
                    self.wfile.write(f"id: {e['seq']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
                    after = int(e["seq"])
                if events:
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                    if len(events) >= api.DEFAULT_EVENTS_LIMIT:  # more are waiting: no pause
                        answer = self.api_server.call(self._event("GET", b"", path, f"after={after}"))
                        continue
                elif self._ended(job_id):
                    # the job ended: one more read, so nothing written before its last transition is missed
                    answer = self.api_server.call(self._event("GET", b"", path, f"after={after}"))
                    if json.loads(str(answer.get("body") or "[]")):
                        continue
                    self.wfile.write(f"event: end\ndata: {json.dumps({'jobId': job_id})}\n\n".encode())
                    self.wfile.flush()
                    return
                elif time.monotonic() - quiet_since > SSE_KEEPALIVE_S:
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                time.sleep(SSE_POLL_S)
                answer = self.api_server.call(self._event("GET", b"", path, f"after={after}"))
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away; it resumes with Last-Event-ID

    def _ended(self, job_id: str) -> bool:
        answer = self.api_server.call(self._event("GET", b"", f"/jobs/{job_id}", ""))
        if answer.get("statusCode") != 200:
            return True
        status = json.loads(str(answer.get("body") or "{}")).get("status")
        return status in {s.value for s in JobState if s.terminal}
