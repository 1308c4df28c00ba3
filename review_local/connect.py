"""Find a stack (the local one from .review/local.json, or a deployed one by name) and build the
`Deps` the operator commands take."""

from __future__ import annotations

import boto3

from contract_review.config import Settings
from contract_review.ports import Deps
from contract_review.wiring import build_deps

from .embedded import FAKE_CREDENTIALS, LOCAL_JSON, load_local_json


def local_session(region: str) -> boto3.Session:
    return boto3.Session(aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                         aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"], region_name=region)


def local_deps(outputs: dict[str, str], region: str, endpoint: str, profile: str = "local") -> Deps:
    return build_deps(Settings.from_outputs(outputs, profile), local_session(region), endpoint)


def connect(stack: str | None = None, region: str | None = None, profile: str | None = None) -> Deps:
    if stack is None:
        info = load_local_json(LOCAL_JSON)
        return local_deps(info["outputs"], info["region"], info["endpoint"], profile or info.get("profile", "local"))
    session = boto3.Session(region_name=region)
    cfn = session.client("cloudformation")
    outputs = {o["OutputKey"]: o["OutputValue"]
               for o in cfn.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])}
    return build_deps(Settings.from_outputs(outputs, profile or "prod"), session)
