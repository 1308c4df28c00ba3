"""The emulator keeps DynamoDB's guarantees that the product's fences and counters rely on."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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
