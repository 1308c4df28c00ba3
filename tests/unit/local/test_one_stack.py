"""One `review up` per checkout (review_local/instance.py): a second one refuses in one line, naming the running one,
before it starts anything or touches `.review/local.json`. The real processes: tests/integration/test_local_up.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from review_local import embedded
from review_local.cli import cli
from review_local.instance import AlreadyRunning, UpLock


def test_a_second_review_up_refuses_naming_the_running_ones_urls_and_pid(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    # GIVEN a `review up` running in this checkout (it holds the lock and recorded its URLs), and its local.json
    local_json = tmp_path / ".review" / "local.json"
    monkeypatch.setattr(embedded, "LOCAL_JSON", local_json)
    running = UpLock(local_json).acquire()
    running.record(endpoint="http://127.0.0.1:4566", api="http://127.0.0.1:4567", ui="http://127.0.0.1:4568/")
    local_json.write_text(json.dumps({"endpoint": "http://127.0.0.1:4566"}))
    pid = json.loads((tmp_path / ".review" / "local.json.lock").read_text())["pid"]
    try:
        # WHEN a second one starts
        second = CliRunner().invoke(cli, ["up"])
        # THEN it refuses: exit 1, one line naming the running one's status page, API, endpoint and pid
        assert second.exit_code == 1, second.output
        assert "Traceback" not in second.output
        [line] = second.stderr.strip().splitlines()
        assert line == (f"Error: a local stack is already running in this checkout (pid {pid}; status page "
                        "http://127.0.0.1:4568/, Job API http://127.0.0.1:4567, AWS endpoint http://127.0.0.1:4566): "
                        f"use it, or stop it first (Ctrl-C in its terminal, or `kill {pid}`); one `review up` per "
                        "checkout")
        assert "synthesizing" not in second.output  # nothing started
        # AND the running one's local.json is untouched
        assert json.loads(local_json.read_text()) == {"endpoint": "http://127.0.0.1:4566"}
    finally:
        running.release()
    # AND once it stopped, the checkout is free again
    UpLock(local_json).acquire().release()


def test_a_stack_still_starting_is_named_by_its_pid(tmp_path: Path):
    # GIVEN a `review up` that took the lock and is still deploying (nothing recorded beyond its pid)
    first = UpLock(tmp_path / "local.json").acquire()
    try:
        with pytest.raises(AlreadyRunning, match=r"pid \d+; still starting"):
            UpLock(tmp_path / "local.json").acquire()
    finally:
        first.release()
