"""The jobs table and the events table (`JobsRepo`): one adapter joined from the stores that split it by what
each writes (job_tables.py): the job records and the open-jobs index (`DynamoJobRecords`, `DynamoOpenJobs`: the
ports' `JobRecords`), the counts on a job (`DynamoJobCounts`: `JobCounts`), its events (`DynamoJobEvents`:
`JobEvents`). They share the tables, the records' expiry and the clock (`JobTables`); one `DynamoJobs` is what
wiring builds and `Deps.jobs` holds."""

from __future__ import annotations

from .job_counts import DynamoJobCounts
from .job_events import DynamoJobEvents
from .job_records import DynamoJobRecords, DynamoOpenJobs


class DynamoJobs(DynamoJobRecords, DynamoOpenJobs, DynamoJobCounts, DynamoJobEvents):
    """The jobs and events tables through the low-level client (`JobsRepo`); built as `JobTables` is."""
