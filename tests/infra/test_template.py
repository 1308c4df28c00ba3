"""Behaviour of the synthesized template (local and prod profiles)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract_review.config.constants import LAMBDA_VISIBILITY_FACTOR
from contract_review.config.settings import ENV, RESOURCES
from infra.stack import API_TIMEOUT_S

from .conftest import (
    FARGATE,
    LOCAL,
    ONLY_WHEN_GIVEN,
    PROD,
    Synth,
    function_by_handler,
    getatt_id,
    props,
    queues,
    resources,
    source_queues,
)

STACKS = [LOCAL, PROD]
REQUIRED_OUTPUTS = {
    "IntakeQueueUrl", "IntakeDlqUrl", "AnalysisQueueUrl", "AnalysisDlqUrl", "ResultsQueueUrl", "ResultsDlqUrl",
    "JobsTableName", "ClaimsTableName", "CheckpointsTableName", "EventsTableName", "ArtifactBucketName",
    "IdempotencyTableName", "JobEventsTopicArn", "CompensationDlqUrl",  # the side effects (infra/side_effects.py)
    "ControlTableName",  # the runtime control: `review quota` (adapters/model_control.py)
    "TokenLedgerTableName",  # the daily token ledger (adapters/token_ledger.py)
}
OTHER_OUTPUTS = {
    "IntakeQueueArn", "AnalysisQueueArn", "ResultsQueueArn", "IntakeFunctionName", "WorkerFunctionName",
    "AggregatorFunctionName", "SweeperFunctionName", "CollectorFunctionName", "ProfileName", "WorkerKind", "ModelProvider", "ModelId",
    "AlarmTopicArn", "DashboardName", "ApiFunctionName", "ApiUrl", "QueueUploadsPrefix", "ReservedConcurrency",
    "TicketUrl", "TicketSecretArn",  # every test stack names a ticket system and its secret (conftest)
    "BatchRoleArn",  # the role Bedrock assumes for batch inference (infra/batch.py)
    "NoticeTopicArn",  # the alarms that page no one (infra/monitoring.py)
    "SdkLayerArn",  # the functions' SDK layer (infra/sdk_layer.py; review preflight reads its description)
}
FOURTEEN_DAYS_S = 1_209_600


@pytest.fixture(params=STACKS)
def each_template(request: pytest.FixtureRequest, synth: Synth) -> tuple[str, dict[str, Any]]:
    """(name, template) of each synthesized stack in turn."""
    return request.param, synth.templates[request.param]


# ---------------------------------------------------------------------- queues
def test_every_queue_has_a_dlq_with_the_profiles_receive_count(each_template: tuple[str, dict], synth: Synth) -> None:
    name, t = each_template
    all_queues = queues(t)
    sources = source_queues(t)
    # + the compensation DLQ (infra/side_effects.py): the saga dead-letters compensations to it itself
    compensation = {q for q in all_queues if q.startswith("SideEffectsCompensationDlq")}
    assert len(all_queues) == 7 and len(sources) == 3 and len(compensation) == 1
    assert all_queues[next(iter(compensation))]["MessageRetentionPeriod"] == FOURTEEN_DAYS_S
    dlq_ids = set(compensation)
    for qid, p in sources.items():
        redrive = p["RedrivePolicy"]
        assert redrive["maxReceiveCount"] == synth.profiles[name].queues.max_receive_count == 5, qid
        dlq_id = getatt_id(redrive["deadLetterTargetArn"])
        assert dlq_id in all_queues and dlq_id not in sources
        dlq_ids.add(dlq_id)
    assert dlq_ids == set(all_queues) - set(sources), "every non-source queue is some queue's DLQ"


def test_queues_that_hold_work_keep_it_14_days(each_template: tuple[str, dict]) -> None:
    # a burst waits its turn in the queue (bench/burst_sim.py): intake, analysis and results keep a message
    # as long as SQS allows, so a backlog is never lost to retention
    _, t = each_template
    sources = source_queues(t)
    assert {p["QueueName"].split("-")[-1] for p in sources.values()} == {"intake", "analysis", "results.fifo"}
    assert {qid: p["MessageRetentionPeriod"] for qid, p in sources.items()} == dict.fromkeys(sources, FOURTEEN_DAYS_S)


def test_dlq_retention_is_14_days_and_not_shorter_than_the_queue(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    all_queues = queues(t)
    for qid, p in source_queues(t).items():
        dlq = all_queues[getatt_id(p["RedrivePolicy"]["deadLetterTargetArn"])]
        assert dlq["MessageRetentionPeriod"] == FOURTEEN_DAYS_S
        assert dlq["MessageRetentionPeriod"] >= p["MessageRetentionPeriod"], qid


def test_queues_are_encrypted_and_tls_only(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    for qid, p in queues(t).items():
        assert p["SqsManagedSseEnabled"] is True, qid
    denied = set()
    for pol in resources(t, "AWS::SQS::QueuePolicy").values():
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            if st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}:
                denied.update(getatt_id(q) for q in pol["Properties"]["Queues"])
    assert denied == set(queues(t))


def test_results_queue_and_its_dlq_are_fifo_with_explicit_names(each_template: tuple[str, dict]) -> None:
    name, t = each_template
    fifo = {qid: p for qid, p in queues(t).items() if p.get("FifoQueue")}
    assert len(fifo) == 2
    names = {p["QueueName"] for p in fifo.values()}
    assert names == {f"{name}-results.fifo", f"{name}-results-dlq.fifo"}
    for p in fifo.values():
        assert p.get("ContentBasedDeduplication", False) is False  # we send explicit dedup ids
    results = next(p for p in fifo.values() if "RedrivePolicy" in p)
    assert getatt_id(results["RedrivePolicy"]["deadLetterTargetArn"]) in fifo
    # every pipeline queue is named after the stack (a DLQ's redrive-allow policy names its source by ARN); the
    # compensation DLQ, retained, has a generated name (test_failed_create.py)
    assert {p.get("QueueName") for p in queues(t).values()} == {
        f"{name}-{purpose}{dlq}{'.fifo' if purpose == 'results' else ''}"
        for purpose in ("intake", "analysis", "results") for dlq in ("", "-dlq")} | {None}


def test_each_dlq_accepts_redrives_from_its_own_source_queue_only(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    all_queues = queues(t)
    for p in source_queues(t).values():
        dlq = all_queues[getatt_id(p["RedrivePolicy"]["deadLetterTargetArn"])]
        allow = dlq["RedriveAllowPolicy"]
        assert allow["redrivePermission"] == "byQueue"
        (source,) = allow["sourceQueueArns"]
        # arn:<partition>:sqs:<region>:<account>:<the source queue's name>, built from the name (no cycle)
        assert source["Fn::Join"][1][-1] == f":{p['QueueName']}", source
        assert "AWS::Region" in json.dumps(source) and "AWS::AccountId" in json.dumps(source)
    for p in source_queues(t).values():
        assert "RedriveAllowPolicy" not in p


def _esm_pairs(t: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(mapping, queue props, function props) for every SQS event source mapping."""
    out = []
    for r in resources(t, "AWS::Lambda::EventSourceMapping").values():
        p = r["Properties"]
        out.append((p, props(t, getatt_id(p["EventSourceArn"])), props(t, getatt_id(p["FunctionName"]))))
    return out


def test_visibility_is_at_least_six_times_the_consumer_timeout(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    pairs = _esm_pairs(t)
    assert len(pairs) == 3
    for _, q, fn in pairs:
        assert q["VisibilityTimeout"] >= LAMBDA_VISIBILITY_FACTOR * fn["Timeout"], fn["Handler"]


def test_visibility_and_timeouts_come_from_the_profile(each_template: tuple[str, dict], synth: Synth) -> None:
    name, t = each_template
    p = synth.profiles[name]
    expected = {
        "intake.handler": (p.functions.intake_timeout_s, p.queues.intake_visibility_s, p.functions.intake_batch_size),
        "worker.handler": (p.functions.worker_timeout_s, p.queues.analysis_visibility_s, p.functions.worker_batch_size),
        "aggregator.handler": (p.functions.aggregator_timeout_s, p.queues.results_visibility_s, p.functions.aggregator_batch_size),
    }
    seen = set()
    for esm, q, fn in _esm_pairs(t):
        key = fn["Handler"].rsplit(".", 2)[-2] + ".handler"
        timeout, visibility, batch = expected[key]
        assert (fn["Timeout"], q["VisibilityTimeout"], esm["BatchSize"]) == (timeout, visibility, batch), key
        seen.add(key)
    assert seen == set(expected)


def test_event_source_mappings_report_partial_batch_failures(each_template: tuple[str, dict], synth: Synth) -> None:
    name, t = each_template
    for esm, _, fn in _esm_pairs(t):
        assert esm["FunctionResponseTypes"] == ["ReportBatchItemFailures"], fn["Handler"]
        if fn["Handler"].endswith("worker.handler"):
            assert esm["ScalingConfig"] == {"MaximumConcurrency": synth.profiles[name].functions.worker_max_concurrency}
        elif fn["Handler"].endswith("intake.handler"):
            assert esm["ScalingConfig"] == {"MaximumConcurrency": synth.profiles[name].functions.intake_max_concurrency}
        else:
            assert "ScalingConfig" not in esm


def test_concurrency_guards_intake_capped_and_the_lambda_worker_reserving_its_maximum(
        each_template: tuple[str, dict], synth: Synth) -> None:
    """A burst waits in its queue instead of taking the account's unreserved concurrency: the intake mapping has a
    maximum concurrency, and the Lambda worker reserves exactly the maximum its mapping may use (no more, so the
    account keeps the rest; no less, or the mapping would be throttled). A Fargate stack's worker function has no
    mapping and reserves nothing. The sweeper and the batch collector reserve 1 each (one run at a
    time). The ReservedConcurrency output, all of them, is what `review preflight` checks the account against."""
    name, t = each_template
    functions = synth.profiles[name].functions
    reserved = {fn["Handler"].rsplit(".", 2)[-2]: fn.get("ReservedConcurrentExecutions")
                for fn in (r["Properties"] for r in resources(t, "AWS::Lambda::Function").values())
                if fn.get("Handler", "").startswith("contract_review.handlers.")}
    fargate = bool(resources(t, "AWS::ECS::Service"))
    want = None if fargate else functions.worker_max_concurrency
    assert reserved == {"intake": None, "worker": want, "aggregator": None, "sweeper": 1, "collector": 1, "api": None}
    assert t["Outputs"]["ReservedConcurrency"]["Value"] == str((want or 0) + 2)
    assert 2 <= functions.intake_max_concurrency <= 1000


def test_one_dead_letter_raises_the_dlq_alarm(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    alarms = [a["Properties"] for a in resources(t, "AWS::CloudWatch::Alarm").values()
              if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"]
    dlqs = {getatt_id(p["RedrivePolicy"]["deadLetterTargetArn"]) for p in source_queues(t).values()}
    dlqs |= {q for q in queues(t) if q.startswith("SideEffectsCompensationDlq")}  # one dead compensation: alarm
    watched = set()
    for p in alarms:
        assert p["Namespace"] == "AWS/SQS" and p["Statistic"] == "Maximum"
        assert p["Threshold"] == 1 and p["Period"] == 60 and p["EvaluationPeriods"] == 1
        assert p["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert p["TreatMissingData"] == "notBreaching"
        (dim,) = p["Dimensions"]
        watched.add(getatt_id(dim["Value"]))
    assert len(alarms) == 4 and watched == dlqs


# ---------------------------------------------------------------------- tables
TABLE_KEYS = {
    "TablesJobsTable": (["job_id"], "expires_at"),
    "TablesClaimsTable": (["job_id", "chunk_id"], "expires_at"),
    "TablesCheckpointsTable": (["pk", "analyst"], "expires_at"),
    "TablesEventsTable": (["job_id", "seq"], "expires_at"),
    "SideEffectsIdempotencyTable": (["id"], "expiration"),  # Powertools idempotency's attribute names
    "TablesTokenLedgerTable": (["model", "hour"], "expires_at"),  # the daily token ledger: `hour` is a number
    "TablesControlTable": (["control"], "expires_at"),  # the runtime control: one item, never expiring
}
NUMBER_KEYS = {"hour"}


def _tables(t: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    out = {}
    for lid, r in resources(t, "AWS::DynamoDB::Table").items():
        prefix = next(k for k in TABLE_KEYS if lid.startswith(k))
        out[prefix] = (lid, r)
    return out


def test_no_global_tables(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    assert not resources(t, "AWS::DynamoDB::GlobalTable")  # moto cannot create them (TableV2)
    assert len(resources(t, "AWS::DynamoDB::Table")) == 7  # jobs, claims, checkpoints, events, idempotency, ledger,
    # the runtime control


def test_table_keys_ttl_pitr_billing_encryption(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    tables = _tables(t)
    assert set(tables) == set(TABLE_KEYS)
    for prefix, (lid, r) in tables.items():
        p = r["Properties"]
        keys, ttl = TABLE_KEYS[prefix]
        assert [k["AttributeName"] for k in p["KeySchema"]] == keys, lid
        assert all(d["AttributeType"] == ("N" if d["AttributeName"] in NUMBER_KEYS else "S")
                   for d in p["AttributeDefinitions"] if d["AttributeName"] in keys)
        assert p["TimeToLiveSpecification"] == {"AttributeName": ttl, "Enabled": True}, lid
        assert p["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}, lid
        assert p["BillingMode"] == "PAY_PER_REQUEST", lid
        assert p["SSESpecification"] == {"SSEEnabled": True}, lid  # AWS-managed KMS key


def test_claims_by_lease_gsi(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    _, claims = _tables(t)["TablesClaimsTable"]
    p = claims["Properties"]
    (gsi,) = p["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "by-lease"
    assert gsi["KeySchema"] == [
        {"AttributeName": "lease_bucket", "KeyType": "HASH"},
        {"AttributeName": "claim_expires_at", "KeyType": "RANGE"},
    ]
    assert gsi["Projection"] == {"ProjectionType": "ALL"}
    types = {d["AttributeName"]: d["AttributeType"] for d in p["AttributeDefinitions"]}
    assert types["lease_bucket"] == "S" and types["claim_expires_at"] == "N"


def test_jobs_by_open_state_gsi(each_template: tuple[str, dict]) -> None:
    """The sweeper's sparse index of open jobs (only non-terminal jobs carry `open_state`), keys only."""
    _, t = each_template
    _, jobs = _tables(t)["TablesJobsTable"]
    p = jobs["Properties"]
    (gsi,) = p["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "by-open-state"
    assert gsi["KeySchema"] == [
        {"AttributeName": "open_state", "KeyType": "HASH"},
        {"AttributeName": "updated_at", "KeyType": "RANGE"},
    ]
    assert gsi["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    types = {d["AttributeName"]: d["AttributeType"] for d in p["AttributeDefinitions"]}
    assert types["open_state"] == "S" and types["updated_at"] == "N"


@pytest.mark.parametrize("name,policy,bucket_policy", [(LOCAL, "Delete", "Delete"),
                                                      (PROD, "Retain", "RetainExceptOnCreate")])
def test_removal_policy_follows_the_profile(synth: Synth, name: str, policy: str, bucket_policy: str) -> None:
    """Tables and buckets are kept on delete and replacement in prod; a bucket is deleted when its own create fails
    (test_failed_create.py), a deletion-protected table is not."""
    t = synth.templates[name]
    tables, buckets = resources(t, "AWS::DynamoDB::Table").values(), resources(t, "AWS::S3::Bucket").values()
    assert tables and all(r["DeletionPolicy"] == policy and r["UpdateReplacePolicy"] == policy for r in tables)
    assert buckets and all(r["DeletionPolicy"] == bucket_policy and r["UpdateReplacePolicy"] == policy
                           for r in buckets)
    for r in tables:
        assert r["Properties"]["DeletionProtectionEnabled"] is (policy == "Retain")
    # auto-delete is opt-in (its custom resource cannot run in moto)
    assert not resources(t, "Custom::S3AutoDeleteObjects")


# ---------------------------------------------------------------------- bucket
def test_artifact_bucket_is_private_encrypted_versioned_tls_only(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    buckets = resources(t, "AWS::S3::Bucket")
    art_id = next(k for k in buckets if k.startswith("StorageArtifacts"))
    p = buckets[art_id]["Properties"]
    assert p["VersioningConfiguration"] == {"Status": "Enabled"}
    assert p["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    (enc,) = p["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert enc["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert "LoggingConfiguration" in p
    tls_only = set()
    for pol in resources(t, "AWS::S3::BucketPolicy").values():
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            if st["Effect"] == "Deny" and st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}:
                tls_only.add(getatt_id(pol["Properties"]["Bucket"]))
    assert tls_only == set(buckets)


@pytest.mark.parametrize("name", STACKS)
def test_every_artifact_expires_with_its_job_record(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    ttl_days = synth.profiles[name].record_ttl_days
    art_id = next(k for k in resources(t, "AWS::S3::Bucket") if k.startswith("StorageArtifacts"))
    rules = {r["Id"]: r for r in props(t, art_id)["LifecycleConfiguration"]["Rules"]}
    # GIVEN every prefix the code writes (records.*_key) ...
    for prefix in ("uploads/", "documents/", "findings/", "reports/", "checkpoints/", "submissions/", "batches/",
                   "batch/"):
        rule = rules[f"expire-{prefix.rstrip('/')}"]
        # ... THEN it expires a day after the job record's TTL (DynamoDB deletes expired records late)
        assert rule["Prefix"] == prefix and rule["Status"] == "Enabled"
        assert rule["ExpirationInDays"] == ttl_days + 1, prefix
        assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 7}, prefix
    assert rules["remove-expired-delete-markers"]["ExpiredObjectDeleteMarker"] is True
    assert rules["expire-noncurrent-versions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    from contract_review.domain import keys as records

    written = {records.document_key("j"), records.upload_key("j"), records.findings_key("j", 0, "c", 1),
               records.checkpoint_key("j", "c", "a", 1), *records.report_keys("j"),
               records.submission_key("j"), records.batch_key("b"), records.plan_key("j"),  # the Job API's, fan-out's
               # batch inference: the worker's hand-off, the answers, the collector's jobs, Bedrock's input and output
               *(f"{p}x" for p in (records.BATCH_PENDING_PREFIX, records.BATCH_ANSWERS_PREFIX,
                                   records.BATCH_JOBS_PREFIX, records.BATCH_INPUT_PREFIX, records.BATCH_OUTPUT_PREFIX))}
    assert {k.split("/", 1)[0] + "/" for k in written} == {r["Prefix"] for r in rules.values() if "Prefix" in r}


# ---------------------------------------------------------------------- functions
HANDLERS = ["intake", "worker", "aggregator", "sweeper", "collector", "api"]


def test_functions_runtime_architecture_handlers_layer(each_template: tuple[str, dict], synth: Synth) -> None:
    name, t = each_template
    p = synth.profiles[name]
    timeouts = {"intake": p.functions.intake_timeout_s, "worker": p.functions.worker_timeout_s,
                "aggregator": p.functions.aggregator_timeout_s, "sweeper": p.functions.sweeper_timeout_s,
                "collector": p.functions.collector_timeout_s, "api": API_TIMEOUT_S}
    assert len(resources(t, "AWS::Lambda::Function")) == len(HANDLERS)
    for h in HANDLERS:
        _, fn = function_by_handler(t, f"contract_review.handlers.{h}.handler")
        assert fn["Handler"] == f"contract_review.handlers.{h}.handler"
        assert fn["Runtime"] == "python3.12" and fn["Architectures"] == ["arm64"]
        assert fn["Timeout"] == timeouts[h]
        # the SDK layer (tests/infra/test_sdk_layer.py) and Powertools: its ARN comes from AWS's public SSM
        # parameter, resolved by CloudFormation at deploy time
        (layer,) = [ref for ref in fn["Layers"] if ref["Ref"] in t.get("Parameters", {})]
        param = t["Parameters"][layer["Ref"]]
        assert param["Type"] == "AWS::SSM::Parameter::Value<String>"
        assert param["Default"] == "/aws/service/powertools/python/arm64/python3.12/3.37.0"
        assert "S3Bucket" in fn["Code"] and "LoggingConfig" in fn
        assert fn["TracingConfig"] == {"Mode": "Active"}
    _, worker = function_by_handler(t, "worker.handler")
    assert worker["MemorySize"] == p.functions.worker_memory_mb
    _, collector = function_by_handler(t, "collector.handler")
    assert collector["MemorySize"] == p.functions.collector_memory_mb


def test_every_function_gets_the_whole_env_contract(each_template: tuple[str, dict], synth: Synth) -> None:
    name, t = each_template
    p = synth.profiles[name]
    expected_provider = "offline" if name == LOCAL else "bedrock"
    for h in HANDLERS:
        _, fn = function_by_handler(t, f"{h}.handler")
        env = fn["Environment"]["Variables"]
        assert set(ENV.values()) - ONLY_WHEN_GIVEN <= set(env), h
        assert ENV["fault_spec"] not in env
        assert env[ENV["profile"]] == p.name
        assert env[ENV["model_provider"]] == expected_provider
        assert env[ENV["model_id"]] == p.review.model_id
        assert env[ENV["worker_kind"]] == "lambda"
        assert env["POWERTOOLS_SERVICE_NAME"] == h
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "ContractReview"
        assert env["LOG_LEVEL"] in ("DEBUG", "INFO")
        # resource names are references into this template, never literals
        for key in ("jobs_table", "claims_table", "bucket", "analysis_queue_url", "analysis_dlq_url"):
            assert isinstance(env[ENV[key]], dict), key


def test_log_groups_have_retention(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    groups = resources(t, "AWS::Logs::LogGroup")
    assert len(groups) == len(HANDLERS) + 1  # one per function, and the Job API's access log
    assert all(g["Properties"]["RetentionInDays"] >= 1 for g in groups.values())
    for h in HANDLERS:
        _, fn = function_by_handler(t, f"{h}.handler")
        assert getatt_id(fn["LoggingConfig"]["LogGroup"]) in groups


# ---------------------------------------------------------------------- outputs
@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_outputs_have_exact_ids(synth: Synth, name: str) -> None:
    outputs = synth.templates[name]["Outputs"]
    # QueueProcessingFargateService adds its own (hashed) outputs for the queue it polls
    generated = {o for o in outputs if name == FARGATE and o.startswith("FargateWorkerService")}
    bedrock = {"ModelProfileArn"} if name != LOCAL else set()  # the application inference profile (infra/inference.py)
    assert set(outputs) - generated == REQUIRED_OUTPUTS | OTHER_OUTPUTS | bedrock  # exact ids: no hash suffix
    assert outputs["ProfileName"]["Value"] == synth.profiles[name].name
    assert outputs["WorkerKind"]["Value"] == ("fargate" if name == FARGATE else "lambda")


def test_required_outputs_are_the_resource_outputs() -> None:
    assert REQUIRED_OUTPUTS == {r.output for r in RESOURCES}


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_every_resource_is_an_output_and_an_env_var_of_every_function(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    outputs = t["Outputs"]
    functions = {lid: fn for lid, fn in resources(t, "AWS::Lambda::Function").items()
                 if fn["Properties"].get("Handler", "").startswith("contract_review.handlers.")}
    assert len(functions) == len(HANDLERS)  # (the Fargate stack also has a CDK custom-resource function of its own)
    envs = {lid: fn["Properties"]["Environment"]["Variables"] for lid, fn in functions.items()}
    for task_def in resources(t, "AWS::ECS::TaskDefinition").values():  # the Fargate poller, when present
        (container,) = [c for c in task_def["Properties"]["ContainerDefinitions"]  # (beside it: the X-Ray daemon)
                        if c.get("Essential", True)]
        envs[container["Name"]] = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert len(envs) == len(HANDLERS) + (1 if name == FARGATE else 0)
    for r in RESOURCES:
        assert r.output in outputs, r.output
        value = outputs[r.output]["Value"]
        assert isinstance(value, dict) and getatt_id(value) in t["Resources"], r.output  # a reference, not a literal
        assert outputs[r.output]["Description"] == r.description
        for who, env in envs.items():
            assert r.env in env, (who, r.env)
            assert env[r.env] == value, (who, r.env)  # the same resource the output names


def test_template_is_environment_agnostic(each_template: tuple[str, dict]) -> None:
    _, t = each_template
    text = json.dumps(t)
    assert "123456789012" not in text
    for region in ("us-east-1", "eu-west-1", "us-west-2"):
        assert region not in text
