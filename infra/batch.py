"""Bedrock batch inference in the stack (docs/batch-inference.md, docs/infrastructure.md "Batch inference"):

- the service role Bedrock assumes to run our batch jobs (`BatchServiceRole`): trusted by bedrock.amazonaws.com only
  for model invocation jobs of this account in this region (`aws:SourceAccount`, `aws:SourceArn`); it reads the
  records under batch/input/ and writes the answers under batch/output/ of the artifacts bucket, nothing else of it;
  with an inference profile it may also invoke the profile and the model it routes to (Bedrock's "Create a custom
  service role for batch inference": https://docs.aws.amazon.com/bedrock/latest/userguide/batch-iam-sr.html);
- `grant_batch_submit`: what the function that submits and collects batch jobs (the batch collector) needs on Bedrock's
  control plane, and `iam:PassRole` on exactly that role, only to Bedrock. It creates each job with the stack's tag
  (`review-stack` = the stack name) and may stop only the jobs that carry it.

The artifacts bucket is encrypted with SSE-S3 (infra/storage.py): no KMS key to grant. A customer-managed key would
need kms:Decrypt (input) and kms:GenerateDataKey (output) on the role, through S3 (`kms:ViaService`).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract_review.domain.keys import BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id, is_inference_profile

from .permissions import QUOTA_READ, _describe_statements, foundation_model_arn, profile_arn

BEDROCK_SERVICE = "bedrock.amazonaws.com"
# Bedrock's control plane for batch jobs, as the collector calls it (adapters/batch_inference.py): create a job (tagged
# at create: TagResource, Bedrock's tag-on-create check), read it, stop one none of whose records is still wanted.
# No ListModelInvocationJobs: the collector finds its jobs in its manifests, never by listing.
CREATE_JOB, GET_JOB, STOP_JOB, TAG = ("bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob",
                                      "bedrock:StopModelInvocationJob", "bedrock:TagResource")


def job_arns(stack: Stack) -> str:
    """Every model invocation job of this account in this region: Bedrock names a job's id when it creates it."""
    return stack.format_arn(service="bedrock", resource="model-invocation-job", resource_name="*",
                            arn_format=ArnFormat.SLASH_RESOURCE_NAME)


def _profile_model_regions(stack: Stack, model_id: str) -> list[str]:
    """The regions of the foundation model an inference profile routes to, as IAM can say them: a global profile's
    model in this region and its region-less ARN; a geographic profile's in any region (its destinations depend on the
    source region and grow over time)."""
    return [stack.region, ""] if model_id.startswith(GLOBAL_PROFILE_PREFIX) else ["*"]


class BatchServiceRole(Construct):
    """The role Bedrock assumes to run this stack's batch jobs (CreateModelInvocationJob `roleArn`)."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, model_id: str) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        principal = iam.ServicePrincipal(BEDROCK_SERVICE).with_conditions({
            "StringEquals": {"aws:SourceAccount": stack.account},
            "ArnLike": {"aws:SourceArn": job_arns(stack)},
        })
        self.role = iam.Role(self, "Role", assumed_by=principal,
                             description="Bedrock batch inference: reads batch/input/, writes batch/output/ of the "
                                         "artifacts bucket (contract-review)")
        self.statements = [
            # the records: the JSONL files under the job's input URI (Bedrock lists the folder, then reads each file)
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{BATCH_INPUT_PREFIX}*")]),
            # AWS's example role lists the output prefix too (Bedrock may look at the output folder before writing)
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
                                conditions={"StringLike": {"s3:prefix": [f"{BATCH_INPUT_PREFIX}*",
                                                                         f"{BATCH_OUTPUT_PREFIX}*"]}}),
            # the answers and the manifest, under the job's output URI
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[bucket.arn_for_objects(f"{BATCH_OUTPUT_PREFIX}*")]),
            *invoke_statements(stack, model_id),
        ]
        for statement in self.statements:
            self.role.add_to_policy(statement)


def invoke_statements(stack: Stack, model_id: str) -> list[iam.PolicyStatement]:
    """What the service role invokes: nothing for a foundation-model id (Bedrock's page asks for S3 only); with an
    inference profile, `bedrock:InvokeModel` on the profile and on the model in each region it routes to (the
    page's "Permissions to run batch inference with inference profiles", which names no condition key)."""
    if not is_inference_profile(model_id):
        return []
    base = base_model_id(model_id)
    return [iam.PolicyStatement(
        actions=["bedrock:InvokeModel"],
        resources=[profile_arn(stack, model_id)] + [foundation_model_arn(stack, base, region)
                                                     for region in _profile_model_regions(stack, model_id)])]


def submit_statements(stack: Stack, role: iam.IRole, model_id: str, tag: tuple[str, str]) -> list[iam.PolicyStatement]:
    """The submitter's grants: create a job of this stack's model (the job, and the model or profile it names: the
    Service Authorization Reference checks both) carrying the stack's `tag` (TagResource, only with that tag's value:
    `aws:RequestTag`), read its jobs (by the ARN its manifest names), stop only jobs carrying the tag
    (`aws:ResourceTag`), and pass the service role to Bedrock only (`iam:PassedToService`)."""
    key, value = tag
    model = ([profile_arn(stack, model_id)] if is_inference_profile(model_id) else []) + \
        [foundation_model_arn(stack, base_model_id(model_id), stack.region)]
    return [
        iam.PolicyStatement(actions=[CREATE_JOB], resources=[job_arns(stack), *model]),
        iam.PolicyStatement(actions=[TAG], resources=[job_arns(stack)],
                            conditions={"StringEquals": {f"aws:RequestTag/{key}": value}}),
        iam.PolicyStatement(actions=[GET_JOB], resources=[job_arns(stack)]),
        iam.PolicyStatement(actions=[STOP_JOB], resources=[job_arns(stack)],
                            conditions={"StringEquals": {f"aws:ResourceTag/{key}": value}}),
        iam.PolicyStatement(actions=["iam:PassRole"], resources=[role.role_arn],
                            conditions={"StringEquals": {"iam:PassedToService": BEDROCK_SERVICE}}),
        # the minimum records per batch job, read once (wiring.batch_min_records): the model's name as Service
        # Quotas names it (GetFoundationModel, GetInferenceProfile), then its quota (no resource ARN: "*")
        *_describe_statements(stack, model_id), QUOTA_READ,
    ]


def grant_batch_submit(grantee: iam.IGrantable, stack: Stack, role: iam.IRole, model_id: str, *,
                       tag: tuple[str, str]) -> None:
    for statement in submit_statements(stack, role, model_id, tag):
        grantee.grant_principal.add_to_principal_policy(statement)
