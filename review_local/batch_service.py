"""A local stand-in (a fake) for Amazon Bedrock batch inference: moto has no model invocation jobs.

boto3's `bedrock` client talks to it through `endpoint_url`, over HTTP, with the service's own REST-JSON interface
(botocore `bedrock` 2023-04-20); only the four batch operations are served:

- `POST /model-invocation-job` CreateModelInvocationJob: jobName, roleArn, modelId, inputDataConfig /
  outputDataConfig (S3 URIs), timeoutDurationInHours (24 to 168), modelInvocationType (InvokeModel, the default,
  or Converse), clientRequestToken: the same token again returns the first job's ARN and creates nothing (the
  docs: "If this token matches a previous request, Amazon Bedrock ignores the request, but does not return an
  error"). Another job of the same name with another token: ConflictException (assumed, not documented).
- `GET /model-invocation-job/{arn}` GetModelInvocationJob; `GET /model-invocation-jobs` ListModelInvocationJobs
  (statusEquals, nameContains, maxResults, nextToken); `POST /model-invocation-job/{arn}/stop`
  StopModelInvocationJob (Stopping, then Stopped, with the output of the records answered before the stop; a job
  that has ended: ValidationException).

A job walks Submitted -> Validating -> Scheduled -> InProgress -> Completed | PartiallyCompleted, one status every
`step_s` seconds, on its own thread. Validating reads the `.jsonl` files under the input URI from S3 (the `s3`
client given: moto) and fails the job (`Failed`, with a message) when it holds fewer records than `min_records`
(the Service Quota "Minimum number of records per batch inference job", 100 by default) or a line is not JSON.
InProgress answers each record with the offline rule model and writes, under `<output URI>/<job id>/`, one
`<input file>.out` per input file (`{"recordId", "modelInput", "modelOutput"}` or `{..., "error": {"errorCode",
"errorMessage"}}` lines, in shuffled order: Bedrock does not keep the input order) and `manifest.json.out`
(totalRecordCount, processedRecordCount, successRecordCount, errorRecordCount, inputTokenCount, outputTokenCount).
Record format: https://docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-data.html and
https://docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-results.html (docs/batch-inference.md).

The offline model reads a request's structured payload; a batch record carries only the Converse (or Anthropic
Messages) body, so `analyst_request` reads back what the analysts put in it (the excerpt block, the analyst's
categories and step, the located clauses) as a model would. A record that is not an analyst's request is
answered with a record error (400).

Injectable failures (`BatchFaults`): records answered with an error (by recordId, or a seeded share), records
left out of the output (missing), a whole job that fails (in Validating or InProgress) or expires (after answering
half its records: their output written, as Bedrock writes and bills the records processed before), and every create
refused (`refuse_create`: ValidationException by default, as for a model or profile not offered in batch).
"""

from __future__ import annotations

import json
import random
import re
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract_review.domain.model import ModelRequest
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel

ACCOUNT = "123456789012"
REGION = "us-east-1"
MIN_RECORDS = 100  # the default of the Service Quota "Minimum number of records per batch inference job"
TIMEOUT_HOURS = (24, 168)  # timeoutDurationInHours: the range CreateModelInvocationJob accepts
ACTIVE = ("Submitted", "Validating", "Scheduled", "InProgress", "Stopping")
_ROLE_ARN = re.compile(r"^arn:aws(-[^:]+)?:iam::\d{12}:role/.+$")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9+\-.])*$")


class BatchFaults(BaseModel):
    """What goes wrong in the jobs created from now on."""

    model_config = ConfigDict(extra="forbid")

    fail_records: list[str] = Field(default_factory=list)  # these recordIds are answered with an error
    fail_rate: float = Field(0.0, ge=0.0, le=1.0)  # and this seeded share of the others
    drop_records: list[str] = Field(default_factory=list)  # these have no line in the output at all
    fail_job: Literal["", "validating", "in_progress"] = ""  # the whole job fails there
    # the job runs out of time in InProgress (Expired) after answering the first half of its records: their output is
    # written (Bedrock writes and bills the records processed before the timeout), the others have no line
    expire_job: bool = False
    # the job holds in InProgress after answering this many records, until it is stopped (a stop landing mid-way:
    # Stopped, with the output of the records answered before it)
    hold_after_records: int | None = None
    error_code: int = 500  # the errorCode of a failed record
    seed: int = 7
    # every CreateModelInvocationJob is refused with this error code (nothing created), as Bedrock refuses a model or
    # inference profile it does not offer in batch (ValidationException), a role it may not use (AccessDenied), a
    # used-up job quota (ServiceQuotaExceededException), or answers ThrottlingException / a 5xx; "": none
    refuse_create: str = ""

    @classmethod
    def parse(cls, spec: str) -> BatchFaults:
        """`review up --batch-faults SPEC`: comma-separated names, e.g. `refuse_create` (ValidationException: the
        model is not offered in batch), `refuse_create=AccessDeniedException`, `expire_job`, `fail_job=in_progress`,
        `fail_rate=0.2`. Raises ValueError for a name or value it does not know."""
        fields: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            if name == "refuse_create":
                fields[name] = value or "ValidationException"
                if fields[name] not in _REFUSALS:
                    raise ValueError(f"refuse_create: one of {', '.join(sorted(_REFUSALS))}")
            elif name == "expire_job":
                fields[name] = True
            elif name in ("fail_job", "fail_rate", "seed") and value:
                fields[name] = value
            else:
                raise ValueError(f"unknown batch fault {item!r}: refuse_create[=CODE], expire_job, "
                                 "fail_job=validating|in_progress, fail_rate=R, seed=N")
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:  # one line: the first field and what it must be
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"bad batch fault {where}={first.get('input')!r}: {first['msg']}") from exc


# what `refuse_create` may answer: the status Bedrock's CreateModelInvocationJob answers each with
_REFUSALS = {"ValidationException": 400, "AccessDeniedException": 403, "ResourceNotFoundException": 404,
             "ServiceQuotaExceededException": 400, "ThrottlingException": 429, "InternalServerException": 500,
             "ServiceUnavailableException": 503}


# --- reading an analyst's request back out of a Converse / Messages body ------------------------------------
_STEP = re.compile(r"Step (locate|assess):")
_ANALYST = re.compile(r"You are the (\S+) analyst\.")
_CATEGORIES = "Your categories: "
_CLAUSES = "Located clauses: "


def _texts(model_input: dict[str, Any]) -> tuple[str, list[str]]:
    """The system prompt and the user message's text blocks, Converse or Anthropic Messages."""
    system = model_input.get("system", "")
    if isinstance(system, list):
        system = "".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    messages = model_input.get("messages") or [{}]
    content = messages[-1].get("content", [])
    if isinstance(content, str):
        return str(system), [content]
    return str(system), [str(b["text"]) for b in content if isinstance(b, dict) and "text" in b]


def _json_after(text: str, marker: str) -> Any:
    at = text.find(marker)
    if at < 0:
        return None
    value, _ = json.JSONDecoder().raw_decode(text, at + len(marker))
    return value


def _tool(model_input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The answer tool's name and input schema (Converse toolConfig, or Messages tools)."""
    tools = (model_input.get("toolConfig") or {}).get("tools") or []
    if tools:
        spec = tools[0].get("toolSpec", {})
        return str(spec.get("name", "")), dict((spec.get("inputSchema") or {}).get("json") or {})
    tools = model_input.get("tools") or []
    if tools:
        return str(tools[0].get("name", "")), dict(tools[0].get("input_schema") or {})
    return "", {}


def analyst_request(model_input: dict[str, Any]) -> ModelRequest | None:
    """The ModelRequest an analyst built this body from (review/analysts.py build_request), or None."""
    system, texts = _texts(model_input)
    if len(texts) < 2 or not texts[0].startswith("<excerpt"):
        return None
    context, prompt = texts[0], texts[-1]
    step, analyst = _STEP.search(prompt), _ANALYST.search(prompt)
    keys = _json_after(prompt, _CATEGORIES)
    if step is None or analyst is None or not isinstance(keys, list):
        return None
    chunk_text = context.split("\n", 1)[1].rsplit("\n", 1)[0]
    payload: dict[str, Any] = {"categories": [{"key": k} for k in keys], "chunk_text": chunk_text}
    if step.group(1) == "assess":
        payload["clauses"] = _json_after(prompt, _CLAUSES) or []
    max_tokens = (model_input.get("inferenceConfig") or {}).get("maxTokens") or model_input.get("max_tokens") or 2048
    return ModelRequest(analyst=analyst.group(1), step=step.group(1), system=system, prompt=prompt, payload=payload,
                        output_schema=_tool(model_input)[1], context=context, max_tokens=int(max_tokens))


Answer = Callable[[dict[str, Any], str], tuple[dict[str, Any], int, int]]


def offline_answer(model: OfflineRuleModel) -> Answer:
    """Answers a record's modelInput, in the job's invocation type's format, with the offline rule model:
    (modelOutput, input tokens, output tokens). Raises ValueError for a body that is not an analyst's request."""

    def answer(model_input: dict[str, Any], invocation_type: str) -> tuple[dict[str, Any], int, int]:
        request = analyst_request(model_input)
        if request is None:
            raise ValueError("not an analyst's request")
        response = model.invoke(request)
        tool_name = _tool(model_input)[0] or "record_answer"
        answer_input = json.loads(response.text)
        tokens_in, tokens_out = response.input_tokens + response.cache_read_tokens + response.cache_write_tokens, \
            response.output_tokens
        if invocation_type == "Converse":
            return ({"output": {"message": {"role": "assistant", "content": [
                        {"toolUse": {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": tool_name,
                                     "input": answer_input}}]}},
                     "stopReason": "tool_use",
                     "usage": {"inputTokens": tokens_in, "outputTokens": tokens_out,
                               "totalTokens": tokens_in + tokens_out},
                     "metrics": {"latencyMs": 0}}, tokens_in, tokens_out)
        return ({"id": f"msg_bdrk_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                 "model": model.model_id,
                 "content": [{"type": "tool_use", "id": f"toolu_bdrk_{uuid.uuid4().hex[:24]}", "name": tool_name,
                              "input": answer_input}],
                 "stop_reason": "tool_use", "stop_sequence": None,
                 "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}}, tokens_in, tokens_out)

    return answer


# --- the service ------------------------------------------------------------------------------------------
@dataclass
class Job:
    arn: str
    request: dict[str, Any]
    status: str = "Submitted"
    message: str = ""
    submit_time: datetime = field(default_factory=lambda: datetime.now(UTC))
    last_modified: datetime = field(default_factory=lambda: datetime.now(UTC))
    end_time: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    faults: BatchFaults = field(default_factory=BatchFaults)
    statuses: list[str] = field(default_factory=lambda: ["Submitted"])  # every status it went through
    tokens: tuple[int, int] = (0, 0)  # the input and output tokens of the records answered so far

    @property
    def job_id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    def describe(self) -> dict[str, Any]:
        r = self.request
        out: dict[str, Any] = {
            "jobArn": self.arn, "jobName": r["jobName"], "modelId": r["modelId"], "roleArn": r["roleArn"],
            "status": self.status, "submitTime": _iso(self.submit_time), "lastModifiedTime": _iso(self.last_modified),
            "inputDataConfig": r["inputDataConfig"], "outputDataConfig": r["outputDataConfig"],
            "timeoutDurationInHours": r.get("timeoutDurationInHours", 24),
            "modelInvocationType": r.get("modelInvocationType", "InvokeModel"), **self.counts}
        if r.get("clientRequestToken"):
            out["clientRequestToken"] = r["clientRequestToken"]
        if self.message:
            out["message"] = self.message
        if self.end_time is not None:
            out["endTime"] = _iso(self.end_time)
        return out


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ServiceError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ServiceError(400, "ValidationException", f"not an S3 URI: {uri}")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class BedrockBatchStandIn:
    """The stand-in: `with BedrockBatchStandIn(s3) as fake: boto3.client("bedrock", endpoint_url=fake.url)`."""

    def __init__(self, s3: Any, *, step_s: float = 0.05, min_records: int = MIN_RECORDS,
                 answer: Answer | None = None, faults: BatchFaults | None = None, port: int = 0):
        self.s3 = s3
        self.step_s = step_s
        self.min_records = min_records
        self.answer = answer or offline_answer(OfflineRuleModel(SimulatedPromptCache(min_tokens=10**9)))
        self.faults = faults or BatchFaults()
        self.jobs: dict[str, Job] = {}  # by ARN, in creation order
        self.tokens: dict[str, str] = {}  # clientRequestToken -> ARN
        self.lock = threading.RLock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.fake = self
        self._serve: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> BedrockBatchStandIn:
        self._serve = threading.Thread(target=self._server.serve_forever, name="batch-service-fake", daemon=True)
        self._serve.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    # ------------------------------------------------------------------------------------ the operations
    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        for name in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
            if not body.get(name):
                raise ServiceError(400, "ValidationException", f"{name} is required")
        if not _JOB_NAME.match(body["jobName"]) or len(body["jobName"]) > 63:
            raise ServiceError(400, "ValidationException", "jobName does not match the pattern")
        if not _ROLE_ARN.match(body["roleArn"]):
            raise ServiceError(400, "ValidationException", "roleArn is not an IAM role ARN")
        hours = int(body.get("timeoutDurationInHours", 24))
        if not TIMEOUT_HOURS[0] <= hours <= TIMEOUT_HOURS[1]:
            raise ServiceError(400, "ValidationException", "timeoutDurationInHours must be 24 to 168")
        if body.get("modelInvocationType", "InvokeModel") not in ("InvokeModel", "Converse"):
            raise ServiceError(400, "ValidationException", "modelInvocationType must be InvokeModel or Converse")
        _split(body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        _split(body["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        for tag in body.get("tags") or []:
            if not isinstance(tag, dict) or not tag.get("key") or "value" not in tag:
                raise ServiceError(400, "ValidationException", "a tag is {key, value}")
        token = body.get("clientRequestToken") or ""
        with self.lock:
            if token and token in self.tokens:
                return {"jobArn": self.tokens[token]}  # the same token: the first answer, nothing created
            if self.faults.refuse_create:
                code = self.faults.refuse_create
                raise ServiceError(_REFUSALS.get(code, 400), code, f"{body['modelId']} refused (injected)")
            if any(j.request["jobName"] == body["jobName"] for j in self.jobs.values()):
                raise ServiceError(409, "ConflictException", f"a job named {body['jobName']} exists")
            arn = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{uuid.uuid4().hex[:12]}"
            job = Job(arn=arn, request=dict(body), faults=self.faults.model_copy(deep=True))
            self.jobs[arn] = job
            if token:
                self.tokens[token] = arn
            thread = threading.Thread(target=self._run, args=(job,), name=f"batch-job-{job.job_id}", daemon=True)
            self._threads.append(thread)
        thread.start()
        return {"jobArn": arn}

    def job(self, identifier: str) -> Job:
        with self.lock:
            job = self.jobs.get(identifier) or next(
                (j for j in self.jobs.values() if identifier in (j.job_id, j.request["jobName"])), None)
        if job is None:
            raise ServiceError(404, "ResourceNotFoundException", "no such model invocation job")
        return job

    def list_jobs(self, query: dict[str, str]) -> dict[str, Any]:
        with self.lock:
            jobs = [j for j in self.jobs.values()
                    if (not query.get("statusEquals") or j.status == query["statusEquals"])
                    and query.get("nameContains", "") in j.request["jobName"]]
        if query.get("sortOrder", "Descending") == "Descending":
            jobs.reverse()
        start = int(query.get("nextToken") or 0)
        size = int(query.get("maxResults") or 1000)
        page = jobs[start:start + size]
        out: dict[str, Any] = {"invocationJobSummaries": [j.describe() for j in page]}
        if start + size < len(jobs):
            out["nextToken"] = str(start + size)
        return out

    def stop(self, identifier: str) -> None:
        job = self.job(identifier)
        with self.lock:
            if job.status not in ACTIVE:
                raise ServiceError(400, "ValidationException", f"the job has ended ({job.status})")
            self._set(job, "Stopping")
            job.stop.set()

    # ------------------------------------------------------------------------------------ a job's life
    def _set(self, job: Job, status: str, message: str = "") -> None:
        with self.lock:
            job.status = status
            job.statuses.append(status)
            job.last_modified = datetime.now(UTC)
            if message:
                job.message = message
            if status not in ACTIVE:
                job.end_time = job.last_modified

    def _wait(self, job: Job) -> bool:
        """One step's delay; False when the job was stopped (then Stopped) or the fake is closing."""
        if job.stop.wait(self.step_s) or self._stopping.is_set():
            self._set(job, "Stopped")
            return False
        return True

    def _run(self, job: Job) -> None:
        try:
            self._walk(job)
        except Exception as exc:  # noqa: BLE001  # the fake's own defect or S3's: the job Fails, as Bedrock's would
            self._set(job, "Failed", f"internal error: {type(exc).__name__}")

    def _walk(self, job: Job) -> None:
        faults = job.faults
        if not self._wait(job):
            return
        self._set(job, "Validating")
        files = self._read_input(job)
        records = [r for _, lines in files for r in lines]
        bad = sum(1 for r in records if r is None)
        if faults.fail_job == "validating":
            return self._set(job, "Failed", "validation failed (injected)")
        if bad:
            return self._set(job, "Failed", f"{bad} lines of the input are not JSON records with a modelInput")
        if len(records) < self.min_records:
            return self._set(job, "Failed", f"the job has {len(records)} records; the minimum per batch inference "
                                            f"job is {self.min_records}")
        with self.lock:
            job.counts = {"totalRecordCount": len(records), "processedRecordCount": 0, "successRecordCount": 0,
                          "errorRecordCount": 0}
        for status in ("Scheduled", "InProgress"):
            if not self._wait(job):
                return
            self._set(job, status)
        if faults.fail_job == "in_progress":
            return self._set(job, "Failed", "the job failed in progress (injected)")
        rng = random.Random(faults.seed)
        # how many it answers before it ends early: half, when it expires; until a stop, when it holds
        until = len(records) // 2 if faults.expire_job else faults.hold_after_records
        outputs: dict[str, list[dict[str, Any]]] = {}
        ended = ""  # "Expired" or "Stopped": it ended before answering every record
        for name, lines in files:
            out_lines = outputs.setdefault(name, [])
            for record in lines:
                assert record is not None
                if until is not None and job.counts["processedRecordCount"] >= until:
                    ended = "Expired" if faults.expire_job else self._held(job)
                    break
                self._answer_one(job, record, rng, out_lines)
            if ended:
                break
        self._write_output(job, outputs, rng)
        if ended == "Expired":
            return self._set(job, "Expired", "the job did not finish within its timeoutDurationInHours")
        if ended:
            return self._set(job, "Stopped")
        if not self._wait(job):
            return
        self._set(job, "PartiallyCompleted" if job.counts["errorRecordCount"]
                  or len(records) > job.counts["processedRecordCount"] else "Completed")

    def _write_output(self, job: Job, outputs: dict[str, list[dict[str, Any]]], rng: random.Random) -> None:
        """The records answered (all, or those before it ended early): one `.out` per input file, and the manifest."""
        out_bucket, out_prefix = _split(job.request["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        folder = f"{out_prefix.rstrip('/')}/{job.job_id}/" if out_prefix.strip("/") else f"{job.job_id}/"
        for name, out_lines in outputs.items():
            rng.shuffle(out_lines)  # Bedrock does not keep the input order
            self.s3.put_object(Bucket=out_bucket, Key=f"{folder}{name}.out",
                               Body="".join(json.dumps(x) + "\n" for x in out_lines).encode())
        manifest = {**job.counts, "inputTokenCount": job.tokens[0], "outputTokenCount": job.tokens[1]}
        self.s3.put_object(Bucket=out_bucket, Key=f"{folder}manifest.json.out", Body=json.dumps(manifest).encode())

    def _answer_one(self, job: Job, record: dict[str, Any], rng: random.Random, out: list[dict[str, Any]]) -> None:
        """One record answered (or failed, or left out), its output line added to `out`, the job's counts moved."""
        faults, rid = job.faults, record["recordId"]
        if rid in faults.drop_records:
            return
        line: dict[str, Any] = {"recordId": rid, "modelInput": record["modelInput"]}
        if rid in faults.fail_records or rng.random() < faults.fail_rate:
            line["error"] = {"errorCode": faults.error_code, "errorMessage": "model error (injected)"}
        else:
            try:
                line["modelOutput"], t_in, t_out = self.answer(record["modelInput"],
                                                               job.request.get("modelInvocationType", "InvokeModel"))
                job.tokens = (job.tokens[0] + t_in, job.tokens[1] + t_out)
            except ValueError as exc:
                line["error"] = {"errorCode": 400, "errorMessage": str(exc)}
        out.append(line)
        with self.lock:
            job.counts["processedRecordCount"] += 1
            job.counts["successRecordCount" if "modelOutput" in line else "errorRecordCount"] += 1

    def _held(self, job: Job) -> str:
        """Hold (`hold_after_records`) until a stop (or the fake's close): "Stopped"."""
        while not job.stop.wait(self.step_s) and not self._stopping.is_set():
            pass
        return "Stopped"

    def _read_input(self, job: Job) -> list[tuple[str, list[dict[str, Any] | None]]]:
        """(file name relative to the input URI, its records: None for a line that is not a record)."""
        bucket, prefix = _split(job.request["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        if prefix.endswith(".jsonl"):
            keys, base = [prefix], prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        else:
            keys, base = [], prefix
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".jsonl")]
        files = []
        for key in sorted(keys):
            text = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
            records: list[dict[str, Any] | None] = []
            for raw in text.splitlines():
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    records.append(None)
                    continue
                if not isinstance(record, dict) or not isinstance(record.get("modelInput"), dict):
                    records.append(None)
                    continue
                record.setdefault("recordId", "".join(random.choices(string.ascii_uppercase + string.digits, k=11)))
                records.append(record)
            files.append((key[len(base):], records))
        return files


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: BedrockBatchStandIn


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # BaseHTTPRequestHandler's signature
        pass

    @property
    def fake(self) -> BedrockBatchStandIn:
        return self.server.fake

    def _send(self, status: int, body: dict[str, Any], error_type: str = "") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if error_type:
            self.send_header("x-amzn-ErrorType", error_type)
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
            if method == "POST" and parts == ["model-invocation-job"]:
                return self._send(200, self.fake.create(body))
            if method == "GET" and len(parts) == 2 and parts[0] == "model-invocation-job":
                return self._send(200, self.fake.job(parts[1]).describe())
            if method == "POST" and len(parts) == 3 and parts[0] == "model-invocation-job" and parts[2] == "stop":
                self.fake.stop(parts[1])
                return self._send(200, {})
            if method == "GET" and parts == ["model-invocation-jobs"]:
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                return self._send(200, self.fake.list_jobs(query))
            raise ServiceError(404, "UnknownOperationException", f"{method} {url.path} is not served by this fake")
        except ServiceError as err:
            self._send(err.status, {"message": err.message}, err.code)
        except ValueError:
            self._send(400, {"message": "the body is not JSON"}, "ValidationException")

    def do_GET(self) -> None:  # noqa: N802  # http.server's naming
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")


def main() -> None:  # pragma: no cover - `python -m review_local.batch_service S3_ENDPOINT [PORT]` for people
    import sys

    import boto3

    s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name=REGION)
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    with BedrockBatchStandIn(s3, port=port, step_s=1.0) as fake:
        print(f"Bedrock batch inference (local fake) on {fake.url}, S3 at {sys.argv[1]}; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    main()
