"""On the in-memory repositories (tests/counting_races.py; the same scenarios run on
moto in tests/integration/test_counting_on_moto.py)."""

from __future__ import annotations

from ... import counting_races as races
from ..fakes import FakeWorld


def test_two_retries_of_one_ended_job_at_once_count_each_chunk_once():
    races.two_retries_at_once(FakeWorld().deps)


def test_a_redrive_between_the_aggregators_read_and_its_settle_is_not_counted():
    races.redrive_inside_the_settle(FakeWorld().deps)


def test_an_aggregator_that_dies_after_counting_leaves_the_event_to_the_redelivery_once():
    races.aggregator_dies_after_counting(FakeWorld().deps)
