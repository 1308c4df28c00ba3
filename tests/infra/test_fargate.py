"""`-c worker=fargate`: the analysis queue is polled by a Fargate service instead of the Lambda ESM."""

from __future__ import annotations

import json

from contract_review.config import ENV

from .conftest import FARGATE, Synth, function_by_handler, getatt_id, resources, source_queues


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
    assert int(p["Memory"]) == synth.profiles[FARGATE].worker_memory_mb
    (container,) = p["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env[ENV["worker_kind"]] == "fargate"
    assert set(ENV.values()) - {ENV["fault_spec"]} <= set(env)
    analysis_q = next(q for q in source_queues(t) if q.startswith("AnalysisQueue"))
    assert getatt_id(env[ENV["analysis_queue_url"]]) == analysis_q
    assert container["StopTimeout"] <= 120
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert "ecr" in json.dumps(container["Image"])  # an image asset, pushed at deploy time
    (service,) = resources(t, "AWS::ECS::Service").values()
    assert service["Properties"]["LaunchType"] == "FARGATE"


def test_image_asset_is_the_functions_dockerfile_for_arm64(synth: Synth) -> None:
    manifest = json.loads((synth.outdir / f"{FARGATE}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "Dockerfile"
    assert image["source"]["platform"] == "linux/arm64"
    staged = synth.outdir / image["source"]["directory"]
    assert (staged / "Dockerfile").is_file() and (staged / "contract_review").is_dir()


def test_dockerfile_pins_match_requirements(synth: Synth) -> None:
    from infra.functions import FUNCTIONS_DIR

    dockerfile = (FUNCTIONS_DIR / "Dockerfile").read_text()
    requirements = (FUNCTIONS_DIR.parent / "requirements.txt").read_text().splitlines()
    pins = {line.split("==")[0].split("[")[0]: line.split("==")[1] for line in requirements if "==" in line}
    for package in ("aws-lambda-powertools", "pydantic", "boto3"):
        assert f'"{package}=={pins[package]}"' in dockerfile, package
    assert "FROM python:3.12-slim" in dockerfile
    assert 'CMD ["python", "-m", "contract_review.handlers.poller"]' in dockerfile


def test_lambda_stacks_have_no_container_resources(synth: Synth) -> None:
    for name, t in synth.templates.items():
        if name != FARGATE:
            assert not resources(t, "AWS::ECS::Service") and not resources(t, "AWS::EC2::VPC")
