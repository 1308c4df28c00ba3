"""Issue 25 findings 8, 9 and 10 on the real adapters (DynamoDB transactions and conditional writes) against the
deployed template on moto: the scenarios of tests/counting_races.py, one repository call wrapped in each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from contract_review.domain.ports import Deps, Queue
from review_local.connect import local_deps
from review_local.embedded import EmbeddedAws

from .. import counting_races as races
from .conftest import deployed


@pytest.fixture(scope="module")
def embedded(local_template: dict[str, Any]) -> Iterator[EmbeddedAws]:
    with deployed(local_template) as aws:
        yield aws


@pytest.fixture
def deps(embedded: EmbeddedAws) -> Deps:
    deps = local_deps(embedded.outputs, embedded.region, embedded.endpoint, "local")
    for q in Queue:  # every case starts with empty queues
        for m in deps.queues.take_all(q):
            deps.queues.delete(q, m.receipt_handle)
    return deps


def test_two_retries_of_one_ended_job_at_once_count_each_chunk_once_on_dynamodb(deps: Deps):
    races.two_retries_at_once(deps)


def test_a_redrive_between_the_aggregators_read_and_its_settle_is_not_counted_on_dynamodb(deps: Deps):
    races.redrive_inside_the_settle(deps)


def test_an_aggregator_that_dies_after_counting_leaves_the_event_to_the_redelivery_once_on_dynamodb(deps: Deps):
    races.aggregator_dies_after_counting(deps)
