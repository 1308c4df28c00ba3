"""Operator views and actions shared by the CLI (and, later, the Job API).

- `job_view`: the job record answering the six questions (DESIGN rule 7).
- `dlq_list` / `dlq_show`: DLQ messages joined with their job and chunk records.
- `submit`: send a document to the intake queue (admission's message: inline, or claim check through S3).
Redrive and reopening ended jobs are in `redrive.py`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from contract_review.domain import spend_cap
from contract_review.domain.batch_inference import BatchStatus
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.control_records import BatchLaneOff, ModelControl
from contract_review.domain.errors import REGISTRY, ErrorEnvelope
from contract_review.domain.keys import BATCHES_PREFIX
from contract_review.domain.messages import AnalysisMessage, InlineDocument, ResultMessage
from contract_review.domain.model import quota_tokens
from contract_review.domain.ports import DLQS, Deps, ModelControls, Queue, QueueMessage
from contract_review.domain.records import (
    Approval,
    ChunkStatus,
    CoverageGap,
    Inference,
    Job,
    JobEvent,
    JobState,
    Priority,
    Reliability,
    SideEffectDone,
    Usage,
    Waiting,
    job_id_for,
)
from contract_review.pipeline import admission, batch_inference
from contract_review.pipeline.intake import failure_key
from contract_review.review.analysts import ANALYSTS, analysts_for
from contract_review.review.chunking import document_hash
from contract_review.review.report import cost_line, coverage_of

RECENT_EVENTS = 10
_QUEUE_OF_DLQ = {dlq: queue for queue, dlq in DLQS.items()}


class MissingChunkView(BaseModel):
    chunk_id: str
    chunk_index: int
    status: ChunkStatus
    error_code: str | None


class EventLine(BaseModel):
    """An event as `review status` shows it: time, type, and its details flattened."""

    model_config = ConfigDict(extra="allow")
    at: str
    type: str


class Answers(BaseModel):
    """The six questions every job record answers."""

    state: JobState
    last_durable_checkpoint: str
    side_effects_done: list[str]
    retry_would: str
    if_cancelled_now: str
    if_it_fails_again: str


class JobView(BaseModel):
    job_id: str
    state: JobState
    document_id: str
    chunks: dict[str, int]  # total, settled, and a count per chunk status
    progress: float
    error_code: str | None
    error: ErrorEnvelope | None
    missing_chunks: list[MissingChunkView]
    mandatory_gaps: list[CoverageGap]
    reliability: Reliability
    report: dict[str, str | None]
    created_at: float
    ended_at: float | None
    model_id: str
    prompt_version: str
    recent_events: list[EventLine]
    answers: Answers
    # the model's circuit breaker as this job met it (breaker.py): "closed" or how its chunks waited for it
    model_circuit: str = "closed"
    # what the job has cost so far (cost.py; docs/cost.md), its budget, and the same as numbers
    cost: str = ""
    usage: Usage = Field(default_factory=Usage)
    budget_micro_usd: int | None = None
    approval: Approval | None = None  # what a person decides on while the job waits (waiting_approval)
    # a named condition its chunks are held for (the daily token quota: model/daily_quota.py), while it runs
    waiting: Waiting | None = None
    last_checkpoint_at: float | None = None  # when its last chunk settled done (epoch s)
    mandatory_analysts: list[str] = Field(default_factory=list)  # the analysts whose gap fails the job
    side_effects: list[SideEffectDone] = Field(default_factory=list)  # each step the saga recorded, in full
    progress_label: str = ""  # the latest event in words, as `review watch` and GET /jobs/{id} show it
    # batch inference (pipeline/batch_inference.py): the job's mode, its deadline, the batch jobs holding its calls now
    inference: Inference = Inference.ON_DEMAND
    deadline_at: float | None = None
    batches: list[BatchStatus] = Field(default_factory=list)
    batch_off: BatchLaneOff | None = None  # the batch lane is off for its model: its calls go on demand
    # why some of a batch-mode job's calls went on demand, from its own events (kept after it ended: `batch_note`)
    batch_note: str | None = None
    model_paused: bool = False  # the runtime control's pause, as this view read it (nothing is packed meanwhile)
    # what holds every model call of the stack now, in words (an operator's pause, the daily spend cap's hold), while
    # the job is open: its chunks wait as backpressure until it is lifted
    model_hold: str | None = None


def batch_off_line(off: BatchLaneOff) -> str:
    """Why a batch-mode job's calls go on demand (`review status`): the batch lane is off for its model."""
    return (f"the batch lane is off for this model since {iso(off.at)} ({off.error_code}, by {off.by or 'an operator'}: "
            f"{off.reason}): its calls go on demand until `review quota batch --on`")


ON_DEMAND_WHY = {  # `batch.on_demand` reasons (pipeline/batch_inference_*.py), in words
    "refused": "Bedrock refused its batch job",
    "unavailable": "the batch lane was off for the model",
    "deadline": "its deadline was nearer than a batch job takes",
    "min_records": "too few requests to fill a batch job before its wait ended",
    "failures": "its batch jobs failed too often",
}


def batch_note(events: Sequence[JobEvent]) -> str | None:
    """Why a batch-mode job's calls went (partly) on demand, in one line, from the job's own events, so it is still
    said after the job ended and whatever the lane's state is now. None: every call stayed in the batch lane."""
    refused = next((e for e in events if e.type == "batch.refused"), None)
    off = next((e for e in events if e.type == "batch.unavailable"), None)
    declined = next((e for e in events if e.type == "job.batch_declined"), None)
    reasons = Counter(str(e.detail.get("reason")) for e in events if e.type == "batch.on_demand")
    if refused is not None:
        head = (f"Bedrock refused its batch job ({refused.detail.get('provider_code') or refused.detail.get('error_code')})"
                ": the batch lane is off for the model")
    elif off is not None:
        head = f"the batch lane was off for the model ({off.detail.get('error_code') or off.detail.get('reason')})"
    elif declined is not None:
        head = "batch declined: its deadline was nearer than a batch job takes"
    elif reasons:
        head = "some chunks left the batch lane"
    else:
        return None
    counts = ", ".join(f"{n} {ON_DEMAND_WHY.get(r, r)}" for r, n in sorted(reasons.items()))
    return f"on demand: {head}" + (f"; chunks sent on demand: {counts}" if counts else "")


def batch_line(b: BatchStatus, paused: bool = False) -> str:
    """One batch job holding some of a job's calls, in words (`review status`, the page). `paused`: the model is
    paused (the runtime control), so the collector packs nothing."""
    if b.batch is None:
        if paused:
            return f"{b.records} request(s) held: the model is paused, nothing is packed until `review quota resume`"
        return f"{b.records} request(s) waiting to be packed into a batch job (with other jobs' requests)"
    when = (f", submitted {iso(b.submitted_at)}, expected by {iso(b.expected_by)}"
            if b.submitted_at and b.expected_by else "")
    of = f" of {b.batch_records}" if b.batch_records else ""
    return f"batch job {b.batch_job_arn or b.batch} {b.status}: {b.records}{of} request(s){when}"


def waiting_line(waiting: Waiting) -> str:
    """`review status` and GET /jobs/{id}: what the job waits for, and since when."""
    return f"{waiting.detail} (since {iso(waiting.since)})"


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds")


CANCEL_NOW = ("`review cancel JOB` (or POST /jobs/{id}/cancel): no new model call starts; chunks in flight stop "
              "within one model call and settle `cancelled`; side effects already done are compensated; the job "
              "ends `cancelled`")
STILL_RUNNING_FAILS = ("chunk messages go to the analysis DLQ with their error envelope; the job ends "
                       "`dead_lettered` listing them")


def _input_failure(code: str | None) -> bool:
    return (code or "").startswith("input.")


def _retry_would(state: JobState, error_code: str | None, dead_lettered: int, failed: int) -> str:
    """What `review dlq redrive`, `review retry` or a resubmission would do now."""
    if state is JobState.COMPLETED:
        return "nothing: the job is complete"
    if _input_failure(error_code):
        return (f"nothing by itself: {error_code} is permanent and nothing was analysed. Fix the input and send it "
                "again: a corrected message with the same idempotency key (the same job id) replaces this failed "
                "job; a changed text without a key gets a new job id")
    if state is JobState.COMPENSATING:
        return (f"nothing yet: the job is failing ({error_code}) and its side effects are being undone; once it is "
                "`failed`, `review retry JOB` runs the side effects again")
    if state is JobState.WAITING_APPROVAL:
        return ("nothing by itself: the job waits for a person's decision on a side effect whose outcome is unknown; "
                "`review approve JOB` retries that step with the same key (the external system dedups it)")
    if not state.terminal:
        return "resume unsettled chunks from their checkpoints"
    if dead_lettered:
        also = f" and reset its {failed} failed chunk(s)" if failed else ""
        return (f"`review dlq redrive` re-sends the {dead_lettered} dead-lettered chunk(s){also} with a fresh "
                "attempt budget; finished chunks and analysts are reused (`review retry JOB` does the same from the "
                "job's records, with or without a DLQ message)")
    if error_code == "runtime.intake_exhausted":
        return "`review retry JOB` puts it back to `queued` and sends its intake message again from the intake DLQ"
    if error_code == "job.budget_exceeded":
        return ("`review retry JOB --budget-usd N`, N above what it has cost, continues it from its checkpoints (its "
                "cancelled chunks run again, its done ones are kept)")
    if state is JobState.CANCELLED:
        return ("`review retry JOB` (or the same document again) resumes it from its checkpoints: its cancelled "
                "chunks run again, its done ones are kept")
    return (f"nothing by itself: the job ended with {error_code or state.value} and none of its chunks is in a DLQ. "
            "Fix the cause (docs/error-codes.md), then `review retry JOB` (or submit the same document again): "
            "its failed chunks run again, so do the analysts with a mandatory gap, the chunks never started are "
            "sent, and the chunks already done are kept")


def _if_it_fails_again(state: JobState, error_code: str | None, dead_lettered: int) -> str:
    """Where the job goes if the next attempt (a redrive, or a corrected resubmission) fails too."""
    if state is JobState.COMPLETED:
        return "nothing can fail any more: the job has completed (the same document again returns this job)"
    if state is JobState.WAITING_APPROVAL:
        return ("once approved, a step whose outcome is unknown again makes the job wait for a decision again; a step "
                "that certainly fails on every attempt fails the job (sideeffect.failed) and undoes its side effects "
                "(`compensating`, then `failed`)")
    if state is JobState.COMPENSATING:
        return ("an undo that fails on every attempt goes to the compensation DLQ (sideeffect.compensation_failed, its "
                "alarm fires; `review compensations --redrive` once fixed) and the job still ends `failed`")
    if _input_failure(error_code):
        return ("a resubmission that is still invalid fails again in one attempt with an `input.*` code on this "
                "job record; nothing is retried and nothing reaches a DLQ")
    if state.terminal and error_code in REGISTRY and REGISTRY[error_code].job_fatal:
        return f"it fails again at once with {error_code} (job-fatal): fix the cause first"
    if state.terminal and error_code == "runtime.intake_exhausted":
        return ("if intake again never finishes its message, the queue moves it to the intake DLQ and the sweeper "
                "fails the job again with runtime.intake_exhausted")
    if state.terminal and not dead_lettered:
        return (f"it ends `{state.value}` again with {error_code}, naming each missing chunk or analyst"
                if error_code else f"it ends `{state.value}` again")
    return STILL_RUNNING_FAILS


def _if_cancelled_now(state: JobState) -> str:
    if state is JobState.CANCELLING:
        return "it is being cancelled: it ends `cancelled` once its chunks in flight have stopped"
    if state is JobState.COMPENSATING:
        return "nothing: it is failing, and ends `failed` once its side effects are undone"
    return "nothing: it has ended" if state.terminal else CANCEL_NOW


# ------------------------------------------------------------------------------ progress
class ProgressView(BaseModel):
    """Where a job stands, from durable state only: chunks settled of all, and the latest event in words."""

    current_step: int
    total_steps: int
    label: str


def analysts_done(detail: Mapping[str, object]) -> str:
    """The analysts of an `analyst.done` event (those committed together): "indemnification, liability done"
    ("term failed" for one that did not end ok)."""
    analysts = detail.get("analysts")
    entries = [a for a in analysts if isinstance(a, dict)] if isinstance(analysts, list) else []
    ok = [str(a.get("analyst")) for a in entries if a.get("status") == "ok"]
    other = [f"{a.get('analyst')} {a.get('status')}" for a in entries if a.get("status") != "ok"]
    return ", ".join(([", ".join(ok) + " done"] if ok else []) + other)


_LABELLED = {"analyst.done", "model.retry", "chunk.retry", "chunk.settled", "chunk.requeued", "chunk.cancelled",
             "chunk.deferred", "job.fanned_out", "job.waiting_quota", "job.waiting_ended", "job.cancelled",
             "chunk.awaiting_batch", "batch.submitted", "batch.returned", "batch.on_demand", "job.batch_declined",
             "batch.resent", "batch.refused", "batch.unavailable", "batch.stopped", "batch.unused"}


def event_label(e: JobEvent) -> str:
    """One event as a line of progress ("chunk 7 of 22: indemnification done"; "3/22 chunks settled (chunk 7
    done)": the one count progress has is chunks settled)."""
    d = e.detail
    chunk = f"chunk {int(str(d.get('chunk_index', 0))) + 1}" if "chunk_index" in d else "chunk"
    of = f" of {d['chunk_count']}" if "chunk_count" in d else ""  # which chunk, never a count: progress is settled
    labels = {
        "analyst.done": lambda: f"{chunk}{of}: {analysts_done(d)}",
        "model.retry": lambda: f"{chunk}: {d.get('error_code')}, attempt {d.get('attempt')}, waiting {d.get('delay_s')} s",
        "chunk.retry": lambda: f"{chunk}: {d.get('error_code')}, attempt {d.get('failures')} failed, "
                               f"back in {d.get('backoff_s')} s",
        "chunk.settled": lambda: f"{d.get('settled')}/{d.get('total')} chunks settled ({chunk} {d.get('status')})",
        "chunk.requeued": lambda: f"chunk requeued: {d.get('reason')}",
        "chunk.deferred": lambda: f"bulk chunk gave way to interactive work {d.get('deferrals')} times, the most "
                                  f"it may (the last for {d.get('delay_s')} s): it runs when it comes back",
        "chunk.cancelled": lambda: f"chunk stopped at {d.get('cancelled_at_stage')}: cancelled",
        "job.fanned_out": lambda: f"chunks {d.get('fanned_out')}/{d.get('total')} sent",
        "job.waiting_quota": lambda: str(d.get("detail") or "waiting for the model's daily token quota"),
        "job.waiting_ended": lambda: "no longer waiting for the model's daily token quota",
        "job.cancelled": lambda: _cancelled_label(d),
        "chunk.awaiting_batch": lambda: f"{chunk}: {d.get('records')} request(s) wait for a batch job",
        "batch.submitted": lambda: f"batch job submitted: {d.get('records')} of its {d.get('batch_records')} "
                                   f"requests are this job's",
        "batch.returned": lambda: f"{chunk}: back from its batch job ({d.get('batch_status')}): "
                                  f"{d.get('answered')} answered" + (f", {d.get('unanswered')} asked again "
                                                                    f"({d.get('error_code')})" if d.get('unanswered')
                                                                    or d.get('error_code') else "")
                                  + (", its calls go on demand" if d.get("on_demand") else ""),
        "batch.on_demand": lambda: f"{chunk}: its calls go on demand ({d.get('reason')})",
        "job.batch_declined": lambda: "batch declined: its deadline is nearer than a batch job takes; on demand",
        "batch.resent": lambda: f"{chunk}: back from its batch job, its message sent again (the first was lost)",
        "batch.refused": lambda: f"Bedrock refused the batch job ({d.get('provider_code')}): {d.get('records')} "
                                 f"request(s) go on demand; the batch lane is off for the model",
        "batch.unavailable": lambda: f"the batch lane is off for the model ({d.get('reason')}): its calls go on demand",
        "batch.stopped": lambda: "batch job stopped: none of its requests is still wanted",
        "batch.unused": lambda: f"batch answers nobody took were billed: {d.get('input_tokens')} input and "
                                f"{d.get('output_tokens')} output tokens added to its cost",
    }
    make = labels.get(e.type)
    return make() if make else e.type.replace("job.", "job ").replace("_", " ")


def _cancelled_label(d: Mapping[str, object]) -> str:
    """`job.cancelled` in the one progress number (chunks settled of all), then what its chunks came to."""
    parts = [f"{d.get(k)} {words}" for k, words in (("chunks_done", "done"), ("chunks_cancelled", "cancelled"),
                                                     ("chunks_never_sent", "never sent")) if d.get(k)]
    settled = f"{d['settled']}/{d['total']} chunks settled" if "settled" in d and "total" in d else "chunks"
    return f"job cancelled: {settled}" + (f" ({', '.join(parts)})" if parts else "") + (
        f", {d.get('error_code')}" if d.get("error_code") not in (None, "job.cancelled") else "")


def progress_of(job: Job, last: JobEvent | None) -> ProgressView:
    total = max(job.chunk_count, 1)
    done = total if job.state is JobState.COMPLETED else min(job.n_settled, total)
    return ProgressView(current_step=done, total_steps=total, label=event_label(last) if last else job.state.value)


def job_progress(deps: Deps, job: Job) -> ProgressView:
    return progress_of(job, deps.jobs.last_event(job.job_id))


def _event_line(e: JobEvent) -> EventLine:
    return EventLine.model_validate({**e.detail, "at": iso(e.at), "type": e.type})


def job_view(deps: Deps, job_id: str) -> JobView | None:
    job = deps.jobs.get(job_id)
    if job is None:
        return None
    chunks = deps.claims.for_job(job_id) if job.chunk_count else []
    events = deps.jobs.events(job_id)
    by_status = Counter(c.status.value for c in chunks)
    state = job.state
    last_cp = max((c.settled_at or 0.0 for c in chunks if c.status is ChunkStatus.DONE), default=None)
    dead = [c for c in chunks if c.status in (ChunkStatus.DEAD_LETTERED, ChunkStatus.FAILED)]
    n_dlq = sum(c.status is ChunkStatus.DEAD_LETTERED for c in dead)
    # mandatory gaps from the chunk records: the job item holds only a bounded sample
    gaps = coverage_of(job.analyst_count, [c for c in chunks if c.settled]).mandatory_gaps if chunks else []
    answers = Answers(
        state=state,
        last_durable_checkpoint=(f"{by_status.get('done', 0)} of {job.chunk_count} chunks settled done"
                                 + (f", last at {iso(last_cp)}" if last_cp else "")),
        side_effects_done=[k for k in ("report_json_key", "report_md_key") if getattr(job, k)]
        + [f"{e.step} {e.status.value} ({e.key[:12]})" for e in job.side_effects],
        retry_would=_retry_would(job.state, job.error_code, n_dlq, len(dead) - n_dlq),
        if_cancelled_now=_if_cancelled_now(job.state),
        if_it_fails_again=_if_it_fails_again(job.state, job.error_code, n_dlq))
    return JobView(
        job_id=job_id, state=state, document_id=job.document_id,
        chunks={"total": job.chunk_count, "settled": job.n_settled, **by_status}, progress=job.progress,
        error_code=job.error_code, error=job.error,
        missing_chunks=[MissingChunkView(chunk_id=c.chunk_id, chunk_index=c.chunk_index, status=c.status,
                                         error_code=c.last_error.error_code if c.last_error else None) for c in dead],
        mandatory_gaps=gaps, reliability=job.reliability or Reliability.of(chunks),
        report={"json": job.report_json_key, "markdown": job.report_md_key},
        created_at=job.created_at, ended_at=job.ended_at, model_id=job.model_id, prompt_version=job.prompt_version,
        recent_events=[_event_line(e) for e in events[-RECENT_EVENTS:]], answers=answers,
        model_circuit=model_circuit(events, deps.clock(), deps.settings.profile.quota.breaker_open_s),
        cost=cost_line(job), usage=job.usage(), budget_micro_usd=job.budget_micro_usd,
        approval=job.approval if job.state is JobState.WAITING_APPROVAL else None,
        waiting=job.waiting if not job.terminal else None, last_checkpoint_at=last_cp,
        mandatory_analysts=sorted(a.name for a in analysts_for(job.analyst_count or len(ANALYSTS)) if a.mandatory),
        side_effects=list(job.side_effects), progress_label=progress_of(job, events[-1] if events else None).label,
        inference=job.inference, deadline_at=job.deadline_at,
        batches=batch_inference.batches_of(deps, chunks, deps.settings.profile.batch.batch_expected_s)
        if not job.terminal else [],
        batch_off=batch_inference.lane_off(deps)
        if job.inference is Inference.BATCH and not job.terminal else None,
        batch_note=batch_note(events) if job.inference is Inference.BATCH else None,
        model_paused=_paused(deps) if job.inference is Inference.BATCH and not job.terminal else False,
        model_hold=model_hold(deps) if not job.terminal else None)


def _paused(deps: Deps) -> bool:
    return deps.model_control is not None and deps.model_control.get().paused


def model_hold(deps: Deps) -> str | None:
    """Why no model call starts now (`review status`, `review quota show`, the status page), None when nothing holds
    them: an operator's pause, the stack's spend-cap hold of today (domain/spend_cap.py)."""
    c = deps.model_control.get() if deps.model_control is not None else None
    if c is None:
        return None
    if c.paused:
        return f"the model is paused by {c.by or 'an operator'}: `review quota resume` lets it go on"
    hold = c.spend_held(spend_cap.utc_day(deps.clock()))
    return spend_cap.hold_line(hold) if hold is not None else None


def _chunk_numbers(indexes: list[int]) -> str:
    """Chunk indexes (0-based) as people count them: "chunk 3", "chunks 3-5, 9"."""
    nums = sorted(i + 1 for i in indexes)
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    spans = [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    return ("chunk " if len(nums) == 1 else "chunks ") + ", ".join(spans)


def gaps_summary(gaps: list[CoverageGap], mandatory: list[str] | None = None) -> list[str]:
    """The mandatory gaps in a few lines, not one per (chunk, analyst): the chunks that miss the same analysts
    for the same reason are one line ("chunks 3-8 cancelled: all 7 mandatory analysts")."""
    by: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    per_chunk: dict[tuple[str, int], list[str]] = {}
    for g in gaps:
        per_chunk.setdefault((g.status, g.chunk_index), []).append(g.analyst)
    every = sorted(mandatory or [])
    for (status, index), analysts in sorted(per_chunk.items(), key=lambda kv: kv[0][1]):
        by.setdefault((status, tuple(sorted(analysts))), []).append(index)
    lines = []
    for (status, names), indexes in by.items():
        analysts = list(names)
        who = (f"all {len(analysts)} mandatory analysts" if len(analysts) > 1 and analysts == every
               else ", ".join(analysts))
        lines.append(f"{_chunk_numbers(indexes)} {status}: {who}")
    return lines


def side_effect_words(view: JobView) -> list[str]:
    """What the job did outside itself, in words: its reports, and each saga step with its status and key."""
    reports = [name for name, key in (("JSON", view.report.get("json")), ("Markdown", view.report.get("markdown")))
               if key]
    out = [f"the {' and '.join(reports)} report{'s' if len(reports) > 1 else ''} written"] if reports else []
    for e in view.side_effects:
        out.append(f"{e.step} {e.status.value.replace('_', ' ')} (key {e.key[:12]})")
    return out


def chunk_counts(view: JobView) -> str:
    """Progress as one number, the chunks settled (as the job counted them), then what its chunk records say:
    "4 of 4 chunks settled; its chunks: 1 done, 3 cancelled"."""
    c = view.chunks
    kinds = [f"{n} {k.replace('_', ' ')}" for k, n in c.items() if k not in ("total", "settled") and n]
    never = c["total"] - sum(n for k, n in c.items() if k not in ("total", "settled"))
    kinds += [f"{never} never started"] if never > 0 else []
    return f"{c['settled']} of {c['total']} chunks settled" + (f"; its chunks: {', '.join(kinds)}" if kinds else "")


def other_gaps(view: JobView) -> list[CoverageGap]:
    """The mandatory gaps beyond the missing chunks' (a missing chunk misses every analyst: said once)."""
    missing = {m.chunk_index for m in view.missing_chunks}
    return [g for g in view.mandatory_gaps if g.chunk_index not in missing]


def _scalar(name: str, value: str | int | float | bool) -> str:
    """An event detail as people read it: times as dates, idempotency keys by their first 12 characters."""
    if name.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return iso(value)
    if name == "key" and isinstance(value, str):
        return value[:12]
    return str(value)


def event_words(e: EventLine) -> str:
    """A recent event as `review status` shows it: its label in words, and its scalar details (lists and
    objects are in `--json`)."""
    extra = e.model_extra or {}
    label = event_label(JobEvent(job_id="", seq="", type=e.type, at=0.0, detail=extra))
    if e.type in _LABELLED:
        return label
    scalars = [f"{k} {_scalar(k, v)}" for k, v in extra.items() if isinstance(v, str | int | float | bool) and v != ""]
    return label + (f" ({', '.join(scalars)})" if scalars else "")


def explain(view: JobView) -> list[str]:
    """`review explain JOB`: the six answers as a short story, one paragraph each: what happened, where it is,
    what it cost, what failed and why, what to do next, and what happens if it fails again."""
    a = view.answers
    ended = f" and ended `{view.state.value}` at {iso(view.ended_at)}" if view.ended_at else \
        f"; it is `{view.state.value}` now"
    happened = (f"What happened: document {view.document_id or '(no id)'} was taken in at {iso(view.created_at)}, "
                f"split into {view.chunks['total']} chunk(s) for {view.model_id} (prompts {view.prompt_version})"
                f"{ended}. Its latest event: {view.progress_label or view.state.value}.")
    where = f"Where it is: {chunk_counts(view)}"
    if view.last_checkpoint_at:
        where += f"; the last chunk was checkpointed done at {iso(view.last_checkpoint_at)}"
    done = side_effect_words(view)
    where += ". Side effects done: " + ("; ".join(done) if done else "none") + "."
    if view.waiting is not None:
        where += f" It waits: {waiting_line(view.waiting)}."
    cost = f"What it cost: {view.cost}. The model was called {view.reliability.model_calls} time(s)" + (
        f", retried {sum(view.reliability.retries_by_code.values())} time(s)" if view.reliability.retries_by_code else
        "") + "."
    failures = []
    if view.error_code:
        failures.append(f"it ended with {view.error_code}" + (f": {view.error.message}" if view.error else ""))
    if view.missing_chunks:
        by_status: dict[str, list[int]] = {}
        for m in view.missing_chunks:
            by_status.setdefault(f"{m.status.value.replace('_', ' ')} ({m.error_code or 'no code'})", []).append(
                m.chunk_index)
        failures += [f"{_chunk_numbers(ix)} {why}" for why, ix in by_status.items()]
    if other_gaps(view):
        failures.append("mandatory analyses missing: " + "; ".join(gaps_summary(other_gaps(view), view.mandatory_analysts)))
    if view.approval is not None:
        failures.append(f"step {view.approval.step} has an unknown outcome: {view.approval.reason}")
    failed = "What failed and why: " + ("; ".join(failures) + "." if failures else "nothing.")
    if view.approval is not None:
        nxt = (f"What to do next: a person decides before {iso(view.approval.expires_at)}: "
               f"`review approve {view.job_id}` retries the step with the same key, `review reject {view.job_id}` "
               "fails the job and undoes its side effects.")
    else:
        nxt = f"What to do next: {a.retry_would.replace('JOB', view.job_id)}."
    again = f"If it fails again: {a.if_it_fails_again}."
    if not view.state.terminal:
        again += f" To stop it now: {a.if_cancelled_now.replace('JOB', view.job_id)}."
    return [happened, where, cost, failed, nxt, again]


def model_circuit(events: list[JobEvent], now: float, open_s: float) -> str:
    """The circuit breaker as the job's chunks met it: `closed`, or `open` while a chunk requeued because of it
    is still within the breaker's open time, else `closed again`, with how often chunks waited."""
    waits = [e for e in events if e.type == "chunk.requeued" and e.detail.get("reason") == "model.circuit_open"]
    if not waits:
        return "closed"
    last = waits[-1].at
    state = "open" if now - last < open_s else "closed again"
    return f"{state} ({len(waits)} chunk requeues waited for it, the last at {iso(last)})"


# ------------------------------------------------------------------------------ dead letters
class DlqChunk(BaseModel):
    status: ChunkStatus
    chunk_index: int
    failures: int
    receives: int
    redeliveries: int
    fence: int
    last_error: ErrorEnvelope | None
    n_calls: int
    retries: dict[str, int]
    claimed_by: str | None


class DlqEntry(BaseModel):
    """A DLQ message joined with its job and chunk records. Never the document text, unless asked
    for (`body`, filled only by `dlq_show(..., with_body=True)`: a user's own message is theirs to see).

    There is no `receive_count`: SQS has no peek, every look at a DLQ is a receive, so the count SQS
    keeps grows each time someone lists it. `attempts` is what the pipeline spent before giving up."""

    message_id: str
    queue: str  # intake | analysis | results
    source_message_id: str | None = None  # the MessageId `send-message` returned, when known
    sent_at: float = 0.0  # epoch s: when we sent it to the DLQ (a message SQS moved keeps its original time)
    moved_by: str  # "pipeline" (with an error envelope) | "sqs" (maxReceiveCount reached, no envelope)
    attempts: int | None = None
    error_code: str | None
    envelope: ErrorEnvelope | None = None
    payload: dict[str, JsonValue]
    job_id: str | None = None
    chunk_id: str | None = None
    job: dict[str, str | None] | None = None  # state, error_code
    chunk: DlqChunk | None = None
    failed_step: str | None = None
    body: str | None = None


_CONSUMER_STEP = {Queue.INTAKE: "intake", Queue.ANALYSIS: "worker", Queue.RESULTS: "aggregate"}


def _intake_payload(body: str) -> tuple[dict[str, JsonValue], str | None]:
    """An intake body as it may be shown (the document text replaced by its length), and its job id
    when one can be told (the job id a client computes: see README)."""
    try:
        raw = json.loads(body)
    except ValueError:
        return {"unparsed": True, "chars": len(body)}, None
    if not isinstance(raw, dict):
        return {"unparsed": True, "chars": len(body)}, None
    document = raw.get("document")
    if isinstance(document, dict) and "text" in document:
        text = document["text"]
        raw["document"] = {**{k: v for k, v in document.items() if k != "text"},
                           "text_chars": len(text) if isinstance(text, str) else None}
    key, _ = failure_key(body)
    return raw, job_id_for(key) if key else None


def _payload(queue: Queue, body: str) -> tuple[dict[str, JsonValue], str | None, str | None]:
    """What may be shown of a message body, and the job and chunk it names."""
    try:
        if queue is Queue.ANALYSIS:
            am = AnalysisMessage.model_validate_json(body)
            return am.model_dump(mode="json", exclude={"text"}) | {"text_chars": len(am.text)}, am.job_id, am.chunk_id
        if queue is Queue.RESULTS:
            rm = ResultMessage.model_validate_json(body)
            return rm.model_dump(mode="json"), rm.job_id, rm.chunk_id
        payload, job_id = _intake_payload(body)  # intake bodies hold document text: shown by size
        return payload, job_id, None
    except ValidationError:
        return {"unparsed": True, "chars": len(body)}, None, None


def _join(deps: Deps, queue: Queue, m: QueueMessage, with_body: bool = False) -> DlqEntry:
    payload, job_id, chunk_id = _payload(queue, m.body)
    job_id = job_id or m.attributes.get("job_id")  # e.g. an intake message whose job the sweeper failed
    envelope = ErrorEnvelope.model_validate_json(m.attributes["envelope"]) if m.attributes.get("envelope") else None
    by_sqs = envelope is None and not m.attributes.get("error_code")
    entry = DlqEntry(message_id=m.message_id, queue=queue.value, sent_at=m.sent_at,
                     # SQS keeps the MessageId when it moves a message to the DLQ; we record it when we do
                     source_message_id=m.attributes.get("source_message_id") or (m.message_id if by_sqs else None),
                     moved_by="sqs" if by_sqs else "pipeline", error_code=m.attributes.get("error_code"),
                     envelope=envelope, payload=payload, job_id=job_id, chunk_id=chunk_id,
                     body=m.body if with_body else None)
    if job_id:
        job = deps.jobs.get(job_id)
        entry.job = {"state": job.state.value if job else None, "error_code": job.error_code if job else None}
    if job_id and chunk_id:
        c = deps.claims.get(job_id, chunk_id)
        if c is not None:
            entry.chunk = DlqChunk.model_validate(c.model_dump())
            entry.envelope = entry.envelope or c.last_error
    if entry.chunk is not None:
        entry.attempts = entry.chunk.failures
    elif by_sqs:
        entry.attempts = deps.settings.profile.queues.max_receive_count  # SQS moved it after this many receives
    elif queue is Queue.INTAKE:
        entry.attempts = 1  # intake dead-letters a permanent input error on its first attempt
    elif entry.envelope is not None and entry.envelope.attempt:
        entry.attempts = entry.envelope.attempt
    entry.failed_step = (entry.envelope.step if entry.envelope else None) or _CONSUMER_STEP[queue]
    return entry


def dlq_list(deps: Deps) -> list[DlqEntry]:
    return [_join(deps, queue, m) for dlq, queue in _QUEUE_OF_DLQ.items() if deps.queues.has(dlq)
            for m in deps.queues.peek(dlq)]


def dlq_show(deps: Deps, message_id: str, with_body: bool = False) -> DlqEntry | None:
    for dlq, queue in _QUEUE_OF_DLQ.items():
        if deps.queues.has(dlq):
            for m in deps.queues.peek(dlq):
                if m.message_id == message_id:
                    return _join(deps, queue, m, with_body)
    return None


def dlq_discard(deps: Deps, message_id: str, by: str) -> DlqEntry | None:
    """Delete one dead letter that can never be fixed (its DLQ alarm stops counting it); a `dlq.discarded` event
    on its job, when it names one, records who discarded what. None when no DLQ holds that message. Every other
    message taken to find it is made visible again at once."""
    found: DlqEntry | None = None
    for dlq, queue in _QUEUE_OF_DLQ.items():
        if not deps.queues.has(dlq):
            continue
        for m in deps.queues.take_all(dlq, visibility_s=30):
            if found is None and m.message_id == message_id:
                found = _join(deps, queue, m)
                deps.queues.delete(dlq, m.receipt_handle)
            else:
                deps.queues.extend_visibility(dlq, m.receipt_handle, 0)
    if found is not None and found.job_id and deps.jobs.get(found.job_id) is not None:
        deps.jobs.record_event(found.job_id, "dlq.discarded", dlq_message_id=found.message_id, queue=found.queue,
                               chunk_id=found.chunk_id or "", by=by,
                               error_code=(found.envelope.error_code if found.envelope else None)
                               or found.error_code or "")
    return found


# ------------------------------------------------------------------------------ model activity over time
THROTTLE_CODES = frozenset({"model.throttled"})  # a tier-1 retry of these is a throttle the model answered
ACTIVITY_WINDOW_S = 3600.0  # the status page's chart: at most the last hour
ACTIVITY_BUCKETS = 30
ACTIVITY_MIN_BUCKET_S = 5.0


@dataclass(frozen=True)
class ChunkActivity:
    """What one settled chunk spent, at the time it settled: model calls, throttles (tier-1 retries of a
    throttle code), and the tokens its calls counted against the tokens-per-minute quota."""

    at: float
    calls: int
    throttles: int
    quota_tokens: int


class ActivityView(BaseModel):
    """Model calls, throttles and quota use over time, in equal buckets from `start` (the status page's chart).
    `quota_use`: each bucket's quota tokens per minute over `tokens_per_minute`, when the stack knows the quota it
    paces to (`-c model_tpm`, or the profile's); None when it paces to the quota the sweeper publishes."""

    start: float
    bucket_s: float
    calls: list[int]
    throttles: list[int]
    quota_tokens: list[int]
    tokens_per_minute: float | None = None
    quota_use: list[float] | None = None


def chunk_activity(job: Job, chunks: list[ChunkRecord], model_id: str) -> list[ChunkActivity]:
    """The job's settled chunks' activity (their records' counters, summed over their attempts)."""
    model = job.model_id or model_id
    return [ChunkActivity(at=c.settled_at, calls=c.n_calls,
                          throttles=sum(n for code, n in c.retries.items() if code in THROTTLE_CODES),
                          quota_tokens=quota_tokens(model, c.input_tokens, c.cache_write_tokens, c.output_tokens))
            for c in chunks if c.settled_at is not None]


def activity(points: list[ChunkActivity], now: float, tokens_per_minute: float | None,
             window_s: float = ACTIVITY_WINDOW_S, buckets: int = ACTIVITY_BUCKETS) -> ActivityView:
    """Bucket the chunks' activity from the first one within the window (at most `window_s` ago) to now."""
    recent = [p for p in points if p.at >= now - window_s]
    start = min((p.at for p in recent), default=now - ACTIVITY_MIN_BUCKET_S * buckets)
    bucket_s = max(ACTIVITY_MIN_BUCKET_S, -(-(now - start) // buckets))  # ceil: the last bucket holds `now`
    calls, throttles, tokens = [0] * buckets, [0] * buckets, [0] * buckets
    for p in recent:
        i = min(buckets - 1, int((p.at - start) // bucket_s))
        calls[i] += p.calls
        throttles[i] += p.throttles
        tokens[i] += p.quota_tokens
    use = [round(t * 60.0 / bucket_s / tokens_per_minute, 4) for t in tokens] if tokens_per_minute else None
    return ActivityView(start=start, bucket_s=bucket_s, calls=calls, throttles=throttles, quota_tokens=tokens,
                        tokens_per_minute=tokens_per_minute, quota_use=use)


def paced_tokens_per_minute(deps: Deps) -> float | None:
    """The tokens-per-minute quota the workers pace to, when the stack's settings say it (no AWS call)."""
    return deps.settings.model_tpm or deps.settings.profile.quota.model_tokens_per_minute


# ------------------------------------------------------------------------------ ids by unique prefix
JOB_ID_CHARS = len(job_id_for(""))  # "job-" + 20 hex
BATCH_ID_CHARS = len("batch-") + 20  # operate/api.py: "batch-" + 20 hex


class AmbiguousId(Exception):
    """A prefix that names more than one job or message: the message lists them."""


def _unique(prefix: str, ids: list[str], what: str) -> str | None:
    found = sorted({i for i in ids if i.startswith(prefix)})
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise AmbiguousId(f"{prefix!r} is the start of {len(found)} {what} ids ({shown}): give more of it")
    return found[0] if found else None


def resolve_job_id(deps: Deps, given: str) -> str:
    """A job id given whole, or by a unique prefix ("job-3fa2", or "3fa2" without `job-`): the whole id. A whole
    id is returned as it is even without a record (intake may not have taken it in yet); a prefix that names no
    job is returned as given, so the caller says "no job ..."."""
    if len(given) >= JOB_ID_CHARS or deps.jobs.get(given) is not None:
        return given
    prefix = given if given.startswith("job-") else "job-" + given
    return _unique(prefix, [j.job_id for j in deps.jobs.all()], "job") or given


def resolve_message_id(deps: Deps, given: str) -> str:
    """A DLQ message id given whole or by a unique prefix: the whole id (as given when none matches)."""
    ids = [m.message_id for dlq in _QUEUE_OF_DLQ if deps.queues.has(dlq) for m in deps.queues.peek(dlq)]
    if given in ids:
        return given
    return _unique(given, ids, "DLQ message") or given


def resolve_batch_id(deps: Deps, given: str) -> str:
    """A batch id given whole or by a unique prefix ("batch-9c1e", or "9c1e" without `batch-`): the whole id (as
    given when none matches). The ids are the batch manifests' names in the artifact bucket (one S3 listing of the
    `batches/` prefix); whose batch it is, `api.batch_manifest` decides after."""
    prefix = given if given.startswith("batch-") else "batch-" + given
    if len(prefix) >= BATCH_ID_CHARS:
        return given
    ids = [k[len(BATCHES_PREFIX):-len(".json")] for k in deps.artifacts.list_keys(BATCHES_PREFIX + prefix)
           if k.endswith(".json")]
    return _unique(prefix, ids, "batch") or given


# ------------------------------------------------------------------------------ submit
def job_id_of(text: str, idempotency_key: str | None = None) -> str:
    """The job id a submission of `text` gets: from the idempotency key, by default the text's SHA-256."""
    return job_id_for(idempotency_key or document_hash(text))


def check_document(deps: Deps, text: str) -> None:
    """The checks intake makes first on a document's text (admission's): raises `input.empty_document` or
    `input.too_large` at once, so a client refuses it before sending anything."""
    admission.document_text(deps, InlineDocument.model_construct(text=text))  # no inline limit: large is claim-checked


def submit(deps: Deps, text: str, document_id: str | None = None, idempotency_key: str | None = None,
           metadata: dict[str, JsonValue] | None = None, budget_usd: float | None = None,
           priority: Priority | None = None, inference: Inference | None = None,
           deadline_hours: float | None = None) -> str:
    """Send one document to the intake queue (inline, or claim-check via S3 when large). Returns the job id.
    Raises `job.budget_insufficient` (nothing sent) when the document's estimate is over `budget_usd`.
    The message is admission's (`admission.intake_body`); intake checks it, so even a document it rejects is
    recorded under the job id returned here (the key is always sent)."""
    key = idempotency_key or document_hash(text)
    admission.check_budget(deps.settings, text, budget_usd)  # job.budget_insufficient: nothing is sent
    deps.queues.send_intake(admission.intake_body(deps, text, key=key, document_id=document_id, metadata=metadata,
                                                  budget_usd=budget_usd, priority=priority, inference=inference,
                                                  deadline_hours=deadline_hours))
    return job_id_for(key)


# ------------------------------------------------------------------------------ the model's runtime control
class NoModelControl(Exception):
    """The stack has no runtime control table (deployed before it existed): redeploy it."""


def _controls(deps: Deps) -> ModelControls:
    if deps.model_control is None:
        raise NoModelControl("this stack has no runtime control (no ControlTableName output): redeploy it with this "
                             "version (`cdk deploy`, or `review up` locally)")
    return deps.model_control


def quota_show(deps: Deps) -> ModelControl:
    """`review quota show`: what the operator set (a pause, a quota) and the models whose batch lane is off; the
    workers see it within the profile's model_control_max_age_s."""
    return _controls(deps).get()


def quota_change(deps: Deps, by: str, *, paused: bool | None = None, tokens_per_minute: float | None = None,
                 clear_quota: bool = False, override_cap: bool = False) -> ModelControl:
    """`review quota pause|resume [--override-cap]|set N|set --clear`: the named fields only, compare-and-set
    (`ModelControls.update`): a pause racing a set keeps both. `override_cap`: the stack's daily spend cap lifted for
    the rest of this UTC day (its hold, and the admissions' cap: the jobs waiting for it start within a sweep)."""
    at = deps.clock()

    def change(now: ModelControl) -> ModelControl:
        return now.model_copy(update={
            "paused": now.paused if paused is None else paused,
            "tokens_per_minute": None if clear_quota else (tokens_per_minute or now.tokens_per_minute),
            "cap_override_day": spend_cap.utc_day(at) if override_cap else now.cap_override_day,
            "by": by, "at": at})

    return _controls(deps).update(change)


def batch_lane_on(deps: Deps, model_id: str) -> tuple[ModelControl, BatchLaneOff | None]:
    """`review quota batch --on`: the model's batch lane on again (its `batch_off` entry removed, the other models'
    and every other field left as they are: compare-and-set). Returns the control as it is now and the entry removed
    (None: the lane was not off; nothing is written when nothing changes)."""
    removed: list[BatchLaneOff] = []

    def change(now: ModelControl) -> ModelControl:
        removed[:] = [now.batch_off[model_id]] if model_id in now.batch_off else []
        return now.model_copy(update={"batch_off": {m: off for m, off in now.batch_off.items() if m != model_id}})

    written = _controls(deps).update(change)
    return written, removed[0] if removed else None

