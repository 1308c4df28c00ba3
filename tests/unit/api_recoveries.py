"""The documented recoveries of the Job API's error codes (`api.*`), executed (test_recoveries.py runs them
with every other code's): the request that gets the code, then what the recovery text says to do, then the
job completes with the findings of a fault-free run."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace

from contract_review.domain.errors import REGISTRY
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState
from contract_review.operate import api
from review_local.api_server import http_api_event, local_principal

from ..texts import TEXT
from .fakes import FakeWorld
from .inprocess import InProcess, fault_free_findings

OWNER = local_principal("owner")
STRANGER = local_principal("stranger")


def _call(world: FakeWorld, method: str, path: str, body: object = None, who: str | None = OWNER,
          headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, object], dict[str, str]]:
    raw = b"" if body is None else json.dumps(body).encode()
    event = http_api_event(method, path, "", {"content-type": "application/json", **(headers or {})}, raw, who,
                           "api.test", "127.0.0.1")
    answer = api.resolve(event, SimpleNamespace(), world.deps)
    assert isinstance(answer, Mapping)
    return int(answer["statusCode"]), json.loads(str(answer["body"] or "{}")), dict(answer.get("headers") or {})


def _code(body: dict[str, object]) -> object:
    error = body.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _completes_as_fault_free(world: FakeWorld, job_id: str) -> None:
    run = InProcess(world)
    job = run.run(job_id)
    assert job.state is JobState.COMPLETED, (job.state, job.error_code)
    assert run.assert_complete_and_consistent(job_id) == fault_free_findings(FakeWorld, {"text": TEXT})
    status, body, _ = _call(world, "GET", f"/jobs/{job_id}")
    assert status == 200 and body["status"] == "completed"


def unauthenticated(code: str) -> None:
    """No principal: 401 and nothing sent; the same request, authenticated, is taken."""
    world = FakeWorld()
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": TEXT}}, who=None)
    assert status == 401 and _code(body) == code and not world.queues.sent[Queue.INTAKE]
    assert "Bearer" in REGISTRY[code].recovery and "SigV4" in REGISTRY[code].recovery
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    assert status == 202
    _completes_as_fault_free(world, str(body["jobId"]))


def not_found(code: str) -> None:
    """Another principal (or a mistyped id) gets 404; the owner, with the id its POST returned, reads the job."""
    world = FakeWorld()
    job_id = str(_call(world, "POST", "/jobs", {"document": {"text": TEXT}})[1]["jobId"])
    for who, path in ((STRANGER, f"/jobs/{job_id}"), (OWNER, "/jobs/job-" + "0" * 20)):
        status, body, _ = _call(world, "GET", path, who=who)
        assert status == 404 and _code(body) == code
    assert _call(world, "GET", f"/jobs/{job_id}")[0] == 200
    _completes_as_fault_free(world, job_id)


def conflict(code: str) -> None:
    """An action the job's state does not allow: 409 saying why; the job goes on and completes."""
    world = FakeWorld()
    job_id = str(_call(world, "POST", "/jobs", {"document": {"text": TEXT}})[1]["jobId"])
    status, body, headers = _call(world, "POST", f"/jobs/{job_id}/retry")  # not taken in yet: Retry-After
    assert status == 409 and _code(body) == code and headers.get("Retry-After")
    InProcess(world).intake()
    status, body, _ = _call(world, "POST", f"/jobs/{job_id}/retry")  # running, nothing failed: nothing to retry
    assert status == 409 and _code(body) == code and "nothing to retry" in str(body["error"])
    _completes_as_fault_free(world, job_id)
    status, body, _ = _call(world, "POST", f"/jobs/{job_id}/cancel")  # ended: nothing to cancel
    assert status == 409 and _code(body) == code


def invalid_request(code: str) -> None:
    """A request the API does not take as sent (here a non-ASCII Idempotency-Key): 400; fixed, it is taken."""
    world = FakeWorld()
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": TEXT}}, headers={"Idempotency-Key": "clé"})
    assert status == 400 and _code(body) == code and not world.queues.sent[Queue.INTAKE]
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": TEXT}}, headers={"Idempotency-Key": "cle-1"})
    assert status == 202
    _completes_as_fault_free(world, str(body["jobId"]))


API_RECOVERIES: dict[str, Callable[[str], None]] = {
    "api.unauthenticated": unauthenticated,
    "api.not_found": not_found,
    "api.conflict": conflict,
    "api.invalid_request": invalid_request,
}
