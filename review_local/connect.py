"""Find a stack (the local one from .review/local.json, or a deployed one by name) and build the
`Deps` the operator commands take. Every way this fails for a user (no local stack, a stale
local.json, no credentials or region, an unknown stack) becomes one clear line: `StackUnavailable`
here, `describe_aws_error` for AWS errors raised later by any command."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
)

from contract_review.config.settings import Settings
from contract_review.domain.ports import Deps
from contract_review.wiring import build_deps

from .embedded import FAKE_CREDENTIALS, load_local_json

_CREDENTIALS_REJECTED = {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException",
                         "SignatureDoesNotMatch", "InvalidAccessKeyId", "RequestExpired"}
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}
NO_CREDENTIALS = ("no AWS credentials for --stack: set AWS_PROFILE (after `aws configure` or `aws sso login`) "
                  "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
NO_REGION = "no AWS region for --stack: pass --region REGION or set AWS_REGION"


class StackUnavailable(Exception):
    """The stack cannot be reached or found; the message says why and what to do, in one line."""


def local_session(region: str) -> boto3.Session:
    return boto3.Session(aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                         aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"], region_name=region)


def local_deps(outputs: dict[str, str], region: str, endpoint: str, profile: str = "local") -> Deps:
    return build_deps(Settings.from_outputs(outputs, profile), local_session(region), endpoint)


def not_running(endpoint: str) -> str:
    return (f"the local stack at {endpoint} is not running: start it with `review up` (its .review/local.json "
            "is left from an earlier run)")


def endpoint_up(endpoint: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections at the endpoint (a stopped `review up` leaves none)."""
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=timeout_s):
            return True
    except OSError:
        return False


def connect(stack: str | None = None, region: str | None = None, profile: str | None = None) -> Deps:
    if stack is None:
        try:
            info = load_local_json()
        except FileNotFoundError as exc:
            raise StackUnavailable(str(exc)) from exc
        if not endpoint_up(info["endpoint"]):
            raise StackUnavailable(not_running(info["endpoint"]))
        return local_deps(info["outputs"], info["region"], info["endpoint"], profile or info.get("profile", "local"))
    try:
        session = boto3.Session(region_name=region)
        cfn = session.client("cloudformation")
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationError":  # CloudFormation: no such stack
            raise StackUnavailable(f"no stack {stack!r} in {cfn.meta.region_name}: check --stack and --region "
                                   "(`aws cloudformation list-stacks`)") from exc
        raise StackUnavailable(describe_aws_error(exc)) from exc
    except BotoCoreError as exc:
        raise StackUnavailable(describe_aws_error(exc)) from exc
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    return build_deps(Settings.from_outputs(outputs, profile or "prod"), session)


def describe_aws_error(exc: BaseException, local_endpoint: str | None = None) -> str:
    """One line for an AWS error a command ran into, from the exception's type and error code."""
    if isinstance(exc, EndpointConnectionError):
        if local_endpoint:
            return not_running(local_endpoint)
        return f"cannot reach {exc.kwargs.get('endpoint_url', 'AWS')}: check --region and your network"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return NO_CREDENTIALS
    if isinstance(exc, NoRegionError):
        return NO_REGION
    if isinstance(exc, ProfileNotFound):
        return f"AWS profile {exc.kwargs.get('profile')!r} not found: check AWS_PROFILE (`aws configure list-profiles`)"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        operation = exc.operation_name
        if code in _CREDENTIALS_REJECTED:
            return f"AWS rejected the credentials ({code} in {operation}): refresh them (`aws sso login`?)"
        if code in _DENIED:
            return f"AWS denied {operation} ({code}): these credentials lack the permission"
        return f"AWS error {code} in {operation}: {exc.response.get('Error', {}).get('Message', '')}"
    return f"AWS: {exc}"
