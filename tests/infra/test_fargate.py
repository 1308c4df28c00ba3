"""`-c worker=fargate`: the analysis queue is polled by a Fargate service instead of the Lambda ESM."""

from __future__ import annotations

import json

from contract_review.config.settings import ENV

from .conftest import (
    FARGATE,
    FARGATE_BASE_IMAGE,
    ONLY_WHEN_GIVEN,
    Synth,
    function_by_handler,
    getatt_id,
    resources,
    source_queues,
)


def test_worker_lambda_has_no_event_source_mapping(synth: Synth) -> None:
    t = synth.templates[FARGATE]
    worker_id, _ = function_by_handler(t, "worker.handler")  # the function still exists
    mapped = {getatt_id(r["Properties"]["FunctionName"]) for r in resources(t, "AWS::Lambda::EventSourceMapping").values()}
    assert len(mapped) == 2 and worker_id not in mapped


def test_service_polls_the_analysis_queue_on_arm64(synth: Synth) -> None:
    t = synth.templates[FARGATE]
    (task_def,) = resources(t, "AWS::ECS::TaskDefinition").values()
    p = task_def["Properties"]
    assert p["RuntimePlatform"] == {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}
    assert p["RequiresCompatibilities"] == ["FARGATE"]
    assert int(p["Memory"]) == synth.profiles[FARGATE].functions.worker_memory_mb
    (container,) = [c for c in p["ContainerDefinitions"] if c["Name"] == "worker"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env[ENV["worker_kind"]] == "fargate"
    assert set(ENV.values()) - ONLY_WHEN_GIVEN <= set(env)  # both only when given
    analysis_q = next(q for q in source_queues(t) if q.startswith("AnalysisQueue"))
    assert getatt_id(env[ENV["analysis_queue_url"]]) == analysis_q
    assert container["StopTimeout"] <= 120
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert "ecr" in json.dumps(container["Image"])  # an image asset, pushed at deploy time
    (service,) = resources(t, "AWS::ECS::Service").values()
    assert service["Properties"]["LaunchType"] == "FARGATE"


def test_the_task_runs_the_xray_daemon_the_poller_sends_its_traces_to(synth: Synth) -> None:
    """Fargate has no active tracing: the poller's segments go to a daemon sidecar, which uploads them with the
    task role."""
    t = synth.templates[FARGATE]
    (task_def,) = resources(t, "AWS::ECS::TaskDefinition").values()
    containers = {c["Name"]: c for c in task_def["Properties"]["ContainerDefinitions"]}
    assert set(containers) == {"worker", "xray-daemon"}
    daemon, worker = containers["xray-daemon"], containers["worker"]
    assert daemon["Image"].startswith("public.ecr.aws/xray/aws-xray-daemon:")
    assert daemon["PortMappings"] == [{"ContainerPort": 2000, "Protocol": "udp"}]
    assert daemon["Essential"] is False and worker.get("Essential", True) is True  # lost traces never stop a chunk
    assert daemon["LogConfiguration"]["LogDriver"] == "awslogs"
    env = {e["Name"]: e["Value"] for e in worker["Environment"]}
    assert env["AWS_XRAY_DAEMON_ADDRESS"] == "127.0.0.1:2000"  # awsvpc: one network namespace per task
    # the task role may upload traces and read the sampling rules the daemon proxies (X-Ray: Resource "*")
    role_ids = {k for k, v in resources(t, "AWS::IAM::Role").items() if "ecs-tasks" in json.dumps(v)}
    task_role = getatt_id(task_def["Properties"]["TaskRoleArn"])
    assert task_role in role_ids
    xray = [st for pol in resources(t, "AWS::IAM::Policy").values()
            if {"Ref": task_role} in pol["Properties"]["Roles"]
            for st in pol["Properties"]["PolicyDocument"]["Statement"]
            if any(str(a).startswith("xray:") for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))]
    granted = {a for st in xray for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
               if a.startswith("xray:")}
    assert granted == {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                       "xray:GetSamplingTargets"}
    assert all(st["Resource"] == "*" and st["Effect"] == "Allow" for st in xray)


def test_lambda_functions_trace_actively(synth: Synth) -> None:
    """Lambda's half of the traces: active tracing on every function (the handlers' Powertools Tracer adds the
    subsegments), and the grants it needs; POWERTOOLS_TRACE_DISABLED is nowhere set."""
    for t in synth.templates.values():
        functions = {k: f for k, f in resources(t, "AWS::Lambda::Function").items()
                     if str(f["Properties"].get("Handler", "")).startswith("contract_review.handlers.")}
        assert len(functions) == 6  # intake, worker, aggregator, sweeper, collector, api
        for fn in functions.values():
            assert fn["Properties"]["TracingConfig"] == {"Mode": "Active"}
            assert "POWERTOOLS_TRACE_DISABLED" not in fn["Properties"]["Environment"]["Variables"]


def test_image_asset_is_the_functions_dockerfile_for_arm64(synth: Synth) -> None:
    manifest = json.loads((synth.outdir / f"{FARGATE}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "Dockerfile"
    assert image["source"]["platform"] == "linux/arm64"
    staged = synth.outdir / image["source"]["directory"]
    assert (staged / "Dockerfile").is_file() and (staged / "contract_review").is_dir()


def test_the_base_image_is_a_build_argument_and_a_digest_given_reaches_the_build(synth: Synth) -> None:
    """functions/Dockerfile builds FROM its BASE_IMAGE argument (default: the python:3.12-slim tag, not a digest);
    `-c fargate_base_image=...@sha256:...` (given to the Fargate stack here) is the argument the deploy builds with,
    and changes the asset (its hash covers the build arguments), so a new digest is a new image."""
    from infra.fargate import BASE_IMAGE_ARG, DEFAULT_BASE_IMAGE
    from infra.functions import FUNCTIONS_DIR

    lines = (FUNCTIONS_DIR / "Dockerfile").read_text().splitlines()
    (first,) = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert lines[first] == f"FROM ${{{BASE_IMAGE_ARG}}}"
    assert f"ARG {BASE_IMAGE_ARG}={DEFAULT_BASE_IMAGE}" in lines[:first]
    manifest = json.loads((synth.outdir / f"{FARGATE}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerBuildArgs"] == {BASE_IMAGE_ARG: FARGATE_BASE_IMAGE}


def test_dockerfile_pins_match_requirements(synth: Synth) -> None:
    from infra.functions import FUNCTIONS_DIR

    dockerfile = (FUNCTIONS_DIR / "Dockerfile").read_text()
    requirements = (FUNCTIONS_DIR.parent / "requirements.txt").read_text().splitlines()
    pins = {line.split("==")[0].split("[")[0]: line.split("==")[1] for line in requirements if "==" in line}
    for package in ("aws-lambda-powertools", "aws-xray-sdk", "pydantic", "boto3"):
        assert f'"{package}=={pins[package]}"' in dockerfile, package
    assert 'CMD ["python", "-m", "contract_review.handlers.poller"]' in dockerfile


def test_lambda_stacks_have_no_container_resources(synth: Synth) -> None:
    for name, t in synth.templates.items():
        if name != FARGATE:
            assert not resources(t, "AWS::ECS::Service") and not resources(t, "AWS::EC2::VPC")


def test_stop_timeout_is_the_profiles_and_covers_a_model_call_and_the_release(synth: Synth) -> None:
    t = synth.templates[FARGATE]
    p = synth.profiles[FARGATE]
    (task_def,) = resources(t, "AWS::ECS::TaskDefinition").values()
    (container,) = [c for c in task_def["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    # SIGTERM -> SIGKILL after StopTimeout: a model call in flight ends, and the chunk is released, before
    assert container["StopTimeout"] == p.fargate.fargate_stop_timeout_s <= 120
    assert p.tier1.model_read_timeout_s + p.tier1.handoff_margin_s <= container["StopTimeout"]


def test_scaling_counts_in_flight_messages_and_scales_in_only_when_all_is_done(synth: Synth) -> None:
    """From zero and back: no task until there is a backlog (created at 0, minimum 0), +1 from the first message,
    -1 only when nothing is visible and nothing in flight, down to zero."""
    t = synth.templates[FARGATE]
    (service,) = resources(t, "AWS::ECS::Service").values()
    assert service["Properties"]["DesiredCount"] == 0  # created with no task: an empty queue costs nothing
    (target,) = resources(t, "AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (
        0, synth.profiles[FARGATE].functions.worker_max_concurrency)
    policies = resources(t, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert len(policies) == 2  # one step policy per direction (CDK's scale_on_metric)
    analysis_q = next(q for q in source_queues(t) if q.startswith("AnalysisQueue"))
    alarms = [a["Properties"] for a in resources(t, "AWS::CloudWatch::Alarm").values()
              if "AlarmName" not in a["Properties"]]
    assert len(alarms) == 2
    for a in alarms:
        metrics = {m["Id"]: m for m in a["Metrics"]}
        (expression,) = [m["Expression"] for m in metrics.values() if "Expression" in m]
        assert expression == "visible + inflight"
        assert {metrics[k]["MetricStat"]["Metric"]["MetricName"] for k in ("visible", "inflight")} == {
            "ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible"}
        for k in ("visible", "inflight"):
            (dim,) = metrics[k]["MetricStat"]["Metric"]["Dimensions"]
            assert getatt_id(dim["Value"]) == analysis_q
    scale_in = next(p["Properties"] for p in policies.values()
                    if any(s["ScalingAdjustment"] < 0 for s in p["Properties"]["StepScalingPolicyConfiguration"]
                           ["StepAdjustments"]))
    (step,) = scale_in["StepScalingPolicyConfiguration"]["StepAdjustments"]
    assert step["ScalingAdjustment"] == -1 and step["MetricIntervalUpperBound"] == 0  # backlog 0: nothing to do
    by_operator = {a["ComparisonOperator"]: a for a in alarms}
    # out from zero on the first message (visible or in flight); in only at a backlog of exactly zero
    assert by_operator["GreaterThanOrEqualToThreshold"]["Threshold"] == 1
    assert by_operator["LessThanOrEqualToThreshold"]["Threshold"] == 0
    scale_out = next(p["Properties"] for p in policies.values() if p["Properties"] is not scale_in)
    first = min(scale_out["StepScalingPolicyConfiguration"]["StepAdjustments"],
                key=lambda s: s["MetricIntervalLowerBound"])
    assert (first["MetricIntervalLowerBound"], first["ScalingAdjustment"]) == (0, 1)  # 1 message: 0 -> 1 task


def test_tasks_have_a_public_address_and_accept_no_inbound_traffic(synth: Synth) -> None:
    """Public subnets, no NAT gateway: each task gets a public IPv4 address (charged per running task) to reach AWS
    APIs, behind a security group with no ingress rule at all; no other security group rule in the stack."""
    t = synth.templates[FARGATE]
    (service,) = resources(t, "AWS::ECS::Service").values()
    network = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "ENABLED"
    (group_ref,) = network["SecurityGroups"]
    group = t["Resources"][getatt_id(group_ref)]["Properties"]
    assert "SecurityGroupIngress" not in group and not resources(t, "AWS::EC2::SecurityGroupIngress")
    assert not resources(t, "AWS::EC2::NatGateway")
    subnets = [t["Resources"][getatt_id(s)]["Properties"] for s in network["Subnets"]]
    assert len(subnets) == 2 and all(s["MapPublicIpOnLaunch"] for s in subnets)


def test_the_task_may_protect_itself_from_scale_in(synth: Synth) -> None:
    t = synth.templates[FARGATE]
    (cluster_id,) = resources(t, "AWS::ECS::Cluster")
    (task_def,) = resources(t, "AWS::ECS::TaskDefinition").values()
    role = getatt_id(task_def["Properties"]["TaskRoleArn"])
    statements = [st for pol in resources(t, "AWS::IAM::Policy").values()
                  if any(getatt_id(r) == role for r in pol["Properties"]["Roles"])
                  for st in pol["Properties"]["PolicyDocument"]["Statement"]
                  if st["Action"] == "ecs:UpdateTaskProtection"]
    (st,) = statements
    parts = st["Resource"]["Fn::Join"][1]
    assert ":task/" in parts and {"Ref": cluster_id} in parts and parts[-1] == "/*"  # this cluster's tasks only


def test_preflight_checks_the_service_linked_role_the_scaling_target_names(synth: Synth) -> None:
    """`review preflight` (stack WorkerKind fargate, or --worker fargate) checks the Application Auto Scaling role this
    template's scalable target uses, by the name and service path the template gives it."""
    from review_local.preflight_account import SERVICE_LINKED_ROLES

    t = synth.templates[FARGATE]
    assert t["Outputs"]["WorkerKind"]["Value"] == "fargate"  # what preflight reads from a deployed stack
    (target,) = resources(t, "AWS::ApplicationAutoScaling::ScalableTarget").values()
    role_arn = "".join(p for p in target["Properties"]["RoleARN"]["Fn::Join"][1] if isinstance(p, str))
    assert any(role_arn.endswith(f":role/aws-service-role/{service}/{role}") for role, service in SERVICE_LINKED_ROLES)
    assert {service for _, service in SERVICE_LINKED_ROLES} == {"ecs.amazonaws.com",
                                                                "ecs.application-autoscaling.amazonaws.com"}
