"""The batch lane's packing and submitting, in one collect (pipeline/batch_inference_collect.py; docs/batch-
inference.md "How it works"): the chunks waiting for a batch are packed (none while the model is paused; a chunk
whose deadline is nearer than a batch can answer goes on demand instead): a manifest written ahead, unsealed, with
its open marker; each chunk's token set conditionally; the records streamed into the input and the manifest sealed
with exactly the chunks tagged and their recordIds; then `CreateModelInvocationJob` (idempotent by the token). Only
a sealed manifest is submitted or finished by a later collect; an unsealed one older than the collector's timeout
is abandoned (its chunks untagged, packed again). A refusal for good (`batch.refused`) sends the chunks on demand
and turns the batch lane off for the model; a retryable failure backs off, the deadline checked before each submit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator

from contract_review.config.profile import Profile
from contract_review.domain.batch_inference import BatchManifest, BatchRecord, ManifestChunk
from contract_review.domain.control_records import BatchLaneOff
from contract_review.domain.errors import ErrorEnvelope, classify_batch_submit
from contract_review.domain.keys import batch_open_key
from contract_review.pipeline.batch_inference import batch_model_id, lane_off, min_records, write_manifest
from contract_review.pipeline.batch_inference_run import (
    CollectRun,
    Parked,
    end_manifest,
    records_of,
    release,
    to_on_demand,
)

log = logging.getLogger(__name__)

SUBMIT_BACKOFF_S = (60.0, 3600.0)  # a retryable refusal of a submit: tried again after 60 s, doubling up to an hour


def pack_or_wait(c: CollectRun, waiting: list[Parked]) -> None:
    deps, p = c.deps, c.p
    off = lane_off(deps)
    if deps.batch_inference is None or off is not None:  # nothing would ever answer them: on demand, said once per job
        _all_on_demand(c, waiting, "unavailable", off)
        return
    if c.paused:  # an operator's spend stop: nothing new is submitted; they wait (tracked)
        c.track(waiting)
        c.report.waiting_records += sum(m.chunk.batch_records for m in waiting)
        return
    late = [m for m in waiting if c.too_late(m)]  # a new batch job could not answer before their deadline
    for m in late:
        to_on_demand(c, m, "deadline")
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
            to_on_demand(c, m, reason)
        else:
            c.report.waiting_records += m.chunk.batch_records
            c.track([m])


def _all_on_demand(c: CollectRun, members: list[Parked], reason: str, off: BatchLaneOff | None,
                   token: str | None = None, error: ErrorEnvelope | None = None) -> None:
    for m in members:
        to_on_demand(c, m, reason, token, error)
    if off is not None or c.deps.batch_inference is None:
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


def _pack(c: CollectRun, members: list[Parked]) -> None:
    """Write ahead: the manifest of the chunks meant (unsealed) and its open marker; then each chunk's token
    (conditional: a chunk is in one batch job at most); then the input, streamed from the tagged chunks' pending
    files, and the manifest sealed with exactly those chunks and their recordIds; then the submit."""
    deps = c.deps
    token = "b" + uuid.uuid4().hex[:31]  # one collect's own: another collect never tags a chunk with it
    # its age from now, not from the run's start: a run that spent minutes following batch jobs before packing
    # writes a manifest another collect must not take for abandoned while it is tagged and sealed
    manifest = BatchManifest(token=token, created_at=deps.clock(), chunks=_chunks_of(members),
                             model_id=batch_model_id(deps))
    write_manifest(deps, manifest)
    deps.artifacts.put_text(batch_open_key(token), "")
    won = [m for m in members if deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, token,
                                                          None) is not None]
    if sum(m.chunk.batch_records for m in won) < min_records(deps):  # another collect packed some meanwhile
        release(c, manifest, won, "Abandoned")
        return
    ids: dict[tuple[str, str], list[str]] = {(m.chunk.job_id, m.chunk.chunk_id): [] for m in won}
    seen: set[str] = set()

    def records() -> Iterator[BatchRecord]:
        for m in won:
            for r in records_of(deps, m.chunk):
                # a recordId is a digest of its request: one already taken is the same request (written twice)
                if r.record_id not in seen:
                    seen.add(r.record_id)
                    ids[(m.chunk.job_id, m.chunk.chunk_id)].append(r.record_id)
                    yield r
    assert deps.batch_inference is not None
    n = deps.batch_inference.put_input(token, records())
    sealed = manifest.model_copy(update={
        "sealed": True, "sealed_at": deps.clock(), "records": n,
        "chunks": [mc.model_copy(update={"record_ids": ids[(mc.job_id, mc.chunk_id)]}) for mc in _chunks_of(won)]})
    write_manifest(deps, sealed)
    submit(c, sealed, won)


def _chunks_of(members: Iterable[Parked]) -> list[ManifestChunk]:
    return [ManifestChunk(job_id=m.chunk.job_id, chunk_id=m.chunk.chunk_id, fence=m.chunk.fence,
                          records=m.chunk.batch_records) for m in members]


def submit(c: CollectRun, manifest: BatchManifest, wanted: list[Parked]) -> None:
    """Submit a sealed manifest: not while paused nor before its backoff; given up (its chunks packed again) when a
    member is no longer wanted, its job's deadline came nearer than a batch can answer, or the lane went off; a
    refusal is an outcome (`_refused`), a retryable failure backs off."""
    deps = c.deps
    assert deps.batch_inference is not None and manifest.is_sealed
    if len(wanted) < len(manifest.chunks) or any(c.too_late(m) for m in wanted) or lane_off(deps) is not None:
        release(c, manifest, wanted, "Released")
        return
    if c.paused or (manifest.retry_at is not None and c.now < manifest.retry_at):
        c.track(wanted)
        return
    try:
        arn = deps.batch_inference.submit(manifest.token)  # the same token again returns the same job
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
        write_manifest(deps, manifest.model_copy(update={
            "submit_failures": failures, "error_code": env.error_code, "reason": env.message[:300],
            "retry_at": c.now + min(cap, base * 2 ** (failures - 1))}))
        c.report.retrying.append(manifest.token)
        c.track(wanted)
        return
    write_manifest(deps, manifest.model_copy(update={"job_arn": arn, "status": "Submitted",
                                                     "submitted_at": deps.clock(), "retry_at": None}))
    c.report.submitted.append(manifest.token)
    c.track(wanted)
    for job_id, n in _per_job(wanted).items():
        deps.jobs.record_event(job_id, "batch.submitted", batch=manifest.token, batch_job_arn=arn, records=n,
                               batch_records=manifest.records)


def _refused(c: CollectRun, manifest: BatchManifest, wanted: list[Parked], env: ErrorEnvelope) -> None:
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
        to_on_demand(c, m, "refused", manifest.token, env)
    for job_id, n in _per_job(wanted).items():
        deps.jobs.record_event(job_id, "batch.refused", batch=manifest.token, error_code=env.error_code,
                               provider_code=env.provider_code, reason=reason, records=n, model_id=model_id)
    end_manifest(c, manifest, status="Refused", error_code=env.error_code, reason=reason)
    c.report.refused.append(manifest.token)


def _per_job(members: Iterable[Parked]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in members:
        counts[m.chunk.job_id] = counts.get(m.chunk.job_id, 0) + m.chunk.batch_records
    return counts
