"""One `review up` per checkout: the first holds an exclusive lock on a file beside `.review/local.json` for as long
as it runs (the operating system lets go when the process ends, however it ends), and records in it its pid and,
once up, its URLs. A second `review up` that cannot take the lock refuses, naming the running one, instead of taking
over `.review/local.json` (the CLI would then talk to the second, and call the first "not running" once the second
stopped)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any


class AlreadyRunning(Exception):
    """Another `review up` holds this checkout; the message names it (pid, URLs) and what to do, in one line."""


def lock_path(local_json: Path) -> Path:
    return local_json.with_name(local_json.name + ".lock")


class UpLock:
    """`acquire()` or AlreadyRunning; `record(**urls)` once up; `release()` when stopped."""

    def __init__(self, local_json: Path):
        self.path = lock_path(local_json)
        self._file: IO[str] | None = None

    def acquire(self) -> UpLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held open while the stack runs)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _parse(f.read())
            f.close()
            raise AlreadyRunning(_running_line(holder, self.path)) from None
        self._file = f
        self.record()
        return self

    def record(self, **fields: Any) -> None:
        """Write this process's pid (and `fields`: the running stack's URLs) into the lock file."""
        assert self._file is not None, "not acquired"
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), **fields}))
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _running_line(holder: dict[str, Any], path: Path) -> str:
    pid = holder.get("pid")
    where = ", ".join(f"{name} {holder[key]}" for key, name in (("ui", "status page"), ("api", "Job API"),
                                                                ("endpoint", "AWS endpoint")) if holder.get(key))
    who = f"pid {pid}" if pid else f"the process holding {path}"
    return (f"a local stack is already running in this checkout ({who}"
            + (f"; {where}" if where else "; still starting") + "): use it, or stop it first "
            f"(Ctrl-C in its terminal{f', or `kill {pid}`' if pid else ''}); one `review up` per checkout")
