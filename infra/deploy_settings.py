"""What one synth needs beyond the profile: read from CDK context, validated once."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, cast

from contract_review.config import FaultSpec, Profile, get_profile

DEFAULT_STACK_NAME = "ContractReview"
WorkerKind = Literal["lambda", "fargate"]
ModelProvider = Literal["offline", "bedrock"]

# Powertools for AWS Lambda (Python) v3 public layer, python3.12 / arm64
# (arn:aws:lambda:<region>:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-arm64:<N>).
# The layer number is per Powertools release; keep it in step with the aws-lambda-powertools pin
# in requirements.txt (check `aws ssm get-parameter --name
# /aws/service/powertools/python/arm64/python3.12/<version>` or the Powertools docs "Lambda
# Layer" page). Override without a code change with `-c powertools_layer_version=<N>`.
POWERTOOLS_LAYER_VERSION = 38

_STACK_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")


@dataclass(frozen=True)
class DeploySettings:
    profile: Profile
    stack_name: str = DEFAULT_STACK_NAME
    worker_kind: WorkerKind = "lambda"
    model_provider: ModelProvider = "bedrock"
    powertools_layer_version: int = POWERTOOLS_LAYER_VERSION
    fault_spec: FaultSpec | None = None
    auto_delete_objects: bool = False

    def __post_init__(self) -> None:
        if not _STACK_NAME_RE.match(self.stack_name):
            # <= 64 keeps "<stack>-results-dlq.fifo" within SQS's 80-character queue-name limit.
            raise ValueError(f"stack_name {self.stack_name!r}: letters, digits and '-', at most 64, letter first")
        if self.worker_kind not in ("lambda", "fargate"):
            raise ValueError(f"worker must be 'lambda' or 'fargate', not {self.worker_kind!r}")
        if self.model_provider not in ("offline", "bedrock"):
            raise ValueError(f"model_provider must be 'offline' or 'bedrock', not {self.model_provider!r}")
        if self.fault_spec is not None and self.profile.name == "prod":
            raise ValueError("fault_spec is for demos and tests only; never in the prod profile")
        if self.auto_delete_objects and not self.is_disposable:
            raise ValueError("auto_delete_objects is only allowed for the local profile")

    @property
    def is_disposable(self) -> bool:
        """Local deployments are thrown away (DESTROY); everything else keeps its data (RETAIN)."""
        return self.profile.name == "local"

    @classmethod
    def from_context(cls, get: Any) -> DeploySettings:
        """Build from CDK context; `get` is `node.try_get_context`. Values from `-c` arrive as strings."""
        profile = get_profile(str(get("profile") or "prod"))
        provider = get("model_provider") or ("offline" if profile.name == "local" else "bedrock")
        fault = get("fault_spec")
        return cls(
            profile=profile,
            stack_name=str(get("stack_name") or DEFAULT_STACK_NAME),
            # checked in __post_init__, with a message naming the allowed values
            worker_kind=cast(WorkerKind, str(get("worker") or "lambda")),
            model_provider=cast(ModelProvider, str(provider)),
            powertools_layer_version=int(get("powertools_layer_version") or POWERTOOLS_LAYER_VERSION),
            fault_spec=FaultSpec.model_validate_json(fault if isinstance(fault, str) else json.dumps(fault)) if fault else None,
            auto_delete_objects=_truthy(get("auto_delete_objects")),
        )


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on") if value is not None else False
