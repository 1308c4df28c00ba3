"""Least privilege, read back from the template: each role's policy is exactly its row of
`infra.permissions.ACCESS` plus a short list of grants the platform needs (below, with reasons).
tests/infra/test_role_coverage.py proves the other half: every ACCESS grant is a call the code makes,
and every call the code makes is allowed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.permissions import ACCESS, merged

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
    role_id,
    source_queues,
)

FUNCTION_ROLES = ("intake", "worker", "aggregator", "sweeper")
# What CDK grants a function whose SqsEventSource polls a queue (Lambda polls with the function's role).
ESM_CONSUME = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes",
               "sqs:GetQueueUrl"}
LOGS = {"logs:CreateLogStream", "logs:PutLogEvents"}
XRAY = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}  # active tracing; no resource-level permissions
# Fargate's X-Ray daemon sidecar also reads the sampling rules it proxies to the poller (infra/fargate.py)
XRAY_SAMPLING = {"xray:GetSamplingRules", "xray:GetSamplingTargets"}
# the sweeper's read of its model's quotas (it publishes them for the workers' pacing; the collector's batch minimum
# is infra/batch.py's); Service Quotas' list actions take no resource ARN
QUOTAS = {"servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas"}
# the sweeper's Bedrock batch inference jobs (infra/batch.py): on model-invocation-job/* (and the model, to create one)
BATCH_JOBS = {"bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob", "bedrock:StopModelInvocationJob"}


def _names(t: dict[str, Any]) -> dict[str, str]:
    """Logical id -> ACCESS target name (`table:jobs`, `queue:analysis`, `dlq:analysis`, `bucket`)."""
    out: dict[str, str] = {}
    for lid, r in t["Resources"].items():
        for prefix, name in (("TablesJobsTable", "table:jobs"), ("TablesClaimsTable", "table:claims"),
                             ("TablesCheckpointsTable", "table:checkpoints"), ("TablesEventsTable", "table:events"),
                             ("TablesTokenLedgerTable", "table:token-ledger"), ("TablesControlTable", "table:control"),
                             ("StorageArtifacts", "bucket")):
            if lid.startswith(prefix) and r["Type"] in ("AWS::DynamoDB::Table", "AWS::S3::Bucket"):
                out[lid] = name
        for prefix, name in (("SideEffectsIdempotencyTable", "table:idempotency"),  # infra/side_effects.py
                             ("SideEffectsJobEventsTopic", "topic:job-events"),
                             ("SideEffectsCompensationDlq", "dlq:compensation")):
            if lid.startswith(prefix) and r["Type"] in ("AWS::DynamoDB::Table", "AWS::SNS::Topic", "AWS::SQS::Queue"):
                out[lid] = name
    for qid, p in source_queues(t).items():
        kind = next(k for k in ("intake", "analysis", "results") if qid.lower().startswith(k))
        out[qid] = f"queue:{kind}"
        out[getatt_id(p["RedrivePolicy"]["deadLetterTargetArn"])] = f"dlq:{kind}"
    return out


def _target(resource: Any, names: dict[str, str]) -> str | None:
    """The ACCESS target a statement resource expresses, or None (not one of the stack's data resources)."""
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        return names.get(resource["Fn::GetAtt"][0])
    if isinstance(resource, dict) and "Ref" in resource:  # an SNS topic's ARN is its Ref
        return names.get(resource["Ref"])
    if isinstance(resource, dict) and "Fn::Join" in resource and str(resource["Fn::Join"][1][-1]).endswith(
            ":event-bus/default"):
        return "bus:default"
    if isinstance(resource, dict) and "Fn::Join" in resource:
        sep, parts = resource["Fn::Join"]
        if sep == "" and len(parts) == 2 and isinstance(parts[0], dict) and "Fn::GetAtt" in parts[0]:
            base, suffix = names.get(parts[0]["Fn::GetAtt"][0]), parts[1]
            if base == "bucket" and suffix.startswith("/") and suffix.endswith("*"):
                return f"objects:{suffix[1:-1]}"
            if base and base.startswith("table:") and suffix.startswith("/index/"):
                return f"index:{base.removeprefix('table:')}{suffix.removeprefix('/index')}"
    return None


def _event_source_queue(t: dict[str, Any], role: str) -> str | None:
    if role == "fargate":
        return None
    fn_id, _ = function_by_handler(t, f"{role}.handler")
    for esm in resources(t, "AWS::Lambda::EventSourceMapping").values():
        if getatt_id(esm["Properties"]["FunctionName"]) == fn_id:
            return getatt_id(esm["Properties"]["EventSourceArn"])
    return None


def _granted(t: dict[str, Any], role: str) -> tuple[dict[str, set[str]], list[dict[str, Any]]]:
    """(ACCESS target -> actions granted on it, the statements that are not about a data resource)."""
    names = _names(t)
    by_target: dict[str, set[str]] = {}
    other: list[dict[str, Any]] = []
    for st in policy_statements_for_role(t, role_id(t, role)):
        assert st["Effect"] == "Allow"
        actions = {st["Action"]} if isinstance(st["Action"], str) else set(st["Action"])
        for res in st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]:
            target = _target(res, names)
            if target is None:
                other.append({**st, "Resource": res})
            else:
                by_target.setdefault(target, set()).update(actions)
    return by_target, other


CASES = [(n, r) for n in (LOCAL, PROD) for r in FUNCTION_ROLES] + [(FARGATE, "fargate")]


@pytest.mark.parametrize("name,role", CASES, ids=[f"{n}-{r}" for n, r in CASES])
def test_each_role_is_granted_exactly_its_access_row(synth: Synth, name: str, role: str) -> None:
    t = synth.templates[name]
    by_target, other = _granted(t, role)
    # data resources: exactly ACCESS[role], resource by resource, action by action, plus the event
    # source mapping's polling of its queue (CDK's SqsEventSource grants it; Lambda polls as the function)
    expected = {k: set(v) for k, v in merged(ACCESS[role]).items()}
    esm_queue = _event_source_queue(t, role)
    if esm_queue is not None:
        target = _names(t)[esm_queue]
        expected[target] = expected.get(target, set()) | ESM_CONSUME
    assert by_target == expected
    # everything else: its own log group, X-Ray, the model's quota (the sweeper), the model (infra/permissions.grant_bedrock), task
    # protection, the ticket secret (the roles that call the ticket system; test_role_coverage.py asserts which secret)
    for st in other:
        actions = {st["Action"]} if isinstance(st["Action"], str) else set(st["Action"])
        text = json.dumps(st["Resource"])
        if actions <= LOGS:
            assert role != "fargate" and getatt_id(st["Resource"]).startswith(f"{role.title()}FnLogs"), st
        elif actions <= XRAY | XRAY_SAMPLING | QUOTAS | {"bedrock:ListModelInvocationJobs"}:
            assert st["Resource"] == "*", st
            assert "bedrock:ListModelInvocationJobs" not in actions or role == "sweeper", st
            assert not actions & XRAY_SAMPLING or role == "fargate", st
            # the sweeper reads the model's quotas and publishes them: no worker reads Service Quotas
            assert not actions & QUOTAS or role == "sweeper", st
        elif actions <= BATCH_JOBS:  # the sweeper submits and collects batch inference jobs (infra/batch.py)
            assert role == "sweeper", st
            assert ":model-invocation-job/*" in text or actions == {"bedrock:CreateModelInvocationJob"} and (
                ":foundation-model/" in text or ":inference-profile/" in text), st
        elif actions == {"iam:PassRole"}:  # the batch service role, to Bedrock only (test_batch_iam.py)
            assert role == "sweeper" and st["Condition"] == {
                "StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}, st
        elif actions <= {"bedrock:GetFoundationModel", "bedrock:GetInferenceProfile"}:  # the model's name (quotas)
            assert role in ("worker", "fargate", "sweeper") and ":bedrock:" in text, st
        elif all(a.startswith("bedrock:") for a in actions):  # the model; or the stack's application profile's ARN
            assert role in ("worker", "fargate") and (":bedrock:" in text or "ModelProfile" in text), st
        elif actions == {"ecs:UpdateTaskProtection"}:
            assert role == "fargate" and ":task/" in text and text.endswith('"/*"]]}'), st
        elif actions == {"secretsmanager:GetSecretValue"}:  # the ticket system's credentials (grant_ticket_secret)
            assert role in ("aggregator", "sweeper", "fargate") and ":secret:" in text, st
        else:
            raise AssertionError(f"{name} {role}: unexpected grant {st}")


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_no_managed_policies_and_no_action_wildcards(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    roles = [r for r in FUNCTION_ROLES] + (["fargate"] if name == FARGATE else [])
    for role in roles:
        assert "ManagedPolicyArns" not in t["Resources"][role_id(t, role)]["Properties"], role
        for st in policy_statements_for_role(t, role_id(t, role)):
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            assert not any("*" in a for a in actions), (role, actions)


def _ids(t: dict[str, Any]) -> dict[str, str]:
    return {v: k for k, v in _names(t).items()}


def test_fargate_task_role_may_sweep_claims_poll_and_protect_itself(synth: Synth) -> None:
    """Two regressions: the poller's in-process sweep failed with AccessDenied; and the
    poller sweeps lapsed claims only; jobs and the DLQs are the sweeper Lambda's. (It queries the open-jobs index as
    the worker does, for priority only: is an interactive job open? pipeline/priority.py)"""
    t = synth.templates[FARGATE]
    ids = _ids(t)
    st = policy_statements_for_role(t, role_id(t, "fargate"))
    index = [s for s in st if "/index/by-lease" in json.dumps(s["Resource"])]
    assert index and all(s["Action"] == "dynamodb:Query" for s in index)
    open_jobs = [s for s in st if "/index/by-open-state" in json.dumps(s["Resource"])]
    assert all(s["Action"] == "dynamodb:Query" for s in open_jobs)
    # the worker's dead-lettering only: no DLQ reads from every task
    assert {"sqs:SendMessage"} == actions_on(st, ids["dlq:analysis"])
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= actions_on(st, ids["queue:analysis"])
    assert any(s["Action"] == "ecs:UpdateTaskProtection" for s in st)


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_no_role_may_scan_and_the_sweeper_finds_open_jobs_through_a_sparse_index(synth: Synth, name: str) -> None:
    """Every sweep used to scan the jobs table (running, cancelling, compensating, waiting, queued)."""
    t = synth.templates[name]
    roles = list(FUNCTION_ROLES) + ["api"] + (["fargate"] if name == FARGATE else [])
    for role in roles:
        for st in policy_statements_for_role(t, role_id(t, role)):
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            assert "dynamodb:Scan" not in actions, (role, st)
    (jobs,) = [lid for lid in resources(t, "AWS::DynamoDB::Table") if lid.startswith("TablesJobsTable")]
    (gsi,) = t["Resources"][jobs]["Properties"]["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "by-open-state" and gsi["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert gsi["KeySchema"] == [{"AttributeName": "open_state", "KeyType": "HASH"},
                                {"AttributeName": "updated_at", "KeyType": "RANGE"}]
    by_target, _ = _granted(t, "sweeper")
    assert by_target["index:jobs/by-open-state"] == {"dynamodb:Query"}
    assert by_target["table:jobs"] == {"dynamodb:GetItem", "dynamodb:UpdateItem"}


def test_intake_reads_only_the_uploads_prefix_and_the_apis_submission_records(synth: Synth) -> None:
    t = synth.templates[PROD]
    by_target, _ = _granted(t, "intake")
    reads = {target for target, actions in by_target.items() if "s3:GetObject" in actions}
    assert reads == {"objects:uploads/", "objects:submissions/"}
    assert by_target["objects:submissions/"] == {"s3:GetObject"}  # only the Job API writes them
    assert by_target["objects:documents/"] == {"s3:PutObject"}


def test_the_api_reads_and_writes_only_its_callers_own_uploads(synth: Synth) -> None:
    by_target, _ = _granted(synth.templates[PROD], "api")
    assert "objects:uploads/" not in by_target
    assert by_target["objects:uploads/principals/"] == {"s3:GetObject", "s3:PutObject"}


def test_readers_never_write_what_they_only_read(synth: Synth) -> None:
    t = synth.templates[PROD]
    aggregator, _ = _granted(t, "aggregator")
    # PutItem: the conditional create of the next page's chunk records (fan-out); UpdateItem: settling the idle
    # chunks of a job it stops (a cancel or a spent budget ending in the aggregator: lifecycle.finish_cancel)
    assert aggregator["table:claims"] == {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem",
                                          "dynamodb:UpdateItem"}
    sweeper, _ = _granted(t, "sweeper")
    # the sweeper reads the DLQ and deletes only what it handled (a copy it sent again, or one nothing acts on);
    # operators drain the rest (`review dlq redrive`); it never touches the results DLQ
    assert sweeper["dlq:analysis"] == {"sqs:ReceiveMessage", "sqs:SendMessage", "sqs:DeleteMessage"}
    assert "dlq:results" not in sweeper
    assert sweeper["objects:documents/"] == {"s3:GetObject"}
    for role in FUNCTION_ROLES:
        granted, _ = _granted(t, role)
        # DeleteItem only on the idempotency table: Powertools frees the record of a side-effect step that failed
        assert not any("dynamodb:DeleteItem" in a or "dynamodb:BatchWriteItem" in a for target, a in granted.items()
                       if target != "table:idempotency"), role
        assert granted.get("table:idempotency", set()) <= {"dynamodb:PutItem", "dynamodb:UpdateItem",
                                                           "dynamodb:DeleteItem"}, role


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
def test_one_idempotency_table_and_no_grant_on_a_table_outside_the_stack(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    tables = set(resources(t, "AWS::DynamoDB::Table"))
    # the side effects' idempotency table (Powertools' key `id`, TTL `expiration`), used by the saga's roles only
    (idem,) = [lid for lid in tables if lid.startswith("SideEffectsIdempotencyTable")]
    props = t["Resources"][idem]["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
    assert len(tables) == 7
    granted: set[str] = set()
    for pid, pol in resources(t, "AWS::IAM::Policy").items():
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            if not any(a.startswith("dynamodb:") for a in actions):
                continue
            for r in st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]:
                # every DynamoDB resource is an ARN built from one of this stack's tables: no literal
                # ARN, no wildcard, no reference to a table that is not in the template
                refs = _referenced_ids(r)
                assert refs and refs <= tables, (pid, r)
                granted |= refs
    assert granted == tables, "every table is used by some role"


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_the_daily_token_ledger_is_the_workers_alone_encrypted_on_demand_and_expiring(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    (ledger,) = [lid for lid in resources(t, "AWS::DynamoDB::Table") if lid.startswith("TablesTokenLedgerTable")]
    props = t["Resources"][ledger]["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "model", "KeyType": "HASH"},
                                  {"AttributeName": "hour", "KeyType": "RANGE"}]
    assert props["BillingMode"] == "PAY_PER_REQUEST" and props["SSESpecification"]["SSEEnabled"] is True
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    # only the role that runs the worker may touch it: add to a counter, read the window, claim a probe (no Put,
    # no Delete, no Scan); on the Fargate template that is the task role
    holders = {}
    for role in FUNCTION_ROLES + ("api",) + (("fargate",) if name == FARGATE else ()):
        granted, _ = _granted(t, role)
        if "table:token-ledger" in granted:
            holders[role] = granted["table:token-ledger"]
    ledger_actions = {"dynamodb:Query", "dynamodb:UpdateItem"}
    # and the Job API, which only adds within a limit (the spend limits' counters: operate/limits.py), a daily
    # charge with the record of the job it was taken for (PutItem, in the same transaction); the
    # stack's daily spend cap (domain/spend_cap.py): intake takes a job's charge the same way, the aggregator adds
    # what each chunk it counts spent (UpdateItem: ADD), the sweeper reads the day's spend and admits a held job
    charge = {"dynamodb:PutItem", "dynamodb:UpdateItem"}
    assert holders == {"worker": ledger_actions, "api": charge, "intake": charge, "aggregator": {"dynamodb:UpdateItem"},
                       "sweeper": charge | {"dynamodb:GetItem"},
                       **({"fargate": ledger_actions} if name == FARGATE else {})}


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_the_runtime_control_is_a_table_written_by_name_under_a_version_condition(synth: Synth, name: str) -> None:
    """The control was one SSM parameter overwritten whole (a pause racing a set lost one). It is
    an item of its own table now (adapters/model_control.py): readers may only GetItem it; a writer GetItems then
    UpdateItems named fields conditional on the version it read, never PutItem (a whole-item overwrite would drop a
    field another writer, or a later version of the code, owns), never DeleteItem."""
    t = synth.templates[name]
    assert not resources(t, "AWS::SSM::Parameter"), "the control is no SSM parameter any more"
    (control,) = [lid for lid in resources(t, "AWS::DynamoDB::Table") if lid.startswith("TablesControlTable")]
    props = t["Resources"][control]["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "control", "KeyType": "HASH"}]
    holders = {}
    for role in sorted(ACCESS):
        if role == "fargate" and name != FARGATE:
            continue
        granted, _ = _granted(t, role)
        if "table:control" in granted:
            holders[role] = granted["table:control"]
    read, write = {"dynamodb:GetItem"}, {"dynamodb:GetItem", "dynamodb:UpdateItem"}
    # the workers read it before each model call (a pause, a quota); on the Fargate template that is the task role
    assert holders["worker"] == read and (name != FARGATE or holders["fargate"] == read)
    # whoever else holds it (the batch collector: its off switch) reads, or reads and updates
    assert all(actions in (read, write) for actions in holders.values()), holders

