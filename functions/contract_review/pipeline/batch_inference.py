"""The batch lane: a job sent with `inference: batch` has its model calls answered by Bedrock batch inference, at
the batch price, within hours (docs/batch-inference.md). This module is the worker's side of it and what the
lane's parts share (the lane's model and whether it is off, the minimum records, a batch job's manifest, the batch
jobs a job's chunks wait in); the collector's side is `batch_inference_collect.py` (following batch jobs to their
end) and `batch_inference_submit.py` (packing and submitting them), over one collect's state
(`batch_inference_run.py`).

A batch-mode chunk goes through the same worker, checkpoints, coverage, report and cost accounting as any other;
only its model calls differ. The worker runs its analysts against the answers its batch jobs already returned
(`Answers`: every answer is replayed, never called again); the first request of an analyst that has no answer yet
(`AwaitBatch`) is written, with the other analysts' first missing ones, to S3 (`batch/pending/`), and the chunk is
parked `awaiting_batch`: nobody holds it and no message is in flight. `locate` and `assess` are two rounds (an
analyst's assess request is only known once its locate answer is back; a repair after an invalid answer is a third).
Batch calls take nothing from the on-demand pacers; the chunk of a job cancelled meanwhile is settled `cancelled` by
the cancel (its batch answers are dropped).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from contract_review.domain.batch_inference import BatchManifest, BatchRecord, BatchStatus, ModelBody
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.control_records import BatchLaneOff
from contract_review.domain.errors import ErrorClass, ErrorEnvelope, ReviewError
from contract_review.domain.keys import batch_manifest_key, batch_pending_key
from contract_review.domain.model import ModelRequest, ModelResponse, traits_for
from contract_review.domain.ports import Deps
from contract_review.domain.records import AttemptStats, ChunkStatus, Inference, Job
from contract_review.model.bedrock import converse_body, converse_response
from contract_review.review.analysts import ParsedItems

DEFAULT_MIN_RECORDS = 100  # Bedrock's default "minimum number of records per batch inference job"


# ------------------------------------------------------------------------------ the worker's side
def record_for(job_id: str, chunk_id: str, request: ModelRequest, model_id: str) -> BatchRecord:
    """The batch record of one model request of a chunk to `model_id`: its Converse body (by the model's catalogue
    row) without a cache point (a batch record reads no prompt cache) under a recordId derived from the job, the chunk and that body: the same request is
    the same record in every process, and a repair (another body) another record."""
    body = converse_body(request, traits_for(model_id), cache_point=False)
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
    model_id: str  # the model the records are for (the bodies follow its catalogue row)
    outputs: dict[str, ModelBody] = field(default_factory=dict)

    @classmethod
    def load(cls, deps: Deps, record: ChunkRecord, model_id: str) -> Answers:
        outputs: dict[str, ModelBody] = {}
        for key in record.batch_answer_keys:
            outputs.update(json.loads(deps.artifacts.get_text(key)))
        return cls(record.job_id, record.chunk_id, model_id, outputs)

    def answer(self, request: ModelRequest) -> tuple[BatchRecord, ModelResponse | None]:
        record = record_for(self.job_id, self.chunk_id, request, self.model_id)
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


def min_records(deps: Deps) -> int:
    """The minimum records per batch job: the profile's, else the account's (Service Quotas, read once), else
    Bedrock's default."""
    service = deps.batch_inference
    return (deps.settings.profile.batch.batch_min_records or (service.min_records() if service else None)
            or DEFAULT_MIN_RECORDS)


def batch_model_id(deps: Deps) -> str:
    """The model rule of the batch lane: a job's batch records go to the stack's batch model (the one every batch job
    is created with: `wiring.build_batch_inference`, the effective model id), whatever model the job was admitted
    under; the lane is judged off for that model, and a batch job's answers are priced with the model its manifest
    names."""
    return deps.settings.effective_model_id


def lane_off(deps: Deps) -> BatchLaneOff | None:
    """Why the batch lane is off for the stack's batch model (`batch_model_id`), from the runtime control; None: on."""
    control = deps.model_control.get() if deps.model_control is not None else None
    return control.batch_lane_off(batch_model_id(deps)) if control is not None else None


def read_manifest(deps: Deps, token: str) -> BatchManifest:
    """A batch job's manifest (written before any chunk names its token, kept after it ends)."""
    return BatchManifest.model_validate_json(deps.artifacts.get_text(batch_manifest_key(token)))


def write_manifest(deps: Deps, manifest: BatchManifest) -> None:
    """Write a batch job's manifest (each step of it written ahead: docs/batch-inference.md)."""
    deps.artifacts.put_text(batch_manifest_key(manifest.token), manifest.model_dump_json())


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
