"""Wiring of Bedrock batch inference (wiring.build_batch_inference; docs/batch-inference.md): Deps.batch_inference exists exactly where
the batch service role is configured (BATCH_ROLE_ARN: the sweeper), its `bedrock` client goes to the stand-in's URL
when one is given, and the adapter takes the artifacts bucket, the batch/ prefix, the model and the profile's
timeout. No network: boto3 clients are built, never called."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from contract_review.adapters.batch_inference import BedrockBatchInference
from contract_review.config.profile import get_profile
from contract_review.config.settings import Settings
from contract_review.domain.keys import BATCH_PREFIX
from contract_review.wiring import batch_min_records, build_deps

ROLE = "arn:aws:iam::123456789012:role/ContractReview-BatchServiceRole"
STAND_IN = "http://127.0.0.1:4599"
MOTO = "http://127.0.0.1:4566"


def _env(**extra: str) -> dict[str, str]:
    return {"REVIEW_PROFILE": "prod", "JOBS_TABLE": "jobs", "CLAIMS_TABLE": "claims", "CHECKPOINTS_TABLE": "cp",
            "EVENTS_TABLE": "events", "ARTIFACT_BUCKET": "artifacts-123", "INTAKE_QUEUE_URL": "https://q/intake",
            "ANALYSIS_QUEUE_URL": "https://q/analysis", "RESULTS_QUEUE_URL": "https://q/results.fifo", **extra}


def _session() -> Any:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")


def test_without_the_batch_service_role_there_is_no_batch_inference():
    deps = build_deps(Settings.from_env(_env()), _session())
    assert deps.batch_inference is None


def test_the_sweepers_batch_inference_is_built_from_settings_and_profile():
    settings = Settings.from_env(_env(BATCH_ROLE_ARN=ROLE, MODEL_PROVIDER="bedrock", MODEL_ID="eu.anthropic.x-v1:0"))
    deps = build_deps(settings, _session())
    batch = deps.batch_inference
    assert isinstance(batch, BedrockBatchInference)
    assert (batch.bucket, batch.prefix, batch.role_arn) == ("artifacts-123", BATCH_PREFIX, ROLE)
    assert batch.model_id == settings.effective_model_id == "eu.anthropic.x-v1:0"
    assert batch.timeout_hours == get_profile("prod").batch.batch_timeout_hours
    assert batch.bedrock.meta.service_model.service_name == "bedrock"  # the control plane, not bedrock-runtime
    assert batch.bedrock.meta.endpoint_url == "https://bedrock.us-east-1.amazonaws.com"  # AWS: no endpoint set
    # records and answers go through the artifacts' own S3 client (counted by the request meter)
    assert batch.s3 is deps.artifacts.client  # type: ignore[attr-defined]


@pytest.mark.parametrize("moto", [None, MOTO])
def test_the_bedrock_client_goes_to_the_stand_in_when_its_url_is_set(moto: str | None):
    """Locally every other client goes to moto (the endpoint given, or AWS_ENDPOINT_URL in a sandbox); the batch
    calls go to BEDROCK_BATCH_ENDPOINT_URL, which moto does not serve."""
    settings = Settings.from_env(_env(BATCH_ROLE_ARN=ROLE, BEDROCK_BATCH_ENDPOINT_URL=STAND_IN))
    deps = build_deps(settings, _session(), moto)
    assert deps.batch_inference is not None
    assert deps.batch_inference.bedrock.meta.endpoint_url == STAND_IN
    assert deps.artifacts.client.meta.endpoint_url != STAND_IN  # type: ignore[attr-defined]


def test_the_cli_reads_the_role_and_the_stand_in_from_the_stack_outputs():
    outputs = {"JobsTableName": "jobs", "ClaimsTableName": "claims", "CheckpointsTableName": "cp",
               "EventsTableName": "events", "ArtifactBucketName": "artifacts-123", "IntakeQueueUrl": "https://q/i",
               "AnalysisQueueUrl": "https://q/a", "ResultsQueueUrl": "https://q/r.fifo"}
    assert Settings.from_outputs(outputs, "prod").batch_role_arn == ""
    s = Settings.from_outputs({**outputs, "BatchRoleArn": ROLE, "BatchEndpointUrl": STAND_IN}, "local")
    assert (s.batch_role_arn, s.batch_endpoint_url) == (ROLE, STAND_IN)
    deps = build_deps(s, _session(), MOTO)
    assert deps.batch_inference is not None and deps.batch_inference.bedrock.meta.endpoint_url == STAND_IN


def _stubbed(session: Any, display: str | None, quotas: list[dict[str, Any]] | None) -> tuple[Any, Stubber, Stubber]:
    """A `bedrock` client naming the model (GetFoundationModel) and a session whose `service-quotas` client lists
    `quotas` (None: refuses)."""
    bedrock = session.client("bedrock", region_name="us-east-1")
    b = Stubber(bedrock)
    details = {"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-sonnet-4-6",
               "modelId": "anthropic.claude-sonnet-4-6", "modelLifecycle": {"status": "ACTIVE"}}
    if display is not None:
        details.update(providerName="Anthropic", modelName=display)
    b.add_response("get_foundation_model", {"modelDetails": details}, {"modelIdentifier": "anthropic.claude-sonnet-4-6"})
    sq = session.client("service-quotas", region_name="us-east-1")
    q = Stubber(sq)
    if quotas is None:
        q.add_client_error("list_service_quotas", service_error_code="AccessDeniedException", http_status_code=403)
    else:
        q.add_response("list_service_quotas", {"Quotas": quotas})
    session.client = lambda service, **_kw: sq if service == "service-quotas" else bedrock  # type: ignore[method-assign]
    return bedrock, b, q


@pytest.mark.parametrize("display,quotas,expected", [
    ("Claude Sonnet 4.6", [{"QuotaName": "Minimum number of records per batch inference job for Anthropic Claude "
                                         "Sonnet 4.6", "QuotaCode": "L-1", "Value": 250.0, "Adjustable": False}], 250),
    ("Claude Sonnet 4.6", None, None),  # Service Quotas refuses: logged, not held to (the collector takes 100)
], ids=["applied", "unreadable"])
def test_the_batch_minimum_is_the_accounts_service_quota_for_the_model(display: str, quotas: Any,
                                                                        expected: int | None) -> None:
    settings = Settings.from_env(_env(BATCH_ROLE_ARN=ROLE, MODEL_PROVIDER="bedrock",
                                      MODEL_ID="anthropic.claude-sonnet-4-6"))
    session = _session()
    bedrock, b, q = _stubbed(session, display, quotas)
    with b, q:
        assert batch_min_records(settings, session, bedrock) == expected
        b.assert_no_pending_responses()
        q.assert_no_pending_responses()
