"""A queue with its dead-letter queue and DLQ alarm: the one place that owns the queue rules.

Rules (checked at construction, so a broken profile fails `cdk synth`):
- visibility timeout >= 6 x the consumer's function timeout (AWS guidance for Lambda event
  source mappings: a slow invocation must not let the message reappear while it still runs);
- visibility timeout <= 12 h (SQS limit);
- 1 <= maxReceiveCount <= 1000 (1 would dead-letter on the first failure: see the profile);
- retention within SQS limits (60 s .. 14 days) and DLQ retention >= queue retention (a message
  must not expire in the DLQ sooner than it could have lived in its source queue; AWS keeps the
  original enqueue timestamp on a DLQ move for standard queues);
- FIFO queues (and their DLQs, which must be FIFO too) carry explicit names ending in `.fifo`;
- the DLQ alarm threshold is >= 1 and its period a CloudWatch-valid period.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from contract_review.config import LAMBDA_VISIBILITY_FACTOR, Profile

SQS_MAX_VISIBILITY_S = 12 * 3600
SQS_MIN_RETENTION_S = 60
SQS_MAX_RETENTION_S = 14 * 86400
SQS_MAX_RECEIVE_COUNT = 1000
_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,75}(\.fifo)?$")


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
        for label, name in (("queue", self.queue_name), ("DLQ", self.dlq_name)):
            if self.fifo and not name:
                v.append(f"{p}: FIFO {label} needs an explicit name ending in .fifo")
            if name is not None:
                if not _QUEUE_NAME_RE.match(name) or len(name) > 80:
                    v.append(f"{p}: {label} name {name!r} is not a valid SQS queue name")
                if name.endswith(".fifo") != self.fifo:
                    v.append(f"{p}: {label} name {name!r} must {'' if self.fifo else 'not '}end in .fifo")
        if self.alarm_threshold < 1:
            v.append(f"{p}: DLQ alarm threshold must be >= 1")
        if self.alarm_period_s not in (10, 30) and (self.alarm_period_s < 60 or self.alarm_period_s % 60):
            v.append(f"{p}: DLQ alarm period {self.alarm_period_s}s must be 10, 30 or a multiple of 60")
        return v

    def check(self) -> None:
        problems = self.violations()
        if problems:
            raise QueueRuleError("queue rules broken:\n  - " + "\n  - ".join(problems))


class QueueWithDlq(Construct):
    """Queue + DLQ (same kind) + CloudWatch alarm on messages visible in the DLQ.

    Both queues use SQS-managed server-side encryption and deny non-TLS requests.
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
        fifo: bool = False,
        name_prefix: str | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
    ) -> None:
        super().__init__(scope, construct_id)
        queue_name = dlq_name = None
        if fifo:
            if not name_prefix:
                raise QueueRuleError(f"{purpose}: a FIFO queue needs a name prefix (moto needs explicit .fifo names)")
            queue_name = f"{name_prefix}-{purpose}.fifo"
            dlq_name = f"{name_prefix}-{purpose}-dlq.fifo"
        self.rules = QueueRules(
            purpose=purpose,
            visibility_timeout_s=visibility_timeout_s,
            consumer_timeout_s=consumer_timeout_s,
            max_receive_count=profile.max_receive_count,
            retention_s=profile.queue_retention_days * 86400,
            dlq_retention_s=profile.dlq_retention_days * 86400,
            alarm_threshold=profile.dlq_alarm_threshold,
            alarm_period_s=profile.dlq_alarm_period_s,
            fifo=fifo,
            queue_name=queue_name,
            dlq_name=dlq_name,
        )
        self.rules.check()
        r = self.rules
        fifo_props: dict[str, object] = {"fifo": True, "content_based_deduplication": False} if fifo else {}

        self.dlq = sqs.Queue(
            self,
            "Dlq",
            queue_name=dlq_name,
            retention_period=Duration.seconds(r.dlq_retention_s),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=removal_policy,
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
        self.alarm = cloudwatch.Alarm(
            self,
            "DlqAlarm",
            alarm_description=(
                f"{purpose} DLQ: >= {r.alarm_threshold} messages visible within {r.alarm_period_s}s. "
                "Inspect with `review dlq list`; see docs/runbook.md."
            ),
            metric=self.dlq.metric_approximate_number_of_messages_visible(
                period=Duration.seconds(r.alarm_period_s), statistic="Maximum"
            ),
            threshold=r.alarm_threshold,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
