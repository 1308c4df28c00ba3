"""The batch lane: a job sent with `inference: batch` has its model calls answered by Bedrock batch inference, at
the batch price, within hours (docs/batch-inference.md).

A batch-mode chunk goes through the same worker, checkpoints, coverage, report and cost accounting as any other;
only its model calls differ. The worker runs its analysts against the answers its batch jobs already returned
(`Answers`: every answer is replayed, never called again); the first request of an analyst that has no answer yet
(`AwaitBatch`) is written, with the other analysts' first missing ones, to S3 (`batch/pending/`), and the chunk is
parked `awaiting_batch`: nobody holds it and no message is in flight. `locate` and `assess` are two rounds (an
analyst's assess request is only known once its locate answer is back; a repair after an invalid answer is a third).

The collector's `collect` (on a schedule) then, over the running batch-mode jobs and the open batch jobs
(`batch/jobs/open/<token>`; docs/batch-inference.md "How it works" says it in full):
1. sends the message of each chunk returned from batch whose message was never recorded as sent (a collector that
   died, or whose send failed, between the chunk's conditional return and its send: `batch_message_due`);
2. follows each open batch job from its manifest (`GetModelInvocationJob`): when it ends with an output, the output is
   streamed once, each answer bucketed to its chunk by the manifest's recordIds, each wanted chunk returned (its
   answers stored, their tokens priced at the batch price in the same conditional write that makes it pending with
   its message due; the message sent, then recorded as sent); answers no chunk takes any more are `batch.unused`
   spend on their jobs and principals. A record that failed or is missing (`batch.record_failed`) is asked again in
   the next round; a batch job that failed (`batch.job_failed`) sends its chunks back with none, one that was
   stopped or expired with the answers of the records it processed before (the others `batch.job_failed`); after
   `batch_max_failures` a chunk goes on demand. A running batch job none of whose chunks still waits for
   it is stopped; a chunk whose job's deadline passed goes on demand.
3. packs the chunks waiting for a batch (none while the model is paused; a chunk whose deadline is nearer than a batch
   can answer goes on demand instead): a manifest written ahead, unsealed, with its open marker; each chunk's token
   set conditionally; the records streamed into the input and the manifest sealed with exactly the chunks tagged and
   their recordIds; then `CreateModelInvocationJob` (idempotent by the token). Only a sealed manifest is submitted or
   finished by a later collect; an unsealed one older than the collector's timeout is abandoned (its chunks untagged,
   packed again). A refusal for good (`batch.refused`) sends the chunks on demand and turns the batch lane off for
   the model; a retryable failure backs off, the deadline checked before each submit.
A job whose batch work was followed without error is touched (tracked, not stalled); one whose batch job cannot be
followed is not, so the stuck-jobs alarm sees it. Batch calls take nothing from the on-demand pacers; the chunk of a
job cancelled meanwhile is settled `cancelled` by the cancel (its batch answers are dropped).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from contract_review.config.profile import Profile
from contract_review.domain import spend_cap
from contract_review.domain.batch import (
    ENDED_EARLY,
    HAS_OUTPUT,
    MISSING,
    BatchJobState,
    BatchJobStatus,
    BatchManifest,
    BatchRecord,
    BatchStatus,
    ManifestChunk,
    ModelBody,
    RecordOutcome,
)
from contract_review.domain.cost import batch_usage, micro_usd, model_cost_usd, model_price
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, ReviewError, classify_batch_submit
from contract_review.domain.keys import (
    BATCH_OPEN_PREFIX,
    batch_answers_key,
    batch_manifest_key,
    batch_open_key,
    batch_pending_key,
)
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    AttemptStats,
    BatchLaneOff,
    ChunkRecord,
    ChunkStatus,
    Inference,
    Job,
    JobState,
    Usage,
)
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


def in_batch_lane(deps: Deps, job: Job, record: ChunkRecord) -> bool:
    """Whether the chunk's model calls go to batch inference (else on demand, replaying any batch answers): not
    while the batch lane is off (a refused batch job turned it off: `lane_off`)."""
    return job.inference is Inference.BATCH and record.batch_on_demand is None and lane_off(deps) is None


def park(deps: Deps, job_id: str, chunk_id: str, fence: int, stats: AttemptStats,
         waiting: Sequence[BatchRecord]) -> ChunkRecord | None:
    """Write the chunk's missing requests where the collector packs them from, then park the chunk (fenced). None:
    the fence moved on (the records written are never read: the key names this fence)."""
    key = batch_pending_key(job_id, chunk_id, fence)
    deps.artifacts.put_text(key, "".join(json.dumps({"recordId": r.record_id, "modelInput": r.model_input},
                                                    separators=(",", ":")) + "\n" for r in waiting),
                            content_type="application/jsonl")
    return deps.claims.await_batch(job_id, chunk_id, fence, stats, key, len(waiting))


# ------------------------------------------------------------------------------ the collector's side
@dataclass
class CollectReport:
    submitted: list[str] = field(default_factory=list)  # batch tokens submitted this collect
    collected: list[str] = field(default_factory=list)  # batch tokens whose job ended and whose chunks went back
    running: int = 0  # batch jobs still running
    on_demand: list[str] = field(default_factory=list)  # chunks ("job/chunk") sent on demand this collect
    waiting_records: int = 0  # records waiting for the minimum after this collect
    refused: list[str] = field(default_factory=list)  # batch tokens whose CreateModelInvocationJob was refused
    retrying: list[str] = field(default_factory=list)  # batch tokens whose submit failed retryably (backing off)
    stopped: list[str] = field(default_factory=list)  # batch jobs stopped: none of their records still wanted
    released: list[str] = field(default_factory=list)  # manifests given up before a submit (chunks packed again)
    resent: int = 0  # returned chunks whose message had not been sent (a collect died or its send failed): sent
    unused_micro_usd: int = 0  # answers of ended batch jobs that no chunk took, recorded on their jobs
    paused: bool = False  # the model is paused (`review quota pause`): nothing was packed or submitted


@dataclass
class Parked:
    job: Job
    chunk: ChunkRecord


def _awaits(chunk: ChunkRecord | None, token: str, fence: int) -> bool:
    return (chunk is not None and chunk.status is ChunkStatus.AWAITING_BATCH and chunk.batch_token == token
            and chunk.fence == fence)


def min_records(deps: Deps) -> int:
    """The minimum records per batch job: the profile's, else the account's (Service Quotas, read once), else
    Bedrock's default."""
    return (deps.settings.profile.batch.batch_min_records or (deps.batch.min_records() if deps.batch else None)
            or DEFAULT_MIN_RECORDS)


def batch_model_id(deps: Deps) -> str:
    """The model rule of the batch lane: a job's batch records go to the stack's batch model (the one every batch job
    is created with: `wiring.build_batch`, the effective model id), whatever model the job was admitted under; the
    lane is judged off for that model, and a batch job's answers are priced with the model its manifest names."""
    return deps.settings.effective_model_id


def lane_off(deps: Deps) -> BatchLaneOff | None:
    """Why the batch lane is off for the stack's batch model (`batch_model_id`), from the runtime control; None: on."""
    control = deps.model_control.get() if deps.model_control is not None else None
    return control.batch_lane_off(batch_model_id(deps)) if control is not None else None


SUBMIT_BACKOFF_S = (60.0, 3600.0)  # a retryable refusal of a submit: tried again after 60 s, doubling up to an hour


class _Collect:
    """One collect: the running batch-mode jobs and their chunks (read once), each job's document read at most once,
    and the jobs whose batch work was followed without error (touched at the end: tracked, not stalled)."""

    def __init__(self, deps: Deps, now: float, report: CollectReport):
        self.deps, self.now, self.report = deps, now, report
        self.p = deps.settings.profile
        self.jobs: dict[str, Job] = {}
        self.chunks: dict[str, list[ChunkRecord]] = {}
        self.tracked: set[str] = set()
        self._texts: dict[str, str] = {}
        control = deps.model_control.get() if deps.model_control is not None else None
        # an operator's pause, or the stack's spend-cap hold of today (domain/spend_cap.py): nothing new is submitted
        self.paused = bool(control is not None and (control.paused or control.spend_held(spend_cap.utc_day(now))))

    def text(self, job: Job) -> str:
        if job.job_id not in self._texts:
            self._texts[job.job_id] = self.deps.artifacts.get_text(job.document_key)
        return self._texts[job.job_id]

    def track(self, members: Iterable[Parked]) -> None:
        self.tracked.update(m.job.job_id for m in members)

    def wanted(self, manifest: BatchManifest) -> list[Parked]:
        """The manifest's chunks still waiting for it: their job running, each awaiting this batch under its fence.
        A member the run's snapshot says is not waiting has its record (and job) read again before anything is
        stopped, dropped or released for it: the snapshot is older than what another collect (or the aggregator)
        wrote since."""
        out = []
        for mc in manifest.chunks:
            job = self.jobs.get(mc.job_id)
            chunk = next((c for c in self.chunks.get(mc.job_id, []) if c.chunk_id == mc.chunk_id), None)
            if job is None or not _awaits(chunk, manifest.token, mc.fence):
                chunk = self.deps.claims.get(mc.job_id, mc.chunk_id)
                if _awaits(chunk, manifest.token, mc.fence) and job is None:
                    job = self.deps.jobs.get(mc.job_id)
                    job = job if job is not None and job.state is JobState.RUNNING else None
            if job is not None and chunk is not None and _awaits(chunk, manifest.token, mc.fence):
                out.append(Parked(job, chunk))
        return out

    def too_late(self, m: Parked) -> bool:
        """Its job's deadline is nearer than a batch job can answer."""
        return m.job.deadline_at is not None and m.job.deadline_at - self.now < self.p.batch.batch_expected_s

    def send(self, back: list[Parked]) -> None:
        """The messages of chunks just made pending (their record says the message is due), one send per job, each
        recorded as sent afterwards: a send that fails or a collect that dies leaves them due, and the next collect
        sends them (`batch_message_due`)."""
        by_job: dict[str, list[Parked]] = {}
        for m in back:
            by_job.setdefault(m.job.job_id, []).append(m)
        for members in by_job.values():
            job = members[0].job
            text = self.text(job)
            self.deps.queues.send_analysis([analysis_message(self.deps, job, m.chunk, "batch", text) for m in members])
            for m in members:
                self.deps.claims.message_sent(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence)


def collect(deps: Deps, now: float, report: CollectReport | None = None,
            isolate: Callable[[str], AbstractContextManager[None]] | None = None) -> CollectReport:
    """One pass of the collector over the running batch-mode jobs and the open batch jobs (module docstring).
    `isolate(item)`: a context manager per item (one bad item is logged and counted, never stops the rest)."""
    report = report or CollectReport()
    c = _Collect(deps, now, report)
    report.paused = c.paused
    for job in deps.jobs.running():  # every running job (one updated while this run lists them too)
        if job.inference is Inference.BATCH:
            c.jobs[job.job_id] = job
            c.chunks[job.job_id] = deps.claims.for_job(job.job_id)
    for job_id, records in c.chunks.items():  # returned chunks whose message a collect never recorded as sent
        due = [Parked(c.jobs[job_id], r) for r in records if r.batch_message_due]
        if due:
            _guarded(isolate, f"{job_id}/resend", functools.partial(_resend, c, due))
    tokens = {key.rsplit("/", 1)[-1] for key in deps.artifacts.list_keys(BATCH_OPEN_PREFIX)}
    tokens |= {r.batch_token for records in c.chunks.values() for r in records
               if r.status is ChunkStatus.AWAITING_BATCH and r.batch_token}  # (manifests from before the marker)
    for token in sorted(tokens):
        _guarded(isolate, f"batch:{token}", functools.partial(_follow, c, token))
    unpacked = [Parked(c.jobs[job_id], r) for job_id, records in c.chunks.items() for r in records
                if r.status is ChunkStatus.AWAITING_BATCH and r.batch_token is None]
    if unpacked:
        _guarded(isolate, "batch:pack", lambda: _pack_or_wait(c, unpacked))
    for job_id in sorted(c.tracked):
        deps.jobs.touch(job_id)  # its batch work was followed: tracked here, not stalled
    return report


def _guarded(isolate: Callable[[str], AbstractContextManager[None]] | None, item: str, fn: Callable[[], None]) -> None:
    if isolate is None:
        fn()
        return
    with isolate(item):
        fn()


def _resend(c: _Collect, due: list[Parked]) -> None:
    c.send(due)
    c.report.resent += len(due)
    for m in due:
        c.deps.jobs.record_event(m.chunk.job_id, "batch.resent", chunk_id=m.chunk.chunk_id,
                                 chunk_index=m.chunk.chunk_index)


# ------------------------------------------------------------------------------ packing
def _pack_or_wait(c: _Collect, waiting: list[Parked]) -> None:
    deps, p = c.deps, c.p
    off = lane_off(deps)
    if deps.batch is None or off is not None:  # nothing would ever answer them: on demand, and said once per job
        _all_on_demand(c, waiting, "unavailable", off)
        return
    if c.paused:  # an operator's spend stop: nothing new is submitted; they wait (tracked)
        c.track(waiting)
        c.report.waiting_records += sum(m.chunk.batch_records for m in waiting)
        return
    late = [m for m in waiting if c.too_late(m)]  # a new batch job could not answer before their deadline
    for m in late:
        _to_on_demand(c, m, "deadline")
    waiting = [m for m in waiting if not c.too_late(m)]
    minimum = min_records(deps)
    if sum(m.chunk.batch_records for m in waiting) >= minimum:
        rest: list[Parked] = []
        for members in _slices(waiting, p.batch.batch_max_records):
            if sum(m.chunk.batch_records for m in members) >= minimum:
                _pack(c, members)
            else:
                rest += members  # the last slice, short of the minimum: waits for more
        waiting = rest
    for m in waiting:
        reason = _overdue(p, m, c.now)
        if reason is not None:
            _to_on_demand(c, m, reason)
        else:
            c.report.waiting_records += m.chunk.batch_records
            c.track([m])


def _all_on_demand(c: _Collect, members: list[Parked], reason: str, off: BatchLaneOff | None,
                   token: str | None = None, error: ErrorEnvelope | None = None) -> None:
    for m in members:
        _to_on_demand(c, m, reason, token, error)
    if off is not None or c.deps.batch is None:
        for job_id in sorted({m.job.job_id for m in members}):
            c.deps.jobs.record_event(job_id, "batch.unavailable",
                                     reason=off.reason if off else "no batch service is configured",
                                     **({"error_code": off.error_code} if off else {}))


def _overdue(p: Profile, m: Parked, now: float) -> str | None:
    """Why a chunk below the minimum stops waiting for others: its wait is over (`batch_max_wait_s`)."""
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


def _records_of(deps: Deps, chunk: ChunkRecord) -> Iterator[BatchRecord]:
    """A parked chunk's requests, from its pending file (one chunk's at a time)."""
    if chunk.batch_pending_key is None:
        return
    for line in deps.artifacts.get_text(chunk.batch_pending_key).splitlines():
        if line.strip():
            d = json.loads(line)
            yield BatchRecord(record_id=d["recordId"], model_input=d["modelInput"])


def _pack(c: _Collect, members: list[Parked]) -> None:
    """Write ahead: the manifest of the chunks meant (unsealed) and its open marker; then each chunk's token
    (conditional: a chunk is in one batch job at most); then the input, streamed from the tagged chunks' pending
    files, and the manifest sealed with exactly those chunks and their recordIds; then the submit."""
    deps = c.deps
    token = "b" + uuid.uuid4().hex[:31]  # one collect's own: another collect never tags a chunk with it
    # its age from now, not from the run's start: a run that spent minutes following batch jobs before packing
    # writes a manifest another collect must not take for abandoned while it is tagged and sealed
    manifest = BatchManifest(token=token, created_at=deps.clock(), chunks=_chunks_of(members),
                             model_id=batch_model_id(deps))
    _write(deps, manifest)
    deps.artifacts.put_text(batch_open_key(token), "")
    won = [m for m in members if deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, token,
                                                          None) is not None]
    if sum(m.chunk.batch_records for m in won) < min_records(deps):  # another collect packed some meanwhile
        _release(c, manifest, won, "Abandoned")
        return
    ids: dict[tuple[str, str], list[str]] = {(m.chunk.job_id, m.chunk.chunk_id): [] for m in won}
    seen: set[str] = set()

    def records() -> Iterator[BatchRecord]:
        for m in won:
            for r in _records_of(deps, m.chunk):
                # a recordId is a digest of its request: one already taken is the same request (written twice)
                if r.record_id not in seen:
                    seen.add(r.record_id)
                    ids[(m.chunk.job_id, m.chunk.chunk_id)].append(r.record_id)
                    yield r
    assert deps.batch is not None
    n = deps.batch.put_input(token, records())
    sealed = manifest.model_copy(update={
        "sealed": True, "sealed_at": deps.clock(), "records": n,
        "chunks": [mc.model_copy(update={"record_ids": ids[(mc.job_id, mc.chunk_id)]}) for mc in _chunks_of(won)]})
    _write(deps, sealed)
    _submit(c, sealed, won)


def _chunks_of(members: Iterable[Parked]) -> list[ManifestChunk]:
    return [ManifestChunk(job_id=m.chunk.job_id, chunk_id=m.chunk.chunk_id, fence=m.chunk.fence,
                          records=m.chunk.batch_records) for m in members]


def _write(deps: Deps, manifest: BatchManifest) -> None:
    deps.artifacts.put_text(batch_manifest_key(manifest.token), manifest.model_dump_json())


def _end(c: _Collect, manifest: BatchManifest, **update: object) -> None:
    """The manifest ended (kept, for `review status`), and no longer followed."""
    _write(c.deps, manifest.model_copy(update={"ended_at": c.now, **update}))
    c.deps.artifacts.delete(batch_open_key(manifest.token))


def _release(c: _Collect, manifest: BatchManifest, members: list[Parked], status: str) -> None:
    """Give the manifest up before any submit: its chunks untagged, to be packed again (or sent on demand)."""
    for m in members:
        c.deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, None, manifest.token)
    _end(c, manifest, status=status)
    c.report.released.append(manifest.token)


def _submit(c: _Collect, manifest: BatchManifest, wanted: list[Parked]) -> None:
    """Submit a sealed manifest: not while paused nor before its backoff; given up (its chunks packed again) when a
    member is no longer wanted, its job's deadline came nearer than a batch can answer, or the lane went off; a
    refusal is an outcome (`_refused`), a retryable failure backs off."""
    deps = c.deps
    assert deps.batch is not None and manifest.is_sealed
    if len(wanted) < len(manifest.chunks) or any(c.too_late(m) for m in wanted) or lane_off(deps) is not None:
        _release(c, manifest, wanted, "Released")
        return
    if c.paused or (manifest.retry_at is not None and c.now < manifest.retry_at):
        c.track(wanted)
        return
    try:
        arn = deps.batch.submit(manifest.token)  # the same token again returns the same job
    except Exception as exc:  # classified from its structured fields: a refusal, or a failure to try again
        env = classify_batch_submit(exc)
        if env.error_code == "batch.refused":
            _refused(c, manifest, wanted, env)
            return
        if not env.retryable:  # not Bedrock's answer (a defect, a denied S3 write): the item fails, loudly
            raise
        log.warning("batch submit failed; backing off", exc_info=True,
                    extra={"batch": manifest.token, "error_code": env.error_code})
        failures = manifest.submit_failures + 1
        base, cap = SUBMIT_BACKOFF_S
        _write(deps, manifest.model_copy(update={"submit_failures": failures, "error_code": env.error_code,
                                                 "reason": env.message[:300],
                                                 "retry_at": c.now + min(cap, base * 2 ** (failures - 1))}))
        c.report.retrying.append(manifest.token)
        c.track(wanted)
        return
    _write(deps, manifest.model_copy(update={"job_arn": arn, "status": "Submitted", "submitted_at": deps.clock(),
                                             "retry_at": None}))
    c.report.submitted.append(manifest.token)
    c.track(wanted)
    for job_id, n in _per_job(wanted).items():
        deps.jobs.record_event(job_id, "batch.submitted", batch=manifest.token, batch_job_arn=arn, records=n,
                               batch_records=manifest.records)


def _refused(c: _Collect, manifest: BatchManifest, wanted: list[Parked], env: ErrorEnvelope) -> None:
    """Bedrock refused the batch job for good: the lane is turned off for the model (the first refusal's reason
    kept), the chunks go on demand with the reason, and the manifest ends `Refused`."""
    deps = c.deps
    model_id = manifest.model_id or batch_model_id(deps)
    reason = env.message
    if deps.model_control is not None:
        off = BatchLaneOff(error_code=env.error_code, reason=reason, at=c.now, by="collector")
        deps.model_control.update(lambda ctl: ctl if ctl.batch_lane_off(model_id) is not None else ctl.model_copy(
            update={"batch_off": {**ctl.batch_off, model_id: off}}))
    for m in wanted:
        _to_on_demand(c, m, "refused", manifest.token, env)
    for job_id, n in _per_job(wanted).items():
        deps.jobs.record_event(job_id, "batch.refused", batch=manifest.token, error_code=env.error_code,
                               provider_code=env.provider_code, reason=reason, records=n, model_id=model_id)
    _end(c, manifest, status="Refused", error_code=env.error_code, reason=reason)
    c.report.refused.append(manifest.token)


def _per_job(members: Iterable[Parked]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in members:
        counts[m.chunk.job_id] = counts.get(m.chunk.job_id, 0) + m.chunk.batch_records
    return counts


def read_manifest(deps: Deps, token: str) -> BatchManifest:
    """A batch job's manifest (written before any chunk names its token, kept after it ends)."""
    return BatchManifest.model_validate_json(deps.artifacts.get_text(batch_manifest_key(token)))


# ------------------------------------------------------------------------------ following a batch job
def _follow(c: _Collect, token: str) -> None:
    deps = c.deps
    manifest = read_manifest(deps, token)
    wanted = c.wanted(manifest)
    if manifest.ended_at is not None:  # a collect that ended it and died before removing its marker
        deps.artifacts.delete(batch_open_key(token))
        return
    if deps.batch is None:  # the service was configured when they were packed, and is not now
        _returned(c, manifest, wanted, ErrorEnvelope.of("batch.job_failed", "no batch service is configured",
                                                        step="batch"))
        _end(c, manifest, status="Failed")
        return
    if not manifest.is_sealed:
        if c.now - manifest.created_at < c.p.functions.collector_timeout_s:
            c.track(wanted)  # another collect is tagging its chunks right now: not ours to touch
            return
        _release(c, manifest, wanted, "Abandoned")  # its collect died before sealing it: packed again
        return
    if manifest.job_arn is None:  # sealed, not submitted: a collect died (or backed off) before the submit
        _submit(c, manifest, wanted)
        return
    state = deps.batch.status(manifest.job_arn)
    if manifest.status != state.status.value:
        manifest = manifest.model_copy(update={"status": state.status.value, "checked_at": c.now})
        _write(deps, manifest)
    if not state.terminal:
        c.report.running += 1
        for m in wanted:  # a job whose deadline passed goes on without it (the batch job holds others' records)
            if m.job.deadline_at is not None and c.now >= m.job.deadline_at:
                _to_on_demand(c, m, "deadline", token)
        still = [m for m in wanted if not (m.job.deadline_at is not None and c.now >= m.job.deadline_at)]
        c.track(still)
        if not still and manifest.stop_requested_at is None and state.status is not BatchJobStatus.STOPPING:
            _stop(c, manifest)
        return
    if state.status in HAS_OUTPUT:
        unused = _returned_with_output(c, manifest, wanted, state)
        _record_unused(c, manifest, unused)
    else:
        env = ErrorEnvelope.of("batch.job_failed", state.message or f"the batch job ended {state.status.value}",
                               provider_code=state.status.value, step="batch")
        _returned(c, manifest, wanted, env, state)
    _end(c, manifest)
    c.report.collected.append(token)


def _stop(c: _Collect, manifest: BatchManifest) -> None:
    """None of its records is still wanted (every chunk cancelled or gone on demand): StopModelInvocationJob. It is
    followed from its manifest until it ends; the answers it still returns are recorded as `batch.unused`."""
    assert c.deps.batch is not None and manifest.job_arn is not None
    c.deps.batch.stop(manifest.job_arn)
    _write(c.deps, manifest.model_copy(update={"stop_requested_at": c.now}))
    c.report.stopped.append(manifest.token)
    for job_id in sorted({mc.job_id for mc in manifest.chunks}):
        c.deps.jobs.record_event(job_id, "batch.stopped", batch=manifest.token, batch_job_arn=manifest.job_arn,
                                 detail="none of its records is still wanted")


def _record_ids(deps: Deps, manifest: BatchManifest, wanted: list[Parked]) -> dict[tuple[str, str], list[str]]:
    """Each member chunk's recordIds, from the manifest (a manifest from before the seal: the wanted chunks' pending
    files)."""
    ids = {(mc.job_id, mc.chunk_id): list(mc.record_ids) for mc in manifest.chunks}
    for m in wanted:
        key = (m.chunk.job_id, m.chunk.chunk_id)
        if not ids.get(key):
            ids[key] = [r.record_id for r in _records_of(deps, m.chunk)]
    return ids


def _returned_with_output(c: _Collect, manifest: BatchManifest, wanted: list[Parked],
                          state: BatchJobState) -> dict[str, Usage]:
    """Stream the output once: each wanted chunk's answers bucketed (as JSON text: the records' inputs are never
    kept), the rest summed as the usage of answers nobody takes, per job. The wanted chunks go back; the usage
    left over is returned."""
    deps = c.deps
    assert deps.batch is not None and manifest.job_arn is not None
    ids = _record_ids(deps, manifest, wanted)
    owners = {rid: key for key, rids in ids.items() for rid in rids}
    buckets: dict[tuple[str, str], _Bucket] = {(m.chunk.job_id, m.chunk.chunk_id): _Bucket() for m in wanted}
    dropped = {(mc.job_id, mc.chunk_id) for mc in manifest.chunks
               if (mc.job_id, mc.chunk_id) not in buckets and not _took(c, mc, manifest.token)}
    unused: dict[str, Usage] = {}
    for outcome in deps.batch.results(manifest.job_arn):
        key = owners.get(outcome.record_id)
        if key is None:
            continue  # not one of ours
        bucket = buckets.get(key)
        if bucket is not None:
            bucket.add(outcome)
        elif key in dropped and outcome.output is not None:  # its chunk cancelled or gone on demand: billed, unused
            unused[key[0]] = Usage.of([unused.get(key[0], Usage()), _tokens(outcome.output)])
    for m in wanted:
        key = (m.chunk.job_id, m.chunk.chunk_id)
        b = buckets[key]
        missed = [rid for rid in ids[key] if rid not in b.answered]
        error = None
        if missed and state.status in ENDED_EARLY:  # stopped or expired before it answered them: the job failed them
            error = ErrorEnvelope.of("batch.job_failed", f"{len(missed)} of {len(ids[key])} records unanswered: the "
                                     f"batch job ended {state.status.value}", provider_code=state.status.value,
                                     step="batch")
        elif missed:
            first = b.errors.get(missed[0], MISSING)
            error = ErrorEnvelope.of("batch.record_failed", f"{len(missed)} of {len(ids[key])} records unanswered",
                                     provider_code=first, step="batch")
        lost = _back(c, manifest, m, b, error, state, len(missed))
        if lost is not None:  # a cancel settled it while it was being returned: billed, unused
            unused[key[0]] = Usage.of([unused.get(key[0], Usage()), lost])
    return unused


def _took(c: _Collect, mc: ManifestChunk, token: str) -> bool:
    """The member chunk took this batch job's answers already (a collect that returned it died before the end, or
    one running beside this one returned it): its record read now, not the run's snapshot."""
    record = c.deps.claims.get(mc.job_id, mc.chunk_id)
    return record is not None and batch_answers_key(mc.job_id, mc.chunk_id, token) in record.batch_answer_keys


@dataclass
class _Bucket:
    """One chunk's answers as they stream: each answer's JSON text, and their tokens."""

    parts: list[str] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    tokens: Usage = field(default_factory=Usage)

    def add(self, outcome: RecordOutcome) -> None:
        if outcome.output is None:
            self.errors[outcome.record_id] = outcome.error_code or "unknown"
            return
        self.answered.add(outcome.record_id)
        self.parts.append(json.dumps(outcome.record_id) + ":" + json.dumps(outcome.output, separators=(",", ":")))
        self.tokens = Usage.of([self.tokens, _tokens(outcome.output)])

    def json(self) -> str:
        return "{" + ",".join(self.parts) + "}"


def _tokens(output: ModelBody) -> Usage:
    usage = output.get("usage", {})
    return Usage(input_tokens=int(usage.get("inputTokens", 0)), output_tokens=int(usage.get("outputTokens", 0)))


def _returned(c: _Collect, manifest: BatchManifest, wanted: list[Parked], job_error: ErrorEnvelope,
              state: BatchJobState | None = None) -> None:
    """Each wanted chunk of a batch job that ended without an output goes back pending, a batch failure."""
    for m in wanted:
        _back(c, manifest, m, _Bucket(), job_error, state, m.chunk.batch_records)


def _back(c: _Collect, manifest: BatchManifest, m: Parked, bucket: _Bucket, error: ErrorEnvelope | None,
          state: BatchJobState | None, unanswered: int) -> Usage | None:
    """A chunk back pending with its answers (none when its batch failed), their tokens at the batch price, a batch
    failure when any of its records went unanswered; its message due, then sent. The answers' tokens when the chunk
    did not take them (a cancel settled it meanwhile): they are `batch.unused`; None when it took them (here, or in
    another collect)."""
    deps, p = c.deps, c.p
    ch, token = m.chunk, manifest.token
    answer_key = None
    if bucket.answered:
        answer_key = batch_answers_key(ch.job_id, ch.chunk_id, token)
        deps.artifacts.put_text(answer_key, bucket.json())
    failed = error is not None
    on_demand = "failures" if failed and ch.batch_failures + 1 >= p.batch.batch_max_failures else None
    back = deps.claims.return_from_batch(ch.job_id, ch.chunk_id, ch.fence, token,
                                         stats=_priced(deps, manifest, bucket.tokens, len(bucket.answered)),
                                         answer_key=answer_key, failed=failed, on_demand=on_demand, error=error)
    if back is None:  # cancelled, or returned by another collect: nothing to send
        now = deps.claims.get(ch.job_id, ch.chunk_id)
        took = answer_key is not None and now is not None and answer_key in now.batch_answer_keys
        return bucket.tokens if bucket.answered and not took else None
    c.send([Parked(m.job, back)])
    deps.jobs.record_event(ch.job_id, "batch.returned", batch=token, chunk_id=ch.chunk_id,
                           chunk_index=ch.chunk_index, answered=len(bucket.answered), unanswered=unanswered,
                           batch_status=state.status.value if state else None,
                           **({"error_code": error.error_code} if error else {}),
                           **({"on_demand": on_demand} if on_demand else {}))
    if on_demand:
        c.report.on_demand.append(f"{ch.job_id}/{ch.chunk_id}")
    return None


def _record_unused(c: _Collect, manifest: BatchManifest, unused: dict[str, Usage]) -> None:
    """Answers nobody took (their chunks cancelled, or gone on demand) were billed all the same: their usage, at the
    batch price, on each member job's cost (`batch.unused`) and its principal's daily spend. Once per (batch job,
    job) on both, whatever fails between here and the manifest's end (the collect is then run again)."""
    for job_id, tokens in sorted(unused.items()):
        _unused(c, manifest, job_id, tokens)


def _unused(c: _Collect, manifest: BatchManifest, job_id: str, tokens: Usage) -> None:
    deps, token = c.deps, manifest.token
    priced = _priced(deps, manifest, tokens, 0).usage()
    if deps.jobs.record_unused(job_id, token, priced, batch=token, input_tokens=priced.input_tokens,
                               output_tokens=priced.output_tokens, model_micro_usd=priced.model_micro_usd):
        c.report.unused_micro_usd += priced.model_micro_usd
    job = c.jobs.get(job_id) or deps.jobs.get(job_id)
    spend_cap.add_spend(deps, job.principal if job else None, priced.model_micro_usd,
                        spend_cap.unused_charge_id(token, job_id))  # (a retry after it was recorded: taken once)
    spend_cap.record_once(deps, priced.model_micro_usd, spend_cap.unused_charge_id(token, job_id))  # the stack's day


def _priced(deps: Deps, manifest: BatchManifest, tokens: Usage, calls: int) -> AttemptStats:
    """Answered records as calls, their tokens at the batch price of the model that answered them (the manifest's;
    the on-demand price if the model has no batch price: never less than what was spent is shown)."""
    prices, model_id = deps.settings.profile.prices, manifest.model_id or batch_model_id(deps)
    priced = batch_usage(prices, model_id, tokens)
    if priced is None:
        priced = tokens.model_copy(update={"model_micro_usd": micro_usd(model_cost_usd(
            model_price(prices, model_id), tokens))})
    return AttemptStats(calls=calls, **priced.model_dump())


def _to_on_demand(c: _Collect, m: Parked, reason: str, token: str | None = None,
                  error: ErrorEnvelope | None = None) -> None:
    """The chunk's calls go on demand from here (its answers so far are kept), whether or not a batch job (`token`)
    still holds its records: that job's answers for it are then dropped (`batch.unused`) when it ends."""
    ch = m.chunk
    back = c.deps.claims.return_from_batch(ch.job_id, ch.chunk_id, ch.fence, token, stats=AttemptStats(),
                                           on_demand=reason, error=error)
    if back is None:
        return
    c.send([Parked(m.job, back)])
    c.deps.jobs.record_event(ch.job_id, "batch.on_demand", chunk_id=ch.chunk_id, chunk_index=ch.chunk_index,
                             reason=reason, records=ch.batch_records)
    c.report.on_demand.append(f"{ch.job_id}/{ch.chunk_id}")


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
