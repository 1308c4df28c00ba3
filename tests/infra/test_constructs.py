"""The queue construct owns the rules and fails synth when they are broken; context parsing."""

from __future__ import annotations

import aws_cdk as cdk
import pytest

from contract_review.config import get_profile
from infra.deploy_settings import POWERTOOLS_LAYER_VERSION, DeploySettings
from infra.fargate import fargate_cpu_for
from infra.functions import log_retention
from infra.queues import QueueRuleError, QueueRules, QueueWithDlq
from infra.stack import sweep_rate_minutes

PROD = get_profile("prod")


def _queue(profile=PROD, **kw) -> QueueWithDlq:
    stack = cdk.Stack(cdk.App(), "T")
    args = {"purpose": "analysis", "visibility_timeout_s": 300, "consumer_timeout_s": 50, **kw}
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
    ],
)
def test_broken_rules_fail_synth(update: dict, kw: dict, needle: str) -> None:
    bad = PROD.model_copy(update=update)  # model_copy skips the profile's own validator
    with pytest.raises(QueueRuleError, match=needle):
        _queue(bad, **kw)


def test_fifo_needs_a_name_prefix_and_gets_fifo_names() -> None:
    with pytest.raises(QueueRuleError, match="name prefix"):
        _queue(purpose="results", fifo=True, visibility_timeout_s=720, consumer_timeout_s=120)
    q = _queue(purpose="results", fifo=True, name_prefix="S", visibility_timeout_s=720, consumer_timeout_s=120)
    assert (q.rules.queue_name, q.rules.dlq_name) == ("S-results.fifo", "S-results-dlq.fifo")


def test_rules_report_every_violation_at_once() -> None:
    rules = QueueRules(purpose="x", visibility_timeout_s=10, consumer_timeout_s=10, max_receive_count=0,
                       retention_s=86400, dlq_retention_s=60, alarm_threshold=3, alarm_period_s=300,
                       fifo=True, queue_name="x", dlq_name="x-dlq.fifo")
    problems = rules.violations()
    assert len(problems) == 4, problems  # visibility, receive count, DLQ retention, fifo name


def test_settings_from_context_defaults() -> None:
    s = DeploySettings.from_context({}.get)
    assert (s.profile.name, s.worker_kind, s.model_provider, s.stack_name) == ("prod", "lambda", "bedrock", "ContractReview")
    assert s.powertools_layer_version == POWERTOOLS_LAYER_VERSION and not s.is_disposable
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
    ],
)
def test_settings_reject_bad_context(ctx: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        DeploySettings.from_context(ctx.get)


def test_fault_spec_is_parsed_for_local() -> None:
    s = DeploySettings.from_context({"profile": "local", "fault_spec": '{"transient_rate": 0.2}'}.get)
    assert s.fault_spec is not None and s.fault_spec.transient_rate == 0.2


def test_small_helpers() -> None:
    assert [sweep_rate_minutes(x) for x in (0.5, 1, 60, 61, 180)] == [1, 1, 1, 2, 3]
    assert log_retention(1) == cdk.aws_logs.RetentionDays.ONE_DAY
    assert log_retention(30) == cdk.aws_logs.RetentionDays.ONE_MONTH
    assert (fargate_cpu_for(1024), fargate_cpu_for(512), fargate_cpu_for(3072)) == (512, 256, 512)
