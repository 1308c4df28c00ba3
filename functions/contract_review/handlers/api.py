"""The Job API's Lambda entry point (HTTP API, payload v2, IAM authorization): glue only. The routes are
`contract_review.operate.api.app`; the local server (`review_local/api_server.py`) serves the same app."""

from __future__ import annotations

from collections.abc import Mapping

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from contract_review.operate import api

from . import deps

logger = Logger(service="api")
metrics = Metrics(namespace="ContractReview", service="api")


@metrics.log_metrics
@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: Mapping[str, object], context: LambdaContext) -> object:
    response = api.resolve(event, context, deps())
    status = response.get("statusCode") if isinstance(response, Mapping) else None
    logger.info("api request", extra={"route": event.get("routeKey"), "path": event.get("rawPath"), "status": status})
    if isinstance(status, int) and status >= 500:
        metrics.add_metric(name="ApiServerErrors", unit=MetricUnit.Count, value=1)
    return response
