"""`review preflight`: one tiny Converse call, what the control plane says about the model id, and the
account's requests/tokens-per-minute quotas, against botocore Stubbers for bedrock-runtime, bedrock,
service-quotas and cloudformation; the account checks (the Powertools layer parameter, Lambda concurrency, a
region-restricted global profile) against moto where it implements the call (SSM GetParameter) and Stubbers where
it does not (Lambda GetAccountSettings, Bedrock, Service Quotas); and every error the command can hit is one line,
never a traceback."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from click.testing import CliRunner

from contract_review.config.profile import get_profile
from contract_review.config.sdk import installed_sdk, sdk_description
from contract_review.model.bedrock import ModelFacts
from contract_review.model.quotas import match_model_quotas
from review_local.cli import cli
from review_local.preflight import (
    PreflightError,
    PreflightReport,
    check_batch,
    local_target,
    preflight,
    region_restriction,
    render,
    run_preflight,
)
from review_local.preflight_account import check_concurrency, check_layer

from .. import bedrock_stubs as bs

SONNET_46 = "Anthropic Claude Sonnet 4.6"
LAYER = "/aws/service/powertools/python/arm64/python3.12/3.37.0"  # what a deploy with the defaults reads
LAYER_ARN = "arn:aws:lambda:us-east-1:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-arm64:30"
SDK_LAYER_ARN = "arn:aws:lambda:us-east-1:123456789012:layer:SdkLayer90B54D5D:3"  # output SdkLayerArn


def quota(name: str, value: float, code: str = "L-00000000", adjustable: bool = True) -> dict[str, Any]:
    return {"ServiceCode": "bedrock", "ServiceName": "Amazon Bedrock", "QuotaCode": code, "QuotaName": name,
            "Value": value, "Unit": "None", "Adjustable": adjustable, "GlobalQuota": False}


# Service Quotas' bedrock list as an account sees it, in Bedrock's current names: the model's own quotas among
# decoys (another family, a long-context variant, a neighbouring model), across two pages; one row still in the
# older "model inference" spelling.
PAGE_1 = [
    quota(f"On-demand InvokeModel requests per minute for {SONNET_46}", 50, "L-ONDEMAND1"),
    quota(f"Global cross-Region InvokeModel requests per minute for {SONNET_46} V1", 250, "L-GLOBALRPM"),
    quota(f"Cross-Region InvokeModel tokens per minute for {SONNET_46}", 400_000, "L-GEOTPM"),
    quota("Global cross-Region InvokeModel tokens per minute for Anthropic Claude Sonnet 4.5 V1", 9, "L-OTHER"),
    quota("Cross-Model Max Tokens Per Day", 5e9, "L-ACCOUNTDAY"),
]
PAGE_2 = [
    quota(f"Global cross-Region InvokeModel tokens per minute for {SONNET_46} V1 1M Context Length", 7, "L-1M"),
    quota(f"Global cross-region model inference tokens per minute for {SONNET_46} V1", 2_000_000, "L-GLOBALTPM"),
    quota(f"Model invocation max tokens per day for {SONNET_46} V1 (doubled for cross-region calls)", 1e9, "L-DAY"),
]


class Clients:
    """Stubbed clients for one preflight run; `verify()` asserts every stubbed answer was used."""

    def __init__(self) -> None:
        self.runtime, self.runtime_stub = bs.stubbed("bedrock-runtime")
        self.bedrock, self.bedrock_stub = bs.stubbed("bedrock")
        self.quotas, self.quotas_stub = bs.stubbed("service-quotas")
        self.cfn, self.cfn_stub = bs.stubbed("cloudformation")
        self.ssm, self.ssm_stub = bs.stubbed("ssm")
        self.lambda_, self.lambda_stub = bs.stubbed("lambda")
        self.stubs: list[Stubber] = [self.runtime_stub, self.bedrock_stub, self.quotas_stub, self.cfn_stub,
                                     self.ssm_stub, self.lambda_stub]
        for s in self.stubs:
            s.activate()

    def quota_pages(self, *pages: list[dict[str, Any]], operation: str = "list_service_quotas") -> None:
        for i, page in enumerate(pages):
            response: dict[str, Any] = {"Quotas": page}
            params: dict[str, Any] = {"ServiceCode": "bedrock"}
            if i + 1 < len(pages):
                response["NextToken"] = f"t{i + 1}"
            if i:
                params["NextToken"] = f"t{i}"
            self.quotas_stub.add_response(operation, response, expected_params=params)

    def account(self, layer: str = LAYER, total: int = 1000, unreserved: int = 1000, deployed: bool = False,
                sdk: dict[str, str] | None = None) -> None:
        """The account checks' answers: the layer parameter exists, GetAccountSettings' limits (a Stubber: moto does
        not implement GetAccountSettings); for a deployed stack, its SDK layer's description (`sdk`, default: the
        versions this checkout pins)."""
        self.ssm_stub.add_response("get_parameter", {"Parameter": {"Name": layer, "Type": "String", "Value": LAYER_ARN,
                                                                   "Version": 1}}, expected_params={"Name": layer})
        self.lambda_stub.add_response("get_account_settings", {"AccountLimit": {
            "ConcurrentExecutions": total, "UnreservedConcurrentExecutions": unreserved}}, expected_params={})
        if deployed:
            self.lambda_stub.add_response("get_layer_version_by_arn", {
                "LayerVersionArn": SDK_LAYER_ARN, "Description": sdk_description(sdk or installed_sdk())},
                expected_params={"Arn": SDK_LAYER_ARN})

    def run(self, model_id: str = bs.CURRENT):
        ticks = itertools.count(0.0, 0.75)  # the clock: each reading 0.75 s after the last
        return run_preflight(model_id, bs.REGION, runtime=self.runtime, bedrock=self.bedrock, quotas=self.quotas,
                             clock=lambda: next(ticks))

    def verify(self) -> None:
        for s in self.stubs:
            s.assert_no_pending_responses()


def test_a_usable_model_reports_access_latency_and_its_own_rpm_and_tpm_quotas():
    # GIVEN a current model that answers, and the account's quota list over two pages
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok(), expected_params={
        "modelId": bs.CURRENT, "messages": [{"role": "user", "content": [{"text": "Reply with the single word OK."}]}],
        "inferenceConfig": {"maxTokens": 8, "temperature": 0.0}})
    c.quota_pages(PAGE_1, PAGE_2)
    # WHEN preflight runs
    report = c.run()
    # THEN access works, with the call's latency, and exactly the global RPM and TPM quotas of that model
    c.verify()
    assert report.ok and report.error_code is None and report.latency_ms == 750.0
    assert report.facts is not None and (report.facts.display_name, report.facts.lifecycle) == (SONNET_46, "ACTIVE")
    assert [(q.what, q.code, q.value, q.source) for q in report.quotas] == [
        ("tokens_per_minute", "L-GLOBALTPM", 2_000_000, "applied"), ("requests_per_minute", "L-GLOBALRPM", 250, "applied"),
        ("tokens_per_day", "L-DAY", 1e9, "applied"), ("account_tokens_per_day", "L-ACCOUNTDAY", 5e9, "applied")]
    text = "\n".join(render(report))
    assert "access: ok - Converse answered" in text and "750 ms" in text
    assert "path: the workers call it through Converse on bedrock-runtime" in text
    assert "requests per minute (not enforced on bedrock-runtime): 250" in text and "tokens per minute: 2,000,000" in text
    assert "pacing: a deployed stack's workers pace to 2,000,000 tokens per minute" in text


def test_a_messages_path_model_is_pinged_through_invoke_model_and_preflight_names_the_path():
    """A model the traits table sends through the Anthropic Messages body: preflight calls it the way the workers
    will (InvokeModel, not Converse) and says so."""
    import io

    from botocore.response import StreamingBody

    model_id = "global.anthropic.claude-opus-4-6-v1"
    c = Clients()
    bs.expect_current(c.bedrock_stub, model_id)
    raw = json.dumps({"content": [{"type": "text", "text": "OK"}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 12, "output_tokens": 1}}).encode()
    c.runtime_stub.add_response("invoke_model", {"body": StreamingBody(io.BytesIO(raw), len(raw)), "contentType": "application/json"}, expected_params={
        "modelId": model_id, "body": json.dumps({
            "anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "temperature": 0.0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Reply with the single word OK."}]}]}),
        "contentType": "application/json", "accept": "application/json"})
    c.quota_pages(PAGE_1, PAGE_2)
    report = c.run(model_id)
    c.verify()
    assert report.ok and report.api == "Messages API (InvokeModel)" and report.message.startswith("stop reason end_turn")
    text = "\n".join(render(report))
    assert "path: the workers call it through Messages API (InvokeModel) on bedrock-runtime" in text
    assert "access: ok - Messages API (InvokeModel) answered" in text


def test_a_retired_model_reports_the_job_fatal_code_and_what_to_do():
    # GIVEN a retired model id (Converse: ValidationException; control plane: LEGACY)
    c = Clients()
    bs.expect_model(c.bedrock_stub, bs.RETIRED, lifecycle="LEGACY", name="Claude 3.5 Sonnet",
                    inference_types=("ON_DEMAND",))
    c.runtime_stub.add_client_error("converse", service_error_code="ValidationException",
                                    service_message=bs.EOL_MESSAGE, http_status_code=400)
    c.quota_pages([quota("On-demand model inference requests per minute for Anthropic Claude 3.5 Sonnet", 20)],
                  )
    c.quota_pages([quota("On-demand model inference tokens per minute for Anthropic Claude 3.5 Sonnet", 2e5)],
                  operation="list_aws_default_service_quotas")
    report = c.run(bs.RETIRED)
    c.verify()
    # THEN the report names the code the workers would record, the id, and the recovery
    assert not report.ok and report.error_code == "model.id_rejected"
    assert bs.RETIRED in report.message and "LEGACY" in report.message
    text = "\n".join(render(report))
    assert "FAILED model.id_rejected" in text and "-c model_id=" in text
    # AND the quotas still come back: the applied RPM, and the TPM from AWS's defaults (no applied value)
    assert [(q.what, q.source) for q in report.quotas] == [("tokens_per_minute", "AWS default"),
                                                           ("requests_per_minute", "applied")]


def test_access_not_enabled_reports_access_denied_with_its_recovery():
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_client_error("converse", service_error_code="AccessDeniedException", http_status_code=403,
                                    service_message="You don't have access to the model with the specified model ID.")
    c.quota_pages(PAGE_1, PAGE_2)
    report = c.run()
    c.verify()
    assert report.error_code == "model.access_denied"
    assert report.message.startswith("AccessDeniedException (HTTP 403)")
    assert "enable model access" in report.recovery
    assert f"what to do: {report.recovery}" in render(report)


def test_unreadable_quotas_are_a_note_not_a_failure():
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quotas_stub.add_client_error("list_service_quotas", service_error_code="AccessDeniedException",
                                   http_status_code=400)
    report = c.run()
    c.verify()
    assert report.ok and report.quotas == []
    assert any("AccessDeniedException" in n and "servicequotas:ListServiceQuotas" in n for n in report.notes)


def test_quota_matching_is_by_family_and_model_name_only():
    both = PAGE_1 + PAGE_2

    def codes(model_id: str, name: str = SONNET_46) -> list[str]:
        return sorted(q.code for q in match_model_quotas(both, model_id, name, "applied"))

    assert codes("global.anthropic.claude-sonnet-4-6") == ["L-ACCOUNTDAY", "L-DAY", "L-GLOBALRPM", "L-GLOBALTPM"]
    assert codes("us.anthropic.claude-sonnet-4-6") == ["L-ACCOUNTDAY", "L-DAY", "L-GEOTPM"]
    assert codes("anthropic.claude-sonnet-4-6") == ["L-ACCOUNTDAY", "L-DAY", "L-ONDEMAND1"]
    assert codes("global.anthropic.claude-sonnet-4", "Anthropic Claude Sonnet 4") == ["L-ACCOUNTDAY"]


def test_a_global_profile_without_global_rows_falls_back_to_the_cross_region_ones():
    rows = match_model_quotas(PAGE_1, "global.anthropic.claude-sonnet-4-6", SONNET_46, "applied")
    assert [(q.what, q.code) for q in rows if q.what == "tokens_per_minute"] == [("tokens_per_minute", "L-GEOTPM")]


# --- the command: resolving the stack, and one line per error ---------------------------------------------

class FakeSession:
    def __init__(self, clients: Clients, credentials: bool = True, region: str | None = bs.REGION):
        self.clients, self.credentials, self.region_name = clients, credentials, region

    def get_credentials(self) -> object | None:
        return object() if self.credentials else None

    def client(self, service: str, **_: Any) -> Any:
        return {"bedrock-runtime": self.clients.runtime, "bedrock": self.clients.bedrock,
                "service-quotas": self.clients.quotas, "cloudformation": self.clients.cfn, "ssm": self.clients.ssm,
                "lambda": self.clients.lambda_}[service]


class WithClients(FakeSession):
    """A FakeSession with more stubbed clients (service name -> client)."""

    def __init__(self, clients: Clients, extra: dict[str, Any]):
        super().__init__(clients)
        self.extra = extra

    def client(self, service: str, **kw: Any) -> Any:
        return self.extra[service] if service in self.extra else super().client(service, **kw)


def deployed_stack_run(c: Clients, outputs: dict[str, str]) -> None:
    """The answers of a preflight of the deployed stack "Prod" with these outputs (its model, the current one): the
    stack, the model, the quotas (read twice: the batch check reads them again), the account."""
    c.cfn_stub.add_response("describe_stacks", _stack({"ModelProvider": "bedrock", "ModelId": bs.CURRENT, **outputs}),
                            expected_params={"StackName": "Prod"})
    bs.expect_current(c.bedrock_stub, bs.CURRENT)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    for _ in range(2):
        c.quota_pages(PAGE_1, PAGE_2)
        c.quota_pages([], operation="list_aws_default_service_quotas")
    c.account(deployed=True)


def _stack(outputs: dict[str, str]) -> dict[str, Any]:
    """A deployed stack's description: these outputs, and the SdkLayerArn every deploy from this checkout has."""
    outputs = {"SdkLayerArn": SDK_LAYER_ARN, **outputs}
    return {"Stacks": [{"StackName": "Prod", "CreationTime": "2026-11-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
                        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items() if v]}]}


def test_a_deployed_stack_is_checked_with_the_model_in_its_outputs():
    c = Clients()
    c.cfn_stub.add_response("describe_stacks", _stack({"ModelProvider": "bedrock", "ModelId": "us.anthropic.claude-sonnet-4-6"}),
                            expected_params={"StackName": "Prod"})
    bs.expect_current(c.bedrock_stub, "us.anthropic.claude-sonnet-4-6")
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.quota_pages([], operation="list_aws_default_service_quotas")  # no requests quota applied: asked for defaults
    c.account(deployed=True)
    lines: list[str] = []
    ok = preflight("Prod", None, session_factory=lambda **_: FakeSession(c), echo=lines.append)
    c.verify()
    assert ok and lines[0] == "stack Prod (us-east-1): model provider bedrock"
    assert lines[1].startswith("model: us.anthropic.claude-sonnet-4-6 (Anthropic Claude Sonnet 4.6")
    assert any("tokens per minute: 400,000" in line for line in lines)  # the geographic profile's family
    assert any(line.startswith("pacing: a deployed stack's workers pace to 400,000") for line in lines)


def test_a_stack_deployed_with_a_quota_says_the_workers_pace_to_it():
    c = Clients()
    c.cfn_stub.add_response("describe_stacks", _stack({"ModelProvider": "bedrock", "ModelId": bs.CURRENT,
                                                       "ModelTpm": "600000"}), expected_params={"StackName": "Prod"})
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account(deployed=True)
    lines: list[str] = []
    assert preflight("Prod", None, session_factory=lambda **_: FakeSession(c), echo=lines.append)
    assert any(line.startswith("pacing: this stack's workers pace to 600,000 tokens per minute (deployed with")
               for line in lines)


def test_a_local_stack_says_it_runs_the_offline_model_and_still_checks_bedrock(tmp_path):
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"endpoint": "http://127.0.0.1:5000", "region": "us-east-1",
                                 "outputs": {"ModelProvider": "offline", "ModelId": bs.CURRENT}}))
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account()
    lines: list[str] = []
    ok = preflight(None, None, session_factory=lambda **_: FakeSession(c), local_json=local, echo=lines.append)
    c.verify()
    assert ok and lines[0] == "local stack (review up): model provider offline"
    assert "offline rule model" in lines[1] and "not an LLM" in lines[1]
    assert any(line.startswith(f"model: {bs.CURRENT}") for line in lines)


@pytest.mark.parametrize("case", ["no credentials", "unknown stack", "no local stack", "stale local json",
                                  "no region"])
def test_every_condition_preflight_cannot_check_past_is_one_clear_line(tmp_path, case):
    c = Clients()
    local = tmp_path / "local.json"
    session = FakeSession(c, credentials=case != "no credentials", region=None if case == "no region" else bs.REGION)
    stack: str | None = "Prod"
    if case == "unknown stack":
        c.cfn_stub.add_client_error("describe_stacks", service_error_code="ValidationError", http_status_code=400,
                                    service_message="Stack with id Prod does not exist")
    elif case in ("no local stack", "stale local json", "no region"):
        stack = None
        if case != "no local stack":
            local.write_text("{not json" if case == "stale local json" else json.dumps({"outputs": {}}))
    with pytest.raises(PreflightError) as info:
        preflight(stack, None, session_factory=lambda **_: session, local_json=local, echo=lambda _l: None)
    message = str(info.value)
    assert "\n" not in message
    assert {"no credentials": "no AWS credentials found", "unknown stack": "no stack 'Prod' in region us-east-1",
            "no local stack": "start the local stack with `review up`", "stale local json": "run `review up` again",
            "no region": "no AWS region"}[case] in message


def test_the_cli_prints_one_line_and_exits_1_without_a_traceback(tmp_path, monkeypatch):
    # GIVEN no AWS credentials anywhere (environment, files, instance metadata)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # WHEN preflight is asked about a deployed stack
    result = CliRunner().invoke(cli, ["--stack", "Prod", "--region", "eu-west-1", "preflight"])
    # THEN one line says so, exit status 1, no traceback
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [f"Error: {result.output.strip().removeprefix('Error: ')}"]
    assert "no AWS credentials found" in result.output and "Traceback" not in result.output


# --- the account checks -------------------------------------------------------------------------------------

def test_a_missing_layer_parameter_fails_with_a_command_that_works_on_moto():
    """moto's SSM knows no /aws/service/powertools parameter (nor may anyone create one: /aws is reserved), as a
    region where the layer is not published: the check fails, and says the region has no layer at all."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        ssm = boto3.client("ssm", region_name="eu-south-2")
        check = check_layer(ssm, LAYER, "eu-south-2")
    assert check.ok is False and "does not exist in eu-south-2" in check.line and "nor" in check.line
    assert check.remedy == "review --region us-east-1 preflight"
    assert "\n" not in check.render() and check.render().startswith("powertools layer: FAILED - ")


def test_a_release_not_published_in_the_region_yet_names_the_latest_layer():
    c = Clients()
    c.ssm_stub.add_client_error("get_parameter", service_error_code="ParameterNotFound", http_status_code=400,
                                expected_params={"Name": LAYER})
    c.ssm_stub.add_response("get_parameter", {"Parameter": {"Name": "latest", "Value": LAYER_ARN}},
                            expected_params={"Name": LAYER.rsplit("/", 1)[0] + "/latest"})
    check = check_layer(c.ssm, LAYER, "us-east-1")
    c.verify()
    assert check.ok is False and check.remedy == "npx cdk deploy -c profile=prod -c powertools_version=latest"
    ok = Clients()
    ok.account()
    assert check_layer(ok.ssm, LAYER, "us-east-1").ok is True


@pytest.mark.parametrize("total,unreserved,reserved,deployed,ok", [
    (1000, 1000, 22, False, True),  # a default account: 22 reserved (worker 20, sweeper 1, collector 1) leaves 978
    (10, 10, 22, False, False),  # a new account: 10 in all
    (1000, 117, 22, False, False),  # others reserved most of it: 95 would be left
    (1000, 100, 22, True, True),  # deployed: its 22 are already out of the 100 left
    (1000, 99, 22, True, False),
    (150, 150, 2, False, True),  # -c worker_reserved_concurrency=0: the sweeper's and the collector's 1 each
    (101, 101, 2, False, False),  # ... which a new account's 10, or any 101, cannot hold with 100 unreserved
])
def test_the_account_concurrency_must_cover_the_reservations_and_the_100_unreserved(
        total: int, unreserved: int, reserved: int, deployed: bool, ok: bool):
    c = Clients()  # a Stubber: moto does not implement Lambda GetAccountSettings
    c.account(total=total, unreserved=unreserved)
    check = check_concurrency(c.lambda_, "eu-west-1", reserved, deployed)
    assert check.ok is ok, check.render()
    assert f"account limit {total:,}, unreserved {unreserved:,}" in check.line
    if not ok:
        assert check.remedy.startswith("aws service-quotas request-service-quota-increase --service-code lambda "
                                       "--quota-code L-B99A9384 --desired-value ")
        assert check.remedy.endswith(" --region eu-west-1")
        assert "worker_reserved_concurrency=0" in check.line
        assert "the sweeper and the batch collector always reserve 2" in check.line


def test_a_local_stack_is_checked_for_what_a_prod_deploy_reserves(tmp_path):
    """The sweeper and the batch collector reserve 1 each beside the worker's maximum; preflight counts
    them (a deploy it passed would otherwise fail on the 100 that must stay unreserved)."""
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"outputs": {"ModelProvider": "offline", "ModelId": bs.CURRENT}}))
    assert local_target(local).reserved == get_profile("prod").functions.worker_max_concurrency + 2


def test_access_denied_on_a_global_profile_is_named_as_a_region_restriction_with_a_geographic_profile():
    # GIVEN an organization whose SCP denies every region but eu-west-1: the global profile is refused
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_client_error("converse", service_error_code="AccessDeniedException", http_status_code=403,
                                    service_message="... with an explicit deny in a service control policy")
    c.quota_pages(PAGE_1, PAGE_2)
    report = run_preflight(bs.CURRENT, "eu-west-1", runtime=c.runtime, bedrock=c.bedrock, quotas=c.quotas)
    check = region_restriction(report)
    # THEN the check names it, with the eu. profile as the fix
    assert check is not None and check.ok is False
    assert check.remedy == "npx cdk deploy -c profile=prod -c model_id=eu.anthropic.claude-sonnet-4-6"
    assert "review --region eu-west-1 preflight --model-id eu.anthropic.claude-sonnet-4-6" in check.line
    # a geographic profile refused is plain access (no region hint); so is a global profile that answers
    assert region_restriction(dataclasses.replace(report, model_id="us.anthropic.claude-sonnet-4-6")) is None
    assert region_restriction(dataclasses.replace(report, error_code=None, ok=True)) is None


def local_stack_run(c: Clients, tmp_path: Path, total: int, unreserved: int) -> Path:
    """The answers of a preflight of the local stack (no deployed stack: the account a deploy would go to), with this
    Lambda concurrency; its local.json."""
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"outputs": {"ModelProvider": "offline", "ModelId": bs.CURRENT}}))
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account(total=total, unreserved=unreserved)
    c.quota_pages(BATCH_PAGE)  # the batch check reads the same list again
    return local


def test_preflight_prints_one_line_per_account_check_and_fails_on_any(tmp_path):
    c = Clients()
    local = local_stack_run(c, tmp_path, total=10, unreserved=10)  # a new account
    lines: list[str] = []
    ok = preflight(None, None, session_factory=lambda **_: FakeSession(c), local_json=local, echo=lines.append)
    c.verify()
    assert not ok  # the model answers, but a deploy with the defaults would not fit the account
    account = lines[lines.index("account:") + 1:]
    assert [line.split(":", 1)[0].strip() for line in account] == ["model catalogue", "powertools layer",
                                                                   "lambda concurrency", "batch inference"]
    assert account[0].startswith("  model catalogue: ok - Claude Sonnet 4.6: converse, tool forced")
    assert account[1].startswith("  powertools layer: ok - ") and "FAILED" in account[2]
    assert account[3].startswith("  batch inference: ok - quota row in us-east-1: at least 100 records per job")
    assert any(line.startswith("pacing: a deployed stack's workers pace to 2,000,000") for line in lines)


def test_the_region_is_taken_after_the_subcommand_too_and_the_worker_passed_through(monkeypatch):
    seen: list[tuple[str | None, str | None]] = []

    def fake(stack, region, model_id, echo, worker=None, before_deploy=False, fallbacks=None):  # noqa: ANN001  # preflight's signature
        seen.append((region, worker))
        return True

    monkeypatch.setattr("review_local.preflight.preflight", fake)
    for args in (["--region", "eu-west-1", "preflight"], ["preflight", "--region", "eu-west-1", "--worker", "fargate"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    assert seen == [("eu-west-1", None), ("eu-west-1", "fargate")]
    assert CliRunner().invoke(cli, ["preflight", "--worker", "ec2"]).exit_code == 2  # lambda | fargate only


def test_a_deployed_stack_is_checked_with_its_own_layer_parameter_and_reservation():
    # GIVEN a stack deployed with -c powertools_version=latest that reserves 20 (its outputs and parameters)
    latest = LAYER.rsplit("/", 1)[0] + "/latest"
    described = _stack({"ModelProvider": "bedrock", "ModelId": bs.CURRENT, "ReservedConcurrency": "20"})
    described["Stacks"][0]["Parameters"] = [{"ParameterKey": "SsmParameterValueawsservicepowertools",
                                             "ParameterValue": latest, "ResolvedValue": LAYER_ARN}]
    c = Clients()
    c.cfn_stub.add_response("describe_stacks", described, expected_params={"StackName": "Prod"})
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account(layer=latest, total=1000, unreserved=100, deployed=True)  # its 20 are already out of the pool: 100 left is enough
    lines: list[str] = []
    assert preflight("Prod", None, session_factory=lambda **_: FakeSession(c), echo=lines.append)
    c.verify()
    assert f"  powertools layer: ok - {latest} exists in us-east-1 ({LAYER_ARN})" in lines
    assert any("the stack reserves 20 (already taken)" in line for line in lines)


class OfflineSession:
    """A machine without a network: every AWS endpoint refuses the connection (real boto3 clients, pointed at a
    closed loopback port, no retries)."""

    region_name = bs.REGION

    def get_credentials(self) -> object:
        return object()

    def client(self, service: str, **_: Any) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(service, region_name=bs.REGION, endpoint_url="http://127.0.0.1:9",
                            aws_access_key_id="x", aws_secret_access_key="x",
                            config=Config(retries={"max_attempts": 1}, connect_timeout=1))


def test_without_a_network_preflight_says_so_in_one_line_not_runtime_retry_advice(tmp_path, caplog):
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"endpoint": "http://127.0.0.1:5000", "region": "us-east-1",
                                 "outputs": {"ModelProvider": "offline", "ModelId": bs.CURRENT}}))
    with pytest.raises(PreflightError) as err:
        preflight(None, None, session_factory=lambda **_: OfflineSession(), local_json=local, echo=lambda _l: None)
    message = str(err.value)
    assert message.startswith("no network: could not connect to http://127.0.0.1:9")
    assert "network" in message and "HTTPS_PROXY" in message and "retr" not in message
    # AND nothing is said before that line (the model client's own "cannot ask Bedrock about ..." warning)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


# --- batch inference (docs/batch-inference.md) ----------------------------------------------------
BATCH_PAGE = [
    quota("Minimum number of records per batch inference job for Anthropic Claude Sonnet 4.5 V1", 50, "L-BATCHOTHER"),
    quota(f"Minimum number of records per batch inference job for {SONNET_46}", 100, "L-BATCHMIN", adjustable=False),
]


def _batch_report(model_id: str = bs.CURRENT, name: str = SONNET_46) -> PreflightReport:
    return PreflightReport(model_id=model_id, region=bs.REGION,
                           facts=ModelFacts(model_id, "anthropic.claude-sonnet-4-6", None, name, "ACTIVE"))


def test_batch_support_is_the_models_minimum_records_quota_and_its_batch_price():
    # GIVEN Service Quotas lists a batch minimum for the model (among another model's) WHEN checked THEN ok, with the
    # model's own minimum and the table's batch price
    c = Clients()
    c.quota_pages(BATCH_PAGE)
    check = check_batch(c.quotas, _batch_report())
    c.verify()
    assert check.ok is True
    assert "at least 100 records per job [applied]" in check.line and "(L-BATCHMIN)" in check.line
    assert "batch price $0.0015/$0.0075 per 1,000 input/output tokens" in check.line
    assert "no dry run" in check.line  # a quota row is no proof that batch accepts the model or profile


def test_a_batch_minimum_only_among_the_defaults_is_found_there():
    c = Clients()
    c.quota_pages(PAGE_1)  # applied values: none for batch
    c.quota_pages([quota("Minimum number of records per batch inference job", 100, "L-BATCHALL")],
                  operation="list_aws_default_service_quotas")
    check = check_batch(c.quotas, _batch_report())
    c.verify()
    assert check.ok is True and "[AWS default]" in check.line and "(L-BATCHALL)" in check.line


def test_no_batch_quota_for_the_model_is_said_without_failing_preflight():
    c = Clients()
    c.quota_pages(PAGE_1)
    c.quota_pages(PAGE_2, operation="list_aws_default_service_quotas")
    check = check_batch(c.quotas, _batch_report(model_id="anthropic.claude-opus-4-6-v1",
                                                name="Anthropic Claude Opus 4.6"))
    c.verify()
    assert check.ok is None  # batch mode is optional: said, not a failure
    assert "likely not offered" in check.line and "no batch price in the price table" in check.line


def test_unreadable_batch_quotas_are_not_checked():
    c = Clients()
    c.quotas_stub.add_client_error("list_service_quotas", service_error_code="AccessDeniedException",
                                   http_status_code=403)
    check = check_batch(c.quotas, _batch_report())
    c.verify()
    assert check.ok is None and "AccessDeniedException" in check.line
    assert check_batch(c.quotas, _batch_report(name="")).ok is None  # the model's name unknown


def test_preflight_json_is_one_document_with_every_field_of_the_report_and_the_checks(tmp_path):
    # GIVEN the same account as above: the model answers, a deploy with the defaults would not fit its concurrency
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"outputs": {"ModelProvider": "offline", "ModelId": bs.CURRENT}}))
    c = Clients()
    bs.expect_current(c.bedrock_stub)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account(total=10, unreserved=10)
    c.quota_pages(BATCH_PAGE)
    lines: list[str] = []
    document: dict[str, Any] = {}
    # WHEN preflight fills a document instead of printing
    ok = preflight(None, None, session_factory=lambda **_: FakeSession(c), local_json=local, echo=lines.append,
                   document=document)
    c.verify()
    # THEN nothing is printed, and the document carries the verdict, the model's access, quotas and pacing, and
    # each account check with its fix, as plain JSON
    assert not ok and lines == [] and document["ok"] is False
    assert json.loads(json.dumps(document)) == document
    assert document["offline_stand_in"] is True and document["model"]["ok"] is True
    assert document["model"]["model_id"] == bs.CURRENT and document["model"]["latency_ms"] > 0
    assert {q["code"] for q in document["model"]["quotas"]} >= {"L-GLOBALTPM"}
    assert any(line.startswith("pacing: a deployed stack's workers pace to 2,000,000") for line in
               document["model"]["lines"])
    checks = {c_["name"]: c_ for c_ in document["checks"]}
    assert list(checks) == ["model catalogue", "powertools layer", "lambda concurrency", "batch inference"]
    assert checks["lambda concurrency"]["ok"] is False and checks["lambda concurrency"]["remedy"]
    assert checks["powertools layer"]["ok"] is True


@pytest.mark.parametrize("outcome", ["ok", "failed", "cannot check"])
def test_the_cli_prints_one_json_document_for_each_outcome(monkeypatch, outcome):
    def fake(stack, region, model_id, echo, document=None, worker=None,  # noqa: ANN001  # preflight's signature
             before_deploy=False, fallbacks=None):
        echo("a line that must not reach stdout with --json")
        if outcome == "cannot check":
            raise PreflightError("no AWS region: pass --region or set AWS_REGION")
        assert document is not None
        document.update(ok=outcome == "ok", checks=[])
        return outcome == "ok"

    monkeypatch.setattr("review_local.preflight.preflight", fake)
    result = CliRunner().invoke(cli, ["preflight", "--json"])
    # stdout is exactly one JSON document; the exit code is the verdict
    parsed = json.loads(result.stdout)
    assert parsed["ok"] is (outcome == "ok") and result.exit_code == (0 if outcome == "ok" else 1)
    if outcome == "cannot check":
        assert parsed["error"] == "no AWS region: pass --region or set AWS_REGION"


def test_the_catalogue_check_refuses_an_uncatalogued_id_and_warns_of_unconfirmed_request_rules():
    from review_local.preflight import check_catalogue

    assert check_catalogue("global.anthropic.claude-sonnet-4-6").ok is True
    unknown = check_catalogue("amazon.nova-pro-v1:0")
    assert unknown.ok is False and "no row in the model catalogue" in unknown.line
    unconfirmed = check_catalogue("global.anthropic.claude-sonnet-5-5")
    assert unconfirmed.ok is None and "forced_tool_choice" in unconfirmed.line and "tool offered" in unconfirmed.line


def test_each_fallback_model_is_checked_as_the_stacks_model_is(tmp_path):
    # GIVEN a chain of two fallbacks: one the account may call, one with no catalogue row
    c = Clients()
    local = local_stack_run(c, tmp_path, total=1000, unreserved=1000)
    fallback = "us.anthropic.claude-sonnet-4-6"
    bs.expect_current(c.bedrock_stub, fallback)
    c.runtime_stub.add_response("converse", bs.converse_ok())  # one tiny call, the way a worker would call it
    c.quota_pages(PAGE_1, PAGE_2)
    c.quota_pages([], operation="list_aws_default_service_quotas")
    c.quota_pages(BATCH_PAGE)  # its batch quota row
    lines: list[str] = []
    ok = preflight(None, None, session_factory=lambda **_: FakeSession(c), local_json=local, echo=lines.append,
                   fallbacks=f"{fallback},anthropic.claude-nonesuch-9")
    # THEN each got its lines, the callable one passing, the uncatalogued one failing without a call
    c.verify()
    account = [line.strip() for line in lines[lines.index("account:") + 1:]]
    ours = [line for line in account if line.startswith("fallback ")]
    assert [line.split(" - ")[0] for line in ours] == [
        f"fallback {fallback}: model catalogue: ok", f"fallback {fallback}: invocable: ok",
        f"fallback {fallback}: batch inference: ok", "fallback anthropic.claude-nonesuch-9: model catalogue: FAILED"]
    assert "Converse answered in" in ours[1]
    assert not ok
