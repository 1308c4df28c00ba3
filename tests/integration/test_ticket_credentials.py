"""The ticket system's credentials on the local stack, as on AWS: a Secrets Manager secret (in moto) that
`review up` creates and hands to the aggregator and sweeper (TICKET_SECRET_ARN), read by the real processes through
Powertools' parameters utility, and checked by the local fake of the ticket system (a third party's stand-in).

- the credentials the fake requires change but the secret does not: the job fails with sideeffect.unauthorized,
  nothing written, after the secret was read once more;
- the credential is rotated in the secret and in the fake while the processes run: the next job opens its
  ticket, without restarting anything.
And the adapter on the real Powertools provider and moto's Secrets Manager: one read cached, one more after a 403."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from aws_lambda_powertools.utilities.parameters import SecretsProvider

from contract_review.adapters.tickets import HttpTicketSystem, SecretCredentials
from contract_review.domain.effects import SideEffectError
from contract_review.domain.records import JobState, StepStatus
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.sideeffects.saga import TICKET
from review_local.embedded import EmbeddedAws
from review_local.stack import LocalStack
from review_local.ticket_service import TicketFaults, TicketServiceFake

from ..texts import RISKY
from .conftest import wait_jobs

pytestmark = pytest.mark.integration


def _counting(client: Any) -> list[str]:
    reads: list[str] = []
    client.meta.events.register("before-parameter-build.secrets-manager.GetSecretValue",
                                lambda params, **_: reads.append(params["SecretId"]))
    return reads


def test_the_adapter_reads_the_secret_once_then_again_only_after_a_refusal(aws: EmbeddedAws):
    sm = aws.client("secretsmanager")
    arn = sm.create_secret(Name="tickets", SecretString=json.dumps({"header": "X-API-Key", "value": "k1"}))["ARN"]
    reads = _counting(sm)
    with TicketServiceFake() as fake:
        fake.require("X-API-Key", "k1")
        tickets = HttpTicketSystem(fake.url, urllib3.PoolManager(), read_timeout_s=1.0,
                                   credentials=SecretCredentials(SecretsProvider(boto3_client=sm), arn, 300))
        # GIVEN two tickets opened: the secret is read once (cached for max_age)
        tickets.open("a", {"title": "t"})
        tickets.open("b", {"title": "t"})
        assert reads == [arn]
        # WHEN the key is rotated in the secret and in the system THEN the cached key's 403 reads it again, once
        sm.put_secret_value(SecretId=arn, SecretString=json.dumps({"header": "X-API-Key", "value": "k2"}))
        fake.require("X-API-Key", "k2")
        assert tickets.open("c", {"title": "t"})["id"]
        assert reads == [arn, arn] and fake.stats()["refused"] == {403: 1}
        # WHEN the system changes its key but the secret is not updated THEN one more read, then unauthorized
        fake.require("X-API-Key", "k3")
        with pytest.raises(SideEffectError) as e:
            tickets.open("d", {"title": "t"})
        assert e.value.envelope.error_code == "sideeffect.unauthorized" and not e.value.retryable
        assert reads == [arn, arn, arn] and fake.stats()["opened"] == 3


pytestmark = pytest.mark.stack(ticket_faults=TicketFaults())  # the `stack` fixture


def test_a_refused_credential_fails_the_job_unauthorized_and_a_rotation_lands_without_a_restart(stack: LocalStack):
    tickets = stack.tickets
    assert tickets is not None and stack.ticket_secret_arn
    deps = stack.deps()
    # GIVEN the ticket system now wants a credential the secret does not hold
    tickets.require_bearer("a-token-nobody-put-in-the-secret")
    # WHEN a review with a high-risk finding completes THEN the job fails with sideeffect.unauthorized, no ticket
    job_id = submission.submit(deps, None, SubmitRequest.inline(RISKY, document_id="refused")).job_id
    job = wait_jobs(deps, [job_id], timeout=120)[job_id]
    assert (job.state, job.error_code) == (JobState.FAILED, "sideeffect.unauthorized"), job.error
    assert job.error is not None and job.error.http_status == 403 and job.error.step == "ticket.open"
    assert tickets.stats()["opened"] == 0 and tickets.stats()["refused"].get(403, 0) >= 1
    # WHEN the credential is rotated in the secret and in the system, the processes still running
    stack.rotate_ticket_secret()
    job_id = submission.submit(deps, None, SubmitRequest.inline(RISKY + "\n\n6. Notices. In writing.\n", document_id="rotated")).job_id
    job = wait_jobs(deps, [job_id], timeout=120)[job_id]
    # THEN the next job opens its ticket with the new credential
    assert job.state is JobState.COMPLETED, job.error
    steps = {r.step: r for r in job.side_effects}
    assert steps[TICKET].status is StepStatus.DONE and tickets.stats()["opened"] == 1
