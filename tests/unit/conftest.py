"""Fixtures the unit tests of every room share (the in-memory fakes themselves: fakes.py, scenarios.py).

`world` is a fresh in-memory world (`FakeWorld`) per test; a module or test marked
`@pytest.mark.small_chunks(**profile)` gets `small_chunk_world(**profile)` instead (every clause of TEXT is a
chunk). What a module wires onto the world (handlers reading it, the CLI's stack built on it) is a fixture of that
module, named for what it wires, that takes `world`."""

from __future__ import annotations

import pytest

from .fakes import FakeWorld
from .scenarios import small_chunk_world


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "small_chunks(**profile): the `world` fixture is small_chunk_world(**profile)")


@pytest.fixture
def world(request: pytest.FixtureRequest) -> FakeWorld:
    small = request.node.get_closest_marker("small_chunks")
    return small_chunk_world(**small.kwargs) if small is not None else FakeWorld()
