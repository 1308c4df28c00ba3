"""The counting races on the real adapters (DynamoDB transactions and conditional writes) against the
deployed template on moto: the scenarios of tests/counting_races.py, one repository call wrapped in each."""

from __future__ import annotations

import pytest

from contract_review.domain.ports import Deps
from review_local.embedded import EmbeddedAws

from .. import counting_races as races
from .conftest import emptied


@pytest.fixture
def deps(embedded: EmbeddedAws) -> Deps:
    return emptied(embedded)


def test_two_retries_of_one_ended_job_at_once_count_each_chunk_once_on_dynamodb(deps: Deps):
    races.two_retries_at_once(deps)


def test_a_redrive_between_the_aggregators_read_and_its_settle_is_not_counted_on_dynamodb(deps: Deps):
    races.redrive_inside_the_settle(deps)


def test_an_aggregator_that_dies_after_counting_leaves_the_event_to_the_redelivery_once_on_dynamodb(deps: Deps):
    races.aggregator_dies_after_counting(deps)
