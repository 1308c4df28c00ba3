"""Builds the CDK app: context -> `DeploySettings` -> `ContractReviewStack`, with cdk-nag.

Used by the top-level `app.py` and by `tests/infra`. Runs the same way under
`npx cdk synth` (context from the CLI) and under plain `python app.py` (context from
`cdk.json` plus `CDK_CONTEXT_JSON`; output directory from `CDK_OUTDIR`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

import aws_cdk as cdk  # noqa: E402  (after the jsii environment above)

from . import nag  # noqa: E402
from .deploy_settings import DeploySettings  # noqa: E402
from .stack import ContractReviewStack  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CDK_JSON = PROJECT_ROOT / "cdk.json"


def cdk_json_context() -> dict[str, Any]:
    """The `context` block of cdk.json (feature flags). The CLI passes it itself; plain
    `python app.py` does not, so the app adds it as defaults (CLI values still win)."""
    try:
        return dict(json.loads(CDK_JSON.read_text()).get("context", {}))
    except FileNotFoundError:
        return {}


def new_app(context: dict[str, Any] | None = None, outdir: str | None = None) -> cdk.App:
    """`cdk.App` with cdk.json's feature flags; `outdir` defaults to `CDK_OUTDIR` (set by the CLI)."""
    return cdk.App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)


def add_stack(app: cdk.App, settings: DeploySettings) -> ContractReviewStack:
    return ContractReviewStack(app, settings.stack_name, settings=settings)


def create_app(context: dict[str, Any] | None = None, outdir: str | None = None) -> tuple[cdk.App, ContractReviewStack]:
    app = new_app(context, outdir)
    settings = DeploySettings.from_context(app.node.try_get_context)
    settings.require_alarm_destination()
    stack = add_stack(app, settings)
    nag.apply(app)
    return app, stack
