"""The emulator keeps DynamoDB's guarantees that the product's fences and counters rely on."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from review_local.embedded import EmbeddedAws

THREADS, EACH = 10, 60


def test_concurrent_updates_of_one_item_are_atomic_as_on_dynamodb(aws: EmbeddedAws) -> None:
    # GIVEN one item, and many clients updating it at once, as the workers and the aggregator do with a
    # job's event counter (each update also adds attributes, which moto's unlocked backend raced on)
    ddb = aws.client("dynamodb")
    ddb.create_table(TableName="counter", KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")
    ddb.put_item(TableName="counter", Item={"k": {"S": "job"}})

    def increments(i: int) -> list[int]:
        client = aws.client("dynamodb")
        numbers = []
        for j in range(EACH):
            r = client.update_item(
                TableName="counter", Key={"k": {"S": "job"}}, UpdateExpression="ADD n :one, s :s SET #a = :one",
                ExpressionAttributeNames={"#a": f"x{i}_{j % 5}"}, ReturnValues="UPDATED_NEW",
                ExpressionAttributeValues={":one": {"N": "1"}, ":s": {"SS": [f"{i}-{j}"]}})
            numbers.append(int(r["Attributes"]["n"]["N"]))
        return numbers

    # WHEN they all ADD 1 and read the new value back
    with ThreadPoolExecutor(THREADS) as pool:
        numbers = [n for ns in pool.map(increments, range(THREADS)) for n in ns]
    # THEN every update got a number of its own and none was lost (the event sequence's contract)
    assert sorted(numbers) == list(range(1, THREADS * EACH + 1))
    item = ddb.get_item(TableName="counter", Key={"k": {"S": "job"}}, ConsistentRead=True)["Item"]
    assert int(item["n"]["N"]) == THREADS * EACH and len(item["s"]["SS"]) == THREADS * EACH


def _table(ddb: Any, name: str, range_key: bool) -> None:
    keys = [("pk", "HASH")] + ([("sk", "RANGE")] if range_key else [])
    ddb.create_table(TableName=name, KeySchema=[{"AttributeName": k, "KeyType": t} for k, t in keys],
                     AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k, _ in keys],
                     BillingMode="PAY_PER_REQUEST")


def _scan(ddb: Any, name: str) -> list[dict[str, Any]]:
    return sorted(ddb.scan(TableName=name, ConsistentRead=True)["Items"], key=lambda i: json.dumps(i, default=repr))


@pytest.mark.parametrize("range_key", [False, True], ids=["hash-key", "hash-and-range-key"])
def test_a_cancelled_transaction_writes_nothing_and_a_committed_one_everything(aws: EmbeddedAws,
                                                                               range_key: bool) -> None:
    # GIVEN two tables holding items (one with a binary attribute), as the jobs and chunks tables do
    ddb = aws.client("dynamodb")
    name, other = f"tx-{range_key}", f"tx-other-{range_key}"
    _table(ddb, name, range_key)
    _table(ddb, other, range_key)

    def key(pk: str) -> dict[str, Any]:
        return {"pk": {"S": pk}, **({"sk": {"S": "s"}} if range_key else {})}

    ddb.put_item(TableName=name, Item={**key("a"), "n": {"N": "1"}, "b": {"B": b"\x00\x01"}})
    ddb.put_item(TableName=other, Item={**key("x"), "n": {"N": "1"}})
    before = (_scan(ddb, name), _scan(ddb, other))
    # WHEN a transaction updates an item, deletes one, puts a new one, and then fails a condition (last)
    refused = {"ConditionCheck": {"TableName": other, "Key": key("x"), "ConditionExpression": "n = :two",
                                  "ExpressionAttributeValues": {":two": {"N": "2"}}}}
    writes = [
        {"Update": {"TableName": name, "Key": key("a"), "UpdateExpression": "SET n = n + :one, c = :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}}}},
        {"Delete": {"TableName": other, "Key": key("x")}},
        {"Put": {"TableName": name, "Item": {**key("new"), "n": {"N": "9"}}}},
    ]
    with pytest.raises(ClientError) as cancelled:
        ddb.transact_write_items(TransactItems=[*writes[:1], writes[2], refused])
    with pytest.raises(ClientError):
        ddb.transact_write_items(TransactItems=[writes[0], writes[2], {  # the same item twice: refused whole
            "Update": {"TableName": name, "Key": key("a"), "UpdateExpression": "SET d = :one",
                       "ExpressionAttributeValues": {":one": {"N": "1"}}}}])
    # THEN nothing of either is written: every item as it was, the new one absent
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert (_scan(ddb, name), _scan(ddb, other)) == before
    # AND a transaction whose conditions hold writes all of it
    ddb.transact_write_items(TransactItems=writes)
    items = {i["pk"]["S"]: i for i in _scan(ddb, name)}
    assert (items["a"]["n"], items["a"]["c"], items["new"]["n"]) == ({"N": "2"}, {"N": "1"}, {"N": "9"})
    assert items["a"]["b"] == {"B": b"\x00\x01"} and _scan(ddb, other) == []
