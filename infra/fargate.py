"""The Fargate alternative for the analysis worker (`-c worker=fargate`).

A long-running poller (`python -m contract_review.handlers.poller`) reads the analysis queue itself,
heartbeats a short visibility (`profile.fargate.fargate_visibility_s`), sweeps in-process, and protects its
task from scale-in while it holds a chunk (ECS task scale-in protection through the container
agent endpoint; the task role may call `ecs:UpdateTaskProtection` on this cluster's tasks only).
The image is built from `functions/Dockerfile`; synth only writes the asset manifest (no Docker
needed until `cdk deploy`).

Scaling: from zero. The service is created with no task (desired count 0, minimum capacity 0): an empty
analysis queue costs no task and no public IPv4 address. Step scaling on the queue's backlog, visible +
in-flight messages (a busy queue with nothing visible is not idle), adds tasks from the first message;
scale-in happens only when both are zero, one task a minute down to zero, and even then ECS stops only
unprotected (idle) tasks (the poller gives its protection back as soon as a receive comes back empty, so an
idle fleet does reach zero). A deploy that updates the service sets its desired count back to 0 (CloudFormation
applies the template's DesiredCount on every update of the service); the next minute's backlog alarm scales it
out again, and a task holding a chunk is protected meanwhile. SIGTERM (deployments, a task ECS retires): the poller takes no
new message, its worker starts no model call that could outlast the stop timeout, and the chunk is
finished or released (requeued from its checkpoints) before ECS's SIGKILL.

Tracing: an X-Ray daemon sidecar (`XRAY_DAEMON_IMAGE`, not essential: a daemon that dies costs traces, never a
chunk) listens on UDP 2000 in the task's network namespace; the poller sends its segments to it
(`AWS_XRAY_DAEMON_ADDRESS`, contract_review/handlers/tracing.py) and the daemon uploads them with the task role
(xray:PutTraceSegments, xray:PutTelemetryRecords, and the sampling rules it proxies; X-Ray has no
resource-level permissions for these, so `*`).

Networking: a two-AZ VPC with public subnets only and no NAT gateway; tasks get a public IPv4 address (charged
per running task: $0.005 an hour, about $3.65 a month per task running all month) and a security group with no
ingress rule (the poller only makes outbound calls to AWS APIs). Private subnets would need a NAT gateway or about
nine interface endpoints (about $130 a month in two AZs), so the public address is kept; docs/infrastructure.md
"The Fargate worker" says what an account that forbids public addresses deploys instead. Rejected traffic is
recorded by a VPC flow log.

Image: `functions/Dockerfile` FROM its `BASE_IMAGE` build argument, by default the `python:3.12-slim` tag (not
pinned: the tag moves with each rebuild of that image); `-c fargate_base_image=python:3.12-slim@sha256:...` builds
FROM exactly that digest (DeploySettings refuses a reference without one).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from contract_review.config.constants import FARGATE_MAX_STOP_TIMEOUT_S

from .functions import FUNCTIONS_DIR, log_retention

# Fargate CPU units -> allowed memory (MiB) range.
_FARGATE_SIZES = [(256, 512, 2048), (512, 1024, 4096), (1024, 2048, 8192), (2048, 4096, 16384), (4096, 8192, 30720)]
CONTAINER_NAME = "worker"
# functions/Dockerfile's `ARG BASE_IMAGE=...`: the build argument `-c fargate_base_image` sets, and its default (a
# tag, not a digest: a test keeps the two equal)
BASE_IMAGE_ARG = "BASE_IMAGE"
DEFAULT_BASE_IMAGE = "python:3.12-slim"
XRAY_CONTAINER_NAME = "xray-daemon"
# AWS's public image of the X-Ray daemon, pinned to its major version (3.x: AWS's moving tag for the daemon's
# current release, multi-arch, arm64 included).
XRAY_DAEMON_IMAGE = "public.ecr.aws/xray/aws-xray-daemon:3.x"
XRAY_DAEMON_ADDRESS = "127.0.0.1:2000"  # awsvpc: the task's containers share one network namespace
XRAY_ACTIONS = ["xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                "xray:GetSamplingTargets"]
# Backlog (visible + in flight) -> change in task count. Chunks are LLM-bound, so CPU says little.
SCALING_STEPS = [
    appscaling.ScalingInterval(upper=0, change=-1),  # nothing waiting and nothing in flight
    appscaling.ScalingInterval(lower=1, change=+1),
    appscaling.ScalingInterval(lower=20, change=+3),
    appscaling.ScalingInterval(lower=100, change=+10),
]


def fargate_cpu_for(memory_mb: int, min_cpu: int = 512) -> int:
    """Smallest valid Fargate CPU (at least `min_cpu` when the memory allows) for `memory_mb`."""
    fitting = [cpu for cpu, low, high in _FARGATE_SIZES if low <= memory_mb <= high]
    if not fitting:
        raise ValueError(f"no Fargate size for {memory_mb} MiB")
    return next((cpu for cpu in fitting if cpu >= min_cpu), fitting[-1])


def backlog_metric(queue: sqs.IQueue) -> cloudwatch.MathExpression:
    """Messages visible + in flight (received, not yet deleted), per minute."""
    minute = Duration.minutes(1)
    return cloudwatch.MathExpression(
        expression="visible + inflight",
        using_metrics={
            "visible": queue.metric_approximate_number_of_messages_visible(period=minute, statistic="Maximum"),
            "inflight": queue.metric_approximate_number_of_messages_not_visible(period=minute, statistic="Maximum"),
        },
        label="analysis backlog (visible + in flight)",
        period=minute,
    )


class FargateWorker(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: sqs.IQueue,
        environment: Mapping[str, str],
        memory_mb: int,
        max_tasks: int,
        stop_timeout_s: int,
        log_retention_days: int,
        removal_policy: RemovalPolicy,
        base_image: str = "",
    ) -> None:
        super().__init__(scope, construct_id)
        if not 1 <= stop_timeout_s <= FARGATE_MAX_STOP_TIMEOUT_S:
            raise ValueError(f"stop timeout {stop_timeout_s}s: Fargate allows 1..{FARGATE_MAX_STOP_TIMEOUT_S}s")
        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=log_retention(log_retention_days), removal_policy=removal_policy
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24)
            ],
            flow_logs={
                "rejected": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.REJECT,
                )
            },
        )
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention(log_retention_days), removal_policy=removal_policy
        )
        image = ecs.ContainerImage.from_asset(
            str(FUNCTIONS_DIR),
            file="Dockerfile",
            platform=ecr_assets.Platform.LINUX_ARM64,
            build_args={BASE_IMAGE_ARG: base_image} if base_image else None,
            exclude=["**/__pycache__", "**/*.pyc", "**/.pytest_cache"],
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=fargate_cpu_for(memory_mb),
            memory_limit_mib=memory_mb,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.task_definition.add_container(
            CONTAINER_NAME,
            image=image,
            environment={**environment, "AWS_XRAY_DAEMON_ADDRESS": XRAY_DAEMON_ADDRESS},
            logging=ecs.LogDrivers.aws_logs(stream_prefix="worker", log_group=self.log_group),
            # SIGTERM -> the poller finishes or releases its chunk (profile.fargate.fargate_stop_timeout_s).
            stop_timeout=Duration.seconds(stop_timeout_s),
        )
        self.task_definition.add_container(
            XRAY_CONTAINER_NAME,
            image=ecs.ContainerImage.from_registry(XRAY_DAEMON_IMAGE),
            essential=False,  # tracing is best effort: its loss never stops the poller
            cpu=32,
            memory_reservation_mib=64,
            port_mappings=[ecs.PortMapping(container_port=2000, protocol=ecs.Protocol.UDP)],
            logging=ecs.LogDrivers.aws_logs(stream_prefix="xray", log_group=self.log_group),
        )
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            assign_public_ip=True,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            desired_count=0,  # no task until the backlog alarm asks for one (scaling from zero, above)
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            min_healthy_percent=100,
            max_healthy_percent=200,
        )
        scaling = self.service.auto_scale_task_count(min_capacity=0, max_capacity=max_tasks)
        scaling.scale_on_metric(
            "QueueBacklogScaling",
            metric=backlog_metric(queue),
            scaling_steps=SCALING_STEPS,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            cooldown=Duration.seconds(60),
        )
        self.task_role = self.task_definition.task_role
        # Scale-in protection through the agent endpoint: the agent calls UpdateTaskProtection with
        # the task role's credentials, on tasks of this cluster only.
        stack = Stack.of(self)
        self.task_arns = stack.format_arn(service="ecs", resource="task",
                                          resource_name=f"{self.cluster.cluster_name}/*",
                                          arn_format=ArnFormat.SLASH_RESOURCE_NAME)
        iam.Grant.add_to_principal(grantee=self.task_role, actions=["ecs:UpdateTaskProtection"],
                                   resource_arns=[self.task_arns])
        # the daemon sidecar uploads the poller's traces with the task role (no resource-level permissions)
        iam.Grant.add_to_principal(grantee=self.task_role, actions=XRAY_ACTIONS, resource_arns=["*"])
