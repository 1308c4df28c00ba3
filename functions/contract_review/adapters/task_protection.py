"""ECS task scale-in protection, set from inside the container through the ECS agent endpoint.

`PUT $ECS_AGENT_URI/task-protection/v1/state {"ProtectionEnabled": true, "ExpiresInMinutes": N}`
keeps ECS (service auto scaling and deployments) from stopping this task for N minutes; `false`
gives it back. The agent calls `ecs:UpdateTaskProtection` with the task role's credentials and
answers `{"protection": {...}}`, `{"failure": {...}}` or `{"error": {...}}`.

Without `ECS_AGENT_URI` (local runs, tests) every call is a no-op. A failed call is logged and
reported as False, never raised: losing protection only risks a scale-in, which the lease,
the sweeper and the chunk's checkpoints already survive.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)

PATH = "/task-protection/v1/state"
MAX_MINUTES = 2880  # ECS: 1 .. 2,880 minutes (48 h)


class TaskProtection:
    """One task's scale-in protection (the agent endpoint)."""

    def __init__(self, agent_uri: str | None, timeout_s: float = 2.0):
        self.url = f"{agent_uri.rstrip('/')}{PATH}" if agent_uri else None
        self.timeout_s = timeout_s

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def set(self, protected: bool, minutes: int | None = None) -> bool:
        """True when the agent confirmed the new state (always False when there is no agent)."""
        if self.url is None:
            return False
        body: dict[str, bool | int] = {"ProtectionEnabled": protected}
        if protected and minutes is not None:
            body["ExpiresInMinutes"] = max(1, min(MAX_MINUTES, minutes))
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read() or b"{}")
        except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors; bad JSON a ValueError
            log.warning("task protection %s failed: %s", "on" if protected else "off", type(exc).__name__)
            return False
        state = answer.get("protection") if isinstance(answer, dict) else None
        if not isinstance(state, dict) or state.get("ProtectionEnabled") is not protected:
            log.warning("task protection %s refused: %s", "on" if protected else "off",
                        json.dumps(answer)[:500] if isinstance(answer, dict) else type(answer).__name__)
            return False
        return True


class ScaleInGuard:
    """Keeps the task protected while it holds work: `busy()` protects it (refreshing the
    protection at half its lifetime until the work ends), `idle()` gives it back. The poller calls
    `idle()` only when a receive comes back empty, so a steady stream of chunks costs one agent
    call per protection half-life, not two per chunk."""

    def __init__(self, protection: TaskProtection, minutes: int, clock: Callable[[], float] = time.monotonic,
                 refresh_s: float | None = None):
        self.protection, self.minutes, self.clock = protection, minutes, clock
        self.refresh_s = refresh_s if refresh_s is not None else minutes * 30.0  # half the protection
        self.protected_until: float | None = None  # monotonic; None: not protected (as far as we know)
        self._lock = threading.Lock()

    def _renew_if_due(self) -> None:
        with self._lock:
            now = self.clock()
            if self.protected_until is not None and now < self.protected_until - self.minutes * 60 + self.refresh_s:
                return  # renewed less than `refresh_s` ago
            if self.protection.set(True, self.minutes):
                self.protected_until = now + self.minutes * 60
            else:
                self.protected_until = None

    def busy(self) -> _Busy:
        return _Busy(self)

    def idle(self) -> None:
        with self._lock:
            if self.protected_until is None:
                return
            self.protected_until = None
            self.protection.set(False)


class _Busy:
    """Context manager of `ScaleInGuard.busy()`: protect now, re-protect every half-life until exit."""

    def __init__(self, guard: ScaleInGuard):
        self.guard = guard
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ScaleInGuard:
        self.guard._renew_if_due()
        if self.guard.protection.enabled:
            self._thread = threading.Thread(target=self._refresh, daemon=True, name="scale-in-protection")
            self._thread.start()
        return self.guard

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _refresh(self) -> None:
        while not self._done.wait(self.guard.refresh_s):
            self.guard._renew_if_due()
