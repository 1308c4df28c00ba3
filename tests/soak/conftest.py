"""The soak runs only when selected (`make soak`, i.e. `pytest -m soak tests/soak`): a bare `pytest tests`
skips it rather than start a run of several minutes."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("markexpr", "") or ""
    if "soak" in markexpr and "not soak" not in markexpr:
        return
    skip = pytest.mark.skip(reason="the soak runs on its own: `make soak` (pytest -m soak tests/soak)")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
