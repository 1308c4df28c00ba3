"""`review preflight` on a deployed stack checks its batch service role (output BatchRoleArn; infra/batch.py): it
exists and Bedrock may assume it. One GetRole, answered here by botocore's Stubber (moto's IAM would answer it too,
but the rest of preflight runs on Stubbers)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from review_local.preflight import preflight
from review_local.preflight_account import check_batch_role

from .. import bedrock_stubs as bs
from .test_preflight import Clients, WithClients, deployed_stack_run

ROLE = "arn:aws:iam::123456789012:role/Prod-BatchServiceRoleBF1D8B3E-1AB2C3D4"
NAME = ROLE.rsplit("/", 1)[-1]
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "bedrock.amazonaws.com"}, "Action": "sts:AssumeRole",
    "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}}}]}


def _role(trust: dict[str, Any]) -> dict[str, Any]:
    """GetRole's answer as IAM sends it: the trust policy URL-encoded JSON (boto3 decodes it; the Stubber does not)."""
    return {"Role": {"Path": "/", "RoleName": NAME, "RoleId": "AROAEXAMPLE000000000", "Arn": ROLE,
                     "CreateDate": "2026-11-01T00:00:00Z", "AssumeRolePolicyDocument": quote(json.dumps(trust))}}


def test_a_role_bedrock_may_assume_is_ok():
    iam, stub = bs.stubbed("iam")
    stub.add_response("get_role", _role(TRUST), expected_params={"RoleName": NAME})
    with stub:
        check = check_batch_role(iam, ROLE)
    assert check.ok is True and NAME in check.line


def test_a_role_that_no_longer_trusts_bedrock_fails_with_the_redeploy():
    iam, stub = bs.stubbed("iam")
    lambda_trust = {"Statement": [{**TRUST["Statement"][0], "Principal": {"Service": "lambda.amazonaws.com"}}]}
    stub.add_response("get_role", _role(lambda_trust), expected_params={"RoleName": NAME})
    with stub:
        check = check_batch_role(iam, ROLE)
    assert check.ok is False and "bedrock.amazonaws.com" in check.line and "cdk deploy" in check.remedy


def test_a_deleted_role_fails_and_an_unreadable_one_is_not_checked():
    iam, stub = bs.stubbed("iam")
    stub.add_client_error("get_role", service_error_code="NoSuchEntity", http_status_code=404)
    stub.add_client_error("get_role", service_error_code="AccessDenied", http_status_code=403)
    with stub:
        gone, denied = check_batch_role(iam, ROLE), check_batch_role(iam, ROLE)
    assert gone.ok is False and "does not exist" in gone.line and "cdk deploy" in gone.remedy
    assert denied.ok is None and "iam:GetRole" in denied.line


def test_preflight_of_a_deployed_stack_prints_the_batch_role_line():
    c = Clients()
    deployed_stack_run(c, {"BatchRoleArn": ROLE})
    iam, stub = bs.stubbed("iam")
    stub.add_response("get_role", _role(TRUST), expected_params={"RoleName": NAME})
    lines: list[str] = []
    with stub:
        preflight("Prod", None, session_factory=lambda **_: WithClients(c, {"iam": iam}), echo=lines.append)
    stub.assert_no_pending_responses()
    assert any(line.startswith("  batch service role: ok - ") for line in lines), lines


def test_the_trust_policy_is_read_as_boto3_decodes_it_too():
    class DecodingIam:  # boto3's IAM client hands the document over as a dict
        def get_role(self, RoleName: str) -> dict[str, Any]:  # noqa: N803  # boto3's parameter name
            return {"Role": {"RoleName": RoleName, "AssumeRolePolicyDocument": TRUST}}

    assert check_batch_role(DecodingIam(), ROLE).ok is True
