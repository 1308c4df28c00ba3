"""The bench's pure helpers: orchestration prices (bench/prices.py) and the ours-vs-baseline table
(bench/compare.py). No AWS, no timing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import prices  # noqa: E402
from bench.compare import baseline_wins, compare  # noqa: E402


def test_requests_are_priced_by_service_and_operation():
    # GIVEN one request of each kind the bench counts
    # THEN each costs its dated list price; DynamoDB writes cost 5x reads; S3 PUT/POST tier 1, GET tier 2
    assert prices.request_usd("sqs", "SendMessageBatch") == pytest.approx(0.40e-6)
    assert prices.request_usd("dynamodb", "UpdateItem") == pytest.approx(0.625e-6)
    assert prices.request_usd("dynamodb", "GetItem") == pytest.approx(0.125e-6)
    assert prices.request_usd("s3", "PutObject") == pytest.approx(0.005e-3)
    assert prices.request_usd("s3", "POST") == pytest.approx(0.005e-3)
    assert prices.request_usd("s3", "GetObject") == pytest.approx(0.0004e-3)
    assert prices.request_usd("s3", "DeleteObject") == 0.0
    assert prices.request_usd("AWSEvents", "PutEvents") == pytest.approx(1.0e-6)
    # AND what the table has no price for is reported, not guessed
    assert prices.request_usd("dynamodb", "DescribeTable") is None
    assert prices.request_usd("kinesis", "PutRecord") is None
    assert prices.PRICES_AS_OF


def test_orchestration_usd_sums_by_service_and_lists_unpriced():
    # GIVEN a million of each of three operations and one unknown one
    counted = {"sqs.SendMessage": 1_000_000, "dynamodb.PutItem": 1_000_000, "dynamodb.Query": 1_000_000,
               "kinesis.PutRecord": 7}
    # WHEN priced
    cost = prices.orchestration_usd(counted)
    # THEN the total is the sum of list prices, split by service, and the unknown one is listed apart
    assert cost.usd == pytest.approx(0.40 + 0.625 + 0.125)
    assert cost.by_service == pytest.approx({"sqs": 0.40, "dynamodb": 0.75})
    assert cost.unpriced == {"kinesis.PutRecord": 7}


def test_usd_per_1k_model_calls():
    assert prices.usd_per_1k_calls(0.5, 250) == pytest.approx(2.0)
    assert prices.usd_per_1k_calls(0.5, 0) == pytest.approx(500.0)  # no calls: per one call, never a division by 0


def test_step_functions_per_call_state_machine():
    # GIVEN 215 task attempts over 14 chunks
    # THEN one transition per attempt, a Map iteration's start and end per chunk, and 3 for the execution
    assert prices.step_functions_transitions(215, 14) == 215 + 28 + 3
    # AND each costs $0.025 per 1,000
    assert prices.step_functions_usd(215, 14) == pytest.approx(246 * 0.025 / 1000)


def test_compare_ratios_and_who_wins():
    # GIVEN a pipeline run faster, with better goodput, but more AWS requests per call than the baseline
    ours = {"makespan_s": 30.0, "goodput": 0.9, "aws_requests_per_model_call": 8.0, "recovery_s": 4.0,
            "silently_incomplete": False, "oracle_problem_count": 0}
    base = {"makespan_s": 120.0, "goodput": 0.8, "aws_requests_per_model_call": 0.4, "recovery_s": None,
            "silently_incomplete": False, "oracle_problem_count": 0}
    # WHEN compared
    rows = {r.figure: r for r in compare(ours, base)}
    # THEN ratios are ours / baseline, lower-is-better and higher-is-better figures are judged each their way
    assert rows["makespan s"].ratio == 0.25 and rows["makespan s"].winner == "ours"
    assert rows["goodput"].winner == "ours"
    assert rows["AWS requests / model call"].ratio == 20.0
    assert rows["AWS requests / model call"].winner == "baseline"
    # AND a missing figure is n/a, an equal one a tie, a zero baseline has no ratio
    assert rows["recovery after kill -9 s"].winner == "n/a"
    assert rows["silently incomplete"].winner == "tie"
    assert rows["oracle problems"].ratio is None
    # AND the figures the baseline wins on are named
    assert baseline_wins(list(rows.values())) == ["AWS requests / model call"]
