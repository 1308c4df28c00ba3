"""The functions' SDK layer (infra/sdk_layer.py): the boto3/botocore requirements.txt pins, ahead of the runtime's.

Read from the session's synthesized assembly: the layer the functions list first, its description (what `review
preflight` reads back), and the zip the cloud assembly would upload: its botocore is the pinned one, importable from
`python/` (the directory Lambda puts on sys.path before the runtime's own boto3).
"""

from __future__ import annotations

import json
import re
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from contract_review.config.sdk import SDK_DISTRIBUTIONS, installed_sdk, parse_sdk_description, sdk_description
from infra import sdk_layer

from .conftest import PROD, Synth, resources
from .test_template import function_by_handler

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


def pins() -> dict[str, str]:
    lines = REQUIREMENTS.read_text().splitlines()
    return {line.split("==")[0]: line.split("==")[1].split()[0] for line in lines if "==" in line}


def test_the_venv_runs_the_pinned_sdk() -> None:
    installed = installed_sdk()
    assert installed["boto3"] == pins()["boto3"] and installed["botocore"] == pins()["botocore"]


def test_the_shipped_distributions_are_boto3s_requirements_closed() -> None:
    """Every distribution boto3 needs (extras left out) is in the layer: none comes from the runtime's older copy."""
    needed, todo = set(), ["boto3"]
    while todo:
        name = todo.pop()
        needed.add(name)
        for line in requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo += [req.name] if req.name not in needed else []
    assert needed == set(SDK_DISTRIBUTIONS)


def test_every_function_has_the_sdk_layer_and_powertools(synth: Synth) -> None:
    for name, t in synth.templates.items():
        (layer_id,) = resources(t, "AWS::Lambda::LayerVersion")
        ours = [fn["Properties"] for fn in resources(t, "AWS::Lambda::Function").values()
                if fn["Properties"].get("Handler", "").startswith("contract_review.handlers.")]
        assert len(ours) == 6  # intake, worker, aggregator, sweeper, collector, api
        for fn in ours:
            assert len(fn["Layers"]) == 2 and {"Ref": layer_id} in fn["Layers"], name
        assert t["Outputs"]["SdkLayerArn"]["Value"] == {"Ref": layer_id}


def test_the_layer_carries_the_pinned_sdk_and_says_so(synth: Synth) -> None:
    t = synth.templates[PROD]
    ((layer_id, layer),) = resources(t, "AWS::Lambda::LayerVersion").items()
    p = layer["Properties"]
    assert (p["CompatibleRuntimes"], p["CompatibleArchitectures"]) == (["python3.12"], ["arm64"])
    assert len(p["Description"]) <= 256  # Lambda's limit
    assert parse_sdk_description(p["Description"]) == installed_sdk()
    assert installed_sdk()["botocore"] == pins()["botocore"]
    manifest = json.loads((synth.outdir / f"{PROD}.assets.json").read_text())
    asset = manifest["files"][p["Content"]["S3Key"].removesuffix(".zip")]["source"]
    assert asset["packaging"] == "file" and asset["path"].endswith(".zip")  # one file uploaded as it is
    with zipfile.ZipFile(synth.outdir / asset["path"]) as zf:
        names = set(zf.namelist())
        init = zf.read("python/botocore/__init__.py").decode()
    assert re.search(rf"^__version__ = '{re.escape(pins()['botocore'])}'$", init, re.M)
    assert {"python/boto3/__init__.py", "python/dateutil/parser/__init__.py", "python/six.py"} <= names
    assert f"python/boto3-{pins()['boto3']}.dist-info/METADATA" in names  # importlib.metadata answers the same
    assert not any(n.endswith((".pyc", ".so")) or not n.startswith("python/") for n in names)
    _, worker = function_by_handler(t, "worker.handler")
    assert {"Ref": layer_id} in worker["Layers"]


def test_the_zip_is_built_once_per_set_of_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second synth reuses the cached zip (no rebuild); other versions get another name."""
    monkeypatch.setattr(sdk_layer, "CACHE_DIR", tmp_path)
    built: list[Path] = []

    def build(path: Path) -> None:
        built.append(path)
        path.write_bytes(b"zip")

    monkeypatch.setattr(sdk_layer, "build_zip", build)
    versions = installed_sdk()
    first = sdk_layer.layer_zip(versions)
    assert sdk_layer.layer_zip(versions) == first and built == [first]
    other = sdk_layer.layer_zip({**versions, "botocore": "0.0.1"})
    assert other != first and built == [first, other]


def test_the_description_round_trips() -> None:
    versions = installed_sdk()
    assert parse_sdk_description(sdk_description(versions)) == versions
    assert parse_sdk_description("some other layer") is None
