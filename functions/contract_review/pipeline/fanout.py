"""Fan-out in pages under a per-job window: a 5 MB document is sent by many short, repeatable
steps, and one large document cannot fill the analysis queue ahead of everyone else.

Intake splits the whole document once (so `chunk_count` is on the job before any chunk is analysed
and the aggregator cannot finalize before every page is out), stores the document and its *plan*
(each chunk's character and byte offsets, `plan_key`), makes the job `running`, and sends the first
page. The job's `fanned_out` is the durable cursor: chunks [0, fanned_out) have their chunk records
and were sent.

The window: at most `fanout_window` chunks of a job are in flight (sent, not yet counted settled by
the aggregator). As chunks settle, the aggregator calls `refill`: once the window has room for a page
of `fanout_page` chunks (or for all that remain) it creates their records, sends their messages (the
page's text read from the stored document by one ranged GET) and then moves the cursor with a
conditional write. Every step is safe to repeat: after a crash before the cursor moved, the next
refill sends the same page again (records are created only if absent; a second message for a chunk
is harmless, its claim decides).

Nothing strands: the aggregator refills *before* it counts the settling chunk, so a refill that keeps
failing leaves that chunk uncounted, and the stalled-job reconciler announces it again. While the
cursor is short of `chunk_count`, some sent chunk is uncounted (a refill leaves the window full, or
short of a page only while more than `window - page` are in flight), so a settle always comes to
refill. Intake calls `refill` too for a repeated submission of a running job.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.keys import plan_key
from contract_review.domain.ports import Deps
from contract_review.domain.records import Inference, Job, JobState
from contract_review.reliability.chunks import chunk_message
from contract_review.review.chunking import Chunk, chunk_id_for


@dataclass(frozen=True)
class PlannedChunk:
    index: int
    chunk_id: str
    start: int  # characters
    end: int
    byte_start: int  # UTF-8 bytes of the stored document
    byte_end: int


class FanoutPlan(BaseModel):
    """Every chunk of a document by offsets: [start, end, byte_start, byte_end] in chunk order (about
    40 bytes a chunk: 55 KB for a 5 MB document). The ids follow from the document hash and offsets."""

    document_sha256: str
    bounds: list[tuple[int, int, int, int]]

    @classmethod
    def of(cls, text: str, document_sha256: str, chunks: list[Chunk]) -> FanoutPlan:
        bounds: list[tuple[int, int, int, int]] = []
        char_pos = byte_pos = 0
        for c in chunks:  # in order: one pass over the text
            byte_pos += len(text[char_pos:c.start].encode("utf-8"))
            byte_start = byte_pos
            byte_pos += len(c.text.encode("utf-8"))
            char_pos = c.end
            bounds.append((c.start, c.end, byte_start, byte_pos))
        return cls(document_sha256=document_sha256, bounds=bounds)

    def __len__(self) -> int:
        return len(self.bounds)

    def page(self, lo: int, hi: int) -> list[PlannedChunk]:
        return [PlannedChunk(i, chunk_id_for(self.document_sha256, i, s, e), s, e, bs, be)
                for i, (s, e, bs, be) in enumerate(self.bounds[lo:hi], start=lo)]


def store_plan(deps: Deps, job_id: str, plan: FanoutPlan) -> None:
    deps.artifacts.put_text(plan_key(job_id), plan.model_dump_json())


def page_size(deps: Deps, job: Job, settling: str | None = None) -> int:
    """How many chunks a refill would send now (0: none). `settling` (a chunk not counted yet, about to be) counts as
    settled already."""
    if job.state is not JobState.RUNNING or job.fanned_out is None:
        return 0  # ended jobs are not fanned out (a reopened one is running again); no cursor: all sent
    p = deps.settings.profile
    remaining = job.chunk_count - job.fanned_out
    if remaining <= 0:
        return 0
    counted = job.n_settled + (1 if settling is not None else 0)
    in_flight = max(0, job.fanned_out - counted)
    # a batch-mode job's chunks are all sent at once: they wait in batch jobs, not in the window (batch.py)
    window = job.chunk_count if job.inference is Inference.BATCH else p.fanout.fanout_window
    room = window - in_flight
    n = min(room, remaining)
    # the settling chunk's cost is not on the job yet: it counts as in flight for the budget
    affordable = budget_room(job, max(0, job.fanned_out - job.n_settled))
    if affordable is not None and affordable < n:  # the budget left covers fewer chunks: send those, no more
        return max(0, affordable)
    if n <= 0 or (n < p.fanout.fanout_page and n < remaining):
        return 0  # wait for a whole page (fewer, larger refills), unless this is the last one
    return n


def budget_room(job: Job, in_flight: int) -> int | None:
    """How many more chunks a job with a budget may send: the budget left (over what it has cost so far) at the
    document's estimate per chunk, less the chunks in flight (each may still spend its estimate). None: no budget
    or no estimate (a job from before estimates). So a job overshoots its budget only by what its chunks cost
    over their estimate."""
    if job.budget_micro_usd is None or not job.estimate_micro_usd or not job.chunk_count:
        return None
    per_chunk = max(1, job.estimate_micro_usd // job.chunk_count)
    return (job.budget_micro_usd - job.total_micro_usd) // per_chunk - in_flight


def stalled_by_budget(job: Job) -> bool:
    """Nothing in flight, chunks left to send, and the budget left covers none of them at its estimate: the job
    cannot go on without passing its budget (the aggregator stops it, before spending)."""
    if job.fanned_out is None or job.fanned_out >= job.chunk_count or job.n_settled < job.fanned_out:
        return False
    room = budget_room(job, 0)
    return room is not None and room <= 0


def refill(deps: Deps, job: Job, *, settling: str | None = None, plan: FanoutPlan | None = None,
           text: str | None = None) -> int:
    """Send the next page of the job's chunks if its window has room; the number sent.

    `job` is as read by the caller; `settling` is a chunk not counted yet, about to be counted settled. Intake passes
    the `plan` and the whole `text` it holds; otherwise both are read from S3 (the plan, and the
    page's bytes of the document)."""
    n = page_size(deps, job, settling)
    if n == 0 or job.fanned_out is None:
        return 0
    first = job.fanned_out
    plan = plan if plan is not None else FanoutPlan.model_validate_json(deps.artifacts.get_text(plan_key(job.job_id)))
    if len(plan) != job.chunk_count or plan.document_sha256 != job.document_sha256:
        raise ValueError(f"fan-out plan of {job.job_id} does not match the job ({len(plan)} chunks, "
                         f"document {plan.document_sha256[:12]}; job {job.chunk_count}, {job.document_sha256[:12]})")
    page = plan.page(first, first + n)
    if text is None:
        body = deps.artifacts.get_text_range(job.document_key, page[0].byte_start, page[-1].byte_end)
        base = page[0].start
    else:
        body, base = text, 0
    messages = []
    sent_at = deps.clock()  # the record says when its message was sent (a repeated page keeps the first time)
    for c in page:
        record = ChunkRecord(job_id=job.job_id, chunk_id=c.chunk_id, chunk_index=c.index, start=c.start, end=c.end,
                             message_sent_at=sent_at)
        deps.claims.create(record)
        messages.append(chunk_message(deps, job, record, body[c.start - base:c.end - base], "intake"))
    deps.queues.send_analysis(messages)
    if deps.jobs.advance_fanout(job.job_id, first, first + n) and first > 0:
        deps.jobs.record_event(job.job_id, "job.fanned_out", first=first, sent=n, fanned_out=first + n,
                               total=job.chunk_count)
    return n
