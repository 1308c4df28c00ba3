"""The batch collector's run (handlers/collector.py, its own scheduled function, one run at a time): one pass of
`collect` over the running batch-mode jobs (pipeline/batch_inference_collect.py: track the batch jobs holding parked
chunks, return the answers of those that ended, pack and submit the chunks waiting for a batch).

It is not part of the recovery sweep (pipeline/sweeper.py): a run holding a batch job of `batch_max_records` records
needs memory and minutes the sweeper does not have, and the stall reconciler must never wait behind it. One item that
raises (a batch job, the packing) is logged and counted (`item_failures`, metric `CollectorItemFailures`); the run
goes on with the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract_review.domain.ports import Deps
from contract_review.pipeline import batch_inference_collect
from contract_review.pipeline.batch_inference_run import CollectReport
from contract_review.pipeline.isolation import isolated

LANE = "collector"


@dataclass
class CollectorRun:
    batch: CollectReport = field(default_factory=CollectReport)
    item_failures: list[str] = field(default_factory=list)  # "collect:item" that raised (logged; the run went on)


def collect(deps: Deps, now: float | None = None) -> CollectorRun:
    """One run of the collector."""
    now = deps.clock() if now is None else now
    run = CollectorRun()
    with isolated(run.item_failures, LANE, "collect", "jobs"):
        batch_inference_collect.collect(deps, now, run.batch, lambda item: isolated(run.item_failures, LANE, "collect", item))
    return run
