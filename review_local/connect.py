"""Find a stack (the local one from .review/local.json, or a deployed one by name) and build a Store."""

from __future__ import annotations

from typing import Any

import boto3

from contract_review.config import Settings, get_profile
from contract_review.runtime import aws_client_config
from contract_review.store import Aws, Store

from .embedded import LOCAL_JSON, load_local_json

# stack output -> Settings field
OUTPUT_FIELDS = {
    "JobsTableName": "jobs_table", "ClaimsTableName": "claims_table", "CheckpointsTableName": "checkpoints_table",
    "EventsTableName": "events_table", "IdempotencyTableName": "idempotency_table", "ArtifactBucketName": "bucket",
    "IntakeQueueUrl": "intake_queue_url", "AnalysisQueueUrl": "analysis_queue_url",
    "ResultsQueueUrl": "results_queue_url", "IntakeDlqUrl": "intake_dlq_url", "AnalysisDlqUrl": "analysis_dlq_url",
    "ResultsDlqUrl": "results_dlq_url",
}


def settings_from_outputs(outputs: dict[str, str], profile: str) -> Settings:
    missing = [k for k in OUTPUT_FIELDS if k not in outputs]
    if missing:
        raise ValueError(f"stack outputs missing: {', '.join(missing)}")
    return Settings(profile=get_profile(profile), **{f: outputs[o] for o, f in OUTPUT_FIELDS.items()})


def local_session(region: str) -> boto3.Session:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", aws_session_token="testing",
                         region_name=region)


def store_for(session: boto3.Session, settings: Settings, endpoint: str | None) -> Store:
    cfg = aws_client_config()
    kw: dict[str, Any] = {"config": cfg}
    if endpoint:
        kw["endpoint_url"] = endpoint
    aws = Aws(ddb=session.client("dynamodb", **kw), s3=session.client("s3", **kw), sqs=session.client("sqs", **kw),
              settings=settings)
    return Store(aws)


def connect(stack: str | None = None, region: str | None = None, profile: str | None = None) -> Store:
    if stack is None:
        info = load_local_json(LOCAL_JSON)
        settings = settings_from_outputs(info["outputs"], profile or info.get("profile", "local"))
        return store_for(local_session(info["region"]), settings, info["endpoint"])
    session = boto3.Session(region_name=region)
    cfn = session.client("cloudformation")
    outputs = {o["OutputKey"]: o["OutputValue"]
               for o in cfn.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])}
    return store_for(session, settings_from_outputs(outputs, profile or "prod"), None)
