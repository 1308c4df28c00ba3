"""The batch collector's peak memory at the largest batch job it may build.

    .venv/bin/python bench/batch_memory.py [--records N] [--out bench/results/batch_memory.json]

Runs the collector's own code (pipeline/batch_inference_collect.py `collect`, the boto3 adapter adapters/batch_inference.py) in a fresh
process, twice: once packing and submitting a batch job of `--records` records (default: the prod profile's
`batch_max_records`), once collecting it after Bedrock answered every record. Everything the collector would find
in AWS is outside its memory, as on AWS: the pending records, the manifest, the answers and the documents are files
on disk behind the Artifacts port; S3 (the input the adapter uploads with the managed transfer, the output it reads
line by line) is a directory behind a stub `s3` client; the Bedrock control plane is a stub `bedrock` client; the
chunk and job records are the in-memory fakes of the unit tests (on AWS: DynamoDB), loaded before the measure. The
records are the analysts' own locate requests (Converse bodies, no cache point) over 4,000-character chunks of the
samples (prod's chunking), the answers the offline model's tool calls, each with its usage.

Measured per phase: the peak resident set size (VmHWM, reset before the phase through /proc/self/clear_refs) above
the process's resident size before it, and the peak of Python's own allocations (tracemalloc). A Lambda function's
memory must hold the runtime, the imports and the in-memory state too: the figure to size the collector by is the
phase's peak RSS of the whole process, printed and written as `peak_rss_mb` (this process holds the fakes' records
as well, which on AWS are in DynamoDB: an overestimate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from botocore.response import StreamingBody  # noqa: E402

from contract_review.adapters.batch_inference import BedrockBatchInference  # noqa: E402
from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.keys import batch_pending_key, document_key  # noqa: E402
from contract_review.domain.ports import Deps  # noqa: E402
from contract_review.domain.records import ChunkStatus, Inference, Job, JobState, job_id_for
from contract_review.doubles.offline_model import OfflineRuleModel  # noqa: E402
from contract_review.pipeline import batch_inference, batch_inference_collect, batch_inference_run  # noqa: E402
from contract_review.review.analysts import ANALYSTS, build_request  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402
from review_local.batch_service import offline_answer  # noqa: E402
from tests.unit.fakes import SETTINGS, FakeClaims, FakeClock, FakeJobs, FakeModelControl, FakeQueues  # noqa: E402

PROD = get_profile("prod")
CHUNKS_PER_JOB = 100  # a 400 KB contract per job: ~10 jobs at 10,000 records
MB = 1024 * 1024


# ------------------------------------------------------------------------------ AWS outside the process's memory
class DiskArtifacts:
    """The Artifacts port over a directory (on AWS: S3): nothing the collector writes stays in its memory."""

    def __init__(self, root: Path, bucket: str = "artifacts"):
        self.root, self.bucket = root, bucket

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_text(self, key: str, body: str, content_type: str = "application/json") -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")

    def get_text(self, key: str) -> str:
        return self._path(key).read_text(encoding="utf-8")

    def get_text_range(self, key: str, byte_start: int, byte_end: int) -> str:
        return self._path(key).read_bytes()[byte_start:byte_end].decode("utf-8")

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if not base.exists():
            return []
        keys = (str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix))

    def read_uri(self, bucket: str, key: str, max_bytes: int | None = None) -> bytes:
        raise NotImplementedError

    def presign_upload(self, key: str, max_bytes: int, expires_s: int) -> Any:
        raise NotImplementedError


class DiskS3:
    """The calls the batch adapter makes of S3, over a directory: the managed upload reads the stream in parts (as
    boto3's does, 8 MiB at a time), GetObject answers a streaming body over the file."""

    def __init__(self, root: Path):
        self.root = root

    def upload_fileobj(self, fileobj: Any, bucket: str, key: str, ExtraArgs: Any = None,  # noqa: N803 (boto3's)
                       Config: Any = None) -> None:  # noqa: N803
        path = self.root / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            while part := fileobj.read(8 * MB):
                out.write(part)

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        path = self.root / Bucket / Key
        return {"Body": StreamingBody(path.open("rb"), path.stat().st_size)}

    def get_paginator(self, _name: str) -> Any:
        root = self.root

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> Iterator[dict[str, Any]]:  # noqa: N803
                base = root / Bucket
                keys = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
                yield {"Contents": [{"Key": k} for k in keys if k.startswith(Prefix)]}
        return Pages()


class StubBedrock:
    """CreateModelInvocationJob / GetModelInvocationJob: a job that is Completed as soon as its output is written."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}

    def create_model_invocation_job(self, **request: Any) -> dict[str, str]:
        arn = f"arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/{len(self.jobs):012d}"
        self.jobs[arn] = {**request, "jobArn": arn, "status": "InProgress"}
        return {"jobArn": arn}

    def get_model_invocation_job(self, jobIdentifier: str) -> dict[str, Any]:  # noqa: N803
        return self.jobs[jobIdentifier]


class CountingQueues(FakeQueues):
    """Analysis messages counted, not kept (on AWS they are in SQS)."""

    def send_analysis(self, messages: Any, delay_s: int = 0) -> None:
        self.analysis_sent = getattr(self, "analysis_sent", 0) + len(messages)


# ------------------------------------------------------------------------------ the world
def _text() -> str:
    samples = sorted((ROOT / "samples").glob("*.txt"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in samples)


def build(root: Path, records: int) -> tuple[Deps, BedrockBatchInference, DiskS3]:
    """Jobs whose chunks are parked awaiting a batch (each chunk's 11 locate requests in its pending file), `records`
    records in all: the state a collect finds."""
    clock = FakeClock()
    settings = SETTINGS.model_copy(update={
        "profile": PROD.with_overrides(batch_min_records=1, batch_max_records=records), "model_provider": "bedrock"})
    artifacts = DiskArtifacts(root / "artifacts")
    s3 = DiskS3(root / "s3")
    adapter = BedrockBatchInference(StubBedrock(), s3, bucket="artifacts", prefix="batch", role_arn="arn:role",
                                    model_id=settings.effective_model_id, stack_tag="bench")
    jobs = FakeJobs(clock)
    claims = FakeClaims(clock, artifacts)  # type: ignore[arg-type]  # the fake's artifacts: on disk here
    jobs.claims = claims
    deps = Deps(settings=settings, jobs=jobs, claims=claims, artifacts=artifacts,  # type: ignore[arg-type]  # disk-backed stand-ins of the ports
                queues=CountingQueues(clock), clock=clock, model_control=FakeModelControl(), batch_inference=adapter)
    base = _text()
    made, n = 0, 0
    while made < records:
        text = f"Contract {n}.\n\n" + (base * 20)[: CHUNKS_PER_JOB * PROD.review.chunk_target_chars]
        key = f"bench-{n}"
        job_id = job_id_for(key)
        chunks = chunk_document(text, PROD.review)
        artifacts.put_text(document_key(job_id), text)
        now = clock()
        jobs.create(Job(job_id=job_id, state=JobState.RUNNING, created_at=now, updated_at=now, idempotency_key=key,
                        document_key=document_key(job_id), chunk_count=len(chunks), model_id=settings.effective_model_id,
                        inference=Inference.BATCH, deadline_at=now + 72 * 3600))
        for chunk in chunks:
            if made >= records:
                break
            reqs = [batch_inference.record_for(job_id, chunk.chunk_id, build_request(spec, "locate", chunk, None, None),
                                               settings.effective_model_id)
                    for spec in ANALYSTS][: records - made]
            pending = batch_pending_key(job_id, chunk.chunk_id, 1)
            artifacts.put_text(pending, "".join(json.dumps({"recordId": r.record_id, "modelInput": r.model_input},
                                                           separators=(",", ":")) + "\n" for r in reqs))
            claims.create(ChunkRecord(job_id=job_id, chunk_id=chunk.chunk_id, chunk_index=chunk.index,
                                      start=chunk.start, end=chunk.end, status=ChunkStatus.AWAITING_BATCH, fence=1,
                                      batch_pending_key=pending, batch_records=len(reqs), batch_since=now))
            made += len(reqs)
        n += 1
    return deps, adapter, s3


def answer_all(adapter: BedrockBatchInference, s3: DiskS3, arn: str) -> int:
    """Bedrock's side: every record of the job's input answered by the offline model, one line each, written line
    by line (never in this process's memory at once); the job Completed. Bytes written."""
    job = adapter.bedrock.jobs[arn]
    answer = offline_answer(OfflineRuleModel())
    in_key = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"].removeprefix("s3://artifacts/") + "records.jsonl"
    out_prefix = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].removeprefix("s3://artifacts/")
    out = s3.root / "artifacts" / out_prefix / arn.rsplit("/", 1)[-1] / "records.jsonl.out"
    out.parent.mkdir(parents=True, exist_ok=True)
    with (s3.root / "artifacts" / in_key).open("rb") as src, out.open("w", encoding="utf-8") as dst:
        for raw in src:
            line = json.loads(raw)
            body, _, _ = answer(line["modelInput"], "Converse")
            dst.write(json.dumps({**line, "modelOutput": body}) + "\n")
    job["status"] = "Completed"
    return out.stat().st_size


# ------------------------------------------------------------------------------ measuring
def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _measured(fn: Any) -> dict[str, float]:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    tracemalloc.start()
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = _status("VmHWM")
    return {"rss_before_mb": round(before / MB, 1), "peak_rss_mb": round(peak / MB, 1),
            "peak_rss_above_before_mb": round((peak - before) / MB, 1), "python_peak_mb": round(py_peak / MB, 1),
            "seconds": round(seconds, 1)}


def child(records: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="batch-memory-"))
    try:
        deps, adapter, s3 = build(root, records)
        reports: list[batch_inference_run.CollectReport] = []
        pack = _measured(lambda: reports.append(batch_inference_collect.collect(deps, deps.clock())))
        (token,) = reports[0].submitted
        (arn,) = adapter.bedrock.jobs
        input_bytes = sum(p.stat().st_size for p in (s3.root / "artifacts").rglob("records.jsonl"))
        output_bytes = answer_all(adapter, s3, arn)
        collect = _measured(lambda: reports.append(batch_inference_collect.collect(deps, deps.clock())))
        assert reports[1].collected == [token], reports[1]
        returned = sum(1 for j in deps.jobs.all() for c in deps.claims.for_job(j.job_id)
                       if c.status is ChunkStatus.PENDING)
        return {"records": records, "input_mb": round(input_bytes / MB, 1), "output_mb": round(output_bytes / MB, 1),
                "chunks_returned": returned, "pack_and_submit": pack, "collect": collect}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=PROD.batch.batch_max_records)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "batch_memory.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.records)))
        return
    # a fresh process per measure: nothing of an earlier run in its heap
    done = subprocess.run([sys.executable, __file__, "--child", "--records", str(args.records)], check=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    peak = max(result["pack_and_submit"]["peak_rss_mb"], result["collect"]["peak_rss_mb"])
    doc = {"what": "the batch collector's peak memory at one batch job of `records` records (bench/batch_memory.py)",
           "python": platform.python_version(), "machine": platform.machine(), "profile": "prod",
           "batch_max_records": PROD.batch.batch_max_records, **result, "peak_rss_mb": peak}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.records} records ({result['input_mb']} MB of input, {result['output_mb']} MB of output): "
          f"pack+submit peak RSS {result['pack_and_submit']['peak_rss_mb']} MB "
          f"(+{result['pack_and_submit']['peak_rss_above_before_mb']} MB, Python peak "
          f"{result['pack_and_submit']['python_peak_mb']} MB); collect peak RSS {result['collect']['peak_rss_mb']} MB "
          f"(+{result['collect']['peak_rss_above_before_mb']} MB, Python peak {result['collect']['python_peak_mb']} MB)"
          f" -> {args.out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
