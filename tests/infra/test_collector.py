"""The batch collector is its own function, and the recovery sweeper runs alone.

Before: the sweeper collected batch jobs of up to `batch_max_records` inside its 256 MB / 60 s recovery run, had no
concurrency limit and Lambda's default asynchronous retries (2) plus EventBridge's (2), so two sweeps overlapped (a
partial batch job submitted) and a long collect starved the stall reconciler. Now, on every template: the collector is
a function of its own (memory and timeout from the profile), each of the two reserves a concurrency of 1, neither is
retried (Lambda's EventInvokeConfig and EventBridge's target: 0 retries, events at most one interval old), each runs
on its own rule."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import FARGATE, LOCAL, PROD, Synth, function_by_handler, getatt_id, resources

TEMPLATES = [LOCAL, PROD, FARGATE]
ONE_AT_A_TIME = ("sweeper", "collector")


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_collector_is_its_own_function_sized_for_a_batch_job(synth: Synth, name: str) -> None:
    t, p = synth.templates[name], synth.profiles[name]
    _, fn = function_by_handler(t, "contract_review.handlers.collector.handler")
    assert (fn["MemorySize"], fn["Timeout"]) == (p.functions.collector_memory_mb, p.functions.collector_timeout_s)
    assert p.functions.collector_memory_mb >= 1024 and fn["Timeout"] <= 900  # Lambda's longest
    _, sweeper = function_by_handler(t, "sweeper.handler")
    assert (sweeper["MemorySize"], sweeper["Timeout"]) == (256, p.functions.sweeper_timeout_s)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_sweeper_and_the_collector_each_run_one_at_a_time_without_asynchronous_retries(
        synth: Synth, name: str) -> None:
    t = synth.templates[name]
    configs = {getatt_id_or_ref(c["Properties"]["FunctionName"]): c["Properties"]
               for c in resources(t, "AWS::Lambda::EventInvokeConfig").values()}
    for fn_name in ONE_AT_A_TIME:
        fn_id, fn = function_by_handler(t, f"{fn_name}.handler")
        assert fn["ReservedConcurrentExecutions"] == 1, fn_name
        # a failed, timed-out or throttled run is not run again: the next one is due within one interval
        assert configs[fn_id] == {"FunctionName": {"Ref": fn_id}, "Qualifier": "$LATEST", "MaximumRetryAttempts": 0,
                                  "MaximumEventAgeInSeconds": 60}, fn_name
    assert len(configs) == len(ONE_AT_A_TIME)


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_runs_every_minute_on_its_own_rule_with_no_retries(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    rules = [r["Properties"] for r in resources(t, "AWS::Events::Rule").values()]
    by_function = {}
    for rule in rules:
        (target,) = rule["Targets"]
        by_function[getatt_id(target["Arn"])] = (rule, target)
    assert set(by_function) == {function_by_handler(t, f"{fn}.handler")[0] for fn in ONE_AT_A_TIME}
    for rule, target in by_function.values():
        assert rule["ScheduleExpression"] == "rate(1 minute)" and rule["State"] == "ENABLED"
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}


def getatt_id_or_ref(value: Any) -> str:
    return value["Ref"] if "Ref" in value else getatt_id(value)
