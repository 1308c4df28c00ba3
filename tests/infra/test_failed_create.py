"""A failed first create can be retried as it is (infra/removal.py).

CloudFormation keeps `Retain` resources when a create fails: a fixed name then blocks the retry ("already
exists") and every attempt leaves resources behind. So: no retained resource has a fixed physical name; every
retained resource without deletion protection is `RetainExceptOnCreate` (deleted when its own create rolls back);
the deletion-protected tables stay `Retain` (docs/first-deploy.md removes them after a failed create); and every
account-global name (the budget, the dashboard) carries the region, so the same stack name deploys to a second
region."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import FARGATE, LOCAL, PROD, Synth

KEPT = ("Retain", "RetainExceptOnUpdate", "RetainExceptOnCreate")
# names CloudFormation would otherwise generate, by the property that fixes them
NAME_PROPERTIES = {"QueueName", "TableName", "BucketName", "LogGroupName", "TopicName", "FunctionName", "RoleName",
                   "AliasName", "SecretName", "RepositoryName", "ClusterName", "StreamName"}
ACCOUNT_GLOBAL = {"AWS::Budgets::Budget": ("Budget", "BudgetName"), "AWS::CloudWatch::Dashboard": ("DashboardName",)}


def _retained(t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in t["Resources"].items() if r.get("DeletionPolicy") in KEPT}


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_no_retained_resource_has_a_fixed_name(synth: Synth, name: str) -> None:
    retained = _retained(synth.templates[name])
    assert len(retained) >= 10  # the tables, the buckets, the key, the log groups, the compensation DLQ
    fixed = {lid: sorted(k for k, v in r.get("Properties", {}).items() if k in NAME_PROPERTIES and isinstance(v, str))
             for lid, r in retained.items()}
    assert {lid: keys for lid, keys in fixed.items() if keys} == {}


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_retained_resources_are_deleted_when_their_own_create_fails_unless_deletion_protected(
        synth: Synth, name: str) -> None:
    retained = _retained(synth.templates[name])
    protected = {lid for lid, r in retained.items() if r.get("Properties", {}).get("DeletionProtectionEnabled")}
    assert protected and all(retained[lid]["Type"] == "AWS::DynamoDB::Table" for lid in protected)
    assert {lid: retained[lid]["DeletionPolicy"] for lid in protected} == dict.fromkeys(protected, "Retain")
    others = {lid: r["DeletionPolicy"] for lid, r in retained.items() if lid not in protected}
    assert others == dict.fromkeys(others, "RetainExceptOnCreate")
    assert all(r["UpdateReplacePolicy"] == "Retain" for r in retained.values())  # a replacement keeps the old one
    kinds = {retained[lid]["Type"] for lid in others}
    assert {"AWS::SQS::Queue", "AWS::S3::Bucket", "AWS::Logs::LogGroup", "AWS::KMS::Key"} <= kinds


def test_a_disposable_stack_keeps_nothing(synth: Synth) -> None:
    assert _retained(synth.templates[LOCAL]) == {}


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_account_global_names_carry_the_region(synth: Synth, name: str) -> None:
    found = 0
    for r in synth.templates[name]["Resources"].values():
        if r["Type"] not in ACCOUNT_GLOBAL:
            continue
        value: Any = r["Properties"]
        for key in ACCOUNT_GLOBAL[r["Type"]]:
            value = value[key]
        assert name in json.dumps(value) and {"Ref": "AWS::Region"} in value["Fn::Join"][1], value
        found += 1
    assert found == (1 if name == LOCAL else 2)  # the dashboard everywhere; the budget on AWS (moto has no Budgets)
