"""Alarms that reach someone, and one dashboard.

- `AlarmTopic`: an SNS topic (KMS-encrypted with a key CloudWatch may use, TLS only) that is the
  action of every alarm of the stack; `-c alarm_email=...` subscribes an address (AWS sends a
  confirmation email first).
- `Monitoring`: per-function error and throttle alarms, the backpressure-requeue rate, stuck jobs, the
  items a sweep or a batch collector run failed on (published by our code through Powertools Metrics,
  namespace `ContractReview`), the daily spend cap's and Bedrock's token alarms, and the dashboard. Every metric
  they read is a row of the catalogue (config/metrics.py, imported as `M`), never a name written here. The queue alarms (DLQ depth, oldest-message age)
  belong to `queues.QueueWithDlq`.

The sweeper and the batch collector run one at a time (reserved concurrency 1): a scheduled run that
finds the previous one still going is throttled and dropped by design (the next is due), so those two
have no throttle alarm; their failures are their errors and their item failures.

Missing data: a function that is not invoked, a queue that is idle and a worker that requeues
nothing publish no datapoints, and that is fine (not breaching). The sweeper publishes `StuckJobs`
on every run, so silence there means the sweeper itself is not running: breaching.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from contract_review.config import metrics as M
from contract_review.config.constants import ONE_AT_A_TIME_FUNCTIONS
from contract_review.config.metrics import Metric
from contract_review.config.profile import Profile

from .queues import QueueWithDlq

NOTICE_SHARE = 0.8  # the non-paging warnings: at 80 % of the cap, of the model's hourly token quota
CAP_HOURS = 8  # the paging token-spend alarm: an hour of Bedrock's own token count that would spend the cap in 8 hours
# (the default fleet's most is about $170 an hour, docs/cost.md: at the prod cap of $1,000 this fires at $125 an hour)
# Bedrock's token metrics (AWS/Bedrock, per ModelId) -> the ids the alarms' metric math names them by; the two cache
# counts are assumed to be published beside the others, as Converse reports them apart (a series never published is 0)
TOKEN_METRICS = {M.BEDROCK_INPUT_TOKENS: "tokens_in", M.BEDROCK_OUTPUT_TOKENS: "tokens_out",
                 M.BEDROCK_CACHE_READ_TOKENS: "cache_read", M.BEDROCK_CACHE_WRITE_TOKENS: "cache_write"}


@dataclass(frozen=True)
class ModelWatch:
    """What the spend and token alarms watch: the daily spend cap (USD; None: off), and for the Bedrock provider the
    application inference profile the workers call through (its ARN is the `ModelId` dimension of Bedrock's token
    metrics: assumed, infra/inference.py), the tokens-per-minute quota known at synth (None: read at runtime, no quota
    alarm), the output burndown (an output token counts this many against it) and the USD prices per token."""

    cap_usd: float | None
    profile_arn: str | None = None
    tokens_per_minute: float | None = None
    output_burndown: int = 1
    usd_per_token: Mapping[Metric, float] | None = None  # TOKEN_METRICS row -> the model's price of one such token


def _decimal(x: float) -> str:
    """A number as CloudWatch metric math reads it (no exponent: 3e-06 is an unknown identifier `e` to it)."""
    return f"{x:.12f}".rstrip("0").rstrip(".") or "0"


def bedrock_tokens(profile_arn: str, period_s: int, weights: Mapping[Metric, float], label: str) -> cloudwatch.MathExpression:
    """Bedrock's own count of the profile's tokens in each period, each metric of `weights` (TOKEN_METRICS) weighted
    (a missing series is 0)."""
    def tokens(m: Metric) -> cloudwatch.Metric:
        (dimension,) = m.dimensions
        return cloudwatch.Metric(namespace=m.namespace, metric_name=m.name, dimensions_map={dimension: profile_arn},
                                 statistic="Sum", period=Duration.seconds(period_s))
    return cloudwatch.MathExpression(
        expression=" + ".join(f"{_decimal(w)} * FILL({TOKEN_METRICS[m]}, 0)" for m, w in weights.items()),
        using_metrics={TOKEN_METRICS[m]: tokens(m) for m in weights}, label=label, period=Duration.seconds(period_s))


def metric(m: Metric, statistic: str, period_s: int, label: str | None = None) -> cloudwatch.Metric:
    """One of our metrics (config/metrics.py), the series of its publisher's `service`."""
    return cloudwatch.Metric(namespace=m.namespace, metric_name=m.name, dimensions_map={"service": str(m.service)},
                             statistic=statistic, period=Duration.seconds(period_s), label=label)


def backpressure(period_s: int) -> cloudwatch.MathExpression:
    """All backpressure requeues per period: the worker's and the sweeper's (a missing series is 0)."""
    return cloudwatch.MathExpression(
        expression="FILL(worker, 0) + FILL(sweeper, 0)",
        using_metrics={"worker": metric(M.BACKPRESSURE_REQUEUES, "Sum", period_s),
                       "sweeper": metric(M.SWEEPER_BACKPRESSURE_REQUEUES, "Sum", period_s)},
        label="backpressure requeues", period=Duration.seconds(period_s))


class AlarmTopic(Construct):
    """SNS topic for every alarm: SSE with a customer-managed key (CloudWatch cannot publish to a
    topic encrypted with the AWS-managed `alias/aws/sns` key), TLS-only."""

    def __init__(self, scope: Construct, construct_id: str, *, email: str, removal_policy: RemovalPolicy,
                 what: str = "alarms") -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
                           description=f"{stack.stack_name} {what} topic encryption")
        cloudwatch_service = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        self.allow_service(cloudwatch_service)
        self.topic = sns.Topic(self, "Topic", display_name=f"{stack.stack_name} {what}"[:100], master_key=self.key,
                               enforce_ssl=True)
        # enforce_ssl writes a topic policy, which replaces the default one: let CloudWatch alarms of
        # this account publish explicitly.
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish", principals=[cloudwatch_service], actions=["sns:Publish"],
            resources=[self.topic.topic_arn],
            conditions={"ArnLike": {"aws:SourceArn": stack.format_arn(service="cloudwatch", resource="alarm",
                                                                      resource_name="*",
                                                                      arn_format=ArnFormat.COLON_RESOURCE_NAME)},
                        "StringEquals": {"aws:SourceAccount": stack.account}}))
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.action = cw_actions.SnsAction(self.topic)

    def allow_service(self, service: iam.ServicePrincipal) -> None:
        """Let an AWS service publish to the encrypted topic through the key, on behalf of this account only
        (`aws:SourceAccount`: the confused deputy). docs/first-deploy.md says how to see an alarm arrive."""
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[service], actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}}))


COST_TAG_KEY = "review-stack"  # every resource carries it (stack name); activate it as a cost-allocation tag


class CostBudget(Construct):
    """A monthly AWS Budgets cost budget on this stack's cost-allocation tag (`review-stack` = the stack name),
    alerting the alarm topic at 80 % of actual spend and at 100 % of the forecast. Budgets sees the tag only once it
    is activated as a cost-allocation tag (docs/deploying.md: `aws ce update-cost-allocation-tags-status`)."""

    def __init__(self, scope: Construct, construct_id: str, *, topic: AlarmTopic, monthly_usd: float) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        budgets_service = iam.ServicePrincipal("budgets.amazonaws.com")
        topic.allow_service(budgets_service)
        topic.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="BudgetsPublish", principals=[budgets_service], actions=["sns:Publish"],
            resources=[topic.topic.topic_arn], conditions={"StringEquals": {"aws:SourceAccount": stack.account}}))
        subscriber = budgets.CfnBudget.SubscriberProperty(address=topic.topic.topic_arn, subscription_type="SNS")

        def alert(kind: str, percent: float) -> budgets.CfnBudget.NotificationWithSubscribersProperty:
            return budgets.CfnBudget.NotificationWithSubscribersProperty(
                notification=budgets.CfnBudget.NotificationProperty(
                    comparison_operator="GREATER_THAN", notification_type=kind, threshold=percent,
                    threshold_type="PERCENTAGE"),
                subscribers=[subscriber])

        self.budget = budgets.CfnBudget(
            self, "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                # budget names are account-global: the region in it lets a second region have its own
                budget_name=f"{stack.stack_name}-{stack.region}-monthly", budget_type="COST", time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=monthly_usd, unit="USD"),
                cost_filters={"TagKeyValue": [f"user:{COST_TAG_KEY}${stack.stack_name}"]}),
            notifications_with_subscribers=[alert("ACTUAL", 80), alert("FORECASTED", 100)])


def error_rate(fn: lambda_.IFunction, period_s: int) -> cloudwatch.MathExpression:
    """A function's errors as a percentage of its invocations in each period (0 when it was not invoked)."""
    period = Duration.seconds(period_s)
    return cloudwatch.MathExpression(
        expression="IF(invocations > 0, 100 * FILL(errors, 0) / invocations, 0)",
        using_metrics={"errors": fn.metric_errors(period=period, statistic="Sum"),
                       "invocations": fn.metric_invocations(period=period, statistic="Sum")},
        label="error rate (%)", period=period)


class Monitoring(Construct):
    """Function, backpressure and stuck-job alarms (all notifying `action`) and the dashboard."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        profile: Profile,
        action: cloudwatch.IAlarmAction,
        functions: Mapping[str, lambda_.IFunction],
        queues: Sequence[QueueWithDlq],
        notice_action: cloudwatch.IAlarmAction | None = None,
        model: ModelWatch | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        # `action` pages a person (something needs doing now); `notice_action` does not (worth knowing, nothing breaks)
        self.profile, self.action, self.notice_action = profile, action, notice_action or action
        self.stack_name = Stack.of(self).stack_name
        self.alarms: list[cloudwatch.Alarm] = []
        p = profile
        period = Duration.seconds(p.alarms.alarm_period_s)
        for name, fn in functions.items():
            rate, periods = p.alarms.function_error_rate_percent, p.alarms.function_error_periods
            self._alarm(f"{name.title()}Errors", f"{name}-errors",
                        f"{name} function: >= {rate:g} % of its invocations failed (exceptions, timeouts) in each of "
                        f"{periods} periods of {p.alarms.alarm_period_s}s in a row. Read its log group; a tier-2 handoff "
                        "is not an error, and the odd error of a fleet that retries does not raise this alarm.",
                        error_rate(fn, p.alarms.alarm_period_s), rate, evaluation_periods=periods)
            if name not in ONE_AT_A_TIME_FUNCTIONS:  # theirs: a run dropped while the previous one goes on
                self._alarm(f"{name.title()}Throttles", f"{name}-throttles",
                            f"{name} function: >= {p.alarms.function_throttles_alarm_threshold} throttled invocation(s) "
                            f"in {p.alarms.alarm_period_s}s: the account's Lambda concurrency is exhausted.",
                            fn.metric_throttles(period=period, statistic="Sum"),
                            p.alarms.function_throttles_alarm_threshold, notice=True)  # retried by the queue
            self._alarm(f"{name.title()}RecursionDropped", f"{name}-recursion-dropped",
                        f"{name} function: Lambda's recursive-loop detection dropped >= 1 invocation in "
                        f"{p.alarms.alarm_period_s}s: a message chain was stopped (docs/runbook.md \"Recursive loops\"). "
                        "The message goes back to its queue and, after its receives, to the DLQ.",
                        fn.metric(M.LAMBDA_RECURSION_DROPPED.name, period=period, statistic="Sum"), 1)
        self._alarm("BackpressureAlarm", "backpressure",
                    f"Backpressure: >= {p.alarms.backpressure_alarm_threshold} chunk requeues per {p.alarms.alarm_period_s}s for "
                    f"{p.alarms.backpressure_alarm_periods} periods in a row. The model quota (requests or tokens per "
                    "minute) is too small for the load, or the model is failing slowly: `review preflight` shows "
                    "the quotas.",
                    backpressure(p.alarms.alarm_period_s), p.alarms.backpressure_alarm_threshold,
                    evaluation_periods=p.alarms.backpressure_alarm_periods, notice=True)  # slower, nothing lost
        self._alarm("StuckJobsAlarm", "stuck-jobs",
                    f"Stuck jobs: the sweeper found >= {p.alarms.stuck_jobs_alarm_threshold} running job(s) without "
                    f"progress for {int(p.recovery.stall_after_s)}s (or the sweeper published nothing: it is not running). "
                    "`review jobs` and `review status JOB` say where each one stands.",
                    metric(M.STUCK_JOBS, "Maximum", p.alarms.alarm_period_s), p.alarms.stuck_jobs_alarm_threshold,
                    missing=cloudwatch.TreatMissingData.BREACHING)
        items = p.alarms.item_failures_alarm_threshold
        self._alarm("SweepItemFailuresAlarm", "sweep-item-failures",
                    f"Sweeper: >= {items} item(s) failed in {p.alarms.alarm_period_s}s (a lapsed claim, a dead letter, a "
                    "stalled job the sweep could not handle; the sweep went on without it). Each is logged as \"sweep "
                    "item failed\" with its item and the exception in the sweeper's log group (docs/runbook.md).",
                    metric(M.SWEEP_ITEM_FAILURES, "Sum", p.alarms.alarm_period_s), items)
        self._alarm("CollectorItemFailuresAlarm", "collector-item-failures",
                    f"Batch collector: >= {items} item(s) failed in {p.alarms.alarm_period_s}s (a batch job it could not "
                    "track, submit or return, or the packing; the run went on without it). Each is logged as "
                    "\"collector item failed\" in the collector's log group (docs/runbook.md \"Batch collector\"). Its "
                    "function errors and timeouts are the CollectorErrors alarm.",
                    metric(M.COLLECTOR_ITEM_FAILURES, "Sum", p.alarms.alarm_period_s), items)
        self._alarm("BatchRefusedAlarm", "batch-refused",
                    "Bedrock refused a batch inference job for good (batch.refused: the model or inference profile is "
                    "not offered in batch, access denied, a quota): its chunks went on demand and the model's batch "
                    "lane is off, so batch-mode jobs of that model now run on demand at the on-demand price. "
                    "`review quota show` says why; fix the cause, then turn the lane back on (docs/runbook.md "
                    "\"Batch inference jobs\").",
                    metric(M.BATCH_JOBS_REFUSED, "Sum", p.alarms.alarm_period_s), 1, notice=True)  # runs on demand
        if model is not None:
            self._model_alarms(model)
        self.dashboard = self._dashboard(functions, queues)

    def _model_alarms(self, m: ModelWatch) -> None:
        """The daily spend cap's (from the sweeper's metrics) and Bedrock's own token count of the stack's profile."""
        period_s = self.profile.alarms.alarm_period_s
        if m.cap_usd is not None:
            self._alarm("SpendCapAlarm", "spend-cap",
                        f"The stack's recorded model spend today reached its daily spend cap (${m.cap_usd:,.2f}, "
                        "daily_spend_cap_usd): model calls are held (backpressure, nothing fails) until 00:00 UTC. "
                        "`review quota show` says so; to go on today: `review quota resume --override-cap` "
                        "(docs/runbook.md \"The daily spend cap\").",
                        metric(M.SPEND_CAP_HELD, "Maximum", period_s), 1)
            self._alarm("SpendNearCapAlarm", "spend-near-cap",
                        f"The stack's recorded model spend today passed {NOTICE_SHARE:.0%} of its daily spend cap "
                        f"(${m.cap_usd:,.2f}): at the cap the model is held until 00:00 UTC.",
                        metric(M.DAILY_SPEND, "Maximum", period_s), NOTICE_SHARE * m.cap_usd, notice=True)
        if m.profile_arn is None:
            return
        hour = 3600
        if m.tokens_per_minute:
            self._alarm("TokensNearQuotaAlarm", "tokens-near-quota",
                        f"Bedrock counted the stack's profile at >= {NOTICE_SHARE:.0%} of the model's tokens-per-minute "
                        f"quota ({m.tokens_per_minute:,.0f}, output tokens x {m.output_burndown}) over an hour: more "
                        "load will be throttled (backpressure); raise the quota or expect slower jobs.",
                        bedrock_tokens(m.profile_arn, hour, {M.BEDROCK_INPUT_TOKENS: 1.0,
                                                             M.BEDROCK_OUTPUT_TOKENS: float(m.output_burndown)},
                                       label="quota tokens per hour"),
                        NOTICE_SHARE * m.tokens_per_minute * 60, notice=True)
        if m.cap_usd is not None and m.usd_per_token:
            self._alarm("TokenSpendRateAlarm", "token-spend-rate",
                        f"Bedrock's own token count of the stack's profile in one hour, at the model's prices, would "
                        f"spend the daily cap (${m.cap_usd:,.2f}) in {CAP_HOURS} hours. The spend-cap hold stops it "
                        "once the recorded spend reaches the cap; if `review quota show` shows no hold while this "
                        "fires, spend is going unrecorded: pause the model (`review quota pause`) and read the "
                        "runbook (\"The daily spend cap\").",
                        bedrock_tokens(m.profile_arn, hour, m.usd_per_token, label="token spend per hour (USD)"),
                        m.cap_usd / CAP_HOURS)

    def _alarm(self, construct_id: str, name: str, description: str, metric_: cloudwatch.IMetric, threshold: float,
               *, evaluation_periods: int = 1, notice: bool = False,
               missing: cloudwatch.TreatMissingData = cloudwatch.TreatMissingData.NOT_BREACHING) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self, construct_id, alarm_name=f"{self.stack_name}-{name}", alarm_description=description,
            metric=metric_, threshold=threshold, evaluation_periods=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=missing)
        alarm.add_alarm_action(self.notice_action if notice else self.action)
        self.alarms.append(alarm)
        return alarm

    def _dashboard(self, functions: Mapping[str, lambda_.IFunction],
                   queues: Sequence[QueueWithDlq]) -> cloudwatch.Dashboard:
        minute = Duration.minutes(1)
        p = self.profile.alarms.alarm_period_s
        depth = [m for q in queues for m in (
            q.queue.metric_approximate_number_of_messages_visible(period=minute, label=f"{q.rules.purpose} visible"),
            q.queue.metric_approximate_number_of_messages_not_visible(period=minute,
                                                                      label=f"{q.rules.purpose} in flight"))]
        age = [q.queue.metric_approximate_age_of_oldest_message(period=minute, label=q.rules.purpose) for q in queues]
        dlq = [q.dlq.metric_approximate_number_of_messages_visible(period=minute, label=f"{q.rules.purpose} DLQ")
               for q in queues]
        retries_by_code = cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{M.RETRIES.namespace},{','.join(sorted(M.RETRIES.dimensions))}}} "
                        f"MetricName=\"{M.RETRIES.name}\"', "
                        f"'Sum', {p})"),
            label="", period=Duration.seconds(p))
        # dashboard names are account-global: the region in it lets the same stack name deploy to a second region
        dashboard = cloudwatch.Dashboard(self, "Dashboard",
                                         dashboard_name=f"{self.stack_name}-{Stack.of(self).region}-pipeline")
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Queue depth (visible, in flight)", left=depth, width=12),
            cloudwatch.GraphWidget(title="Age of the oldest message (s)", left=age, width=12),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Job completion time (s, submit to end)", left=[
                metric(M.JOB_DURATION, "p50", p, "p50"), metric(M.JOB_DURATION, "p90", p, "p90"),
                metric(M.JOB_DURATION, "Maximum", p, "max")], width=12),
            cloudwatch.GraphWidget(title="Dead letters (DLQ depth)", left=dlq, width=12),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Retries by tier", left=[
                metric(M.TIER1_RETRIES, "Sum", p, "tier 1 (in-process retries)"),
                metric(M.TIER2_HANDOFFS, "Sum", p, "tier 2 (queue redeliveries)"),
                backpressure(p)],
                right=[metric(M.MODEL_CALLS, "Sum", p, "model calls")], width=12),
            cloudwatch.GraphWidget(title="Retries by error code and tier", left=[retries_by_code], width=12),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Function errors and throttles", left=[
                m for name, fn in functions.items() for m in (
                    fn.metric_errors(period=Duration.seconds(p), label=f"{name} errors"),
                    fn.metric_throttles(period=Duration.seconds(p), label=f"{name} throttles"))], width=12),
            cloudwatch.GraphWidget(title="Stuck jobs (per sweep)", left=[metric(M.STUCK_JOBS, "Maximum", p, "stuck")],
                                   width=12),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Batch lane (collector runs)", left=[
                metric(M.BATCH_JOBS_SUBMITTED, "Sum", p, "batch jobs submitted"),
                metric(M.BATCH_JOBS_COLLECTED, "Sum", p, "batch jobs collected"),
                metric(M.BATCH_JOBS_RUNNING, "Maximum", p, "batch jobs running"),
                metric(M.BATCH_JOBS_REFUSED, "Sum", p, "batch jobs refused")], width=12),
            cloudwatch.GraphWidget(title="Items a run failed on", left=[
                metric(M.SWEEP_ITEM_FAILURES, "Sum", p, "sweep"),
                metric(M.COLLECTOR_ITEM_FAILURES, "Sum", p, "collector")], width=12),
        )
        return dashboard
