"""`review preflight` on a deployed stack checks its functions' SDK layer (output SdkLayerArn, infra/sdk_layer.py):
the layer version's description names the boto3/botocore it carries, compared with the ones this checkout pins; a
stack deployed from a checkout before the layer (no output) runs the Lambda runtime's own SDK.
`--before-deploy` (what `make deploy` runs) lets such a stack be deployed: the deploy is the fix. GetLayerVersionByArn
answered by botocore's Stubber, like the rest of preflight."""

from __future__ import annotations

from pathlib import Path

from botocore.stub import Stubber
from click.testing import CliRunner

from contract_review.config.profile import get_profile
from contract_review.config.sdk import installed_sdk, sdk_description
from review_local.cli import cli
from review_local.preflight import preflight
from review_local.preflight_account import check_sdk_layer

from .. import bedrock_stubs as bs
from .test_preflight import PAGE_1, PAGE_2, SDK_LAYER_ARN, Clients, FakeSession, _stack

PINNED = installed_sdk()


def _layer(lambda_stub: Stubber, description: str) -> None:
    lambda_stub.add_response("get_layer_version_by_arn", {"LayerVersionArn": SDK_LAYER_ARN, "Description": description},
                             expected_params={"Arn": SDK_LAYER_ARN})


def test_a_layer_with_the_pinned_sdk_is_ok():
    client, stub = bs.stubbed("lambda")
    _layer(stub, sdk_description(PINNED))
    with stub:
        check = check_sdk_layer(client, SDK_LAYER_ARN, PINNED)
    assert check.ok is True and check.line == (f"the functions run boto3=={PINNED['boto3']} botocore=="
                                               f"{PINNED['botocore']}, as this checkout pins")


def test_a_layer_from_another_checkout_says_which_versions_differ():
    client, stub = bs.stubbed("lambda")
    _layer(stub, sdk_description({**PINNED, "botocore": "1.40.0"}))
    with stub:
        check = check_sdk_layer(client, SDK_LAYER_ARN, PINNED)
    assert check.ok is False and check.redeploy_fixes and check.remedy == "make deploy (from this checkout)"
    assert f"botocore 1.40.0 (this checkout: {PINNED['botocore']})" in check.line and "boto3 " not in check.line


def test_a_stack_without_the_layer_runs_the_runtimes_sdk():
    check = check_sdk_layer(None, "", PINNED)  # no call: the output alone says it
    assert check.ok is False and check.redeploy_fixes
    assert "deployed from a checkout before the SDK layer" in check.line and "runtime's own" in check.line


def test_a_layer_that_names_no_versions_fails_and_an_unreadable_one_is_not_checked():
    client, stub = bs.stubbed("lambda")
    _layer(stub, "")
    stub.add_client_error("get_layer_version_by_arn", service_error_code="AccessDeniedException", http_status_code=403)
    with stub:
        silent, refused = check_sdk_layer(client, SDK_LAYER_ARN, PINNED), check_sdk_layer(client, SDK_LAYER_ARN, PINNED)
    assert silent.ok is False and "does not say which SDK" in silent.line
    assert refused.ok is None and "lambda:GetLayerVersion" in refused.line


def _older_stack_run(c: Clients) -> None:
    """A deployed stack "Prod" from a checkout before the SDK layer: no SdkLayerArn output; otherwise all passes."""
    c.cfn_stub.add_response("describe_stacks", _stack({"ModelProvider": "bedrock", "ModelId": bs.CURRENT,
                                                       "SdkLayerArn": ""}), expected_params={"StackName": "Prod"})
    bs.expect_current(c.bedrock_stub, bs.CURRENT)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account()


def test_a_stack_deployed_before_the_layer_fails_preflight_but_not_the_deploy_that_fixes_it():
    verdicts, outputs = [], []
    for before_deploy in (False, True):
        c = Clients()
        _older_stack_run(c)
        lines: list[str] = []
        verdicts.append(preflight("Prod", None, session_factory=lambda s=FakeSession(c), **_: s, echo=lines.append,
                                  before_deploy=before_deploy))
        c.verify()
        outputs.append(lines)
    assert verdicts == [False, True]
    plain, gated = ([line for line in lines if line.startswith("  sdk layer: FAILED")] for lines in outputs)
    assert plain and "make deploy (from this checkout)" in plain[0] and "this deploy fixes it" not in plain[0]
    assert gated and gated[0].endswith("(this deploy fixes it)")


def test_before_a_first_deploy_the_stack_need_not_exist_nor_the_local_stack(tmp_path: Path):
    c = Clients()
    c.cfn_stub.add_client_error("describe_stacks", service_error_code="ValidationError",
                                service_message="Stack with id Prod does not exist", http_status_code=400)
    prod = get_profile("prod")
    bs.expect_current(c.bedrock_stub, prod.review.model_id)
    c.runtime_stub.add_response("converse", bs.converse_ok())
    c.quota_pages(PAGE_1, PAGE_2)
    c.account()  # no SDK layer asked for: nothing deployed yet
    lines: list[str] = []
    ok = preflight("Prod", None, session_factory=lambda **_: FakeSession(c), echo=lines.append,
                   local_json=tmp_path / "absent.json", before_deploy=True)
    c.verify()
    assert ok and lines[0] == "stack Prod (us-east-1; not deployed yet, its first deploy with the prod defaults): " \
                              "model provider bedrock"
    reserved = prod.functions.worker_max_concurrency + 2  # the worker's maximum, the sweeper's and collector's 1
    assert any(f"the stack reserves {reserved} (on deploy)" in line for line in lines), lines


def test_the_cli_flag_reaches_preflight(monkeypatch):
    seen = []

    def fake(stack, region, model_id, echo, worker=None, before_deploy=False, fallbacks=None):  # noqa: ANN001  # preflight's signature
        seen.append((stack, before_deploy))
        return False

    monkeypatch.setattr("review_local.preflight.preflight", fake)
    result = CliRunner().invoke(cli, ["--stack", "Prod", "preflight", "--before-deploy"])
    assert result.exit_code == 1 and seen == [("Prod", True)]
