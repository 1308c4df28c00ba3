"""What the job's side effects (the saga, `contract_review/sideeffects/saga.py`) need in the stack.

- the idempotency table: Powertools idempotency records of each side-effect step and compensation
  (`dynamodb.Table`, not `TableV2`: moto's CloudFormation cannot create a GlobalTable); partition key
  `id`, TTL on `expiration` (Powertools' default attribute names);
- the job-events SNS topic ("Review completed" / "Review withdrawn", the job's id and state: no report
  location, the topic is every principal's): what
  integrators subscribe to instead of polling; its twin events go to the account's default EventBridge
  bus (`source` "contract-review");
- the compensation DLQ: a compensation that exhausted its retries lands here with its error envelope,
  and one message is enough to raise the alarm.

The ticket system is external (a third party): its base URL is the CDK context value `ticket_url`
(environment `TICKET_URL`); without it the ticket step is skipped with an event saying so.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from contract_review.config.profile import Profile

from .removal import removal_policy

IDEMPOTENCY_KEY_ATTRIBUTE = "id"  # Powertools DynamoDBPersistenceLayer defaults
IDEMPOTENCY_TTL_ATTRIBUTE = "expiration"


class SideEffectResources(Construct):
    """The idempotency table, the job-events topic and the compensation DLQ (with its alarm)."""

    def __init__(self, scope: Construct, construct_id: str, *, profile: Profile, retain: bool,
                 alarm_action: cloudwatch.IAlarmAction | None) -> None:
        super().__init__(scope, construct_id)
        stack_name = Stack.of(self).stack_name
        self.idempotency = dynamodb.Table(
            self, "IdempotencyTable",
            partition_key=dynamodb.Attribute(name=IDEMPOTENCY_KEY_ATTRIBUTE, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=IDEMPOTENCY_TTL_ATTRIBUTE,
            deletion_protection=retain,
            removal_policy=removal_policy(retain, deletion_protected=True),
        )
        # SSE with the AWS-managed SNS key: its key policy lets this account's principals publish through
        # SNS (no KMS grant on the roles); TLS only.
        self.topic = sns.Topic(self, "JobEventsTopic", display_name=f"{stack_name} job events", enforce_ssl=True,
                               master_key=kms.Alias.from_alias_name(self, "SnsManagedKey", "alias/aws/sns"))
        self.compensation_dlq = sqs.Queue(
            self, "CompensationDlq",
            retention_period=Duration.days(profile.queues.dlq_retention_days),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=removal_policy(retain),  # a generated name: a retried create never meets it
        )
        self.alarm = cloudwatch.Alarm(
            self, "CompensationDlqAlarm",
            alarm_name=f"{stack_name}-compensation-dlq-depth",
            alarm_description=("Compensation DLQ: a side effect of a cancelled or failed job could not be undone "
                               "after its retries (a ticket left open, a withdrawal not published). The message "
                               "holds the envelope and the order: fix the cause, then redrive it "
                               "(docs/runbook.md, side effects)."),
            metric=self.compensation_dlq.metric_approximate_number_of_messages_visible(
                period=Duration.seconds(profile.alarms.dlq_alarm_period_s), statistic="Maximum"),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        if alarm_action is not None:
            self.alarm.add_alarm_action(alarm_action)
