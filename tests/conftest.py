"""Shared test configuration.

Cost tiers: tests/unit (no network), tests/integration (moto server + real worker processes),
tests/infra (synthesized template). Integration tests share one xdist group so their worker
processes never compete with each other for the 2 cores (timing-based recovery assertions).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUAD_DIR = ROOT.parent / "shared" / "data" / "cuad"
SAMPLES_DIR = ROOT / "samples"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if "integration" in path.parts:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.xdist_group("integration"))
        elif "infra" in path.parts:
            item.add_marker(pytest.mark.infra)
            item.add_marker(pytest.mark.xdist_group("infra"))


def cuad_texts(limit: int | None = None, max_chars: int | None = None) -> list[tuple[str, str]]:
    """(name, text) of the CUAD contracts, smallest first; empty when ../shared is absent."""
    if not CUAD_DIR.is_dir():
        return []
    files = sorted(CUAD_DIR.glob("cuad_*.txt"), key=lambda p: p.stat().st_size)
    out = [(f.name, f.read_text(encoding="utf-8")) for f in files]
    if max_chars:
        out = [o for o in out if len(o[1]) <= max_chars]
    return out[:limit] if limit else out
