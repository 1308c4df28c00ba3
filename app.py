#!/usr/bin/env python3
"""CDK entry point for the contract-review stack.

    npx cdk synth -c profile=local                 # cdk.json runs `python3 app.py`
    npx cdk deploy -c profile=prod -c alarm_email=you@example.com [-c worker=fargate] [-c model_provider=bedrock]
    CDK_OUTDIR=cdk.out python app.py               # without the CLI: cdk.App() writes to CDK_OUTDIR
    CDK_OUTDIR=/tmp/out CDK_CONTEXT_JSON='{"profile":"local"}' python app.py

Context: profile (prod | local, default prod), worker (lambda | fargate, default lambda),
model_provider (bedrock | offline; default bedrock, offline for local), stack_name (default
ContractReview), alarm_email (required in prod: an address, or none), powertools_layer_version,
fault_spec (JSON, not prod), auto_delete_objects (local only), fargate_base_image (with worker=fargate: the
image's base pinned by digest). No AWS calls and no account at synth: the stack is environment-agnostic.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
for path in (ROOT, ROOT / "functions"):  # `import infra` and `import contract_review.config.profile`
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from infra.application import create_app  # noqa: E402
from infra.deploy_settings import DeploySettingsError  # noqa: E402


def main() -> None:
    try:
        app, _ = create_app()
    except DeploySettingsError as exc:  # a deploy option that cannot be deployed: one line, not a traceback
        sys.exit(f"app.py: {exc}")
    app.synth()  # raises (non-zero exit) when a cdk-nag finding is not acknowledged


if __name__ == "__main__":
    main()
