"""The artifacts bucket (uploads/, documents/, checkpoints/, findings/, reports/) and its access-log bucket.

Every artifact prefix expires with the job record it belongs to: `record_ttl_days` after writing
plus one day of slack (DynamoDB deletes an expired record up to two days late, and a record must
never point at an object that is already gone). Versioning protects against overwrites: an
overwritten or expired artifact stays recoverable as a noncurrent version for
NONCURRENT_ARTIFACT_DAYS, then goes, and the leftover delete markers are removed. So nothing of a
document outlives its job record by more than about a week.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract_review.domain.keys import PREFIXES  # every key the pipeline writes (domain/keys.py)

from .removal import removal_policy

NONCURRENT_VERSION_DAYS = 30  # anything else in the bucket: old versions go after this
NONCURRENT_ARTIFACT_DAYS = 7  # an overwritten or expired artifact stays recoverable this long
ACCESS_LOG_DAYS = 90


class ArtifactBucket(Construct):
    """Private, SSE-S3, TLS-only, versioned. Destroyed with the stack only for disposable profiles."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        retain: bool,
        artifact_expiry_days: int,
        auto_delete_objects: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = removal_policy(retain)
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
                s3.LifecycleRule(id="remove-expired-delete-markers", expired_object_delete_marker=True),
                *(
                    s3.LifecycleRule(
                        id=f"expire-{prefix.rstrip('/')}",
                        prefix=prefix,
                        expiration=Duration.days(artifact_expiry_days),
                        noncurrent_version_expiration=Duration.days(NONCURRENT_ARTIFACT_DAYS),
                    )
                    for prefix in PREFIXES
                ),
            ],
            removal_policy=removal,
            auto_delete_objects=auto_delete_objects or None,
        )
