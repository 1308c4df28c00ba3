from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..sweeper import sweep
from . import deps

logger = Logger(service="sweeper")


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = sweep(deps())
    logger.info("sweep", extra={"requeued": len(report.requeued), "dead_lettered": len(report.dead_lettered),
                                "dlq_seen": report.dlq_seen})
    return {"requeued": report.requeued, "dead_lettered": report.dead_lettered, "dlq_seen": report.dlq_seen}
