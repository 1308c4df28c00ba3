"""A local stand-in (a fake) for the external ticket system: a third party's HTTP API, not ours.

Besides the model (`OfflineRuleModel`), this is the only thing faked in the local stack. The saga
(`contract_review.sideeffects.saga`) opens a review ticket here when a report has high-risk findings, and
closes it again as a compensation. `review up` runs it on loopback and hands its URL to the
functions (environment `TICKET_URL`); on AWS the URL of the real system is the CDK context value
`ticket_url`.

The contract is Stripe's `Idempotency-Key` (https://docs.stripe.com/api/idempotent_requests):

- `POST /tickets` `{"title", "job_id", ...}` with header `Idempotency-Key: K` creates the ticket once.
  The same key again returns the first answer (status and body), with `Idempotent-Replayed: true`.
  The same key with other parameters: 422 `idempotency_key_reused`. The same key while its first
  request is still being processed: 409 `idempotency_key_in_use`.
- `GET /tickets?idempotency_key=K`: the ticket that key created (200), or 404.
- `GET /tickets`: every ticket (`{"tickets": [...]}`); `GET /tickets/{id}`: one.
- `POST /tickets/{id}/close` `{"comment"}`: closes it; closing a closed ticket answers the same
  closed ticket (idempotent), the first comment kept.
- `/_admin/stats` (GET), `/_admin/faults` (POST a `TicketFaults` JSON), `/_admin/reset` (POST):
  for tests and people; the Python API (`TicketServiceFake.state`, `.faults`) does the same in-process.

Credentials, as a real system checks them: with `require(header, value)` (`review up` requires the bearer
token it puts in the local stack's ticket secret), every `/tickets` request without that header answers 401
`unauthorized`, with another value 403 `forbidden`, and nothing is written. `require` again rotates it.

Injectable failures (`TicketFaults`), scripted (`Fault`: the next N matching requests) or seeded rates:
- `error_before_write`: 503 before anything is written (a retry with the same key is safe);
- `timeout_after_write`: the write happens, then the answer is held for `hang_s` (longer than the
  client's read timeout): the client cannot know whether it happened;
- `drop_after_write`: the write happens, then the connection is closed without an answer;
- `timeout_before_write`: the answer is held for `hang_s` and nothing is written (ambiguous too,
  but a lookup of the key finds nothing);
- `lookup_unavailable`: `GET /tickets?idempotency_key=` answers 503.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal["error_before_write", "timeout_after_write", "drop_after_write", "timeout_before_write",
                    "lookup_unavailable"]
Operation = Literal["create", "close", "lookup", "any"]


class Fault(BaseModel):
    """The next `times` requests of `op` fail with `kind`."""

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    op: Operation = "create"
    times: int = 1


class TicketFaults(BaseModel):
    """What goes wrong: scripted faults first (in order), then seeded rates on writes (create, close)."""

    model_config = ConfigDict(extra="forbid")

    scripted: list[Fault] = Field(default_factory=list)
    error_rate: float = 0.0  # error_before_write on this share of writes
    timeout_after_write_rate: float = 0.0  # timeout_after_write on this share of writes
    hang_s: float = 3.0  # how long a timeout holds the answer (longer than the client's read timeout)
    seed: int = 7

    @classmethod
    def parse(cls, spec: str) -> TicketFaults:
        """`review up --ticket-faults "error=0.1,timeout_after_write=0.05,hang=3,seed=7"`: rates (a share of the
        writes). `KIND=xN` scripts the next N requests instead (creates; lookups for `lookup_unavailable`), KIND
        any of error_before_write, timeout_after_write, drop_after_write, timeout_before_write, lookup_unavailable:
        "timeout_after_write=x1,lookup_unavailable=x4" makes the next ticket's outcome unknown, so its job waits
        in `waiting_approval` (4: the lookups the ticket step makes, `side_effect_attempts`; the faults end there,
        so a reject then closes the ticket)."""
        names = {"error": "error_rate", "timeout_after_write": "timeout_after_write_rate", "hang": "hang_s",
                 "seed": "seed"}
        kinds = ("error_before_write", "timeout_after_write", "drop_after_write", "timeout_before_write",
                 "lookup_unavailable")
        values: dict[str, Any] = {}
        scripted: list[Fault] = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, value = (x.strip() for x in part.partition("="))
            if value.startswith("x") and name in kinds:
                op = "lookup" if name == "lookup_unavailable" else "create"
                scripted.append(Fault.model_validate({"kind": name, "op": op, "times": int(value[1:])}))
                continue
            if name not in names:
                raise ValueError(f"unknown ticket fault {name!r}; known: {', '.join(names)} (rates), "
                                 f"{', '.join(k + '=xN' for k in kinds)} (the next N requests)")
            values[names[name]] = float(value) if name != "seed" else int(value)
        return cls.model_validate({**values, "scripted": scripted})


@dataclass
class StoredAnswer:
    """What a key's first request was answered: replayed for the same key."""

    request_hash: str
    status: int
    body: dict[str, Any]
    ticket_id: str


@dataclass
class TicketState:
    """The fake's memory: tickets, keys, counters. Thread-safe through `lock`."""

    tickets: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, StoredAnswer] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    requests: dict[str, int] = field(default_factory=dict)  # operation -> requests received
    refused: dict[int, int] = field(default_factory=dict)  # 401/403 -> requests refused for their credentials
    faults_injected: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_id(self) -> str:
        return f"TCK-{next(self._ids):05d}"

    def stats(self) -> dict[str, Any]:
        with self.lock:
            tickets = list(self.tickets.values())
            return {"opened": len(tickets), "closed": sum(1 for t in tickets if t["status"] == "closed"),
                    "open": sum(1 for t in tickets if t["status"] == "open"), "requests": dict(self.requests),
                    "refused": dict(self.refused),
                    "faults_injected": dict(self.faults_injected)}


def request_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # BaseHTTPRequestHandler's signature
        pass  # quiet: tests and `review up` print what matters

    # --------------------------------------------------------------------------- plumbing
    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"error": {"type": code, "message": message}})

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _hang(self) -> None:
        self.server.fake.hang(self.server.fake.faults.hang_s)
        self.close_connection = True  # the client gave up long ago: no answer at all

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --------------------------------------------------------------------------- routes
    def _refused(self) -> bool:
        """Answered 401/403 when the request lacks the credential the fake requires (then True)."""
        status = self.server.fake.check(dict(self.headers.items()))
        if status is None:
            return False
        if status == 401:
            self._error(401, "unauthorized", "missing credentials")
        else:
            self._error(403, "forbidden", "these credentials may not use the ticket system")
        return True

    def do_GET(self) -> None:  # noqa: N802  # http.server's naming
        url = urlsplit(self.path)
        fake = self.server.fake
        parts = [p for p in url.path.split("/") if p]
        if parts == ["_admin", "stats"]:
            return self._send(200, fake.state.stats())
        if parts[:1] == ["tickets"] and self._refused():
            return None
        if parts == ["tickets"]:
            key = (parse_qs(url.query).get("idempotency_key") or [""])[0]
            if key:
                fake.count("lookup")
                if fake.take_fault("lookup") == "lookup_unavailable":
                    return self._error(503, "service_unavailable", "lookup failed (injected)")
                ticket = fake.find(key)
                if ticket is None:
                    return self._error(404, "resource_missing", "no ticket was created with this idempotency key")
                return self._send(200, ticket)
            fake.count("list")
            return self._send(200, {"tickets": fake.all()})
        if len(parts) == 2 and parts[0] == "tickets":
            ticket = fake.get(parts[1])
            return self._send(200, ticket) if ticket else self._error(404, "resource_missing", "no such ticket")
        return self._error(404, "not_found", "no such route")

    def do_POST(self) -> None:  # noqa: N802  # http.server's naming
        url = urlsplit(self.path)
        fake = self.server.fake
        parts = [p for p in url.path.split("/") if p]
        body = self._body()
        if body is None:
            return self._error(400, "invalid_request", "the body must be a JSON object")
        if parts == ["_admin", "faults"]:
            fake.set_faults(TicketFaults.model_validate(body))
            return self._send(200, fake.faults.model_dump())
        if parts == ["_admin", "reset"]:
            fake.reset()
            return self._send(200, fake.state.stats())
        if parts[:1] == ["tickets"] and self._refused():
            return None
        if parts == ["tickets"]:
            return self._create(body)
        if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "close":
            return self._close(parts[1], body)
        return self._error(404, "not_found", "no such route")

    def _create(self, body: dict[str, Any]) -> None:
        fake = self.server.fake
        fake.count("create")
        if not isinstance(body.get("title"), str) or not body["title"]:
            return self._error(400, "invalid_request", "title is required")
        key = self.headers.get("Idempotency-Key") or ""
        fault = fake.take_fault("create")
        if fault == "error_before_write":
            return self._error(503, "service_unavailable", "try again later (injected, nothing written)")
        if fault == "timeout_before_write":
            return self._hang()
        status, answer, replayed = fake.create(key, body)
        if fault == "timeout_after_write":
            return self._hang()
        if fault == "drop_after_write":
            return self._drop()
        self._send(status, answer, {"Idempotent-Replayed": "true"} if replayed else None)

    def _close(self, ticket_id: str, body: dict[str, Any]) -> None:
        fake = self.server.fake
        fake.count("close")
        fault = fake.take_fault("close")
        if fault == "error_before_write":
            return self._error(503, "service_unavailable", "try again later (injected, nothing written)")
        if fault == "timeout_before_write":
            return self._hang()
        ticket = fake.close(ticket_id, str(body.get("comment") or ""))
        if ticket is None:
            return self._error(404, "resource_missing", "no such ticket")
        if fault == "timeout_after_write":
            return self._hang()
        if fault == "drop_after_write":
            return self._drop()
        self._send(200, ticket)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: TicketServiceFake

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        super().__init__(address, handler)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        with self.connections_lock:
            self.connections.add(conn)
        return conn, addr

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Stopped: kept-alive connections end too (a stopped system answers nothing)."""
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TicketServiceFake:
    """The fake ticket system: in-memory state, injectable faults, an HTTP server on loopback.

    `with TicketServiceFake() as tickets: tickets.url ...`; `tickets.stats()` counts what happened."""

    def __init__(self, faults: TicketFaults | None = None, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self.state = TicketState()
        self.faults = faults or TicketFaults()
        self._rng = random.Random(self.faults.seed)
        self._scripted: list[Fault] = [f.model_copy() for f in self.faults.scripted]
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._credential: tuple[str, str] | None = None  # (header, value) every /tickets request must carry

    # --------------------------------------------------------------------------- credentials
    def require(self, header: str, value: str) -> None:
        """From now on every /tickets request must carry `header: value` (again: a rotation)."""
        with self.state.lock:
            self._credential = (header, value)

    def require_bearer(self, token: str) -> None:
        self.require("Authorization", f"Bearer {token}")

    def check(self, headers: dict[str, str]) -> int | None:
        """None when the request may go on, else the status it is refused with (401 missing, 403 wrong)."""
        with self.state.lock:
            if self._credential is None:
                return None
            header, value = self._credential
            sent = next((v for k, v in headers.items() if k.lower() == header.lower()), None)
            status = None if sent == value else (401 if sent is None else 403)
            if status is not None:
                self.state.refused[status] = self.state.refused.get(status, 0) + 1
            return status

    # --------------------------------------------------------------------------- lifecycle
    def start(self) -> TicketServiceFake:
        server = _Server((self.host, self.port), _Handler)
        server.fake = self
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                                        name="ticket-service-fake")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # held answers end now
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None

    def __enter__(self) -> TicketServiceFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --------------------------------------------------------------------------- faults
    def set_faults(self, faults: TicketFaults) -> None:
        with self.state.lock:
            self.faults = faults
            self._rng = random.Random(faults.seed)
            self._scripted = [f.model_copy() for f in faults.scripted]

    def inject(self, kind: FaultKind, op: Operation = "create", times: int = 1) -> None:
        """Script the next `times` requests of `op` to fail with `kind`."""
        with self.state.lock:
            self._scripted.append(Fault(kind=kind, op=op, times=times))

    def reset_faults(self) -> None:
        """No more injected failures (scripted or rates)."""
        self.set_faults(TicketFaults(hang_s=self.faults.hang_s))

    def take_fault(self, op: str) -> str | None:
        with self.state.lock:
            for f in self._scripted:
                if f.times > 0 and f.op in (op, "any") and (f.kind == "lookup_unavailable") == (op == "lookup"):
                    f.times -= 1
                    self._scripted = [s for s in self._scripted if s.times > 0]
                    self.state.faults_injected[f.kind] = self.state.faults_injected.get(f.kind, 0) + 1
                    return f.kind
            if op in ("create", "close"):
                roll = self._rng.random()
                kind: str | None = None
                if roll < self.faults.error_rate:
                    kind = "error_before_write"
                elif roll < self.faults.error_rate + self.faults.timeout_after_write_rate:
                    kind = "timeout_after_write"
                if kind:
                    self.state.faults_injected[kind] = self.state.faults_injected.get(kind, 0) + 1
                return kind
            return None

    def hang(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    # --------------------------------------------------------------------------- the ticket system
    def count(self, op: str) -> None:
        with self.state.lock:
            self.state.requests[op] = self.state.requests.get(op, 0) + 1

    def create(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        """(status, answer, replayed). Stripe's rules for a key: replay, reuse (422), in use (409)."""
        h = request_hash(body)
        with self.state.lock:
            if key:
                stored = self.state.keys.get(key)
                if stored is not None:
                    if stored.request_hash != h:
                        return 422, {"error": {"type": "idempotency_key_reused", "message":
                                               "this key was used with other parameters"}}, False
                    return stored.status, stored.body, True
                if key in self.state.in_flight:
                    return 409, {"error": {"type": "idempotency_key_in_use", "message":
                                           "a request with this key is being processed"}}, False
                self.state.in_flight.add(key)
        try:
            with self.state.lock:
                ticket_id = self.state.new_id()
                ticket = {"id": ticket_id, "status": "open", "title": body["title"], "fields": body,
                          "idempotency_key": key or None, "created_at": time.time(), "closed_at": None,
                          "close_comment": None}
                self.state.tickets[ticket_id] = ticket
                if key:
                    self.state.keys[key] = StoredAnswer(h, 201, dict(ticket), ticket_id)
                return 201, dict(ticket), False
        finally:
            with self.state.lock:
                self.state.in_flight.discard(key)

    def close(self, ticket_id: str, comment: str) -> dict[str, Any] | None:
        with self.state.lock:
            ticket = self.state.tickets.get(ticket_id)
            if ticket is None:
                return None
            if ticket["status"] != "closed":
                ticket.update(status="closed", closed_at=time.time(), close_comment=comment)
            return dict(ticket)

    def find(self, key: str) -> dict[str, Any] | None:
        with self.state.lock:
            stored = self.state.keys.get(key)
            return dict(self.state.tickets[stored.ticket_id]) if stored else None

    def get(self, ticket_id: str) -> dict[str, Any] | None:
        with self.state.lock:
            t = self.state.tickets.get(ticket_id)
            return dict(t) if t else None

    def all(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [dict(t) for t in self.state.tickets.values()]

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def reset(self) -> None:
        with self.state.lock:
            self.state.tickets.clear()
            self.state.keys.clear()
            self.state.requests.clear()
            self.state.refused.clear()
            self.state.faults_injected.clear()
            self._scripted = []


def main() -> None:  # pragma: no cover - `python -m review_local.ticket_service [PORT]` for people
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    with TicketServiceFake(port=port) as fake:
        print(f"ticket system (local fake of a third party) on {fake.url}; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    main()
