"""`review preflight`: before submitting, is the configured Bedrock model usable from this account?

One tiny call with the stack's model through the adapter the workers use for it (Converse, or InvokeModel
with the Anthropic Messages body: the path is printed; a failure gets the same error code they would record), its latency, what the Bedrock control plane says about the
model id, and the account's requests- and tokens-per-minute quotas for that model as the Service
Quotas API reports them. `run_preflight` takes its clients as arguments (tests stub them with
botocore's Stubber); `preflight` resolves the stack and builds real clients.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError
from botocore.exceptions import ConnectionError as NoConnection

from contract_review.config.constants import (
    LAMBDA_CONCURRENCY_QUOTA_CODE,
    LAMBDA_MIN_UNRESERVED,
    OFFLINE_MODEL_ID,
    ONE_AT_A_TIME_FUNCTIONS,
    POWERTOOLS_LAYER_PARAMETER_PATH,
    POWERTOOLS_LAYER_VERSION,
)
from contract_review.config.prices import PRICES
from contract_review.config.profile import get_profile
from contract_review.config.sdk import SDK_DISTRIBUTIONS, installed_sdk, parse_sdk_description
from contract_review.domain.errors import REGISTRY, ReviewError, classify
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id
from contract_review.model.bedrock import ModelFacts, ModelIdCheck, bedrock_model
from contract_review.model.quotas import QuotaRow, quota_kind, read_batch_quota, read_model_quotas
from contract_review.wiring import bedrock_control_client, bedrock_runtime_client

from .embedded import LOCAL_JSON

PING_READ_TIMEOUT_S = 60


class PreflightError(Exception):
    """A condition preflight cannot check past (no credentials, no such stack...): one line for the user."""


# --- the check --------------------------------------------------------------------------------------------

@dataclass
class PreflightReport:
    model_id: str
    region: str
    api: str = ""  # the bedrock-runtime API the workers call this model through (domain/model.py MODEL_TRAITS)
    ok: bool = False
    latency_ms: float | None = None
    error_code: str | None = None
    message: str = ""
    facts: ModelFacts | None = None
    quota_kind: str = ""  # the Service Quotas family: on-demand | cross-region | global cross-region
    quotas: list[QuotaRow] = field(default_factory=list)
    paced_to: float | None = None  # the stack was deployed with `-c model_tpm` (its ModelTpm output): this wins
    notes: list[str] = field(default_factory=list)

    @property
    def recovery(self) -> str:
        return REGISTRY[self.error_code].recovery if self.error_code in REGISTRY else ""


def run_preflight(model_id: str, region: str, *, runtime: Any, bedrock: Any, quotas: Any,
                  clock: Callable[[], float] = time.monotonic) -> PreflightReport:
    """One tiny call with `model_id` through the API the workers use for it (Converse, or InvokeModel with the
    Anthropic Messages body), what the control plane says about it, and its quotas.
    `runtime`, `bedrock`, `quotas`: boto3 clients for bedrock-runtime, bedrock and service-quotas."""
    report = PreflightReport(model_id=model_id, region=region, quota_kind=quota_kind(model_id))
    check = ModelIdCheck(lambda: bedrock)
    report.facts = check.facts(model_id)  # cached: the adapter's own check below reuses the answer
    if report.facts is None:
        report.notes.append("the Bedrock control plane did not answer GetFoundationModel/GetInferenceProfile "
                            "(permission?): the model's name and lifecycle are unknown")
    started = clock()
    try:
        client = bedrock_model(runtime, model_id, id_check=check)
        report.api = client.API
        response = client.ping()
        report.ok, report.latency_ms = True, (clock() - started) * 1000
        report.message = (f"stop reason {response.stop_reason}, {response.input_tokens} input / "
                          f"{response.output_tokens} output tokens")
    except (NoCredentialsError, NoRegionError, NoConnection):
        raise
    except Exception as exc:  # classified exactly as the workers would classify it
        if isinstance(exc.__cause__, NoConnection):  # the adapter's envelope of "no network": said as such
            raise exc.__cause__ from exc
        report.latency_ms = (clock() - started) * 1000
        report.error_code = classify(exc, model_call=True).error_code
        report.message = _describe_failure(exc)
    report.quotas = _model_quotas(quotas, report)
    return report


def _error(exc: ClientError) -> dict[str, Any]:
    return dict(cast(dict[str, Any], exc.response).get("Error") or {})


def _describe_failure(exc: Exception) -> str:
    if isinstance(exc, ReviewError):
        return exc.envelope.message
    if isinstance(exc, ClientError):
        status = cast(dict[str, Any], exc.response).get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{_error(exc).get('Code')} (HTTP {status}): {_error(exc).get('Message')}"
    return f"{type(exc).__name__}: {exc}"


def _model_quotas(client: Any, report: PreflightReport) -> list[QuotaRow]:
    """The model's quotas as the sweeper reads them for the workers (model/quotas.py): the same names, the same rows."""
    if report.facts is None or not report.facts.display_name:
        report.notes.append("quotas not looked up: the model's name (which Service Quotas names quotas by) is unknown")
        return []
    name = report.facts.display_name
    try:
        found = list(read_model_quotas(client, report.model_id, name).rows)
    except ClientError as exc:
        report.notes.append(f"quotas not readable: Service Quotas answered {_error(exc).get('Code')} "
                            "(needs servicequotas:ListServiceQuotas and ListAWSDefaultServiceQuotas)")
        return []
    except BotoCoreError as exc:
        report.notes.append(f"quotas not readable: {type(exc).__name__}: {exc}")
        return []
    if not any(q.what == "tokens_per_minute" for q in found):
        report.notes.append(f"no {report.quota_kind} tokens-per-minute quota named for {name!r} in Service Quotas "
                            f"({report.region}): the workers will pace to the profile's quota_fallback_tokens_per_minute; deploy with "
                            "`-c model_tpm=N` to set the quota")
    return found


_LABELS = {"tokens_per_minute": "tokens per minute", "requests_per_minute": "requests per minute (not enforced on "
           "bedrock-runtime)", "tokens_per_day": "tokens per day", "account_tokens_per_day": "tokens per day, all "
           "models of the account", "batch_min_records": "minimum records per batch inference job"}


def render(report: PreflightReport) -> list[str]:
    facts = report.facts
    about = f" ({facts.display_name}, lifecycle {facts.lifecycle})" if facts and facts.display_name else ""
    lines = [f"model: {report.model_id}{about}, region {report.region}",
             f"path: the workers call it through {report.api or 'Converse'} on bedrock-runtime"]
    if report.ok:
        lines.append(f"access: ok - {report.api} answered in {report.latency_ms:.0f} ms ({report.message})")
    else:
        lines.append(f"access: FAILED {report.error_code} after {report.latency_ms or 0:.0f} ms - {report.message}")
        if report.error_code != "model.id_rejected":  # that message already says what to do
            lines.append(f"what to do: {report.recovery}")
    if report.quotas:
        lines.append(f"quotas ({report.quota_kind} inference, this account, from Service Quotas):")
        for q in report.quotas:
            adjustable = "adjustable" if q.adjustable else "not adjustable"
            lines.append(f"  {_LABELS[q.what]}: {q.value:,.0f}  [{q.source}, {adjustable}] {q.name} ({q.code})")
    tpm = next((q.value for q in report.quotas if q.what == "tokens_per_minute"), None)
    if report.paced_to is not None:
        lines.append(f"pacing: this stack's workers pace to {report.paced_to:,.0f} tokens per minute (deployed with "
                     "-c model_tpm; `review quota set N` changes it at runtime)")
    elif tpm is not None:
        lines.append(f"pacing: a deployed stack's workers pace to {tpm:,.0f} tokens per minute (this quota; "
                     "`cdk deploy -c model_tpm=N` sets another)")
    else:
        lines.append("pacing: no tokens-per-minute quota found for this model, so the workers will pace to the "
                     "profile's quota_fallback_tokens_per_minute (set one: npx cdk deploy -c profile=prod -c model_tpm=N)")
    lines += [f"note: {n}" for n in report.notes]
    return lines


# --- the account: what a deploy and the running stack assume ----------------------------------------------

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
        code = _error(exc).get("Code")
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
        return Check(name, None, f"GetAccountSettings refused ({_error(exc).get('Code')}; needs "
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


def check_batch(quotas: Any, report: PreflightReport) -> Check:
    """The model's batch quota row (docs/batch-inference.md): its "Minimum number of records per batch inference job"
    quota in Service Quotas (ListFoundationModels does not say: its inferenceTypesSupported knows ON_DEMAND and
    PROVISIONED only), and whether the price table has its batch price. Never a failure: batch mode is optional, a
    quota named otherwise is not proof of absence, and a row is no proof of acceptance (there is no dry run: the first
    refusal turns the batch lane off, pipeline/batch_inference.py)."""
    name = "batch inference"
    base = PRICES.priced_as.get(report.model_id) or base_model_id(report.model_id)
    price = PRICES.models.get(base)
    priced = (f"batch price ${price.batch_input_per_1k}/${price.batch_output_per_1k} per 1,000 input/output tokens "
              f"(as of {PRICES.as_of})" if price is not None and price.batch else "no batch price in the price table")
    if report.facts is None or not report.facts.display_name:
        return Check(name, None, "the model's name (which Service Quotas names quotas by) is unknown")
    try:
        row = read_batch_quota(quotas, report.facts.display_name)
    except ClientError as exc:
        return Check(name, None, f"Service Quotas answered {_error(exc).get('Code')} (needs "
                                 "servicequotas:ListServiceQuotas and ListAWSDefaultServiceQuotas)")
    except BotoCoreError as exc:
        return Check(name, None, f"Service Quotas not readable: {type(exc).__name__}")
    if row is None:
        return Check(name, None, f"no \"Minimum number of records per batch inference job\" quota for "
                                 f"{report.facts.display_name!r} in {report.region}: batch inference is likely not "
                                 f"offered for it here (the first batch job Bedrock refuses turns the batch lane off "
                                 f"and batch-mode jobs then run on demand); {NO_DRY_RUN}; {priced}")
    return Check(name, True, f"quota row in {report.region}: at least {row.value:,.0f} records per job [{row.source}] "
                             f"{row.name} ({row.code}); {NO_DRY_RUN}; {priced}")


# what no check here can tell (docs/batch-inference.md): CreateModelInvocationJob has no dry run
NO_DRY_RUN = ("neither this nor any offline check proves the model or inference profile is accepted by batch (there "
              "is no dry run)")


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
        code = _error(exc).get("Code")
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
            code = _error(exc).get("Code")
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
        return Check(name, None, f"SNS answered {_error(exc).get('Code')} (needs sns:ListSubscriptionsByTopic on "
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
        return Check(name, None, f"Lambda answered {_error(exc).get('Code')} (needs lambda:GetLayerVersion on "
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


_GEOGRAPHY = {"us": "us", "ca": "us", "eu": "eu", "ap": "apac"}  # region prefix -> the geographic profile's prefix


def region_restriction(report: PreflightReport) -> Check | None:
    """A `global.` profile refused with AccessDenied although the control plane answers in this region: what an
    organization SCP restricting regions does (a global profile may route to any commercial region). Named with
    its remedy, a geographic profile that stays in this region's geography. Decided from the error code and the
    profile kind, never from the message (printed as it came)."""
    if report.error_code != "model.access_denied" or not report.model_id.startswith(GLOBAL_PROFILE_PREFIX):
        return None
    geo = _GEOGRAPHY.get(report.region.split("-", 1)[0], "us")
    local = f"{geo}.{base_model_id(report.model_id)}"
    return Check("model region", False, f"AccessDenied on the global profile {report.model_id}: an SCP that restricts "
                                        "regions denies global cross-region inference (the message above says "
                                        f"whether a service control policy denied it); a {geo}. profile stays in "
                                        f"this geography (check it: review --region {report.region} preflight "
                                        f"--model-id {local})",
                 f"npx cdk deploy -c profile=prod -c model_id={local}")


# --- resolving the stack, building clients ----------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    label: str  # what is being checked, for the first line
    model_provider: str
    model_id: str
    model_tpm: float | None = None  # the quota the stack was deployed to pace to (`-c model_tpm`, output ModelTpm)
    # The Lambda concurrency the stack reserves (output ReservedConcurrency); for a stack not deployed yet, what a
    # deploy with the prod defaults reserves (the worker's maximum concurrency, the sweeper's 1, the collector's 1)
    reserved: int = 0
    deployed: bool = False  # a deployed stack on AWS: its reservation is already out of the unreserved pool
    layer_parameter: str = ""  # the SSM parameter the stack's layer ARN comes from ("": the default release's)
    batch_role_arn: str = ""  # the role Bedrock assumes for batch jobs (output BatchRoleArn; "": a stack without it)
    alarm_topic_arn: str = ""  # the topic every alarm notifies (output AlarmTopicArn; "": not a deployed stack)
    worker_kind: str = "lambda"  # the analysis worker (output WorkerKind, or `--worker`): fargate needs its SLRs
    sdk_layer_arn: str = ""  # the functions' SDK layer (output SdkLayerArn; "": none, or not a deployed stack)


def stack_target(session: Any, stack: str, before_deploy: bool = False) -> Target:
    """The deployed stack's model and resources, from its outputs. No such stack: an error, unless `before_deploy`
    (then its first deploy, with the prod defaults: `first_deploy_target`)."""
    try:
        described = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        if _error(exc).get("Code") == "ValidationError" and before_deploy:  # CloudFormation: no such stack
            return first_deploy_target(f"stack {stack} ({session.region_name}; not deployed yet, its first deploy "
                                       "with the prod defaults)")
        if _error(exc).get("Code") == "ValidationError":
            raise PreflightError(f"no stack {stack!r} in region {session.region_name} (check --stack and --region)"
                                 ) from exc
        raise
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    layer = next((p.get("ParameterValue", "") for p in described.get("Parameters", [])
                  if str(p.get("ParameterValue", "")).startswith(POWERTOOLS_LAYER_PARAMETER_PATH)), "")
    reserved = int(outputs.get("ReservedConcurrency") or 0)
    if "ModelId" in outputs:
        tpm = float(outputs["ModelTpm"]) if outputs.get("ModelTpm") else None
        return Target(f"stack {stack} ({session.region_name})", outputs.get("ModelProvider", "bedrock"),
                      outputs["ModelId"], tpm, reserved=reserved, deployed=True, layer_parameter=layer,
                      batch_role_arn=outputs.get("BatchRoleArn", ""), alarm_topic_arn=outputs.get("AlarmTopicArn", ""),
                      worker_kind=outputs.get("WorkerKind", "lambda"), sdk_layer_arn=outputs.get("SdkLayerArn", ""))
    # a stack deployed before the ModelId output existed: its profile's model
    profile = get_profile(outputs.get("ProfileName", "prod"))
    return Target(f"stack {stack} ({session.region_name}; no ModelId output, using profile {profile.name}'s model)",
                  "bedrock", profile.review.model_id, reserved=reserved, deployed=True, layer_parameter=layer)


def local_target(local_json: Path) -> Target:
    if not local_json.exists():
        raise PreflightError(f"{local_json} not found: start the local stack with `review up`, or pass --stack NAME")
    try:
        outputs = json.loads(local_json.read_text())["outputs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PreflightError(f"{local_json} is not a local stack description ({type(exc).__name__}); "
                             "run `review up` again") from exc
    # the account checks are about a deploy with the prod defaults (the local stack reserves nothing on AWS)
    first = first_deploy_target("local stack (review up)")
    return replace(first, model_provider=outputs.get("ModelProvider", "offline"),
                   model_id=outputs.get("ModelId") or first.model_id)


def first_deploy_target(label: str) -> Target:
    """A stack not deployed yet, as a deploy with the prod defaults makes it: the prod model, and the reservations of
    the worker's maximum and 1 each for the sweeper and the batch collector (infra DeploySettings.reserved_concurrency)."""
    prod = get_profile("prod")
    return Target(label, "bedrock", prod.review.model_id,
                  reserved=prod.functions.worker_max_concurrency + len(ONE_AT_A_TIME_FUNCTIONS))


def resolve_target(session: Any, stack: str | None, local_json: Path, before_deploy: bool) -> Target:
    """`--stack NAME`: that stack (before a deploy, it need not exist yet); none: the local stack of `review up`, or
    before a deploy, a first deploy of the default stack."""
    if stack is None and not before_deploy:
        return local_target(local_json)
    _require_credentials(session)
    if stack is None:
        return first_deploy_target(f"a first deploy ({session.region_name}; the prod defaults)")
    return stack_target(session, stack, before_deploy)


def preflight(stack: str | None, region: str | None, model_id: str | None = None, *,
              session_factory: Callable[..., Any] = boto3.Session, local_json: Path = LOCAL_JSON,
              echo: Callable[[str], None] = print, document: dict[str, Any] | None = None,
              worker: str | None = None, before_deploy: bool = False) -> bool:
    """Resolve the stack's model, check it against the real Bedrock, print the report. True: usable.
    `worker` (`--worker`): check the account for that analysis worker instead of the stack's.
    Raises `PreflightError` (one line) when it cannot check at all. With `document`, nothing is printed: the
    report is put in it instead (`review preflight --json`, `as_document`). `before_deploy` (`make deploy`): the
    stack need not exist yet, and a failure the deploy repairs (`Check.redeploy_fixes`) is printed, not counted."""
    if document is not None:
        echo = _silent
    try:
        session = session_factory(region_name=region) if region else session_factory()
        target = resolve_target(session, stack, local_json, before_deploy)
        echo(f"{target.label}: model provider {target.model_provider}")
        if target.model_provider != "bedrock":
            echo(f"  this stack runs the offline rule model ({OFFLINE_MODEL_ID}), a deterministic stand-in, not an "
                 "LLM: its jobs never call Bedrock. Checking the Bedrock model a deployed stack would use instead,")
            echo("  with your AWS credentials (`cdk deploy -c model_id=ID` picks another; --model-id checks one).")
        if worker:  # the worker a deploy will use; a Fargate stack's worker reserves no Lambda concurrency
            undeployed_fargate = worker == "fargate" and not target.deployed
            target = replace(target, worker_kind=worker,
                             reserved=len(ONE_AT_A_TIME_FUNCTIONS) if undeployed_fargate else target.reserved)
        if model_id:  # another model: the stack's quota is not its
            target = replace(target, model_provider="bedrock", model_id=model_id, model_tpm=None)
        if not session.region_name:
            raise PreflightError("no AWS region: pass --region or set AWS_REGION")
        _require_credentials(session)
        report = run_preflight(target.model_id, session.region_name,
                               runtime=bedrock_runtime_client(session, PING_READ_TIMEOUT_S),
                               bedrock=bedrock_control_client(session),
                               quotas=session.client("service-quotas"))
        checks = account_checks(session, target, report)
    except NoCredentialsError as exc:
        raise PreflightError(_NO_CREDENTIALS) from exc
    except NoRegionError as exc:
        raise PreflightError("no AWS region: pass --region or set AWS_REGION") from exc
    except ClientError as exc:
        raise PreflightError(f"AWS refused {exc.operation_name}: {_error(exc).get('Code')}: "
                             f"{_error(exc).get('Message')}") from exc
    except NoConnection as exc:  # nothing answered at all: the network, not the model or the account
        raise PreflightError(
            f"no network: could not connect to {exc.kwargs.get('endpoint_url') or 'AWS'}, so nothing was checked. "
            "Check this machine's network connection (a proxy needs HTTPS_PROXY; inside a VPC without internet, "
            "VPC endpoints for bedrock-runtime, bedrock, service-quotas, ssm and lambda), then run `review "
            "preflight` again") from exc
    except BotoCoreError as exc:
        raise PreflightError(f"AWS: {exc}") from exc
    report.paced_to = target.model_tpm
    restricted = region_restriction(report)
    checks += [restricted] if restricted else []
    ok = report.ok and all(c.ok is not False for c in checks if not (before_deploy and c.redeploy_fixes))
    if document is not None:
        document.update(as_document(target, report, checks, ok))
        return ok
    for line in render(report):
        echo(line)
    echo("account:")
    for check in checks:
        fixed = " (this deploy fixes it)" if before_deploy and check.redeploy_fixes and check.ok is False else ""
        echo(f"  {check.render()}{fixed}")
    return ok


def account_checks(session: Any, target: Target, report: PreflightReport) -> list[Check]:
    """The account's checks: the layer, Lambda concurrency, batch inference; for a deployed stack, its batch service
    role, its alarm topic's subscribers and its functions' SDK layer; for the Fargate worker, its service-linked
    roles."""
    checks = [check_layer(session.client("ssm"), target.layer_parameter or default_layer_parameter(),
                          session.region_name),
              check_concurrency(session.client("lambda"), session.region_name, target.reserved, target.deployed),
              check_batch(session.client("service-quotas"), report)]
    if target.batch_role_arn:  # a deployed stack's (the local one's is not created: moto does not run IAM)
        checks.append(check_batch_role(session.client("iam"), target.batch_role_arn))
    if target.alarm_topic_arn:  # a deployed stack's: do its alarms reach a person?
        checks.append(check_alarm_subscribers(session.client("sns"), target.alarm_topic_arn))
    if target.worker_kind == "fargate":  # the stack's worker, or `--worker fargate`
        checks.append(check_service_linked_roles(session.client("iam")))
    if target.deployed:  # do its functions run the SDK this checkout pins?
        checks.append(check_sdk_layer(session.client("lambda"), target.sdk_layer_arn, installed_sdk()))
    return checks


def _silent(_line: str) -> None:
    return None


def as_document(target: Target, report: PreflightReport, checks: list[Check], ok: bool) -> dict[str, Any]:
    """Every field of the report and of each account check, as one JSON document (`review preflight --json`)."""
    from dataclasses import asdict

    return {"ok": ok, "target": target.label, "model_provider": target.model_provider,
            "offline_stand_in": target.model_provider != "bedrock",
            "model": {**{k: v for k, v in asdict(report).items() if k not in ("facts", "quotas")},
                      "recovery": report.recovery, "facts": asdict(report.facts) if report.facts else None,
                      "quotas": [asdict(q) for q in report.quotas], "lines": render(report)},
            "checks": [{"name": c.name, "ok": c.ok, "line": c.line, "remedy": c.remedy,
                        "redeploy_fixes": c.redeploy_fixes} for c in checks]}


_NO_CREDENTIALS = ("no AWS credentials found: set AWS_PROFILE (then `aws sso login` if it is an SSO profile), "
                   "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run `aws configure`")


def _require_credentials(session: Any) -> None:
    if session.get_credentials() is None:
        raise PreflightError(_NO_CREDENTIALS)
