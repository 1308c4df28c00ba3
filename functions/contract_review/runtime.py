"""Wiring: Settings + a boto3 session -> the adapters and model the core takes.

Called once per process by the handlers (lazily, on first invocation), never at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Settings
from .models import BedrockConverseModel, CallLedger, FaultInjectingModel, ModelClient, bedrock_client_config
from .offline_model import OfflineRuleModel
from .store import Aws, Store


@dataclass
class Deps:
    settings: Settings
    store: Store
    session: Any

    def model(self) -> ModelClient:
        return build_model(self.settings, self.session)


def aws_client_config() -> Any:
    from botocore.config import Config

    # AWS API calls (DynamoDB, S3, SQS): botocore's standard retry mode, 5 attempts in total.
    # Tier 1 wraps model calls only, so the two never multiply.
    return Config(retries={"mode": "standard", "total_max_attempts": 5}, connect_timeout=5, read_timeout=30)


def build_deps(settings: Settings, session: Any) -> Deps:
    return Deps(settings=settings, store=Store(Aws.from_session(session, settings, aws_client_config())), session=session)


def build_model(settings: Settings, session: Any) -> ModelClient:
    model: ModelClient
    if settings.model_provider == "bedrock":
        client = session.client("bedrock-runtime", config=bedrock_client_config(settings.model_call_timeout_s))
        model = BedrockConverseModel(client, settings.effective_model_id)
    else:
        model = OfflineRuleModel()
    spec = settings.fault_spec
    if spec is not None:
        model = FaultInjectingModel(model, spec)
        if spec.call_log:
            model = CallLedger(model, spec.call_log)
    return model
