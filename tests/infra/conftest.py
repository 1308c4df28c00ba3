"""Infra fixtures: ONE synth per pytest session.

One in-process `cdk.App` holds three stacks (local profile, prod profile with an alarm email,
prod + Fargate worker) with the cdk-nag plugin attached, and is synthesized once into a session temp dir.
A synth that succeeds is itself the proof that no cdk-nag finding is unacknowledged (the
plugin makes `app.synth()` raise `ValidationFailed` otherwise).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contract_review.config.settings import ENV

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "functions"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

import infra  # noqa: E402,F401  # before any test module imports aws_cdk: jsii starts package.json's Node (JSII_NODE)
from contract_review.config.profile import Profile, get_profile  # noqa: E402

LOCAL, PROD, FARGATE = "ContractReviewLocal", "ContractReviewProd", "ContractReviewFargate"
# Function variables set only when their option is given (or differs from its default); the batch service role only on
# the collector (and its STACK_TAG), the batch stand-in's URL only locally (test_batch_iam.py)
ONLY_WHEN_GIVEN = {ENV["fault_spec"], ENV["ticket_url"], ENV["model_tpm"], ENV["queue_uploads_prefix"], ENV["stack_tag"],
                   ENV["batch_role_arn"], ENV["batch_endpoint_url"],
                   ENV["invoke_model_id"],  # the worker's only, with the Bedrock provider (infra/inference.py)
                   ENV["model_fallbacks"]}  # with `-c model_fallbacks` only
ALARM_EMAIL = "oncall@example.com"  # `-c alarm_email=...` of the prod stack (the others have none)
# Every stack calls an external ticket system with credentials from a secret (`-c ticket_url`, `-c ticket_secret_arn`),
# given by its name: the roles may read `<name>-??????` in the stack's own account and region, the one secret of that
# name (tests/infra/test_role_coverage.py creates it in the embedded account and records the calls that read it).
TICKET_URL = "https://tickets.example.com/api"
TICKET_SECRET_NAME = "contract-review/ticket-credentials"
# `-c fargate_base_image` of the Fargate stack: a digest's shape (not a real digest: nothing is built from it here)
FARGATE_BASE_IMAGE = "python:3.12-slim@sha256:" + "0" * 64


@dataclass
class Synth:
    outdir: Path
    seconds: float
    templates: dict[str, dict[str, Any]]
    profiles: dict[str, Profile]

    def template_path(self, stack: str) -> Path:
        return self.outdir / f"{stack}.template.json"


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    from infra import nag
    from infra.application import add_stack, new_app
    from infra.deploy_settings import DeploySettings

    outdir = tmp_path_factory.mktemp("cdk.out")
    started = time.monotonic()
    app = new_app(outdir=str(outdir))
    tickets = {"ticket_url": TICKET_URL, "ticket_secret_arn": TICKET_SECRET_NAME}
    settings = {
        LOCAL: DeploySettings(profile=get_profile("local"), stack_name=LOCAL, model_provider="offline", **tickets),
        PROD: DeploySettings(profile=get_profile("prod"), stack_name=PROD, alarm_email=ALARM_EMAIL, **tickets),
        FARGATE: DeploySettings(profile=get_profile("prod"), stack_name=FARGATE, worker_kind="fargate",
                                  fargate_base_image=FARGATE_BASE_IMAGE, **tickets),
    }
    for s in settings.values():
        add_stack(app, s)
    nag.apply(app)
    assembly = app.synth()  # raises on any unacknowledged cdk-nag finding
    templates = {name: assembly.get_stack_by_name(name).template for name in settings}
    return Synth(
        outdir=outdir,
        seconds=time.monotonic() - started,
        templates=json.loads(json.dumps(templates)),  # plain dicts, detached from jsii
        profiles={name: s.profile for name, s in settings.items()},
    )


@pytest.fixture(scope="session")
def local(synth: Synth) -> dict[str, Any]:
    return synth.templates[LOCAL]


@pytest.fixture(scope="session")
def prod(synth: Synth) -> dict[str, Any]:
    return synth.templates[PROD]


@pytest.fixture(scope="session")
def fargate(synth: Synth) -> dict[str, Any]:
    return synth.templates[FARGATE]


# ---------------------------------------------------------------------- template helpers
def resources(template: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == type_}


def props(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    return template["Resources"][logical_id].get("Properties", {})


def getatt_id(value: Any) -> str:
    """Logical id behind {"Fn::GetAtt": [id, attr]} or {"Ref": id}."""
    if "Fn::GetAtt" in value:
        return value["Fn::GetAtt"][0]
    return value["Ref"]


def queues(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: r["Properties"] for k, r in resources(template, "AWS::SQS::Queue").items()}


def source_queues(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Queues with a redrive policy (intake, analysis, results)."""
    return {k: p for k, p in queues(template).items() if "RedrivePolicy" in p}


def function_by_handler(template: dict[str, Any], handler_suffix: str) -> tuple[str, dict[str, Any]]:
    found = [(k, r["Properties"]) for k, r in resources(template, "AWS::Lambda::Function").items()
             if r["Properties"].get("Handler", "").endswith(handler_suffix)]
    assert len(found) == 1, f"expected one function with handler *{handler_suffix}, got {found}"
    return found[0]


def batch_service_role_id(template: dict[str, Any]) -> str:
    """The role Bedrock assumes to run batch inference jobs (infra/batch.py): the one bedrock.amazonaws.com may assume."""
    (found,) = [lid for lid, r in resources(template, "AWS::IAM::Role").items()
                if "bedrock.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    return found


def role_id(template: dict[str, Any], role: str) -> str:
    """The logical id of a role: `fargate` (the task role), `batch` (the batch service role Bedrock assumes) or a
    function's short name (`worker`...)."""
    if role == "batch":
        return batch_service_role_id(template)
    if role == "fargate":
        (task_def,) = resources(template, "AWS::ECS::TaskDefinition").values()
        return getatt_id(task_def["Properties"]["TaskRoleArn"])
    _, fn = function_by_handler(template, f"{role}.handler")
    return getatt_id(fn["Role"])


def policy_statements_for_role(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in resources(template, "AWS::IAM::Policy").values():
        if any(getatt_id(x) == role_id for x in r["Properties"].get("Roles", [])):
            out.extend(r["Properties"]["PolicyDocument"]["Statement"])
    return out


def actions_on(statements: list[dict[str, Any]], logical_id: str) -> set[str]:
    """Actions granted on any resource expression that mentions `logical_id`."""
    acts: set[str] = set()
    for st in statements:
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if any(logical_id in json.dumps(r) for r in res):
            a = st["Action"]
            acts.update([a] if isinstance(a, str) else a)
    return acts
