"""The pipeline against the baseline, figure by figure (pure; bench/quota.py prints it).

Each figure of a pipeline run is shown beside the same figure of the baseline run with the same workload,
faults and kills, as a ratio ours / baseline, and which side wins: lower is better for times, calls,
waste and cost, higher for goodput and quota utilisation; the table says when the baseline wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# (label, key in a run's summary, True when higher is better)
FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("makespan s", "makespan_s", False),
    ("makespan x ideal", "makespan_vs_ideal", False),
    ("model-call span s", "model_call_span_s", False),  # ours' makespan also holds intake and the report
    ("model calls made", "calls_made", False),
    ("goodput", "goodput", True),
    ("redone work", "redone_work", False),
    ("quota utilisation", "quota_utilisation", True),
    ("throttled share", "throttled_share", False),
    ("AWS requests / model call", "aws_requests_per_model_call", False),
    ("DynamoDB writes / model call", "dynamodb_writes_per_model_call", False),
    ("orchestration $ / 1k model calls", "orchestration_usd_per_1k_calls", False),
    ("recovery after kill -9 s", "recovery_s", False),
    ("oracle problems", "oracle_problem_count", False),
    ("silently incomplete", "silently_incomplete", False),
)


@dataclass(frozen=True)
class Row:
    figure: str
    ours: Any
    baseline: Any
    ratio: float | None  # ours / baseline; None when either is missing or the baseline is 0
    winner: str  # "ours" | "baseline" | "tie" | "n/a"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def compare(ours: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[Row]:
    rows = []
    for label, key, higher_better in FIGURES:
        a, b = ours.get(key), baseline.get(key)
        x, y = _number(a), _number(b)
        if x is None or y is None:
            rows.append(Row(label, a, b, None, "n/a"))
            continue
        ratio = round(x / y, 3) if y else None
        if x == y:
            winner = "tie"
        elif (x > y) == higher_better:
            winner = "ours"
        else:
            winner = "baseline"
        rows.append(Row(label, a, b, ratio, winner))
    return rows


def baseline_wins(rows: list[Row]) -> list[str]:
    """The figures where the baseline is better: the table must say so."""
    return [r.figure for r in rows if r.winner == "baseline"]
