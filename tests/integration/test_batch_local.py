"""The local stack (`review up`, `make demo`, the integration fixtures: review_local/stack.py) runs Bedrock batch
inference's stand-in beside the ticket fake: its URL in .review/local.json and in the batch collector's environment,
the service role's ARN the template gives the collector, as strict as the local profile (10 records per job at least),
and stopped with the rest. The collector's Deps.batch_inference, built from that environment, runs a job end to end against
it."""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError

from contract_review.config.profile import get_profile
from contract_review.config.settings import Settings
from contract_review.domain.batch_inference import BatchJobStatus, BatchRecord
from contract_review.wiring import build_deps
from review_local.connect import local_session
from review_local.runtime import function_specs
from review_local.stack import LocalStack


def _bedrock(url: str) -> Any:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                         region_name="us-east-1").client("bedrock", endpoint_url=url)


def _records(n: int) -> list[BatchRecord]:
    return [BatchRecord(f"r-{i}", {"messages": [{"role": "user", "content": [{"text": "a clause"}]}]})
            for i in range(n)]


pytestmark = pytest.mark.stack(start={"workers": False, "api": False})  # the `stack` fixture


def test_the_local_stack_serves_the_batch_stand_in_to_the_collector_and_the_cli(stack: LocalStack,
                                                                               tmp_path: Path) -> None:
    assert stack.batch_service is not None
    url = stack.batch_service.url
    # GIVEN .review/local.json as `review up` writes it
    local_json = tmp_path / "local.json"
    stack.write_local_json(local_json)
    info = json.loads(local_json.read_text())
    assert info["batch_service"] == url
    role_arn = info["outputs"]["BatchRoleArn"]
    assert role_arn.startswith("arn:aws:iam::123456789012:role/BatchServiceRole")
    assert info["outputs"]["BatchEndpointUrl"] == url
    # THEN boto3's own bedrock client at that URL answers the batch calls (moto does not)
    assert _bedrock(url).list_model_invocation_jobs()["invocationJobSummaries"] == []
    assert stack.batch_service.min_records == get_profile("local").batch.batch_min_records == 10
    # AND the collector's sandbox (scheduled, like the sweeper's) gets the stand-in's URL beside the role the template
    # gives it, and no other function
    specs = {s.name: s for s in function_specs(stack.aws, 60)}
    assert specs["collector"].schedule_s == specs["sweeper"].schedule_s == 60
    assert specs["collector"].env["BATCH_ROLE_ARN"] == role_arn
    assert stack.extra_env["collector"]["BEDROCK_BATCH_ENDPOINT_URL"] == url
    assert all("BATCH_ROLE_ARN" not in s.env for name, s in specs.items() if name != "collector")
    assert all("BEDROCK_BATCH_ENDPOINT_URL" not in stack.extra_env.get(name, {}) for name in specs
               if name != "collector")
    # WHEN the collector builds its dependencies from that environment, as its sandbox does (AWS_ENDPOINT_URL: moto)
    env = {**specs["collector"].env, **stack.extra_env["collector"]}
    deps = build_deps(Settings.from_env(env), local_session(stack.aws.region), stack.aws.endpoint)
    batch = deps.batch_inference
    assert batch is not None and batch.bedrock.meta.endpoint_url == url
    # THEN a job of the minimum runs through the stand-in, reading and writing batch/ of the stack's bucket
    batch.put_input("local-1", _records(10))
    job = batch.submit("local-1")
    deadline = time.monotonic() + 30
    while not (state := batch.status(job)).terminal:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert state.status in (BatchJobStatus.COMPLETED, BatchJobStatus.PARTIALLY_COMPLETED), state
    done = state.status
    assert {o.record_id for o in batch.results(job)} == {f"r-{i}" for i in range(10)}
    keys = [o["Key"] for o in stack.aws.client("s3").list_objects_v2(
        Bucket=deps.settings.bucket, Prefix="batch/")["Contents"]]
    assert "batch/input/local-1/records.jsonl" in keys and any(k.startswith("batch/output/local-1/") for k in keys)
    # AND one record short of the local minimum fails in validation, as Bedrock's quota would
    batch.put_input("local-2", _records(9))
    short = batch.submit("local-2")
    deadline = time.monotonic() + 30
    while not (state := batch.status(short)).terminal:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert state.status is BatchJobStatus.FAILED and "minimum" in state.message
    # AND the CLI's view of the local stack (Settings.from_outputs of local.json) reaches the same stand-in
    cli = build_deps(Settings.from_outputs(info["outputs"], "local"), local_session(stack.aws.region),
                     stack.aws.endpoint)
    assert cli.batch_inference is not None and cli.batch_inference.status(job).status is done


def test_the_stand_in_stops_with_the_stack(local_template: dict[str, Any], tmp_path: Path) -> None:
    s = LocalStack(template=local_template, state_dir=tmp_path / "stack").start(workers=False, api=False)
    assert s.batch_service is not None
    url = s.batch_service.url
    s.stop()
    assert s.batch_service is None
    with pytest.raises((EndpointConnectionError, urllib.error.URLError, ConnectionError)):
        _bedrock(url).list_model_invocation_jobs()


def test_without_the_stand_in_no_batch_inference_is_offered(local_template: dict[str, Any], tmp_path: Path) -> None:
    """`LocalStack(batch_faults=None)`: no stand-in, and the CLI's Deps has no batch inference (not moto's 404s)."""
    s = LocalStack(template=local_template, state_dir=tmp_path / "stack", batch_faults=None).start(workers=False,
                                                                                                 api=False)
    try:
        assert s.batch_service is None and "BatchRoleArn" not in s.outputs
        assert s.deps().batch_inference is None
    finally:
        s.stop()
