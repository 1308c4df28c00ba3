"""The DynamoDB codec and the one conditional-update helper, shared by the table adapters."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any, TypedDict, Union, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError
from pydantic import BaseModel

_ser = TypeSerializer()
_de = TypeDeserializer()

Item = dict[str, Any]  # a DynamoDB item in the low-level (typed) form
PlainItem = dict[str, Any]  # an item as `deserialize` gives it back: plain values, for a record's `model_validate`
# A value as the codec takes it into an item or an expression: JSON's values, and DynamoDB's string and number sets
# (`Union`: a recursive alias names itself in quotes, which `|` does not take)
Plain = Union[str, int, float, bool, None, set[str], set[int], list["Plain"], dict[str, "Plain"]]  # noqa: UP007
# An expression's values by placeholder (`:v`, what `serialize` turns into ExpressionAttributeValues), or the fields
# of an update by name (`set_clause`)
Values = dict[str, Plain]
# One write of a TransactWriteItems (its `Update`, `ConditionCheck` or `Put`), in the low-level form
class Write(TypedDict, total=False):
    TableName: str
    Key: Item
    Item: Item
    UpdateExpression: str
    ConditionExpression: str
    ExpressionAttributeNames: dict[str, str]
    ExpressionAttributeValues: Item


class TransactItem(TypedDict, total=False):
    Update: Write
    ConditionCheck: Write
    Put: Write


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


def _dyn(value: Any) -> Any:
    """Python -> DynamoDB-safe (floats become Decimal; empty sets are not storable: dropped by callers)."""
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: _dyn(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dyn(v) for v in value]
    return value


def serialize(values: Mapping[str, Plain]) -> Item:
    return {k: _ser.serialize(_dyn(v)) for k, v in values.items()}


def deserialize(item: Item) -> PlainItem:
    return _plain({k: _de.deserialize(v) for k, v in item.items()})


def to_item(record: BaseModel, *, exclude: set[str] | None = None) -> Item:
    """A record as an item: JSON-shaped, `None` and empty sets left out."""
    data = record.model_dump(mode="json", exclude_none=True, exclude=exclude)
    for name, value in list(data.items()):
        if isinstance(getattr(record, name, None), (set, frozenset)):
            if value:
                data[name] = set(value)  # a DynamoDB string set
            else:
                del data[name]
    return serialize(data)


def model_values(record: BaseModel) -> Values:
    """A partial record (an update) as plain values for an UpdateExpression."""
    return record.model_dump(mode="json", exclude_none=True)


def is_conditional_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("ConditionalCheckFailedException",
                                                          "TransactionCanceledException")


def old_item(exc: ClientError) -> PlainItem | None:
    """The item a failed conditional write saw (`ReturnValuesOnConditionCheckFailure=ALL_OLD`)."""
    old = cast(Item, exc.response).get("Item")
    return deserialize(old) if old else None


def cancel_codes(exc: ClientError) -> list[str]:
    """Each item's reason a transaction was cancelled ("None" for an item that was not the cause)."""
    return [str(r.get("Code", "None")) for r in exc.response.get("CancellationReasons", [])]


def transact(client: Any, items: list[TransactItem], attempts: int, what: str) -> list[str] | None:
    """`items` in one transaction: None when written; when a condition failed (nothing written), each item's
    cancellation reason ("ConditionalCheckFailed" for those whose condition failed). A transaction cancelled only by
    a concurrent one on the same items (TransactionConflict) is tried again, up to `attempts` times."""
    for attempt in range(attempts):
        try:
            client.transact_write_items(TransactItems=items)
            return None
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            codes = cancel_codes(exc)
            if "ConditionalCheckFailed" in codes:
                return codes
            if not codes or any(c not in ("None", "TransactionConflict") for c in codes):
                raise
            time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # noqa: S311 (jitter, not crypto)
    raise RuntimeError(f"{what} kept conflicting ({attempts} attempts)")


class Table:
    """One table through the low-level client: the conditional update and paginated reads."""

    def __init__(self, client: Any, name: str):
        self.client = client
        self.name = name

    def update_if(self, key: Mapping[str, Plain], **kw: Any) -> PlainItem | None:
        """A conditional update_item: the new item, or None when the condition did not hold."""
        try:
            r = self.client.update_item(TableName=self.name, Key=serialize(key), ReturnValues="ALL_NEW", **kw)
        except ClientError as exc:
            if is_conditional_failure(exc):
                return None
            raise
        return deserialize(r["Attributes"])

    def put_if(self, item: Item, condition: str, **kw: Any) -> tuple[bool, PlainItem | None]:
        """A conditional put: (True, None), or (False, the existing item) when the condition failed."""
        try:
            self.client.put_item(TableName=self.name, Item=item, ConditionExpression=condition,
                                 ReturnValuesOnConditionCheckFailure="ALL_OLD", **kw)
            return True, None
        except ClientError as exc:
            if not is_conditional_failure(exc):
                raise
            return False, old_item(exc)

    def get(self, key: Mapping[str, Plain]) -> PlainItem | None:
        r = self.client.get_item(TableName=self.name, Key=serialize(key), ConsistentRead=True)
        return deserialize(r["Item"]) if "Item" in r else None

    def pages(self, operation: str, **kw: Any) -> Iterator[PlainItem]:
        """Every item of a paginated `query` or `scan`."""
        for page in self.client.get_paginator(operation).paginate(TableName=self.name, **kw):
            for item in page["Items"]:
                yield deserialize(item)


def set_clause(values: Mapping[str, Plain], prefix: str = "f") -> tuple[str, dict[str, str], Values]:
    """`#f0 = :f0, #f1 = :f1 ...` with its names and values."""
    names = {f"#{prefix}{i}": k for i, k in enumerate(values)}
    vals = {f":{prefix}{i}": v for i, v in enumerate(values.values())}
    return ", ".join(f"#{prefix}{i} = :{prefix}{i}" for i in range(len(values))), names, vals
