"""Runs THE BASELINE (bench/baseline/handler.py) the way bench/quota.py runs the pipeline: embedded AWS (a
fresh moto server), real worker processes, the simulated Bedrock, the same document, quota, faults and kill.

Its resources are created here with boto3 against the moto server (it is the baseline, not the product's
template), with the product's numbers where the baseline has the same thing: the worker's function timeout
(LOCAL.functions.worker_timeout_s), the analysis queue's visibility timeout (6 x that, AWS's rule for Lambda + SQS)
and maxReceiveCount, batch size 1 and the same number of concurrent workers. The workers are
review_local's sandboxes (the event-source-mapping emulator: poll, invoke with an SQS event and a Lambda
context, delete what the partial batch response does not list, replace a killed process), given a
FunctionSpec for the baseline handler. Intake is the bench: one message per chunk (what the developer's
intake would send); there is no aggregator: the bench counts a chunk done when its findings are in S3.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from botocore.config import Config

from contract_review.config.profile import Profile
from contract_review.doubles.spec import FaultSpec
from contract_review.review.chunking import Chunk, chunk_document
from review_local.embedded import EmbeddedAws
from review_local.runtime import FunctionSpec, LocalRuntime

HANDLER = "bench.baseline.handler.lambda_handler"
NAME = "baseline"


@dataclass
class Resources:
    queue_url: str
    queue_arn: str
    dlq_url: str
    table: str = "baseline-idempotency"
    bucket: str = "baseline-findings"
    prefix: str = "findings"


def _client(aws: EmbeddedAws, service: Any, app_id: str | None) -> Any:
    cfg = Config(user_agent_appid=app_id) if app_id else None  # type: ignore[call-arg]  # botocore >= 1.31 has it; its stubs lag
    return aws.session().client(service, endpoint_url=aws.endpoint, config=cfg)


def create_resources(aws: EmbeddedAws, profile: Profile, observer: str) -> Resources:
    sqs, ddb, s3 = (_client(aws, s, observer) for s in ("sqs", "dynamodb", "s3"))
    dlq_url = sqs.create_queue(QueueName="baseline-chunks-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName="baseline-chunks", Attributes={
        "VisibilityTimeout": str(profile.queues.analysis_visibility_s),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": profile.queues.max_receive_count})},
    )["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    res = Resources(queue_url=url, queue_arn=arn, dlq_url=dlq_url)
    ddb.create_table(TableName=res.table, BillingMode="PAY_PER_REQUEST",
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    s3.create_bucket(Bucket=res.bucket)
    return res


@dataclass
class KillWatch:
    """Reads the model-call ledger; kills (SIGKILL) a baseline worker once the chunk it is on has at least
    half the calls it needs done (mid-chunk), and says when that chunk's calls resumed in another process."""

    ledger: Path
    needed: dict[str, int]
    offset: int = 0
    ok: Counter[tuple[int, str]] = field(default_factory=Counter)
    current: dict[int, str] = field(default_factory=dict)
    killed: tuple[float, str, int] | None = None  # (at, chunk id, pid)
    resumed_at: float | None = None

    def _read(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        with open(self.ledger) as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[:data.rfind("\n") + 1]
        self.offset += len(complete.encode())
        return [json.loads(x) for x in complete.splitlines() if x.strip()]

    def poll(self, live_pids: list[int], done: set[int], index_of: dict[str, int]) -> None:
        for c in self._read():
            pid, chunk = c["pid"], c["chunk_id"]
            self.current[pid] = chunk
            if c["outcome"] == "ok":
                self.ok[(pid, chunk)] += 1
            if self.killed and chunk == self.killed[1] and pid != self.killed[2] and self.resumed_at is None:
                self.resumed_at = c["started_at"]
        if self.killed is not None:
            return
        for pid in live_pids:
            chunk = self.current.get(pid)
            if chunk is None or index_of[chunk] in done or 2 * self.ok[(pid, chunk)] < self.needed[chunk]:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed = (time.time(), chunk, pid)
            return


def _done(s3: Any, res: Resources) -> set[int]:
    out: set[int] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=res.bucket, Prefix=res.prefix + "/"):
        out.update(int(o["Key"].rsplit("/", 1)[1].split(".")[0]) for o in page.get("Contents", []))
    return out


def _dead_lettered(sqs: Any, res: Resources) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=res.dlq_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def oracle_problems(s3: Any, res: Resources, chunks: list[Chunk], expected: dict[str, list[dict[str, Any]]],
                    done: set[int]) -> list[str]:
    problems = []
    for chunk in chunks:
        if chunk.index not in done:
            problems.append(f"chunk {chunk.index}: no findings (missing)")
            continue
        body = s3.get_object(Bucket=res.bucket, Key=f"{res.prefix}/{chunk.index:06d}.json")["Body"].read()
        if json.loads(body) != expected[chunk.chunk_id]:
            problems.append(f"chunk {chunk.index}: findings differ from the fault-free run")
    return problems


@dataclass
class BaselineRun:
    """What one baseline run measured; bench/quota.py summarizes it like a pipeline run."""

    state: str  # completed | incomplete (chunks dead-lettered or not done by the timeout)
    makespan_s: float
    chunks: int
    chunks_done: int
    dead_lettered: int
    recovery_s: float | None
    oracle: dict[str, Any]
    worker_restarts: int


def run_baseline(*, profile: Profile, spec: FaultSpec, text: str, workers: int, timeout_s: float, state_dir: Path,
                 observer: str, kill: bool, on_start: Any, expected: dict[str, list[dict[str, Any]]],
                 needed_by_chunk: dict[str, int]) -> BaselineRun:
    """One run on a fresh moto server. `on_start()` is called right before the chunks are sent (the bench
    snapshots its request counter there)."""
    aws = EmbeddedAws().start()
    runtime: LocalRuntime | None = None
    try:
        res = create_resources(aws, profile, observer)
        fn = FunctionSpec(logical_id="BaselineChunkFunction", name=NAME, handler=HANDLER,
                          timeout_s=profile.functions.worker_timeout_s, memory_mb=profile.functions.worker_memory_mb,
                          env={"IDEMPOTENCY_TABLE": res.table, "FINDINGS_BUCKET": res.bucket,
                               "FINDINGS_PREFIX": res.prefix, "FAULT_SPEC": spec.to_env(),
                               "ANALYST_COUNT": str(profile.review.analyst_count),
                               "MODEL_READ_TIMEOUT_S": str(profile.tier1.model_call_timeout_s)},
                          queue_url=res.queue_url, queue_arn=res.queue_arn, batch_size=profile.functions.worker_batch_size,
                          report_batch_item_failures=True, concurrency=workers)
        runtime = LocalRuntime(aws, [fn], concurrency={NAME: workers}, log_dir=state_dir / "logs").start()
        s3_seen, sqs_seen = _client(aws, "s3", observer), _client(aws, "sqs", observer)
        intake = _client(aws, "sqs", None)  # the developer's intake: counted
        chunks = chunk_document(text, profile.review)
        index_of = {c.chunk_id: c.index for c in chunks}
        watch = KillWatch(Path(spec.call_log or state_dir / "calls.jsonl"), needed_by_chunk)
        time.sleep(1.0)  # the sandboxes import their handler (the pipeline's are polling when it submits, too)
        on_start()
        t0 = time.monotonic()
        bodies = [json.dumps({"document_id": state_dir.name, "chunk": asdict(c)}) for c in chunks]
        for i in range(0, len(bodies), 10):
            intake.send_message_batch(QueueUrl=res.queue_url, Entries=[
                {"Id": str(n), "MessageBody": b} for n, b in enumerate(bodies[i:i + 10])])
        done: set[int] = set()
        dead = 0
        last_dlq_check = 0.0
        while time.monotonic() - t0 < timeout_s:
            done = _done(s3_seen, res)
            if kill:
                watch.poll(runtime.pids(NAME), done, index_of)
            if time.monotonic() - last_dlq_check > 1.0:
                dead, last_dlq_check = _dead_lettered(sqs_seen, res), time.monotonic()
            if len(done) + dead >= len(chunks):
                break
            time.sleep(0.2)
        makespan = time.monotonic() - t0
        if kill:
            watch.poll([], done, index_of)
        recovery = (round(watch.resumed_at - watch.killed[0], 2)
                    if watch.killed and watch.resumed_at else None)
        problems = oracle_problems(s3_seen, res, chunks, expected, done)
        return BaselineRun(state="completed" if len(done) == len(chunks) else "incomplete",
                           makespan_s=makespan, chunks=len(chunks), chunks_done=len(done), dead_lettered=dead,
                           recovery_s=recovery,
                           oracle={"problems": problems, "silently_incomplete": len(done) < len(chunks)},
                           worker_restarts=sum(b.restarts for b in runtime.sandboxes))
    finally:
        if runtime is not None:
            runtime.stop()
        aws.stop()


def expected_by_chunk(oracle: Any) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """From tests/oracle.py's fault-free run: each chunk's findings as the baseline writes them, and the
    calls it needs."""
    findings = {c.chunk_id: [f.model_dump(mode="json") for f in c.findings] for c in oracle}
    needed = defaultdict(int, {c.chunk_id: c.model_calls for c in oracle})
    return findings, needed
