"""The whole local stack: embedded AWS with the template deployed, plus the worker sandboxes."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract_review.config.profile import get_profile
from contract_review.config.settings import OPTION_OUTPUTS
from contract_review.domain.ports import Deps
from contract_review.doubles.spec import FaultSpec

from .api_server import ApiServer
from .connect import local_deps
from .embedded import LOCAL_JSON, STATE_DIR, EmbeddedAws, synth
from .runtime import LocalRuntime, function_specs
from .ticket_service import TicketFaults, TicketServiceFake
from .ui_server import UiServer

TICKET_SECRET_NAME = "ticket-credentials"
SAGA_FUNCTIONS = ("aggregator", "sweeper")  # where the side effects run: they get the ticket system's URL


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
        return {**self.aws.outputs, **tickets}

    def deps(self) -> Deps:
        """The repositories and queues of this stack, as the CLI and the tests use them."""
        return local_deps(self.outputs, self.aws.region, self.aws.endpoint, self.profile)

    def write_local_json(self, path: Path = LOCAL_JSON) -> None:
        extra: dict[str, Any] = {"profile": self.profile}
        if self.api is not None:  # the Job API: its base URL and each principal's bearer token, by name
            extra.update(api=self.api.url, api_token=self.api.token, api_tokens=self.api.tokens_by_name)
        if self.ui is not None:  # the status page (`review ui` serves it again, or as one of api_tokens' principals)
            extra["ui"] = self.ui.url
        self.aws.write_local_json(path, extra={**extra, "outputs": self.outputs})

    def describe(self) -> str:
        return json.dumps({"endpoint": self.aws.endpoint, "region": self.aws.region, "outputs": self.outputs}, indent=2)
