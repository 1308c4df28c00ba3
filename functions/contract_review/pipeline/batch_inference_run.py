"""One collect of the batch lane (pipeline/batch_inference_collect.py `collect`): its state (`CollectRun`: the
running batch-mode jobs and their chunks, read once; each job's document read at most once; the jobs whose batch
work was followed without error), its report, and the moves both the following and the packing half make: a chunk
sent on demand, a manifest given up or ended, a parked chunk's records read back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from contract_review.domain import spend_cap
from contract_review.domain.batch_inference import BatchManifest, BatchRecord
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import ErrorEnvelope
from contract_review.domain.keys import batch_open_key
from contract_review.domain.ports import Deps
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState
from contract_review.pipeline.batch_inference import write_manifest
from contract_review.reliability.chunks import analysis_message


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


class CollectRun:
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


def records_of(deps: Deps, chunk: ChunkRecord) -> Iterator[BatchRecord]:
    """A parked chunk's requests, from its pending file (one chunk's at a time)."""
    if chunk.batch_pending_key is None:
        return
    for line in deps.artifacts.get_text(chunk.batch_pending_key).splitlines():
        if line.strip():
            d = json.loads(line)
            yield BatchRecord(record_id=d["recordId"], model_input=d["modelInput"])


def end_manifest(c: CollectRun, manifest: BatchManifest, **update: object) -> None:
    """The manifest ended (kept, for `review status`), and no longer followed."""
    write_manifest(c.deps, manifest.model_copy(update={"ended_at": c.now, **update}))
    c.deps.artifacts.delete(batch_open_key(manifest.token))


def release(c: CollectRun, manifest: BatchManifest, members: list[Parked], status: str) -> None:
    """Give the manifest up before any submit: its chunks untagged, to be packed again (or sent on demand)."""
    for m in members:
        c.deps.claims.assign_batch(m.chunk.job_id, m.chunk.chunk_id, m.chunk.fence, None, manifest.token)
    end_manifest(c, manifest, status=status)
    c.report.released.append(manifest.token)


def to_on_demand(c: CollectRun, m: Parked, reason: str, token: str | None = None,
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
