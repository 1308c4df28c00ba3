"""The documented recoveries of the Job API's error codes (`api.*`), executed (test_recoveries.py runs them
with every other code's): the request that gets the code, then what the recovery text says to do, then the
job completes with the findings of a fault-free run."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace

from contract_review.domain.errors import REGISTRY
from contract_review.domain.ports import Queue
from contract_review.domain.records import JobState, job_id_for
from contract_review.operate import api
from contract_review.pipeline import admission
from review_local.api_server import http_api_event, local_principal

from ..texts import TEXT
from .fakes import SETTINGS, FakeWorld
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


def limited(**limits: object) -> FakeWorld:
    """A world whose profile has these spend limits (profile `limits`)."""
    return FakeWorld(settings=SETTINGS.model_copy(update={"profile": SETTINGS.profile.with_overrides(**limits)}))


def rate_limited(code: str) -> None:
    """Over its requests a minute: 429 with Retry-After, nothing done; after Retry-After the request is taken."""
    world = limited(api_requests_per_minute=2)
    world.clock.now = 120.0  # the start of a minute
    assert _call(world, "GET", "/jobs/job-" + "0" * 20)[0] == 404
    assert _call(world, "GET", "/jobs/job-" + "0" * 20)[0] == 404
    status, body, headers = _call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    assert status == 429 and _code(body) == code and headers["Retry-After"] == "60"
    assert not world.queues.sent[Queue.INTAKE] and "Retry-After" in REGISTRY[code].recovery
    world.clock.advance(float(headers["Retry-After"]))
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    assert status == 202
    _completes_as_fault_free(world, str(body["jobId"]))


def spend_exceeded(code: str) -> None:
    """Over the principal's daily cap: 429 until the next UTC day, nothing queued; then the submission is taken."""
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = limited(principal_daily_spend_usd=1.5 * estimate / 1e6)  # room for one such job a day
    world.clock.now = 86400.0 * 20_000 + 3600  # 01:00 UTC
    first = _call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    assert first[0] == 202
    other = TEXT.replace("New York", "Ohio")
    status, body, headers = _call(world, "POST", "/jobs", {"document": {"text": other}})
    assert status == 429 and _code(body) == code and int(headers["Retry-After"]) == 23 * 3600
    assert len(world.queues.sent[Queue.INTAKE]) == 1 and "00:00 UTC" in REGISTRY[code].recovery
    assert _call(world, "POST", "/jobs", {"document": {"text": TEXT}})[0] == 202  # a replay is never refused
    world.clock.advance(23 * 3600)  # the next UTC day: sent again, it is taken
    status, body, _ = _call(world, "POST", "/jobs", {"document": {"text": other}})
    assert status == 202 and json.loads(world.queues.sent[Queue.INTAKE][-1].body)["document"]["text"] == other
    _completes_as_fault_free(world, str(first[1]["jobId"]))


def spend_cap(code: str) -> None:
    """Over the stack's daily spend cap, whoever sends it: the Job API answers 429 until the next UTC day (nothing
    queued); a job sent to the intake queue is not failed but waits `queued` (condition spend_cap, no chunk sent, no
    model call) and the sweeper starts it after 00:00 UTC; both complete as if never held."""
    estimate = admission.estimate(SETTINGS, TEXT).model_micro_usd
    world = limited(daily_spend_cap_usd=1.5 * estimate / 1e6, principal_daily_spend_usd=None)  # room for one a day
    world.clock.now = 86400.0 * 20_000 + 3600  # 01:00 UTC
    first = _call(world, "POST", "/jobs", {"document": {"text": TEXT}})
    assert first[0] == 202
    other = TEXT.replace("New York", "Ohio")
    status, body, headers = _call(world, "POST", "/jobs", {"document": {"text": other}})
    assert status == 429 and _code(body) == code and int(headers["Retry-After"]) == 23 * 3600
    assert len(world.queues.sent[Queue.INTAKE]) == 1 and "00:00 UTC" in REGISTRY[code].recovery
    # a document whose estimate alone is over the cap could never start: 422, not a 429 to wait out
    many = "\n\n".join(TEXT.replace("New York", f"State {n}") for n in range(8))  # its estimate: several caps
    assert admission.estimate(SETTINGS, many).model_micro_usd > 1.5 * estimate
    status, body, headers = _call(world, "POST", "/jobs", {"document": {"text": many}})
    assert status == 422 and _code(body) == code and "Retry-After" not in headers, body
    run = InProcess(world)
    run.send({"text": other}, key="queue-sender")  # the same document to the intake queue: no one to answer 429 to
    run.intake()
    held = world.jobs.get(job_id_for("queue-sender"))
    assert held is not None and held.state is JobState.QUEUED and held.waiting is not None
    assert held.waiting.condition == "spend_cap" and "00:00 UTC" in held.waiting.detail
    _completes_as_fault_free(world, str(first[1]["jobId"]))
    assert world.claims.for_job(held.job_id) == [] and world.jobs.get(held.job_id).state is JobState.QUEUED  # type: ignore[union-attr]
    world.clock.advance(23 * 3600)  # the next UTC day: the sweeper admits it, and it runs
    ended = run.run(held.job_id)
    assert ended.state is JobState.COMPLETED and ended.waiting is None, (ended.state, ended.error_code)
    assert any(e.type == "job.waiting_spend_cap" for e in world.jobs.events(held.job_id))


API_RECOVERIES: dict[str, Callable[[str], None]] = {
    "api.rate_limited": rate_limited,
    "quota.spend_exceeded": spend_exceeded,
    "quota.spend_cap": spend_cap,
    "api.unauthenticated": unauthenticated,
    "api.not_found": not_found,
    "api.conflict": conflict,
    "api.invalid_request": invalid_request,
}
