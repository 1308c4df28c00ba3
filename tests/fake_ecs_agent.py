"""A fake ECS container agent on loopback: the task scale-in protection endpoint
(`PUT/GET $ECS_AGENT_URI/task-protection/v1/state`), answering like the agent does and recording
every request body, so tests can see what a poller asked for and when."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/test-cluster/0123456789abcdef0"


class FakeEcsAgent:
    """`uri` is what ECS puts in ECS_AGENT_URI. `answer` overrides the next answers: "failure" (the
    agent's TASK_NOT_VALID failure shape), "error" (AccessDenied) or an HTTP status code."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, str, dict[str, Any]]] = []  # (monotonic time, method+path, body)
        self.protected = False
        self.answer: str | int | None = None
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._reply(200, agent._state())

            def do_PUT(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                agent.requests.append((time.monotonic(), f"PUT {self.path}", body))
                if self.path != "/task-protection/v1/state":
                    self._reply(404, {"error": {"Code": "NotFound"}})
                elif isinstance(agent.answer, int):
                    self._reply(agent.answer, {})
                elif agent.answer == "failure":
                    self._reply(200, {"failure": {"Arn": TASK_ARN, "Detail": None, "Reason": "TASK_NOT_VALID"}})
                elif agent.answer == "error":
                    self._reply(200, {"requestID": "r-1", "error": {"Arn": TASK_ARN, "Code": "AccessDeniedException",
                                                                    "Message": "not authorized"}})
                else:
                    agent.protected = bool(body.get("ProtectionEnabled"))
                    self._reply(200, agent._state())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True, name="fake-ecs-agent")

    def _state(self) -> dict[str, Any]:
        return {"protection": {"ExpirationDate": "2030-01-01T00:00:00Z" if self.protected else None,
                               "ProtectionEnabled": self.protected, "TaskArn": TASK_ARN}}

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, _, body in self.requests]

    def __enter__(self) -> FakeEcsAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
