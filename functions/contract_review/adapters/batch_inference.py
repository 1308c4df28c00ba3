"""Bedrock batch inference through boto3 (`BatchInference`, domain/ports.py; docs/batch-inference.md).

`submit` writes the records as one JSONL file under the batch prefix of the bucket and creates a model invocation
job reading it (`CreateModelInvocationJob`, the token as `clientRequestToken`: the same token again returns the
first job); `status` is `GetModelInvocationJob`; `results` reads every `*.jsonl.out` file Bedrock wrote under
`<output prefix>/<job id>/` and joins the lines on `recordId` (their order is not guaranteed), a submitted record
with no line being MISSING. Locally the `bedrock` client points at the stand-in (review_local/batch_service.py)
through `endpoint_url`, and the `s3` client at moto.

Layout in the bucket (one folder per token, so a retried submit rewrites the same object):
    <prefix>/input/<token>/records.jsonl
    <prefix>/output/<token>/<job id>/records.jsonl.out, manifest.json.out
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from contract_review.domain.batch import (
    CONVERSE,
    HAS_OUTPUT,
    MISSING,
    BatchJobState,
    BatchJobStatus,
    BatchRecord,
    RecordOutcome,
)
from contract_review.domain.errors import ReviewError

INPUT_FILE = "records.jsonl"
JOB_NAME_MAX = 63  # CreateModelInvocationJob jobName: [a-zA-Z0-9](-*[a-zA-Z0-9+\-.])*, 1 to 63 characters


def job_id_of(job_arn: str) -> str:
    """The id at the end of a job ARN (arn:aws:bedrock:REGION:ACCOUNT:model-invocation-job/ID): the folder Bedrock
    writes the job's output under."""
    return job_arn.rsplit("/", 1)[-1]


class BedrockBatchInference:
    def __init__(self, bedrock: Any, s3: Any, *, bucket: str, prefix: str, role_arn: str, model_id: str,
                 invocation_type: str = CONVERSE, timeout_hours: int = 24, job_name_prefix: str = "review",
                 read_min_records: Callable[[], int | None] = lambda: None):
        self.bedrock = bedrock  # boto3 "bedrock" (the control plane), not "bedrock-runtime"
        self.s3 = s3
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.role_arn = role_arn
        self.model_id = model_id
        self.invocation_type = invocation_type
        self.timeout_hours = timeout_hours
        self.job_name_prefix = job_name_prefix
        self._read_min_records = read_min_records  # Service Quotas (wiring.batch_min_records), read once
        self._min_records: tuple[int | None] | None = None

    def min_records(self) -> int | None:
        if self._min_records is None:
            self._min_records = (self._read_min_records(),)
        return self._min_records[0]

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def submit(self, records: Sequence[BatchRecord], token: str) -> str:
        ids = [r.record_id for r in records]
        if len(set(ids)) != len(ids):
            raise ReviewError.of("batch.request_invalid", "two records share a recordId")
        body = "".join(json.dumps({"recordId": r.record_id, "modelInput": r.model_input}, separators=(",", ":"))
                       + "\n" for r in records)
        input_prefix = f"{self.prefix}/input/{token}/"
        self.s3.put_object(Bucket=self.bucket, Key=input_prefix + INPUT_FILE, Body=body.encode("utf-8"),
                           ContentType="application/jsonl", ServerSideEncryption="AES256")
        resp = self.bedrock.create_model_invocation_job(
            jobName=f"{self.job_name_prefix}-{token}"[:JOB_NAME_MAX].rstrip("-"),
            clientRequestToken=token,
            roleArn=self.role_arn,
            modelId=self.model_id,
            modelInvocationType=self.invocation_type,
            timeoutDurationInHours=self.timeout_hours,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": self._uri(input_prefix), "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": self._uri(f"{self.prefix}/output/{token}/")}},
        )
        return str(resp["jobArn"])

    def _job(self, job_id: str) -> dict[str, Any]:
        return dict(self.bedrock.get_model_invocation_job(jobIdentifier=job_id))

    def status(self, job_id: str) -> BatchJobState:
        job = self._job(job_id)
        return BatchJobState(job_id=str(job["jobArn"]), status=BatchJobStatus(job["status"]),
                             message=str(job.get("message", "")), total=job.get("totalRecordCount"),
                             processed=job.get("processedRecordCount"), succeeded=job.get("successRecordCount"),
                             errored=job.get("errorRecordCount"))

    def results(self, job_id: str) -> dict[str, RecordOutcome]:
        job = self._job(job_id)
        status = BatchJobStatus(job["status"])
        if status not in HAS_OUTPUT:
            raise ReviewError.of("batch.job_failed", f"batch job status {status.value}",
                                 provider_code=status.value)
        out_bucket, out_prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        in_bucket, in_prefix = _split(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        submitted = [rid for key in self._keys(in_bucket, in_prefix, ".jsonl")
                     for rid in _record_ids(self._read(in_bucket, key))]
        folder = f"{out_prefix.rstrip('/')}/{job_id_of(str(job['jobArn']))}/" if out_prefix else \
            f"{job_id_of(str(job['jobArn']))}/"
        outcomes: dict[str, RecordOutcome] = {}
        for key in self._keys(out_bucket, folder, ".jsonl.out"):
            for line in self._read(out_bucket, key).splitlines():
                if line.strip():
                    outcome = _outcome(json.loads(line))
                    outcomes[outcome.record_id] = outcome
        for rid in submitted:
            outcomes.setdefault(rid, RecordOutcome(rid, error_code=MISSING,
                                                   error_message="no line for this record in the job's output"))
        return outcomes

    def _keys(self, bucket: str, prefix: str, suffix: str) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", []) if str(o["Key"]).endswith(suffix)]
        return sorted(keys)

    def _read(self, bucket: str, key: str) -> str:
        body: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body.decode("utf-8")


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _record_ids(text: str) -> list[str]:
    return [str(json.loads(line)["recordId"]) for line in text.splitlines() if line.strip()]


def _outcome(line: dict[str, Any]) -> RecordOutcome:
    rid = str(line["recordId"])
    if "modelOutput" in line:
        return RecordOutcome(rid, output=dict(line["modelOutput"]))
    error = line.get("error") or {}
    return RecordOutcome(rid, error_code=str(error.get("errorCode", "unknown")),
                         error_message=str(error.get("errorMessage", "")))
