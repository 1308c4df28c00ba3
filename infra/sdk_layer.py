"""The SDK layer: the boto3/botocore the tests ran with, in every function, ahead of the runtime's own.

Lambda puts the layers' `python/` directory on `sys.path` before the runtime's bundled boto3, so the functions import
the layer's copy (contract_review/config/sdk.py says why the runtime's will not do). Every function gets it beside the
Powertools layer (infra/functions.py). Their order does not matter (and the CDK sorts a function's layers, feature flag
`@aws-cdk/aws-lambda:recognizeLayerVersion`): layers merge into one `/opt`, and the Powertools layer ships no AWS SDK
(Powertools relies on the one the runtime bundles), so no file of this layer is overwritten. The `runtime` line each
function logs at cold start (handlers/__init__.py) shows the versions actually imported. The Fargate image pins the
same versions in its Dockerfile.

The layer is built at synth time with no Docker and no network (CI synthesizes on a clean checkout; CDK's bundling
needs Docker): a zip of the files the venv's installed distributions record (`importlib.metadata`), under `python/`,
dist-info included (so `importlib.metadata` in the function answers the same versions). Every one is pure Python, so
the venv's Python (3.11 here) builds what the functions' 3.12 runs; a compiled file stops the build. The zip is built
once per set of versions into `.review/sdk-layer/` (a temporary name, then renamed: parallel synths never read half
a file) and named to the CDK by those versions (a custom asset hash), so the many synths of a test run neither
rebuild it nor hash its ~20 MB. A zip, not a directory: the CDK copies one file into each cloud assembly, not
~2,300.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from importlib.metadata import distribution
from pathlib import Path

from aws_cdk import AssetHashType
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from contract_review.config.sdk import SDK_DISTRIBUTIONS, installed_sdk, sdk_description

from .functions import ARCHITECTURE, FUNCTIONS_DIR, RUNTIME

CACHE_DIR = FUNCTIONS_DIR.parent / ".review" / "sdk-layer"
LAYOUT = "1"  # bump when the zip's layout changes: a new name, so an old cached zip is not reused
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # every entry's timestamp: the same versions give the same bytes


class SdkLayerError(Exception):
    """The venv's SDK cannot be shipped as a layer as it is (a compiled file in a distribution)."""


def layer_key(versions: dict[str, str]) -> str:
    """The zip's name and the asset's hash: the versions and the layout, nothing else."""
    pins = " ".join(f"{name}=={versions[name]}" for name in SDK_DISTRIBUTIONS)
    return hashlib.sha256(f"{LAYOUT} {RUNTIME.name} {pins}".encode()).hexdigest()[:32]


def layer_files() -> list[tuple[str, Path]]:
    """(path inside the zip, file on disk) of every file the SDK's distributions installed under site-packages."""
    out: list[tuple[str, Path]] = []
    for name in SDK_DISTRIBUTIONS:
        dist = distribution(name)
        for f in dist.files or []:
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith(".pyc"):
                continue  # console scripts outside site-packages, bytecode of this Python
            if rel.endswith((".so", ".pyd")):
                raise SdkLayerError(f"{name} installed a compiled file ({rel}): the layer ships pure Python only")
            out.append((f"python/{rel}", Path(str(dist.locate_file(f)))))
    return sorted(out)


def build_zip(path: Path) -> None:
    """Write the layer's zip to `path` (through a temporary file in the same directory, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, source in layer_files():
                info = zipfile.ZipInfo(arcname, date_time=_FIXED_TIME)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, source.read_bytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def layer_zip(versions: dict[str, str]) -> Path:
    """The cached zip for these versions, built if missing."""
    path = CACHE_DIR / f"sdk-{layer_key(versions)}.zip"
    if not path.exists():
        build_zip(path)
    return path


def sdk_layer(scope: Construct) -> lambda_.LayerVersion:
    """The layer of the venv's SDK, its description naming each version (what `review preflight` reads back)."""
    versions = installed_sdk()
    code = lambda_.Code.from_asset(str(layer_zip(versions)), asset_hash=layer_key(versions),
                                   asset_hash_type=AssetHashType.CUSTOM)
    return lambda_.LayerVersion(scope, "SdkLayer", code=code, compatible_runtimes=[RUNTIME],
                                compatible_architectures=[ARCHITECTURE], description=sdk_description(versions))
