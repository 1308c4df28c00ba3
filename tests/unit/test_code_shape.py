"""The code's shape, kept by tests: small classes, use cases that never touch AWS clients, records
that are typed everywhere but at the serialization boundary (issue: persistence shape)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "functions" / "contract_review"
USE_CASES = ["intake.py", "worker.py", "aggregator.py", "sweeper.py", "ops.py", "redrive.py", "chunks.py",
             "report.py", "records.py", "ports.py"]
# Where untyped JSON-shaped dicts are allowed: the codecs, the model-provider payloads, the Lambda
# events the handlers receive, and boto3 client keyword arguments.
SERIALIZATION_BOUNDARY = {"adapters/dynamo.py", "adapters/jobs.py", "adapters/claims.py", "adapters/queues.py",
                          "model_clients.py", "analysts.py", "errors.py", "messages.py", "wiring.py",
                          "handlers/aggregator.py", "handlers/intake.py", "handlers/poller.py",
                          "handlers/sweeper.py", "handlers/worker.py"}
MAX_CLASS_LINES = 200


def _modules() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_no_class_is_longer_than_200_lines(path: Path):
    tree = ast.parse(path.read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > MAX_CLASS_LINES]
    assert not long, f"{path.name}: classes over {MAX_CLASS_LINES} lines: {long}"


@pytest.mark.parametrize("name", USE_CASES)
def test_use_cases_import_no_aws_sdk(name: str):
    tree = ast.parse((CORE / name).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert not imported & {"boto3", "botocore"}, f"{name} imports {imported & {'boto3', 'botocore'}}"
    source = (CORE / name).read_text()
    assert ".client(" not in source and "os.environ" not in source


def test_untyped_dicts_stay_at_the_serialization_boundary():
    offenders = [str(p.relative_to(CORE)) for p in _modules()
                 if "dict[str, Any]" in p.read_text() and str(p.relative_to(CORE)) not in SERIALIZATION_BOUNDARY]
    assert not offenders, f"dict[str, Any] outside the serialization boundary: {offenders}"
