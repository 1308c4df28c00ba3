"""ECS task scale-in protection (adapters/task_protection.py) against a fake ECS agent on loopback,
and the poller's SIGTERM deadline (handlers/poller.Shutdown). No AWS: the agent is a local HTTP
server that answers like the real one."""

from __future__ import annotations

import pytest

from contract_review.adapters.task_protection import ScaleInGuard, TaskProtection
from contract_review.handlers.poller import NO_DEADLINE_MS, Shutdown

from ...fake_ecs_agent import FakeEcsAgent


@pytest.fixture
def agent() -> FakeEcsAgent:
    with FakeEcsAgent() as a:
        yield a


def test_protect_and_release_put_the_documented_body(agent: FakeEcsAgent) -> None:
    p = TaskProtection(agent.uri)
    # WHEN the task is protected for 30 minutes, then released
    assert p.set(True, 30) is True
    assert agent.protected
    assert p.set(False) is True
    # THEN two PUTs to the state path, with exactly the agent's parameters
    assert [path for _, path, _ in agent.requests] == ["PUT /task-protection/v1/state"] * 2
    assert agent.bodies == [{"ProtectionEnabled": True, "ExpiresInMinutes": 30}, {"ProtectionEnabled": False}]
    assert not agent.protected


def test_minutes_are_clamped_to_what_ecs_accepts(agent: FakeEcsAgent) -> None:
    p = TaskProtection(agent.uri)
    p.set(True, 0)
    p.set(True, 10_000)
    assert [b["ExpiresInMinutes"] for b in agent.bodies] == [1, 2880]


@pytest.mark.parametrize("answer", ["failure", "error", 500])
def test_a_refusal_is_reported_not_raised(agent: FakeEcsAgent, answer: str | int) -> None:
    agent.answer = answer
    assert TaskProtection(agent.uri).set(True, 5) is False
    assert len(agent.requests) == 1


def test_an_unreachable_agent_is_reported_not_raised() -> None:
    with FakeEcsAgent() as gone:
        uri = gone.uri
    assert TaskProtection(uri, timeout_s=0.2).set(True, 5) is False


def test_without_an_agent_uri_everything_is_a_no_op() -> None:
    p = TaskProtection(None)
    assert not p.enabled and p.set(True, 5) is False
    guard = ScaleInGuard(p, 5)
    with guard.busy():
        pass
    guard.idle()
    assert guard.protected_until is None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_guard_protects_once_per_half_life_and_releases_only_when_idle(agent: FakeEcsAgent) -> None:
    clock = Clock()
    guard = ScaleInGuard(TaskProtection(agent.uri), minutes=10, clock=clock)
    # GIVEN three chunks in a row, the second and third within the first half-life
    for _ in range(3):
        with guard.busy():
            clock.t += 60
    # THEN one PUT protected the task for all three; nothing was released between chunks
    assert agent.bodies == [{"ProtectionEnabled": True, "ExpiresInMinutes": 10}]
    # WHEN half the protection has passed, the next chunk renews it
    clock.t += 5 * 60
    with guard.busy():
        pass
    assert len(agent.bodies) == 2 and agent.bodies[-1]["ProtectionEnabled"] is True
    # WHEN a receive comes back empty, the protection is given back, once
    guard.idle()
    guard.idle()
    assert agent.bodies[-1] == {"ProtectionEnabled": False} and len(agent.bodies) == 3


def test_a_long_chunk_keeps_its_protection_renewed(agent: FakeEcsAgent) -> None:
    guard = ScaleInGuard(TaskProtection(agent.uri), minutes=1, refresh_s=0.05)
    with guard.busy():
        import time

        time.sleep(0.4)  # a chunk "longer" than the refresh interval
    renewals = [b for b in agent.bodies if b["ProtectionEnabled"]]
    assert len(renewals) >= 3, agent.bodies  # the first PUT plus refreshes while busy
    assert not any(b["ProtectionEnabled"] is False for b in agent.bodies)  # never released while busy


def test_a_failed_protection_is_retried_on_the_next_chunk(agent: FakeEcsAgent) -> None:
    agent.answer = "failure"
    guard = ScaleInGuard(TaskProtection(agent.uri), minutes=10, clock=Clock())
    with guard.busy():
        pass
    assert guard.protected_until is None
    agent.answer = None
    with guard.busy():
        pass
    assert guard.protected_until is not None and len(agent.bodies) == 2


def test_shutdown_gives_the_chunk_in_hand_the_stop_timeout() -> None:
    clock = Clock()
    stop = Shutdown(grace_s=120, clock=clock)
    # GIVEN no SIGTERM: the worker sees no deadline
    assert not stop.is_set() and stop.remaining_ms() == NO_DEADLINE_MS
    # WHEN SIGTERM arrives (twice: ECS may repeat it), the deadline is the first one's + 120 s
    stop.request()
    clock.t += 30
    stop.request()
    assert stop.is_set() and stop.remaining_ms() == 90_000
    clock.t += 200
    assert stop.remaining_ms() == 0
