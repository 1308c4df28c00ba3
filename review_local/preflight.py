"""`review preflight`: before submitting, is the configured Bedrock model usable from this account?

One tiny call with the stack's model through the adapter the workers use for it (Converse, or InvokeModel
with the Anthropic Messages body: the path is printed; a failure gets the same error code they would record), its latency, what the Bedrock control plane says about the
model id, and the account's requests- and tokens-per-minute quotas for that model as the Service
Quotas API reports them; then the account's checks (preflight_account.py). `run_preflight` takes its clients as
arguments (tests stub them with botocore's Stubber); `preflight` resolves the stack and builds real clients.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError
from botocore.exceptions import ConnectionError as NoConnection

from contract_review.config.catalogue import CORRECTNESS, refused_id, row_for
from contract_review.config.constants import (
    OFFLINE_MODEL_ID,
    ONE_AT_A_TIME_FUNCTIONS,
    POWERTOOLS_LAYER_PARAMETER_PATH,
)
from contract_review.config.prices import PRICES
from contract_review.config.profile import get_profile
from contract_review.config.sdk import installed_sdk
from contract_review.domain.errors import REGISTRY, ReviewError, classify
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id
from contract_review.model.bedrock import ModelFacts, ModelIdCheck, bedrock_model
from contract_review.model.quotas import QuotaRow, quota_kind, read_batch_quota, read_model_quotas
from contract_review.wiring import bedrock_control_client, bedrock_runtime_client

from .embedded import LOCAL_JSON
from .preflight_account import (
    Check,
    check_alarm_subscribers,
    check_batch_role,
    check_concurrency,
    check_layer,
    check_sdk_layer,
    check_service_linked_roles,
    default_layer_parameter,
    error_fields,
)

PING_READ_TIMEOUT_S = 60


class PreflightError(Exception):
    """A condition preflight cannot check past (no credentials, no such stack...): one line for the user."""


# --- the check --------------------------------------------------------------------------------------------

@dataclass
class PreflightReport:
    model_id: str
    region: str
    api: str = ""  # the bedrock-runtime API the workers call this model through (its catalogue row)
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


def _describe_failure(exc: Exception) -> str:
    if isinstance(exc, ReviewError):
        return exc.envelope.message
    if isinstance(exc, ClientError):
        status = cast(dict[str, Any], exc.response).get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error_fields(exc).get('Code')} (HTTP {status}): {error_fields(exc).get('Message')}"
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
        report.notes.append(f"quotas not readable: Service Quotas answered {error_fields(exc).get('Code')} "
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


# --- the model's own checks (its batch quota row, a global profile an SCP refuses); the account's: preflight_account.py

def check_catalogue(model_id: str) -> Check:
    """The model's row in the catalogue (config/catalogue.py): a deploy refuses an id without one; a row whose request
    rules no AWS page confirms is a warning (the strictest known rules are sent: the first calls tell)."""
    name = "model catalogue"
    refused = refused_id(model_id)
    if refused is not None:
        return Check(name, False, refused)
    row = row_for(model_id)
    rules = (f"{row.name}: {row.api}, tool {'forced' if row.forced_tool_choice else 'offered'}, "
             f"{'temperature sent' if row.sampling else 'no sampling parameter'}, output burndown {row.output_burndown}x")
    unsure = [f for f in CORRECTNESS if f in row.unverified]
    if unsure:
        return Check(name, None, f"{rules}; not confirmed on an AWS page: {', '.join(unsure)} (docs/models.md)")
    return Check(name, True, rules)


def fallback_checks(session: Any, model_id: str) -> list[Check]:
    """A model of the fallback chain, checked as the stack's own: its catalogue row, one tiny call the way the workers
    would make it after a switch (they call a fallback by its id), and its batch quota row."""
    catalogue = check_catalogue(model_id)
    catalogue = replace(catalogue, name=f"fallback {model_id}: {catalogue.name}")
    if catalogue.ok is False:
        return [catalogue]
    report = run_preflight(model_id, session.region_name, runtime=bedrock_runtime_client(session, PING_READ_TIMEOUT_S),
                           bedrock=bedrock_control_client(session), quotas=session.client("service-quotas"))
    call = Check(f"fallback {model_id}: invocable", report.ok,
                 f"{report.api} answered in {report.latency_ms:.0f} ms" if report.ok
                 else f"{report.error_code}: {report.message}",
                 remedy="" if report.ok else "enable access to it in the Bedrock console, or drop it from "
                                             "-c model_fallbacks")
    batch = check_batch(session.client("service-quotas"), report)
    return [catalogue, call, replace(batch, name=f"fallback {model_id}: {batch.name}")]


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
        return Check(name, None, f"Service Quotas answered {error_fields(exc).get('Code')} (needs "
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
    model_fallbacks: tuple[str, ...] = ()  # the models a job falls back to (output ModelFallbacks, or --fallbacks)


def stack_target(session: Any, stack: str, before_deploy: bool = False) -> Target:
    """The deployed stack's model and resources, from its outputs. No such stack: an error, unless `before_deploy`
    (then its first deploy, with the prod defaults: `first_deploy_target`)."""
    try:
        described = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        if error_fields(exc).get("Code") == "ValidationError" and before_deploy:  # CloudFormation: no such stack
            return first_deploy_target(f"stack {stack} ({session.region_name}; not deployed yet, its first deploy "
                                       "with the prod defaults)")
        if error_fields(exc).get("Code") == "ValidationError":
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
                      worker_kind=outputs.get("WorkerKind", "lambda"), sdk_layer_arn=outputs.get("SdkLayerArn", ""),
                      model_fallbacks=_chain(outputs.get("ModelFallbacks", "")))
    # a stack deployed before the ModelId output existed: its profile's model
    profile = get_profile(outputs.get("ProfileName", "prod"))
    return Target(f"stack {stack} ({session.region_name}; no ModelId output, using profile {profile.name}'s model)",
                  "bedrock", profile.review.model_id, reserved=reserved, deployed=True, layer_parameter=layer)


def _chain(ids: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in ids.split(",") if m.strip())


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
              worker: str | None = None, before_deploy: bool = False, fallbacks: str | None = None) -> bool:
    """Resolve the stack's model, check it against the real Bedrock, print the report. True: usable.
    `worker` (`--worker`): check the account for that analysis worker instead of the stack's.
    Raises `PreflightError` (one line) when it cannot check at all. With `document`, nothing is printed: the
    report is put in it instead (`review preflight --json`, `as_document`). `before_deploy` (`make deploy`): the
    stack need not exist yet, and a failure the deploy repairs (`Check.redeploy_fixes`) is printed, not counted.
    `fallbacks` (`--fallbacks ID,ID`): the fallback chain to check instead of the stack's (output ModelFallbacks):
    each model is checked as the stack's is (its catalogue row, one tiny call, its batch quota row)."""
    if document is not None:
        echo = _silent
    # the model client's own warning when the control plane does not answer ("cannot ask Bedrock about ...") is said
    # by the report itself, in its words (a note, or the one-line error): not printed a second time before it
    with _quiet(logging.getLogger(bedrock_model.__module__)):
        return _preflight(stack, region, model_id, session_factory, local_json, echo, document, worker, before_deploy,
                          fallbacks)


@contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """`logger` says only errors while inside."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _preflight(stack: str | None, region: str | None, model_id: str | None, session_factory: Callable[..., Any],
               local_json: Path, echo: Callable[[str], None], document: dict[str, Any] | None, worker: str | None,
               before_deploy: bool, fallbacks: str | None) -> bool:
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
        if model_id:  # another model: the stack's quota is not its (nor its fallbacks, unless given)
            target = replace(target, model_provider="bedrock", model_id=model_id, model_tpm=None, model_fallbacks=())
        if fallbacks is not None:
            target = replace(target, model_fallbacks=_chain(fallbacks))
        if not session.region_name:
            raise PreflightError("no AWS region: pass --region or set AWS_REGION")
        _require_credentials(session)
        report = run_preflight(target.model_id, session.region_name,
                               runtime=bedrock_runtime_client(session, PING_READ_TIMEOUT_S),
                               bedrock=bedrock_control_client(session),
                               quotas=session.client("service-quotas"))
        checks = account_checks(session, target, report)
        checks += [c for fallback in target.model_fallbacks for c in fallback_checks(session, fallback)]
    except NoCredentialsError as exc:
        raise PreflightError(_NO_CREDENTIALS) from exc
    except NoRegionError as exc:
        raise PreflightError("no AWS region: pass --region or set AWS_REGION") from exc
    except ClientError as exc:
        raise PreflightError(f"AWS refused {exc.operation_name}: {error_fields(exc).get('Code')}: "
                             f"{error_fields(exc).get('Message')}") from exc
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
    checks.insert(0, check_catalogue(target.model_id))
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
