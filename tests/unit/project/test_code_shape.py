"""The code's shape, kept by tests. The layers and the import rules (no cycle, adapters and doubles
imported by wiring only, no AWS SDK in the core) are import-linter contracts in pyproject.toml, run by
`make lint` (`lint-imports`) and by the test below: they, not a count of entries, decide where code goes (the
package top has no cap); what import-linter cannot see is checked here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "functions" / "contract_review"
# Where a process meets its environment: only these read os.environ or create boto3 clients.
EDGE = ("handlers/", "wiring.py", "adapters/")
# Where untyped JSON-shaped dicts are allowed: the codecs, the model-provider payloads, the Lambda
# events the handlers receive, and boto3 client keyword arguments.
SERIALIZATION_BOUNDARY = {"adapters/dynamo.py", "adapters/queues.py",
                          "domain/model.py", "model/bedrock.py", "model/quotas.py", "review/analysts.py", "domain/errors.py",
                          "domain/messages.py", "wiring.py", "handlers/aggregator.py", "handlers/intake.py",
                          "handlers/poller.py", "handlers/sweeper.py", "handlers/collector.py", "handlers/worker.py",
                          # batch inference records: a model request / response body in JSONL (docs/batch-inference.md)
                          "domain/batch_inference.py", "adapters/batch_inference.py",
                          # the strict bedrock-runtime stand-in: Converse and Messages bodies as boto3 passes them
                          "doubles/bedrock_runtime.py"}
# And how many there are outside the handlers: the table adapters write `Values` and `TransactItem` (adapters/dynamo.py),
# typed records elsewhere; a new one needs a reason, and this number lowered when one goes
MAX_UNTYPED_DICTS = 35


def _modules() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return str(p.relative_to(CORE))


def test_the_import_contracts_hold():
    """GIVEN the contracts in pyproject.toml WHEN import-linter checks the package THEN every one is kept."""
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "PATH": str(lint.parent)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("path", [p for p in _modules() if not _rel(p).startswith(EDGE)], ids=_rel)
def test_the_core_reads_no_environment_and_builds_no_client(path: Path):
    tree = ast.parse(path.read_text())
    attrs = {(n.value.id, n.attr) for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    assert ("os", "environ") not in attrs and ("os", "getenv") not in attrs, _rel(path)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "client"]
    assert not calls, f"{_rel(path)} creates a client: the adapters and wiring do"


def test_untyped_dicts_stay_at_the_serialization_boundary():
    offenders = [_rel(p) for p in _modules() if "dict[str, Any]" in p.read_text() and _rel(p) not in SERIALIZATION_BOUNDARY]
    assert not offenders, f"dict[str, Any] outside the serialization boundary: {offenders}"


def test_untyped_dicts_outside_the_handlers_stay_few():
    found = [f"{_rel(p)}:{n}" for p in _modules() if not _rel(p).startswith("handlers/")
             for n, line in enumerate(p.read_text().splitlines(), 1) if "dict[str, Any]" in line]
    assert len(found) <= MAX_UNTYPED_DICTS, found
