"""`review preflight` for the Fargate worker (the stack's WorkerKind output, or `--worker fargate` before a deploy):
the ECS and Application Auto Scaling service-linked roles exist, else the check fails with the exact
`aws iam create-service-linked-role` command (on a fresh account the first create can race ECS's own
creation of its role). GetRole answered by botocore's Stubber, like the rest of preflight."""

from __future__ import annotations

from typing import Any

from review_local.preflight import preflight
from review_local.preflight_account import SERVICE_LINKED_ROLES, check_service_linked_roles

from .. import bedrock_stubs as bs
from .test_preflight import Clients, WithClients, deployed_stack_run, local_stack_run

ECS, SCALING = (role for role, _ in SERVICE_LINKED_ROLES)
CREATE_ECS = "aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com"
CREATE_SCALING = "aws iam create-service-linked-role --aws-service-name ecs.application-autoscaling.amazonaws.com"


def _role(name: str) -> dict[str, Any]:
    return {"Role": {"Path": "/aws-service-role/", "RoleName": name, "RoleId": "AROAEXAMPLE000000000",
                     "Arn": f"arn:aws:iam::123456789012:role/aws-service-role/{name}",
                     "CreateDate": "2026-11-01T00:00:00Z"}}


def _iam(*existing: str, denied: bool = False) -> tuple[Any, Any]:
    """An IAM client answering GetRole for both roles in order: these exist, the others do not."""
    iam, stub = bs.stubbed("iam")
    for role in (ECS, SCALING):
        if denied:
            stub.add_client_error("get_role", service_error_code="AccessDenied", http_status_code=403)
            break
        if role in existing:
            stub.add_response("get_role", _role(role), expected_params={"RoleName": role})
        else:
            stub.add_client_error("get_role", service_error_code="NoSuchEntity", http_status_code=404)
    return iam, stub


def test_both_roles_there_is_ok():
    iam, stub = _iam(ECS, SCALING)
    with stub:
        check = check_service_linked_roles(iam)
    stub.assert_no_pending_responses()
    assert check.ok is True and ECS in check.line and SCALING in check.line


def test_a_missing_role_fails_with_the_command_that_creates_exactly_the_missing_ones():
    iam, stub = _iam(SCALING)  # a fresh account that never created an ECS cluster
    with stub:
        check = check_service_linked_roles(iam)
    assert check.ok is False and ECS in check.line and SCALING not in check.line
    assert check.remedy == CREATE_ECS
    iam, stub = _iam()
    with stub:
        check = check_service_linked_roles(iam)
    assert check.ok is False and check.remedy == f"{CREATE_ECS} && {CREATE_SCALING}"


def test_a_caller_without_get_role_is_told_it_was_not_checked():
    iam, stub = _iam(denied=True)
    with stub:
        check = check_service_linked_roles(iam)
    assert check.ok is None and "iam:GetRole" in check.line


def test_a_deployed_fargate_stack_is_checked_for_its_roles_and_a_lambda_stack_is_not():
    c = Clients()
    deployed_stack_run(c, {"WorkerKind": "fargate"})
    iam, stub = _iam(ECS)
    lines: list[str] = []
    with stub:
        ok = preflight("Prod", None, session_factory=lambda **_: WithClients(c, {"iam": iam}), echo=lines.append)
    stub.assert_no_pending_responses()
    assert not ok
    (line,) = [line for line in lines if line.startswith("  fargate service-linked roles: FAILED - ")]
    assert line.endswith(f"; fix: {CREATE_SCALING}")
    c = Clients()
    deployed_stack_run(c, {"WorkerKind": "lambda"})
    lines = []
    preflight("Prod", None, session_factory=lambda **_: WithClients(c, {}), echo=lines.append)  # no IAM client asked
    assert not any("service-linked" in line for line in lines)


def test_worker_fargate_before_a_deploy_checks_the_roles_and_counts_no_worker_reservation(tmp_path):
    """Before the first deploy (no stack: the local target), `--worker fargate` checks the roles, and the concurrency a
    Fargate stack takes: the sweeper's and the collector's 1 each, not the Lambda worker's 20."""
    c = Clients()
    local = local_stack_run(c, tmp_path, total=102, unreserved=102)  # room for 2 reserved + AWS's 100, not for 22
    iam, stub = _iam(ECS, SCALING)
    document: dict[str, Any] = {}
    with stub:
        ok = preflight(None, None, session_factory=lambda **_: WithClients(c, {"iam": iam}), local_json=local,
                       document=document, worker="fargate")
    c.verify()
    stub.assert_no_pending_responses()
    checks = {check["name"]: check for check in document["checks"]}
    assert ok and checks["fargate service-linked roles"]["ok"] is True
    assert checks["lambda concurrency"]["ok"] is True and "the stack reserves 2 " in checks["lambda concurrency"]["line"]

