"""`OutcomeStore` (domain/effects.py) on Powertools idempotency: the saga's record of each side
effect's outcome, in DynamoDB on AWS and locally, in memory in the unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from contract_review.domain.effects import JsonObject

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer


class _RemainingTime:
    """What Powertools reads from a Lambda context: the invocation's remaining time. The in-progress
    record of an action expires with it (so a crashed invocation does not block the key forever)."""

    def __init__(self, remaining_ms: Callable[[], int]):
        self.get_remaining_time_in_millis = remaining_ms


class PowertoolsOutcomes:
    """`OutcomeStore` on Powertools idempotency (`@idempotent_function`), one record per key.

    The record's key is `sideeffect#<md5 of our key>` whatever function runs it (aggregator, sweeper,
    CLI), because `key_prefix` is fixed. Powertools frees an in-progress record when the invocation's
    time runs out (`remaining_ms`), and that lease is not configurable: the external system's own
    idempotency key is what really keeps an action single."""

    KEY_PREFIX = "sideeffect"

    def __init__(self, persistence: BasePersistenceLayer, expires_after_s: int):
        self.persistence = persistence
        self.expires_after_s = expires_after_s

    def once(self, key: str, act: Callable[[], JsonObject], remaining_ms: Callable[[], int]) -> JsonObject:
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

        config = IdempotencyConfig(event_key_jmespath="key", raise_on_no_idempotency_key=True,
                                   expires_after_seconds=self.expires_after_s)
        config.register_lambda_context(_RemainingTime(remaining_ms))  # type: ignore[arg-type]  # duck-typed context

        @idempotent_function(data_keyword_argument="request", persistence_store=self.persistence, config=config,
                             key_prefix=self.KEY_PREFIX)
        def run(request: dict[str, str]) -> JsonObject:
            return act()

        result: JsonObject = run(request={"key": key})
        return result
