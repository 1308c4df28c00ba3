"""docs/openapi.yaml is the truth about the running API: schemathesis generates requests for every
operation from the document and checks every answer against it (status codes, content types, headers,
bodies; no 5xx), against the local server of `review up` (the same resolver the Lambda runs) on the
embedded stack. Without worker processes: the API's own behaviour is under test, not the pipeline's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from review_local.stack import LocalStack

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
# A schema-valid request may still be answered 422 (a document that cannot be processed: outside uploads/, not
# there, empty) or 409 (a key used for another document): the API documents both.
CONFIG = {"phases": {"coverage": {"enabled": False}},
          "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "422"]}}}
schema = schemathesis.openapi.from_path(OPENAPI, config=SchemathesisConfig.from_dict(CONFIG))


@pytest.fixture(scope="module")
def api_stack(local_template: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack(template=local_template, state_dir=tmp_path_factory.mktemp("api-schema"))
    stack.start(workers=False)
    try:
        yield stack
    finally:
        stack.stop()


def test_the_document_names_every_route_the_app_serves():
    from contract_review.operate import api

    documented = {(m.upper(), p) for p, ops in schema.raw_schema["paths"].items() for m in ops if m != "parameters"}
    assert documented == set(api.ROUTES)


def test_the_document_names_every_field_a_submission_takes():
    from contract_review.operate import api

    schemas = schema.raw_schema["components"]["schemas"]
    assert set(schemas["JobRequest"]["properties"]) == set(api.JobRequest.model_fields)
    assert set(schemas["BatchItem"]["properties"]) == set(api.BatchItem.model_fields)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_keeps_its_openapi_document(case: schemathesis.Case, api_stack: LocalStack) -> None:
    assert api_stack.api is not None
    case.call_and_validate(base_url=api_stack.api.url, headers={"Authorization": f"Bearer {api_stack.api.token}"})
