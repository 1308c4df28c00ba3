"""`review preflight`'s account checks: what a deploy and the running stack assume of the account, each one `Check`
(one line, and when it fails the command that fixes it). The Powertools layer's SSM parameter, Lambda's concurrency;
for a deployed stack its batch service role, its alarm subscribers and its functions' SDK layer; for the Fargate
worker, the service-linked roles. Each takes the boto3 client it reads (tests stub them); `preflight.py` picks the
checks that apply to a target and runs them beside the model's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote

from botocore.exceptions import BotoCoreError, ClientError

from contract_review.config.constants import (
    LAMBDA_CONCURRENCY_QUOTA_CODE,
    LAMBDA_MIN_UNRESERVED,
    ONE_AT_A_TIME_FUNCTIONS,
    POWERTOOLS_LAYER_PARAMETER_PATH,
    POWERTOOLS_LAYER_VERSION,
)
from contract_review.config.sdk import SDK_DISTRIBUTIONS, parse_sdk_description


def error_fields(exc: ClientError) -> dict[str, Any]:
    """The `Error` member of an AWS error response (its Code and Message)."""
    return dict(cast(dict[str, Any], exc.response).get("Error") or {})


@dataclass(frozen=True)
class Check:
    """One account check: one line, and when it fails a command that fixes it. `ok` None: it could not be checked
    (a permission, an API moto or the account does not offer): said, not counted as a failure. `redeploy_fixes`: a
    failure the deploy itself repairs (the deployed stack's own resources), so it does not block one (`review
    preflight --before-deploy`, `make deploy`)."""

    name: str
    ok: bool | None
    line: str
    remedy: str = ""
    redeploy_fixes: bool = False

    def render(self) -> str:
        status = {True: "ok", False: "FAILED", None: "not checked"}[self.ok]
        return f"{self.name}: {status} - {self.line}" + (f"; fix: {self.remedy}" if self.remedy else "")


def default_layer_parameter(version: str = POWERTOOLS_LAYER_VERSION) -> str:
    """The public SSM parameter a deploy reads the Powertools layer ARN from (infra/functions.py)."""
    return f"{POWERTOOLS_LAYER_PARAMETER_PATH}/{version}"


def check_layer(ssm: Any, parameter: str, region: str) -> Check:
    """The Powertools layer's SSM parameter exists in the region: CloudFormation resolves it at deploy time, and a
    missing one fails the whole deploy (GetParameter)."""
    name = "powertools layer"
    try:
        arn = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        return Check(name, True, f"{parameter} exists in {region} ({arn})")
    except ClientError as exc:
        code = error_fields(exc).get("Code")
        if code != "ParameterNotFound":
            return Check(name, None, f"{parameter} not readable ({code}; needs ssm:GetParameter)")
    latest = default_layer_parameter("latest")
    try:
        ssm.get_parameter(Name=latest)
    except ClientError:
        return Check(name, False, f"{parameter} does not exist in {region}, nor {latest}: AWS publishes no Powertools "
                                  "layer there and a deploy would fail; deploy in a region that has it",
                     "review --region us-east-1 preflight")
    return Check(name, False, f"{parameter} does not exist in {region} (this release is not published there yet): a "
                              "deploy would fail on it", "npx cdk deploy -c profile=prod -c powertools_version=latest")


def check_concurrency(lambda_client: Any, region: str, reserved: int, deployed: bool) -> Check:
    """The account's Lambda concurrency (GetAccountSettings) covers the stack's reservations (the worker's maximum,
    and 1 each for the sweeper and the batch collector) plus the 100 that AWS keeps unreserved. A deployed stack's
    reservation is already out of the unreserved pool."""
    name = "lambda concurrency"
    try:
        limits = lambda_client.get_account_settings()["AccountLimit"]
    except ClientError as exc:
        return Check(name, None, f"GetAccountSettings refused ({error_fields(exc).get('Code')}; needs "
                                 "lambda:GetAccountSettings)")
    total, unreserved = int(limits["ConcurrentExecutions"]), int(limits["UnreservedConcurrentExecutions"])
    still = 0 if deployed else reserved  # what a deploy would still take out of the unreserved pool
    facts = (f"account limit {total:,}, unreserved {unreserved:,}; the stack reserves {reserved:,} "
             f"({'already taken' if deployed else 'on deploy'}) and AWS keeps {LAMBDA_MIN_UNRESERVED} unreserved")
    if unreserved - still >= LAMBDA_MIN_UNRESERVED:
        return Check(name, True, facts)
    want = max(1000, total + still + LAMBDA_MIN_UNRESERVED - unreserved)
    return Check(name, False, f"{facts}: needs {still + LAMBDA_MIN_UNRESERVED:,} unreserved (new accounts may start "
                              f"at 10 in all, the default is 1,000; the sweeper and the batch collector always reserve "
                              f"{len(ONE_AT_A_TIME_FUNCTIONS)} in all, one run at a time each; with a little more than "
                              "that, reserve nothing for the worker and shrink the fleet: npx cdk deploy -c "
                              "profile=prod -c worker_reserved_concurrency=0 -c worker_concurrency=2 -c "
                              "intake_max_concurrency=2)",
                 f"aws service-quotas request-service-quota-increase --service-code lambda --quota-code "
                 f"{LAMBDA_CONCURRENCY_QUOTA_CODE} --desired-value {want} --region {region}")


BEDROCK_SERVICE = "bedrock.amazonaws.com"


def check_batch_role(iam: Any, role_arn: str) -> Check:
    """The stack's batch service role (output BatchRoleArn, infra/batch.py) exists and trusts Bedrock: a role removed
    or edited by hand since the deploy makes every batch job fail in validation, hours before anyone looks. One
    GetRole; a caller without iam:GetRole is told it was not checked."""
    name = "batch service role"
    role_name = role_arn.rsplit("/", 1)[-1]
    try:
        role = iam.get_role(RoleName=role_name)["Role"]
    except ClientError as exc:
        code = error_fields(exc).get("Code")
        if code == "NoSuchEntity":
            return Check(name, False, f"{role_arn} does not exist: batch jobs would fail in validation",
                         "npx cdk deploy (the stack creates the role)", redeploy_fixes=True)
        return Check(name, None, f"IAM answered {code} (needs iam:GetRole on {role_arn})")
    except BotoCoreError as exc:
        return Check(name, None, f"IAM not readable: {type(exc).__name__}")
    trust = role.get("AssumeRolePolicyDocument") or {}
    if isinstance(trust, str):  # URL-encoded JSON when not decoded by the SDK
        trust = json.loads(unquote(trust))
    trusted = any(st.get("Effect") == "Allow" and "sts:AssumeRole" in _as_list(st.get("Action"))
                  and BEDROCK_SERVICE in _as_list((st.get("Principal") or {}).get("Service"))
                  for st in _as_list(trust.get("Statement")))
    if not trusted:
        return Check(name, False, f"{role_name} does not let {BEDROCK_SERVICE} assume it: batch jobs would fail",
                     "npx cdk deploy (the stack's trust policy: infra/batch.py)", redeploy_fixes=True)
    return Check(name, True, f"{role_name}: Bedrock may assume it for this account's batch jobs")


# The service-linked roles a Fargate stack (`-c worker=fargate`, infra/fargate.py) needs, with the service principal
# each belongs to: ECS assumes the first to create the cluster and place the tasks, Application Auto Scaling the second
# to scale the service (the template's ScalableTarget names it). Each service creates its role on first use, but on a
# fresh account CloudFormation's CreateCluster can race that creation and fail the whole create ("Unable to assume
# the service linked role"); created once beforehand, they are simply there.
SERVICE_LINKED_ROLES = (
    ("AWSServiceRoleForECS", "ecs.amazonaws.com"),
    ("AWSServiceRoleForApplicationAutoScaling_ECSService", "ecs.application-autoscaling.amazonaws.com"),
)


def create_service_linked_role_command(service: str) -> str:
    return f"aws iam create-service-linked-role --aws-service-name {service}"


def check_service_linked_roles(iam: Any) -> Check:
    """The ECS and Application Auto Scaling service-linked roles exist (SERVICE_LINKED_ROLES): a missing one fails with
    the command that creates it (once per account; all regions share it). One GetRole each; a caller without
    iam:GetRole is told they were not checked."""
    name = "fargate service-linked roles"
    missing: list[tuple[str, str]] = []
    for role, service in SERVICE_LINKED_ROLES:
        try:
            iam.get_role(RoleName=role)
        except ClientError as exc:
            code = error_fields(exc).get("Code")
            if code != "NoSuchEntity":
                return Check(name, None, f"IAM answered {code} (needs iam:GetRole on {role})")
            missing.append((role, service))
        except BotoCoreError as exc:
            return Check(name, None, f"IAM not readable: {type(exc).__name__}")
    if missing:
        return Check(name, False, f"{' and '.join(role for role, _ in missing)} missing: on a fresh account the "
                                  "first create of a Fargate stack can fail on \"Unable to assume the service linked "
                                  "role\" (each is created on first use, which CloudFormation races); create them "
                                  "before deploying (once per account)",
                     " && ".join(create_service_linked_role_command(service) for _, service in missing))
    return Check(name, True, f"{' and '.join(role for role, _ in SERVICE_LINKED_ROLES)} exist")


def check_alarm_subscribers(sns: Any, topic_arn: str) -> Check:
    """The stack's alarm topic (output AlarmTopicArn) has a confirmed subscriber: every alarm notifies that topic
    only, and an email subscription counts once its owner clicked the link AWS sent (until then its ARN reads
    "PendingConfirmation"). One ListSubscriptionsByTopic, paged."""
    name = "alarm subscribers"
    try:
        subs = [s for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic_arn)
                for s in page.get("Subscriptions", [])]
    except ClientError as exc:
        return Check(name, None, f"SNS answered {error_fields(exc).get('Code')} (needs sns:ListSubscriptionsByTopic on "
                                 f"{topic_arn})")
    except BotoCoreError as exc:
        return Check(name, None, f"SNS not readable: {type(exc).__name__}")
    confirmed = [s for s in subs if str(s.get("SubscriptionArn", "")).startswith("arn:")]
    pending = len(subs) - len(confirmed)
    waiting = f"; {pending} waiting for confirmation (the link in the email AWS sent)" if pending else ""
    if confirmed:
        protocols = ", ".join(sorted({str(s.get("Protocol")) for s in confirmed}))
        return Check(name, True, f"{len(confirmed)} confirmed ({protocols}){waiting}")
    return Check(name, False, f"no confirmed subscriber on {topic_arn.rsplit(':', 1)[-1]}{waiting}: the stack's "
                              "alarms reach nobody",
                 f"click the confirmation link, or aws sns subscribe --topic-arn {topic_arn} --protocol email "
                 "--notification-endpoint you@example.com (then confirm it)")


def check_sdk_layer(lambda_client: Any, layer_arn: str, pinned: dict[str, str]) -> Check:
    """The deployed functions' SDK layer (output SdkLayerArn, infra/sdk_layer.py) carries the boto3/botocore this
    checkout pins (`pinned`: the venv's, requirements.txt's): its version's description names them
    (GetLayerVersionByArn). A stack without the output was deployed from a checkout before the layer: its functions
    run the Lambda runtime's own, older SDK. Either way a deploy from this checkout fixes it."""
    name = "sdk layer"
    wanted = " ".join(f"{d}=={pinned[d]}" for d in ("boto3", "botocore"))
    fix = "make deploy (from this checkout)"
    if not layer_arn:
        return Check(name, False, "the stack has no SdkLayerArn output: deployed from a checkout before the SDK layer, "
                                  "its functions run the Lambda runtime's own boto3/botocore (older, not the one the "
                                  f"tests ran with; this checkout pins {wanted})", fix, redeploy_fixes=True)
    try:
        description = str(lambda_client.get_layer_version_by_arn(Arn=layer_arn).get("Description") or "")
    except ClientError as exc:
        return Check(name, None, f"Lambda answered {error_fields(exc).get('Code')} (needs lambda:GetLayerVersion on "
                                 f"{layer_arn})")
    except BotoCoreError as exc:
        return Check(name, None, f"Lambda not readable: {type(exc).__name__}")
    shipped = parse_sdk_description(description)
    if shipped is None:
        return Check(name, False, f"{layer_arn} does not say which SDK it carries ({description!r})", fix,
                     redeploy_fixes=True)
    differ = [d for d in SDK_DISTRIBUTIONS if shipped.get(d) != pinned[d]]
    if differ:
        said = ", ".join(f"{d} {shipped.get(d) or 'none'} (this checkout: {pinned[d]})" for d in differ)
        return Check(name, False, f"the functions run {said}: the stack was deployed from another checkout", fix,
                     redeploy_fixes=True)
    return Check(name, True, f"the functions run {wanted}, as this checkout pins")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]
