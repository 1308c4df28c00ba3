"""Lambda functions: one construct per function (own role, own log group), shared code asset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from contract_review.config.metrics import NAMESPACE

FUNCTIONS_DIR = Path(__file__).resolve().parents[1] / "functions"
ASSET_EXCLUDE = ["Dockerfile", ".dockerignore", "**/__pycache__", "**/*.pyc", "**/.pytest_cache"]
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
# The public SSM parameters AWS publishes per Powertools release (and `latest`) in every region;
# each holds that region's layer ARN for this runtime and architecture.
POWERTOOLS_SSM_PATH = f"/aws/service/powertools/python/{ARCHITECTURE.name}/{RUNTIME.name}"

_RETENTION_STEPS = [
    (1, logs.RetentionDays.ONE_DAY),
    (3, logs.RetentionDays.THREE_DAYS),
    (5, logs.RetentionDays.FIVE_DAYS),
    (7, logs.RetentionDays.ONE_WEEK),
    (14, logs.RetentionDays.TWO_WEEKS),
    (30, logs.RetentionDays.ONE_MONTH),
    (60, logs.RetentionDays.TWO_MONTHS),
    (90, logs.RetentionDays.THREE_MONTHS),
    (180, logs.RetentionDays.SIX_MONTHS),
    (365, logs.RetentionDays.ONE_YEAR),
]


def log_retention(days: int) -> logs.RetentionDays:
    """Smallest CloudWatch retention that covers `days` (logs live as long as the job records)."""
    for limit, retention in _RETENTION_STEPS:
        if days <= limit:
            return retention
    return logs.RetentionDays.ONE_YEAR


def powertools_parameter(version: str) -> str:
    """The public SSM parameter holding the Powertools layer ARN of `version` ("3.37.0" or "latest")."""
    return f"{POWERTOOLS_SSM_PATH}/{version}"


def powertools_layer(scope: Construct, version: str) -> lambda_.ILayerVersion:
    """The layer ARN is read from SSM by CloudFormation at deploy time (a template parameter of
    type `AWS::SSM::Parameter::Value<String>`): no account, region or layer number in the code."""
    arn = ssm.StringParameter.value_for_string_parameter(scope, powertools_parameter(version))
    return lambda_.LayerVersion.from_layer_version_arn(scope, "PowertoolsLayer", arn)


class PipelineFunction(Construct):
    """A Python 3.12 / arm64 function with its layers (the pinned SDK and Powertools: infra/sdk_layer.py), its own
    role and its own log group.

    The role starts empty: log writing is granted on this function's log group only (no
    AWSLambdaBasicExecutionRole managed policy); the stack adds the data grants.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: str,
        service: str,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        environment: Mapping[str, str],
        timeout_s: int,
        memory_mb: int,
        log_retention_days: int,
        log_level: str,
        removal_policy: RemovalPolicy,
        description: str,
        recursive_loop: lambda_.RecursiveLoop = lambda_.RecursiveLoop.TERMINATE,
        reserved_concurrency: int | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.service = service
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention(log_retention_days), removal_policy=removal_policy
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"contract-review {service} function",
        )
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=handler,
            code=code,
            layers=list(layers),
            role=self.role,
            timeout=Duration.seconds(timeout_s),
            memory_size=memory_mb,
            log_group=self.log_group,
            description=description,
            tracing=lambda_.Tracing.ACTIVE,  # X-Ray: one trace per invocation (adds xray:Put* to the role)
            # Lambda's recursive-loop detection stops a function after ~16 invocations in one chain of SQS
            # messages; ALLOW only where the code bounds its own loop (docs/runbook.md "Recursive loops").
            recursive_loop=recursive_loop,
            # None: no reservation (the account's unreserved pool); the worker reserves its maximum (stack.py)
            reserved_concurrent_executions=reserved_concurrency,
            environment={
                **environment,
                "POWERTOOLS_SERVICE_NAME": service,
                "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE,
                "LOG_LEVEL": log_level,
            },
        )


def functions_code() -> lambda_.Code:
    return lambda_.Code.from_asset(str(FUNCTIONS_DIR), exclude=ASSET_EXCLUDE)
