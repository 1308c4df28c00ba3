"""The artifacts bucket (documents/, checkpoints/, findings/, reports/) and its access-log bucket."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

PREFIXES = ("documents/", "checkpoints/", "findings/", "reports/")
NONCURRENT_VERSION_DAYS = 30  # versioning protects against overwrites; old versions go after this
ACCESS_LOG_DAYS = 90


class ArtifactBucket(Construct):
    """Private, SSE-S3, TLS-only, versioned. Destroyed with the stack only for disposable profiles."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        retain: bool,
        checkpoint_expiry_days: int,
        auto_delete_objects: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY
        # auto_delete_objects adds a custom resource (a Lambda) that empties the bucket on
        # delete. moto's CloudFormation cannot run it (it invokes Lambda through Docker), so it
        # is opt-in (`-c auto_delete_objects=true`, local profile only) for real sandboxes.
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,  # log delivery supports SSE-S3 only
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(ACCESS_LOG_DAYS))],
            removal_policy=removal,
            auto_delete_objects=auto_delete_objects or None,
        )
        self.bucket = s3.Bucket(
            self,
            "Artifacts",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-noncurrent-versions",
                    noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                # Checkpoint outputs are only read while their DynamoDB checkpoint record lives
                # (TTL record_ttl_days); one day of slack, then they go.
                s3.LifecycleRule(
                    id="expire-checkpoints",
                    prefix="checkpoints/",
                    expiration=Duration.days(checkpoint_expiry_days),
                ),
            ],
            removal_policy=removal,
            auto_delete_objects=auto_delete_objects or None,
        )
