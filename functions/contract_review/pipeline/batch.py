"""The batch lane: a job sent with `inference: batch` has its model calls answered by Bedrock batch inference, at
the batch price, within hours (docs/batch-inference.md).

A batch-mode chunk goes through the same worker, checkpoints, coverage, report and cost accounting as any other;
only its model calls differ. The worker runs its analysts against the answers its batch jobs already returned
(`Answers`: every answer is replayed, never called again); the first request of an analyst that has no answer yet
(`AwaitBatch`) is written, with the other analysts' first missing ones, to S3 (`batch/pending/`), and the chunk is
parked `awaiting_batch`: nobody holds it and no message is in flight. `locate` and `assess` are two rounds (an
analyst's assess request is only known once its locate answer is back; a repair after an invalid answer is a third).

The sweeper's `collect` (each sweep) then, over the running batch-mode jobs:
1. tracks each batch job holding parked chunks (`GetModelInvocationJob`): when it ends with an output, each chunk's
   answers are stored (`batch/answers/`), their tokens priced at the batch price and added to the chunk record in
   the same conditional write that makes the chunk pending again, and the chunk's message is sent: the worker
   replays its answers and parks what is still missing (the next round) or settles it. A record that failed or is
   missing from the output (`batch.record_failed`) is simply asked again in the next round; a batch job that failed,
   stopped or expired (`batch.job_failed`) sends its chunks back the same way, their answers none. Either is a
   batch failure of the chunk: after `batch_max_failures` the chunk's remaining calls go on demand.
2. packs the chunks waiting for a batch: when their records reach the minimum per batch job (Service Quotas; the
   profile's `batch_min_records`), into one batch job (at most `batch_max_records`) under an idempotency token
   (a write-ahead manifest `batch/jobs/<token>.json`, then each chunk's token set conditionally, then
   `CreateModelInvocationJob` with that token: a sweep that crashes anywhere is finished by the next with the same
   token, and no chunk is ever in two batch jobs). Below the minimum, a chunk waits for others until its job's deadline
   less `batch_expected_s` (or `batch_max_wait_s`, when the profile sets it); then its calls go on demand (`batch_on_demand`), as they do
   at once when no batch service is configured. A chunk whose batch job is still running at its job's deadline goes
   on demand too (the batch job, which holds other jobs' records, goes on; its answers for that chunk are dropped).
A parked chunk's job is touched each sweep (it is tracked, not stalled). Batch calls take nothing from the on-demand
pacers; the chunk of a job cancelled meanwhile is settled `cancelled` by the cancel (its batch answers are dropped).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from contract_review.config.profile import Profile
from contract_review.domain.batch import (
    HAS_OUTPUT,
    BatchJobState,
    BatchManifest,
    BatchRecord,
    BatchStatus,
    ManifestChunk,
    ModelBody,
    RecordOutcome,
)
from contract_review.domain.cost import batch_usage, micro_usd, model_cost_usd, model_price
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, ReviewError
from contract_review.domain.keys import batch_answers_key, batch_manifest_key, batch_pending_key
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Deps
from contract_review.domain.records import AttemptStats, ChunkRecord, ChunkStatus, Inference, Job, Usage
from contract_review.model.bedrock import converse_body, converse_response
from contract_review.reliability.chunks import analysis_message
from contract_review.review.analysts import ParsedItems

log = logging.getLogger(__name__)

DEFAULT_MIN_RECORDS = 100  # Bedrock's default "minimum number of records per batch inference job"


# ------------------------------------------------------------------------------ the worker's side
def record_for(job_id: str, chunk_id: str, request: ModelRequest) -> BatchRecord:
    """The batch record of one model request of a chunk: its Converse body without a cache point (a batch record
    reads no prompt cache) under a recordId derived from the job, the chunk and that body: the same request is
    the same record in every process, and a repair (another body) another record."""
    body = converse_body(request, cache_point=False)
    digest = hashlib.sha256(json.dumps([job_id, chunk_id, body], sort_keys=True, separators=(",", ":"))
                            .encode()).hexdigest()[:24]
    return BatchRecord(record_id=f"{request.analyst}.{request.step}.{digest}", model_input=body)


class AwaitBatch(Exception):
    """An analyst's next request has no answer yet: it goes into a batch job (the analyst stops here)."""

    def __init__(self, record: BatchRecord):
        super().__init__(record.record_id)
        self.record = record


@dataclass
class Answers:
    """The answers a chunk's batch jobs returned (recordId -> Converse response body), replayed by its analysts.
    A replayed answer has no usage: its tokens were priced and added to the chunk when it was collected."""

    job_id: str
    chunk_id: str
    outputs: dict[str, ModelBody] = field(default_factory=dict)

    @classmethod
    def load(cls, deps: Deps, record: ChunkRecord) -> Answers:
        outputs: dict[str, ModelBody] = {}
        for key in record.batch_answer_keys:
            outputs.update(json.loads(deps.artifacts.get_text(key)))
        return cls(record.job_id, record.chunk_id, outputs)

    def answer(self, request: ModelRequest) -> tuple[BatchRecord, ModelResponse | None]:
        record = record_for(self.job_id, self.chunk_id, request)
        output = self.outputs.get(record.record_id)
        if output is None:
            return record, None
        return record, converse_response({k: v for k, v in output.items() if k != "usage"})

    def step(self, build: Callable[[ErrorEnvelope | None], ModelRequest],
             parse: Callable[[ModelResponse], ParsedItems]) -> tuple[ParsedItems, int]:
        """One analyst step from the answers (`review.analysts.StepCaller`): the answer, and one repair after an
        invalid one, as on demand (`Retrier.call_with_repair`); raises `AwaitBatch` for the first request that
        has no answer. Returns the items and the answers used."""
        invalid: ErrorEnvelope | None = None
        for used, repair in enumerate((False, True), start=1):
            record, response = self.answer(build(invalid))
            if response is None:
                raise AwaitBatch(record)
            try:
                return parse(response), used
            except ReviewError as exc:
                if exc.envelope.error_class is not ErrorClass.SEMANTIC or repair:
                    raise
                invalid = exc.envelope
        raise AssertionError("unreachable")


def in_batch_lane(job: Job, record: ChunkRecord) -> bool:
    """Whether the chunk's model calls go to batch inference (else on demand, replaying any batch answers)."""
    return job.inference is Inference.BATCH and record.batch_on_demand is None


def park(deps: Deps, job_id: str, chunk_id: str, fence: int, stats: AttemptStats,
         waiting: Sequence[BatchRecord]) -> ChunkRecord | None:
    """Write the chunk's missing requests where the collector packs them from, then park the chunk (fenced). None:
    the fence moved on (the records written are never read: the key names this fence)."""
    key = batch_pending_key(job_id, chunk_id, fence)
    deps.artifacts.put_text(key, "".join(json.dumps({"recordId": r.record_id, "modelInput": r.model_input},
                                                    separators=(",", ":")) + "\n" for r in waiting),
                            content_type="application/jsonl")
    return deps.claims.await_batch(job_id, chunk_id, fence, stats, key, len(waiting))


# ------------------------------------------------------------------------------ the sweeper's side
@dataclass
class CollectReport:
    submitted: list[str] = field(default_factory=list)  # batch tokens submitted this sweep
    collected: list[str] = field(default_factory=list)  # batch tokens whose job ended and whose chunks went back
    running: int = 0  # batch jobs still running
    on_demand: list[str] = field(default_factory=list)  # chunks ("job/chunk") sent on demand this sweep
    waiting_records: int = 0  # records waiting for the minimum after this sweep


@dataclass
class Parked:
    job: Job
    chunk: ChunkRecord


def min_records(deps: Deps) -> int:
    """The minimum records per batch job: the profile's, else the account's (Service Quotas, read once), else
    Bedrock's default."""
    return (deps.settings.profile.batch.batch_min_records or (deps.batch.min_records() if deps.batch else None)
            or DEFAULT_MIN_RECORDS)


def collect(deps: Deps, now: float, report: CollectReport | None = None,
            isolate: Callable[[str], AbstractContextManager[None]] | None = None) -> CollectReport:
    """One pass of the collector over the running batch-mode jobs (module docstring). `isolate(item)`: a context
    manager per item (the sweeper's: one bad item is logged and counted, never stops the rest)."""
    report = report or CollectReport()
    parked: list[Parked] = []
    for job in deps.jobs.stalled(now + 1):  # every running job (none updated after now)
        if job.inference is not Inference.BATCH:
            continue
        waiting = [c for c in deps.claims.for_job(job.job_id) if c.status is ChunkStatus.AWAITING_BATCH]
        if waiting:
            deps.jobs.touch(job.job_id)  # tracked: its batch jobs are followed here, it is not stalled
            parked += [Parked(job, c) for c in waiting]
    by_token: dict[str | None, list[Parked]] = {}
    for p in parked:
        by_token.setdefault(p.chunk.batch_token, []).append(p)
    for token, members in by_token.items():
        if token is not None:
            _guarded(isolate, f"batch:{token}", functools.partial(_track, deps, token, members, now, report))
    unpacked = by_token.get(None, [])
    if unpacked:
        _guarded(isolate, "batch:pack", lambda: _pack_or_wait(deps, unpacked, now, report))
    return report


def _guarded(isolate: Callable[[str], AbstractContextManager[None]] | None, item: str, fn: Callable[[], None]) -> None:
    if isolate is None:
        fn()
        return
    with isolate(item):
        fn()


def _pack_or_wait(deps: Deps, waiting: list[Parked], now: float, report: CollectReport) -> None:
    p = deps.settings.profile
    if deps.batch is None:  # no batch service configured: nothing would ever answer them
        for m in waiting:
            _to_on_demand(deps, m, "unavailable", report)
        return
    total = sum(m.chunk.batch_records for m in waiting)
    if total >= min_records(deps):
        for members in _slices(waiting, p.batch.batch_max_records):
            _pack(deps, members, now, report)
        return
    for m in waiting:
        reason = _overdue(p, m, now)
        if reason is not None:
            _to_on_demand(deps, m, reason, report)
        else:
            report.waiting_records += m.chunk.batch_records


def _overdue(p: Profile, m: Parked, now: float) -> str | None:
    """Why a chunk below the minimum stops waiting for others: its wait is over, or its job's deadline is near."""
    if m.job.deadline_at is not None and m.job.deadline_at - now < p.batch.batch_expected_s:
        return "deadline"
    wait_s = p.batch.batch_max_wait_s
    if wait_s is not None and now - (m.chunk.batch_since or now) >= wait_s:
        return "min_records"
    return None


def _slices(members: list[Parked], max_records: int) -> Iterable[list[Parked]]:
    """Members in batch jobs of at most `max_records` records (a chunk's records stay together)."""
    current: list[Parked] = []
    n = 0
    for m in sorted(members, key=lambda m: (m.chunk.batch_since or 0.0, m.chunk.job_id, m.chunk.chunk_index)):
        if current and n + m.chunk.batch_records > max_records:
            yield current
            current, n = [], 0
        current.append(m)
        n += m.chunk.batch_records
    if current:
        yield current


def _token(members: Sequence[Parked]) -> str:
    names = sorted(f"{m.chunk.job_id}/{m.chunk.chunk_id}/{m.chunk.fence}" for m in members)
    return "b" + hashlib.sha256("\n".join(names).encode()).hexdigest()[:31]


def _records_of(deps: Deps, chunk: ChunkRecord) -> list[BatchRecord]:
    if chunk.batch_pending_key is None:
        return []
    lines = deps.artifacts.get_text(chunk.batch_pending_key).splitlines()
    return [BatchRecord(record_id=d["recordId"], model_input=d["modelInput"]) for d in map(json.loads, lines) if d]


def _pack(deps: Deps, members: list[Parked], now: float, report: CollectReport) -> None:
    """Write-ahead manifest, each chunk's token (conditional), then the batch job (idempotent by the token)."""
    token = _token(members)
    manifest = BatchManifest(token=token, created_at=now, chunks=_chunks_of(members))
    _write(deps, manifest)
    won = [m for m in members if deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, token,
                                                          None) is not None]
    if sum(m.chunk.batch_records for m in won) < min_records(deps):  # another sweep packed some of them meanwhile
        for m in won:
            deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, None, token)
        return
    _submit(deps, token, won, manifest, report)


def _chunks_of(members: Iterable[Parked]) -> list[ManifestChunk]:
    return [ManifestChunk(job_id=m.chunk.job_id, chunk_id=m.chunk.chunk_id, fence=m.chunk.fence,
                          records=m.chunk.batch_records) for m in members]


def _write(deps: Deps, manifest: BatchManifest) -> None:
    deps.artifacts.put_text(batch_manifest_key(manifest.token), manifest.model_dump_json())


def _submit(deps: Deps, token: str, members: list[Parked], manifest: BatchManifest, report: CollectReport) -> None:
    assert deps.batch is not None
    # a recordId is a digest of its request: one already taken is the same request (a file written twice by hand)
    records = list({r.record_id: r for m in members for r in _records_of(deps, m.chunk)}.values())
    arn = deps.batch.submit(records, token)  # the same token again returns the same job
    manifest = manifest.model_copy(update={"job_arn": arn, "status": "Submitted", "submitted_at": deps.clock(),
                                           "records": len(records), "chunks": _chunks_of(members)})
    _write(deps, manifest)
    report.submitted.append(token)
    for job_id, n in _per_job(members).items():
        deps.jobs.record_event(job_id, "batch.submitted", batch=token, batch_job_arn=arn, records=n,
                               batch_records=len(records))


def _per_job(members: Iterable[Parked]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in members:
        counts[m.chunk.job_id] = counts.get(m.chunk.job_id, 0) + m.chunk.batch_records
    return counts


def read_manifest(deps: Deps, token: str) -> BatchManifest:
    """A batch job's manifest (written before any chunk names its token, kept after it ends)."""
    return BatchManifest.model_validate_json(deps.artifacts.get_text(batch_manifest_key(token)))


def _track(deps: Deps, token: str, members: list[Parked], now: float, report: CollectReport) -> None:
    if deps.batch is None:  # the service was configured when they were packed, and is not now
        _returned(deps, token, members, None, ErrorEnvelope.of("batch.job_failed", "no batch service is configured",
                                                                step="batch"), report)
        return
    manifest = read_manifest(deps, token)
    if manifest.job_arn is None:  # a sweep stopped between the tokens and the submit: finish it
        _submit(deps, token, members, manifest, report)
        return
    state = deps.batch.status(manifest.job_arn)
    if manifest.status != state.status.value:
        manifest = manifest.model_copy(update={"status": state.status.value, "checked_at": now})
        _write(deps, manifest)
    if not state.terminal:
        report.running += 1
        for m in members:  # a job whose deadline passed goes on without it (the batch job holds others' records)
            if m.job.deadline_at is not None and now >= m.job.deadline_at:
                _to_on_demand(deps, m, "deadline", report, token)
        return
    if state.status in HAS_OUTPUT:
        _returned(deps, token, members, deps.batch.results(state.job_id), None, report, state)
    else:
        env = ErrorEnvelope.of("batch.job_failed", state.message or f"the batch job ended {state.status.value}",
                               provider_code=state.status.value, step="batch")
        _returned(deps, token, members, None, env, report, state)
    _write(deps, manifest.model_copy(update={"ended_at": now}))
    report.collected.append(token)


def _returned(deps: Deps, token: str, members: list[Parked], outcomes: dict[str, RecordOutcome] | None,
              job_error: ErrorEnvelope | None, report: CollectReport, state: BatchJobState | None = None) -> None:
    """Each chunk of an ended batch job goes back pending with its answers (none when the job failed), its
    answered records' tokens at the batch price, a batch failure when any of its records went unanswered."""
    p = deps.settings.profile
    for m in members:
        c = m.chunk
        ids = [r.record_id for r in _records_of(deps, c)]
        answered: dict[str, ModelBody] = {}
        for i in ids:
            output = outcomes[i].output if outcomes is not None and i in outcomes else None
            if output is not None:
                answered[i] = output
        missed = [i for i in ids if i not in answered]
        error = job_error
        if job_error is None and missed:
            first = outcomes.get(missed[0]) if outcomes is not None else None
            error = ErrorEnvelope.of("batch.record_failed", f"{len(missed)} of {len(ids)} records unanswered",
                                     provider_code=first.error_code if first else None, step="batch")
        answer_key = None
        if answered:
            answer_key = batch_answers_key(c.job_id, c.chunk_id, token)
            deps.artifacts.put_text(answer_key, json.dumps(answered))
        failed = error is not None
        on_demand = "failures" if failed and c.batch_failures + 1 >= p.batch.batch_max_failures else None
        back = deps.claims.return_from_batch(c.job_id, c.chunk_id, c.fence, token, stats=_priced(deps, answered),
                                             answer_key=answer_key, failed=failed, on_demand=on_demand, error=error)
        if back is None:
            continue  # cancelled, or returned by another sweep: nothing to send
        deps.queues.send_analysis([analysis_message(deps, m.job, back, "batch")])
        deps.jobs.record_event(c.job_id, "batch.returned", batch=token, chunk_id=c.chunk_id,
                               chunk_index=c.chunk_index, answered=len(answered), unanswered=len(missed),
                               batch_status=state.status.value if state else None,
                               **({"error_code": error.error_code} if error else {}),
                               **({"on_demand": on_demand} if on_demand else {}))
        if on_demand:
            report.on_demand.append(f"{c.job_id}/{c.chunk_id}")


def _priced(deps: Deps, answered: dict[str, ModelBody]) -> AttemptStats:
    """The answered records as calls, their tokens at the batch price (the on-demand price if the model has no
    batch price: never less than what was spent is shown)."""
    tokens = Usage(input_tokens=sum(int(o.get("usage", {}).get("inputTokens", 0)) for o in answered.values()),
                   output_tokens=sum(int(o.get("usage", {}).get("outputTokens", 0)) for o in answered.values()))
    s = deps.settings
    priced = batch_usage(s.profile.prices, s.effective_model_id, tokens)
    if priced is None:
        priced = tokens.model_copy(update={"model_micro_usd": micro_usd(model_cost_usd(
            model_price(s.profile.prices, s.effective_model_id), tokens))})
    return AttemptStats(calls=len(answered), **priced.model_dump())


def _to_on_demand(deps: Deps, m: Parked, reason: str, report: CollectReport, token: str | None = None) -> None:
    """The chunk's calls go on demand from here (its answers so far are kept), whether or not a batch job (`token`)
    still holds its records: that job's answers for it are then dropped when it ends."""
    c = m.chunk
    back = deps.claims.return_from_batch(c.job_id, c.chunk_id, c.fence, token, stats=AttemptStats(),
                                         on_demand=reason)
    if back is None:
        return
    deps.queues.send_analysis([analysis_message(deps, m.job, back, "batch")])
    deps.jobs.record_event(c.job_id, "batch.on_demand", chunk_id=c.chunk_id, chunk_index=c.chunk_index,
                           reason=reason, records=c.batch_records)
    report.on_demand.append(f"{c.job_id}/{c.chunk_id}")


# ------------------------------------------------------------------------------ status
def batches_of(deps: Deps, chunks: Sequence[ChunkRecord], expected_s: float) -> list[BatchStatus]:
    """The batch jobs holding a job's parked chunks (and its records still waiting for the minimum), for `review
    status`, the API and the page: Bedrock's job ARN and status, the records, when it is expected to end."""
    tokens: dict[str, int] = {}
    waiting = 0
    for c in chunks:
        if c.status is ChunkStatus.AWAITING_BATCH:
            if c.batch_token is None:
                waiting += c.batch_records
            else:
                tokens[c.batch_token] = tokens.get(c.batch_token, 0) + c.batch_records
    out: list[BatchStatus] = []
    for token, mine in sorted(tokens.items()):
        m = read_manifest(deps, token)
        out.append(BatchStatus(batch=token, batch_job_arn=m.job_arn, status=m.status or "packing", records=mine,
                               batch_records=m.records, submitted_at=m.submitted_at,
                               expected_by=m.submitted_at + expected_s if m.submitted_at else None))
    if waiting:
        out.append(BatchStatus(batch=None, batch_job_arn=None, status="waiting_for_records", records=waiting,
                               batch_records=None, submitted_at=None, expected_by=None))
    return out
