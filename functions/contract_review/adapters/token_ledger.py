"""`TokenLedger` (domain/ports.py) on a DynamoDB table: the daily token ledger every worker shares.

Items, keyed (`model`, `hour`), hour = epoch seconds // the bucket's length (an hour in every deployed profile):
- one counter per model per hour, `tokens`, added to with an atomic `ADD` (each worker flushes what its calls
  counted about once a minute and at the end of each chunk attempt: far below one write per call), expiring two
  days after its hour (the table's TTL attribute; reads never rely on TTL deletion: the query names its hours);
- one control item per model at `hour` = CONTROL_HOUR (past every real hour, so the same query returns it):
  `since_hour` (count from here on: a probe succeeded) and `probe_hour` (the last hold start or probe).
One query reads a model's last 24 counters and its control.

The spend limits (operate/limits.py, domain/spend_cap.py) keep their counters here too, under their own partition
keys (`spend#<owner>` and `stackspend#admitted|recorded` by UTC day, `requests#<owner>` by minute): `take` adds within a limit, in one conditional write;
`take_once` adds under a charge id (the job a submission admits), with a record of the charge at
(`charge#<id>`, CONTROL_HOUR) written in the same transaction, so a replay of the admission takes nothing again, and
`give_back` undoes it (the record expired, the amount taken off, together).
"""

from __future__ import annotations

from typing import Any

from contract_review.domain.ports import Charge, LedgerWindow, Taken

from .dynamo import Table, TransactItem, serialize, transact

CONTROL_HOUR = 10**15  # the control item's sort key: after every hour (even at test bucket lengths)
KEEP_HOURS = 48  # a counter outlives its 24-hour window by a day before TTL may delete it
CHARGE_PREFIX = "charge#"  # a charge's record: partition `charge#<id>`, sort key CONTROL_HOUR
TRANSACT_ATTEMPTS = 10  # a transaction cancelled by a concurrent one on the same items (not a condition) again


class DynamoTokenLedger:
    def __init__(self, client: Any, table: str, bucket_s: float):
        self.table = Table(client, table)
        self.bucket_s = bucket_s

    def add(self, model_id: str, hour: int, tokens: int) -> None:
        self.table.client.update_item(
            TableName=self.table.name, Key=serialize({"model": model_id, "hour": hour}),
            UpdateExpression="ADD tokens :n SET expires_at = if_not_exists(expires_at, :ttl)",
            ExpressionAttributeValues=serialize({":n": tokens, ":ttl": int((hour + KEEP_HOURS) * self.bucket_s)}))

    def window(self, model_id: str, first_hour: int) -> LedgerWindow:
        hours: dict[int, int] = {}
        since, probe = 0, None
        for item in self.table.pages("query", KeyConditionExpression="#m = :m AND #h >= :h",
                                     ExpressionAttributeNames={"#m": "model", "#h": "hour"},
                                     ExpressionAttributeValues=serialize({":m": model_id, ":h": first_hour}),
                                     ConsistentRead=True):
            if int(item["hour"]) == CONTROL_HOUR:
                since = int(item.get("since_hour", 0))
                probe = int(item["probe_hour"]) if "probe_hour" in item else None
            else:
                hours[int(item["hour"])] = int(item.get("tokens", 0))
        return LedgerWindow(hours=hours, since_hour=since, probe_hour=probe)

    def claim_probe(self, model_id: str, hour: int, seen: int | None) -> bool:
        cond = "attribute_not_exists(#p)" if seen is None else "#p = :seen"
        values = {":h": hour, **({":seen": seen} if seen is not None else {})}
        return self.table.update_if({"model": model_id, "hour": CONTROL_HOUR}, UpdateExpression="SET #p = :h",
                                    ConditionExpression=cond, ExpressionAttributeNames={"#p": "probe_hour"},
                                    ExpressionAttributeValues=serialize(values)) is not None

    def lift(self, model_id: str, hour: int) -> None:
        self.table.client.update_item(
            TableName=self.table.name, Key=serialize({"model": model_id, "hour": CONTROL_HOUR}),
            UpdateExpression="SET #s = :h REMOVE #p", ExpressionAttributeNames={"#s": "since_hour", "#p": "probe_hour"},
            ExpressionAttributeValues=serialize({":h": hour}))

    def take(self, counter: str, window: int, amount: int, limit: int, expires_at: int) -> int | None:
        if amount > limit:
            return None
        item = self.table.update_if(
            {"model": counter, "hour": window}, UpdateExpression="ADD #n :a SET expires_at = if_not_exists(expires_at, :ttl)",
            ConditionExpression="attribute_not_exists(#n) OR #n <= :room", ExpressionAttributeNames={"#n": "tokens"},
            ExpressionAttributeValues=serialize({":a": amount, ":room": limit - amount, ":ttl": expires_at}))
        return int(item["tokens"]) if item is not None else None

    def count(self, counter: str, window: int) -> int:
        item = self.table.get({"model": counter, "hour": window})
        return int(item.get("tokens", 0)) if item is not None else 0

    def take_once(self, charge: Charge, limit: int, now: int) -> Taken:
        room = limit - charge.amount  # below 0: refused whatever the count (a missing count compares false)
        codes = self._transact([
            {"Put": {"TableName": self.table.name, "Item": serialize({
                "model": CHARGE_PREFIX + charge.charge_id, "hour": CONTROL_HOUR, "counter": charge.counter,
                "window": charge.window, "amount": charge.amount, "expires_at": charge.expires_at}),
                # a record past its expiry, or given back, is no record (its time is compared here: TTL deletes
                # it days later, moto never)
                "ConditionExpression": "attribute_not_exists(#m) OR #e < :now",
                "ExpressionAttributeNames": {"#m": "model", "#e": "expires_at"},
                "ExpressionAttributeValues": serialize({":now": now})}},
            {"Update": {"TableName": self.table.name, "Key": serialize({"model": charge.counter, "hour": charge.window}),
                        "UpdateExpression": "ADD #n :a SET expires_at = if_not_exists(expires_at, :ttl)",
                        "ConditionExpression": ("attribute_not_exists(#n) OR " if room >= 0 else "") + "#n <= :room",
                        "ExpressionAttributeNames": {"#n": "tokens"},
                        "ExpressionAttributeValues": serialize({":a": charge.amount, ":room": room,
                                                                ":ttl": charge.expires_at})}},
        ])
        if codes is None:
            return Taken.NOW
        return Taken.BEFORE if codes[0] == "ConditionalCheckFailed" else Taken.REFUSED

    def give_back(self, charge: Charge) -> bool:
        """The record expired at once (`expires_at` 0: no record for `take_once`, deleted by TTL) and its amount
        taken off, together; conditional on the record being this charge's, not given back yet."""
        return self._transact([
            {"Update": {"TableName": self.table.name,
                        "Key": serialize({"model": CHARGE_PREFIX + charge.charge_id, "hour": CONTROL_HOUR}),
                        "UpdateExpression": "SET #e = :gone",
                        "ConditionExpression": "#e = :exp AND #a = :a AND #w = :w",
                        "ExpressionAttributeNames": {"#e": "expires_at", "#a": "amount", "#w": "window"},
                        "ExpressionAttributeValues": serialize({":gone": 0, ":exp": charge.expires_at,
                                                                ":a": charge.amount, ":w": charge.window})}},
            {"Update": {"TableName": self.table.name, "Key": serialize({"model": charge.counter, "hour": charge.window}),
                        "UpdateExpression": "ADD #n :minus", "ConditionExpression": "attribute_exists(#n)",
                        "ExpressionAttributeNames": {"#n": "tokens"},
                        "ExpressionAttributeValues": serialize({":minus": -charge.amount})}},
        ]) is None

    def _transact(self, items: list[TransactItem]) -> list[str] | None:
        """`items` in one transaction (dynamo.transact): None when written, else each item's cancellation reason."""
        return transact(self.table.client, items, TRANSACT_ATTEMPTS, "a spend charge")
