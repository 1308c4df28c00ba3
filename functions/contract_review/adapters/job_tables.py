"""What the stores of the jobs table and the events table share (`JobTables`): the tables, the records' expiry,
the clock, a job read, and the item layout's names. The stores split `JobsRepo` by what each writes: the job
records and the sparse open-jobs index (job_records.py), the counts on a job (job_counts.py: settled chunks, their
usage, requeues, the fan-out cursor, what fenced-out attempts spent), and each job's events (job_events.py);
jobs.py joins them into the one `DynamoJobs` that `Deps.jobs` holds. No table, key or attribute differs from when
one class held them all."""

from __future__ import annotations

from typing import Any

from contract_review.domain.ports import Clock
from contract_review.domain.records import USAGE_FIELDS, Job, JobState, Usage

from .dynamo import Table, Values

# The sparse index of open jobs (infra/tables.py JOBS_OPEN_INDEX): only a job in a non-terminal state carries
# `open_state` (its state, written by the same write that writes the state; removed by the write that ends it),
# sorted by `updated_at`. The sweeper queries "jobs in this state idle since T" instead of scanning the table.
OPEN_INDEX = "by-open-state"
OPEN_STATE = "open_state"
COUNTED = "counted"  # on a chunk record: counted settled on its job (written with the job's `settled_count`)
EVENT_OWED = "event_owed"  # on a chunk record: counted, its `chunk.settled` event not written yet
LEGACY_SETTLED = "settled"  # a job item's string set of counted chunk ids, from before `settled_count`


def open_state(state: JobState) -> str | None:
    return None if state.terminal else state.value


def usage_adds(usage: Usage | None) -> tuple[list[str], Values]:
    """`ADD` clauses adding `usage` (its non-zero fields) to a job's running usage."""
    if usage is None:
        return [], {}
    fields = [f for f in USAGE_FIELDS if getattr(usage, f)]
    return [f"{f} :u_{f}" for f in fields], {f":u_{f}": getattr(usage, f) for f in fields}


class JobTables:
    def __init__(self, client: Any, jobs_table: str, events_table: str, ttl_s: int, clock: Clock, *,
                 claims_table: str):
        self.jobs = Table(client, jobs_table)
        self.events_table = Table(client, events_table)
        self.claims = Table(client, claims_table)  # the chunk records' `counted` marks (settle_new_chunk)
        self.ttl_s = ttl_s
        self.clock = clock

    def get(self, job_id: str) -> Job | None:
        item = self.jobs.get({"job_id": job_id})
        return Job.model_validate(item) if item else None
