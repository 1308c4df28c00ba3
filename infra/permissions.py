"""Least-privilege grants, written out action by action.

The CDK `grant_*` helpers for S3 and for tables with indexes emit wildcard actions
(`s3:GetObject*`, `s3:List*`) and `<table>/index/*` resources; these helpers list exactly what
the code calls, so the only wildcard left is the unavoidable `<bucket-arn>/*` object resource.
SQS grants use the CDK helpers (they are already explicit).
"""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs

DDB_READ = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:Scan",
    "dynamodb:ConditionCheckItem",
    "dynamodb:DescribeTable",
)
DDB_WRITE = (
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
)
S3_OBJECT_READ = ("s3:GetObject",)
S3_BUCKET_READ = ("s3:ListBucket",)  # lets a missing key answer 404 (NoSuchKey), not 403
S3_OBJECT_WRITE = ("s3:PutObject", "s3:AbortMultipartUpload")
SQS_PEEK = ("sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")

# Cross-region inference profile ids carry a geography prefix (us.anthropic..., eu.amazon...).
_INFERENCE_PROFILE_PREFIXES = ("us.", "eu.", "apac.", "us-gov.", "jp.", "au.", "ca.", "global.")


def grant_table(grantee: iam.IGrantable, table: dynamodb.Table, *, write: bool, indexes: Iterable[str] = ()) -> None:
    actions = DDB_READ + (DDB_WRITE if write else ())
    resources = [table.table_arn, *(f"{table.table_arn}/index/{name}" for name in indexes)]
    iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=resources)


def grant_bucket(grantee: iam.IGrantable, bucket: s3.IBucket, *, write: bool) -> None:
    iam.Grant.add_to_principal(grantee=grantee, actions=list(S3_BUCKET_READ), resource_arns=[bucket.bucket_arn])
    actions = S3_OBJECT_READ + (S3_OBJECT_WRITE if write else ())
    iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=[bucket.arn_for_objects("*")])


def grant_peek(grantee: iam.IGrantable, queue: sqs.IQueue) -> None:
    """Receive (and re-hide) without delete: the sweeper reads the DLQ, operators drain it."""
    iam.Grant.add_to_principal(grantee=grantee, actions=list(SQS_PEEK), resource_arns=[queue.queue_arn])


def is_inference_profile(model_id: str) -> bool:
    return model_id.startswith(_INFERENCE_PROFILE_PREFIXES)


def bedrock_model_arns(stack: Stack, model_id: str) -> list[str]:
    """ARNs `bedrock:InvokeModel` (Converse) needs for `model_id`.

    A foundation-model id needs only the model in this region. An inference-profile id needs the
    profile (this account, this region) and the underlying model in every region the profile
    routes to, which IAM can only express with a region wildcard.
    """
    if not is_inference_profile(model_id):
        return [_foundation_model_arn(stack, model_id, stack.region)]
    base = model_id.split(".", 1)[1]
    return [
        stack.format_arn(
            service="bedrock",
            resource="inference-profile",
            resource_name=model_id,
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        ),
        _foundation_model_arn(stack, base, "*"),
    ]


def _foundation_model_arn(stack: Stack, model_id: str, region: str) -> str:
    return stack.format_arn(
        service="bedrock",
        region=region,
        account="",
        resource="foundation-model",
        resource_name=model_id,
        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
    )


def grant_bedrock(grantee: iam.IGrantable, stack: Stack, model_id: str) -> None:
    iam.Grant.add_to_principal(
        grantee=grantee, actions=["bedrock:InvokeModel"], resource_arns=bedrock_model_arns(stack, model_id)
    )
