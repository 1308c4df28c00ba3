"""A queue with its dead-letter queue and its alarms: the one place that owns the queue rules.

Rules (checked at construction, so a broken profile fails `cdk synth`):
- visibility timeout >= 6 x the consumer's function timeout (AWS guidance for Lambda event
  source mappings: a slow invocation must not let the message reappear while it still runs);
- visibility timeout <= 12 h (SQS limit);
- 1 <= maxReceiveCount <= 1000 (1 would dead-letter on the first failure: see the profile);
- retention within SQS limits (60 s .. 14 days) and DLQ retention >= queue retention (a message
  must not expire in the DLQ sooner than it could have lived in its source queue; AWS keeps the
  original enqueue timestamp on a DLQ move for standard queues);
- every queue has an explicit name `<stack>-<purpose>[-dlq][.fifo]` of at most 80 characters
  (FIFO names end in `.fifo`; moto needs them, and a DLQ's redrive-allow policy names its one
  source queue by ARN, which a generated name would turn into a circular reference);
- the DLQ alarm threshold is >= 1 and its period a CloudWatch-valid period.

Alarms: DLQ depth (messages visible >= threshold) and the age of the oldest message, on the
queue and on its DLQ (a dead letter about to reach the end of its retention); every alarm
notifies `alarm_action`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from contract_review.config.constants import LAMBDA_VISIBILITY_FACTOR
from contract_review.config.profile import Profile

SQS_MAX_VISIBILITY_S = 12 * 3600
SQS_MIN_RETENTION_S = 60
SQS_MAX_RETENTION_S = 14 * 86400
SQS_MAX_RECEIVE_COUNT = 1000
SQS_MAX_QUEUE_NAME = 80
_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,75}(\.fifo)?$")
# The stack's queues: (purpose, FIFO). Names are derived from the stack name (`queue_names`).
PURPOSES = (("intake", False), ("analysis", False), ("results", True))
DLQ_AGE_WARNING_DAYS = 2  # the DLQ age alarm fires this long before a dead letter would expire


def queue_names(prefix: str, purpose: str, fifo: bool) -> tuple[str, str]:
    """(queue name, DLQ name) of one of the stack's queues."""
    ext = ".fifo" if fifo else ""
    return f"{prefix}-{purpose}{ext}", f"{prefix}-{purpose}-dlq{ext}"


def max_name_prefix() -> int:
    """The longest stack name whose every queue name stays within SQS's 80 characters."""
    return SQS_MAX_QUEUE_NAME - max(len(queue_names("", p, fifo)[1]) for p, fifo in PURPOSES)


class QueueRuleError(ValueError):
    """The queue configuration breaks one of the rules above; raised at synth time."""


@dataclass(frozen=True)
class QueueRules:
    """The numbers one queue is built from (taken from the profile by `QueueWithDlq`)."""

    purpose: str
    visibility_timeout_s: int
    consumer_timeout_s: int
    max_receive_count: int
    retention_s: int
    dlq_retention_s: int
    alarm_threshold: int
    alarm_period_s: int
    age_alarm_s: int = 3600
    fifo: bool = False
    queue_name: str | None = None
    dlq_name: str | None = None

    def violations(self) -> list[str]:
        v: list[str] = []
        p = self.purpose
        need = LAMBDA_VISIBILITY_FACTOR * self.consumer_timeout_s
        if self.visibility_timeout_s < need:
            v.append(f"{p}: visibility timeout {self.visibility_timeout_s}s must be >= "
                     f"{LAMBDA_VISIBILITY_FACTOR} x consumer timeout {self.consumer_timeout_s}s = {need}s")
        if self.visibility_timeout_s > SQS_MAX_VISIBILITY_S:
            v.append(f"{p}: visibility timeout {self.visibility_timeout_s}s exceeds the SQS maximum of 12 h")
        if self.consumer_timeout_s <= 0:
            v.append(f"{p}: consumer timeout must be positive")
        if not 1 <= self.max_receive_count <= SQS_MAX_RECEIVE_COUNT:
            v.append(f"{p}: maxReceiveCount {self.max_receive_count} must be within 1..{SQS_MAX_RECEIVE_COUNT}")
        for label, secs in (("retention", self.retention_s), ("DLQ retention", self.dlq_retention_s)):
            if not SQS_MIN_RETENTION_S <= secs <= SQS_MAX_RETENTION_S:
                v.append(f"{p}: {label} {secs}s must be within {SQS_MIN_RETENTION_S}s..{SQS_MAX_RETENTION_S}s")
        if self.dlq_retention_s < self.retention_s:
            v.append(f"{p}: DLQ retention {self.dlq_retention_s}s must be >= queue retention {self.retention_s}s")
        v += self._name_violations()
        if self.alarm_threshold < 1:
            v.append(f"{p}: DLQ alarm threshold must be >= 1")
        if self.alarm_period_s not in (10, 30) and (self.alarm_period_s < 60 or self.alarm_period_s % 60):
            v.append(f"{p}: DLQ alarm period {self.alarm_period_s}s must be 10, 30 or a multiple of 60")
        if not 60 <= self.age_alarm_s < self.retention_s:
            v.append(f"{p}: age alarm {self.age_alarm_s}s must be >= 60s and shorter than the retention "
                     f"{self.retention_s}s (a message must not expire before anyone hears of it)")
        return v

    def _name_violations(self) -> list[str]:
        v: list[str] = []
        p = self.purpose
        for label, name in (("queue", self.queue_name), ("DLQ", self.dlq_name)):
            if not name:
                v.append(f"{p}: {label} needs an explicit name{' ending in .fifo' if self.fifo else ''}")
                continue
            if not _QUEUE_NAME_RE.match(name) or len(name) > SQS_MAX_QUEUE_NAME:
                v.append(f"{p}: {label} name {name!r} is not a valid SQS queue name")
            if name.endswith(".fifo") != self.fifo:
                v.append(f"{p}: {label} name {name!r} must {'' if self.fifo else 'not '}end in .fifo")
        return v

    def check(self) -> None:
        problems = self.violations()
        if problems:
            raise QueueRuleError("queue rules broken:\n  - " + "\n  - ".join(problems))


class QueueWithDlq(Construct):
    """Queue + DLQ (same kind, explicit names) + alarms: DLQ depth, oldest-message age of both.

    Both queues use SQS-managed server-side encryption and deny non-TLS requests. The DLQ's
    redrive-allow policy admits only its own source queue (`byQueue`).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        profile: Profile,
        purpose: str,
        visibility_timeout_s: int,
        consumer_timeout_s: int,
        name_prefix: str,
        age_alarm_s: int,
        alarm_action: cloudwatch.IAlarmAction | None = None,
        fifo: bool = False,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
    ) -> None:
        super().__init__(scope, construct_id)
        queue_name, dlq_name = queue_names(name_prefix, purpose, fifo)
        self.rules = QueueRules(
            purpose=purpose,
            visibility_timeout_s=visibility_timeout_s,
            consumer_timeout_s=consumer_timeout_s,
            max_receive_count=profile.queues.max_receive_count,
            retention_s=profile.queues.queue_retention_days * 86400,
            dlq_retention_s=profile.queues.dlq_retention_days * 86400,
            alarm_threshold=profile.alarms.dlq_alarm_threshold,
            alarm_period_s=profile.alarms.dlq_alarm_period_s,
            age_alarm_s=age_alarm_s,
            fifo=fifo,
            queue_name=queue_name,
            dlq_name=dlq_name,
        )
        self.rules.check()
        r = self.rules
        fifo_props: dict[str, object] = {"fifo": True, "content_based_deduplication": False} if fifo else {}
        # The source queue's ARN from its name: a GetAtt would be a cycle (its redrive policy names the DLQ).
        source_arn = Stack.of(self).format_arn(service="sqs", resource=queue_name,
                                               arn_format=ArnFormat.NO_RESOURCE_NAME)

        self.dlq = sqs.Queue(
            self,
            "Dlq",
            queue_name=dlq_name,
            retention_period=Duration.seconds(r.dlq_retention_s),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=removal_policy,
            redrive_allow_policy=sqs.RedriveAllowPolicy(
                redrive_permission=sqs.RedrivePermission.BY_QUEUE,
                source_queues=[sqs.Queue.from_queue_arn(self, "Source", source_arn)],
            ),
            **fifo_props,  # type: ignore[arg-type]  # jsii kwargs: bool values typed by name, not by this dict
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            queue_name=queue_name,
            visibility_timeout=Duration.seconds(r.visibility_timeout_s),
            retention_period=Duration.seconds(r.retention_s),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dlq, max_receive_count=r.max_receive_count),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=removal_policy,
            **fifo_props,  # type: ignore[arg-type]  # jsii kwargs: bool values typed by name, not by this dict
        )
        self.alarms: list[cloudwatch.Alarm] = []
        self.alarm = self._alarm(
            "DlqAlarm", f"{purpose}-dlq-depth",
            f"{purpose} DLQ: >= {r.alarm_threshold} message(s) visible. One dead letter is one chunk or document "
            "that will not be processed: inspect with `review dlq list` (docs/runbook.md).",
            self.dlq.metric_approximate_number_of_messages_visible(
                period=Duration.seconds(r.alarm_period_s), statistic="Maximum"),
            r.alarm_threshold, alarm_action)
        age_period = Duration.seconds(60)
        self._alarm(
            "AgeAlarm", f"{purpose}-oldest-message",
            f"{purpose} queue: a message has waited >= {r.age_alarm_s}s. The consumer is down, throttled or too "
            "slow for the backlog (docs/runbook.md).",
            self.queue.metric_approximate_age_of_oldest_message(period=age_period, statistic="Maximum"),
            r.age_alarm_s, alarm_action, evaluation_periods=5)
        dlq_age = r.dlq_retention_s - DLQ_AGE_WARNING_DAYS * 86400
        self._alarm(
            "DlqAgeAlarm", f"{purpose}-dlq-expiring",
            f"{purpose} DLQ: a dead letter is {dlq_age // 86400} days old and expires in "
            f"{DLQ_AGE_WARNING_DAYS} days; redrive or record it (`review dlq list`).",
            self.dlq.metric_approximate_age_of_oldest_message(period=Duration.seconds(300), statistic="Maximum"),
            dlq_age, alarm_action)

    def _alarm(self, construct_id: str, name: str, description: str, metric: cloudwatch.IMetric, threshold: float,
               action: cloudwatch.IAlarmAction | None, evaluation_periods: int = 1) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self, construct_id,
            alarm_name=f"{Stack.of(self).stack_name}-{name}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            # An idle queue publishes no datapoints: nothing waits, nothing is dead-lettered.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        if action is not None:
            alarm.add_alarm_action(action)
        self.alarms.append(alarm)
        return alarm
