"""An HTTP server on 127.0.0.1 in a daemon thread: the lifecycle the local Job API (api_server.py) and the status page
(ui_server.py) share. `stopping` is set before the server shuts down, so long-lived answers (server-sent events)
end instead of holding the shutdown. A client that goes away mid-request (a closed tab, a curl stopped with Ctrl-C)
is counted, not printed: the stdlib would print its `ConnectionResetError` as a traceback on `review up`'s terminal."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    disconnects = 0  # requests whose client went away before the answer was written

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted: the client's doing
            self.disconnects += 1
            return
        super().handle_error(request, client_address)  # anything else is ours: printed with its traceback


class Loopback:
    def __init__(self) -> None:
        self.httpd: _Server | None = None
        self.stopping = threading.Event()

    @property
    def disconnects(self) -> int:
        """Requests whose client went away before they were answered (not printed)."""
        return self.httpd.disconnects if self.httpd is not None else 0

    def serve(self, handler: type[BaseHTTPRequestHandler], port: int, name: str) -> None:
        """Serve `handler` on `port` (0: a free one) until `close`."""
        self.httpd = _Server(("127.0.0.1", port), handler)
        threading.Thread(target=self.httpd.serve_forever, name=name, daemon=True).start()

    @property
    def address(self) -> str:
        """`http://127.0.0.1:PORT`."""
        assert self.httpd is not None, "not started"
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.stopping.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
