"""Long-running analysis poller: the Fargate alternative to the worker Lambda. Same core.

It owns a short visibility timeout (heartbeated), so a dead task's chunk is back in
`fargate_visibility_s` even without the sweeper, and it sweeps lapsed claims in-process (a query of the
sparse lease index: what only a poller does faster than the minute schedule). Jobs (stalled, cancelling,
compensating, waiting for approval, queued; the DLQs) are left to the scheduled sweeper Lambda, so the
cost of finding them does not grow with the number of tasks.
Entry point: `python -m contract_review.handlers.poller` (the task definition's command).

Scale-in and SIGTERM:
- while it holds a chunk the task is protected from scale-in (ECS task scale-in protection through
  the agent endpoint, `adapters/task_protection.py`); the protection is given back when a receive
  comes back empty, so only idle tasks are stopped by a scale-in;
- on SIGTERM it takes no new message and gives the chunk in hand a deadline of the stop timeout
  (`profile.fargate.fargate_stop_timeout_s`, the container's stopTimeout): the worker starts no model call
  that could outlast it, so the chunk is finished, or released through its checkpoints
  (`runtime.time_exhausted`, requeued, no failure counted), before ECS's SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from pydantic import ValidationError

from contract_review.config.settings import Settings
from contract_review.domain import log_fields
from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Deps
from contract_review.pipeline.sweeper import sweep_claims
from contract_review.pipeline.worker import ChunkWorker, Delivery, Tier2

from ..wiring import ScaleInGuard, aws_client_config, build_chunk_worker, build_deps, build_scale_in_guard
from . import build_traced_model, observe, tracing
from .telemetry import record_attempt

log = logging.getLogger("contract_review.poller")
# Before SIGTERM: no time limit (the worker's time check never trips). The claim then records a
# deadline days away, so a lease that lapses on Fargate always reads as a lost worker to the sweeper.
NO_DEADLINE_MS = 10**9


class Shutdown:
    """SIGTERM: stop taking work, and finish the work in hand within `grace_s`."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic):
        self.grace_s, self.clock = grace_s, clock
        self.event = threading.Event()
        self.deadline: float | None = None

    def request(self) -> None:
        if self.deadline is None:
            self.deadline = self.clock() + self.grace_s
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def remaining_ms(self) -> int:
        """What the worker sees as its invocation's remaining time."""
        if self.deadline is None:
            return NO_DEADLINE_MS
        return max(0, int((self.deadline - self.clock()) * 1000))


def _sweep_loop(deps: Deps, interval_s: float, stop: Shutdown) -> None:
    """Every poller also sweeps lapsed claims (idempotent, conditional): a dead task's chunk is requeued within
    lease + interval without waiting for the scheduled sweeper Lambda (1 minute at best). Only claims: one
    query of the sparse lease index per round, whose answer is the claims that lapsed (usually none), so 20
    tasks sweeping every 10 s cost 120 small queries a minute and nothing that grows with the jobs kept. The
    sweeper Lambda, which runs in this stack too, reconciles jobs and publishes the sweep metrics (StuckJobs)."""
    if deps.meter is not None:  # the sweeps' requests are not the chunk attempt's running meanwhile
        deps.meter.exclude_current_thread()
    while not stop.wait(interval_s):
        try:
            with log_fields.bound(log_fields.job_fields(step="sweep.lapsed")), tracing.poller_segment("worker-sweep"):
                report = sweep_claims(deps)
            if report.requeued or report.dead_lettered:
                log.info("sweep requeued=%s dead_lettered=%s", report.requeued, report.dead_lettered)
        except Exception:  # the next round retries; logged, not hidden
            log.exception("sweep failed")


def _process(worker: ChunkWorker, m: dict[str, Any], visibility: int, stop: Shutdown, metrics: Metrics) -> bool:
    """One message through the core; True when it may be deleted (acknowledged)."""
    delivery = Delivery(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"],
                        receive_count=int(m["Attributes"]["ApproximateReceiveCount"]), visibility_s=visibility,
                        remaining_ms=stop.remaining_ms)
    try:
        msg = AnalysisMessage.model_validate_json(m["Body"])
    except ValidationError as exc:  # never log the body: it holds document text
        log.error("invalid analysis message %s (%d errors); left for the DLQ", m["MessageId"], exc.error_count())
        return False
    fields = log_fields.job_fields(job_id=msg.job_id, chunk_id=msg.chunk_id, step="analysis", queue="analysis",
                                   attempt=delivery.receive_count, external_ids={"sqs_message_id": m["MessageId"]})
    with log_fields.bound(fields), tracing.poller_segment("worker-poller"):  # one trace per chunk message
        try:
            outcome = worker.handle(msg, delivery)
        except Tier2 as exc:
            record_attempt(metrics, exc.stats, tier2_code=exc.envelope.error_code)
            metrics.flush_metrics()
            log.warning("tier 2: %s", exc.envelope.error_code, extra={"error_code": exc.envelope.error_code, "tier": 2})
            return False
        except Exception:  # not acknowledged: the queue redelivers it (tier 2), then the DLQ
            log.exception("chunk failed with an unexpected error")
            return False
        record_attempt(metrics, outcome.stats, action=outcome.action, reason=str(outcome.detail.get("reason") or ""))
        metrics.flush_metrics()
        log.info("chunk %s", outcome.action, extra={"outcome": outcome.action})
    return True


def run(settings: Settings, session: Any, stop: Shutdown, guard: ScaleInGuard | None = None,
        metrics: Metrics | None = None) -> None:
    """Poll until `stop`; the chunk in hand when it is set is finished or released first."""
    metrics = metrics or Metrics(service="worker")
    guard = guard or build_scale_in_guard(settings, None)
    deps = build_deps(settings, session)
    threading.Thread(target=_sweep_loop, args=(deps, settings.profile.fargate.fargate_sweep_interval_s, stop),
                     daemon=True, name="sweeper").start()
    worker = build_chunk_worker(settings, deps, build_traced_model(settings, session),
                                lambda other: build_traced_model(other, session))
    sqs = session.client("sqs", config=aws_client_config())  # the poller is its own event source mapping
    visibility = settings.profile.fargate.fargate_visibility_s
    try:
        while not stop.is_set():
            with tracing.untraced():  # a chunk's trace starts at its message (`_process`)
                r = sqs.receive_message(QueueUrl=settings.analysis_queue_url, MaxNumberOfMessages=1,
                                        WaitTimeSeconds=settings.profile.fargate.poller_wait_s, VisibilityTimeout=visibility,
                                        MessageSystemAttributeNames=["ApproximateReceiveCount"])
            messages = r.get("Messages", [])
            if not messages:
                guard.idle()  # nothing in hand: this task may be scaled in
                if not settings.profile.fargate.poller_wait_s:
                    stop.wait(0.2)  # short polling (local profile): back off while idle
            for m in messages:
                with guard.busy():
                    if _process(worker, m, visibility, stop, metrics):
                        with tracing.untraced():
                            sqs.delete_message(QueueUrl=settings.analysis_queue_url, ReceiptHandle=m["ReceiptHandle"])
    finally:
        guard.idle()


def main() -> None:
    import boto3

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"))
    observe(Logger(service="worker"))  # the core's and the poller's lines: structured, with the job's fields
    # traced where the task definition runs the X-Ray daemon sidecar (infra/fargate.py); locally: off
    tracing.tracer("worker", enabled=bool(os.environ.get("AWS_XRAY_DAEMON_ADDRESS")))
    settings = Settings.from_env(os.environ).model_copy(update={"worker_kind": "fargate"})
    stop = Shutdown(settings.profile.fargate.fargate_stop_timeout_s)
    signal.signal(signal.SIGTERM, lambda *_: stop.request())
    # ECS_AGENT_URI: set by ECS; absent locally, where the protection is a no-op
    run(settings, boto3.Session(), stop, build_scale_in_guard(settings, os.environ.get("ECS_AGENT_URI")))
    log.info("poller stopped")


if __name__ == "__main__":
    main()
