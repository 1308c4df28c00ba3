"""The external ticket system over HTTP, with a Stripe-style `Idempotency-Key` on every write.

urllib3 (botocore's own HTTP library: no new dependency in the Lambda asset), with urllib3's retries
off: the saga owns retries, and a re-send after a read timeout is exactly the ambiguity it must see.
Failures are classified from structured facts only (exception types, HTTP status codes):

- connection refused / connect timeout / HTTP 5xx / 409 (the key is being processed): nothing was
  written, or the system will dedup the same key: `written="no"`, retryable;
- read timeout or the connection dropped after the request was sent: `written="unknown"`;
- other 4xx (422: the key was used with other parameters, 400): not retryable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

import urllib3
from pydantic import JsonValue
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ProtocolError, ReadTimeoutError

from contract_review.domain.effects import JsonObject, SideEffectError
from contract_review.domain.errors import ErrorEnvelope


class HttpTicketSystem:
    """`TicketSystem` over HTTP. `http` is passed in (a `urllib3.PoolManager`), never built at import."""

    def __init__(self, base_url: str, http: urllib3.PoolManager, *, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.http = http
        self.timeout = urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s)

    def open(self, key: str, fields: Mapping[str, JsonValue]) -> JsonObject:
        return self._call("POST", "/tickets", "ticket.open", body=dict(fields), key=key)

    def find(self, key: str) -> JsonObject | None:
        try:
            return self._call("GET", f"/tickets?idempotency_key={quote(key)}", "ticket.lookup")
        except SideEffectError as e:
            if e.envelope.http_status == 404:
                return None
            raise

    def close(self, ticket_id: str, comment: str, key: str) -> JsonObject:
        return self._call("POST", f"/tickets/{quote(ticket_id)}/close", "ticket.close", body={"comment": comment},
                          key=key)

    def _call(self, method: str, path: str, step: str, *, body: Mapping[str, JsonValue] | None = None,
              key: str | None = None) -> JsonObject:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        data = json.dumps(body).encode() if body is not None else None
        try:
            resp = self.http.request(method, self.base_url + path, body=data, headers=headers, timeout=self.timeout,
                                     retries=False, redirect=False)
        except (NewConnectionError, ConnectTimeoutError) as e:  # never reached the system
            raise SideEffectError(ErrorEnvelope.of("sideeffect.failed", "ticket system unreachable",
                                                   provider_code=type(e).__name__, step=step), written="no") from e
        except (ReadTimeoutError, ProtocolError) as e:  # sent; the answer never came
            raise SideEffectError(ErrorEnvelope.of("sideeffect.ambiguous", "no answer from the ticket system after "
                                                   "the request was sent", provider_code=type(e).__name__, step=step),
                                  written="unknown") from e
        except urllib3.exceptions.MaxRetryError as e:  # retries=False wraps the cause in some urllib3 versions
            cause = e.reason
            sent = not isinstance(cause, (NewConnectionError, ConnectTimeoutError))
            raise SideEffectError(ErrorEnvelope.of("sideeffect.ambiguous" if sent else "sideeffect.failed",
                                                   "ticket system call failed", provider_code=type(cause).__name__,
                                                   step=step), written="unknown" if sent else "no") from e
        status = resp.status
        parsed: object
        try:
            parsed = json.loads(resp.data or b"{}")
        except ValueError:
            parsed = {}
        answer: JsonObject = parsed if isinstance(parsed, dict) else {}
        if 200 <= status < 300:
            return answer
        err = answer.get("error")
        provider_code = str(err.get("type")) if isinstance(err, dict) and err.get("type") else f"HTTP{status}"
        envelope = ErrorEnvelope.of("sideeffect.failed", f"ticket system answered HTTP {status}", http_status=status,
                                    provider_code=provider_code, step=step)
        retryable = status >= 500 or status in (408, 409, 429)
        raise SideEffectError(envelope, written="no", retryable=retryable)
