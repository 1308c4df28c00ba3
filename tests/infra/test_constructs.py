"""The queue construct owns the rules and fails synth when they are broken; context parsing."""

from __future__ import annotations

import aws_cdk as cdk
import pytest

from contract_review.config.profile import FLAT_FIELDS, get_profile
from infra.deploy_settings import MAX_STACK_NAME, POWERTOOLS_VERSION, DeploySettings
from infra.fargate import fargate_cpu_for
from infra.functions import log_retention, powertools_parameter
from infra.queues import SQS_MAX_QUEUE_NAME, QueueRuleError, QueueRules, QueueWithDlq, queue_names
from infra.stack import sweep_rate_minutes

PROD = get_profile("prod")


def _queue(profile=PROD, **kw) -> QueueWithDlq:
    stack = cdk.Stack(cdk.App(), "T")
    args = {"purpose": "analysis", "visibility_timeout_s": 300, "consumer_timeout_s": 50, "name_prefix": "S",
            "age_alarm_s": 3600, **kw}
    return QueueWithDlq(stack, "Q", profile=profile, **args)


def test_valid_profile_builds() -> None:
    q = _queue()
    assert q.rules.max_receive_count == 5 and q.rules.violations() == []


@pytest.mark.parametrize(
    "update,kw,needle",
    [
        ({"max_receive_count": 0}, {}, "maxReceiveCount"),
        ({}, {"visibility_timeout_s": 299}, "6 x consumer timeout"),
        ({"dlq_retention_days": 3}, {}, "DLQ retention"),
        ({"dlq_retention_days": 15}, {}, "DLQ retention"),
        ({"dlq_alarm_threshold": 0}, {}, "alarm threshold"),
        ({"dlq_alarm_period_s": 90}, {}, "alarm period"),
        ({}, {"visibility_timeout_s": 50_000, "consumer_timeout_s": 60}, "12 h"),
        ({}, {"age_alarm_s": 14 * 86400}, "age alarm"),
    ],
)
def test_broken_rules_fail_synth(update: dict, kw: dict, needle: str) -> None:
    # model_copy skips the profile's own validator: the construct's rules must catch it
    bad = PROD.model_copy(update={FLAT_FIELDS[k]: getattr(PROD, FLAT_FIELDS[k]).model_copy(update={k: v})
                                  for k, v in update.items()})
    with pytest.raises(QueueRuleError, match=needle):
        _queue(bad, **kw)


def test_every_queue_gets_an_explicit_name_and_fifo_queues_fifo_names() -> None:
    q = _queue(purpose="results", fifo=True, visibility_timeout_s=720, consumer_timeout_s=120)
    assert (q.rules.queue_name, q.rules.dlq_name) == ("S-results.fifo", "S-results-dlq.fifo")
    q = _queue()
    assert (q.rules.queue_name, q.rules.dlq_name) == ("S-analysis", "S-analysis-dlq")


def test_rules_report_every_violation_at_once() -> None:
    rules = QueueRules(purpose="x", visibility_timeout_s=10, consumer_timeout_s=10, max_receive_count=0,
                       retention_s=86400, dlq_retention_s=60, alarm_threshold=3, alarm_period_s=300,
                       fifo=True, queue_name="x", dlq_name="x-dlq.fifo")
    problems = rules.violations()
    assert len(problems) == 4, problems  # visibility, receive count, DLQ retention, fifo name


def test_a_queue_without_a_name_breaks_the_rules() -> None:
    rules = QueueRules(purpose="x", visibility_timeout_s=60, consumer_timeout_s=10, max_receive_count=5,
                       retention_s=86400, dlq_retention_s=86400, alarm_threshold=1, alarm_period_s=60)
    assert rules.violations() == ["x: queue needs an explicit name", "x: DLQ needs an explicit name"]


def test_the_longest_stack_name_keeps_every_queue_name_within_the_sqs_limit() -> None:
    # GIVEN the longest stack name the settings accept (the FIFO DLQ `<stack>-results-dlq.fifo` binds)
    longest = "S" + "x" * (MAX_STACK_NAME - 1)
    DeploySettings(profile=PROD, stack_name=longest)
    names = [n for purpose, fifo in (("intake", False), ("analysis", False), ("results", True))
             for n in queue_names(longest, purpose, fifo)]
    # THEN every queue name fits, the FIFO DLQ exactly; one character more is refused at synth
    assert max(len(n) for n in names) == SQS_MAX_QUEUE_NAME == len(f"{longest}-results-dlq.fifo")
    with pytest.raises(ValueError, match=f"at most {MAX_STACK_NAME} characters"):
        DeploySettings(profile=PROD, stack_name=longest + "x")
    assert MAX_STACK_NAME == 63


def test_settings_from_context_defaults() -> None:
    s = DeploySettings.from_context({}.get)
    assert (s.profile.name, s.worker_kind, s.model_provider, s.stack_name) == ("prod", "lambda", "bedrock", "ContractReview")
    assert s.powertools_version == POWERTOOLS_VERSION and not s.is_disposable and s.alarm_email == ""
    local = DeploySettings.from_context({"profile": "local", "worker": "fargate", "stack_name": "Dev-1"}.get)
    assert (local.model_provider, local.worker_kind, local.stack_name, local.is_disposable) == ("offline", "fargate", "Dev-1", True)


@pytest.mark.parametrize(
    "ctx,needle",
    [
        ({"profile": "staging"}, "unknown profile"),
        ({"worker": "ec2"}, "worker"),
        ({"model_provider": "openai"}, "model_provider"),
        ({"fault_spec": '{"transient_rate": 0.2}'}, "never in the prod"),
        ({"auto_delete_objects": "true"}, "local profile"),
        ({"stack_name": "9bad_name"}, "stack_name"),
        ({"powertools_version": "38"}, "powertools_version"),
        ({"alarm_email": "not-an-address"}, "alarm_email"),
        ({"ticket_url": "tickets.example.com"}, "ticket_url"),  # the external ticket system: an http(s) URL
        ({"ticket_url": "http://tickets.example.com/api"}, "https:// is required"),  # credentials go over it
        ({"ticket_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:t"}, "give ticket_url too"),
        ({"ticket_url": "https://t.example.com", "ticket_secret_arn": "arn:aws:s3:::bucket"}, "Secrets Manager secret ARN"),
        ({"ticket_url": "https://t.example.com", "ticket_secret_arn": "my secret"}, "Secrets Manager secret ARN"),
        ({"ticket_url": "https://t.example.com", "ticket_secret_kms_key": "arn:aws:kms:eu-west-1:123456789012:key/k"},
         "give ticket_secret_arn too"),
        ({"intake_max_concurrency": "1"}, "intake_max_concurrency 1 must be within 2..1000"),
        ({"worker_reserved_concurrency": "5"}, "at least the worker's maximum concurrency 20"),
        ({"worker_reserved_concurrency": "1001"}, "worker_reserved_concurrency"),
    ],
)
def test_settings_reject_bad_context(ctx: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        DeploySettings.from_context(ctx.get)


def test_ticket_url_is_read_from_context_and_optional() -> None:
    s = DeploySettings.from_context({"ticket_url": " https://tickets.example.com/api "}.get)
    assert s.ticket_url == "https://tickets.example.com/api"
    assert DeploySettings.from_context({}.get).ticket_url == ""  # none: the saga skips the ticket step


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:9000/api", "http://[::1]:80",
                                 "https://tickets.example.com"])
def test_http_is_taken_only_to_a_loopback_host(url: str) -> None:
    assert DeploySettings.from_context({"ticket_url": url}.get).ticket_url == url


def test_a_ticket_secret_is_granted_exactly_or_by_its_name() -> None:
    base = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:contract-review/tickets"
    complete = DeploySettings.from_context({"ticket_url": "https://t.example.com", "ticket_secret_arn": base + "-AbC123"}.get)
    assert complete.ticket_secret_resource == base + "-AbC123"  # the one secret with that suffix
    partial = DeploySettings.from_context({"ticket_url": "https://t.example.com", "ticket_secret_arn": base}.get)
    assert partial.ticket_secret_resource == base + "-??????"  # the secret of that name, whatever its suffix
    named = DeploySettings.from_context({"ticket_url": "https://t.example.com", "ticket_secret_arn": "ct/tickets"}.get)
    assert named.ticket_secret_resource == "ct/tickets-??????"  # the stack puts its own account and region around it


def test_the_worker_reserves_its_maximum_unless_told_otherwise() -> None:
    one = {"sweeper": 1, "collector": 1}  # always: one run at a time each
    assert DeploySettings.from_context({}.get).reserved_concurrency == {"worker": 20, **one}
    assert DeploySettings.from_context({"worker_concurrency": "7"}.get).reserved_concurrency == {"worker": 7, **one}
    assert DeploySettings.from_context({"worker_reserved_concurrency": "0"}.get).reserved_concurrency == one
    assert DeploySettings.from_context({"worker": "fargate"}.get).reserved_concurrency == one  # no mapping to feed
    assert DeploySettings.from_context({"intake_max_concurrency": "9"}.get).profile.functions.intake_max_concurrency == 9


def test_fault_spec_is_parsed_for_local() -> None:
    s = DeploySettings.from_context({"profile": "local", "fault_spec": '{"transient_rate": 0.2}'}.get)
    assert s.fault_spec is not None and s.fault_spec.transient_rate == 0.2


def test_small_helpers() -> None:
    assert [sweep_rate_minutes(x) for x in (0.5, 1, 60, 61, 180)] == [1, 1, 1, 2, 3]
    assert log_retention(1) == cdk.aws_logs.RetentionDays.ONE_DAY
    assert log_retention(30) == cdk.aws_logs.RetentionDays.ONE_MONTH
    assert (fargate_cpu_for(1024), fargate_cpu_for(512), fargate_cpu_for(3072)) == (512, 256, 512)


def test_context_sets_the_alarm_email_and_the_powertools_release() -> None:
    s = DeploySettings.from_context({"alarm_email": " ops@example.com ", "powertools_version": "latest"}.get)
    assert (s.alarm_email, s.powertools_version) == ("ops@example.com", "latest")
    assert powertools_parameter(s.powertools_version) == "/aws/service/powertools/python/arm64/python3.12/latest"
    # `review preflight` names the same parameter without the CDK app
    from contract_review.config.constants import POWERTOOLS_LAYER_PARAMETER_PATH
    assert powertools_parameter("3.37.0") == f"{POWERTOOLS_LAYER_PARAMETER_PATH}/3.37.0"


def test_the_default_powertools_layer_is_the_pinned_library_release() -> None:
    from infra.functions import FUNCTIONS_DIR

    requirements = (FUNCTIONS_DIR.parent / "requirements.txt").read_text().splitlines()
    (pin,) = [line.split("==")[1] for line in requirements if line.startswith("aws-lambda-powertools==")]
    assert POWERTOOLS_VERSION == pin


def test_a_profile_whose_model_call_could_outlive_the_fargate_stop_timeout_is_refused() -> None:
    # a call in flight at SIGTERM must end, and its chunk be released, before ECS's SIGKILL
    fields = PROD.model_dump()
    with pytest.raises(ValueError, match="must fit the Fargate stop timeout"):
        type(PROD).model_validate({**fields, "model_read_timeout_s": 115})
    with pytest.raises(ValueError, match="fargate_stop_timeout_s"):
        type(PROD).model_validate({**fields, "fargate_stop_timeout_s": 121})
    ok = type(PROD).model_validate({**fields, "model_read_timeout_s": 60, "fargate_stop_timeout_s": 70})
    assert ok.tier1.model_read_timeout_s + ok.tier1.handoff_margin_s <= ok.fargate.fargate_stop_timeout_s
