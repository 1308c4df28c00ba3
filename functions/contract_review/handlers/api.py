"""The Job API's Lambda entry point (HTTP API, payload v2, IAM authorization): glue only. The routes are
`contract_review.operate.api.app`; the local server (`review_local/api_server.py`) serves the same app."""

from __future__ import annotations

from collections.abc import Mapping

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.config import metrics as M
from contract_review.domain import log_fields
from contract_review.operate import api

from . import deps, observe, tracing
from .telemetry import emit

logger = observe(Logger(service="api"))
tracer = tracing.tracer("api")
metrics = Metrics(namespace=M.NAMESPACE, service="api")


def _fields(event: Mapping[str, object]) -> dict[str, object]:
    """The job a request names (`/jobs/{job_id}...`: one `$default` route, so no path parameters) and its
    Idempotency-Key (hashed), for the request's log lines."""
    path = event.get("rawPath")
    parts = path.strip("/").split("/") if isinstance(path, str) else []
    headers = event.get("headers")
    key = headers.get("idempotency-key") if isinstance(headers, Mapping) else None
    return log_fields.job_fields(job_id=parts[1] if len(parts) > 1 and parts[0] == "jobs" and parts[1] else None,
                                 idempotency_key=key if isinstance(key, str) else None, step="api")


@metrics.log_metrics
@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracing.capture_handler(tracer)
def handler(event: Mapping[str, object], context: LambdaContext) -> object:
    with log_fields.bound(_fields(event)):
        response = api.resolve(event, context, deps())
        status = response.get("statusCode") if isinstance(response, Mapping) else None
        logger.info("api request", extra={"route": event.get("routeKey"), "path": event.get("rawPath"),
                                          "status": status})
    if isinstance(status, int) and status >= 500:
        emit(metrics, M.API_SERVER_ERRORS, 1)
    return response
