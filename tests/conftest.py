"""Shared test configuration.

Cost tiers: tests/unit (no network; one folder per room of functions/contract_review, plus `local` for
review_local and `project` for the repository itself: docs, toolchain, code shape; the in-memory fakes and
scenarios they share stay at tests/unit), tests/integration (moto server + real worker processes),
tests/infra (synthesized template).

`make test` runs two xdist workers with `--dist loadgroup`. Each integration test FILE is its own group, so its
module-scoped fixtures (a stack, a deployed template) stay on one worker while the two workers run two files at
once, each with its own moto server on a free port and its own tmp dirs (the synthesized template is cached on
disk under a lock). No integration test asserts elapsed wall time: a recovery is checked on its records (leases,
claims, events), so two files sharing the cores is safe. The infra tests are one group: one CDK synth per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUAD_DIR = ROOT.parent / "shared" / "data" / "cuad"
SAMPLES_DIR = ROOT / "samples"


# tryfirst: xdist's worker hook, which reads the groups, registers after this file and would otherwise run first
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if "integration" in path.parts:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.xdist_group(f"integration:{path.stem}"))
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
