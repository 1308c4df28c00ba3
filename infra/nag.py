"""cdk-nag and every acknowledged finding, with its reason, in one place.

cdk-nag 3 runs as a CDK policy-validation plugin (`Validations.of(app).add_plugins(...)`, the
v3 replacement for `Aspects.of(app).add(AwsSolutionsChecks())`): any unacknowledged finding makes
`app.synth()` raise `ValidationFailed` and writes `validation-report.json` into the cloud
assembly, so `cdk synth`, `python app.py` and the infra tests all fail on a new finding.
Acknowledgments use CDK's `Validations.of(construct).acknowledge(...)`; with
`write_suppressions_to_cloud_formation` they are also written into the template metadata
(`cdk_nag.rules_to_suppress`) for auditors. Findings are acknowledged one by one: IAM5 findings
name the exact action or resource (`AwsSolutions-IAM5[Resource::<Bucket.Arn>/*]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, App, CfnElement, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from contract_review.domain.keys import BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id, is_inference_profile

from .functions import PipelineFunction
from .permissions import ACCESS, merged

if TYPE_CHECKING:
    from .stack import ContractReviewStack

REASONS = {
    "L1": (
        "Python 3.12 is pinned on purpose: the Powertools public layer used here is built for "
        "python3.12/arm64 and the Fargate image uses python:3.12-slim, so both workers run the "
        "same interpreter. Moving to a newer runtime is a deliberate upgrade of both."
    ),
    "IAM5-bucket-objects": (
        "S3 object actions (GetObject, PutObject) need an object ARN; each grant is scoped to one key "
        "prefix of this stack's artifacts bucket (uploads/, documents/, findings/, ...), only the prefixes "
        "the role's code reads or writes (infra/permissions.py ACCESS), with explicit actions."
    ),
    "IAM5-xray": (
        "Lambda active tracing: xray:PutTraceSegments and xray:PutTelemetryRecords do not support "
        "resource-level permissions (AWS requires Resource '*'); CDK adds exactly these two actions."
    ),
    "IAM5-xray-batch-quotas": (
        "Lambda active tracing: xray:PutTraceSegments and xray:PutTelemetryRecords do not support "
        "resource-level permissions (AWS requires Resource '*'); and the batch collector reads its model's minimum "
        "records per batch job once per process (wiring.batch_min_records): servicequotas:ListServiceQuotas and "
        "ListAWSDefaultServiceQuotas take no resource ARN (infra/permissions.py QUOTA_READ). Read-only."
    ),
    "IAM5-batch-jobs": (
        "Bedrock names a batch inference job's id when it creates it, so the batch collector's Create, TagResource, "
        "Get and Stop grants are on model-invocation-job/* of this account and region only (no other Bedrock resource "
        "type). Create is held to this stack's model by the same grant; TagResource only with this stack's "
        "review-stack tag value (aws:RequestTag: the tag every job is created with); Stop only on jobs carrying it "
        "(aws:ResourceTag); Get reads the jobs its manifests name."
    ),
    "IAM5-batch-objects": (
        "The Bedrock batch service role reads the records under batch/input/ and writes the answers under "
        "batch/output/ of this stack's artifacts bucket: object actions need an object ARN, scoped to that one "
        "prefix each (infra/batch.py); its ListBucket is held to batch/input/ by an s3:prefix condition."
    ),
    "IAM5-bedrock-batch-profile": (
        "The Bedrock batch service role runs jobs through this stack's geographic inference profile, which routes to "
        "the same foundation model in several regions (which ones depends on the source region and grows over time), "
        "hence the region wildcard on that one model id; only Bedrock can assume the role, for this account's "
        "batch jobs in this region (aws:SourceAccount, aws:SourceArn)."
    ),
    "IAM5-xray-quotas": (
        "Lambda active tracing: xray:PutTraceSegments and xray:PutTelemetryRecords do not support "
        "resource-level permissions (AWS requires Resource '*'); and the sweeper reads its model's quotas each sweep "
        "to publish them for the workers (pipeline/sweeper.py publish_quotas): servicequotas:ListServiceQuotas and "
        "ListAWSDefaultServiceQuotas take no resource ARN (infra/permissions.py QUOTA_READ). Read-only."
    ),
    "IAM5-xray-daemon": (
        "The Fargate task's X-Ray daemon sidecar uploads the poller's traces: xray:PutTraceSegments, "
        "PutTelemetryRecords, GetSamplingRules and GetSamplingTargets do not support resource-level permissions "
        "(AWS requires Resource '*')."
    ),
    "IAM5-task-protection": (
        "ecs:UpdateTaskProtection for scale-in protection: a task's id is only known at run time, so the "
        "resource is every task of this stack's one cluster (task/<cluster>/*), nothing wider."
    ),
    "IAM5-bedrock-profile": (
        "A geographic cross-region inference profile routes to the same foundation model in several "
        "regions (which ones depends on the source region and grows over time); IAM requires the "
        "foundation-model ARN in each, hence the region wildcard. The model id itself is fixed, and the "
        "statement only applies through this stack's inference profile (bedrock:InferenceProfileArn)."
    ),
    "IAM5-ecr-token": (
        "ecr:GetAuthorizationToken does not support resource-level permissions (AWS requires "
        "Resource '*'); image pulls themselves are scoped to the asset repository."
    ),
    "SQS3-compensation-dlq": (
        "The compensation DLQ is itself a dead-letter queue (compensations that exhausted their retries are sent "
        "to it by the saga, with their envelope); nothing consumes it automatically, its alarm fires on one "
        "message, and a DLQ of a DLQ would only hide what it holds."
    ),
    "ECS2": (
        "The environment only carries resource names, queue URLs and the profile name (the same "
        "values the Lambda functions get); no secrets are passed to the container."
    ),
}


def apply(app: App) -> None:
    """Run the AwsSolutions pack on the whole app; any unacknowledged finding fails synth."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True, write_suppressions_to_cloud_formation=True))


def _ack(scope: IConstruct, rule: str, reason_key: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=f"AwsSolutions-{rule}", reason=REASONS[reason_key]))


def _logical_id(stack: Stack, construct: IConstruct) -> str:
    child = construct.node.default_child
    assert isinstance(child, CfnElement)
    return str(stack.resolve(child.logical_id))


def _ref(stack: Stack, construct: IConstruct) -> str:
    """How cdk-nag prints a GetAtt of `construct`'s resource: `<LogicalId.Arn>`."""
    return f"<{_logical_id(stack, construct)}.Arn>"


def acknowledge(stack: ContractReviewStack) -> None:
    """Called at the end of `ContractReviewStack.__init__`, after every resource exists."""
    functions = [c for c in stack.node.find_all() if isinstance(c, PipelineFunction)]
    roles = [f.role for f in functions]
    worker_roles = [stack.worker_fn.role]
    for f in functions:
        _ack(f.function, "L1", "L1")

    fargate = getattr(stack, "fargate", None)
    if fargate is not None:
        task_definition = fargate.task_definition
        roles.append(task_definition.task_role)
        worker_roles.append(task_definition.task_role)
        _ack(task_definition, "ECS2", "ECS2")
        _ack(task_definition.obtain_execution_role(), "IAM5[Resource::*]", "IAM5-ecr-token")

    bucket = _ref(stack, stack.storage.bucket)
    role_access = [(f.role, ACCESS[f.service]) for f in functions]
    if fargate is not None:
        role_access.append((fargate.task_role, ACCESS["fargate"]))
        cluster = _logical_id(stack, fargate.cluster)
        _ack(fargate.task_role, f"IAM5[Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:task/"
                                f"<{cluster}>/*]", "IAM5-task-protection")
    for role, accesses in role_access:  # object grants: one per key prefix the role's code uses
        for target in merged(accesses):
            if target.startswith("objects:"):
                _ack(role, f"IAM5[Resource::{bucket}/{target.removeprefix('objects:')}*]", "IAM5-bucket-objects")
    for f in functions:
        reason = ("IAM5-xray-quotas" if f.role is stack.sweeper_fn.role else
                  "IAM5-xray-batch-quotas" if f.role is stack.collector_fn.role else "IAM5-xray")
        _ack(f.role, "IAM5[Resource::*]", reason)
    if fargate is not None:
        _ack(fargate.task_role, "IAM5[Resource::*]", "IAM5-xray-daemon")

    _ack(stack.side_effects.compensation_dlq, "SQS3", "SQS3-compensation-dlq")

    # batch inference (infra/batch.py): the collector's job grants, the service role's two prefixes
    _ack(stack.collector_fn.role, "IAM5[Resource::arn:<AWS::Partition>:bedrock:<AWS::Region>:<AWS::AccountId>:"
                                  "model-invocation-job/*]", "IAM5-batch-jobs")
    service_role = stack.batch.role
    for prefix in (BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX):
        _ack(service_role, f"IAM5[Resource::{bucket}/{prefix}*]", "IAM5-batch-objects")

    model_id = stack.settings.model_id
    if is_inference_profile(model_id) and not model_id.startswith(GLOBAL_PROFILE_PREFIX):  # global: no wildcard
        any_region = f"IAM5[Resource::arn:<AWS::Partition>:bedrock:*::foundation-model/{base_model_id(model_id)}]"
        for role in worker_roles:
            _ack(role, any_region, "IAM5-bedrock-profile")
        _ack(stack.batch.role, any_region, "IAM5-bedrock-batch-profile")
