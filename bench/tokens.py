"""Speed and money under a tokens-per-minute quota (the shape Claude has on Bedrock), side by side in one run.

    .venv/bin/python bench/tokens.py [--chars 100000] [--tpm 600000] [--only old-layout,cached,unpaced]

The real pipeline (embedded AWS, real worker processes) against the simulated Bedrock (a stand-in, not Bedrock:
doubles/bedrock_sim.py): a tokens-per-minute quota shared by every worker process (a call reserves its input +
maxTokens when admitted and is settled at input + cache writes + 5 x output; a throttle is a 429 without
Retry-After), the account's prompt cache with the model's minimum prefix (2,048 tokens assumed for Sonnet 4.6),
LLM-like answer lengths and, unless `--fixed-latency`, Bedrock's physics (FaultSpec, off by default elsewhere): a
latency from each call's tokens (time to first token + the answer at an assumed output speed, heavy-tailed),
capacity throttles below the quota in seeded busy slots, seeded 429/5xx/timeouts, and the double's own tokenizer
(so the pacer's estimate is not its count and the pacer has to learn it). Every figure is simulated. Runs, each on a fresh stack, with the
fleet a default deploy sizes for this quota (config/fleet.py) and the workers paced to it as `-c model_tpm` sets:
- `old-layout`: the requests as the pipeline sent them before 2026-11-25 (bench/legacy_layout.py: per-analyst
  instructions under the cache minimum, the excerpt uncached in every call, maxTokens 2,048), paced;
- `cached`: today's layout (one cached prefix per chunk, a warm-up call, maxTokens per step), paced;
- `unpaced`: today's layout, the workers not told the quota (a deploy where nothing could read it).
Figures: model $ per 100 KB at the dated price table, cache-read share of prompt tokens, quota tokens per call,
makespan / the token bound (the quota tokens the job itself counted, less the first window's burst, / the quota
rate), throttled share of attempts, goodput (calls needed / attempts), and the answers' share of the model $ (the
same under both layouts) beside the prompt side's $ against the old layout. Targets print PASS/FAIL. Results: bench/results/<name>.json.
`--workers` lists fleet sizes for the knee (makespan against workers at this quota; `make bench-scaling`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from bench.quota import _ledger, _wait, calls_needed, document, git_state, print_table  # noqa: E402
from contract_review.config.fleet import fleet_for_quota  # noqa: E402
from contract_review.config.prices import PRICES  # noqa: E402
from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.domain import cost  # noqa: E402
from contract_review.domain.model import quota_tokens, traits_for  # noqa: E402
from contract_review.doubles.spec import FaultSpec  # noqa: E402
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402

LOCAL = get_profile("local")
RUNS = {  # name: (the old prompt layout, paced to the quota)
    "old-layout": (True, True),
    "cached": (False, True),
    "unpaced": (False, False),
}
TARGETS = [  # (label, run, key, comparison, bound)
    ("makespan <= 1.3 x the token bound", "cached", "makespan_vs_token_bound", "<=", 1.3),
    ("throttled <= 5 % of attempts", "cached", "throttled_share", "<=", 0.05),
    ("cache-read share >= 0.6 of prompt tokens", "cached", "cache_read_share", ">=", 0.6),
    ("model $ per 100 KB <= 0.6 x the old layout", "cached", "model_usd_vs_old_layout", "<=", 0.6),
]
COLUMNS = [("run", "name"), ("chars", "chars"), ("workers", "workers"), ("state", "state"), ("makespan s", "makespan_s"),
           ("token bound s", "token_bound_s"), ("x bound", "makespan_vs_token_bound"),
           ("attempts", "attempts"), ("needed", "calls_needed"), ("goodput", "goodput"),
           ("throttled", "throttled_share"), ("quota tok/call", "quota_tokens_per_call"),
           ("cache-read share", "cache_read_share"), ("model $/100 KB", "model_usd_per_100kb"),
           ("x old layout", "model_usd_vs_old_layout"), ("AWS $/100 KB", "aws_usd_per_100kb"), ("output $ share", "output_share_of_model_usd"),
           ("prompt $ x old", "prompt_usd_vs_old_layout")]


def run_one(template: dict[str, Any], name: str, text: str, args: argparse.Namespace, work: Path,
            workers: int) -> dict[str, Any]:
    legacy, paced = RUNS[name.split("@")[0]]
    state = work / name.replace("@", "-")
    state.mkdir(parents=True, exist_ok=True)
    log = state / "calls.jsonl"
    spec = FaultSpec.simulated_bedrock(str(state / "bedrock"), tokens_per_minute=args.tpm,
                                       median_ms=args.median_ms if args.fixed_latency else 0.0,
                                       p99_ms=args.p99_ms if args.fixed_latency else None,
                                       window_s=args.window_s, seed=11, call_log=str(log),
                                       answer_tokens_median=args.answer_median, answer_tokens_p99=args.answer_p99,
                                       model_wrapper="bench.legacy_layout:old_layout" if legacy else None,
                                       **physics(args))
    # the fleet config/fleet.py sizes; a client timeout for this latency (the local profile's 1 s is for the
    # offline model's milliseconds; a deploy's is 60 s; 9 s is the most the local worker timeout, 20 s, fits for
    # an analyst's two calls: a call slower than that ends in a read timeout, as it would at such a client)
    overrides = {"worker_max_concurrency": workers, "fanout_window": 2 * workers,
                 "model_call_timeout_s": 5 if args.fixed_latency else 9}
    env: dict[str, str] = {"PROFILE_OVERRIDES": json.dumps(overrides)}
    if paced:
        env["MODEL_TPM"] = str(args.tpm)  # what `cdk deploy -c model_tpm=N` sets on the worker
    stack = LocalStack(faults=spec, template=template, state_dir=state, concurrency={"worker": workers},
                       extra_env={"worker": env, **{f: {"PROFILE_OVERRIDES": json.dumps(overrides)} for f in ("intake", "aggregator", "sweeper")}})
    stack.start()
    try:
        deps = stack.deps()
        t0 = time.monotonic()
        job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"tokens-{name.replace('@', '-')}")).job_id
        (job,) = _wait(deps, [job_id], args.timeout)
        makespan = time.monotonic() - t0
    finally:
        stack.stop()
    calls = _ledger(log)
    outcomes = Counter(c["outcome"] for c in calls)
    model_id = LOCAL.review.model_id
    counted = quota_tokens(model_id, job.input_tokens, job.cache_write_tokens, job.output_tokens)
    prompt = job.input_tokens + job.cache_read_tokens + job.cache_write_tokens
    answered = outcomes.get("ok", 0)
    needed, _ = calls_needed(text)
    # the token bound: the least time the quota allows the tokens the job counted, its first window's burst (a
    # full bucket at the start) included
    bound = max(counted - args.tpm / 60 * args.window_s, 0) / (args.tpm / 60)
    return {
        "name": name, "workers": workers, "state": job.state.value, "error_code": job.error_code,
        "legacy_layout": legacy, "paced": paced, "chars": len(text), "makespan_s": round(makespan, 2),
        "token_bound_s": round(bound, 2), "makespan_vs_token_bound": round(makespan / bound, 2) if bound else None,
        "attempts": len(calls), "answered": answered, "calls_needed": needed, "outcomes": dict(outcomes),
        "goodput": round(needed / len(calls), 3) if calls else None,
        "throttled_share": round(outcomes.get("ThrottlingException", 0) / len(calls), 3) if calls else None,
        "quota_tokens": counted, "quota_tokens_per_call": round(counted / max(answered, 1)),
        "tokens": {"input": job.input_tokens, "output": job.output_tokens, "cache_read": job.cache_read_tokens,
                   "cache_write": job.cache_write_tokens},
        "cache_read_share": round(job.cache_read_tokens / prompt, 3) if prompt else 0.0,
        "model_usd": str(cost.usd(job.model_micro_usd)),
        "model_usd_per_100kb": round(job.model_micro_usd / 1e6 * 100_000 / len(text.encode()), 4),
        "aws_usd_per_100kb": round(job.aws_micro_usd / 1e6 * 100_000 / len(text.encode()), 4),
        "output_share_of_model_usd": round(output_usd(job.output_tokens) / (job.model_micro_usd / 1e6), 3)
        if job.model_micro_usd else None,
    }


def physics(args: argparse.Namespace) -> dict[str, Any]:
    """The simulated Bedrock's physics for this run (none with `--fixed-latency`, as the bench ran before them)."""
    if args.fixed_latency:
        return {}
    return {"ttft_ms": args.ttft_ms, "output_tokens_per_s": args.output_tps, "latency_tail_p99": args.tail_p99,
            "capacity_throttle_rate": args.capacity_throttle_rate, "capacity_slot_s": args.capacity_slot_s,
            "transient_rate": args.transient_rate, "simulated_tokenizer": True}


def typical_latency_s(args: argparse.Namespace) -> float:
    """The call latency the fleet is sized for: the fixed median, or the token latency of a median answer (its
    input's share of the time to first token left out)."""
    if args.fixed_latency:
        return float(args.median_ms) / 1000
    return float(args.ttft_ms) / 1000 + args.answer_median / args.output_tps


def output_usd(output_tokens: int) -> float:
    """What the answers cost at the dated price table: the same under both layouts (they answer alike)."""
    price = cost.model_price(PRICES, LOCAL.review.model_id).price
    return float(price.output_per_1k) * output_tokens / 1000 if price else 0.0


def verdicts(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, run, key, op, bound in TARGETS:
        value = runs.get(run, {}).get(key)
        if value is None:
            continue
        ok = value >= bound if op == ">=" else value <= bound
        out.append({"target": label, "run": run, "value": value, "verdict": "PASS" if ok else "FAIL"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="tokens")
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--chars", default="100000",
                    help="document size (a ~100 KB contract); a list runs the scaling series")
    ap.add_argument("--tpm", type=float, default=600_000.0, help="the tokens-per-minute quota")
    ap.add_argument("--fixed-latency", action="store_true",
                    help="the latency as before the simulated Bedrock's physics: lognormal from --median-ms/--p99-ms, "
                         "whatever the answer's length; no capacity throttles, no injected faults, the pacer's count")
    ap.add_argument("--median-ms", type=float, default=800.0, help="with --fixed-latency")
    ap.add_argument("--p99-ms", type=float, default=2000.0, help="with --fixed-latency")
    defaults = FaultSpec()
    ap.add_argument("--ttft-ms", type=float, default=500.0, help="time to first token, before its growth with input")
    ap.add_argument("--output-tps", type=float, default=defaults.output_tokens_per_s,
                    help="output tokens per second (an assumption: AWS publishes none; FaultSpec's default)")
    ap.add_argument("--tail-p99", type=float, default=defaults.latency_tail_p99,
                    help="99th percentile of the latency's tail factor (FaultSpec's default, an assumption)")
    ap.add_argument("--capacity-throttle-rate", type=float, default=0.02,
                    help="share of time slots in which the service throttles every call, below the quota")
    ap.add_argument("--capacity-slot-s", type=float, default=2.0)
    ap.add_argument("--transient-rate", type=float, default=0.01, help="seeded 429/5xx/timeouts, a third each")
    ap.add_argument("--window-s", type=float, default=10.0,
                    help="the quota's burst window (Bedrock: 60 s; scaled down so a one-minute run is not all burst, "
                         "and long enough for the calls in flight to hold their reservations, as on Bedrock)")
    ap.add_argument("--answer-median", type=float, default=150.0, help="answer tokens, median (an LLM: 100-400)")
    ap.add_argument("--answer-p99", type=float, default=600.0)
    ap.add_argument("--workers", default="", help="fleet sizes to run instead of the one config/fleet.py sizes")
    ap.add_argument("--timeout", type=float, default=400.0)
    ap.add_argument("--source", choices=("samples", "cuad"), default="samples")
    args = ap.parse_args()
    template = synth("local")
    work = ROOT / ".review" / "bench-tokens" / args.name
    shutil.rmtree(work, ignore_errors=True)
    fleet = fleet_for_quota(args.tpm, typical_latency_s(args))
    fleets = [int(w) for w in args.workers.split(",")] if args.workers else [fleet.workers]
    sizes = [int(c) for c in args.chars.split(",")]
    minimum = traits_for(LOCAL.review.model_id).min_cache_tokens
    runs: dict[str, dict[str, Any]] = {}
    point = len(fleets) == 1 and len(sizes) == 1  # one point: old layout, cached and unpaced side by side
    for chars in sizes:
        text = document(chars, args.source)
        for workers in fleets:
            for name in args.only.split(","):
                key = name if point else f"{name}@{chars}c{workers}w"
                latency = (f"{args.median_ms:g} ms median (fixed)" if args.fixed_latency else
                           f"latency from tokens ({args.ttft_ms:g} ms to first token, {args.output_tps:g} tokens/s), "
                           f"capacity throttles {args.capacity_throttle_rate:g}, faults {args.transient_rate:g}, "
                           f"the double's tokenizer")
                print(f"{key}: {chars} chars, {args.tpm:,.0f} tokens/min, {workers} workers, {latency}, "
                      f"cache minimum {minimum} tokens (assumed)", flush=True)
                runs[key] = run_one(template, key, text, args, work, workers)
    old = {k.split("@")[-1] if "@" in k else "": r for k, r in runs.items() if k.startswith("old-layout")}
    for key, r in runs.items():
        base = old.get(key.split("@")[-1] if "@" in key else "")
        if base and base["model_usd_per_100kb"]:
            r["model_usd_vs_old_layout"] = round(r["model_usd_per_100kb"] / base["model_usd_per_100kb"], 2)
            # the prompt side alone (input, cache reads and writes): what the layout changes
            prompt, old_prompt = (x["model_usd_per_100kb"] * (1 - (x["output_share_of_model_usd"] or 0))
                                  for x in (r, base))
            r["prompt_usd_vs_old_layout"] = round(prompt / old_prompt, 2) if old_prompt else None
    result: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "git": git_state(), "settings": vars(args), "simulated": True,
        "assumed": {"model_id": LOCAL.review.model_id, "min_cache_tokens": minimum,
                    "output_burndown": traits_for(LOCAL.review.model_id).output_burndown,
                    "fleet_for_quota": fleet.__dict__, "prices_as_of": PRICES.as_of,
                    "physics": physics(args), "typical_latency_s": typical_latency_s(args)},
        "runs": runs, "targets": verdicts(runs) if point else [],
        "reproduce": f".venv/bin/python bench/tokens.py --name {args.name} --only {args.only} --chars {args.chars} "
                     f"--tpm {args.tpm:g}" + (f" --workers {args.workers}" if args.workers else "")
                     + (" --fixed-latency" if args.fixed_latency else ""),
    }
    out = ROOT / "bench" / "results" / f"{args.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(f"{args.name}: {args.chars} chars, {args.tpm:,.0f} tokens/min (simulated Bedrock)", COLUMNS,
                list(runs.values()))
    for v in result["targets"]:
        print(f"{v['verdict']}  {v['target']}: {v['value']}")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
