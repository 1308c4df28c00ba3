"""The operator surface in words: each job event as a line of progress, and times as people read them.

- `event_label`: one event as `review watch`, `GET /jobs/{id}/events` (`label`) and the status page show it;
  `event_words`: a recent event as `review status` lists it (its label and its scalar details).
- `batch_note` / `batch_line` / `batch_off_line` / `waiting_line` / `model_circuit`: what a job waits for, or how
  its calls went, in one line each.
- `human_time`: the one time format for people (UTC, to the second: "2025-01-31T09:00:00+00:00"); the Job API's
  bodies use `job_view.api_time` (RFC 3339 to the millisecond, "Z"), the format its schema documents.

A job view told as a story (`review explain`) is `job_view.explain`: it reads a `JobView`, which is built with
these words (so it lives beside the view, and this module imports nothing of it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from contract_review.domain.batch_inference import BatchStatus
from contract_review.domain.control_records import BatchLaneOff
from contract_review.domain.records import JobEvent, Waiting


class EventLine(BaseModel):
    """An event as `review status` shows it: time, type, and its details flattened."""

    model_config = ConfigDict(extra="allow")
    at: str
    type: str



def batch_off_line(off: BatchLaneOff) -> str:
    """Why a batch-mode job's calls go on demand (`review status`): the batch lane is off for its model."""
    return (f"the batch lane is off for this model since {human_time(off.at)} ({off.error_code}, by {off.by or 'an operator'}: "
            f"{off.reason}): its calls go on demand until `review quota batch --on`")


ON_DEMAND_WHY = {  # `batch.on_demand` reasons (pipeline/batch_inference.py), in words
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
    when = (f", submitted {human_time(b.submitted_at)}, expected by {human_time(b.expected_by)}"
            if b.submitted_at and b.expected_by else "")
    of = f" of {b.batch_records}" if b.batch_records else ""
    return f"batch job {b.batch_job_arn or b.batch} {b.status}: {b.records}{of} request(s){when}"


def waiting_line(waiting: Waiting) -> str:
    """`review status` and GET /jobs/{id}: what the job waits for, and since when."""
    return f"{waiting.detail} (since {human_time(waiting.since)})"


def human_time(epoch: float) -> str:
    """A time as people read it (`review status`, `explain`, event details): UTC to the second."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds")


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
             "batch.resent", "batch.refused", "batch.unavailable", "batch.stopped", "batch.unused", "job.model_switched"}


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
        "job.model_switched": lambda: f"model switched: {d.get('from_model')} -> {d.get('to_model')} "
                                      f"({d.get('reason')}); the checkpoints made before are kept",
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



def _scalar(name: str, value: str | int | float | bool) -> str:
    """An event detail as people read it: times as dates, idempotency keys by their first 12 characters."""
    if name.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return human_time(value)
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



def model_circuit(events: list[JobEvent], now: float, open_s: float) -> str:
    """The circuit breaker as the job's chunks met it: `closed`, or `open` while a chunk requeued because of it
    is still within the breaker's open time, else `closed again`, with how often chunks waited."""
    waits = [e for e in events if e.type == "chunk.requeued" and e.detail.get("reason") == "model.circuit_open"]
    if not waits:
        return "closed"
    last = waits[-1].at
    state = "open" if now - last < open_s else "closed again"
    return f"{state} ({len(waits)} chunk requeues waited for it, the last at {human_time(last)})"

