"""The external ticket system over HTTP, with a Stripe-style `Idempotency-Key` on every write.

urllib3 (botocore's own HTTP library: no new dependency in the Lambda asset), with urllib3's retries
off: the saga owns retries, and a re-send after a read timeout is exactly the ambiguity it must see.
Failures are classified from structured facts only (exception types, HTTP status codes):

- connection refused / connect timeout / HTTP 5xx / 409 (the key is being processed): nothing was
  written, or the system will dedup the same key: `written="no"`, retryable;
- read timeout or the connection dropped after the request was sent: `written="unknown"`;
- 401/403: the credentials were refused (`sideeffect.unauthorized`, nothing written): the secret is fetched
  again once (a rotation lands without a redeploy) and, when it changed, the request is sent again with it;
  refused again, or unchanged: the step fails, not retryable;
- other 4xx (422: the key was used with other parameters, 400): not retryable.

Credentials (`SecretCredentials`): the Secrets Manager secret `-c ticket_secret_arn` names, read through
Powertools' parameters utility (the `SecretsProvider` behind `get_secret`, with our client) and cached
`ticket_secret_max_age_s`. Its SecretString is one of (`TicketCredentials`):

    {"bearer_token": "..."}                       ->  Authorization: Bearer ...
    {"header": "X-API-Key", "value": "..."}       ->  X-API-Key: ...

The base URL must be `https://` (`http://` only to a loopback host): `config.settings.ticket_url_problem`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

import urllib3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError, TransformParameterError
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ProtocolError, ReadTimeoutError

from contract_review.config.settings import ticket_url_problem
from contract_review.domain.effects import JsonObject, SideEffectError
from contract_review.domain.errors import ErrorEnvelope, classify

UNAUTHORIZED = (401, 403)
_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"  # an HTTP header name (RFC 9110 token)


class TicketCredentials(BaseModel):
    """The secret's JSON: a bearer token, or an API key sent in a header of the system's choosing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bearer_token: str | None = Field(default=None, min_length=1)
    header: str | None = Field(default=None, pattern=_HEADER_NAME)
    value: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> TicketCredentials:
        bearer, api_key = self.bearer_token is not None, self.header is not None and self.value is not None
        if bearer == api_key or (not api_key and (self.header or self.value)):
            raise ValueError('either {"bearer_token": "..."} or {"header": "X-API-Key", "value": "..."}')
        return self

    def headers(self) -> dict[str, str]:
        if self.bearer_token is not None:
            return {"Authorization": f"Bearer {self.bearer_token}"}
        assert self.header is not None and self.value is not None  # the validator's other form
        return {self.header: self.value}


class SecretCredentials:
    """The ticket system's credentials from one Secrets Manager secret, cached `max_age_s` by Powertools' parameters
    utility; `headers(refresh=True)` reads it again now (after a 401/403). The secret's value never reaches a log
    or an error message."""

    def __init__(self, provider: SecretsProvider, secret_id: str, max_age_s: int):
        self.provider, self.secret_id, self.max_age_s = provider, secret_id, max_age_s

    def headers(self, *, refresh: bool = False) -> dict[str, str]:
        try:
            value = self.provider.get(self.secret_id, max_age=self.max_age_s, transform="json", force_fetch=refresh)
        except TransformParameterError as e:
            raise _unauthorized("the ticket secret is not JSON", "SecretNotJson") from e
        except GetParameterError as e:  # Powertools wraps the botocore error: classify the error it wraps
            cause = e.__context__
            if not isinstance(cause, (ClientError, BotoCoreError)):
                raise  # not an answer of Secrets Manager's: a bug, not a credential problem
            env = classify(cause)
            if env.retryable:  # throttled or unavailable: nothing was sent to the ticket system, try again
                raise SideEffectError(ErrorEnvelope.of("sideeffect.failed", "the ticket secret could not be read now",
                                                       provider_code=env.provider_code, step="ticket.credentials"),
                                      written="no") from e
            raise _unauthorized(f"the ticket secret could not be read ({env.provider_code})",
                                env.provider_code or type(cause).__name__) from e
        try:
            return TicketCredentials.model_validate(value).headers()
        except ValidationError:  # not chained: pydantic's message quotes the input, which is the secret
            raise _unauthorized('the ticket secret is not {"bearer_token": ...} nor {"header": ..., "value": ...}',
                                "SecretShapeInvalid") from None


def _unauthorized(message: str, provider_code: str, http_status: int | None = None, step: str = "ticket.credentials"
                  ) -> SideEffectError:
    return SideEffectError(ErrorEnvelope.of("sideeffect.unauthorized", message, http_status=http_status,
                                            provider_code=provider_code, step=step), written="no", retryable=False)


class HttpTicketSystem:
    """`TicketSystem` over HTTP. `http` is passed in (a `urllib3.PoolManager`), never built at import;
    `credentials`: where the request's credential headers come from (None: none sent)."""

    def __init__(self, base_url: str, http: urllib3.PoolManager, *, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 5.0, credentials: SecretCredentials | None = None):
        problem = ticket_url_problem(base_url)
        if problem:  # refused here too: a stack deployed around the synth check still sends no credential in clear
            raise ValueError(problem)
        self.base_url = base_url.rstrip("/")
        self.http = http
        self.timeout = urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s)
        self.credentials = credentials

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
        sent = self.credentials.headers() if self.credentials else {}
        status, answer = self._send(method, path, step, data, {**headers, **sent})
        if status in UNAUTHORIZED and self.credentials is not None:
            # refused, so nothing was written: read the secret again once (rotated since it was cached?) and send
            # again only with a credential that changed
            fresh = self.credentials.headers(refresh=True)
            if fresh != sent:
                status, answer = self._send(method, path, step, data, {**headers, **fresh})
        if 200 <= status < 300:
            return answer
        err = answer.get("error")
        provider_code = str(err.get("type")) if isinstance(err, dict) and err.get("type") else f"HTTP{status}"
        if status in UNAUTHORIZED:
            raise _unauthorized(f"the ticket system refused the credentials (HTTP {status})"
                                + ("" if self.credentials else "; none are configured (ticket_secret_arn)"),
                                provider_code, status, step)
        envelope = ErrorEnvelope.of("sideeffect.failed", f"ticket system answered HTTP {status}", http_status=status,
                                    provider_code=provider_code, step=step)
        retryable = status >= 500 or status in (408, 409, 429)
        raise SideEffectError(envelope, written="no", retryable=retryable)

    def _send(self, method: str, path: str, step: str, data: bytes | None, headers: dict[str, str]
              ) -> tuple[int, JsonObject]:
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
        parsed: object
        try:
            parsed = json.loads(resp.data or b"{}")
        except ValueError:
            parsed = {}
        return resp.status, parsed if isinstance(parsed, dict) else {}
