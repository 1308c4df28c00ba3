"""What one DynamoDB TransactWriteItems costs on the embedded AWS, by table size: moto as shipped against moto with
`review_local.embedded.roll_back_transactions_by_item` (the full soak stalled behind it).

    .venv/bin/python bench/embedded_transactions.py [--items 300,3000,10000] [--out bench/results/embedded_transactions.json]

moto deep-copies every table a transaction names before applying it; the embedded AWS serializes DynamoDB requests,
so that copy holds every other DynamoDB request of the stack. For each table size, in a fresh process per variant
(the patch is process-wide): a moto server (`ThreadedMotoServer`, as `review up`), DynamoDB requests serialized as
the embedded AWS does, one table of N items of ~1 KB (a chunk record's order of size), then 30 one-item
transactions, timed from the client. Printed side by side with the ratio; the JSON records the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSACTIONS = 30


def measure(items: int, by_item: bool) -> float:
    """Milliseconds per transaction (in this process: the patch, if any, stays on)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from review_local import embedded

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    embedded.serialize_dynamodb_requests()
    if by_item:
        embedded.roll_back_transactions_by_item()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    ddb = boto3.client("dynamodb", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")
    for start in range(0, items, 25):
        ddb.batch_write_item(RequestItems={"t": [
            {"PutRequest": {"Item": {"pk": {"S": f"k{j}"}, "text": {"S": "x" * 800},
                                     "usage": {"M": {f"f{q}": {"N": str(q)} for q in range(10)}}}}}
            for j in range(start, min(items, start + 25))]})
    started = time.perf_counter()
    for i in range(TRANSACTIONS):
        ddb.transact_write_items(TransactItems=[{"Update": {
            "TableName": "t", "Key": {"pk": {"S": f"k{i}"}}, "UpdateExpression": "SET n = :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}}}}])
    per = (time.perf_counter() - started) / TRANSACTIONS * 1000
    server.stop()
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default="300,3000,10000")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embedded_transactions.json")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: ITEMS BY_ITEM, in a fresh process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one[0]), args.one[1] == "1")))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT)])}
    rows = []
    print(f"{'items':>6} {'moto as shipped':>16} {'by item':>10} {'ratio':>7}   (ms per transaction)")
    for items in (int(n) for n in args.items.split(",")):
        shipped, by_item = (float(subprocess.run([sys.executable, __file__, "--one", str(items), flag], env=env,
                                                 check=True, capture_output=True, text=True).stdout)
                            for flag in ("0", "1"))
        rows.append({"items": items, "shipped_ms": round(shipped, 2), "by_item_ms": round(by_item, 2),
                     "ratio": round(shipped / by_item, 1)})
        print(f"{items:>6} {shipped:>16.1f} {by_item:>10.1f} {shipped / by_item:>6.1f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"transactions_per_size": TRANSACTIONS, "rows": rows, "cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
                                    "python": platform.python_version(), "machine": platform.machine(),
                                    "reproduce": "make bench-transactions"}, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
