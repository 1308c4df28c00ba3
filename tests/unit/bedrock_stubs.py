"""Bedrock as botocore's Stubber sees it: real clients (dummy credentials, nothing leaves the process)
and the response and error shapes Bedrock sends, for the runtime (Converse) and the control plane
(GetFoundationModel, GetInferenceProfile)."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.stub import Stubber

from contract_review.domain.model import base_model_id
from contract_review.model.bedrock import bedrock_client_config

REGION = "us-east-1"
ACCOUNT = "123456789012"
CURRENT = "global.anthropic.claude-sonnet-4-6"  # the prod profile's default
RETIRED = "anthropic.claude-3-5-sonnet-20240620-v1:0"  # an id Bedrock retired
# What Bedrock answers Converse with for a retired model: a ValidationException (400), the same code
# and status as any other bad request. Classification never reads this text.
EOL_MESSAGE = "This model version has reached the end of its life. Please refer to the AWS documentation for more details."


def client(service: str) -> Any:
    kw: dict[str, Any] = {"config": bedrock_client_config(60)} if service == "bedrock-runtime" else {}
    return boto3.client(service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing",
                        **kw)


def stubbed(service: str) -> tuple[Any, Stubber]:
    c = client(service)
    return c, Stubber(c)


def converse_ok(text: str = "OK", stop: str = "end_turn") -> dict[str, Any]:
    return {"output": {"message": {"role": "assistant", "content": [{"text": text}]}}, "stopReason": stop,
            "usage": {"inputTokens": 14, "outputTokens": 2, "totalTokens": 16}, "metrics": {"latencyMs": 420}}


def foundation_model(model_id: str, lifecycle: str = "ACTIVE", name: str = "Claude Sonnet 4.6",
                     inference_types: tuple[str, ...] = ("INFERENCE_PROFILE",)) -> dict[str, Any]:
    """GetFoundationModel's answer (current Claude models are served through inference profiles only)."""
    return {"modelDetails": {
        "modelArn": f"arn:aws:bedrock:{REGION}::foundation-model/{model_id}", "modelId": model_id,
        "modelName": name, "providerName": "Anthropic", "inputModalities": ["TEXT", "IMAGE"],
        "outputModalities": ["TEXT"], "responseStreamingSupported": True, "customizationsSupported": [],
        "inferenceTypesSupported": list(inference_types), "modelLifecycle": {"status": lifecycle}}}


def inference_profile(profile_id: str, status: str = "ACTIVE") -> dict[str, Any]:
    """GetInferenceProfile's answer for a system-defined cross-region profile."""
    base = base_model_id(profile_id)
    regions = [""] if profile_id.startswith("global.") else ["us-east-1", "us-east-2", "us-west-2"]
    return {"inferenceProfileName": f"{profile_id.split('.')[0].upper()} Anthropic Claude Sonnet 4.6",
            "inferenceProfileArn": f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{profile_id}",
            "inferenceProfileId": profile_id, "status": status, "type": "SYSTEM_DEFINED",
            "models": [{"modelArn": f"arn:aws:bedrock:{r}::foundation-model/{base}"} for r in regions]}


def expect_profile(stub: Stubber, profile_id: str, **kw: Any) -> None:
    stub.add_response("get_inference_profile", inference_profile(profile_id, **kw),
                      expected_params={"inferenceProfileIdentifier": profile_id})


def expect_model(stub: Stubber, model_id: str, **kw: Any) -> None:
    stub.add_response("get_foundation_model", foundation_model(model_id, **kw),
                      expected_params={"modelIdentifier": model_id})


def expect_current(stub: Stubber, model_id: str = CURRENT) -> None:
    """The control plane's answers for a current, active global profile."""
    expect_profile(stub, model_id)
    expect_model(stub, base_model_id(model_id))
