"""One view of a job: `JobView`, the job record answering the six questions (DESIGN rule 7), read by
`review status` / `explain` / `watch`, the status page and the Job API.

- `job_view` / `view_of`: the view, from the job's records (`brief`: only what `GET /jobs/{id}` shows is read).
- `job_status` / `api_body`: `GET /jobs/{id}`, a camelCase projection of the view (docs/openapi.yaml `Job`); its
  times are `api_time` (RFC 3339 to the millisecond), while people read `narration.human_time`.
- `explain` and the words of a view (`chunk_counts`, `gaps_summary`, `side_effect_words`): the view told as
  `review status` and `review explain` say it. They live here, not in `narration.py`, because the view is built
  with narration's words: narration imports nothing of the view.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import BaseModel, Field, JsonValue

from contract_review.domain.batch_inference import BatchStatus
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.control_records import BatchLaneOff
from contract_review.domain.errors import REGISTRY, ErrorEnvelope
from contract_review.domain.ports import Deps
from contract_review.domain.records import (
    Approval,
    ChunkStatus,
    CoverageGap,
    Inference,
    Job,
    JobEvent,
    JobState,
    Reliability,
    SideEffectDone,
    Submission,
    Usage,
    Waiting,
)
from contract_review.operate.model_control import model_hold, paused
from contract_review.operate.narration import (
    EventLine,
    batch_note,
    event_label,
    human_time,
    model_circuit,
    waiting_line,
)
from contract_review.pipeline import batch_inference, redrive
from contract_review.review.analysts import ANALYSTS, analysts_for
from contract_review.review.report import cost_line, coverage_of

RECENT_EVENTS = 10


class MissingChunkView(BaseModel):
    chunk_id: str
    chunk_index: int
    status: ChunkStatus
    error_code: str | None



class Answers(BaseModel):
    """The six questions every job record answers."""

    state: JobState
    last_durable_checkpoint: str
    side_effects_done: list[str]
    retry_would: str
    if_cancelled_now: str
    if_it_fails_again: str


class ProgressView(BaseModel):
    """Where a job stands, from durable state only: chunks settled of all, and the latest event in words."""

    current_step: int
    total_steps: int
    label: str



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
    # the models it ran on before `model_id` (it fell back, or an operator switched the stack: pipeline/fallback.py),
    # and per analyst the models its settled chunks' answers came from (model -> chunks)
    earlier_models: list[str] = Field(default_factory=list)
    analyst_models: dict[str, dict[str, int]] = Field(default_factory=dict)
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
    # what only GET /jobs/{id} shows (`api_body`), left out of `review status --json` (exclude): when the record last
    # changed, progress as steps, the report's findings, whether POST /jobs/{id}/retry would put it back to work, and
    # the approval as recorded (a decided one too: `approval` above is the one still to decide)
    updated_at: float = Field(default=0.0, exclude=True)
    steps: ProgressView | None = Field(default=None, exclude=True)
    findings: int | None = Field(default=None, exclude=True)
    retryable: bool = Field(default=False, exclude=True)
    recorded_approval: Approval | None = Field(default=None, exclude=True)



CANCEL_NOW = ("`review cancel JOB` (or POST /jobs/{id}/cancel): no new model call starts; chunks in flight stop "
              "within one model call and settle `cancelled`; side effects already done are compensated; the job "
              "ends `cancelled`")
STILL_RUNNING_FAILS = ("chunk messages go to the analysis DLQ with their error envelope; the job ends "
                       "`dead_lettered` listing them")


def _input_failure(code: str | None) -> bool:
    return (code or "").startswith("input.")


def no_report(job: Job) -> str:
    """Why `job` has no report, in one line (`review report`, the Job API's report route): still under way, or how it
    ended (its code) and what would bring it one."""
    if not job.terminal:
        return (f"job {job.job_id} has no report yet: it is {job.state.value}, and a report is written when it ends "
                f"(`review watch {job.job_id}` follows it)")
    return (f"job {job.job_id} has no report: it ended {job.state.value} with {job.error_code or 'no error code'} "
            f"before a report was written. What to do: {_retry_would(job.state, job.error_code, 0, 0)}")


def remedy(view: JobView) -> str | None:
    """What to do about a job that ended without completing, as `review status` prints it (`a retry would: ...`),
    with its id in place of JOB; None for a job still open or completed."""
    if not view.state.terminal or view.state is JobState.COMPLETED:
        return None
    return view.answers.retry_would.replace("JOB", view.job_id)


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



def settled_chunks(job: Job) -> int:
    """The one progress number: how many of the job's chunks are settled (all of them once it completed). `review
    status`, `GET /jobs/{id}`, its events' stream and the status page (its job list and its job pane) all count this."""
    return job.chunk_count if job.state is JobState.COMPLETED else min(job.n_settled, job.chunk_count)


def progress_of(job: Job, last: JobEvent | None) -> ProgressView:
    total = max(job.chunk_count, 1)
    done = settled_chunks(job) if job.chunk_count else int(job.state is JobState.COMPLETED)
    return ProgressView(current_step=done, total_steps=total, label=event_label(last) if last else job.state.value)


def job_progress(deps: Deps, job: Job) -> ProgressView:
    return progress_of(job, deps.jobs.last_event(job.job_id))


def _event_line(e: JobEvent) -> EventLine:
    return EventLine.model_validate({**e.detail, "at": human_time(e.at), "type": e.type})


def job_view(deps: Deps, job_id: str) -> JobView | None:
    """The job's view (`review status`, `explain`, the status page), from all its records; None: no such job."""
    job = deps.jobs.get(job_id)
    return view_of(deps, job) if job is not None else None


def view_of(deps: Deps, job: Job, brief: bool = False) -> JobView:
    """The view of `job`. `brief`: only what `GET /jobs/{id}` shows (`api_body`) is read beyond the job record, as
    a client polls it: its latest event, and its chunk records only while a batch-mode job's calls may wait in the
    batch lane; the counts, gaps, answers and model control fields are then those of no chunk records."""
    open_batch = job.inference is Inference.BATCH and not job.terminal
    if brief:
        chunks = deps.claims.for_job(job.job_id) if open_batch else []
        last = deps.jobs.last_event(job.job_id)
        events = [last] if last is not None else []
    else:
        chunks = deps.claims.for_job(job.job_id) if job.chunk_count else []
        events = deps.jobs.events(job.job_id)
    by_status = Counter(c.status.value for c in chunks)
    last_cp = max((c.settled_at or 0.0 for c in chunks if c.status is ChunkStatus.DONE), default=None)
    dead = [c for c in chunks if c.status in (ChunkStatus.DEAD_LETTERED, ChunkStatus.FAILED)]
    # mandatory gaps from the chunk records: the job item holds only a bounded sample
    coverage = coverage_of(job.analyst_count, [c for c in chunks if c.settled]) if chunks else None
    steps = progress_of(job, events[-1] if events else None)
    control = not brief and not job.terminal  # the runtime control is read for an open job's full view only
    return JobView(
        job_id=job.job_id, state=job.state, document_id=job.document_id,
        chunks={"total": job.chunk_count, "settled": settled_chunks(job), **by_status}, progress=job.progress,
        error_code=job.error_code, error=job.error,
        missing_chunks=[MissingChunkView(chunk_id=c.chunk_id, chunk_index=c.chunk_index, status=c.status,
                                         error_code=c.last_error.error_code if c.last_error else None) for c in dead],
        mandatory_gaps=coverage.mandatory_gaps if coverage else [], reliability=job.reliability or Reliability.of(chunks),
        report={"json": job.report_json_key, "markdown": job.report_md_key},
        created_at=job.created_at, ended_at=job.ended_at, model_id=job.model_id, prompt_version=job.prompt_version,
        earlier_models=list(job.earlier_models), analyst_models=coverage.models if coverage else {},
        recent_events=[_event_line(e) for e in events[-RECENT_EVENTS:]], answers=_answers(job, by_status, last_cp, dead),
        model_circuit=model_circuit(events, deps.clock(), deps.settings.profile.quota.breaker_open_s),
        cost=cost_line(job), usage=job.usage(), budget_micro_usd=job.budget_micro_usd,
        approval=job.approval if job.state is JobState.WAITING_APPROVAL else None,
        waiting=job.waiting if not job.terminal else None, last_checkpoint_at=last_cp,
        mandatory_analysts=sorted(a.name for a in analysts_for(job.analyst_count or len(ANALYSTS)) if a.mandatory),
        side_effects=list(job.side_effects), progress_label=steps.label,
        inference=job.inference, deadline_at=job.deadline_at,
        batches=batch_inference.batches_of(deps, chunks, deps.settings.profile.batch.batch_expected_s) if not job.terminal else [],
        batch_off=batch_inference.lane_off(deps) if open_batch and control else None,
        batch_note=batch_note(events) if job.inference is Inference.BATCH else None,
        model_paused=paused(deps) if open_batch and control else False,
        model_hold=model_hold(deps) if control else None,
        updated_at=job.updated_at, steps=steps, findings=job.n_findings, retryable=redrive.retryable(job),
        recorded_approval=job.approval)


def _answers(job: Job, by_status: Mapping[str, int], last_cp: float | None, dead: list[ChunkRecord]) -> Answers:
    n_dlq = sum(c.status is ChunkStatus.DEAD_LETTERED for c in dead)
    return Answers(
        state=job.state,
        last_durable_checkpoint=(f"{by_status.get('done', 0)} of {job.chunk_count} chunks settled done"
                                 + (f", last at {human_time(last_cp)}" if last_cp else "")),
        side_effects_done=[k for k in ("report_json_key", "report_md_key") if getattr(job, k)]
        + [f"{e.step} {e.status.value} ({e.key[:12]})" for e in job.side_effects],
        retry_would=_retry_would(job.state, job.error_code, n_dlq, len(dead) - n_dlq),
        if_cancelled_now=_if_cancelled_now(job.state),
        if_it_fails_again=_if_it_fails_again(job.state, job.error_code, n_dlq))


# ------------------------------------------------------------------------------ GET /jobs/{id}
def api_time(epoch: float) -> str:
    """A time in the Job API's bodies: RFC 3339, UTC, to the millisecond, "Z" (docs/openapi.yaml)."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def links(job_id: str, base_url: str) -> dict[str, str]:
    base = f"{base_url}/jobs/{job_id}"
    return {"statusUrl": base, "eventsUrl": f"{base}/events", "cancelUrl": f"{base}/cancel"}


def job_status(deps: Deps, found: Job | Submission, base_url: str = "") -> dict[str, JsonValue]:
    """`GET /jobs/{id}` (URLs under `base_url`): the job's brief view in the API's words (`api_body`), or, while
    intake has not taken the job in, its submission record's answer (`queued`, waiting for intake)."""
    if isinstance(found, Submission):
        return {"jobId": found.job_id, "status": JobState.QUEUED.value, "documentId": None,
                "progress": {"currentStep": 0, "totalSteps": 0, "label": "waiting for intake"},
                "result": None, "error": None, "createdAt": api_time(found.submitted_at),
                "updatedAt": api_time(found.submitted_at), **links(found.job_id, base_url)}
    return api_body(view_of(deps, found, brief=True), deps.artifacts.bucket, base_url)


def api_body(view: JobView, bucket: str, base_url: str = "") -> dict[str, JsonValue]:
    """A job view as `GET /jobs/{id}` answers it (camelCase, docs/openapi.yaml `Job`)."""
    result: JsonValue = None
    if view.report.get("json"):
        result = {"reportUrl": f"{base_url}/jobs/{view.job_id}/report",  # what the caller can read (a 302 to it)
                  "reportJson": f"s3://{bucket}/{view.report['json']}",
                  "reportMarkdown": f"s3://{bucket}/{view.report['markdown']}" if view.report.get("markdown") else None,
                  "findings": view.findings}
    error: JsonValue = None
    if view.error_code or view.error:
        code = view.error_code or (view.error.error_code if view.error else "runtime.internal")
        error = {"code": code, "message": view.error.message if view.error else "", "retryable": view.retryable}
    steps = view.steps or ProgressView(current_step=0, total_steps=0, label="")
    body: dict[str, JsonValue] = {
        "jobId": view.job_id, "status": view.state.value, "documentId": view.document_id or None,
        "progress": {"currentStep": steps.current_step, "totalSteps": steps.total_steps, "label": steps.label},
        "result": result, "error": error, "createdAt": api_time(view.created_at),
        "updatedAt": api_time(view.updated_at), **links(view.job_id, base_url)}
    if view.inference is Inference.BATCH:  # batch inference: its deadline, and the batch jobs holding its calls
        body["inference"] = view.inference.value
        body["deadline"] = api_time(view.deadline_at) if view.deadline_at else None
        if not view.state.terminal:
            body["batches"] = [{"batchJobArn": b.batch_job_arn, "status": b.status, "records": b.records,
                                "batchRecords": b.batch_records,
                                "submittedAt": api_time(b.submitted_at) if b.submitted_at else None,
                                "expectedBy": api_time(b.expected_by) if b.expected_by else None}
                               for b in view.batches]
    if view.waiting is not None:  # what its chunks are held for (the daily token quota), while it is open
        w = view.waiting
        body["waiting"] = {"condition": w.condition, "modelId": w.model_id, "tokensPerDay": w.tokens_per_day,
                           "since": api_time(w.since), "message": w.detail}
    if view.recorded_approval is not None:  # a side effect whose outcome is unknown: what a person decides on
        a = view.recorded_approval
        body["approval"] = {"step": a.step, "key": a.key, "reason": a.reason, "evidence": a.evidence,
                            "requestedAt": api_time(a.requested_at), "expiresAt": api_time(a.expires_at),
                            "decision": a.decision, "decidedBy": a.decided_by or None,
                            "approvalUrl": f"{base_url}/jobs/{view.job_id}/approval"}
    return body



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


def header_words(view: JobView) -> str:
    """The job's document, model and dates in one line (`review status`); a field it does not have (a job that failed
    on its input has no model yet) is left out, not printed empty."""
    model = f"model {model_words(view)}" + (f", prompts {view.prompt_version}" if view.prompt_version else "")
    when = f"created {human_time(view.created_at)}" + (f", ended {human_time(view.ended_at)}" if view.ended_at else "")
    return "; ".join([f"document {view.document_id or '(no id)'}", *([model] if view.model_id else []), when])


def model_words(view: JobView) -> str:
    """The job's model; when it ran on more than one (it fell back, or an operator switched the stack's model), each
    in turn and the models each analyst's answers came from, in chunks."""
    if not view.earlier_models:
        return view.model_id
    by_analyst = "; ".join(f"{a}: " + ", ".join(f"{m} {n}" for m, n in by.items())
                           for a, by in view.analyst_models.items())
    return f"{view.model_id} (ran on {' then '.join([*view.earlier_models, view.model_id])}; answers by analyst, " \
           f"in chunks: {by_analyst or 'none settled yet'})"


def other_gaps(view: JobView) -> list[CoverageGap]:
    """The mandatory gaps beyond the missing chunks' (a missing chunk misses every analyst: said once)."""
    missing = {m.chunk_index for m in view.missing_chunks}
    return [g for g in view.mandatory_gaps if g.chunk_index not in missing]



def explain(view: JobView) -> list[str]:
    """`review explain JOB`: the six answers as a short story, one paragraph each: what happened, where it is,
    what it cost, what failed and why, what to do next, and what happens if it fails again."""
    a = view.answers
    ended = f" and ended `{view.state.value}` at {human_time(view.ended_at)}" if view.ended_at else \
        f"; it is `{view.state.value}` now"
    happened = (f"What happened: document {view.document_id or '(no id)'} was taken in at {human_time(view.created_at)}, "
                f"split into {view.chunks['total']} chunk(s) for {view.model_id} (prompts {view.prompt_version})"
                f"{ended}. Its latest event: {view.progress_label or view.state.value}.")
    where = f"Where it is: {chunk_counts(view)}"
    if view.last_checkpoint_at:
        where += f"; the last chunk was checkpointed done at {human_time(view.last_checkpoint_at)}"
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
    decided = view.recorded_approval
    if decided is not None and decided.decision in ("reject", "expired") and view.approval is None \
            and not view.error_code:
        # a person rejected a side effect (or let its approval expire) and the job was retried since: its ending is
        # gone from the record, the decision is not
        failures.append(f"earlier, step {decided.step}'s approval was {'rejected' if decided.decision == 'reject' else 'left to expire'}"
                        + (f" by {decided.decided_by}" if decided.decided_by else "")
                        + (f" at {human_time(decided.decided_at)}" if decided.decided_at else "")
                        + f" ({decided.reason}); the job was retried after it")
    failed = "What failed and why: " + ("; ".join(failures) + "." if failures else "nothing.")
    if view.approval is not None:
        nxt = (f"What to do next: a person decides before {human_time(view.approval.expires_at)}: "
               f"`review approve {view.job_id}` retries the step with the same key, `review reject {view.job_id}` "
               "fails the job and undoes its side effects.")
    else:
        nxt = f"What to do next: {a.retry_would.replace('JOB', view.job_id)}."
    again = f"If it fails again: {a.if_it_fails_again}."
    if not view.state.terminal:
        again += f" To stop it now: {a.if_cancelled_now.replace('JOB', view.job_id)}."
    return [happened, where, cost, failed, nxt, again]

