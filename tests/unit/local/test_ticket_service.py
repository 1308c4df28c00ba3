"""The local fake of the external ticket system (`review_local/ticket_service.py`) keeps the Stripe-style
`Idempotency-Key` contract the saga relies on, and its injected failures are the ones it claims.
Over real HTTP on loopback, through the real client adapter (`adapters/tickets.py`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import urllib3
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError, TransformParameterError
from botocore.exceptions import ClientError
from pydantic import ValidationError

from contract_review.adapters.tickets import HttpTicketSystem, SecretCredentials, TicketCredentials
from contract_review.domain.effects import SideEffectError
from review_local.ticket_service import TicketFaults, TicketServiceFake

FIELDS = {"title": "2 high-risk findings", "job_id": "job-1"}


@pytest.fixture
def service() -> Iterator[TicketServiceFake]:
    with TicketServiceFake(TicketFaults(hang_s=1.0)) as fake:
        yield fake


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager()


def client(service: TicketServiceFake, http: urllib3.PoolManager, read_timeout_s: float = 0.3) -> HttpTicketSystem:
    return HttpTicketSystem(service.url, http, connect_timeout_s=0.5, read_timeout_s=read_timeout_s)


def post(http: urllib3.PoolManager, url: str, body: dict[str, object], key: str | None = None) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    return http.request("POST", url, body=json.dumps(body).encode(), headers=headers, retries=False)


def test_the_same_key_creates_once_and_replays_the_first_answer(service: TicketServiceFake, http: urllib3.PoolManager):
    # GIVEN a ticket created with key K WHEN the same request comes again with K
    first = post(http, service.url + "/tickets", FIELDS, key="K")
    again = post(http, service.url + "/tickets", FIELDS, key="K")
    # THEN one ticket, the same answer, marked as replayed
    assert first.status == again.status == 201
    assert first.json() == again.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert service.stats()["opened"] == 1
    # WHEN another key comes THEN another ticket; without a key every request creates one (Stripe)
    post(http, service.url + "/tickets", FIELDS, key="K2")
    post(http, service.url + "/tickets", FIELDS)
    post(http, service.url + "/tickets", FIELDS)
    assert service.stats()["opened"] == 4


def test_the_same_key_with_other_parameters_is_rejected(service: TicketServiceFake, http: urllib3.PoolManager):
    post(http, service.url + "/tickets", FIELDS, key="K")
    other = post(http, service.url + "/tickets", {**FIELDS, "title": "another"}, key="K")
    assert other.status == 422 and other.json()["error"]["type"] == "idempotency_key_reused"
    assert service.stats()["opened"] == 1
    # the client adapter reports it as a failure no retry will change
    with pytest.raises(SideEffectError) as e:
        client(service, http).open("K", {**FIELDS, "title": "another"})
    assert (e.value.written, e.value.retryable, e.value.envelope.http_status) == ("no", False, 422)


def test_lookup_by_key_list_and_idempotent_close(service: TicketServiceFake, http: urllib3.PoolManager):
    tickets = client(service, http)
    t = tickets.open("K", FIELDS)
    assert tickets.find("K") == t and tickets.find("unknown") is None
    closed = tickets.close(str(t["id"]), "withdrawn: job cancelled", key="C")
    again = tickets.close(str(t["id"]), "a second comment", key="C2")
    assert closed["status"] == again["status"] == "closed"
    assert again["close_comment"] == "withdrawn: job cancelled"  # the first comment kept
    listed = http.request("GET", service.url + "/tickets").json()["tickets"]
    assert [x["status"] for x in listed] == ["closed"]
    assert http.request("GET", service.url + "/_admin/stats").json()["closed"] == 1


def test_error_before_write_writes_nothing_and_is_safe_to_retry(service: TicketServiceFake, http: urllib3.PoolManager):
    service.inject("error_before_write", times=1)
    tickets = client(service, http)
    with pytest.raises(SideEffectError) as e:
        tickets.open("K", FIELDS)
    assert (e.value.written, e.value.retryable, e.value.envelope.http_status) == ("no", True, 503)
    assert service.stats()["opened"] == 0
    tickets.open("K", FIELDS)
    assert service.stats()["opened"] == 1


@pytest.mark.parametrize("kind", ["timeout_after_write", "drop_after_write"])
def test_a_write_whose_answer_never_comes_is_ambiguous_and_found_by_its_key(
        kind: str, service: TicketServiceFake, http: urllib3.PoolManager):
    # GIVEN the system writes, then holds the answer past the client's read timeout (or drops it)
    service.inject(kind)  # type: ignore[arg-type]  # a FaultKind from the parameter list
    tickets = client(service, http)
    with pytest.raises(SideEffectError) as e:
        tickets.open("K", FIELDS)
    # THEN the client cannot know: outcome unknown, from its read timeout (a client that waited for the held answer
    # would have got it, and raised nothing)
    assert e.value.written == "unknown" and e.value.envelope.error_code == "sideeffect.ambiguous"
    # AND the ticket exists: the key finds it, and the same key again creates nothing
    found = tickets.find("K")
    assert found is not None and found["status"] == "open"
    assert tickets.open("K", FIELDS)["id"] == found["id"]
    assert service.stats()["opened"] == 1


def test_a_timeout_before_the_write_leaves_nothing_to_find(service: TicketServiceFake, http: urllib3.PoolManager):
    service.inject("timeout_before_write")
    tickets = client(service, http)
    with pytest.raises(SideEffectError) as e:
        tickets.open("K", FIELDS)
    assert e.value.written == "unknown"
    assert tickets.find("K") is None and service.stats()["opened"] == 0


def test_lookup_unavailable_and_unreachable_system(service: TicketServiceFake, http: urllib3.PoolManager):
    service.inject("lookup_unavailable", op="lookup")
    tickets = client(service, http)
    with pytest.raises(SideEffectError) as e:
        tickets.find("K")
    assert e.value.envelope.http_status == 503
    url = service.url
    service.stop()
    with pytest.raises(SideEffectError) as e:
        HttpTicketSystem(url, http, connect_timeout_s=0.3, read_timeout_s=0.3).open("K", FIELDS)
    assert (e.value.written, e.value.envelope.error_code) == ("no", "sideeffect.failed")


def test_seeded_fault_rates_and_the_admin_api(http: urllib3.PoolManager):
    assert TicketFaults.parse("error=0.5,timeout_after_write=0.25,hang=2,seed=3") == TicketFaults(
        error_rate=0.5, timeout_after_write_rate=0.25, hang_s=2, seed=3)
    with pytest.raises(ValueError):
        TicketFaults.parse("explode=1")
    with TicketServiceFake() as fake:
        r = post(http, fake.url + "/_admin/faults", {"error_rate": 1.0})
        assert r.status == 200
        assert post(http, fake.url + "/tickets", FIELDS, key="K").status == 503
        post(http, fake.url + "/_admin/reset", {})
        post(http, fake.url + "/_admin/faults", {})
        assert post(http, fake.url + "/tickets", FIELDS, key="K").status == 201
        assert fake.stats()["opened"] == 1 and fake.stats()["requests"]["create"] == 1


# ------------------------------------------------------------------------ credentials (adapters/tickets.py)
class SecretsStub:
    """A fake of Powertools' SecretsProvider (`get` with max_age, transform, force_fetch), caching as it does (never
    expiring here): `value` is the secret in the store (or the exception reading it raises); `reads` counts reads of
    the store. The real provider on moto: tests/integration/test_ticket_credentials.py."""

    def __init__(self, value: object):
        self.value, self.reads, self.forced = value, 0, 0
        self.cached: object | None = None

    def get(self, name: str, max_age: int, transform: str, force_fetch: bool) -> object:
        if self.cached is not None and not force_fetch:
            return self.cached
        self.reads += 1
        self.forced += force_fetch
        if isinstance(self.value, Exception):
            raise self.value
        self.cached = self.value
        return self.value


def with_secret(service: TicketServiceFake, http: urllib3.PoolManager, stub: SecretsStub) -> HttpTicketSystem:
    creds = SecretCredentials(stub, "arn:aws:secretsmanager:us-east-1:123456789012:secret:t-AbC123", 300)  # type: ignore[arg-type]
    return HttpTicketSystem(service.url, http, connect_timeout_s=0.5, read_timeout_s=0.3, credentials=creds)


@pytest.mark.parametrize("url", ["http://tickets.example.com/api", "ftp://tickets.example.com", "tickets.example.com"])
def test_the_adapter_refuses_a_url_credentials_would_cross_in_clear(url: str):
    with pytest.raises(ValueError, match="ticket_url"):
        HttpTicketSystem(url, urllib3.PoolManager())
    HttpTicketSystem("https://tickets.example.com/api", urllib3.PoolManager())
    HttpTicketSystem("http://127.0.0.1:8080", urllib3.PoolManager())  # loopback: the local fake, a sidecar


def test_the_secret_takes_a_bearer_token_or_an_api_key_header_and_nothing_else():
    assert TicketCredentials.model_validate({"bearer_token": "t"}).headers() == {"Authorization": "Bearer t"}
    assert TicketCredentials.model_validate({"header": "X-API-Key", "value": "k"}).headers() == {"X-API-Key": "k"}
    for bad in ({}, {"bearer_token": "t", "header": "X-API-Key", "value": "k"}, {"header": "X-API-Key"},
                {"value": "k"}, {"bearer_token": ""}, {"header": "Bad Header", "value": "k"}, {"token": "t"}):
        with pytest.raises(ValidationError):
            TicketCredentials.model_validate(bad)


def test_credentials_from_the_secret_are_sent_and_a_rotation_is_picked_up_after_one_refetch(
        service: TicketServiceFake, http: urllib3.PoolManager):
    # GIVEN the system requires token A, and the secret holds A (cached), then B after a rotation
    service.require_bearer("A")
    stub = SecretsStub({"bearer_token": "A"})
    tickets = with_secret(service, http, stub)
    assert tickets.open("k1", FIELDS)["id"]
    assert stub.reads == 1 and stub.forced == 0
    # WHEN the system and the secret are rotated to B while the adapter still caches A
    service.require_bearer("B")
    stub.value = {"bearer_token": "B"}
    # THEN the 403 fetches the secret again once, and the request goes again with B: a ticket, no error
    assert tickets.open("k2", FIELDS)["id"]
    assert (stub.reads, stub.forced) == (2, 1)
    assert service.stats()["refused"] == {403: 1} and service.stats()["opened"] == 2


def test_a_credential_refused_again_is_unauthorized_after_one_refetch_and_nothing_is_written(
        service: TicketServiceFake, http: urllib3.PoolManager):
    # GIVEN the system requires a token the secret does not hold (the secret not updated after a rotation)
    service.require_bearer("NEW")
    stub = SecretsStub({"header": "Authorization", "value": "Bearer OLD"})
    tickets = with_secret(service, http, stub)
    # WHEN a ticket is opened THEN refused: sideeffect.unauthorized, not retryable, nothing written
    with pytest.raises(SideEffectError) as e:
        tickets.open("k", FIELDS)
    env = e.value.envelope
    assert (env.error_code, env.http_status, env.provider_code, env.step) == ("sideeffect.unauthorized", 403,
                                                                               "forbidden", "ticket.open")
    assert not e.value.retryable and e.value.written == "no" and env.error_class == "permanent"
    # AND the secret was read once more (an unchanged credential is not sent again), then the step failed
    assert (stub.reads, stub.forced) == (2, 1)
    assert service.stats()["refused"] == {403: 1} and service.stats()["opened"] == 0
    assert "OLD" not in env.message and "NEW" not in env.message


def test_no_credentials_configured_and_a_401_is_unauthorized_not_a_rejected_request(
        service: TicketServiceFake, http: urllib3.PoolManager):
    service.require_bearer("A")
    with pytest.raises(SideEffectError) as e:
        client(service, http).open("k", FIELDS)
    assert (e.value.envelope.error_code, e.value.envelope.http_status) == ("sideeffect.unauthorized", 401)
    assert "ticket_secret_arn" in e.value.envelope.message
    # a rejected request stays sideeffect.failed (a 4xx that is not about credentials)
    with TicketServiceFake() as open_to_all, pytest.raises(SideEffectError) as e:
        client(open_to_all, http).open("k", {"job_id": "no title"})
    assert (e.value.envelope.error_code, e.value.envelope.http_status) == ("sideeffect.failed", 400)


def _wrapped(code: str, status: int) -> GetParameterError:
    """What Powertools raises: its GetParameterError, raised while handling botocore's error."""
    try:
        try:
            raise ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                              "GetSecretValue")
        except ClientError as exc:
            raise GetParameterError(str(exc))  # noqa: B904  # as Powertools does (base.py), the cause in __context__
    except GetParameterError as wrapped:
        return wrapped


@pytest.mark.parametrize("value,code,retryable", [
    (_wrapped("AccessDeniedException", 400), "sideeffect.unauthorized", False),  # the role may not read it
    (_wrapped("ResourceNotFoundException", 400), "sideeffect.unauthorized", False),  # no such secret
    (_wrapped("ThrottlingException", 400), "sideeffect.failed", True),  # try again: nothing was sent
    (TransformParameterError("not JSON"), "sideeffect.unauthorized", False),
    ({"bearer_token": ""}, "sideeffect.unauthorized", False),  # not the documented shape
])
def test_a_secret_that_cannot_be_read_fails_with_a_code_before_anything_is_sent(
        service: TicketServiceFake, http: urllib3.PoolManager, value: object, code: str, retryable: bool):
    with pytest.raises(SideEffectError) as e:
        with_secret(service, http, SecretsStub(value)).open("k", FIELDS)
    assert (e.value.envelope.error_code, e.value.retryable, e.value.written) == (code, retryable, "no")
    assert e.value.envelope.step == "ticket.credentials"
    assert service.stats()["requests"] == {}  # nothing reached the ticket system


def test_a_failure_that_is_not_secrets_managers_answer_is_not_called_a_credential_problem(
        service: TicketServiceFake, http: urllib3.PoolManager):
    try:
        try:
            raise KeyError("SecretString")  # a bug on the way, not an AWS answer
        except KeyError as exc:
            raise GetParameterError(str(exc))  # noqa: B904  # as Powertools does
    except GetParameterError as wrapped:
        bug = wrapped
    with pytest.raises(GetParameterError):
        with_secret(service, http, SecretsStub(bug)).open("k", FIELDS)


def test_ticket_faults_script_the_next_requests_so_a_job_can_be_made_to_wait_for_approval():
    # `review up --ticket-faults timeout_after_write=x1,lookup_unavailable=xN` (docs/cli.md: reaching waiting_approval):
    # the next create is written and its answer lost, the next N lookups answer 503 -- the outcome stays unknown
    faults = TicketFaults.parse("timeout_after_write=x1,lookup_unavailable=x50,hang=2")
    assert faults.hang_s == 2 and faults.timeout_after_write_rate == 0
    fake = TicketServiceFake(faults)
    assert fake.take_fault("create") == "timeout_after_write" and fake.take_fault("create") is None
    assert [fake.take_fault("lookup") for _ in range(51)] == ["lookup_unavailable"] * 50 + [None]
    with pytest.raises(ValueError, match="lookup_unavailable=xN"):
        TicketFaults.parse("lookup_down=x1")


def test_review_up_refuses_an_unknown_ticket_fault_in_one_line():
    from click.testing import CliRunner

    from review_local.cli import cli

    result = CliRunner().invoke(cli, ["up", "--ticket-faults", "explode=x1"])
    assert result.exit_code == 2 and "Invalid value for --ticket-faults: unknown ticket fault 'explode'" in result.output
