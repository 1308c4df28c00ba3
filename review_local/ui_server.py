"""The status page: one HTML page (`review_local/ui_page.html`, plain HTML and vanilla JS, no build step) and the
small JSON and server-sent-events endpoints it reads, on loopback only.

`review up` serves it next to the Job API (`ui` in .review/local.json); `review ui` serves it against the local
stack or, with `--stack NAME`, a deployed one with the user's own AWS credentials (no new public endpoint). By
default it is an operator's view (every job, the dead letters); `principal` makes it act as one API principal
(its jobs only, as the Job API shows them: another principal's job is `404 api.not_found`).

Every read and action is a core function the CLI and the Job API already use, reached through `operate`:
`job_view.job_status` and `api.job_events` (with `narration.event_label`), `job_view.job_view` (cost, budget, the six
answers), `lifecycle.request_cancel`, `actions.decide` / `actions.retry`, `dead_letters.dlq_list` / `dlq_redrive` /
`dlq_discard`, the one `submission.submit` (as the operator, or as a principal: as `POST /jobs`), `actions` for the
analysts and findings of the grid, and `activity.chunk_activity` / `activity.activity` for the chart of model calls,
throttles and quota use (from the chunk records), and `model_control.quota_show` for the model's runtime control
beside it (a pause, a quota set, the batch lanes turned off: one read of the control table).

What it computes it takes from `operate` too, the same for the CLI and the Job API: the one progress number
(`job_view.chunk_counts`, `job_view.settled_chunks`), a failed job's remedy (`job_view.remedy`, `no_report`), the grid
folded above `actions.GRID_FOLD` chunks (`actions.grid`), the findings by risk with their titles (`actions.by_risk`),
the report as written (`actions.report_text`), a dead letter's reason (`dead_letters.dlq_reason`) and body
(`dlq_show`), and the activity chart's axes and caption (`activity.axes`, `activity.caption`).

Loopback is not enough against a web page the user visits (it can POST to 127.0.0.1): the server answers only
requests whose Host is its own loopback address (DNS rebinding), and acts only on POSTs carrying
`X-Review-UI: 1`, a header a cross-site form cannot send and a cross-site script cannot send without a CORS
preflight, which this server never grants.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from contract_review.domain import lifecycle
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import REGISTRY
from contract_review.domain.ports import Deps
from contract_review.domain.principals import Caller
from contract_review.domain.records import ChunkStatus, Job, JobState, Priority
from contract_review.operate import actions, activity, api, dead_letters, job_view, model_control
from contract_review.operate.submission import Refused, SubmitRequest, submit

from .loopback import Loopback

PAGE = Path(__file__).with_name("ui_page.html")
LIVE_POLL_S = 0.5  # how often the live stream reads the job again
KEEPALIVE_S = 15.0
REFRESH_S = 5.0  # the live stream reads the whole detail again at least this often (a chunk claimed has no event)
MAX_JOBS = 500  # the jobs list shows the newest this many
ACTIVITY_REFRESH_S = 10.0  # the activity chart reads a changing job's chunk records at most this often
ACTION_HEADER = "X-Review-UI"


class UiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        assert code in REGISTRY, code
        self.status, self.code, self.message = status, code, message


@dataclass
class UiServer:
    """`start()` serves the page on 127.0.0.1 (a free port unless given); `url`. `principal`: act as this API
    principal (an ARN), else an operator's view of every job."""

    deps: Deps
    principal: str | None = None
    port: int = 0
    by: str = "ui"  # who the audit events name for an operator's action
    loop: Loopback = field(default_factory=Loopback)  # the server on 127.0.0.1 (loopback.py)
    _findings: dict[str, list[actions.Finding]] = field(default_factory=dict)  # findings_key -> findings (immutable)
    # job id -> (the job item's updated_at when read, when read (monotonic), its settled chunks' activity): a settle
    # changes the job item; an open job's chunk records are read again at most every ACTIVITY_REFRESH_S
    _activity: dict[str, tuple[float, float, list[activity.ChunkActivity]]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.loop.address + "/"

    def start(self) -> UiServer:
        server = self

        class Handler(_Handler):
            ui = server

        self.loop.serve(Handler, self.port, "ui-server")
        return self

    def stop(self) -> None:
        self.loop.close()

    def __enter__(self) -> UiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ reads
    @property
    def caller(self) -> Caller | None:
        return Caller(self.principal) if self.principal else None

    def mode(self) -> dict[str, Any]:
        return {"operator": self.principal is None, "principal": self.principal}

    def _job(self, job_id: str) -> Job:
        """The job, if this view may see it (a principal: its own only, as the Job API decides); else 404."""
        caller = self.caller
        if caller is not None:
            try:
                found = api.owned_job(self.deps, caller, job_id)
            except api.ApiError as exc:
                raise UiError(exc.status, exc.code, exc.message) from exc
            if isinstance(found, Job):
                return found
            raise UiError(409, "api.conflict", "intake has not taken the job in yet: try again in a few seconds")
        job = self.deps.jobs.get(job_id)
        if job is None:
            raise UiError(404, "api.not_found", f"no job {job_id}")
        return job

    def jobs(self, state: str = "", q: str = "") -> list[dict[str, Any]]:
        caller = self.caller
        rows: list[dict[str, Any]] = []
        for j in self.deps.jobs.all():
            if caller is not None and not caller.owns(j.principal):
                continue
            if state and j.state.value != state:
                continue
            if q and q.lower() not in j.job_id.lower() and q.lower() not in (j.document_id or "").lower():
                continue
            steps = job_view.progress_of(j, None)  # the one progress number, as GET /jobs/{id} counts it
            rows.append({"jobId": j.job_id, "status": j.state.value, "documentId": j.document_id,
                         "chunks": j.chunk_count, "settled": steps.current_step, "total": steps.total_steps,
                         "error": j.error_code,
                         "createdAt": job_view.api_time(j.created_at), "created": j.created_at})
        rows.sort(key=lambda r: r["created"], reverse=True)
        return rows[:MAX_JOBS]

    def findings(self, chunks: list[ChunkRecord]) -> list[dict[str, Any]]:
        """The settled chunks' findings, highest risk first with their category titles (`actions.by_risk`; each
        findings object read once: it never changes)."""
        done = [c for c in sorted(chunks, key=lambda c: c.chunk_index)
                if c.status is ChunkStatus.DONE and c.findings_key]
        new = [c for c in done if c.findings_key not in self._findings]
        if new:
            for c, found in zip(new, _per_chunk(self.deps, new), strict=True):
                self._findings[str(c.findings_key)] = found
        return [f.model_dump(mode="json")
                for f in actions.by_risk([f for c in done for f in self._findings[str(c.findings_key)]])]

    def detail(self, job_id: str) -> dict[str, Any]:
        """The job pane: the Job API's view of the job (`job`), its progress as `review status` prints it (the one
        number, `job_view.settled_chunks`), the grid (folded above `actions.GRID_FOLD` chunks), its findings by risk,
        its cost, links to its report, and for a job that ended without completing what to do (`remedy`)."""
        job = self._job(job_id)
        chunks = self.deps.claims.for_job(job_id) if job.chunk_count else []
        view = job_view.job_view(self.deps, job_id)
        status = job_view.job_status(self.deps, job)
        budget = view.budget_micro_usd if view is not None else None
        base = f"/api/jobs/{job_id}/report"
        return {"job": status, "mode": self.mode(), "grid": actions.grid(job, chunks).model_dump(mode="json", by_alias=True, exclude_none=True),
                "findings": self.findings(chunks),
                "progress": job_view.chunk_counts(view) if view is not None else "",
                # its model; when it ran on more than one (it fell back), each and the models of each analyst's answers
                "model": job_view.model_words(view) if view is not None else job.model_id,
                "cost": {"line": view.cost if view is not None else "",
                         "microUsd": view.usage.total_micro_usd if view is not None else 0, "budgetMicroUsd": budget},
                "answers": view.answers.model_dump(mode="json") if view is not None else {},
                "remedy": job_view.remedy(view) if view is not None else None,
                "report": {"markdown": f"{base}?format=md" if job.report_md_key else None,
                           "json": f"{base}?format=json"} if job.report_json_key else None,
                "noReport": None if job.report_json_key else job_view.no_report(job),
                "canCancel": not job.terminal and job.state is not JobState.CANCELLING,
                "canRetry": actions.can_retry(job), "terminal": job.terminal}

    def report(self, job_id: str, fmt: str) -> tuple[str, bytes]:
        """The job's report as written (`md`, the default, or `json`), read with the page's own credentials: one
        click from the job pane, no presigned URL. 409 `api.conflict` with `job_view.no_report` while it has none."""
        if fmt not in ("md", "json"):
            raise UiError(400, "api.invalid_request", f"format {fmt!r}: give md or json")
        job = self._job(job_id)
        text = actions.report_text(self.deps, job, fmt)
        if text is None:
            raise UiError(409, "api.conflict", job_view.no_report(job))
        return ("application/json" if fmt == "json" else "text/plain; charset=utf-8"), text.encode()

    def events(self, job_id: str, after: int) -> list[Any]:
        self._job(job_id)
        return api.job_events(self.deps, job_id, after, api.MAX_EVENTS_LIMIT)

    def dlq(self) -> list[dict[str, Any]]:
        if self.principal is not None:
            raise UiError(404, "api.not_found", "the dead letters are an operator's view: run `review ui` without --as")
        rows = []
        for i in dead_letters.dlq_list(self.deps):  # each with its time and its reason (a code and a message)
            code, message = dead_letters.dlq_reason(i)
            rows.append({**i.model_dump(mode="json", exclude={"body"}), "at": job_view.api_time(i.sent_at),
                         "reason": {"code": code, "message": message}})
        return rows

    def dlq_body(self, message_id: str) -> dict[str, Any]:
        """One dead letter's message body as it was sent (`review dlq show ID --body`): the operator's to see."""
        self.dlq()  # an operator's only
        entry = dead_letters.dlq_show(self.deps, message_id, with_body=True)
        if entry is None:
            raise UiError(404, "api.not_found", f"no DLQ message {message_id}: someone else redrove or discarded it")
        return {"messageId": entry.message_id, "queue": entry.queue, "body": entry.body}

    def activity(self, now: float | None = None) -> dict[str, Any]:
        """Model calls, throttles and quota use over time, over the jobs this view shows that were open within the
        chart's window (each job's chunk records read again only when its item changed)."""
        now = self.deps.clock() if now is None else now
        caller, points = self.caller, []
        for j in self.deps.jobs.all():
            if caller is not None and not caller.owns(j.principal):
                continue
            if j.terminal and (j.ended_at or j.updated_at) < now - activity.ACTIVITY_WINDOW_S:
                continue
            cached = self._activity.get(j.job_id)
            if cached is None or (cached[0] != j.updated_at and time.monotonic() - cached[1] >= ACTIVITY_REFRESH_S):
                chunks = self.deps.claims.for_job(j.job_id) if j.chunk_count else []
                cached = (j.updated_at, time.monotonic(),
                          activity.chunk_activity(j, chunks, self.deps.settings.effective_model_id))
                self._activity[j.job_id] = cached
            points += cached[2]
        view = activity.activity(points, now, activity.paced_tokens_per_minute(self.deps))
        return {**view.model_dump(mode="json"), "axes": activity.axes(view), "caption": activity.caption(view),
                "control": self.control()}

    def control(self) -> dict[str, Any] | None:
        """The model's runtime control as `review quota show` says it (an operator's view only; None for a principal or
        a stack without the control table): paused, the quota set, and each model whose batch lane is off, why."""
        if self.principal is not None or self.deps.model_control is None:
            return None
        c = model_control.quota_show(self.deps)
        return {"paused": c.paused, "tokensPerMinute": c.tokens_per_minute, "by": c.by,
                "at": job_view.api_time(c.at) if c.at else None, "hold": model_control.model_hold(self.deps),
                "batchOff": [{"model": m, "errorCode": off.error_code, "reason": off.reason, "at": job_view.api_time(off.at),
                              "by": off.by} for m, off in sorted(c.batch_off.items())]}

    # ------------------------------------------------------------------ actions
    def act(self, job_id: str, action: str) -> dict[str, Any]:
        self._job(job_id)
        by = self.principal or self.by
        if action == "cancel":
            c = lifecycle.request_cancel(self.deps, job_id, by=by)
            ok = c.changed or c.state in (JobState.CANCELLING, JobState.CANCELLED)
            return _outcome(ok, c.state, c.message)
        if action in ("approve", "reject"):
            d = actions.decide(self.deps, job_id, action, by=by)
            return _outcome(d.changed, d.state, d.message)
        if action == "retry":
            r = actions.retry(self.deps, job_id)
            return _outcome(r.retried, r.state, r.action)
        raise UiError(404, "api.not_found", f"no action {action}")

    def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        text, document_id = body.get("text"), body.get("documentId") or None
        if not isinstance(text, str) or not text.strip():
            raise UiError(400, "input.invalid", "the document is empty: paste a contract's text")
        caller = self.caller  # the operator's job is an interactive queue sender's; a principal's, the Job API's
        options = {"document_id": document_id} | ({"priority": Priority.INTERACTIVE} if caller is not None else {})
        try:  # the one submit, as `review submit` (the operator) and POST /jobs (a principal) call it
            done = submit(self.deps, caller, SubmitRequest.inline(text, **options))
        except Refused as exc:
            answer = api.refusal(exc)
            raise UiError(answer.status, answer.code, answer.message) from exc
        return {"jobId": done.job_id}

    def dlq_redrive(self, message_id: str, force: bool = False) -> dict[str, Any]:
        """`review dlq redrive ID [--force]`; a letter skipped (a permanent input error) answers `canForce`: the
        page then offers **Redrive anyway** (`force`)."""
        self.dlq()  # an operator's only
        done = dead_letters.dlq_redrive(self.deps, {message_id}, force=force)
        if not done:
            raise UiError(404, "api.not_found", f"no DLQ message {message_id}")
        return {"ok": not done[0].skipped, "message": done[0].action, "canForce": done[0].skipped}


    def dlq_discard(self, message_id: str) -> dict[str, Any]:
        """`review dlq discard ID --yes`: the same core, the same refusal (no such letter: 404 `api.not_found`)."""
        self.dlq()  # an operator's only
        gone = dead_letters.dlq_discard(self.deps, message_id, by=self.by)
        if gone is None:
            raise UiError(404, "api.not_found", f"no DLQ message {message_id}: someone else redrove or discarded it")
        about = f"{gone.queue} DLQ" + (f", job {gone.job_id}" if gone.job_id else "")
        return {"ok": True, "message": f"discarded {message_id} ({about})"
                + (f"; recorded as dlq.discarded on {gone.job_id}" if gone.job_id else "")}


def _per_chunk(deps: Deps, chunks: list[ChunkRecord]) -> list[list[actions.Finding]]:
    found = actions.chunk_findings(deps, chunks)
    out: list[list[actions.Finding]] = [[] for _ in chunks]
    index = {c.chunk_id: n for n, c in enumerate(chunks)}
    for f in found:
        out[index[f.chunk_id]].append(f)
    return out


def _outcome(ok: bool, state: JobState | None, message: str) -> dict[str, Any]:
    if state is None:
        raise UiError(404, "api.not_found", message)
    if not ok:
        raise UiError(409, "api.conflict", message)
    return {"ok": True, "status": state.value, "message": message}


class _Handler(BaseHTTPRequestHandler):
    ui: UiServer
    protocol_version = "HTTP/1.1"
    server_version = "review-ui/1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's signature)
        pass

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; "
                                                    "script-src 'unsafe-inline'; frame-ancestors 'none'")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, body: object) -> None:
        self._send(status, "application/json", json.dumps(body).encode())

    def _error(self, e: UiError) -> None:
        self._json(e.status, {"error": {"code": e.code, "message": e.message}})

    def _host_ok(self) -> bool:
        port = urlsplit(self.ui.url).port
        return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self._dispatch(self._get)

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self._dispatch(self._post)

    def _dispatch(self, route: Callable[[list[str], dict[str, str]], None]) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        try:
            if not self._host_ok():
                raise UiError(403, "api.invalid_request", "the status page answers on its loopback address only")
            route(parts, dict(parse_qsl(url.query)))
        except UiError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            return  # the page went away

    def _get(self, parts: list[str], params: dict[str, str]) -> None:
        ui = self.ui
        if not parts:
            self._send(200, "text/html; charset=utf-8", PAGE.read_bytes())
        elif parts == ["api", "jobs"]:
            self._json(200, {"mode": ui.mode(), "jobs": ui.jobs(params.get("state", ""), params.get("q", ""))})
        elif parts == ["api", "dlq"]:
            self._json(200, ui.dlq())
        elif parts == ["api", "activity"]:
            self._json(200, ui.activity())
        elif len(parts) == 3 and parts[:2] == ["api", "jobs"]:
            self._json(200, ui.detail(parts[2]))
        elif len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "report":
            self._send(200, *ui.report(parts[2], params.get("format", "md")))
        elif len(parts) == 4 and parts[:2] == ["api", "dlq"] and parts[3] == "body":
            self._json(200, ui.dlq_body(parts[2]))
        elif len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "events":
            after = params.get("after", "0")
            self._json(200, ui.events(parts[2], int(after) if after.isdigit() else 0))
        elif len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "live":
            self._live(parts[2], int(self.headers.get("Last-Event-ID") or 0))
        else:
            raise UiError(404, "api.not_found", f"no page {self.path}")

    def _post(self, parts: list[str], params: dict[str, str]) -> None:
        if self.headers.get(ACTION_HEADER) != "1":
            raise UiError(403, "api.invalid_request", f"actions need the {ACTION_HEADER} header the page sends")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ui = self.ui
        if parts == ["api", "submit"]:
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as exc:
                raise UiError(400, "api.invalid_request", "the body is not JSON") from exc
            self._json(202, ui.submit(body if isinstance(body, dict) else {}))
        elif len(parts) == 4 and parts[:2] == ["api", "jobs"]:
            self._json(202, ui.act(parts[2], parts[3]))
        elif len(parts) == 4 and parts[:2] == ["api", "dlq"] and parts[3] == "redrive":
            self._json(202, ui.dlq_redrive(parts[2], force=params.get("force") == "1"))
        elif len(parts) == 4 and parts[:2] == ["api", "dlq"] and parts[3] == "discard":
            self._json(202, ui.dlq_discard(parts[2]))
        else:
            raise UiError(404, "api.not_found", f"no action {self.path}")

    def _live(self, job_id: str, after: int) -> None:
        """Server-sent events: `job` (the detail, whenever it changed) and `events` (the new events), until the
        job has ended and both were sent; then `end`."""
        ui = self.ui
        detail = ui.detail(job_id)  # 404 before the stream starts
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        last, quiet, seen = "", time.monotonic(), ui.deps.jobs.get(job_id)
        refreshed = time.monotonic()
        while not ui.loop.stopping.is_set():
            sent = False
            events = ui.events(job_id, after)
            if events:
                after = int(events[-1]["seq"])
                self.wfile.write(f"id: {after}\nevent: events\ndata: {json.dumps(events)}\n\n".encode())
                sent = True
            text = json.dumps(detail)
            if text != last:
                self.wfile.write(f"event: job\ndata: {text}\n\n".encode())
                last, sent = text, True
            if sent:
                self.wfile.flush()
                quiet = time.monotonic()
            elif detail["terminal"] and len(events) < api.MAX_EVENTS_LIMIT:
                self.wfile.write(b"event: end\ndata: {}\n\n")
                self.wfile.flush()
                return
            elif time.monotonic() - quiet > KEEPALIVE_S:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                quiet = time.monotonic()
            if not sent:
                time.sleep(LIVE_POLL_S)
            # the whole detail (every chunk record, every event) is read again only when the job's item changed or
            # events came (a checkpoint, a settled chunk, a transition), and at least every REFRESH_S
            job = ui.deps.jobs.get(job_id)
            if events or job != seen or time.monotonic() - refreshed > REFRESH_S:
                detail, seen, refreshed = ui.detail(job_id), job, time.monotonic()
