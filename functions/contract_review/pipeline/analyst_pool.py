"""Bounded concurrency for one chunk's analysts (used by `worker.AnalystRunner`).

Each analyst runs in its own thread, at most `limit` at once, each still checkpointed and fenced by
the runner. How an error in one analyst stops the others:
- a hard stop (the job is being cancelled, or the lease is lost): no model call starts any more in
  any analyst of the chunk (`check`, called before every call through `Retrier.check`); the calls
  already in flight finish and are dropped;
- any other error (tier-1 gave up, out of time, an AWS error): no analyst *starts* any more, and
  the ones under way finish and checkpoint (their work is not redone on the next attempt).
The first hard stop, else the first error, is raised once every analyst has stopped.
With `limit` 1 the analysts run one by one in the caller's thread, exactly as before.

`GroupCommit` commits the outputs of analysts that finish together with one write.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from contract_review.domain.errors import LeaseLost
from contract_review.domain.lifecycle import JobCancelled

T = TypeVar("T")
R = TypeVar("R")
HARD_STOPS: tuple[type[BaseException], ...] = (JobCancelled, LeaseLost)


class StopAnalysts(Exception):
    """Internal: another analyst of the chunk hit a hard stop; this one starts no model call."""


class AnalystPool(Generic[T, R]):
    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._hard = threading.Event()  # no model call starts any more
        self._soft = threading.Event()  # no analyst starts any more
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def check(self) -> None:
        """Before every model call: raises when another analyst of the chunk hit a hard stop."""
        if self._hard.is_set():
            raise StopAnalysts()

    def run(self, items: Sequence[T], fn: Callable[[T], R]) -> list[R | None]:
        """`fn(item)` for every item, at most `limit` at once; results in the items' order (None where
        the item never ran or stopped). Raises the chunk's first hard stop, else its first error."""
        if self.limit == 1 or len(items) <= 1:
            return [fn(item) for item in items]  # one by one: the first error propagates at once
        with ThreadPoolExecutor(max_workers=min(self.limit, len(items)), thread_name_prefix="analyst") as pool:
            # each in a copy of the caller's context: its log fields and trace segment (tracing.py)
            futures = [pool.submit(contextvars.copy_context().run, self._one, fn, item) for item in items]
        results = [f.result() for f in futures]
        if self._errors:
            hard = [e for e in self._errors if isinstance(e, HARD_STOPS)]
            cancelled = [e for e in hard if isinstance(e, JobCancelled)]
            raise (cancelled or hard or self._errors)[0]
        return results

    def _one(self, fn: Callable[[T], R], item: T) -> R | None:
        if self._soft.is_set():
            return None
        try:
            return fn(item)
        except StopAnalysts:
            return None
        except BaseException as exc:  # kept, and raised by `run` once every analyst has stopped
            with self._lock:
                self._errors.append(exc)
            self._soft.set()
            if isinstance(exc, HARD_STOPS):
                self._hard.set()
            return None


@dataclass
class _Entry(Generic[T, R]):
    item: T
    done: bool = False
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """A database's group commit, by flat combining: a thread that commits while another thread's write
    is under way waits for it, then writes everything that arrived meanwhile in one go (`write(batch)`).
    Every caller returns only once its own item was written, with that write's result, or raises that
    write's error: batching saves writes and costs nothing in safety. One thread alone writes each item
    by itself, at once."""

    def __init__(self, write: Callable[[list[T]], R]):
        self._write = write
        self._pending: list[_Entry[T, R]] = []
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()

    def commit(self, item: T) -> R:
        entry: _Entry[T, R] = _Entry(item)
        with self._pending_lock:
            self._pending.append(entry)
        with self._write_lock:
            if not entry.done:  # nobody wrote it meanwhile: write it, with whatever else is waiting
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                try:
                    result = self._write([e.item for e in batch])
                except BaseException as exc:
                    for e in batch:
                        e.error, e.done = exc, True
                else:
                    for e in batch:
                        e.result, e.done = result, True
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]  # set with done


class WarmUp:
    """A chunk's first model call runs alone when its prefix will be cached: the other analysts' calls wait until
    it has written the prefix, then read it (eleven misses at once would each pay the cache-write price, 1.25 x
    input, instead of one write and ten reads at 0.1 x).

    The leader's step (with its tier-1 retries) ends in one of two ways: it succeeded, and everyone goes on; or it
    failed, and the next caller leads instead (ten calls at once into a quota that just throttled would all miss).
    Waiting is a condition wait, not a poll (no read per tick); a waiter that wakes runs `after_wait` (the stop
    conditions and the time left, which may have changed meanwhile) before its call. A waiter never waits longer
    than `max_wait_s` (the leader's calls are bounded by their timeouts; this bounds a stuck one too). No one waits
    for a call with no cache point (a prefix under the model's minimum)."""

    def __init__(self, active: bool, max_wait_s: float = 300.0):
        self._active = active
        self._max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._leading = False
        self._done = False

    def enter(self, cached: bool, after_wait: Callable[[], None]) -> bool:
        """Before an analyst's step (`cached`: its call sends a cache point). True: this step leads (call `leave`
        after it); False: go ahead (after waiting for the leader if there is one, and `after_wait`)."""
        waited = False
        with self._cond:
            if not self._active or not cached:
                return False
            deadline = time.monotonic() + self._max_wait_s
            while not self._done and self._leading:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                waited = True
                self._cond.wait(left)
            if not self._done and not self._leading:
                self._leading = True
                return True
        if waited:
            after_wait()
        return False

    def leave(self, succeeded: bool) -> None:
        with self._cond:
            self._leading = False
            self._done = self._done or succeeded
            self._cond.notify_all()
