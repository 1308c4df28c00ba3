"""Least-privilege grants per function, read back from the template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import (
    FARGATE,
    LOCAL,
    PROD,
    Synth,
    actions_on,
    function_by_handler,
    getatt_id,
    policy_statements_for_role,
    resources,
    source_queues,
)

DDB_READ = {"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:Scan",
            "dynamodb:ConditionCheckItem", "dynamodb:DescribeTable"}
DDB_WRITE = {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"}
SQS_SEND = {"sqs:SendMessage"}
SQS_CONSUME = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}


def _ids(t: dict[str, Any]) -> dict[str, str]:
    """Logical ids by role in the pipeline."""
    out: dict[str, str] = {}
    for lid in t["Resources"]:
        for prefix in ("TablesJobsTable", "TablesClaimsTable", "TablesCheckpointsTable", "TablesEventsTable",
                       "StorageArtifacts"):
            if lid.startswith(prefix) and t["Resources"][lid]["Type"] in ("AWS::DynamoDB::Table", "AWS::S3::Bucket"):
                out[prefix.removeprefix("Tables").removesuffix("Table").lower()] = lid
    for qid, p in source_queues(t).items():
        kind = next(k for k in ("intake", "analysis", "results") if qid.lower().startswith(k))
        out[f"{kind}_q"] = qid
        out[f"{kind}_dlq"] = getatt_id(p["RedrivePolicy"]["deadLetterTargetArn"])
    out["bucket"] = out.pop("storageartifacts")
    return out


def _grants(t: dict[str, Any], handler: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    _, fn = function_by_handler(t, f"{handler}.handler")
    return policy_statements_for_role(t, getatt_id(fn["Role"])), _ids(t)


@pytest.fixture(params=[LOCAL, PROD])
def t(request: pytest.FixtureRequest, synth: Synth) -> dict[str, Any]:
    return synth.templates[request.param]


def test_no_managed_policies_and_no_action_wildcards_on_function_roles(t: dict[str, Any]) -> None:
    for h in ("intake", "worker", "aggregator", "sweeper"):
        _, fn = function_by_handler(t, f"{h}.handler")
        role = t["Resources"][getatt_id(fn["Role"])]["Properties"]
        assert "ManagedPolicyArns" not in role, h
        for st in policy_statements_for_role(t, getatt_id(fn["Role"])):
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            assert not any("*" in a for a in actions), (h, actions)
            assert st["Effect"] == "Allow"


def test_intake_grants(t: dict[str, Any]) -> None:
    st, ids = _grants(t, "intake")
    for table in ("jobs", "claims", "events"):
        assert DDB_READ | DDB_WRITE <= actions_on(st, ids[table]), table
    assert not actions_on(st, ids["checkpoints"])
    assert {"s3:GetObject", "s3:PutObject", "s3:ListBucket"} <= actions_on(st, ids["bucket"])
    assert SQS_SEND <= actions_on(st, ids["analysis_q"])
    assert SQS_SEND <= actions_on(st, ids["intake_dlq"])
    assert SQS_CONSUME <= actions_on(st, ids["intake_q"])
    assert not actions_on(st, ids["results_q"])


def test_worker_grants(t: dict[str, Any]) -> None:
    st, ids = _grants(t, "worker")
    for table in ("jobs", "claims", "checkpoints", "events"):
        assert DDB_READ | DDB_WRITE <= actions_on(st, ids[table]), table
    assert {"s3:GetObject", "s3:PutObject"} <= actions_on(st, ids["bucket"])
    assert SQS_SEND | SQS_CONSUME <= actions_on(st, ids["analysis_q"])
    assert SQS_SEND <= actions_on(st, ids["analysis_dlq"])
    assert actions_on(st, ids["results_q"]) & SQS_CONSUME == set()
    assert SQS_SEND <= actions_on(st, ids["results_q"])
    bedrock = [s for s in st if s["Action"] == "bedrock:InvokeModel"]
    assert len(bedrock) == 1
    text = json.dumps(bedrock[0]["Resource"])
    assert ":bedrock:" in text and "AWS::Region" in text
    assert "foundation-model/anthropic.claude-3-5-sonnet-20240620-v1:0" in text


def test_aggregator_grants(t: dict[str, Any]) -> None:
    st, ids = _grants(t, "aggregator")
    for table in ("jobs", "events"):
        assert DDB_READ | DDB_WRITE <= actions_on(st, ids[table]), table
    claims = actions_on(st, ids["claims"])
    assert DDB_READ <= claims and not claims & DDB_WRITE, "claims are read-only for the aggregator"
    assert not actions_on(st, ids["checkpoints"])
    assert {"s3:GetObject", "s3:PutObject"} <= actions_on(st, ids["bucket"])
    assert SQS_CONSUME <= actions_on(st, ids["results_q"])
    assert not actions_on(st, ids["analysis_q"])
    assert not [s for s in st if "bedrock" in json.dumps(s["Action"])]


def test_sweeper_grants(t: dict[str, Any]) -> None:
    st, ids = _grants(t, "sweeper")
    for table in ("jobs", "claims", "events"):
        assert DDB_READ | DDB_WRITE <= actions_on(st, ids[table]), table
    index_arns = [json.dumps(s["Resource"]) for s in st if "dynamodb:Query" in s["Action"]]
    assert any("/index/by-lease" in a for a in index_arns)
    bucket = actions_on(st, ids["bucket"])
    assert "s3:GetObject" in bucket and "s3:PutObject" not in bucket
    assert SQS_SEND <= actions_on(st, ids["analysis_q"])
    assert SQS_SEND <= actions_on(st, ids["results_q"])
    dlq = actions_on(st, ids["analysis_dlq"])
    assert "sqs:ReceiveMessage" in dlq and "sqs:DeleteMessage" not in dlq, "the sweeper reads the DLQ, never deletes"


def test_fargate_task_role_has_the_worker_grants(synth: Synth) -> None:
    t = synth.templates[FARGATE]
    ids = _ids(t)
    (task_def,) = resources(t, "AWS::ECS::TaskDefinition").values()
    st = policy_statements_for_role(t, getatt_id(task_def["Properties"]["TaskRoleArn"]))
    for table in ("jobs", "claims", "checkpoints", "events"):
        assert DDB_READ | DDB_WRITE <= actions_on(st, ids[table]), table
    assert SQS_SEND | SQS_CONSUME <= actions_on(st, ids["analysis_q"])
    assert SQS_SEND <= actions_on(st, ids["results_q"])
    assert any(s["Action"] == "bedrock:InvokeModel" for s in st)


def _referenced_ids(expr: Any) -> set[str]:
    """Every logical id a resource expression points at (through Ref or Fn::GetAtt, at any depth)."""
    if isinstance(expr, dict):
        if "Ref" in expr and isinstance(expr["Ref"], str):
            return {expr["Ref"]}
        if "Fn::GetAtt" in expr:
            return {expr["Fn::GetAtt"][0]}
        return set().union(*(_referenced_ids(v) for v in expr.values()))
    if isinstance(expr, list):
        return set().union(*(_referenced_ids(v) for v in expr))
    return set()


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_no_idempotency_table_and_no_grant_on_a_table_outside_the_stack(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    tables = set(resources(t, "AWS::DynamoDB::Table"))
    # the idempotency table was removed (unused); nothing may still point at it
    assert not [lid for lid in t["Resources"] if "idempotency" in lid.lower()]
    assert "idempotency" not in json.dumps(t).lower()
    assert {lid for lid in tables if lid.startswith(("TablesJobsTable", "TablesClaimsTable",
                                                      "TablesCheckpointsTable", "TablesEventsTable"))} == tables
    assert len(tables) == 4
    policies = resources(t, "AWS::IAM::Policy")
    granted: set[str] = set()
    for pid, pol in policies.items():
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            if not any(a.startswith("dynamodb:") for a in actions):
                continue
            res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            for r in res:
                # every DynamoDB resource is an ARN built from one of this stack's tables: no literal
                # ARN, no wildcard, no reference to a table that is not in the template
                refs = _referenced_ids(r)
                assert refs and refs <= tables, (pid, r)
                granted |= refs
    assert granted == tables, "every table is used by some role"
