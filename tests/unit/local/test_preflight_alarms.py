"""`review preflight` on a deployed stack counts the alarm topic's confirmed subscribers (output AlarmTopicArn): every
alarm notifies that topic only, and an email subscription reaches someone only once confirmed.
ListSubscriptionsByTopic, answered by botocore's Stubber (the rest of preflight runs on Stubbers)."""

from __future__ import annotations

from typing import Any

from review_local.preflight import preflight
from review_local.preflight_account import check_alarm_subscribers

from .. import bedrock_stubs as bs
from .test_preflight import Clients, WithClients, deployed_stack_run

TOPIC = "arn:aws:sns:us-east-1:123456789012:Prod-AlarmsTopic1A2B3C4D-EXAMPLE"


def _sub(arn: str, protocol: str = "email") -> dict[str, Any]:
    return {"SubscriptionArn": arn, "Owner": "123456789012", "Protocol": protocol, "Endpoint": "oncall@example.com",
            "TopicArn": TOPIC}


def test_a_confirmed_subscriber_is_ok_and_pending_ones_are_named():
    sns, stub = bs.stubbed("sns")
    stub.add_response("list_subscriptions_by_topic", {"Subscriptions": [_sub("PendingConfirmation")], "NextToken": "t"},
                      expected_params={"TopicArn": TOPIC})
    stub.add_response("list_subscriptions_by_topic", {"Subscriptions": [_sub(f"{TOPIC}:1234", "https")]},
                      expected_params={"TopicArn": TOPIC, "NextToken": "t"})
    with stub:
        check = check_alarm_subscribers(sns, TOPIC)
    assert check.ok is True and check.line == "1 confirmed (https); 1 waiting for confirmation (the link in the " \
                                              "email AWS sent)"


def test_only_unconfirmed_or_no_subscribers_fail_with_what_to_do():
    sns, stub = bs.stubbed("sns")
    stub.add_response("list_subscriptions_by_topic", {"Subscriptions": [_sub("PendingConfirmation")]})
    stub.add_response("list_subscriptions_by_topic", {"Subscriptions": []})
    with stub:
        pending, nobody = check_alarm_subscribers(sns, TOPIC), check_alarm_subscribers(sns, TOPIC)
    for check in (pending, nobody):
        assert check.ok is False and "alarms reach nobody" in check.line
        assert f"aws sns subscribe --topic-arn {TOPIC} --protocol email" in check.remedy
    assert "1 waiting for confirmation" in pending.line and "waiting" not in nobody.line


def test_an_unreadable_topic_is_not_checked():
    sns, stub = bs.stubbed("sns")
    stub.add_client_error("list_subscriptions_by_topic", service_error_code="AuthorizationError", http_status_code=403)
    with stub:
        check = check_alarm_subscribers(sns, TOPIC)
    assert check.ok is None and "sns:ListSubscriptionsByTopic" in check.line


def test_preflight_of_a_deployed_stack_whose_alarms_reach_nobody_fails():
    c = Clients()
    deployed_stack_run(c, {"AlarmTopicArn": TOPIC})
    sns, stub = bs.stubbed("sns")
    stub.add_response("list_subscriptions_by_topic", {"Subscriptions": [_sub("PendingConfirmation")]},
                      expected_params={"TopicArn": TOPIC})
    lines: list[str] = []
    with stub:
        ok = preflight("Prod", None, session_factory=lambda **_: WithClients(c, {"sns": sns}), echo=lines.append)
    stub.assert_no_pending_responses()
    assert ok is False
    assert any(line.startswith("  alarm subscribers: FAILED - no confirmed subscriber") for line in lines), lines
