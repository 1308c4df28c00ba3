"""The whole local stack: embedded AWS with the template deployed, plus the worker sandboxes."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract_review.config.profile import get_profile
from contract_review.config.settings import OPTION_OUTPUTS
from contract_review.domain.ports import Deps
from contract_review.doubles.spec import FaultSpec

from .api_server import ApiServer
from .batch_service import MIN_RECORDS, BatchFaults, BedrockBatchStandIn
from .connect import local_deps
from .embedded import LOCAL_JSON, STATE_DIR, EmbeddedAws, synth
from .runtime import LocalRuntime, function_specs
from .ticket_service import TicketFaults, TicketServiceFake
from .ui_server import UiServer

TICKET_SECRET_NAME = "ticket-credentials"
SAGA_FUNCTIONS = ("aggregator", "sweeper")  # where the side effects run: they get the ticket system's URL
BATCH_FUNCTIONS = ("collector",)  # where batch jobs are submitted and collected (BATCH_ROLE_ARN): the stand-in's URL
BATCH_STEP_S = 0.5  # the local batch stand-in: one job status every half second (Bedrock: minutes to hours)


@dataclass
class LocalStack:
    profile: str = "local"
    worker: str = "lambda"  # lambda | fargate: the CDK context that picks the analysis worker
    faults: FaultSpec | None = None
    concurrency: dict[str, int] = field(default_factory=dict)
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    aws: EmbeddedAws = field(default_factory=EmbeddedAws)
    runtime: LocalRuntime | None = None
    template: dict[str, Any] = field(default_factory=dict)
    state_dir: Path = STATE_DIR  # worker logs go to state_dir/logs
    # The external ticket system's local fake (a third party's stand-in) on loopback, its URL handed to
    # the functions as TICKET_URL; None: no ticket system (the saga skips the ticket step and says so).
    ticket_faults: TicketFaults | None = None
    tickets: TicketServiceFake | None = None
    api: ApiServer | None = None  # the Job API on loopback (the Lambda's resolver; review_local/api_server.py)
    ui: UiServer | None = None  # the status page on loopback, an operator's view (review_local/ui_server.py)
    ticket_secret_arn: str = ""  # the local secret holding the fake's credentials (create_ticket_secret)
    ticket_token: str = ""  # the bearer token in it, which the fake requires
    # Bedrock batch inference's local stand-in (review_local/batch_service.py; moto has no model invocation jobs) on
    # loopback, reading and writing the embedded S3, its URL handed to the functions as BEDROCK_BATCH_ENDPOINT_URL;
    # None: no stand-in (then the functions' batch calls go to moto, which does not serve them)
    batch_faults: BatchFaults | None = field(default_factory=BatchFaults)
    batch_step_s: float = BATCH_STEP_S
    batch_service: BedrockBatchStandIn | None = None

    def start(self, workers: bool = True, api: bool = True) -> LocalStack:
        self.template = self.template or synth(self.profile, {"worker": self.worker})
        self.aws.start()
        self.aws.deploy(self.template)
        if self.ticket_faults is not None and self.tickets is None:
            self.tickets = TicketServiceFake(self.ticket_faults).start()
            # its credentials as on AWS: a Secrets Manager secret (in moto) the functions read, the fake checks
            self.ticket_secret_arn = self.create_ticket_secret()
            for name in SAGA_FUNCTIONS:
                self.extra_env.setdefault(name, {}).update(TICKET_URL=self.tickets.url,
                                                           TICKET_SECRET_ARN=self.ticket_secret_arn)
        if self.batch_faults is not None and self.batch_service is None:
            self.start_batch_service()
        if workers:
            self.start_workers()
        if api:
            self.start_api()
            self.start_ui()
        return self

    def create_ticket_secret(self) -> str:
        """The ticket system's credentials in a secret `contract-review/ticket-credentials` (a bearer token), required by the
        fake: the local path runs the same code as a deploy with `-c ticket_secret_arn`. Its ARN."""
        assert self.tickets is not None
        token = self.ticket_token = secrets.token_urlsafe(24)
        arn = str(self.aws.client("secretsmanager").create_secret(
            Name=f"contract-review/{TICKET_SECRET_NAME}",
            SecretString=json.dumps({"bearer_token": token}))["ARN"])
        self.tickets.require_bearer(token)
        return arn

    def rotate_ticket_secret(self) -> str:
        """A new bearer token in the secret and in the fake (what a rotation does); the new token."""
        assert self.tickets is not None and self.ticket_secret_arn
        token = self.ticket_token = secrets.token_urlsafe(24)
        self.aws.client("secretsmanager").put_secret_value(SecretId=self.ticket_secret_arn,
                                                           SecretString=json.dumps({"bearer_token": token}))
        self.tickets.require_bearer(token)
        return token

    def start_batch_service(self) -> BedrockBatchStandIn:
        """The batch stand-in, as strict as the profile says Bedrock is here: at least `batch_min_records` records per
        job (the local profile's 10; Bedrock's default quota, 100, where a profile leaves it to Service Quotas)."""
        min_records = get_profile(self.profile).batch.batch_min_records or MIN_RECORDS
        self.batch_service = BedrockBatchStandIn(self.aws.client("s3"), step_s=self.batch_step_s, min_records=min_records,
                                              faults=self.batch_faults).__enter__()
        for name in BATCH_FUNCTIONS:
            self.extra_env.setdefault(name, {})["BEDROCK_BATCH_ENDPOINT_URL"] = self.batch_service.url
        return self.batch_service

    def start_api(self, port: int = 0) -> None:
        self.api = ApiServer(self.deps(), port=port).start()

    def start_ui(self, port: int = 0, principal: str | None = None) -> UiServer:
        """The status page (an operator's view, or `principal`'s jobs only); `review up` writes its URL as `ui`."""
        self.ui = UiServer(self.deps(), principal=principal, port=port).start()
        return self.ui

    def start_workers(self) -> None:
        prof = get_profile(self.profile)
        env = {k: dict(v) for k, v in self.extra_env.items()}
        if self.faults is not None:
            env.setdefault("worker", {})["FAULT_SPEC"] = self.faults.to_env()
        env.setdefault("worker", {})["LOG_LEVEL"] = "INFO"
        self.runtime = LocalRuntime(self.aws, function_specs(self.aws, prof.recovery.sweep_interval_s), env_overrides=env,
                                    concurrency=self.concurrency, log_dir=self.state_dir / "logs").start()

    def stop_workers(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None

    def stop(self) -> None:
        if self.ui is not None:
            self.ui.stop()
            self.ui = None
        if self.api is not None:
            self.api.stop()
            self.api = None
        self.stop_workers()
        if self.tickets is not None:
            self.tickets.stop()
            self.tickets = None
        if self.batch_service is not None:
            self.batch_service.close()
            self.batch_service = None
        self.aws.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def outputs(self) -> dict[str, str]:
        """The deployed template's outputs, and the ticket fake's as a deploy with `-c ticket_url` outputs them, so
        the CLI (`review compensations --redrive`) reaches the same ticket system as the functions."""
        tickets = ({OPTION_OUTPUTS["ticket_url"]: self.tickets.url, OPTION_OUTPUTS["ticket_secret_arn"]:
                    self.ticket_secret_arn} if self.tickets is not None else {})
        return {**self.aws.outputs, **tickets, **self.batch_outputs()}

    def batch_outputs(self) -> dict[str, str]:
        """With the batch stand-in running: the service role's ARN (the template's output, which moto does not deploy:
        the role is not created, its ARN named as the collector's BATCH_ROLE_ARN names it) and the stand-in's URL, so
        the CLI and the tests submit batch jobs as the collector does (Settings.from_outputs)."""
        output = self.aws.template.get("Outputs", {}).get(OPTION_OUTPUTS["batch_role_arn"])
        if self.batch_service is None or output is None:
            return {}
        return {OPTION_OUTPUTS["batch_role_arn"]: str(self.aws.resolve(output["Value"])),
                OPTION_OUTPUTS["batch_endpoint_url"]: self.batch_service.url}

    def deps(self) -> Deps:
        """The repositories and queues of this stack, as the CLI and the tests use them."""
        return local_deps(self.outputs, self.aws.region, self.aws.endpoint, self.profile)

    def write_local_json(self, path: Path = LOCAL_JSON) -> None:
        extra: dict[str, Any] = {"profile": self.profile, "pid": os.getpid()}  # the process serving it
        if self.api is not None:  # the Job API: its base URL and each principal's bearer token, by name
            extra.update(api=self.api.url, api_token=self.api.token, api_tokens=self.api.tokens_by_name)
        if self.ui is not None:  # the status page (`review ui` serves it again, or as one of api_tokens' principals)
            extra["ui"] = self.ui.url
        if self.batch_service is not None:  # Bedrock batch inference's stand-in (boto3 "bedrock", endpoint_url=...)
            extra["batch_service"] = self.batch_service.url
        self.aws.write_local_json(path, extra={**extra, "outputs": self.outputs})

    def describe(self) -> str:
        return json.dumps({"endpoint": self.aws.endpoint, "region": self.aws.region, "outputs": self.outputs}, indent=2)
