"""Analysis worker core: claim a chunk, run its analysts with checkpoints, settle it.

The outcome of one delivery is always one of:
- `ack`: the message is done with (chunk finished, settled, requeued fresh, or not ours);
- raise `Tier2`: the record is reported as a batch-item failure and the queue redelivers it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .analysts import AnalystOutput, AnalystSpec, analysts_for, refused_output, run_analyst
from .chunking import Chunk
from .errors import ErrorClass, ErrorEnvelope, LeaseLost, ReviewError, classify
from .messages import AnalysisMessage, ResultMessage
from .models import ModelClient, ModelRequest
from .retry import Retrier, RetryBudget, RetryStats
from .store import SETTLED_CHUNK_STATES, TERMINAL_JOB_STATES, Store

log = logging.getLogger(__name__)


class Tier2(Exception):
    """Hand the record back to the queue (batch-item failure). Carries the envelope."""

    def __init__(self, envelope: ErrorEnvelope, stats: RetryStats | None = None):
        super().__init__(f"{envelope.error_code}: {envelope.message}")
        self.envelope = envelope
        self.stats = stats or RetryStats()


@dataclass
class Delivery:
    """What the queue told us about this receipt of the message."""

    message_id: str
    receipt_handle: str
    receive_count: int
    queue_url: str
    visibility_s: int
    remaining_ms: Callable[[], int] = lambda: 10**9


@dataclass
class Outcome:
    action: str  # done | skipped | requeued | failed | dead_lettered | duplicate | lease_lost | job_failed
    detail: dict[str, Any] = field(default_factory=dict)
    stats: RetryStats = field(default_factory=RetryStats)  # model calls and tier-1 retries of this attempt


class Heartbeat:
    """Extends the claim lease and the message visibility every lease/3 while a chunk is worked."""

    def __init__(self, store: Store, msg: AnalysisMessage, fence: int, delivery: Delivery, lease_s: float):
        self.store, self.msg, self.fence, self.delivery, self.lease_s = store, msg, fence, delivery, lease_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                if not self.store.heartbeat(self.msg.job_id, self.msg.chunk_id, self.fence, self.lease_s):
                    self.lost.set()
                    return
                if self.delivery.receipt_handle:
                    self.store.aws.sqs.change_message_visibility(
                        QueueUrl=self.delivery.queue_url, ReceiptHandle=self.delivery.receipt_handle,
                        VisibilityTimeout=self.delivery.visibility_s)
            except Exception:  # a missed beat is survivable; the next one retries. Logged, not hidden.
                log.warning("heartbeat failed", exc_info=True, extra={"job_id": self.msg.job_id,
                                                                     "chunk_id": self.msg.chunk_id})


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class ChunkWorker:
    def __init__(self, store: Store, model: ModelClient, *, rng: random.Random | None = None,
                 sleep: Callable[[float], None] = time.sleep, call_safety_s: float | None = None):
        self.store = store
        self.model = model
        self.s = store.s
        self.rng = rng or random.Random()
        self.sleep = sleep
        # time left that one more model call needs: its timeout plus a margin to save and hand off
        self.call_safety_s = call_safety_s if call_safety_s is not None else self.s.model_call_timeout_s + 1.0

    # ------------------------------------------------------------------ entry
    def handle(self, msg: AnalysisMessage, delivery: Delivery) -> Outcome:
        job = self.store.get_job(msg.job_id)
        if job is None or job.get("state") in TERMINAL_JOB_STATES:
            return Outcome("skipped", {"job_state": job.get("state") if job else None})
        claim = self.store.claim(msg.job_id, msg.chunk_id, worker_identity(), self.s.claim_lease_s,
                                 delivery.receive_count)
        if not claim.won:
            return self._not_claimed(msg, claim.item)
        fence = claim.fence
        if int(claim.item.get("failures", 0)) >= msg.max_attempts:
            env = ErrorEnvelope.model_validate(claim.item["last_error"]) if claim.item.get("last_error") else \
                ErrorEnvelope.of("runtime.worker_lost", "poison budget used by earlier attempts")
            return self._dead_letter(msg, fence, env, {})
        stats = RetryStats()
        error: ErrorEnvelope | None = None
        with Heartbeat(self.store, msg, fence, delivery, self.s.claim_lease_s) as hb:
            try:
                outputs = self._run_analysts(msg, job, fence, claim.item, delivery, stats, hb)
            except LeaseLost:
                self.store.event(msg.job_id, "chunk.lease_lost", chunk_id=msg.chunk_id, fence=fence)
                return Outcome("lease_lost", {"error": "runtime.lease_lost"}, stats)
            except ReviewError as exc:
                error = exc.envelope
            except Exception as exc:  # an AWS call failed (e.g. DynamoDB throttling): classified, not lost
                log.warning("chunk attempt failed", exc_info=True, extra={"job_id": msg.job_id, "chunk_id": msg.chunk_id})
                error = classify(exc, step="worker")
        # the heartbeat has stopped: it can no longer overwrite the tier-2 backoff visibility
        outcome = self._on_error(msg, job, fence, delivery, stats, error) if error else \
            self._complete(msg, fence, stats, outputs)
        outcome.stats = stats
        return outcome

    # ------------------------------------------------------------------ pieces
    def _not_claimed(self, msg: AnalysisMessage, item: dict[str, Any]) -> Outcome:
        status = item.get("status")
        if status in SETTLED_CHUNK_STATES:
            # The results message may not have been sent before a crash: send again. The dedup id is
            # stable and the aggregator settles idempotently, so a second copy is harmless.
            err = ErrorEnvelope.model_validate(item["last_error"]) if status != "done" and item.get("last_error") else None
            self._send_result(msg, status, int(item["fence"]), item.get("findings_key"), err)
            return Outcome("duplicate", {"status": status})
        return Outcome("duplicate", {"status": status, "claimed_by": item.get("claimed_by")})

    @staticmethod
    def _check(hb: Heartbeat) -> None:
        if hb.lost.is_set():
            raise LeaseLost()

    def _has_time(self, delivery: Delivery) -> Callable[[float], bool]:
        return lambda extra_s: delivery.remaining_ms() / 1000 - extra_s > self.call_safety_s

    def _run_analysts(self, msg: AnalysisMessage, job: dict[str, Any], fence: int, claim_item: dict[str, Any],
                      delivery: Delivery, stats: RetryStats, hb: Heartbeat) -> dict[str, AnalystOutput]:
        chunk = Chunk(index=msg.chunk_index, chunk_id=msg.chunk_id, start=msg.start, end=msg.end, text=msg.text)
        config_hash = job.get("config_hash") or self.s.analysis_config_hash()
        current_hash = self.s.analysis_config_hash()
        saved = self.store.checkpoints(msg.job_id, msg.chunk_id, claim_item)
        outputs: dict[str, AnalystOutput] = {}
        retrier = Retrier(policy=self.s.profile.model_retry, budget=RetryBudget(self.s.profile.chunk_retry_budget_s),
                          stats=stats, rng=self.rng, sleep=self.sleep, has_time=self._has_time(delivery),
                          check=lambda: self._check(hb))
        specs = analysts_for(int(job.get("analyst_count") or self.s.profile.analyst_count))
        for spec in specs:
            item = saved.get(spec.name)
            if item is not None:
                if item.get("config_hash") == current_hash:
                    try:
                        outputs[spec.name] = AnalystOutput.model_validate(self.store.load_checkpoint_output(item))
                        continue
                    except Exception as exc:  # noqa: BLE001 - recorded as an event, analyst re-run
                        self.store.event(msg.job_id, "checkpoint.missing", chunk_id=msg.chunk_id, analyst=spec.name,
                                         error_code="runtime.checkpoint_missing", detail=type(exc).__name__)
                else:
                    self.store.event(msg.job_id, "checkpoint.stale", chunk_id=msg.chunk_id, analyst=spec.name,
                                     checkpoint_hash=item.get("config_hash"), current_hash=current_hash,
                                     job_hash=config_hash)
            self._check(hb)
            if not self._has_time(delivery)(0):
                raise ReviewError.of("runtime.time_exhausted", "before analyst " + spec.name, step=spec.name)
            out = self._run_one(spec, chunk, retrier)
            if not self.store.put_checkpoint(msg.job_id, msg.chunk_id, spec.name, fence, current_hash,
                                             out.model_dump(mode="json")):
                raise LeaseLost("checkpoint write rejected by fencing token")
            outputs[spec.name] = out
        return outputs

    def _run_one(self, spec: AnalystSpec, chunk: Chunk, retrier: Retrier) -> AnalystOutput:
        calls_before = retrier.stats.calls

        def call_step(build: Callable[[str | None], ModelRequest], parse: Callable[[Any], list[dict[str, Any]]]):
            return retrier.call_with_repair(build, lambda req: self.model.invoke(req), parse,  # type: ignore[arg-type]
                                            step=spec.name)
        try:
            return run_analyst(spec, chunk, call_step)
        except ReviewError as exc:
            env = exc.envelope
            calls = retrier.stats.calls - calls_before
            if env.error_class is ErrorClass.POLICY:
                return refused_output(spec, chunk, calls)
            if env.error_class is ErrorClass.SEMANTIC:  # repair already failed: permanent for this analyst
                return AnalystOutput(analyst=spec.name, status="failed", findings=[], model_calls=calls,
                                     error_code=env.error_code)
            raise

    def _stats(self, stats: RetryStats) -> dict[str, Any]:
        return {"calls": stats.calls, "repairs": stats.repairs, "retries": dict(stats.retries)}

    def _complete(self, msg: AnalysisMessage, fence: int, stats: RetryStats,
                  outputs: dict[str, AnalystOutput]) -> Outcome:
        findings = [f.model_dump(mode="json") for o in outputs.values() for f in o.findings]
        key = f"findings/{msg.job_id}/{msg.chunk_index:05d}-{msg.chunk_id}/{fence}.json"
        self.store.put_object(key, json.dumps({"chunk_id": msg.chunk_id, "chunk_index": msg.chunk_index,
                                               "findings": findings}))
        coverage = {name: o.status for name, o in outputs.items()}
        done = self.store.finish(msg.job_id, msg.chunk_id, fence, "done", self._stats(stats),
                                 {"findings_key": key, "coverage": coverage, "n_findings": len(findings)})
        if done is None:
            self.store.event(msg.job_id, "chunk.lease_lost", chunk_id=msg.chunk_id, fence=fence, at_step="complete")
            return Outcome("lease_lost")
        self._send_result(msg, "done", fence, key)
        return Outcome("done", {"findings": len(findings), "calls": stats.calls})

    def _send_result(self, msg: AnalysisMessage, status: str, fence: int, key: str | None,
                     error: ErrorEnvelope | None = None) -> None:
        body = ResultMessage(job_id=msg.job_id, chunk_id=msg.chunk_id, chunk_index=msg.chunk_index, status=status,
                             fence=fence, findings_key=key, error=error.model_dump(mode="json") if error else None)
        self.store.send_result(body.model_dump_json(), msg.job_id, f"{msg.job_id}:{msg.chunk_id}:{status}:{fence}")

    def _requeue(self, msg: AnalysisMessage, delay_s: float, reason: str, resume_from: list[str]) -> None:
        fresh = msg.model_copy(update={"requeues": msg.requeues + 1, "reason": reason, "resume_from": resume_from})
        self.store.send_analysis([fresh.model_dump_json()], delay_s=max(0, min(int(round(delay_s)),
                                                                               self.s.profile.throttle_max_delay_s)))

    def _dead_letter(self, msg: AnalysisMessage, fence: int, env: ErrorEnvelope, stats: dict[str, Any]) -> Outcome:
        if self.store.finish(msg.job_id, msg.chunk_id, fence, "dead_lettered", stats, {}, env) is None:
            return Outcome("lease_lost")
        if self.s.analysis_dlq_url:
            self.store.send_to_dlq(self.s.analysis_dlq_url, msg.model_dump_json(), env,
                                   {"job_id": msg.job_id, "chunk_id": msg.chunk_id})
        self.store.event(msg.job_id, "chunk.dead_lettered", chunk_id=msg.chunk_id, error_code=env.error_code)
        self._send_result(msg, "dead_lettered", fence, None, env)
        return Outcome("dead_lettered", {"error": env.error_code})

    def _on_error(self, msg: AnalysisMessage, job: dict[str, Any], fence: int, delivery: Delivery,
                  stats: RetryStats, env: ErrorEnvelope) -> Outcome:
        st = self._stats(stats)
        record = self.store.get_chunk(msg.job_id, msg.chunk_id) or {}
        done = sorted(record.get("checkpoints") or {})
        # Backpressure: throttling and running out of Lambda time are not failures.
        if env.is_backpressure:
            if self.store.release(msg.job_id, msg.chunk_id, fence, st, env, failure=False) is None:
                return Outcome("lease_lost")
            delay = 0.0
            if env.error_code != "runtime.time_exhausted":
                # grows with consecutive requeues; never shorter than the provider's Retry-After
                ceiling = min(self.s.profile.throttle_max_delay_s, self.s.profile.model_retry.cap_s * 2 ** min(msg.requeues, 10))
                delay = max(env.retry_after_s or 0.0, self.rng.uniform(ceiling / 2, ceiling))
            reason = "model.throttled" if env.error_code != "runtime.time_exhausted" else env.error_code
            self._requeue(msg, delay, reason, done)
            self.store.event(msg.job_id, "chunk.requeued", chunk_id=msg.chunk_id, reason=reason,
                             delay_s=round(delay, 3), checkpointed=len(done), tier=1)
            return Outcome("requeued", {"reason": reason})
        if env.retryable:
            failures = int(record.get("failures", 0)) + 1
            if failures >= msg.max_attempts:
                return self._dead_letter(msg, fence, env.model_copy(update={"attempt": failures}), st)
            if self.store.release(msg.job_id, msg.chunk_id, fence, st, env, failure=True) is None:
                return Outcome("lease_lost")
            self.store.event(msg.job_id, "chunk.retry", chunk_id=msg.chunk_id, error_code=env.error_code,
                             failures=failures, tier=2, checkpointed=len(done))
            # Tier 2 backoff: come back after a short, growing delay instead of the full visibility timeout.
            if delivery.receipt_handle:
                back = int(min(delivery.visibility_s, self.s.profile.tier2_backoff_base_s * 2 ** (failures - 1)))
                self.store.aws.sqs.change_message_visibility(QueueUrl=delivery.queue_url,
                                                             ReceiptHandle=delivery.receipt_handle,
                                                             VisibilityTimeout=back)
            raise Tier2(env, stats)
        # Permanent: the chunk fails; a job-fatal code fails the whole job now.
        if self.store.finish(msg.job_id, msg.chunk_id, fence, "failed", st, {}, env) is None:
            return Outcome("lease_lost")
        self.store.event(msg.job_id, "chunk.failed", chunk_id=msg.chunk_id, error_code=env.error_code)
        if env.job_fatal:  # fail the job first, so the result below cannot finalize it with another code
            if self.store.transition(msg.job_id, ["queued", "running"], "failed",
                                     {"error": env.model_dump(mode="json"), "error_code": env.error_code,
                                      "ended_at": self.store.clock()}):
                self.store.event(msg.job_id, "job.failed", error_code=env.error_code, chunk_id=msg.chunk_id)
        self._send_result(msg, "failed", fence, None, env)
        if env.job_fatal:
            return Outcome("job_failed", {"error": env.error_code})
        return Outcome("failed", {"error": env.error_code})
