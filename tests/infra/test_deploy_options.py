"""Stack options of the ops guards, synthesized as `cdk deploy -c ...` builds them (one app, one synth):
the concurrency guards (`-c intake_max_concurrency`, `-c worker_reserved_concurrency`) and the ticket system's
credentials with a customer-managed key (`-c ticket_secret_arn` complete, `-c ticket_secret_kms_key`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import function_by_handler, getatt_id, policy_statements_for_role, resources, role_id

SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:contract-review/tickets-AbC123"
KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
CONTEXTS = {
    "Guards": {"intake_max_concurrency": "3", "worker_reserved_concurrency": "0", "default_budget_usd": "45",
               "principal_daily_spend_usd": "none", "api_requests_per_minute": "120", "monthly_budget_usd": "none",
               "alarm_email": "none"},
    "Reserved": {"worker_concurrency": "7", "worker_reserved_concurrency": "50"},
    "TicketKms": {"ticket_url": "https://tickets.example.com/api", "ticket_secret_arn": SECRET,
                  "ticket_secret_kms_key": KEY, "worker": "fargate"},
}


@pytest.fixture(scope="module")
def by_context(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    from infra import nag
    from infra.application import add_stack, new_app
    from infra.deploy_settings import DeploySettings

    app = new_app(outdir=str(tmp_path_factory.mktemp("cdk.out.options")))
    for name, ctx in CONTEXTS.items():
        context = {"profile": "prod", "stack_name": name, **ctx}
        add_stack(app, DeploySettings.from_context(context.get))
    nag.apply(app)  # a synth that succeeds has every cdk-nag finding acknowledged
    assembly = app.synth()
    return json.loads(json.dumps({n: assembly.get_stack_by_name(n).template for n in CONTEXTS}))


def _mapping_concurrency(t: dict[str, Any]) -> dict[str, int | None]:
    """Function handler module -> its mapping's MaximumConcurrency."""
    out: dict[str, int | None] = {}
    for r in resources(t, "AWS::Lambda::EventSourceMapping").values():
        fn = t["Resources"][getatt_id(r["Properties"]["FunctionName"])]["Properties"]
        out[fn["Handler"].rsplit(".", 2)[-2]] = r["Properties"].get("ScalingConfig", {}).get("MaximumConcurrency")
    return out


def test_the_concurrency_guards_follow_their_stack_options(by_context: dict[str, dict[str, Any]]) -> None:
    # -c intake_max_concurrency=3 -c worker_reserved_concurrency=0: intake capped at 3, the worker reserves nothing (the
    # sweeper and the batch collector still reserve 1 each: one run at a time)
    guards = by_context["Guards"]
    assert _mapping_concurrency(guards) == {"intake": 3, "worker": 20, "aggregator": None}
    _, worker = function_by_handler(guards, "worker.handler")
    assert "ReservedConcurrentExecutions" not in worker
    assert guards["Outputs"]["ReservedConcurrency"]["Value"] == "2"
    # -c worker_concurrency=7 -c worker_reserved_concurrency=50: a fleet of 7 with 50 reserved; intake the profile's
    reserved = by_context["Reserved"]
    assert _mapping_concurrency(reserved) == {"intake": 5, "worker": 7, "aggregator": None}
    _, worker = function_by_handler(reserved, "worker.handler")
    assert worker["ReservedConcurrentExecutions"] == 50
    assert reserved["Outputs"]["ReservedConcurrency"]["Value"] == "52"


def test_a_customer_managed_key_is_granted_for_decrypting_through_secrets_manager_only(
        by_context: dict[str, dict[str, Any]]) -> None:
    t = by_context["TicketKms"]
    for role in ("intake", "worker", "aggregator", "sweeper", "api", "fargate"):
        statements = policy_statements_for_role(t, role_id(t, role))
        reads = [st for st in statements if "secretsmanager:" in json.dumps(st["Action"])]
        decrypts = [st for st in statements if "kms:Decrypt" in json.dumps(st["Action"]) and st["Resource"] == KEY]
        if role in ("aggregator", "sweeper", "fargate"):  # the roles whose code calls the ticket system
            assert [(st["Action"], st["Resource"]) for st in reads] == [("secretsmanager:GetSecretValue", SECRET)]
            (decrypt,) = decrypts
            assert decrypt["Action"] == "kms:Decrypt"
            assert json.dumps(decrypt["Condition"]["StringEquals"]["kms:ViaService"]).startswith('{"Fn::Join"')
            assert "secretsmanager." in json.dumps(decrypt["Condition"])
        else:
            assert not reads and not decrypts, role
    _, aggregator = function_by_handler(t, "aggregator.handler")
    assert aggregator["Environment"]["Variables"]["TICKET_SECRET_ARN"] == SECRET


def test_the_spend_limits_follow_their_stack_options_into_the_functions_and_the_cli(
        by_context: dict[str, dict[str, Any]]) -> None:
    from contract_review.config.settings import PROFILE_OVERRIDES_ENV, Settings

    guards = by_context["Guards"]
    # -c default_budget_usd=45 -c principal_daily_spend_usd=none -c api_requests_per_minute=120: every function's
    # profile, and the CLI's (from the stack's outputs), have those limits
    for handler in ("intake.handler", "api.handler"):
        _, fn = function_by_handler(guards, handler)
        overrides = json.loads(fn["Environment"]["Variables"][PROFILE_OVERRIDES_ENV])
        assert overrides == {"default_budget_usd": 45.0, "principal_daily_spend_usd": None, "api_requests_per_minute": 120}
    outputs = {k: str(v["Value"]) for k, v in guards["Outputs"].items() if isinstance(v["Value"], str)}
    cli = Settings.from_outputs({**{k: "x" for k in _required_outputs()}, **outputs}, "prod").profile.limits
    assert (cli.default_budget_usd, cli.principal_daily_spend_usd, cli.api_requests_per_minute) == (45.0, None, 120)
    # -c monthly_budget_usd=none: no cost budget; the other stacks have the default one
    assert not resources(guards, "AWS::Budgets::Budget") and resources(by_context["Reserved"], "AWS::Budgets::Budget")


def _required_outputs() -> list[str]:
    from contract_review.config.settings import RESOURCES

    return [r.output for r in RESOURCES]


def test_alarm_email_none_deploys_a_topic_without_a_subscriber(by_context: dict[str, dict[str, Any]]) -> None:
    guards = by_context["Guards"]  # -c alarm_email=none: said on purpose
    assert resources(guards, "AWS::SNS::Subscription") == {}
    assert "AlarmTopicArn" in guards["Outputs"]  # what to subscribe yourself


def test_a_kept_stack_needs_an_alarm_address_or_an_explicit_none() -> None:
    from infra.deploy_settings import DeploySettings, DeploySettingsError

    with pytest.raises(DeploySettingsError, match="alarm_email=none"):
        DeploySettings.from_context({"profile": "prod"}.get).require_alarm_destination()
    for ctx in ({"profile": "prod", "alarm_email": "none"}, {"profile": "prod", "alarm_email": "ops@example.com"},
                {"profile": "local"}):  # the local stack is thrown away: its alarms page nobody anyway
        DeploySettings.from_context(ctx.get).require_alarm_destination()
    with pytest.raises(DeploySettingsError, match="not an email address"):
        DeploySettings.from_context({"profile": "prod", "alarm_email": "nobody"}.get)


def test_the_fargate_base_image_is_taken_only_pinned_by_digest_and_only_for_the_fargate_worker() -> None:
    from infra.deploy_settings import DeploySettings, DeploySettingsError

    digest = "sha256:" + "ab" * 32  # a digest's shape
    for image in (f"python:3.12-slim@{digest}", f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/mirror/python@{digest}"):
        ctx = {"profile": "prod", "worker": "fargate", "fargate_base_image": image}
        assert DeploySettings.from_context(ctx.get).fargate_base_image == image
    assert DeploySettings.from_context({"profile": "prod", "worker": "fargate"}.get).fargate_base_image == ""
    for image in ("python:3.12-slim", "python:3.12-slim@sha256:abc", f"python:3.12-slim@{digest.upper()}"):
        with pytest.raises(DeploySettingsError, match="pinned by digest"):  # a tag moves: not what this option is for
            DeploySettings.from_context({"profile": "prod", "worker": "fargate", "fargate_base_image": image}.get)
    with pytest.raises(DeploySettingsError, match="worker=fargate"):
        DeploySettings.from_context({"profile": "prod", "fargate_base_image": f"python:3.12-slim@{digest}"}.get)
