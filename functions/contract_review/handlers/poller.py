"""Long-running analysis poller: the Fargate alternative to the worker Lambda. Same core.

It owns a short visibility timeout (heartbeated), so a dead task's chunk is back in
`fargate_visibility_s` even without the sweeper. Stops cleanly on SIGTERM after the current chunk.
Entry point: `python -m contract_review.handlers.poller` (the task definition's command).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from pydantic import ValidationError

from ..config import Settings
from ..errors import Tier2
from ..messages import AnalysisMessage
from ..ports import Deps
from ..sweeper import sweep
from ..wiring import aws_client_config, build_deps, build_model
from ..worker import ChunkWorker, Delivery

log = logging.getLogger("contract_review.poller")


def _sweep_loop(deps: Deps, interval_s: float, stop: threading.Event) -> None:
    """Every poller also sweeps (idempotent, conditional): a dead task's chunk is requeued within
    lease + interval without waiting for the scheduled sweeper Lambda (1 minute at best)."""
    while not stop.wait(interval_s):
        try:
            report = sweep(deps)
            if report.requeued or report.dead_lettered:
                log.info("sweep requeued=%s dead_lettered=%s", report.requeued, report.dead_lettered)
        except Exception:  # the next round retries; logged, not hidden
            log.exception("sweep failed")


def _process(worker: ChunkWorker, m: dict[str, Any], visibility: int) -> bool:
    """One message through the core; True when it may be deleted (acknowledged)."""
    delivery = Delivery(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"],
                        receive_count=int(m["Attributes"]["ApproximateReceiveCount"]), visibility_s=visibility)
    try:
        msg = AnalysisMessage.model_validate_json(m["Body"])
    except ValidationError as exc:  # never log the body: it holds document text
        log.error("invalid analysis message %s (%d errors); left for the DLQ", m["MessageId"], exc.error_count())
        return False
    try:
        outcome = worker.handle(msg, delivery)
    except Tier2 as exc:
        log.warning("tier 2: %s", exc.envelope.error_code)
        return False
    except Exception:  # not acknowledged: the queue redelivers it (tier 2), then the DLQ
        log.exception("chunk failed with an unexpected error")
        return False
    log.info("chunk %s", outcome.action)
    return True


def run(settings: Settings, session: Any, stop: threading.Event) -> None:
    deps = build_deps(settings, session)
    threading.Thread(target=_sweep_loop, args=(deps, settings.profile.fargate_sweep_interval_s, stop),
                     daemon=True, name="sweeper").start()
    worker = ChunkWorker(deps, build_model(settings, session))
    sqs = session.client("sqs", config=aws_client_config())  # the poller is its own event source mapping
    visibility = settings.profile.fargate_visibility_s
    while not stop.is_set():
        r = sqs.receive_message(QueueUrl=settings.analysis_queue_url, MaxNumberOfMessages=1,
                                WaitTimeSeconds=settings.profile.poller_wait_s,
                                VisibilityTimeout=visibility, MessageSystemAttributeNames=["ApproximateReceiveCount"])
        if not r.get("Messages") and not settings.profile.poller_wait_s:
            stop.wait(0.2)  # short polling (local profile): back off while idle
        for m in r.get("Messages", []):
            if _process(worker, m, visibility):
                sqs.delete_message(QueueUrl=settings.analysis_queue_url, ReceiptHandle=m["ReceiptHandle"])


def main() -> None:
    import boto3

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(Settings.from_env(os.environ).model_copy(update={"worker_kind": "fargate"}), boto3.Session(), stop)


if __name__ == "__main__":
    main()
