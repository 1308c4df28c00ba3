"""One contract, two implementations: the repositories on DynamoDB/S3/SQS (moto server, tables from
the deployed template) and the in-memory fakes the unit tests use. If the fakes drift from the
adapters, a case here fails for one of them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest
from botocore.awsrequest import AWSResponse

from contract_review.adapters.artifacts import S3Artifacts
from contract_review.adapters.claims import DynamoClaims
from contract_review.adapters.jobs import DynamoJobs
from contract_review.adapters.model_control import CONTROL_KEY, KEY_ATTRIBUTE, DynamoModelControl
from contract_review.adapters.queues import SqsQueues
from contract_review.adapters.token_ledger import DynamoTokenLedger
from contract_review.config.settings import Settings
from contract_review.domain import lifecycle
from contract_review.domain.chunk_records import CheckpointWrite, ChunkOutcome, ChunkRecord, ReleaseReason
from contract_review.domain.control_records import BatchLaneOff, ModelControl
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.messages import ResultMessage
from contract_review.domain.ports import (
    Artifacts,
    Charge,
    ClaimsRepo,
    Deps,
    JobsRepo,
    ModelControls,
    Queue,
    Queues,
    Taken,
    TokenLedger,
)
from contract_review.domain.records import (
    AttemptStats,
    ChunkStatus,
    CoverageSummary,
    Inference,
    Job,
    JobOutcome,
    JobState,
    Priority,
    Reliability,
    SideEffectDone,
    StepStatus,
    Usage,
    Waiting,
)
from contract_review.wiring import aws_client_config, queue_urls
from review_local.connect import local_session
from review_local.embedded import EmbeddedAws

from ..oracle import counted
from ..unit.fakes import SETTINGS, FakeClock, FakeModelControl, FakeWorld


@dataclass
class Repos:
    jobs: JobsRepo
    claims: ClaimsRepo
    artifacts: Artifacts
    queues: Queues
    clock: FakeClock
    ledger: TokenLedger
    control: ModelControls  # the runtime control, read through a cache of CONTROL_MAX_AGE_S on `clock`
    other_control: ModelControls  # another process's reader and writer of the same control, with its own cache


@pytest.fixture(params=["fake", "aws"])
def repos(request: pytest.FixtureRequest) -> Repos:
    clock = FakeClock()
    if request.param == "fake":
        w = FakeWorld(clock=clock)
        w.claims.inline_max_bytes = INLINE_MAX
        control = FakeModelControl(CONTROL_MAX_AGE_S, clock)
        return Repos(w.jobs, w.claims, w.artifacts, w.queues, clock, w.token_ledger, control, control.another())
    aws: EmbeddedAws = request.getfixturevalue("embedded")
    settings = Settings.from_outputs(aws.outputs, "local")
    session = local_session(aws.region)
    kw = {"config": aws_client_config(), "endpoint_url": aws.endpoint}
    ddb = session.client("dynamodb", **kw)
    queues = SqsQueues(session.client("sqs", **kw), queue_urls(settings))
    for q in Queue:  # every case starts with empty queues (PurgeQueue allows one call a minute)
        for m in queues.take_all(q):
            queues.delete(q, m.receipt_handle)
    artifacts = S3Artifacts(session.client("s3", **kw), settings.bucket)
    # every case starts with no control item (the table is the stack's: one item)
    ddb.delete_item(TableName=settings.control_table, Key={KEY_ATTRIBUTE: {"S": CONTROL_KEY}})
    return Repos(DynamoJobs(ddb, settings.jobs_table, settings.events_table, 3600, clock, claims_table=settings.claims_table),
                 DynamoClaims(ddb, settings.claims_table, settings.checkpoints_table, artifacts, 3600, INLINE_MAX, clock),
                 artifacts, queues, clock, DynamoTokenLedger(ddb, settings.token_ledger_table, 3600),
                 DynamoModelControl(ddb, settings.control_table, CONTROL_MAX_AGE_S, clock),
                 DynamoModelControl(ddb, settings.control_table, CONTROL_MAX_AGE_S, clock))


INLINE_MAX = 100  # checkpoint outputs larger than this go to S3
CONTROL_MAX_AGE_S = 60.0  # the runtime control's cache (prod's model_control_max_age_s)
_n = iter(range(10**6))


def _job(state: JobState = JobState.QUEUED, **kw: Any) -> Job:
    return Job(job_id=f"job-{next(_n)}-{id(kw)}", state=state, created_at=1.0, updated_at=1.0, idempotency_key="k",
               chunk_count=2, **kw)


def _chunk(job_id: str, i: int = 0) -> ChunkRecord:
    return ChunkRecord(job_id=job_id, chunk_id=f"c{i}", chunk_index=i, start=0, end=10)


def _with_chunks(repos: Repos, job: Job, n: int = 2) -> Job:
    """`job` created, with chunk records c0 .. c{n-1} (what a settle marks)."""
    created, _ = repos.jobs.create(job)
    for i in range(n):
        assert repos.claims.create(_chunk(created.job_id, i))
    return created


# ------------------------------------------------------------------------------ jobs
def test_jobs_create_is_idempotent_and_replaces_only_input_failures(repos: Repos):
    job = _job(metadata={"team": "legal", "n": 2, "tags": ["a"]})
    created, ok = repos.jobs.create(job)
    assert ok and repos.jobs.get(job.job_id) == created
    again, ok2 = repos.jobs.create(job.model_copy(update={"document_id": "other"}))
    assert not ok2 and again.document_id == "" and again.metadata == {"team": "legal", "n": 2, "tags": ["a"]}
    bad = _job(JobState.FAILED, error_code="input.invalid")
    repos.jobs.create(bad)
    fixed, replaced = repos.jobs.create(bad.model_copy(update={"state": JobState.QUEUED, "error_code": None}))
    assert replaced and repos.jobs.get(bad.job_id).state is JobState.QUEUED
    other = _job(JobState.FAILED, error_code="model.access_denied")
    repos.jobs.create(other)
    assert not repos.jobs.create(other.model_copy(update={"state": JobState.QUEUED}))[1]


def test_jobs_transition_is_conditional_and_writes_the_outcome(repos: Repos):
    job = _with_chunks(repos, _job())
    assert repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.COMPLETED) is None
    running = repos.jobs.transition(job.job_id, (JobState.QUEUED,), JobState.RUNNING, started_at=5.0)
    assert running is not None and running.state is JobState.RUNNING and running.started_at == 5.0
    env = ErrorEnvelope.of("job.chunks_missing", "1 chunk(s) missing")
    outcome = JobOutcome(report_json_key="r.json", report_md_key="r.md", ended_at=9.5, n_findings=3,
                         reliability=Reliability(model_calls=7, retries_by_code={"model.throttled": 2}),
                         coverage_summary=CoverageSummary(missing_chunks=1), error=env, error_code=env.error_code)
    ended = repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.FAILED, outcome=outcome)
    assert ended is not None and repos.jobs.get(job.job_id) == ended
    assert (ended.error, ended.reliability, ended.ended_at) == (env, outcome.reliability, 9.5)
    # reopening clears the ending and rebuilds what is counted: the records marked, the count to match
    repos.jobs.settle_chunk(job.job_id, "c0")
    reopened = repos.jobs.transition(job.job_id, (JobState.FAILED,), JobState.RUNNING, settled={"c1"})
    assert reopened is not None and counted(repos.claims, reopened) == {"c1"} and reopened.settled_count == 1
    assert (reopened.error, reopened.error_code, reopened.ended_at, reopened.missing) == (None, None, None, [])
    # and the report's fields with it: the report file (one key per job) is rewritten by the next finalize, and an
    # ending that writes no report fields (a failure after waiting for approval) must not name a stale count
    assert (reopened.report_json_key, reopened.n_findings, reopened.reliability) == (None, None, None)
    empty = repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.RUNNING, settled=set())
    assert empty is not None and counted(repos.claims, empty) == set() and empty.settled_count == 0


def test_a_reopen_that_loses_to_another_leaves_the_winners_marks_alone(repos: Repos):
    """Two retries of one ended job at once. Both read the job (one version) and its chunks; the
    first reopens it, and a chunk it reset is counted again under it. The second's transition then loses, and must
    have written nothing: the adapter used to rewrite every chunk's mark before its conditional write, so the loser
    unmarked the chunk the winner had counted (the count kept it), and the chunk was counted twice."""
    job = _with_chunks(repos, _job(JobState.RUNNING).model_copy(update={"chunk_count": 3}), n=3)
    for c in ("c0", "c1", "c2"):
        repos.jobs.settle_chunk(job.job_id, c, usage=Usage(input_tokens=10))
    ended = repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.DEAD_LETTERED)
    assert ended is not None
    # the winner: c0 stays counted, c1 and c2 run again; c1 settles again and is counted
    won = repos.jobs.transition(job.job_id, (JobState.DEAD_LETTERED,), JobState.RUNNING, settled={"c0"},
                                if_version=ended.version)
    assert won is not None and counted(repos.claims, won) == {"c0"}
    assert repos.jobs.settle_new_chunk(job.job_id, "c1", usage=Usage(input_tokens=10)) is not None
    # WHEN the loser, which read the job and its chunks before all that, makes its transition
    assert repos.jobs.transition(job.job_id, (JobState.DEAD_LETTERED,), JobState.RUNNING, settled={"c0"},
                                 if_version=ended.version) is None
    # THEN c1 is still counted, once: a second copy of its result counts nothing
    after = repos.jobs.get(job.job_id)
    assert after is not None and counted(repos.claims, after) == {"c0", "c1"} and after.settled_count == 2
    assert repos.jobs.settle_new_chunk(job.job_id, "c1", usage=Usage(input_tokens=10)) is None
    final = repos.jobs.get(job.job_id)
    assert final is not None and final.settled_count == 2


def test_jobs_transition_can_be_conditional_on_the_settled_version(repos: Repos):
    # finalize's transition loses to a chunk that left the settled set after finalize's read
    job = _with_chunks(repos, _job(JobState.RUNNING))
    assert job.settled_version == 0
    repos.jobs.settle_chunk(job.job_id, "c0")
    read = repos.jobs.settle_chunk(job.job_id, "c1")
    after = repos.jobs.unsettle_chunks(job.job_id, {"c1": Usage()})
    assert after is not None and counted(repos.claims, after) == {"c0"}
    assert after.settled_version == read.settled_version + 1
    assert repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.DEAD_LETTERED,
                                 if_settled_version=read.settled_version) is None
    assert repos.jobs.get(job.job_id).state is JobState.RUNNING
    ended = repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.DEAD_LETTERED,
                                  if_settled_version=after.settled_version)
    assert ended is not None and ended.state is JobState.DEAD_LETTERED
    # a job no chunk ever left: version 0 (an item from before the field, without it, is read as 0 too)
    fresh, _ = repos.jobs.create(_job(JobState.RUNNING))
    assert repos.jobs.transition(fresh.job_id, (JobState.RUNNING,), JobState.COMPLETED, if_settled_version=0)
    # nothing is created for a job that does not exist
    assert repos.jobs.unsettle_chunks("job-that-does-not-exist", {"c0": Usage()}) is None
    assert repos.jobs.get("job-that-does-not-exist") is None


def test_unsettling_takes_off_exactly_what_settling_counted_once(repos: Repos):
    """A redrive of a dead-lettered chunk while its job runs unsettled it without taking its usage off,
    so its attempts were counted again when it settled again. Now the usage leaves with the chunk, in one update
    conditional on the chunk being counted: twice, or for a chunk never counted, takes nothing."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    first = Usage(input_tokens=1_000, output_tokens=400, model_micro_usd=9_000, aws_requests=12, aws_micro_usd=5)
    other = Usage(input_tokens=7, model_micro_usd=21)
    repos.jobs.settle_chunk(job.job_id, "c0", usage=other)
    repos.jobs.settle_chunk(job.job_id, "c1", usage=first)
    after = repos.jobs.unsettle_chunks(job.job_id, {"c1": first})
    again = repos.jobs.unsettle_chunks(job.job_id, {"c1": first, "never-settled": first})
    assert after is not None and again is not None
    assert after.usage() == again.usage() == other and counted(repos.claims, again) == {"c0"}
    assert again.settled_version == after.settled_version + 2  # the version moves either way
    # the chunk runs again: its record now holds both attempts, counted once when it settles again
    both = Usage.of([first, Usage(input_tokens=1_000, output_tokens=400, model_micro_usd=9_000)])
    settled = repos.jobs.settle_chunk(job.job_id, "c1", usage=both)
    assert settled.usage() == Usage.of([other, both])


def test_jobs_stalled_finds_jobs_of_the_state_asked(repos: Repos):
    queued, _ = repos.jobs.create(_job(JobState.QUEUED))
    running, _ = repos.jobs.create(_job(JobState.RUNNING))
    later = repos.clock() + 1
    assert queued.job_id in {j.job_id for j in repos.jobs.stalled(later, JobState.QUEUED)}
    assert running.job_id not in {j.job_id for j in repos.jobs.stalled(later, JobState.QUEUED)}
    assert running.job_id in {j.job_id for j in repos.jobs.stalled(later)}
    assert queued.job_id not in {j.job_id for j in repos.jobs.stalled(later)}


def test_jobs_running_lists_every_running_job_however_recently_updated(repos: Repos):
    running, _ = repos.jobs.create(_job(JobState.RUNNING))
    queued, _ = repos.jobs.create(_job(JobState.QUEUED))
    repos.clock.advance(5.0)
    repos.jobs.touch(running.job_id)  # updated now: no `stalled` read finds it, `running` does
    ids = {j.job_id for j in repos.jobs.running()}
    assert running.job_id in ids and queued.job_id not in ids
    repos.jobs.transition(running.job_id, (JobState.RUNNING,), JobState.CANCELLING)
    assert running.job_id not in {j.job_id for j in repos.jobs.running()}


def test_an_ended_job_leaves_the_open_jobs_and_a_reopened_one_comes_back(repos: Repos):
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    later = repos.clock() + 1
    assert job.job_id in {j.job_id for j in repos.jobs.stalled(later)}
    repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.FAILED)
    assert job.job_id not in {j.job_id for s in JobState for j in repos.jobs.stalled(later, s)}
    repos.jobs.transition(job.job_id, (JobState.FAILED,), JobState.RUNNING, settled=set())  # a retry reopens it
    assert job.job_id in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}
    repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.CANCELLING)
    assert job.job_id in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1, JobState.CANCELLING)}
    assert job.job_id not in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}


def _raw(repos: Repos) -> tuple[Any, str]:
    jobs = repos.jobs
    assert isinstance(jobs, DynamoJobs)
    return jobs.jobs.client, jobs.jobs.name


def test_only_open_jobs_carry_the_index_key(repos: Repos):
    if not isinstance(repos.jobs, DynamoJobs):
        pytest.skip("the index key is the DynamoDB adapter's")
    client, table = _raw(repos)
    running, _ = repos.jobs.create(_job(JobState.RUNNING))
    ended, _ = repos.jobs.create(_job(JobState.FAILED, error_code="input.invalid"))

    def key(job_id: str) -> Any:
        return client.get_item(TableName=table, Key={"job_id": {"S": job_id}})["Item"].get("open_state")

    assert key(running.job_id) == {"S": "running"} and key(ended.job_id) is None
    repos.jobs.transition(running.job_id, (JobState.RUNNING,), JobState.COMPLETED)
    assert key(running.job_id) is None  # removed by the very write that ended it


def test_a_stale_index_entry_is_read_again_and_ignored(repos: Repos):
    """A GSI is eventually consistent: it may still name a job that has moved on. `stalled` reads the job again."""
    if not isinstance(repos.jobs, DynamoJobs):
        pytest.skip("the index is the DynamoDB adapter's")
    client, table = _raw(repos)
    # what a lagging index shows: the entry says running and idle, the item itself has ended (written raw,
    # since moto's index is never stale)
    job, _ = repos.jobs.create(_job(JobState.COMPLETED))
    client.update_item(TableName=table, Key={"job_id": {"S": job.job_id}}, UpdateExpression="SET open_state = :r",
                       ExpressionAttributeValues={":r": {"S": "running"}})
    moved, _ = repos.jobs.create(_job(JobState.RUNNING))  # an entry idle by the index, progress on the item
    client.update_item(TableName=table, Key={"job_id": {"S": moved.job_id}},
                       UpdateExpression="SET #s = :c", ExpressionAttributeNames={"#s": "state"},
                       ExpressionAttributeValues={":c": {"S": "cancelling"}})
    found = {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}
    assert job.job_id not in found and moved.job_id not in found


def test_running_brief_reads_the_running_jobs_with_what_says_whose_chunks_are_open(repos: Repos):
    """Priority's check (pipeline/priority.py): the running jobs, with their priority, counts and hold as `get` reads
    them (an older job's settled set included); no queued or ended job."""
    interactive = _with_chunks(repos, _job(JobState.RUNNING).model_copy(update={"chunk_count": 3}), n=3)
    _legacy_settled(repos, interactive.job_id, {"c0"})
    repos.jobs.settle_new_chunk(interactive.job_id, "c1")
    held, _ = repos.jobs.create(_job(JobState.RUNNING, priority=Priority.BULK))
    repos.jobs.set_waiting(held.job_id, Waiting(condition="daily_token_quota", model_id="m", tokens_per_day=1.0,
                                                since=1.0, detail="held"))
    queued, _ = repos.jobs.create(_job(JobState.QUEUED))
    ended, _ = repos.jobs.create(_job(JobState.FAILED, error_code="input.invalid"))
    brief = {j.job_id: j for j in repos.jobs.running_brief()}
    assert {interactive.job_id, held.job_id} <= set(brief) and not {queued.job_id, ended.job_id} & set(brief)
    for job_id in (interactive.job_id, held.job_id):
        full = repos.jobs.get(job_id)
        assert full is not None
        got = brief[job_id]
        assert (got.state, got.priority, got.chunk_count, got.n_settled, got.waiting) == \
            (full.state, full.priority, full.chunk_count, full.n_settled, full.waiting)
    assert brief[interactive.job_id].n_settled == 2 and brief[held.job_id].priority is Priority.BULK
    assert brief[held.job_id].waiting is not None


def test_running_brief_reads_whether_a_batch_mode_job_went_on_demand(repos: Repos):
    """Priority counts a batch-mode job only once one of its chunks went on demand, so the brief
    reads `inference` and `on_demand_since` (a projection without them read every batch-mode job as on demand's
    default, interactive work open); `mark_on_demand` sets the time once."""
    parked, _ = repos.jobs.create(_job(JobState.RUNNING, inference=Inference.BATCH, deadline_at=99.0))
    gone, _ = repos.jobs.create(_job(JobState.RUNNING, inference=Inference.BATCH, deadline_at=99.0))
    repos.clock.advance(3)
    assert repos.jobs.mark_on_demand(gone.job_id)
    at = repos.clock()
    repos.clock.advance(3)
    assert not repos.jobs.mark_on_demand(gone.job_id) and not repos.jobs.mark_on_demand("job-nobody")
    brief = {j.job_id: j for j in repos.jobs.running_brief()}
    assert (brief[parked.job_id].inference, brief[parked.job_id].on_demand_since) == (Inference.BATCH, None)
    assert (brief[gone.job_id].inference, brief[gone.job_id].on_demand_since) == (Inference.BATCH, at)
    full = repos.jobs.get(gone.job_id)
    assert full is not None and full.on_demand_since == at and full.version == gone.version


def test_running_brief_reads_past_100_jobs_and_asks_again_for_unprocessed_keys(repos: Repos):
    """BatchGetItem takes at most 100 keys, and may leave some unprocessed (throttling): none is missed."""
    if not isinstance(repos.jobs, DynamoJobs):
        pytest.skip("BatchGetItem is the DynamoDB adapter's")
    ids = {repos.jobs.create(_job(JobState.RUNNING))[0].job_id for _ in range(105)}
    client, table = _raw(repos)
    answered: list[int] = []

    def unprocessed_once(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if answered:
            return None
        keys = json.loads(params["body"])["RequestItems"][table]
        answered.append(len(keys["Keys"]))
        return AWSResponse("", 200, {}, None), {"Responses": {table: []}, "UnprocessedKeys": {table: keys},
                                                "ResponseMetadata": {"HTTPStatusCode": 200}}

    client.meta.events.register("before-call.dynamodb.BatchGetItem", unprocessed_once)
    try:
        found = {j.job_id for j in repos.jobs.running_brief()}
    finally:
        client.meta.events.unregister("before-call.dynamodb.BatchGetItem", unprocessed_once)
    assert answered == [100] and ids <= found


def test_the_backfill_indexes_open_jobs_written_before_the_index(repos: Repos):
    if not isinstance(repos.jobs, DynamoJobs):
        pytest.skip("the index is the DynamoDB adapter's")
    client, table = _raw(repos)
    old, _ = repos.jobs.create(_job(JobState.RUNNING))
    ended, _ = repos.jobs.create(_job(JobState.COMPLETED))
    client.update_item(TableName=table, Key={"job_id": {"S": old.job_id}}, UpdateExpression="REMOVE open_state")
    assert old.job_id not in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}  # invisible to the sweeper
    jobs = repos.jobs
    assert isinstance(jobs, DynamoJobs)
    assert jobs.backfill_open_index() == 1
    assert old.job_id in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}
    assert ended.job_id not in {j.job_id for s in JobState for j in repos.jobs.stalled(repos.clock() + 1, s)}
    assert jobs.backfill_open_index() == 0  # once: nothing left to index


def test_settle_new_chunk_counts_a_chunk_once_and_says_whether_it_did(repos: Repos):
    job = _with_chunks(repos, _job(JobState.RUNNING))
    first = repos.jobs.settle_new_chunk(job.job_id, "c0", usage=Usage(input_tokens=5))
    assert first is not None and counted(repos.claims, first) == {"c0"} and first.input_tokens == 5
    assert first.settled_count == 1 and repos.claims.get(job.job_id, "c0").counted  # type: ignore[union-attr]
    # counted already: nothing written (no usage added), and the caller is told
    assert repos.jobs.settle_new_chunk(job.job_id, "c0", usage=Usage(input_tokens=5)) is None
    again = repos.jobs.get(job.job_id)
    assert again is not None and again.input_tokens == 5 and again.settled_count == 1
    # a chunk without a record, or a job that does not exist: nothing counted, nothing created
    assert repos.jobs.settle_new_chunk(job.job_id, "no-record", usage=Usage(input_tokens=5)) is None
    assert repos.claims.get(job.job_id, "no-record") is None
    assert repos.jobs.settle_new_chunk("job-that-does-not-exist", "c0") is None
    assert repos.jobs.get("job-that-does-not-exist") is None and repos.jobs.get(job.job_id).input_tokens == 5  # type: ignore[union-attr]


def test_settle_new_chunk_counts_only_the_chunk_as_its_caller_read_it(repos: Repos):
    """The settle's mark is conditional on the chunk's fence and status as read, so a redrive
    landing after the read (a new fence, pending again) is not counted."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    won = repos.claims.claim(job.job_id, "c0", "w", 30, 1)
    dead = repos.claims.finish(job.job_id, "c0", won.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(calls=1))
    assert dead is not None
    assert repos.claims.reset_for_redrive(job.job_id, "c0") is not None  # the redrive, after the caller's read
    assert repos.jobs.settle_new_chunk(job.job_id, "c0", fence=dead.fence, status=dead.status) is None
    assert repos.jobs.settle_chunk(job.job_id, "c0", fence=dead.fence, status=dead.status).settled_count == 0
    record = repos.claims.get(job.job_id, "c0")
    assert record is not None and not record.counted
    # the record as it is now (pending) is not counted under a settled status either
    assert repos.jobs.settle_new_chunk(job.job_id, "c0", fence=dead.fence + 1, status=ChunkStatus.DEAD_LETTERED) is None
    again = repos.claims.claim(job.job_id, "c0", "w", 30, 1)
    finished = repos.claims.finish(job.job_id, "c0", again.fence, ChunkStatus.DONE, AttemptStats(calls=1))
    assert finished is not None
    now = repos.jobs.settle_new_chunk(job.job_id, "c0", fence=finished.fence, status=finished.status)
    assert now is not None and counted(repos.claims, now) == {"c0"}


def test_a_settle_owes_its_event_and_the_event_is_written_once(repos: Repos):
    """The transaction that counts a chunk leaves its event owed on the record; the event is
    written with the debt's removal, in one transaction conditional on it: once, however many writers try."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    assert repos.jobs.record_owed_event(job.job_id, "c0", "chunk.settled", chunk_id="c0") == 0  # nothing owed yet
    assert repos.jobs.settle_new_chunk(job.job_id, "c0") is not None
    owing = repos.claims.get(job.job_id, "c0")
    assert owing is not None and owing.event_owed
    assert repos.jobs.record_owed_event(job.job_id, "c0", "chunk.settled", chunk_id="c0") == 1
    assert repos.jobs.record_owed_event(job.job_id, "c0", "chunk.settled", chunk_id="c0") == 0
    paid = repos.claims.get(job.job_id, "c0")
    assert paid is not None and not paid.event_owed
    assert [(e.type, e.detail) for e in repos.jobs.events(job.job_id)] == [("chunk.settled", {"chunk_id": "c0"})]
    assert repos.jobs.record_event(job.job_id, "other") == 2  # the numbers go on


def test_jobs_settled_count_stalled_and_events(repos: Repos):
    job = _with_chunks(repos, _job(JobState.RUNNING))
    repos.clock.advance(1)
    assert counted(repos.claims, repos.jobs.settle_chunk(job.job_id, "c0")) == {"c0"}
    assert counted(repos.claims, repos.jobs.settle_chunk(job.job_id, "c0")) == {"c0"}  # idempotent
    repos.jobs.settle_chunk(job.job_id, "c1")
    repos.jobs.unsettle_chunks(job.job_id, {"c0": Usage()})
    assert counted(repos.claims, repos.jobs.get(job.job_id)) == {"c1"}
    assert job.job_id in {j.job_id for j in repos.jobs.stalled(repos.clock() + 1)}
    assert job.job_id not in {j.job_id for j in repos.jobs.stalled(repos.clock() - 1)}
    repos.clock.advance(5)
    repos.jobs.touch(job.job_id)
    assert job.job_id not in {j.job_id for j in repos.jobs.stalled(repos.clock() - 1)}
    repos.jobs.record_event(job.job_id, "a", n=1)
    repos.clock.advance(0.001)
    repos.jobs.record_event(job.job_id, "b", chunk_id="c0", nested={"x": [1, 2]})
    assert [(e.type, e.detail) for e in repos.jobs.events(job.job_id)] == \
        [("a", {"n": 1}), ("b", {"chunk_id": "c0", "nested": {"x": [1, 2]}})]
    assert job.job_id in {j.job_id for j in repos.jobs.all()}


def test_a_fenced_out_attempts_spend_goes_on_its_chunk_and_on_the_job_that_counted_it_once(repos: Repos):
    """An attempt that lost its lease wrote nothing of what it spent. `add_fenced_out` adds it
    to the chunk record, and to the job in the same transaction when the chunk is counted there; once per fence."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    repos.jobs.settle_new_chunk(job.job_id, "c0", usage=Usage(input_tokens=100))
    spent = AttemptStats(calls=3, retries={"model.timeout": 2}, input_tokens=40, output_tokens=4, model_micro_usd=7)
    assert repos.jobs.add_fenced_out(job.job_id, "c0", 1, spent)  # counted: the chunk and the job
    assert not repos.jobs.add_fenced_out(job.job_id, "c0", 1, spent)  # the same attempt again: nothing
    assert repos.jobs.add_fenced_out(job.job_id, "c1", 1, spent)  # not counted: the chunk only
    assert repos.jobs.add_fenced_out(job.job_id, "c1", 2, spent)  # another attempt of it
    assert not repos.jobs.add_fenced_out(job.job_id, "c9", 1, spent)  # no such chunk
    got = repos.jobs.get(job.job_id)
    assert got is not None and (got.input_tokens, got.output_tokens, got.model_micro_usd) == (140, 4, 7)
    c0, c1 = repos.claims.get(job.job_id, "c0"), repos.claims.get(job.job_id, "c1")
    assert c0 is not None and (c0.n_calls, c0.retries, c0.input_tokens, c0.counted) == (3, {"model.timeout": 2}, 40, True)
    assert c1 is not None and (c1.n_calls, c1.input_tokens, c1.counted) == (6, 80, False)


@pytest.mark.parametrize("ending", ["finish", "release"])
def test_an_owner_whose_ending_write_landed_but_whose_retry_failed_adds_nothing_fenced_out(repos: Repos, ending: str):
    """The owner's ending write went through (its spend added, its running-spend entry dropped), botocore's retry of
    it failed the condition: the worker takes its lease for lost and calls `add_fenced_out`, which adds nothing."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    j = job.job_id
    repos.jobs.settle_new_chunk(j, "c0", usage=Usage())  # counted: what is added goes on the job too
    c = repos.claims.claim(j, "c0", "a", 30, 1)
    assert c.won
    spent = AttemptStats(calls=2, input_tokens=50, output_tokens=5, model_micro_usd=11)
    assert repos.claims.heartbeat(j, "c0", c.fence, 30, spent) is not None  # its running spend written
    if ending == "finish":
        assert repos.claims.finish(j, "c0", c.fence, ChunkStatus.DONE, spent) is not None
    else:
        assert repos.claims.release(j, "c0", c.fence, spent, None, failure=False) is not None
    assert not repos.jobs.add_fenced_out(j, "c0", c.fence, spent)
    record = repos.claims.get(j, "c0")
    assert record is not None and (record.n_calls, record.input_tokens, record.model_micro_usd) == (2, 50, 11)
    # and the attempt after it, fenced out with no entry, still adds what it spent
    if ending == "release":
        c2 = repos.claims.claim(j, "c0", "b", 30, 2)
        assert c2.won and repos.jobs.add_fenced_out(j, "c0", c2.fence, spent)


def test_a_dead_attempts_running_spend_is_folded_once_by_whoever_ends_its_fence(repos: Repos):
    """An attempt killed mid-run recorded nothing of what it spent. Its beats and commits set its
    running spend (by fence, set not added); its owner's ending write adds all and drops it; anyone else ending the
    fence (the sweeper, a later claim) folds in what was written, once; a frozen owner fenced out adds the rest."""
    job = _with_chunks(repos, _job(JobState.RUNNING), n=3)
    j = job.job_id
    so_far = AttemptStats(calls=2, retries={"model.timeout": 1}, input_tokens=30, timed_out_calls=1,
                          estimated_micro_usd=9)
    more = so_far.plus(AttemptStats(calls=1, input_tokens=20, output_tokens=5, model_micro_usd=3))
    # c0: the owner ends its own attempt: all it spent, once (its entry dropped, not added again)
    c = repos.claims.claim(j, "c0", "a", 30, 1)
    assert repos.claims.heartbeat(j, "c0", c.fence, 30, spent=so_far)
    assert repos.claims.put_checkpoints(j, "c0", c.fence, [CheckpointWrite(analyst="x", config_hash="h", status="ok",
                                                                           output_json="{}")], 30, spent=more)
    assert repos.claims.get(j, "c0").spend[str(c.fence)].input_tokens == 50  # type: ignore[union-attr]  # set
    done = repos.claims.finish(j, "c0", c.fence, ChunkStatus.DONE, more)
    assert done is not None and (done.n_calls, done.input_tokens, done.spend) == (3, 50, {})
    # c1: killed; the sweeper's write ends the lapsed fence and folds its spend in, once
    c = repos.claims.claim(j, "c1", "a", 30, 1)
    repos.claims.heartbeat(j, "c1", c.fence, 30, spent=so_far)
    repos.clock.advance(31)
    (lapsed,) = [r for r in repos.claims.lapsed(repos.clock()) if r.job_id == j]
    fold = lapsed.spend
    released = repos.claims.release(j, "c1", c.fence, AttemptStats(), None, failure=True, lapsed_before=repos.clock(),
                                    reason=ReleaseReason.WORKER_LOST, fold=fold)
    assert released is not None and (released.n_calls, released.input_tokens, released.timed_out_calls,
                                     released.estimated_micro_usd, released.retries) == (2, 30, 1, 9, {"model.timeout": 1})
    assert released.spend[str(c.fence)].folded
    again = repos.claims.claim(j, "c1", "b", 30, 1)  # a new owner: nothing left to fold
    assert again.record is not None and again.record.input_tokens == 30
    repos.claims.finish(j, "c1", again.fence, ChunkStatus.DONE, AttemptStats(calls=1, input_tokens=7))
    assert repos.claims.get(j, "c1").input_tokens == 37  # type: ignore[union-attr]
    # c2: taken over by a claim before the sweeper looked: the claim folds it; the frozen owner adds only the rest
    c = repos.claims.claim(j, "c2", "a", 30, 1)
    repos.claims.heartbeat(j, "c2", c.fence, 30, spent=so_far)
    repos.clock.advance(31)
    taken = repos.claims.claim(j, "c2", "b", 30, 2)
    assert taken.won and taken.record is not None and taken.record.input_tokens == 30
    assert repos.claims.release(j, "c2", c.fence, AttemptStats(), None, failure=True, lapsed_before=repos.clock(),
                                fold=fold) is None  # the sweeper, too late: the fence moved on
    assert repos.jobs.add_fenced_out(j, "c2", c.fence, more)
    assert not repos.jobs.add_fenced_out(j, "c2", c.fence, more)
    c2 = repos.claims.get(j, "c2")
    assert c2 is not None and (c2.n_calls, c2.input_tokens, c2.output_tokens, c2.timed_out_calls) == (3, 50, 5, 1)
    assert str(c.fence) not in c2.spend


def test_a_settle_counts_the_usage_it_read_or_nothing(repos: Repos):
    """The aggregator read a chunk's usage, an attempt fenced out of it added its spend to the
    (uncounted) record, and the settle counted only what it had read: the rest was on no job. The settle is
    conditional on the usage read; the count reads again and counts it all (forced here by wrapping the settle)."""
    job = _with_chunks(repos, _job(JobState.RUNNING))
    frozen = repos.claims.claim(job.job_id, "c0", "a", 30, 1).fence
    repos.clock.advance(31)
    c = repos.claims.claim(job.job_id, "c0", "b", 30, 2)
    repos.claims.finish(job.job_id, "c0", c.fence, ChunkStatus.DONE, AttemptStats(calls=1, input_tokens=10))
    read = repos.claims.get(job.job_id, "c0")
    assert read is not None
    late = AttemptStats(calls=2, input_tokens=40, output_tokens=4)
    real = repos.jobs.settle_new_chunk
    raced = []

    def settle_after_a_fenced_out_add(*a: Any, **kw: Any) -> Job | None:
        if not raced:  # between the read and the settle: the fenced-out attempt adds its spend
            raced.append(repos.jobs.add_fenced_out(job.job_id, "c0", frozen, late))
        return real(*a, **kw)

    repos.jobs.settle_new_chunk = settle_after_a_fenced_out_add  # type: ignore[method-assign]
    deps = cast(Deps, SimpleNamespace(jobs=repos.jobs, claims=repos.claims, token_ledger=None))  # no spend cap here
    counted_job = lifecycle.count_settled(deps, read, Usage(aws_requests=1))
    assert raced == [True] and counted_job is not None and counted_job.settled_count == 1
    assert (counted_job.input_tokens, counted_job.output_tokens, counted_job.aws_requests) == (50, 4, 1)
    assert lifecycle.count_settled(deps, read) is None  # counted: once


def test_event_numbers_have_no_gap_under_concurrent_writers_and_never_touch_the_job_item(repos: Repos):
    """Numbers and events are written together (the counter item beside the events), so concurrent
    writers leave numbers 1..n with no gap, and the job item is not written per event."""
    import threading

    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    numbers: list[int] = []

    def writer(i: int) -> None:
        for k in range(5):
            numbers.append(repos.jobs.record_event(job.job_id, "e", writer=i, k=k))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(numbers) == list(range(1, 21))
    events = repos.jobs.events(job.job_id)
    assert [e.number for e in events] == list(range(1, 21))
    assert repos.jobs.last_event(job.job_id) == events[-1]
    assert [e.number for e in repos.jobs.events(job.job_id, after=18)] == [19, 20]
    assert repos.jobs.get(job.job_id) == job  # the job item untouched (no `event_seq`, no `updated_at`)
    assert repos.jobs.record_event("job-nobody", "e") == 0 and repos.jobs.events("job-nobody") == []


def test_a_page_of_events_is_short_only_when_there_are_no_more(repos: Repos):
    """A Query stops at 1 MB whatever its Limit. 150 events of ~9 KB each are more than 1 MB:
    a page of 1000 must still hold all 150 (a reader takes a short page for the end of the log), and a page of 120
    the first 120, from any number a reader resumes after."""
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    for i in range(150):
        repos.jobs.record_event(job.job_id, "e", i=i, pad="x" * 9_000)
    assert [e.number for e in repos.jobs.events(job.job_id, limit=1000)] == list(range(1, 151))
    assert [e.number for e in repos.jobs.events(job.job_id, limit=120)] == list(range(1, 121))
    assert [e.number for e in repos.jobs.events(job.job_id, after=20, limit=1000)] == list(range(21, 151))
    assert [e.number for e in repos.jobs.events(job.job_id, after=150, limit=1000)] == []


def test_a_job_whose_events_predate_the_counter_goes_on_from_its_last_number(repos: Repos):
    # GIVEN a job written by an older version: events 1..3 numbered on the job item (`event_seq` 3), no counter
    job, _ = repos.jobs.create(_job(JobState.RUNNING, event_seq=3))
    # WHEN an event is appended THEN it is number 4, and the next 5
    assert repos.jobs.record_event(job.job_id, "a") == 4
    assert repos.jobs.record_event(job.job_id, "b") == 5
    assert [e.number for e in repos.jobs.events(job.job_id)] == [4, 5]


def test_a_job_gone_by_its_ttl_gets_no_event_though_its_counter_lives_on(repos: Repos):
    """The counter item is written after the job item (and its TTL restarts with every event), so it outlives a job
    its TTL deleted: record_event must not go on numbering events of a job that is gone."""
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    assert repos.jobs.record_event(job.job_id, "a") == 1
    # WHEN the job's expiry passes and its TTL deletes the job item (the counter item still there)
    repos.clock.advance(job.expires_at - repos.clock() + 1) if job.expires_at else None
    created, _ = repos.jobs.create(_job(JobState.RUNNING))
    assert repos.jobs.record_event(created.job_id, "a") == 1  # another job, created after: still numbered
    _delete_job_item(repos, job.job_id)
    # THEN no event is written, and 0 says so
    assert repos.jobs.record_event(job.job_id, "b") == 0
    assert [e.number for e in repos.jobs.events(job.job_id)] == [1]
    assert repos.jobs.record_event(created.job_id, "b") == 2


def _delete_job_item(repos: Repos, job_id: str) -> None:
    """What DynamoDB's TTL does to an expired job item (the fake: the same, in memory)."""
    if isinstance(repos.jobs, DynamoJobs):
        repos.jobs.jobs.client.delete_item(TableName=repos.jobs.jobs.name, Key={"job_id": {"S": job_id}})
    else:
        del repos.jobs.items[job_id]  # type: ignore[attr-defined]


def _legacy_settled(repos: Repos, job_id: str, ids: set[str]) -> None:
    """What an older version left on a job in flight: the counted chunk ids in a string set on the job item."""
    if isinstance(repos.jobs, DynamoJobs):
        repos.jobs.jobs.client.update_item(TableName=repos.jobs.jobs.name, Key={"job_id": {"S": job_id}},
                                           UpdateExpression="ADD settled :s",
                                           ExpressionAttributeValues={":s": {"SS": sorted(ids)}})
    else:
        jobs: Any = repos.jobs
        jobs.items[job_id] = jobs.items[job_id].model_copy(update={"legacy_settled": set(ids)})


def test_a_job_in_flight_with_a_settled_set_on_its_item_keeps_working(repos: Repos):
    """Migration: a job written before the count holds its counted chunks in a set on the job item. It is read with
    the marks (counted = in the set or marked), never added to; a chunk in it is not counted again, one taken off
    leaves it with its usage, and a reopen replaces it with marks and a count."""
    u = Usage(input_tokens=10, model_micro_usd=30)
    job = _with_chunks(repos, _job(JobState.RUNNING, input_tokens=20, model_micro_usd=60).model_copy(
        update={"chunk_count": 4}), n=4)
    _legacy_settled(repos, job.job_id, {"c0", "c1"})
    old = repos.jobs.get(job.job_id)
    assert old is not None and old.n_settled == 2 and old.progress == 0.5 and counted(repos.claims, old) == {"c0", "c1"}
    # a chunk in the set is not counted again (no usage added), a new one is counted by the new form
    assert repos.jobs.settle_new_chunk(job.job_id, "c0", usage=u) is None
    now = repos.jobs.settle_new_chunk(job.job_id, "c2", usage=u)
    assert now is not None and (now.settled_count, now.n_settled, now.input_tokens) == (1, 3, 30)
    assert counted(repos.claims, now) == {"c0", "c1", "c2"}
    # unsettling a chunk of the set takes it (and its usage) off the set; one of the new form, off its mark
    after = repos.jobs.unsettle_chunks(job.job_id, {"c1": u, "c2": u})
    assert after is not None and counted(repos.claims, after) == {"c0"} and after.input_tokens == 10
    assert after.settled_version == old.settled_version + 2
    # a reopen rebuilds what is counted from the records: marks and a count, the set gone
    reopened = repos.jobs.transition(job.job_id, (JobState.RUNNING,), JobState.RUNNING, settled={"c0", "c3"})
    assert reopened is not None and reopened.legacy_settled == set() and reopened.settled_count == 2
    assert counted(repos.claims, reopened) == {"c0", "c3"}
    assert repos.jobs.settle_new_chunk(job.job_id, "c0") is None  # still counted once


def test_the_job_item_does_not_grow_with_the_chunks_it_counts(repos: Repos):
    """Every settle used to add the chunk id to a set on the job item (~19 bytes a chunk: a 5 MB
    job's item reached ~24 KB, each write to it billed ~24 units). Now the mark is on the chunk record."""
    if not isinstance(repos.jobs, DynamoJobs):
        pytest.skip("item sizes are DynamoDB's")
    client, table = _raw(repos)
    job = _with_chunks(repos, _job(JobState.RUNNING).model_copy(update={"chunk_count": 40}), n=40)

    def attributes() -> dict[str, Any]:
        return client.get_item(TableName=table, Key={"job_id": {"S": job.job_id}}, ConsistentRead=True)["Item"]

    repos.jobs.settle_chunk(job.job_id, "c0", usage=Usage(input_tokens=1))
    first = attributes()
    for i in range(1, 40):
        repos.jobs.settle_chunk(job.job_id, f"c{i}", usage=Usage(input_tokens=1))
    last = attributes()
    assert "settled" not in last and last["settled_count"] == {"N": "40"}
    assert set(last) == set(first) and len(json.dumps(last)) - len(json.dumps(first)) <= 4  # a number's digits


# ------------------------------------------------------------------------------ claims
def test_claims_are_exclusive_leases_with_a_growing_fence(repos: Repos):
    job_id = _job().job_id
    assert repos.claims.create(_chunk(job_id)) and not repos.claims.create(_chunk(job_id))
    assert not repos.claims.claim(job_id, "nope", "a", 30, 1).won
    first = repos.claims.claim(job_id, "c0", "a", 30, 1)
    assert first.won and first.fence == 1 and first.record is not None and first.record.claimed_by == "a"
    lost = repos.claims.claim(job_id, "c0", "b", 30, 1)
    assert not lost.won and lost.record is not None and lost.record.claimed_by == "a"  # why, without a read
    assert [c.chunk_id for c in repos.claims.lapsed(repos.clock() + 31) if c.job_id == job_id] == ["c0"]
    assert [c for c in repos.claims.lapsed(repos.clock() + 29) if c.job_id == job_id] == []
    repos.clock.advance(31)
    second = repos.claims.claim(job_id, "c0", "b", 30, 2)
    assert second.won and second.fence == 2 and second.record.redeliveries == 1
    assert not repos.claims.heartbeat(job_id, "c0", first.fence, 30)
    assert repos.claims.heartbeat(job_id, "c0", second.fence, 60)
    assert repos.claims.get(job_id, "c0").claim_expires_at == repos.clock() + 60


def test_claims_release_finish_and_redrive_are_fenced(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    env = ErrorEnvelope.of("model.unavailable", "503")
    stats = AttemptStats(calls=3, repairs=1, retries={"model.unavailable": 2})
    assert repos.claims.release(job_id, "c0", c.fence + 1, stats, env, failure=True) is None
    released = repos.claims.release(job_id, "c0", c.fence, stats, env, failure=True)
    assert released is not None and released.status is ChunkStatus.PENDING and released.failures == 1
    assert (released.n_calls, released.repairs, released.retries, released.last_error) == \
        (3, 1, {"model.unavailable": 2}, env)
    assert released.claimed_by is None
    assert [c for c in repos.claims.lapsed(repos.clock() + 10**6) if c.job_id == job_id] == []
    c2 = repos.claims.claim(job_id, "c0", "b", 30, 2)
    # the sweeper's write loses to a heartbeat that landed after its read
    assert repos.claims.finish(job_id, "c0", c2.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(),
                               lapsed_before=repos.clock()) is None
    outcome = ChunkOutcome(findings_key="f.json", coverage={"liability": "ok"}, n_findings=2)
    done = repos.claims.finish(job_id, "c0", c2.fence, ChunkStatus.DONE, AttemptStats(calls=2, retries={"x": 1}),
                               outcome=outcome)
    assert done is not None and done.status is ChunkStatus.DONE and done.settled_at == repos.clock()
    assert (done.findings_key, done.coverage, done.n_findings, done.n_calls) == ("f.json", {"liability": "ok"}, 2, 5)
    assert done.retries == {"model.unavailable": 2, "x": 1} and done.claimed_by is None
    assert repos.claims.reset_for_redrive(job_id, "c0") is None  # only failed / dead-lettered chunks
    assert not repos.claims.claim(job_id, "c0", "c", 30, 3).won  # settled: never claimed again
    repos.claims.create(_chunk(job_id, 1))
    c3 = repos.claims.claim(job_id, "c1", "a", 30, 1)
    dead = repos.claims.finish(job_id, "c1", c3.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(), error=env)
    assert dead is not None and dead.failures == 1 and dead.last_error == env
    reset = repos.claims.reset_for_redrive(job_id, "c1")
    assert reset is not None and (reset.status, reset.failures, reset.fence, reset.redriven) == \
        (ChunkStatus.PENDING, 0, c3.fence + 1, 1)
    assert reset.settled_at is None and reset.redriven_at == repos.clock()
    assert [r.chunk_id for r in repos.claims.for_job(job_id)] == ["c0", "c1"]


def test_claims_park_a_chunk_for_a_batch_pack_it_once_and_return_it_once(repos: Repos):
    """The batch lane's three writes (pipeline/batch_inference.py), on the fake and on DynamoDB alike: a fenced park, a token
    set only on an unpacked parked chunk, a return only with the token it holds (once), the answers' usage added."""
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    assert repos.claims.await_batch(job_id, "c0", c.fence + 1, AttemptStats(), "batch/pending/k", 11) is None
    parked = repos.claims.await_batch(job_id, "c0", c.fence, AttemptStats(calls=0), "batch/pending/k", 11)
    assert parked is not None and parked.status is ChunkStatus.AWAITING_BATCH and parked.claimed_by is None
    assert (parked.batch_pending_key, parked.batch_records, parked.batch_since) == ("batch/pending/k", 11, repos.clock())
    assert not repos.claims.claim(job_id, "c0", "b", 30, 2).won  # parked: no worker takes it
    assert repos.claims.assign_batch(job_id, "c0", c.fence, "t1", None) is not None
    assert repos.claims.assign_batch(job_id, "c0", c.fence, "t2", None) is None  # packed once
    assert repos.claims.return_from_batch(job_id, "c0", c.fence, "t2", stats=AttemptStats()) is None
    env = ErrorEnvelope.of("batch.record_failed", "1 of 11 records unanswered")
    back = repos.claims.return_from_batch(job_id, "c0", c.fence, "t1", stats=AttemptStats(calls=10, input_tokens=500,
                                          model_micro_usd=7), answer_key="batch/answers/a1", failed=True, error=env)
    assert back is not None and back.status is ChunkStatus.PENDING and back.batch_token is None
    assert (back.batch_answer_keys, back.batch_failures, back.n_calls, back.input_tokens, back.model_micro_usd) == \
        (["batch/answers/a1"], 1, 10, 500, 7)
    # its message due, not sent: the collector sends it, then marks it sent (until then the next collect sends it)
    assert (back.release_reason, back.message_sent_at, back.last_error, back.batch_pending_key) == \
        (ReleaseReason.BATCH, None, env, None)
    assert back.batch_message_due
    assert repos.claims.return_from_batch(job_id, "c0", c.fence, "t1", stats=AttemptStats()) is None  # once
    sent = repos.claims.message_sent(job_id, "c0", c.fence)
    assert sent is not None and sent.message_sent_at == repos.clock() and not sent.batch_message_due
    # the next round: claimed again, parked again, sent on demand unpacked, its answers kept
    c2 = repos.claims.claim(job_id, "c0", "b", 30, 1)
    assert repos.claims.await_batch(job_id, "c0", c2.fence, AttemptStats(), "batch/pending/k2", 1) is not None
    od = repos.claims.return_from_batch(job_id, "c0", c2.fence, None, stats=AttemptStats(), on_demand="min_records")
    assert od is not None and od.batch_on_demand == "min_records" and od.batch_answer_keys == ["batch/answers/a1"]


def test_claims_reset_a_done_chunk_only_to_run_analysts_again(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    for analyst in ("liability", "disputes"):
        assert repos.claims.put_checkpoints(job_id, "c0", c.fence,
                                            [CheckpointWrite(analyst=analyst, config_hash="h",
                                                             status="failed", output_json="{}")])
    outcome = ChunkOutcome(findings_key="f.json", coverage={"liability": "failed", "disputes": "ok"}, n_findings=0)
    assert repos.claims.finish(job_id, "c0", c.fence, ChunkStatus.DONE, AttemptStats(), outcome=outcome)
    assert repos.claims.reset_for_redrive(job_id, "c0") is None  # a done chunk, nothing to forget: untouched
    reset = repos.claims.reset_for_redrive(job_id, "c0", forget=["liability", "indemnity"])
    assert reset is not None and (reset.status, reset.fence, reset.redriven) == (ChunkStatus.PENDING, c.fence + 1, 1)
    assert reset.checkpoints == {"disputes": c.fence}  # the forgotten analyst runs again; indemnity had none
    assert set(repos.claims.checkpoints(reset)) == {"disputes"}


def test_claims_keep_the_deadline_the_release_reason_and_the_backpressure_streak(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    env = ErrorEnvelope.of("model.throttled", "429")
    # a Lambda's claim keeps its deadline while it holds the lease (the sweeper sees it lapsed)
    c = repos.claims.claim(job_id, "c0", "a", 30, 1, deadline_at=repos.clock() + 900.5)
    assert c.record is not None and c.record.deadline_at == repos.clock() + 900.5
    (lapsed,) = [r for r in repos.claims.lapsed(repos.clock() + 31) if r.job_id == job_id]
    assert lapsed.deadline_at == repos.clock() + 900.5
    # a backpressure release starts the streak and says why; the next one extends it
    started = repos.clock()
    first = repos.claims.release(job_id, "c0", c.fence, AttemptStats(), env, failure=False,
                                 reason=ReleaseReason.BACKPRESSURE)
    assert first is not None and first.deadline_at is None and first.failures == 0
    assert (first.release_reason, first.released_at, first.backpressure_since, first.backpressure_requeues) == \
        (ReleaseReason.BACKPRESSURE, started, started, 1)
    repos.clock.advance(5)
    c2 = repos.claims.claim(job_id, "c0", "b", 30, 1)  # no deadline: a Fargate poller
    assert c2.record is not None and c2.record.deadline_at is None
    second = repos.claims.release(job_id, "c0", c2.fence, AttemptStats(), env, failure=False,
                                  reason=ReleaseReason.BACKPRESSURE)
    assert second is not None and (second.released_at, second.backpressure_since, second.backpressure_requeues) == \
        (repos.clock(), started, 2)
    # a failed attempt (tier 2) neither extends nor ends it
    c3 = repos.claims.claim(job_id, "c0", "c", 30, 2)
    retry = repos.claims.release(job_id, "c0", c3.fence, AttemptStats(), env, failure=True)
    assert retry is not None and retry.release_reason is ReleaseReason.RETRY and retry.failures == 1
    assert (retry.backpressure_since, retry.backpressure_requeues) == (started, 2)
    # a committed checkpoint (progress) ends it
    c4 = repos.claims.claim(job_id, "c0", "d", 30, 1)
    assert repos.claims.put_checkpoints(job_id, "c0", c4.fence,
                                        [CheckpointWrite(analyst="liability", config_hash="h",
                                                         status="ok", output_json="{}")])
    progressed = repos.claims.get(job_id, "c0")
    assert progressed is not None and (progressed.backpressure_since, progressed.backpressure_requeues) == (None, 0)
    # and a redrive starts the chunk afresh
    again = repos.claims.release(job_id, "c0", c4.fence, AttemptStats(), env, failure=False,
                                 reason=ReleaseReason.BACKPRESSURE)
    assert again is not None and again.backpressure_since == repos.clock()
    c5 = repos.claims.claim(job_id, "c0", "e", 30, 1)
    assert repos.claims.finish(job_id, "c0", c5.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(), error=env)
    reset = repos.claims.reset_for_redrive(job_id, "c0")
    assert reset is not None and (reset.backpressure_since, reset.backpressure_requeues) == (None, 0)


def test_claims_say_when_the_chunks_message_was_sent_and_a_resend_is_fenced(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id).model_copy(update={"message_sent_at": repos.clock()}))  # fan-out
    fanned = repos.clock()
    env = ErrorEnvelope.of("model.throttled", "429")
    # a tier-2 retry sends nothing (its message comes back): the first send time stays, with its retention clock
    repos.clock.advance(10)
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    retry = repos.claims.release(job_id, "c0", c.fence, AttemptStats(), env, failure=True)
    assert retry is not None and retry.message_sent_at == fanned
    # every release that sends a fresh message (backpressure, hold, lost worker) and a redrive move it
    for reason in (ReleaseReason.BACKPRESSURE, ReleaseReason.HELD, ReleaseReason.WORKER_LOST):
        repos.clock.advance(10)
        c = repos.claims.claim(job_id, "c0", "a", 30, 1)
        released = repos.claims.release(job_id, "c0", c.fence, AttemptStats(), env, failure=False, reason=reason)
        assert released is not None and released.message_sent_at == repos.clock(), reason
    repos.clock.advance(10)
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    ended = repos.claims.release(job_id, "c0", c.fence, AttemptStats(), None, failure=False,
                                 reason=ReleaseReason.JOB_ENDED)
    assert ended is not None and ended.message_sent_at == repos.clock() - 10
    # the reconciler's re-send: only while the chunk is pending, unheld and under the fence read
    repos.clock.advance(10)
    assert repos.claims.message_sent(job_id, "c0", c.fence - 1) is None
    marked = repos.claims.message_sent(job_id, "c0", c.fence)
    assert marked is not None and marked.message_sent_at == repos.clock()
    held = repos.claims.claim(job_id, "c0", "b", 30, 1)
    assert repos.claims.message_sent(job_id, "c0", held.fence) is None
    assert repos.claims.finish(job_id, "c0", held.fence, ChunkStatus.DEAD_LETTERED, AttemptStats(), error=env)
    repos.clock.advance(10)
    reset = repos.claims.reset_for_redrive(job_id, "c0")
    assert reset is not None and reset.message_sent_at == repos.clock()


def test_jobs_count_requeues_without_touching_progress(repos: Repos):
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    repos.clock.advance(10)
    repos.jobs.count_requeue(job.job_id)
    repos.jobs.count_requeue(job.job_id)
    after = repos.jobs.get(job.job_id)
    assert after is not None and after.requeues == 2 and after.updated_at == job.updated_at
    repos.jobs.count_requeue("job-that-does-not-exist")  # nothing happens, nothing is created
    assert repos.jobs.get("job-that-does-not-exist") is None


def test_jobs_record_unused_batch_spend_once_per_batch_job_without_touching_progress(repos: Repos):
    """Money spent outside the job's counted chunks (a batch job's answers nobody took: `batch.unused`): added with
    its event, once per batch job however often a collect retries it (two at once included)."""
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    repos.clock.advance(10)
    first = Usage(input_tokens=100, output_tokens=7, model_micro_usd=42)
    assert repos.jobs.record_unused(job.job_id, "b1", first, batch="b1", model_micro_usd=42) == 1
    assert repos.jobs.record_unused(job.job_id, "b1", first, batch="b1", model_micro_usd=42) == 0  # a retry
    assert repos.jobs.record_unused(job.job_id, "b2", Usage(input_tokens=1, model_micro_usd=1), batch="b2") == 2
    after = repos.jobs.get(job.job_id)
    assert after is not None and (after.input_tokens, after.output_tokens, after.model_micro_usd) == (
        job.input_tokens + 101, job.output_tokens + 7, job.model_micro_usd + 43)
    assert after.batch_unused == {"b1", "b2"}
    assert after.updated_at == job.updated_at and after.version == job.version
    assert [(e.type, e.detail.get("batch")) for e in repos.jobs.events(job.job_id)] == [
        ("batch.unused", "b1"), ("batch.unused", "b2")]
    # nothing happens, nothing is created
    assert repos.jobs.record_unused("job-that-does-not-exist", "b1", Usage(model_micro_usd=1)) == 0
    assert repos.jobs.get("job-that-does-not-exist") is None


def test_a_commit_and_a_beat_write_the_expiry_counted_from_their_start_on_both_repositories(repos: Repos):
    """The contract in time: a commit whose outputs take seconds to write (a large one goes to
    S3 first) extends the lease from its start, and says what it wrote; the fake must do exactly what the adapter
    does (it used to count from its end, which the unit tests could not see)."""
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    put_text = repos.artifacts.put_text

    def slow(*a: Any, **kw: Any) -> None:
        repos.clock.advance(20)
        put_text(*a, **kw)
    repos.artifacts.put_text = slow  # type: ignore[method-assign]  # the S3 write takes 20 s
    started = repos.clock()
    until = repos.claims.put_checkpoints(job_id, "c0", c.fence, [CheckpointWrite(
        analyst="liability", config_hash="h", status="ok", output_json="x" * (INLINE_MAX + 1))], lease_s=30)
    assert until == started + 30 == repos.claims.get(job_id, "c0").claim_expires_at
    beat = repos.claims.heartbeat(job_id, "c0", c.fence, 30)
    assert beat == repos.clock() + 30 == repos.claims.get(job_id, "c0").claim_expires_at


def test_checkpoints_commit_only_under_the_current_fence_and_large_ones_go_to_s3(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    old = repos.claims.claim(job_id, "c0", "a", 30, 1)
    repos.clock.advance(31)
    new = repos.claims.claim(job_id, "c0", "b", 30, 2)
    small = json.dumps({"analyst": "liability", "findings": []})
    assert not repos.claims.put_checkpoints(job_id, "c0", old.fence,
                                            [CheckpointWrite(analyst="liability", config_hash="h",
                                                             status="ok", output_json=small)])
    assert repos.claims.checkpoints(repos.claims.get(job_id, "c0")) == {}
    assert repos.claims.put_checkpoints(job_id, "c0", new.fence,
                                        [CheckpointWrite(analyst="liability", config_hash="h",
                                                         status="ok", output_json=small)])
    big = json.dumps({"analyst": "disputes", "pad": "x" * 200})
    assert repos.claims.put_checkpoints(job_id, "c0", new.fence,
                                        [CheckpointWrite(analyst="disputes", config_hash="h",
                                                         status="refused", output_json=big)])
    record = repos.claims.get(job_id, "c0")
    assert record is not None and record.checkpoints == {"liability": new.fence, "disputes": new.fence}
    cps = repos.claims.checkpoints(record)
    assert set(cps) == {"liability", "disputes"}
    assert cps["liability"].output == small and cps["disputes"].output is None
    assert (cps["disputes"].output_key or "").startswith(f"checkpoints/{job_id}/c0/disputes/")
    assert repos.claims.checkpoint_output(cps["disputes"]) == big
    assert (cps["disputes"].status, cps["disputes"].fence, cps["disputes"].config_hash) == ("refused", new.fence, "h")


def test_jobs_fan_out_cursor_moves_only_from_where_it_is(repos: Repos):
    job, _ = repos.jobs.create(_job(JobState.RUNNING, fanned_out=0))
    assert repos.jobs.get(job.job_id).fanned_out == 0
    assert repos.jobs.advance_fanout(job.job_id, 0, 8)
    assert not repos.jobs.advance_fanout(job.job_id, 0, 8)  # a second fan-out from the same read loses
    assert repos.jobs.advance_fanout(job.job_id, 8, 10)
    assert repos.jobs.get(job.job_id).fanned_out == 10
    legacy, _ = repos.jobs.create(_job(JobState.RUNNING))  # no cursor (everything sent at once)
    assert legacy.fanned_out is None and not repos.jobs.advance_fanout(legacy.job_id, 0, 1)
    assert repos.jobs.get(legacy.job_id).fanned_out is None
    assert not repos.jobs.advance_fanout("job-none", 0, 1)


# ------------------------------------------------------------------------------ artifacts and queues
def test_artifacts_read_a_byte_range_of_a_utf8_object(repos: Repos):
    text = "ab é 𝄞 \x01 end"
    repos.artifacts.put_text("documents/r.txt", text, "text/plain; charset=utf-8")
    data = text.encode("utf-8")
    start = data.index("é".encode())
    assert repos.artifacts.get_text_range("documents/r.txt", start, len(data)) == text[text.index("é"):]
    assert repos.artifacts.get_text_range("documents/r.txt", 0, 2) == "ab"
    four = data.index("𝄞".encode())
    assert repos.artifacts.get_text_range("documents/r.txt", four, four + 4) == "𝄞"
    assert repos.artifacts.get_text_range("documents/r.txt", 3, 3) == ""


def test_artifacts_round_trip_and_a_missing_claim_check_is_an_input_error(repos: Repos):
    repos.artifacts.put_text("documents/x.txt", "héllo", "text/plain; charset=utf-8")
    assert repos.artifacts.get_text("documents/x.txt") == "héllo"
    assert repos.artifacts.read_uri(repos.artifacts.bucket, "documents/x.txt") == "héllo".encode()
    with pytest.raises(ReviewError) as info:
        repos.artifacts.read_uri(repos.artifacts.bucket, "uploads/none.txt")
    assert info.value.envelope.error_code == "input.document_missing"


def test_a_claim_check_read_with_a_limit_reads_one_byte_past_it_at_most(repos: Repos):
    repos.artifacts.put_text("uploads/ten.txt", "0123456789", "text/plain")
    assert repos.artifacts.read_uri(repos.artifacts.bucket, "uploads/ten.txt", max_bytes=4) == b"01234"
    assert repos.artifacts.read_uri(repos.artifacts.bucket, "uploads/ten.txt", max_bytes=10) == b"0123456789"
    repos.artifacts.put_text("uploads/empty.txt", "", "text/plain")  # S3 answers a range of it with 416
    assert repos.artifacts.read_uri(repos.artifacts.bucket, "uploads/empty.txt", max_bytes=4) == b""
    with pytest.raises(ReviewError) as info:
        repos.artifacts.read_uri(repos.artifacts.bucket, "uploads/none.txt", max_bytes=4)
    assert info.value.envelope.error_code == "input.document_missing"


def test_dead_letters_carry_their_envelope_and_peeking_hides_nothing(repos: Repos):
    env = ErrorEnvelope.of("model.unavailable", "503", step="liability")
    repos.queues.dead_letter(Queue.ANALYSIS, '{"job_id": "j"}', env, job_id="j", chunk_id="c0")
    first = repos.queues.peek(Queue.ANALYSIS_DLQ)
    second = repos.queues.peek(Queue.ANALYSIS_DLQ)
    assert [m.message_id for m in first] == [m.message_id for m in second] and len(first) == 1
    (m,) = first
    assert m.body == '{"job_id": "j"}' and m.sent_at > 0
    assert (m.attributes["error_code"], m.attributes["job_id"], m.attributes["chunk_id"]) == ("model.unavailable", "j", "c0")
    assert ErrorEnvelope.model_validate_json(m.attributes["envelope"]) == env
    (taken,) = repos.queues.take_all(Queue.ANALYSIS_DLQ)
    repos.queues.delete(Queue.ANALYSIS_DLQ, taken.receipt_handle)
    assert repos.queues.peek(Queue.ANALYSIS_DLQ) == []
    # a peeked message can be deleted with the receipt handle the peek gave (the sweeper does)
    repos.queues.dead_letter(Queue.ANALYSIS, '{"job_id": "k"}', env, job_id="k")
    (peeked,) = repos.queues.peek(Queue.ANALYSIS_DLQ)
    repos.queues.delete(Queue.ANALYSIS_DLQ, peeked.receipt_handle)
    assert repos.queues.peek(Queue.ANALYSIS_DLQ) == [] and repos.queues.take_all(Queue.ANALYSIS_DLQ) == []


def test_results_with_the_same_dedup_id_are_delivered_once(repos: Repos):
    msg = ResultMessage(job_id="job-q", chunk_id="c0", chunk_index=0, status=ChunkStatus.DONE, fence=1)
    repos.queues.send_result(msg, msg.dedup_id())
    repos.queues.send_result(msg, msg.dedup_id())
    repos.queues.send_result(msg, msg.dedup_id(":reconcile:1"))
    assert repos.queues.depth(Queue.RESULTS) == 2


# ------------------------------------------------------------------------------ side effects (saga.py)
def test_jobs_record_side_effects_in_place_without_touching_the_version(repos: Repos):
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    ticket = SideEffectDone(step="ticket.open", key="k1", at=2.0, operation="create", result={"ticket_id": "T-1"})
    publish = SideEffectDone(step="report.publish", key="k2", at=3.0, operation="publish",
                             result={"sns_message_id": "m", "event_id": "e"})
    repos.jobs.record_side_effect(job.job_id, ticket)
    after = repos.jobs.record_side_effect(job.job_id, publish)
    assert after is not None and [e.step for e in after.side_effects] == ["ticket.open", "report.publish"]
    env = ErrorEnvelope.of("sideeffect.compensation_failed", "close failed", cause_code="sideeffect.failed")
    closed = ticket.model_copy(update={"status": StepStatus.COMPENSATION_FAILED, "error": env,
                                       "compensation_key": "c1", "compensation_result": {"ticket_id": None}})
    updated = repos.jobs.record_side_effect(job.job_id, closed)
    assert updated is not None and updated.side_effects == [closed, publish]  # replaced where it was
    assert repos.jobs.get(job.job_id) == updated and updated.version == job.version  # a transition still holds
    assert repos.jobs.record_side_effect("job-none", ticket) is None


def test_the_outcome_store_acts_once_per_key_and_forgets_a_failure(repos: Repos, request: pytest.FixtureRequest):
    from contract_review.adapters.outcomes import PowertoolsOutcomes

    from ..unit.fake_side_effects import MemoryPersistence

    if isinstance(repos.jobs, DynamoJobs):  # Powertools' own DynamoDB layer on the stack's idempotency table
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        aws: EmbeddedAws = request.getfixturevalue("embedded")
        client = local_session(aws.region).client("dynamodb", endpoint_url=aws.endpoint)
        layer: Any = DynamoDBPersistenceLayer(table_name=aws.outputs["IdempotencyTableName"], boto3_client=client)
    else:
        layer = MemoryPersistence()
    store = PowertoolsOutcomes(layer, expires_after_s=3600)
    key = f"k-{next(_n)}"
    acted: list[int] = []

    def act() -> dict[str, Any]:
        acted.append(1)
        return {"ticket_id": "T-1", "n": len(acted)}

    assert store.once(key, act, lambda: 10_000) == {"ticket_id": "T-1", "n": 1}
    assert store.once(key, act, lambda: 10_000) == {"ticket_id": "T-1", "n": 1} and len(acted) == 1

    def fails() -> dict[str, Any]:
        acted.append(1)
        raise RuntimeError("the ticket system is down")

    other = f"k-{next(_n)}"
    with pytest.raises(RuntimeError):
        store.once(other, fails, lambda: 10_000)
    assert store.once(other, act, lambda: 10_000)["n"] == 3  # the failed attempt kept nothing


def test_a_hold_ends_the_backpressure_streak_instead_of_extending_it(repos: Repos):
    job_id = _job().job_id
    repos.claims.create(_chunk(job_id))
    c = repos.claims.claim(job_id, "c0", "a", 30, 1)
    throttled = repos.claims.release(job_id, "c0", c.fence, AttemptStats(), ErrorEnvelope.of("model.throttled"),
                                     failure=False, reason=ReleaseReason.BACKPRESSURE)
    assert throttled is not None and throttled.backpressure_since is not None
    c2 = repos.claims.claim(job_id, "c0", "b", 30, 1)
    held = repos.claims.release(job_id, "c0", c2.fence, AttemptStats(),
                                ErrorEnvelope.of("model.daily_quota_exhausted"), failure=False,
                                reason=ReleaseReason.HELD)
    assert held is not None and (held.release_reason, held.failures) == (ReleaseReason.HELD, 0)
    assert (held.backpressure_since, held.backpressure_requeues) == (None, 0)
    assert held.last_error is not None and held.last_error.error_code == "model.daily_quota_exhausted"


def test_a_jobs_waiting_condition_is_named_once_and_ended_once(repos: Repos):
    job, _ = repos.jobs.create(_job(JobState.RUNNING))
    first = Waiting(condition="daily_token_quota", model_id="m", tokens_per_day=1e6, since=5.0, detail="waiting")
    assert repos.jobs.set_waiting(job.job_id, first)
    assert not repos.jobs.set_waiting(job.job_id, first.model_copy(update={"since": 9.0}))  # the first one stays
    got = repos.jobs.get(job.job_id)
    assert got is not None and got.waiting == first and got.version == job.version
    assert repos.jobs.set_waiting(job.job_id, None) and not repos.jobs.set_waiting(job.job_id, None)
    ended = repos.jobs.get(job.job_id)
    assert ended is not None and ended.waiting is None
    assert not repos.jobs.set_waiting("job-none", first)  # no job: nothing is created


def test_the_daily_token_ledger_adds_atomically_reads_its_window_and_claims_each_probe_once(repos: Repos):
    model, h = f"model-{next(_n)}", 500_000
    repos.ledger.add(model, h - 24, 7)
    repos.ledger.add(model, h - 1, 100)
    repos.ledger.add(model, h, 20)
    repos.ledger.add(model, h, 30)  # two workers' flushes of one hour: summed
    repos.ledger.add(f"{model}-other", h, 1_000)
    window = repos.ledger.window(model, h - 23)
    assert (dict(window.hours), window.since_hour, window.probe_hour) == ({h - 1: 100, h: 50}, 0, None)
    # the hold starts once; each later hour's probe is claimed by one caller only
    assert repos.ledger.claim_probe(model, h, None) and not repos.ledger.claim_probe(model, h, None)
    assert repos.ledger.claim_probe(model, h + 1, h) and not repos.ledger.claim_probe(model, h + 1, h)
    assert repos.ledger.window(model, h - 23).probe_hour == h + 1
    # a probe answered: counting restarts at its hour, no hold under way
    repos.ledger.lift(model, h + 1)
    after = repos.ledger.window(model, h - 23)
    assert (after.since_hour, after.probe_hour, dict(after.hours)) == (h + 1, None, {h - 1: 100, h: 50})


def test_a_spend_charge_is_taken_once_per_id_within_the_limit_and_given_back_once(repos: Repos):
    """The allowance taken under the job's charge id, in one transaction with its
    record: a replay takes nothing again, a give-back undoes it once, and an expired record is no record."""
    counter, day = f"spend#owner-{next(_n)}", 20_000
    first = Charge("job-a", counter, day, 60, expires_at=10_000)
    assert repos.ledger.take_once(first, 100, now=1_000) is Taken.NOW
    assert repos.ledger.take_once(first, 100, now=1_000) is Taken.BEFORE  # a replay: nothing again
    assert repos.ledger.take_once(Charge("job-b", counter, day, 60, 10_000), 100, now=1_000) is Taken.REFUSED
    assert repos.ledger.take_once(Charge("job-c", counter, day, 500, 10_000), 100, now=1_000) is Taken.REFUSED
    assert repos.ledger.take_once(Charge("job-c", counter, day, 40, 10_000), 100, now=1_000) is Taken.NOW
    assert repos.ledger.take(counter, day, 1, 100, 10_000) is None  # 100 of 100 taken
    # given back once: the room is there again, and the charge may be taken again (once)
    assert repos.ledger.give_back(first) and not repos.ledger.give_back(first)
    assert repos.ledger.take(counter, day, 0, 100, 10_000) == 40
    assert repos.ledger.take_once(first, 100, now=1_000) is Taken.NOW
    assert repos.ledger.take_once(first, 200, now=1_000) is Taken.BEFORE
    # a record past its expiry (TTL may not have deleted it yet) is no record: the next day's admission is charged
    later = Charge("job-a", counter, day + 1, 60, 20_000)
    assert repos.ledger.take_once(later, 100, now=10_001) is Taken.NOW
    assert repos.ledger.take(counter, day + 1, 0, 100, 20_000) == 60


def test_artifacts_list_every_key_under_a_prefix_and_nothing_else(repos: Repos):
    # GIVEN manifests under batches/, and keys that only look alike elsewhere
    for i in range(3):
        repos.artifacts.put_text(f"batches/batch-{i:020d}.json", "{}")
    repos.artifacts.put_text("batchesx/other.json", "{}")
    repos.artifacts.put_text("reports/batch-0.json", "{}")
    assert sorted(repos.artifacts.list_keys("batches/batch-")) == [f"batches/batch-{i:020d}.json" for i in range(3)]
    assert repos.artifacts.list_keys("batches/batch-1") == []
    assert repos.artifacts.list_keys("batches/batch-" + "0" * 19 + "2") == ["batches/batch-" + "0" * 19 + "2.json"]
    repos.artifacts.delete("batches/batch-" + "0" * 19 + "2.json")
    repos.artifacts.delete("batches/never-written.json")  # gone already: nothing happens
    assert sorted(repos.artifacts.list_keys("batches/batch-")) == [f"batches/batch-{i:020d}.json" for i in range(2)]


# ------------------------------------------------------------------------------ the runtime control
def _control_deps(control: ModelControls, clock: FakeClock) -> Deps:
    """What `review quota` (operate/model_control.py) takes: the control and the clock (the other repositories unused)."""
    w = FakeWorld(clock=clock)
    return Deps(settings=SETTINGS, jobs=w.jobs, claims=w.claims, artifacts=w.artifacts, queues=w.queues, clock=clock,
                model_control=control)


class _Interleaved:
    """The control, with `race` run between one writer's read and its conditional write, once (the forced
    interleaving: the other writer gets there first)."""

    def __init__(self, control: ModelControls, race: Any):
        self.control, self.race, self.applied = control, race, 0

    def get(self) -> ModelControl:
        return self.control.get()

    def update(self, change: Any) -> ModelControl:
        def interleaved(seen: ModelControl) -> ModelControl:
            self.applied += 1
            if self.applied == 1:
                self.race()
            return change(seen)
        return self.control.update(interleaved)


def test_a_pause_racing_a_set_keeps_both_and_the_collectors_switch_survives_a_clear(repos: Repos):
    """The control was read, changed and overwritten whole, so of a `review quota pause` and a
    `review quota set` at once, the later write undid the earlier. Each writer now writes its own fields,
    conditional on the version it read: the loser reads again and applies its change again."""
    from contract_review.operate import model_control

    alice, bob = _control_deps(repos.other_control, repos.clock), None
    # WHEN bob's `review quota set 900000` reads the control (none yet), alice's `review quota pause` writes it, and
    # only then does bob's write go out (the first write of the item: the race to create it)
    racing = _Interleaved(repos.control, lambda: model_control.quota_change(alice, "alice", paused=True))
    bob = _control_deps(racing, repos.clock)
    written = model_control.quota_change(bob, "bob", tokens_per_minute=900_000)
    # THEN both are kept: the pause and the quota; bob's change was applied again to what alice wrote
    assert racing.applied == 2
    assert (written.paused, written.tokens_per_minute, written.by, written.version) == (True, 900_000, "bob", 2)
    # WHEN the batch collector turns a model's batch lane off (its own field) while `review quota set --clear` is
    # between its read and its write
    off = BatchLaneOff(error_code="batch.refused", reason="ValidationException: model not offered in batch",
                       at=repos.clock(), by="collector")
    collector = lambda: repos.other_control.update(  # noqa: E731
        lambda now: now.model_copy(update={"batch_off": {**now.batch_off, "model-a": off}}))
    racing = _Interleaved(repos.control, collector)
    cleared = model_control.quota_change(_control_deps(racing, repos.clock), "carol", clear_quota=True)
    # THEN the switch survives the clear, the quota is cleared, the pause is kept
    assert cleared.batch_off == {"model-a": off} and cleared.tokens_per_minute is None and cleared.paused
    assert cleared.version == 4
    # AND a reader in another process sees all of it once its cache has aged
    repos.clock.advance(CONTROL_MAX_AGE_S)
    assert repos.other_control.get() == cleared
    # AND `review quota batch --on` removes that model's entry only; again, nothing changes and nothing is written
    on, removed = model_control.batch_lane_on(alice, "model-a")
    assert removed == off and on.batch_off == {} and on.version == 5 and on.paused
    again, removed = model_control.batch_lane_on(alice, "model-a")
    assert removed is None and again.version == 5


def test_control_reads_are_cached_for_their_max_age_and_a_writer_sees_its_own_write_at_once(repos: Repos):
    from contract_review.operate import model_control

    assert repos.control.get() == ModelControl()  # no item: no control, the model runs as deployed
    model_control.quota_change(_control_deps(repos.other_control, repos.clock), "ops", paused=True)
    assert repos.other_control.get().paused  # the writer's own cache took what it wrote
    repos.clock.advance(CONTROL_MAX_AGE_S - 1)
    assert not repos.control.get().paused  # another process's reader: from its cache, no read (the cost it saves)
    repos.clock.advance(1)
    assert repos.control.get().paused  # within the cache's age of the write

