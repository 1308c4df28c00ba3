"""Per-item DynamoDB write and read units of one job, before and after the settled count, COMPUTED.

    .venv/bin/python bench/item_units.py [--chunks 40] [--before-ref main] [--chunk-s 20]

moto reports no real consumed capacity (a constant, none for UpdateItem), so the units are computed from what
is measured: every DynamoDB request the pipeline makes to the jobs and events tables is counted per item (a
botocore hook on the real `DynamoJobs` adapter, against a moto server), and each item's size is read back after
each request and sized by DynamoDB's rules (attribute names + values). A write costs ceil(size / 1 KB) units
(the larger of the item before and after; twice that in a transaction), a strongly consistent read
ceil(size / 4 KB).

Running a 5 MB job (~1,300 chunks, ~30,000 model calls) through the in-process pipeline takes too long here, so
a smaller job (`--chunks`, default about 40 chunks of the same contract text, the local profile's fan-out) is
run whole, and the per-chunk figures are scaled to the 5 MB job's chunk count under the prod profile: its
requests per chunk as measured, its job item as large as it grows by the end of the 5 MB job (the measured size
without the settled set, plus the measured bytes per settled chunk times the 5 MB job's chunks; since the settled
count, there is no set and the item does not grow). Code whose settle writes the chunk record (one transaction
with the job item) runs with its claims and checkpoints tables on moto too: their items are counted, with no
per-item rate (one item per chunk, written while its chunk runs). The job item's units per write count its
transactional share twice.

Per-second rates on one item assume the prod fan-out window of one job in flight (40 chunks) and a chunk taking
`--chunk-s` seconds (default 20: two model-call latencies with 11 analysts at once): settles/s = window /
chunk-s. The cancellation check before the settled count read the job item before every model call; after, at most once
a second per chunk, so its reads/s lie between (chunks in flight x 1/s) and (model calls/s), whichever is
lower; the in-process run (a clock that stands still within a chunk) shows the best case (one read per chunk
attempt).

The before side is `git archive <ref>` (default `main`) unpacked in a temporary directory, run with the same
script and the same interpreter. Results: bench/results/item_units.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
KB = 1024
RESULTS = HERE / "bench" / "results" / "item_units.json"


# ----------------------------------------------------------------------------- DynamoDB item size
def _number_size(n: Any) -> int:
    digits = str(Decimal(str(n))).replace("-", "").replace(".", "").lstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def _value_size(v: dict[str, Any]) -> int:
    (kind, value), = v.items()
    if kind == "S":
        return len(value.encode("utf-8"))
    if kind == "N":
        return _number_size(value)
    if kind == "B":
        return len(value)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in value)
    if kind == "NS":
        return sum(_number_size(n) for n in value)
    if kind == "L":
        return 3 + sum(1 + _value_size(x) for x in value)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + _value_size(x) for k, x in value.items())
    raise ValueError(kind)


def item_size(item: dict[str, Any]) -> int:
    """DynamoDB's item size: each attribute's name (UTF-8 bytes) plus its value's size."""
    return sum(len(k.encode("utf-8")) + _value_size(v) for k, v in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / KB))


def read_units(size: int, consistent: bool = True) -> float:
    units = max(1, math.ceil(size / (4 * KB)))
    return units if consistent else units / 2


# ----------------------------------------------------------------------------- the measured run (child)
@dataclasses.dataclass
class ItemStats:
    writes: int = 0
    tx_writes: int = 0  # of them, in a transaction (billed twice)
    write_units: int = 0
    reads: int = 0
    read_units: float = 0.0
    max_size: int = 0
    ops: Counter[str] = dataclasses.field(default_factory=Counter)


KEY_NAMES = {"events": ["job_id", "seq"], "jobs": ["job_id"], "claims": ["job_id", "chunk_id"],
             "checkpoints": ["pk", "analyst"]}


def _label(table: str, key: dict[str, Any]) -> tuple[str, str]:
    if table == "jobs":
        return "job item", key["job_id"]["S"]
    if table == "claims":  # one item per chunk, written while its chunk runs: no hot item
        return "chunk records", "*"
    if table == "checkpoints":
        return "checkpoint items", "*"
    seq = key["seq"]["S"]
    return ("event counter item", key["job_id"]["S"]) if seq.startswith("#") else ("event items", "*")


def _keys_of(op: str, p: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool, dict[str, Any] | None]]:
    """(table, key, transactional, item put) per item the request touches."""
    if op == "TransactWriteItems":
        out = []
        for t in p["TransactItems"]:
            (_kind, body), = t.items()
            key = body.get("Key") or {k: body["Item"][k] for k in KEY_NAMES[body["TableName"]]}
            out.append((body["TableName"], key, True, body.get("Item")))
        return out
    if "Key" in p:
        return [(p["TableName"], p["Key"], False, None)]
    if "Item" in p:
        return [(p["TableName"], {k: p["Item"][k] for k in KEY_NAMES[p["TableName"]]}, False, p["Item"])]
    return []


def _create_tables(side: Any, claims_on_moto: bool) -> None:
    """The jobs and events tables (and, for code whose settle writes chunk records, claims and checkpoints) as the
    stack defines them (infra/tables.py)."""
    side.create_table(TableName="jobs", BillingMode="PAY_PER_REQUEST",
                      KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
                      AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"},
                                            {"AttributeName": "open_state", "AttributeType": "S"},
                                            {"AttributeName": "updated_at", "AttributeType": "N"}],
                      GlobalSecondaryIndexes=[{"IndexName": "by-open-state", "Projection": {"ProjectionType": "KEYS_ONLY"},
                                               "KeySchema": [{"AttributeName": "open_state", "KeyType": "HASH"},
                                                             {"AttributeName": "updated_at", "KeyType": "RANGE"}]}])
    side.create_table(TableName="events", BillingMode="PAY_PER_REQUEST",
                      KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"},
                                 {"AttributeName": "seq", "KeyType": "RANGE"}],
                      AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"},
                                            {"AttributeName": "seq", "AttributeType": "S"}])
    if claims_on_moto:
        side.create_table(TableName="claims", BillingMode="PAY_PER_REQUEST",
                          KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"},
                                     {"AttributeName": "chunk_id", "KeyType": "RANGE"}],
                          AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"},
                                                {"AttributeName": "chunk_id", "AttributeType": "S"},
                                                {"AttributeName": "lease_bucket", "AttributeType": "S"},
                                                {"AttributeName": "claim_expires_at", "AttributeType": "N"}],
                          GlobalSecondaryIndexes=[{"IndexName": "by-lease", "Projection": {"ProjectionType": "ALL"},
                                                   "KeySchema": [{"AttributeName": "lease_bucket", "KeyType": "HASH"},
                                                                 {"AttributeName": "claim_expires_at",
                                                                  "KeyType": "RANGE"}]}])
        side.create_table(TableName="checkpoints", BillingMode="PAY_PER_REQUEST",
                          KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                     {"AttributeName": "analyst", "KeyType": "RANGE"}],
                          AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                                {"AttributeName": "analyst", "AttributeType": "S"}])


def _measure(n_chunks: int) -> dict[str, Any]:
    """One job of about `n_chunks` chunks through the in-process pipeline, its jobs and events tables on a moto
    server behind the real adapter (everything else: the unit tests' fakes). Runs against whatever code tree is
    first on sys.path (this one, or the archived before tree)."""
    import inspect

    import boto3

    from contract_review.adapters.claims import DynamoClaims
    from contract_review.adapters.jobs import DynamoJobs
    from contract_review.config.profile import get_profile
    from contract_review.review.chunking import chunk_document
    from review_local.embedded import EmbeddedAws
    from tests.large_docs import large_contract
    from tests.unit.inprocess import InProcess
    from tests.unit.scenarios import small_chunk_world

    aws = EmbeddedAws().start()
    try:
        kw = {"endpoint_url": aws.endpoint, "region_name": aws.region, "aws_access_key_id": "testing",
              "aws_secret_access_key": "testing"}  # noqa: S106 (moto's)
        side = boto3.client("dynamodb", **kw)  # not counted: reads each item's size back
        # Since the settled count a settle writes the chunk record too (one transaction with the job
        # item): the code that does so gets its claims and checkpoints tables on moto as well (the before side, whose
        # jobs adapter never touches them, keeps the fakes').
        claims_on_moto = "claims_table" in inspect.signature(DynamoJobs).parameters
        _create_tables(side, claims_on_moto)
        session = boto3.Session()
        stats: dict[tuple[str, str], ItemStats] = defaultdict(ItemStats)
        table_reads: Counter[str] = Counter()  # scans and queries: not one item's
        lock = threading.Lock()

        def current_size(table: str, key: dict[str, Any]) -> int:
            r = side.get_item(TableName=table, Key=key, ConsistentRead=True)
            return item_size(r["Item"]) if "Item" in r else 0

        pending = threading.local()

        def before(params: dict[str, Any], model: Any, **_: Any) -> None:
            op = model.name
            if op in ("Scan", "Query"):
                with lock:
                    table_reads[f"{op} {params['TableName']}{'/' + params['IndexName'] if params.get('IndexName') else ''}"] += 1
                pending.touched = []
                return
            touched = _keys_of(op, params)
            pending.touched = [(t, k, tx, item, current_size(t, k)) for t, k, tx, item in touched]

        def after(http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
            op = model.name
            for table, key, tx, _item, size_before in getattr(pending, "touched", []):
                size_after = current_size(table, key)
                with lock:
                    s = stats[_label(table, key)]
                    s.ops[op] += 1
                    if op in ("GetItem",):
                        s.reads += 1
                        s.read_units += read_units(size_after, True)
                    else:
                        s.writes += 1
                        s.tx_writes += tx
                        s.write_units += write_units(max(size_before, size_after)) * (2 if tx else 1)
                    s.max_size = max(s.max_size, size_after)
            pending.touched = []

        session.events.register("before-parameter-build.dynamodb", before)
        session.events.register("after-call.dynamodb", after)
        client = session.client("dynamodb", **kw)  # after the hooks: a client copies the session's handlers

        world = small_chunk_world(chunk_target_chars=4000, chunk_min_chars=3600)
        if claims_on_moto:
            world.jobs = DynamoJobs(client, "jobs", "events", 86400, world.clock,  # type: ignore[assignment]
                                    claims_table="claims")
            world.claims = DynamoClaims(client, "claims", "checkpoints", world.artifacts, 86400,  # type: ignore[assignment]
                                        world.settings.profile.review.checkpoint_inline_max_bytes, world.clock)
        else:
            world.jobs = DynamoJobs(client, "jobs", "events", 86400, world.clock)  # type: ignore[assignment,call-arg]
        world.deps = dataclasses.replace(world.deps, jobs=world.jobs, claims=world.claims)
        p = InProcess(world)
        text = large_contract(n_chunks * 4000)
        from contract_review.domain.records import job_id_for

        p.send({"text": text}, key="item-units")
        job_id = job_id_for("item-units")
        p.intake()
        job = p.run(job_id, rounds=400)
        chunks = job.chunk_count
        final = side.get_item(TableName="jobs", Key={"job_id": {"S": job_id}}, ConsistentRead=True)["Item"]
        settled_bytes = len("settled") + _value_size(final["settled"]) if "settled" in final else 0
        prod = get_profile("prod")
        chunks_5mb = len(chunk_document(large_contract(5_000_000), prod.review))
        items = {f"{kind}": {"writes": s.writes, "tx_writes": s.tx_writes, "write_units": s.write_units, "reads": s.reads,
                             "read_units": s.read_units, "max_size_bytes": s.max_size, "ops": dict(s.ops)}
                 for (kind, _k), s in stats.items()}
        from contract_review.domain import lifecycle

        return {"state": job.state.value, "chunks": chunks, "model_calls": p.model.calls,
                "cancel_check_cached": hasattr(lifecycle, "CANCEL_CHECK_MAX_AGE_S"),
                "job_item_bytes_at_end": item_size(final), "settled_set_bytes": settled_bytes,
                "chunks_5mb": chunks_5mb, "fanout_window_prod": prod.fanout.fanout_window,
                "items": items, "table_reads": dict(table_reads)}
    finally:
        aws.stop()


# ----------------------------------------------------------------------------- scaled to 5 MB
def scaled(m: dict[str, Any], chunk_s: float) -> dict[str, Any]:
    """Per-item units per chunk (measured), the job item's size at the end of the 5 MB job, and rates."""
    n, n5 = m["chunks"], m["chunks_5mb"]
    per_chunk_settled = m["settled_set_bytes"] / n if n else 0.0
    base = m["job_item_bytes_at_end"] - m["settled_set_bytes"]
    job_5mb = int(base + per_chunk_settled * n5)
    settles_per_s = m["fanout_window_prod"] / chunk_s
    calls_per_chunk = m["model_calls"] / n
    out: dict[str, Any] = {"job_item_bytes_5mb": job_5mb, "settled_bytes_per_chunk": round(per_chunk_settled, 1),
                           "settles_per_s": settles_per_s, "model_calls_per_chunk": round(calls_per_chunk, 1),
                           "items": {}}
    for kind, s in m["items"].items():
        writes_pc, reads_pc = s["writes"] / n, s["reads"] / n
        if kind == "job item":  # its writes in a transaction (since the settled count: the settle) billed twice
            size = job_5mb
            tx_share = s.get("tx_writes", 0) / s["writes"] if s["writes"] else 0.0
            w_units, r_units = round(write_units(size) * (1 + tx_share), 2), read_units(size)
        else:  # items whose size does not grow with the document: as measured
            size = s["max_size_bytes"]
            w_units = (s["write_units"] / s["writes"]) if s["writes"] else 0
            r_units = (s["read_units"] / s["reads"]) if s["reads"] else 0
        row = {"bytes": size, "writes_per_chunk": round(writes_pc, 2), "reads_per_chunk": round(reads_pc, 2),
               "units_per_write": w_units, "units_per_consistent_read": r_units}
        if kind not in ("event items", "chunk records", "checkpoint items"):  # one item per event / chunk: no hot item
            row["wcu_per_s"] = round(writes_pc * settles_per_s * w_units, 1)
            row["rcu_per_s"] = round(reads_pc * settles_per_s * r_units, 1)
        if kind == "job item" and m.get("cancel_check_cached"):
            # the in-process clock stands still within a chunk: one cancellation read per chunk attempt is the
            # cache's best case; at worst each chunk in flight reads once a second (never more than its calls)
            calls_per_s = calls_per_chunk * settles_per_s
            worst = (reads_pc - 1) * settles_per_s + min(calls_per_s, m["fanout_window_prod"] / 1.0)
            row["rcu_per_s_worst"] = round(worst * r_units, 1)
        out["items"][kind] = row
    return out


def _child(root: Path, n_chunks: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "functions")]),
           "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
    r = subprocess.run([sys.executable, str(HERE / "bench" / "item_units.py"), "--child", "--chunks", str(n_chunks)],
                       cwd=root, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"{root}: " + "\n".join(line[:300] for line in r.stderr.splitlines()[-25:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=40, help="chunks of the measured job (scaled to 5 MB)")
    ap.add_argument("--chunk-s", type=float, default=20.0, help="seconds one chunk takes (rates)")
    ap.add_argument("--before-ref", default="main", help="git ref of the 'before' code")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "functions")]
        print(json.dumps(_measure(args.chunks)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.before_ref], cwd=HERE, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        before = _child(Path(tmp), args.chunks)
    after = _child(HERE, args.chunks)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout
    result = {"label": "COMPUTED from measured item sizes and counted requests (moto reports no consumed capacity)",
              "before_ref": args.before_ref, "after_commit": commit.strip(), "chunk_s": args.chunk_s,
              "before": {"measured": before, "5mb": scaled(before, args.chunk_s)},
              "after": {"measured": after, "5mb": scaled(after, args.chunk_s)}}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)


def _print(r: dict[str, Any]) -> None:
    b, a = r["before"], r["after"]
    print(f"per-item units on one 5 MB job (COMPUTED; measured on a {b['measured']['chunks']}-chunk job, scaled to "
          f"{b['measured']['chunks_5mb']} chunks; {b['5mb']['settles_per_s']:.1f} settles/s: window "
          f"{b['measured']['fanout_window_prod']} / {r['chunk_s']:.0f} s a chunk)")
    print(f"{'item':<20} {'':<10} {'bytes':>8} {'writes/chunk':>13} {'WCU/write':>10} {'WCU/s':>8} "
          f"{'reads/chunk':>12} {'RCU/read':>9} {'RCU/s':>8}")
    for kind in sorted(set(b["5mb"]["items"]) | set(a["5mb"]["items"])):
        for side, data in (("before", b), ("after", a)):
            row = data["5mb"]["items"].get(kind)
            if row is None:
                print(f"{kind:<20} {side:<10} {'(no such item)':>8}")
                continue
            print(f"{kind:<20} {side:<10} {row['bytes']:>8} {row['writes_per_chunk']:>13} {row['units_per_write']:>10.1f} "
                  f"{row.get('wcu_per_s', '-'):>8} {row['reads_per_chunk']:>12} {row['units_per_consistent_read']:>9.1f} "
                  f"{row.get('rcu_per_s', '-'):>8}")
    worst = a["5mb"]["items"].get("job item", {}).get("rcu_per_s_worst")
    if worst is not None:
        print(f"after, job item: {worst} RCU/s if every chunk in flight re-reads its cancellation check each second "
              f"(the table shows the in-process best case: one read per chunk attempt)")
    print(f"model calls per chunk: before {b['5mb']['model_calls_per_chunk']}, after {a['5mb']['model_calls_per_chunk']}")
    for side, data in (("before", b), ("after", a)):
        print(f"{side}: the sweeper's table-wide reads over the run {data['measured']['table_reads']}")


if __name__ == "__main__":
    main()
