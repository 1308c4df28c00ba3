"""Bedrock batch inference through boto3 (`BatchInference`, domain/ports.py; docs/batch-inference.md).

Nothing holds a whole batch job in memory: `put_input` streams the records, one JSONL line at a time, into a spooled
temporary file (in memory up to SPOOL_MAX_BYTES, then on the function's ephemeral storage) and uploads it with boto3's
managed transfer (`upload_fileobj`: multipart parts of 8 MiB); `submit` creates a model invocation job reading it
(`CreateModelInvocationJob`, the token as `clientRequestToken`: the same token again returns the first job; tagged
with the stack's tag when one is set); `status` is `GetModelInvocationJob`; `results` reads every `*.jsonl.out` file
Bedrock wrote under `<output prefix>/<job id>/` line by line (`iter_lines` on the body), one outcome per line (their
order is not guaranteed; the caller joins them on recordId, and knows what it submitted from its manifest);
`stop` is `StopModelInvocationJob`. Locally the `bedrock` client points at the stand-in
(review_local/batch_service.py) through `endpoint_url`, and the `s3` client at moto.

Layout in the bucket (one folder per token, so a retried put rewrites the same object):
    <prefix>/input/<token>/records.jsonl
    <prefix>/output/<token>/<job id>/records.jsonl.out, manifest.json.out
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from boto3.s3.transfer import TransferConfig

from contract_review.domain.batch_inference import (
    CONVERSE,
    HAS_OUTPUT,
    BatchJobState,
    BatchJobStatus,
    BatchRecord,
    RecordOutcome,
)
from contract_review.domain.errors import ReviewError

INPUT_FILE = "records.jsonl"
STACK_TAG_KEY = "review-stack"  # the tag every batch job carries (Settings.stack_tag): the Stop grant names it
SPOOL_MAX_BYTES = 8 * 1024 * 1024  # a job's input stays in memory up to this, then goes to ephemeral storage
# the managed transfer's multipart parts (S3's minimum part is 5 MiB) and the threads uploading them
TRANSFER = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=2)
LINE_CHUNK_BYTES = 64 * 1024  # how much of an output file is read at a time (its lines are returned one by one)
JOB_NAME_MAX = 63  # CreateModelInvocationJob jobName: [a-zA-Z0-9](-*[a-zA-Z0-9+\-.])*, 1 to 63 characters


def job_id_of(job_arn: str) -> str:
    """The id at the end of a job ARN (arn:aws:bedrock:REGION:ACCOUNT:model-invocation-job/ID): the folder Bedrock
    writes the job's output under."""
    return job_arn.rsplit("/", 1)[-1]


class BedrockBatchInference:
    def __init__(self, bedrock: Any, s3: Any, *, bucket: str, prefix: str, role_arn: str, model_id: str,
                 invocation_type: str = CONVERSE, timeout_hours: int = 24, job_name_prefix: str = "review",
                 read_min_records: Callable[[], int | None] = lambda: None, stack_tag: str = ""):
        self.bedrock = bedrock  # boto3 "bedrock" (the control plane), not "bedrock-runtime"
        self.s3 = s3
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.role_arn = role_arn
        self.model_id = model_id
        self.invocation_type = invocation_type
        self.timeout_hours = timeout_hours
        self.job_name_prefix = job_name_prefix
        self.stack_tag = stack_tag  # tags=[{"key": "review-stack", "value": stack_tag}] at create ("": untagged)
        self._read_min_records = read_min_records  # Service Quotas (wiring.batch_min_records), read once
        self._min_records: tuple[int | None] | None = None

    def min_records(self) -> int | None:
        if self._min_records is None:
            self._min_records = (self._read_min_records(),)
        return self._min_records[0]

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _input_prefix(self, token: str) -> str:
        return f"{self.prefix}/input/{token}/"

    def put_input(self, token: str, records: Iterable[BatchRecord]) -> int:
        seen: set[str] = set()
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
            for r in records:
                if r.record_id in seen:
                    raise ReviewError.of("batch.request_invalid", "two records share a recordId")
                seen.add(r.record_id)
                spool.write(json.dumps({"recordId": r.record_id, "modelInput": r.model_input},
                                       separators=(",", ":")).encode("utf-8") + b"\n")
            spool.seek(0)
            self.s3.upload_fileobj(spool, self.bucket, self._input_prefix(token) + INPUT_FILE,
                                   ExtraArgs={"ContentType": "application/jsonl", "ServerSideEncryption": "AES256"},
                                   Config=TRANSFER)
        return len(seen)

    def submit(self, token: str) -> str:
        extra: dict[str, Any] = {"tags": [{"key": STACK_TAG_KEY, "value": self.stack_tag}]} if self.stack_tag else {}
        resp = self.bedrock.create_model_invocation_job(
            jobName=f"{self.job_name_prefix}-{token}"[:JOB_NAME_MAX].rstrip("-"),
            clientRequestToken=token,
            roleArn=self.role_arn,
            modelId=self.model_id,
            modelInvocationType=self.invocation_type,
            timeoutDurationInHours=self.timeout_hours,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": self._uri(self._input_prefix(token)),
                                                   "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": self._uri(f"{self.prefix}/output/{token}/")}},
            **extra,
        )
        return str(resp["jobArn"])

    def stop(self, job_id: str) -> None:
        self.bedrock.stop_model_invocation_job(jobIdentifier=job_id)

    def _job(self, job_id: str) -> dict[str, Any]:
        return dict(self.bedrock.get_model_invocation_job(jobIdentifier=job_id))

    def status(self, job_id: str) -> BatchJobState:
        job = self._job(job_id)
        return BatchJobState(job_id=str(job["jobArn"]), status=BatchJobStatus(job["status"]),
                             message=str(job.get("message", "")), total=job.get("totalRecordCount"),
                             processed=job.get("processedRecordCount"), succeeded=job.get("successRecordCount"),
                             errored=job.get("errorRecordCount"))

    def results(self, job_id: str) -> Iterator[RecordOutcome]:
        job = self._job(job_id)
        status = BatchJobStatus(job["status"])
        if status not in HAS_OUTPUT:
            raise ReviewError.of("batch.job_failed", f"batch job status {status.value}",
                                 provider_code=status.value)
        out_bucket, out_prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        folder = f"{out_prefix.rstrip('/')}/{job_id_of(str(job['jobArn']))}/" if out_prefix else \
            f"{job_id_of(str(job['jobArn']))}/"
        for key in self._keys(out_bucket, folder, ".jsonl.out"):
            body = self.s3.get_object(Bucket=out_bucket, Key=key)["Body"]
            for line in body.iter_lines(chunk_size=LINE_CHUNK_BYTES):
                if line.strip():
                    yield _outcome(json.loads(line))

    def _keys(self, bucket: str, prefix: str, suffix: str) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", []) if str(o["Key"]).endswith(suffix)]
        return sorted(keys)


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _outcome(line: dict[str, Any]) -> RecordOutcome:
    rid = str(line["recordId"])
    if "modelOutput" in line:
        return RecordOutcome(rid, output=dict(line["modelOutput"]))
    error = line.get("error") or {}
    return RecordOutcome(rid, error_code=str(error.get("errorCode", "unknown")),
                         error_message=str(error.get("errorMessage", "")))
