"""The local Job API's and status page's servers on loopback (review_local/loopback.py): a client that goes away in the
middle of a request is none of `review up`'s business: nothing is printed on its terminal, and the server goes on."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from urllib.parse import urlsplit

import pytest

from review_local.api_server import ApiServer
from review_local.ui_server import UiServer

from ..fakes import FakeWorld


def reset_mid_request(url: str) -> None:
    """Send half a request, then close with a reset (SO_LINGER 0): what a closed tab or a killed curl does."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=10) as s:
        s.sendall(b"GET /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def handled(server: ApiServer | UiServer, n: int) -> None:
    """Wait (a wait, not a bound: up to 30 s) until the server has handled `n` disconnects (each in its own thread)."""
    pause = threading.Event()
    for _ in range(600):
        if server.loop.disconnects >= n:
            return
        pause.wait(0.05)
    raise AssertionError(f"{server.loop.disconnects} of {n} disconnects handled")


@pytest.mark.parametrize("server", [ApiServer, UiServer], ids=["job-api", "status-page"])
def test_a_client_that_disconnects_mid_request_prints_no_traceback_and_the_server_goes_on(
        server: type[ApiServer] | type[UiServer], capfd: pytest.CaptureFixture[str]):
    with server(FakeWorld().deps) as running:
        # WHEN a client resets its connection before its request is complete, three times
        for _ in range(3):
            reset_mid_request(running.url)
        # THEN each is counted as a disconnect, and nothing is printed: no ConnectionResetError traceback
        handled(running, 3)
        out, err = capfd.readouterr()
        assert "Traceback" not in err + out and "ConnectionResetError" not in err + out, err
        # AND the server still answers
        parts = urlsplit(running.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        conn.request("GET", "/")
        assert conn.getresponse().status < 500  # an answer (the API: 404 for "/")
        conn.close()
