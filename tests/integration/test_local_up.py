"""`review up` as a person runs it, a real process: one per checkout (a second refuses, naming the first, and leaves
it in charge of `.review/local.json`), and stopping it (SIGTERM, as Ctrl-C) says what it stops and ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from review_local.instance import UpLock

from ..conftest import ROOT
from .conftest import wait_for

REVIEW = [sys.executable, "-m", "review_local.cli"]


def test_a_second_review_up_refuses_and_stopping_the_first_says_what_it_stops(tmp_path: Path):
    local_json = tmp_path / "local.json"
    env = {**os.environ, "REVIEW_LOCAL_JSON": str(local_json), "PYTHONUNBUFFERED": "1", "COLUMNS": "400",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT)])}
    # GIVEN `review up` running
    first = subprocess.Popen([*REVIEW, "up", "--workers", "1"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(first.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]  # piped
    reader.start()
    try:
        wait_for(lambda: any("Ctrl-C to stop" in x for x in lines) or first.poll() is not None, 600,
                 what="review up to be up")
        assert first.poll() is None, "".join(lines)
        info = json.loads(local_json.read_text())
        assert info["pid"] == first.pid
        # WHEN a second `review up` starts in the same checkout
        second = subprocess.run([*REVIEW, "up"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        # THEN it refuses in one line naming the running one's URLs and pid, and leaves it in charge
        assert second.returncode == 1, second.stdout + second.stderr
        [line] = second.stderr.strip().splitlines()
        assert f"a local stack is already running in this checkout (pid {first.pid};" in line
        assert info["ui"] in line and info["api"] in line and info["endpoint"] in line
        assert json.loads(local_json.read_text()) == info
        listed = subprocess.run([*REVIEW, "jobs", "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        assert listed.returncode == 0, listed.stderr  # the CLI still talks to the first
        # WHEN the first is stopped (SIGTERM; Ctrl-C takes the same path)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=300) == 0, "".join(lines)
    finally:
        if first.poll() is None:
            first.kill()
    reader.join(30)
    out = "".join(lines)
    # THEN it said what it was stopping, then that it stopped, and printed no traceback
    stopping = next(x for x in lines if x.startswith("stopping the local stack"))
    assert stopping.startswith(f"stopping the local stack (pid {first.pid}): the status page, the Job API, ")
    assert "worker processes" in stopping and f"embedded AWS at {info['endpoint']}" in stopping
    assert any(x.startswith("stopped in ") for x in lines[lines.index(stopping):]), out
    assert "Traceback" not in out
    # AND the checkout is free for the next `review up`
    UpLock(local_json).acquire().release()
