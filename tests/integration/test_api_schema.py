"""docs/openapi.yaml is the truth about the running API: schemathesis generates requests for every
operation from the document and checks every answer against it (status codes, content types, headers,
bodies; no 5xx), against the local server of `review up` (the same resolver the Lambda runs) on the
embedded stack. Without worker processes: the API's own behaviour is under test, not the pipeline's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.config import SchemathesisConfig

from contract_review.domain.ports import Queue
from contract_review.pipeline.intake import handle_intake
from review_local.stack import LocalStack

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
# A schema-valid request may still be answered 422 (a document that cannot be processed: outside uploads/, not
# there, empty) or 409 (a key used for another document): the API documents both.
CONFIG = {"phases": {"coverage": {"enabled": False}},
          "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "422"]}}}
schema = schemathesis.openapi.from_path(OPENAPI, config=SchemathesisConfig.from_dict(CONFIG))


pytestmark = pytest.mark.stack(start={"workers": False})  # the `shared_stack`: the API alone, no worker


def test_the_document_names_every_route_the_app_serves():
    from contract_review.operate import api

    documented = {(m.upper(), p) for p, ops in schema.raw_schema["paths"].items() for m in ops if m != "parameters"}
    assert documented == set(api.ROUTES)


def test_the_document_names_every_field_a_submission_takes():
    from contract_review.operate import api_requests

    schemas = schema.raw_schema["components"]["schemas"]
    assert set(schemas["JobRequest"]["properties"]) == set(api_requests.JobRequest.model_fields)
    assert set(schemas["BatchItem"]["properties"]) == set(api_requests.BatchItem.model_fields)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_keeps_its_openapi_document(case: schemathesis.Case, shared_stack: LocalStack) -> None:
    assert shared_stack.api is not None
    case.call_and_validate(base_url=shared_stack.api.url, headers={"Authorization": f"Bearer {shared_stack.api.token}"})


# The same document, stateful: schemathesis' state machine follows the document's links from a submitted job (read
# it, its events, cancel it, decide its approval, retry it, in any order, several times) and checks each answer as
# above, plus its stateful checks (a job just accepted can be read; an action does not make it vanish). Its roots are
# the operations with links out that random data can start; the batch routes (a root of their own) are left to the
# test above so that the walks start from POST /jobs.
class ApiWorkflow(schema.exclude(path_regex="^/batches").as_state_machine()):  # type: ignore[misc]  # built at run time
    stack: LocalStack | None = None

    def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
        assert self.stack is not None and self.stack.api is not None
        return {"base_url": self.stack.api.url, "headers": {"Authorization": f"Bearer {self.stack.api.token}"}}

    def after_call(self, response: Any, case: schemathesis.Case) -> None:
        """Intake takes each accepted job in at once (the real core on the stack, in this process: no worker
        processes, so the walk is the same every run), so that the next steps act on a running job, not on a
        submission intake has not seen yet."""
        super().after_call(response, case)
        if (case.method, case.path) == ("POST", "/jobs") and response.status_code == 202:
            assert self.stack is not None
            deps = self.stack.deps()
            for message in deps.queues.take_all(Queue.INTAKE):
                handle_intake(deps, message.body, message.message_id)
                deps.queues.delete(Queue.INTAKE, message.receipt_handle)


def test_the_api_keeps_its_openapi_document_across_linked_calls(shared_stack: LocalStack) -> None:
    ApiWorkflow.stack = shared_stack
    # no shrinking: the stack keeps its state between walks, so a replayed walk meets other jobs and hypothesis would
    # report a flaky strategy instead of the failure it found
    ApiWorkflow.run(settings=settings(max_examples=15, stateful_step_count=6, deadline=None, derandomize=True,
                                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate]))
