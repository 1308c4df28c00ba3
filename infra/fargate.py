"""The Fargate alternative for the analysis worker (`-c worker=fargate`).

A long-running poller (`python -m contract_review.handlers.poller`) reads the analysis queue itself,
heartbeats a short visibility (`profile.fargate_visibility_s`) and scales on queue depth.
The image is built from `functions/Dockerfile`; synth only writes the asset manifest (no
Docker needed until `cdk deploy`).

Networking: a two-AZ VPC with public subnets only and no NAT gateway; tasks get a public IP and
a security group with no ingress (the poller only makes outbound calls to AWS APIs). Rejected
traffic is recorded by a VPC flow log.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_ecs_patterns as ecs_patterns
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from .functions import FUNCTIONS_DIR, log_retention

# Fargate CPU units -> allowed memory (MiB) range.
_FARGATE_SIZES = [(256, 512, 2048), (512, 1024, 4096), (1024, 2048, 8192), (2048, 4096, 16384), (4096, 8192, 30720)]
FARGATE_MAX_STOP_TIMEOUT_S = 120


def fargate_cpu_for(memory_mb: int, min_cpu: int = 512) -> int:
    """Smallest valid Fargate CPU (at least `min_cpu` when the memory allows) for `memory_mb`."""
    fitting = [cpu for cpu, low, high in _FARGATE_SIZES if low <= memory_mb <= high]
    if not fitting:
        raise ValueError(f"no Fargate size for {memory_mb} MiB")
    return next((cpu for cpu in fitting if cpu >= min_cpu), fitting[-1])


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
    ) -> None:
        super().__init__(scope, construct_id)
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
            exclude=["**/__pycache__", "**/*.pyc", "**/.pytest_cache"],
        )
        self.service = ecs_patterns.QueueProcessingFargateService(
            self,
            "Service",
            cluster=self.cluster,
            queue=queue,
            image=image,
            environment=dict(environment),
            cpu=fargate_cpu_for(memory_mb),
            memory_limit_mib=memory_mb,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
            log_driver=ecs.LogDrivers.aws_logs(stream_prefix="worker", log_group=self.log_group),
            assign_public_ip=True,
            task_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            min_scaling_capacity=1,
            max_scaling_capacity=max_tasks,
            # Scale on visible messages: one more task as soon as work waits, faster when it piles
            # up; scale in when the queue is empty. Chunks are LLM-bound, so CPU says little.
            scaling_steps=[
                appscaling.ScalingInterval(upper=0, change=-1),
                appscaling.ScalingInterval(lower=1, change=+1),
                appscaling.ScalingInterval(lower=20, change=+3),
                appscaling.ScalingInterval(lower=100, change=+10),
            ],
            disable_cpu_based_scaling=True,
            cooldown=Duration.seconds(60),
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            min_healthy_percent=100,
            max_healthy_percent=200,
        )
        # SIGTERM -> the poller finishes (or checkpoints) its chunk; give it up to the Lambda
        # worker's timeout before SIGKILL (Fargate allows at most 120 s).
        task = self.service.task_definition.node.default_child
        assert isinstance(task, ecs.CfnTaskDefinition)
        task.add_property_override(
            "ContainerDefinitions.0.StopTimeout", min(FARGATE_MAX_STOP_TIMEOUT_S, stop_timeout_s)
        )
        self.task_role = self.service.task_definition.task_role
