
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from contract_review.domain import spend_cap
from contract_review.domain.batch_inference import (
    ENDED_EARLY,
    HAS_OUTPUT,
    MISSING,
    BatchJobState,
    BatchJobStatus,
    BatchManifest,
    ManifestChunk,
    ModelBody,
    RecordOutcome,
)
from contract_review.domain.cost import batch_usage, micro_usd, model_cost_usd, model_price
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import BATCH_OPEN_PREFIX, batch_answers_key, batch_open_key
from contract_review.domain.ports import Deps
from contract_review.domain.records import AttemptStats, ChunkStatus, Inference, Usage
from contract_review.pipeline.batch_inference import batch_model_id, read_manifest, write_manifest
from contract_review.pipeline.batch_inference_run import (
    CollectReport,
    CollectRun,
    Parked,
    end_manifest,
    records_of,
    release,
    to_on_demand,
)
from contract_review.pipeline.batch_inference_submit import pack_or_wait, submit


def collect(deps: Deps, now: float, report: CollectReport | None = None,
            isolate: Callable[[str], AbstractContextManager[None]] | None = None) -> CollectReport:
    """One pass of the collector over the running batch-mode jobs and the open batch jobs (module docstring).
    `isolate(item)`: a context manager per item (one bad item is logged and counted, never stops the rest)."""
    report = report or CollectReport()
    c = CollectRun(deps, now, report)
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
        _guarded(isolate, "batch:pack", lambda: pack_or_wait(c, unpacked))
    for job_id in sorted(c.tracked):
        deps.jobs.touch(job_id)  # its batch work was followed: tracked here, not stalled
    return report


def _guarded(isolate: Callable[[str], AbstractContextManager[None]] | None, item: str, fn: Callable[[], None]) -> None:
    if isolate is None:
        fn()
        return
    with isolate(item):
        fn()


def _resend(c: CollectRun, due: list[Parked]) -> None:
    c.send(due)
    c.report.resent += len(due)
    for m in due:
        c.deps.jobs.record_event(m.chunk.job_id, "batch.resent", chunk_id=m.chunk.chunk_id,
                                 chunk_index=m.chunk.chunk_index)


# ------------------------------------------------------------------------------ following a batch job
def _follow(c: CollectRun, token: str) -> None:
    deps = c.deps
    manifest = read_manifest(deps, token)
    wanted = c.wanted(manifest)
    if manifest.ended_at is not None:  # a collect that ended it and died before removing its marker
        deps.artifacts.delete(batch_open_key(token))
        return
    if deps.batch_inference is None:  # the service was configured when they were packed, and is not now
        _returned(c, manifest, wanted, ErrorEnvelope.of("batch.job_failed", "no batch service is configured",
                                                        step="batch"))
        end_manifest(c, manifest, status="Failed")
        return
    if not manifest.is_sealed:
        if c.now - manifest.created_at < c.p.functions.collector_timeout_s:
            c.track(wanted)  # another collect is tagging its chunks right now: not ours to touch
            return
        release(c, manifest, wanted, "Abandoned")  # its collect died before sealing it: packed again
        return
    if manifest.job_arn is None:  # sealed, not submitted: a collect died (or backed off) before the submit
        submit(c, manifest, wanted)
        return
    state = deps.batch_inference.status(manifest.job_arn)
    if manifest.status != state.status.value:
        manifest = manifest.model_copy(update={"status": state.status.value, "checked_at": c.now})
        write_manifest(deps, manifest)
    if not state.terminal:
        c.report.running += 1
        for m in wanted:  # a job whose deadline passed goes on without it (the batch job holds others' records)
            if m.job.deadline_at is not None and c.now >= m.job.deadline_at:
                to_on_demand(c, m, "deadline", token)
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
    end_manifest(c, manifest)
    c.report.collected.append(token)


def _stop(c: CollectRun, manifest: BatchManifest) -> None:
    """None of its records is still wanted (every chunk cancelled or gone on demand): StopModelInvocationJob. It is
    followed from its manifest until it ends; the answers it still returns are recorded as `batch.unused`."""
    assert c.deps.batch_inference is not None and manifest.job_arn is not None
    c.deps.batch_inference.stop(manifest.job_arn)
    write_manifest(c.deps, manifest.model_copy(update={"stop_requested_at": c.now}))
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
            ids[key] = [r.record_id for r in records_of(deps, m.chunk)]
    return ids


def _returned_with_output(c: CollectRun, manifest: BatchManifest, wanted: list[Parked],
                          state: BatchJobState) -> dict[str, Usage]:
    """Stream the output once: each wanted chunk's answers bucketed (as JSON text: the records' inputs are never
    kept), the rest summed as the usage of answers nobody takes, per job. The wanted chunks go back; the usage
    left over is returned."""
    deps = c.deps
    assert deps.batch_inference is not None and manifest.job_arn is not None
    ids = _record_ids(deps, manifest, wanted)
    owners = {rid: key for key, rids in ids.items() for rid in rids}
    buckets: dict[tuple[str, str], _Bucket] = {(m.chunk.job_id, m.chunk.chunk_id): _Bucket() for m in wanted}
    dropped = {(mc.job_id, mc.chunk_id) for mc in manifest.chunks
               if (mc.job_id, mc.chunk_id) not in buckets and not _took(c, mc, manifest.token)}
    unused: dict[str, Usage] = {}
    for outcome in deps.batch_inference.results(manifest.job_arn):
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


def _took(c: CollectRun, mc: ManifestChunk, token: str) -> bool:
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


def _returned(c: CollectRun, manifest: BatchManifest, wanted: list[Parked], job_error: ErrorEnvelope,
              state: BatchJobState | None = None) -> None:
    """Each wanted chunk of a batch job that ended without an output goes back pending, a batch failure."""
    for m in wanted:
        _back(c, manifest, m, _Bucket(), job_error, state, m.chunk.batch_records)


def _back(c: CollectRun, manifest: BatchManifest, m: Parked, bucket: _Bucket, error: ErrorEnvelope | None,
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


def _record_unused(c: CollectRun, manifest: BatchManifest, unused: dict[str, Usage]) -> None:
    """Answers nobody took (their chunks cancelled, or gone on demand) were billed all the same: their usage, at the
    batch price, on each member job's cost (`batch.unused`) and its principal's daily spend. Once per (batch job,
    job) on both, whatever fails between here and the manifest's end (the collect is then run again)."""
    for job_id, tokens in sorted(unused.items()):
        _unused(c, manifest, job_id, tokens)


def _unused(c: CollectRun, manifest: BatchManifest, job_id: str, tokens: Usage) -> None:
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
