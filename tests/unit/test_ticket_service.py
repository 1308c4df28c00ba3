"""The local fake of the external ticket system (`review_local/ticket_service.py`) keeps the Stripe-style
`Idempotency-Key` contract the saga relies on, and its injected failures are the ones it claims.
Over real HTTP on loopback, through the real client adapter (`adapters/tickets.py`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import urllib3

from contract_review.adapters.tickets import HttpTicketSystem
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
    started = time.monotonic()
    with pytest.raises(SideEffectError) as e:
        tickets.open("K", FIELDS)
    # THEN the client cannot know: outcome unknown, in about its read timeout
    assert e.value.written == "unknown" and e.value.envelope.error_code == "sideeffect.ambiguous"
    assert time.monotonic() - started < 0.9
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
