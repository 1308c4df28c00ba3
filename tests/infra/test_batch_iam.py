"""Bedrock batch inference in the template (infra/batch.py; docs/infrastructure.md "Batch inference"): the service role
Bedrock assumes is trusted by Bedrock alone, for this account's batch jobs in this region, and may read batch/input/
and write batch/output/ of the artifacts bucket and nothing else of it; only the batch collector may pass it, only to
Bedrock, and only the collector may create (tagged with the stack's tag), read and stop (only jobs carrying that tag)
batch jobs; nobody lists them. tests/infra/test_role_coverage.py proves the other half: every call the code (and the
batch stand-in, as Bedrock) makes is allowed, and every grant is used by shipped code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import (
    FARGATE,
    LOCAL,
    PROD,
    Synth,
    batch_service_role_id,
    function_by_handler,
    getatt_id,
    policy_statements_for_role,
    resources,
    role_id,
)

TEMPLATES = [LOCAL, PROD, FARGATE]
JOBS = ["arn:", {"Ref": "AWS::Partition"}, ":bedrock:", {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"},
        ":model-invocation-job/*"]
BATCH_CALLS = {"bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob", "bedrock:StopModelInvocationJob",
               "bedrock:TagResource"}
TAG_KEY = "review-stack"  # infra/monitoring.py COST_TAG_KEY: every resource of the stack carries it (the stack name)


def _actions(st: dict[str, Any]) -> set[str]:
    return {st["Action"]} if isinstance(st["Action"], str) else set(st["Action"])


def _bucket(t: dict[str, Any]) -> str:
    (bucket,) = [lid for lid in resources(t, "AWS::S3::Bucket") if lid.startswith("StorageArtifacts")]
    return bucket


def _objects(t: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {"Fn::Join": ["", [{"Fn::GetAtt": [_bucket(t), "Arn"]}, f"/{prefix}*"]]}


@pytest.mark.parametrize("name", TEMPLATES)
def test_only_bedrock_may_assume_the_service_role_for_this_accounts_batch_jobs(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    role = t["Resources"][batch_service_role_id(t)]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust == {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "bedrock.amazonaws.com"},
                     "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
                                   "ArnLike": {"aws:SourceArn": {"Fn::Join": ["", JOBS]}}}}
    assert "ManagedPolicyArns" not in role and "Policies" not in role


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_service_role_reads_batch_input_and_writes_batch_output_only(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    statements = policy_statements_for_role(t, batch_service_role_id(t))
    s3 = [st for st in statements if any(a.startswith("s3:") for a in _actions(st))]
    assert sorted(s3, key=lambda st: json.dumps(st, sort_keys=True)) == sorted([
        {"Action": "s3:GetObject", "Effect": "Allow", "Resource": _objects(t, "batch/input/")},
        {"Action": "s3:ListBucket", "Effect": "Allow", "Resource": {"Fn::GetAtt": [_bucket(t), "Arn"]},
         "Condition": {"StringLike": {"s3:prefix": ["batch/input/*", "batch/output/*"]}}},
        {"Action": "s3:PutObject", "Effect": "Allow", "Resource": _objects(t, "batch/output/")},
    ], key=lambda st: json.dumps(st, sort_keys=True))
    # the rest: invoking the stack's model through its inference profile (test_model_grants.py), nothing else; no KMS
    # (the bucket is SSE-S3)
    others = [st for st in statements if st not in s3]
    assert all(_actions(st) == {"bedrock:InvokeModel"} for st in others), others
    assert t["Resources"][_bucket(t)]["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}


@pytest.mark.parametrize("name", TEMPLATES)
def test_only_the_collector_may_pass_the_service_role_and_only_to_bedrock(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    service_role = batch_service_role_id(t)
    passers: dict[str, list[dict[str, Any]]] = {}
    for pid, policy in resources(t, "AWS::IAM::Policy").items():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            if any(a.startswith("iam:") for a in _actions(st)):
                passers.setdefault(pid, []).append(st)
    collector_policy = [pid for pid, p in resources(t, "AWS::IAM::Policy").items()
                        if any(getatt_id(r) == role_id(t, "collector") for r in p["Properties"]["Roles"])]
    assert list(passers) == collector_policy, passers
    (st,) = passers[collector_policy[0]]
    assert st == {"Action": "iam:PassRole", "Effect": "Allow", "Resource": {"Fn::GetAtt": [service_role, "Arn"]},
                  "Condition": {"StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}}


@pytest.mark.parametrize("name", TEMPLATES)
def test_only_the_collector_submits_and_collects_batch_jobs(synth: Synth, name: str) -> None:
    """No role lists batch jobs (no code does: the collector finds its jobs in its manifests);
    Stop only on jobs carrying this stack's tag, TagResource only with that tag's value (the tag every job is created
    with: Bedrock checks TagResource on a create with tags); the sweeper holds no batch grant any more."""
    t = synth.templates[name]
    roles = ["intake", "worker", "aggregator", "sweeper", "collector", "api", "batch"] + \
        (["fargate"] if name == FARGATE else [])
    callers = {role: set().union(*(_actions(st) & BATCH_CALLS for st in policy_statements_for_role(t, role_id(t, role))))
               for role in roles}
    assert {r: a for r, a in callers.items() if a} == {"collector": BATCH_CALLS}
    assert not [st for role in roles for st in policy_statements_for_role(t, role_id(t, role))
                if "bedrock:ListModelInvocationJobs" in _actions(st)]
    jobs = {"Fn::Join": ["", JOBS]}
    by_action: dict[str, list[dict[str, Any]]] = {}
    for st in policy_statements_for_role(t, role_id(t, "collector")):
        for action in _actions(st) & BATCH_CALLS:
            by_action.setdefault(action, []).append(st)
    (create,) = by_action["bedrock:CreateModelInvocationJob"]  # the jobs of this account and region, the stack's model
    assert jobs in create["Resource"] and "Condition" not in create
    assert all(":foundation-model/" in json.dumps(r) or ":inference-profile/" in json.dumps(r)
               for r in create["Resource"] if r != jobs), create
    (get,) = by_action["bedrock:GetModelInvocationJob"]
    assert (_actions(get), get["Resource"], get.get("Condition")) == ({"bedrock:GetModelInvocationJob"}, jobs, None)
    (stop,) = by_action["bedrock:StopModelInvocationJob"]
    assert (_actions(stop), stop["Resource"]) == ({"bedrock:StopModelInvocationJob"}, jobs)
    assert stop["Condition"] == {"StringEquals": {f"aws:ResourceTag/{TAG_KEY}": name}}  # the stack name
    (tag,) = by_action["bedrock:TagResource"]
    assert (_actions(tag), tag["Resource"]) == ({"bedrock:TagResource"}, jobs)
    assert tag["Condition"] == {"StringEquals": {f"aws:RequestTag/{TAG_KEY}": name}}


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_collector_alone_is_told_the_service_role_and_the_stacks_tag(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    service_role = {"Fn::GetAtt": [batch_service_role_id(t), "Arn"]}
    for handler in ("intake", "worker", "aggregator", "sweeper", "collector", "api"):
        _, fn = function_by_handler(t, f"{handler}.handler")
        env = fn["Environment"]["Variables"]
        assert env.get("BATCH_ROLE_ARN") == (service_role if handler == "collector" else None), handler
        assert env.get("STACK_TAG") == (name if handler == "collector" else None), handler  # the review-stack tag
        assert "BEDROCK_BATCH_ENDPOINT_URL" not in env  # AWS: the bedrock client's own endpoint
    for task in resources(t, "AWS::ECS::TaskDefinition").values():
        for c in task["Properties"]["ContainerDefinitions"]:
            assert not {"BATCH_ROLE_ARN", "BEDROCK_BATCH_ENDPOINT_URL", "STACK_TAG"} & {
                e["Name"] for e in c.get("Environment", [])}
    _, collector = function_by_handler(t, "collector.handler")
    assert {"Key": TAG_KEY, "Value": name} in collector["Tags"]  # STACK_TAG is the value of the stack's own tag
    assert t["Outputs"]["BatchRoleArn"]["Value"] == service_role  # the CLI's view (Settings.from_outputs)


@pytest.mark.parametrize("name", TEMPLATES)
def test_workers_hand_over_pending_records_and_read_answers_and_nothing_else_of_batch(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    for role in ["worker"] + (["fargate"] if name == FARGATE else []):
        granted: dict[str, set[str]] = {}
        for st in policy_statements_for_role(t, role_id(t, role)):
            for resource in st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]:
                text = json.dumps(resource)
                if "/batch/" in text:
                    granted.setdefault(text, set()).update(_actions(st))
        assert granted == {json.dumps(_objects(t, "batch/pending/")): {"s3:PutObject"},
                           json.dumps(_objects(t, "batch/answers/")): {"s3:GetObject"}}, role
