"""An HTTP server on 127.0.0.1 in a daemon thread: the lifecycle the local Job API (api_server.py) and the status page
(ui_server.py) share. `stopping` is set before the server shuts down, so long-lived answers (server-sent events)
end instead of holding the shutdown."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Loopback:
    def __init__(self) -> None:
        self.httpd: ThreadingHTTPServer | None = None
        self.stopping = threading.Event()

    def serve(self, handler: type[BaseHTTPRequestHandler], port: int, name: str) -> None:
        """Serve `handler` on `port` (0: a free one) until `close`."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
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
