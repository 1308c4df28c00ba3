"""Alarms that reach someone, and the dashboard, read back from the template (moto skips alarms)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

import pytest

from contract_review.config import metrics as M
from infra.deploy_settings import DEFAULT_MONTHLY_BUDGET_USD
from infra.monitoring import COST_TAG_KEY

from .conftest import (
    ALARM_EMAIL,
    FARGATE,
    LOCAL,
    PROD,
    ROOT,
    Synth,
    function_by_handler,
    getatt_id,
    resources,
    source_queues,
)

STACKS = [LOCAL, PROD, FARGATE]


def _topic(t: dict[str, Any], which: str = "Alarms") -> str:
    """The alarm topic (pages), or with "Notices" the notice topic (does not page); the third topic is the job-events
    topic integrators subscribe to (infra/side_effects.py)."""
    (topic_id,) = [lid for lid in resources(t, "AWS::SNS::Topic") if lid.startswith(f"{which}Topic")]
    return topic_id


# alarms that need no one now go to the notice topic (the runbook's alarm table says which: test below)
NOTICES = {"backpressure", "batch-refused", "spend-near-cap", "tokens-near-quota"}


def _alarms(t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Our alarms by name suffix (`<stack>-<suffix>`); the Fargate service's step-scaling alarms excluded."""
    out = {}
    for lid, a in resources(t, "AWS::CloudWatch::Alarm").items():
        p = a["Properties"]
        if "AlarmName" not in p:
            assert lid.startswith("FargateWorkerServiceTaskCountTarget"), lid  # scaling policy alarms only
            continue
        out[p["AlarmName"].split("-", 1)[1]] = p
    return out


@pytest.mark.parametrize("name", STACKS)
def test_every_alarm_notifies_the_alarm_topic(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    topic = _topic(t)
    alarms = resources(t, "AWS::CloudWatch::Alarm")
    ours = _alarms(t)
    # 3 queues x 3 + 6 functions x 2 (errors, recursion; incl. the Job API and the batch collector) + throttles of the 4
    # that may be throttled (not the one-at-a-time sweeper and collector) + backpressure + stuck jobs + compensation
    # DLQ + the sweep's and the collector's item failures + a batch job refused + the daily spend cap's two + (Bedrock:
    # the token spend rate of the application profile)
    assert len(ours) == 9 + 12 + 4 + 3 + 2 + 1 + 2 + (0 if name == LOCAL else 1)
    for lid, a in alarms.items():
        p = a["Properties"]
        if "AlarmName" not in p:  # the scaling policy's own alarms act on the policy, not on people
            (action,) = p["AlarmActions"]
            assert getatt_id(action) in resources(t, "AWS::ApplicationAutoScaling::ScalingPolicy")
            continue
        suffix = p["AlarmName"].split("-", 1)[1]
        notice = suffix in NOTICES or suffix.endswith("-throttles")
        assert p["AlarmActions"] == [{"Ref": _topic(t, "Notices") if notice else topic}], lid
        assert p["AlarmName"].startswith(f"{name}-") and len(p["AlarmDescription"]) > 40, lid
    assert len(alarms) == len(ours) + (2 if name == FARGATE else 0)


@pytest.mark.parametrize("name", STACKS)
@pytest.mark.parametrize("which", ["Alarms", "Notices"])
def test_the_alarm_topic_is_encrypted_tls_only_and_cloudwatch_may_publish(synth: Synth, name: str, which: str) -> None:
    t = synth.templates[name]
    topic_id = _topic(t, which)
    topic = t["Resources"][topic_id]["Properties"]
    key_id = getatt_id(topic["KmsMasterKeyId"])
    assert key_id in resources(t, "AWS::KMS::Key") and key_id.startswith(which)  # a customer key: not aws/sns
    key = t["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    assert any("cloudwatch.amazonaws.com" in json.dumps(st.get("Principal"))
               and {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(st["Action"])
               for st in key["KeyPolicy"]["Statement"])
    (policy,) = [p for p in resources(t, "AWS::SNS::TopicPolicy").values()
                 if p["Properties"]["Topics"] == [{"Ref": topic_id}]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for st in statements)
    publish = next(st for st in statements if st.get("Sid") == "CloudWatchAlarmsPublish")
    assert publish["Principal"] == {"Service": "cloudwatch.amazonaws.com"} and publish["Action"] == "sns:Publish"
    assert ":alarm:*" in json.dumps(publish["Condition"]["ArnLike"])
    assert "aws:SourceAccount" in publish["Condition"]["StringEquals"]


def test_alarm_email_from_context_subscribes_to_the_topic(synth: Synth) -> None:
    prod = synth.templates[PROD]
    subs = sorted(resources(prod, "AWS::SNS::Subscription").values(), key=lambda s: json.dumps(s["Properties"]))
    assert all(s["Properties"]["Protocol"] == "email" and s["Properties"]["Endpoint"] == ALARM_EMAIL for s in subs)
    # the address gets both: what pages (subscribe a pager to AlarmTopicArn alone) and the notices
    assert sorted(s["Properties"]["TopicArn"]["Ref"] for s in subs) == sorted([_topic(prod), _topic(prod, "Notices")])
    assert not resources(synth.templates[LOCAL], "AWS::SNS::Subscription")  # no email given: no subscription


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_queue_alarms_depth_and_age_with_profile_thresholds(synth: Synth, name: str) -> None:
    t, p = synth.templates[name], synth.profiles[name]
    alarms = _alarms(t)
    queue_ids = {q: qid for qid in source_queues(t) for q in ("intake", "analysis", "results")
                 if qid.lower().startswith(q)}
    for purpose, age in (("intake", p.alarms.intake_age_alarm_s), ("analysis", p.alarms.analysis_age_alarm_s),
                         ("results", p.alarms.results_age_alarm_s)):
        depth = alarms[f"{purpose}-dlq-depth"]
        assert (depth["Threshold"], depth["MetricName"]) == (1, "ApproximateNumberOfMessagesVisible")
        oldest = alarms[f"{purpose}-oldest-message"]
        assert oldest["MetricName"] == "ApproximateAgeOfOldestMessage" and oldest["Threshold"] == age
        (dim,) = oldest["Dimensions"]
        assert getatt_id(dim["Value"]) == queue_ids[purpose]
        expiring = alarms[f"{purpose}-dlq-expiring"]
        assert expiring["MetricName"] == "ApproximateAgeOfOldestMessage"
        assert expiring["Threshold"] == (p.queues.dlq_retention_days - 2) * 86400  # two days before it is lost
        for a in (depth, oldest, expiring):
            assert a["TreatMissingData"] == "notBreaching" and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_function_errors_and_throttles_per_function(synth: Synth, name: str) -> None:
    """The error rate of every function, over several periods (one error of a fleet that retries pages nobody);
    throttles of those a throttle means the account's concurrency is exhausted. The sweeper and the batch collector
    reserve 1 each: a scheduled run throttled behind the previous one is dropped by design (the next is due), so no
    throttle alarm for them."""
    t, p = synth.templates[name], synth.profiles[name]
    alarms = _alarms(t)
    assert "sweeper-throttles" not in alarms and "collector-throttles" not in alarms
    for fn in ("intake", "worker", "aggregator", "sweeper", "collector", "api"):
        fn_id, _ = function_by_handler(t, f"{fn}.handler")
        lambda_metric = {"Namespace": "AWS/Lambda", "Dimensions": [{"Name": "FunctionName", "Value": {"Ref": fn_id}}]}
        errors = alarms[f"{fn}-errors"]
        metrics = _metric_stats(errors)
        (expression,) = [m["Expression"] for m in metrics.values() if "Expression" in m]
        assert expression == "IF(invocations > 0, 100 * FILL(errors, 0) / invocations, 0)"
        for metric_id, metric_name in (("errors", "Errors"), ("invocations", "Invocations")):
            stat = metrics[metric_id]["MetricStat"]
            assert stat["Metric"] == {**lambda_metric, "MetricName": metric_name}
            assert (stat["Stat"], stat["Period"]) == ("Sum", p.alarms.alarm_period_s)
        assert (errors["Threshold"], errors["EvaluationPeriods"], errors["TreatMissingData"]) == (
            p.alarms.function_error_rate_percent, p.alarms.function_error_periods, "notBreaching")
        assert errors["EvaluationPeriods"] > 1 and errors["Threshold"] > 0
        if fn in ("sweeper", "collector"):
            continue
        a = alarms[f"{fn}-throttles"]
        assert (a["Namespace"], a["MetricName"], a["Statistic"]) == ("AWS/Lambda", "Throttles", "Sum")
        assert a["Dimensions"] == lambda_metric["Dimensions"]
        assert (a["Threshold"], a["Period"], a["TreatMissingData"]) == (
            p.alarms.function_throttles_alarm_threshold, p.alarms.alarm_period_s, "notBreaching")


def _metric_stats(alarm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["Id"]: m for m in alarm["Metrics"]}


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_backpressure_rate_and_stuck_jobs(synth: Synth, name: str) -> None:
    t, p = synth.templates[name], synth.profiles[name]
    alarms = _alarms(t)
    bp = alarms["backpressure"]
    assert (bp["Threshold"], bp["EvaluationPeriods"]) == (p.alarms.backpressure_alarm_threshold, p.alarms.backpressure_alarm_periods)
    metrics = _metric_stats(bp)
    (expression,) = [m["Expression"] for m in metrics.values() if "Expression" in m]
    assert expression == "FILL(worker, 0) + FILL(sweeper, 0)"
    for who in ("worker", "sweeper"):  # published by handlers/worker.py (+ poller.py) and handlers/sweeper.py
        stat = metrics[who]["MetricStat"]
        assert stat["Metric"] == {"Namespace": "ContractReview", "MetricName": "BackpressureRequeues",
                                  "Dimensions": [{"Name": "service", "Value": who}]}
        assert (stat["Stat"], stat["Period"]) == ("Sum", p.alarms.alarm_period_s)
    stuck = alarms["stuck-jobs"]
    assert (stuck["Namespace"], stuck["MetricName"]) == ("ContractReview", "StuckJobs")
    assert stuck["Dimensions"] == [{"Name": "service", "Value": "sweeper"}]
    assert stuck["Threshold"] == p.alarms.stuck_jobs_alarm_threshold
    assert stuck["TreatMissingData"] == "breaching"  # published on every sweep: silence = no sweeper


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_a_failed_sweep_item_and_a_failed_collector_item_each_raise_an_alarm(synth: Synth, name: str) -> None:
    """`SweepItemFailures` (handlers/sweeper.py) had no alarm, so a batch job the sweep failed on every
    minute paged nobody; the batch collector's own item failures (handlers/collector.py) alarm too, and its function
    errors and timeouts are its Errors alarm."""
    t, p = synth.templates[name], synth.profiles[name]
    alarms = _alarms(t)
    for alarm, metric_name, service in (("sweep-item-failures", "SweepItemFailures", "sweeper"),
                                        ("collector-item-failures", "CollectorItemFailures", "collector")):
        a = alarms[alarm]
        assert (a["Namespace"], a["MetricName"], a["Statistic"]) == ("ContractReview", metric_name, "Sum")
        assert a["Dimensions"] == [{"Name": "service", "Value": service}]
        assert (a["Threshold"], a["Period"], a["ComparisonOperator"]) == (
            p.alarms.item_failures_alarm_threshold, p.alarms.alarm_period_s, "GreaterThanOrEqualToThreshold")
        assert a["TreatMissingData"] == "notBreaching"
    # a batch job Bedrock refused is an outcome, not a failure (its chunks go on demand), but the lane is then off for
    # the model: someone is told
    refused = alarms["batch-refused"]
    assert (refused["Namespace"], refused["MetricName"], refused["Statistic"], refused["Threshold"]) == (
        "ContractReview", "BatchJobsRefused", "Sum", 1)
    assert refused["Dimensions"] == [{"Name": "service", "Value": "collector"}]
    collector_id, _ = function_by_handler(t, "collector.handler")
    errors = _metric_stats(alarms["collector-errors"])["errors"]["MetricStat"]["Metric"]
    assert (errors["MetricName"], errors["Dimensions"]) == ("Errors", [{"Name": "FunctionName",
                                                                        "Value": {"Ref": collector_id}}])


@pytest.mark.parametrize("name", STACKS)
def test_dashboard_shows_queues_jobs_retries_and_dead_letters(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    (dashboard,) = resources(t, "AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == {"Fn::Join": ["", [f"{name}-", {"Ref": "AWS::Region"},
                                                                           "-pipeline"]]}
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for needle in ("ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible",
                   "ApproximateAgeOfOldestMessage", "JobDuration", "Tier1Retries", "Tier2Handoffs",
                   "BackpressureRequeues", "ModelCalls", "StuckJobs", "Errors", "Throttles",
                   "Job completion time", "Retries by error code and tier", "Dead letters"):
        assert needle in body, needle
    # retries by code: a SEARCH over the Retries metric's (service, tier, code) dimensions
    assert "SEARCH('{ContractReview,code,service,tier} MetricName=" in body and "Retries" in body
    assert "p90" in body


@pytest.mark.parametrize("name", [LOCAL, PROD])
def test_recursive_loops_are_allowed_where_the_code_bounds_them_and_alarmed_everywhere(synth: Synth, name: str) -> None:
    """Lambda stops a chain of ~16 SQS-triggered invocations unless the function allows recursion (moto has no
    such guard): the worker (requeues to its own queue) and the aggregator (refills the analysis queue page by
    page) allow it; intake keeps the guard; every function alarms on RecursiveInvocationsDropped."""
    t = synth.templates[name]
    alarms = _alarms(t)
    for fn, loop in (("intake", "Terminate"), ("worker", "Allow"), ("aggregator", "Allow"), ("sweeper", "Terminate"),
                     ("collector", "Terminate")):
        fn_id, props = function_by_handler(t, f"{fn}.handler")
        assert props.get("RecursiveLoop") == loop, fn
        a = alarms[f"{fn}-recursion-dropped"]
        assert (a["Namespace"], a["MetricName"], a["Statistic"], a["Threshold"]) == (
            "AWS/Lambda", "RecursiveInvocationsDropped", "Sum", 1)
        assert a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": fn_id}}]


def test_a_monthly_cost_budget_on_the_stacks_tag_alerts_the_alarm_topic(synth: Synth) -> None:
    t = synth.templates[PROD]
    (budget,) = resources(t, "AWS::Budgets::Budget").values()
    data = budget["Properties"]["Budget"]
    assert data["BudgetType"] == "COST" and data["TimeUnit"] == "MONTHLY"
    assert data["BudgetLimit"] == {"Amount": DEFAULT_MONTHLY_BUDGET_USD, "Unit": "USD"}
    assert data["CostFilters"] == {"TagKeyValue": [f"user:{COST_TAG_KEY}$ContractReviewProd"]}
    alerts = budget["Properties"]["NotificationsWithSubscribers"]
    assert {(a["Notification"]["NotificationType"], a["Notification"]["Threshold"]) for a in alerts} == {
        ("ACTUAL", 80), ("FORECASTED", 100)}
    topic_id = _topic(t)
    assert all(a["Subscribers"] == [{"Address": {"Ref": topic_id}, "SubscriptionType": "SNS"}] for a in alerts)
    # Budgets may publish to the (encrypted) topic, and every resource carries the tag the budget filters on
    (policy,) = [p for p in resources(t, "AWS::SNS::TopicPolicy").values()
                 if p["Properties"]["Topics"] == [{"Ref": topic_id}]]
    publish = next(st for st in policy["Properties"]["PolicyDocument"]["Statement"] if st.get("Sid") == "BudgetsPublish")
    assert publish["Principal"] == {"Service": "budgets.amazonaws.com"}
    key = next(iter(resources(t, "AWS::KMS::Key").values()))["Properties"]
    assert any("budgets.amazonaws.com" in json.dumps(st.get("Principal")) for st in key["KeyPolicy"]["Statement"])
    (table,) = [r for lid, r in resources(t, "AWS::DynamoDB::Table").items() if lid.startswith("TablesJobsTable")]
    assert {"Key": COST_TAG_KEY, "Value": "ContractReviewProd"} in table["Properties"]["Tags"]
    # the local stack (moto has no AWS Budgets) has none
    assert not resources(synth.templates[LOCAL], "AWS::Budgets::Budget")


class RunbookRow(NamedTuple):
    """A row of docs/runbook.md's alarm table: the alarm (`<queue>`, `<fn>`: one for each of `each`), the names of the
    metrics it reads, when it fires (threshold, evaluation periods, period s) and the topic it notifies: alarms (pages)
    or notices (does not)."""

    alarm: str
    each: list[str]
    metrics: list[str]
    threshold: float
    periods: int
    period: int
    topic: str

    def names(self) -> list[str]:
        return [re.sub(r"<(queue|fn)>", n, self.alarm) for n in self.each]


def _runbook_table() -> list[RunbookRow]:
    text = (ROOT / "docs" / "runbook.md").read_text()
    table = text[text.index("| alarm | for | metric | fires at | over |"):].split("\n\n", 1)[0].splitlines()[2:]
    out = []
    for row in table:
        alarm, each, metric_names, fires, over, topic, _ = (c.strip() for c in row.strip("|").split("|"))
        threshold = float(re.match(r"[\d.]+", fires).group())  # type: ignore[union-attr]  # every row starts with it
        periods, period = (int(n) for n in re.fullmatch(r"(\d+) x (\d+) s", over).groups())  # type: ignore[union-attr]
        out.append(RunbookRow(alarm.strip("`"), [n.strip() for n in each.split(",")] if each != "-" else [""],
                              re.findall(r"`(\w+)`", metric_names), threshold, periods, period, topic))
    return out


def _runbook_alarms() -> dict[str, tuple[float, int, int, str]]:
    """The runbook's alarm table: alarm name (without the stack) -> (threshold, evaluation periods, period s, topic)."""
    return {name: (r.threshold, r.periods, r.period, r.topic) for r in _runbook_table() for name in r.names()}


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_the_runbooks_alarm_table_is_the_templates(synth: Synth, name: str) -> None:
    template: dict[str, tuple[float, int, int, str]] = {}
    for r in resources(synth.templates[name], "AWS::CloudWatch::Alarm").values():
        a = r["Properties"]
        if not isinstance(a.get("AlarmName"), str):
            continue  # the Fargate service's scaling alarms (Application Auto Scaling's own, no action)
        period = a.get("Period") or min(m["MetricStat"]["Period"] for m in a["Metrics"] if "MetricStat" in m)
        (action,) = a["AlarmActions"]
        topic = {"Alarms": "alarms", "Notices": "notices"}[action["Ref"].split("Topic")[0]]
        template[a["AlarmName"].removeprefix(f"{name}-")] = (float(a["Threshold"]), a["EvaluationPeriods"], period,
                                                             topic)
    assert _runbook_alarms() == template


# ---------------------------------------------------------------------- the metric catalogue (config/metrics.py)
Series = tuple[str, str, frozenset[tuple[str, str]]]  # namespace, metric name, (dimension, value of ours) pairs


def _series(namespace: str, name: str, dimensions: dict[str, Any]) -> Series:
    """A series as the template names it; only a `service` dimension's value is ours to check (the others are Refs to a
    function, a queue or the model's profile)."""
    return namespace, name, frozenset((d, v if d == "service" else "") for d, v in dimensions.items())


def _alarm_series(alarm: dict[str, Any]) -> list[Series]:
    """The series an alarm reads: its one metric, or each metric of its metric math."""
    if "MetricName" in alarm:
        return [_series(alarm["Namespace"], alarm["MetricName"],
                        {d["Name"]: d["Value"] for d in alarm.get("Dimensions", [])})]
    stats = [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]
    return [_series(m["Namespace"], m["MetricName"], {d["Name"]: d["Value"] for d in m.get("Dimensions", [])})
            for m in stats]


SEARCH = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\"'")


def _dashboard_series(template: dict[str, Any]) -> tuple[list[Series], list[tuple[str, str, frozenset[str]]]]:
    """The series the dashboard's widgets graph, and the (namespace, name, dimension names) its SEARCH expressions
    span (every value of those dimensions)."""
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = json.loads("".join(p if isinstance(p, str) else "ref" for p in parts))  # a Ref is a queue's or a function's
    series, searches = [], []
    for widget in body["widgets"]:
        for row in widget["properties"].get("metrics", []):
            fields = [f for f in row if isinstance(f, str)]
            if fields:  # [namespace, name, dimension, value, ..., {options}]
                series.append(_series(fields[0], fields[1], dict(zip(fields[2::2], fields[3::2]))))
            for match in SEARCH.finditer(next((f.get("expression", "") for f in row if isinstance(f, dict)), "")):
                namespace, *dimensions = match.group(1).split(",")
                searches.append((namespace, match.group(2), frozenset(dimensions)))
    return series, searches


def _catalogued(s: Series) -> bool:
    namespace, name, dimensions = s
    return M.find(namespace, name, dict(dimensions)) is not None


@pytest.mark.parametrize("name", STACKS)
def test_every_metric_an_alarm_or_the_dashboard_reads_is_in_the_catalogue(synth: Synth, name: str) -> None:
    """A misspelt metric name (or namespace, or service) in an alarm or a widget reads a series nobody publishes: the
    alarm never fires, the graph stays empty. Each must be a row of the catalogue, which the emitters publish from
    (tests/unit/handlers/test_telemetry.py)."""
    t = synth.templates[name]
    alarms = [s for a in resources(t, "AWS::CloudWatch::Alarm").values() for s in _alarm_series(a["Properties"])]
    graphed, searches = _dashboard_series(t)
    assert alarms and graphed and searches
    assert [s for s in alarms + graphed if not _catalogued(s)] == []
    for namespace, metric_name, dimensions in searches:
        assert any((m.namespace, m.name, set(m.dimensions)) == (namespace, metric_name, dimensions)
                   for m in M.CATALOGUE), (namespace, metric_name, dimensions)
    # a row of ours the template reads carries its publisher's service (not just any service)
    assert ("ContractReview", "StuckJobs", frozenset({("service", "sweeper")})) in alarms
    assert not _catalogued(("ContractReview", "StuckJobs", frozenset({("service", "worker")})))


def test_every_aws_metric_of_the_catalogue_is_read_by_an_alarm_or_the_dashboard(synth: Synth) -> None:
    """AWS's rows are in the catalogue only because an alarm or the dashboard reads them (the prod stack's Bedrock
    alarms read the token counts); ours are held to their emitters instead (tests/unit/handlers/test_telemetry.py)."""
    read = {(s[0], s[1]) for t in synth.templates.values()
            for s in [*(x for a in resources(t, "AWS::CloudWatch::Alarm").values() for x in _alarm_series(a["Properties"])),
                      *_dashboard_series(t)[0]]}
    assert {(m.namespace, m.name) for m in M.CATALOGUE if not m.ours} <= read


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_the_runbooks_alarm_table_names_the_metrics_each_alarm_reads(synth: Synth, name: str) -> None:
    by_name = {a["Properties"]["AlarmName"].removeprefix(f"{name}-"): a["Properties"]
               for a in resources(synth.templates[name], "AWS::CloudWatch::Alarm").values()
               if isinstance(a["Properties"].get("AlarmName"), str)}
    catalogued = {m.name for m in M.CATALOGUE}
    for row in _runbook_table():
        assert set(row.metrics) <= catalogued, (row.alarm, set(row.metrics) - catalogued)
        for alarm in row.names():
            assert sorted(row.metrics) == sorted({s[1] for s in _alarm_series(by_name[alarm])}), alarm


def test_the_alarm_keys_services_act_for_this_account_only(synth: Synth) -> None:
    key = next(iter(resources(synth.templates[PROD], "AWS::KMS::Key").values()))["Properties"]
    granted = [st for st in key["KeyPolicy"]["Statement"] if "Service" in st.get("Principal", {})]
    services = {svc for st in granted for svc in (lambda s: s if isinstance(s, list) else [s])(st["Principal"]["Service"])}
    assert services == {"cloudwatch.amazonaws.com", "budgets.amazonaws.com"}
    for st in granted:
        assert sorted(st["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
        assert st["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
