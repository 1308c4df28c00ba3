"""Speed under a model quota: the real pipeline (embedded AWS, real worker processes) against the simulated
Bedrock (a stand-in, not Bedrock: `FaultSpec.simulated_bedrock`, faults.py) with a requests-per-minute quota
shared by every worker process.

    .venv/bin/python bench/quota.py [--name quota] [--only before,after,faults] [--rpm 600] [--workers 20]

Runs, side by side on the same document and quota (each a fresh stack):
- `before`: analysts one by one (`analyst_concurrency` 1), the pipeline as it was;
- `concurrent`: analysts concurrently (the profile's default), calls not paced;
- `after`: analysts concurrently, each worker pacing its calls (model/pacing.py: its share of the quota, AIMD);
- `faults`: `after` with 5 % transient model faults and one `kill -9` of a worker mid-chunk per document;
- `baseline-clean` and `baseline`: THE BASELINE (bench/baseline/handler.py: what a developer writes with
  Powertools alone: BatchProcessor, idempotency on the whole chunk, analysts one by one, fixed retries, no
  claims, checkpoints or heartbeats) on the same document, quota and workers, without faults, and with the
  `faults` run's 5 % faults and kill; every figure of `after` / `faults` is also shown as a ratio to it.
`--sizes 10000,100000,1000000` runs the scaling series instead (`after` at each size).
For each: makespan and its ideal (max of the quota bound, calls needed / quota, and the critical-path
bound, the slowest chunk's calls in sequence / its analysts' concurrency x the median latency), goodput
(calls needed / calls made), redone work, quota utilisation, throttled share of calls, AWS requests per
model call by service and operation (counted at the moto server, the bench's own polling excluded),
orchestration $ per 1,000 model calls (bench/prices.py) beside Step Functions Standard with one task state
per call, crash recovery latency, and jobs completed / failed with a code / silently incomplete (tests/oracle.py).
PASS/FAIL against the targets below are printed as measured. Results: bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from bench import prices  # noqa: E402
from bench.baseline import run as baseline  # noqa: E402
from bench.compare import baseline_wins, compare  # noqa: E402
from contract_review.config.profile import get_profile
from contract_review.domain.ports import Deps  # noqa: E402
from contract_review.domain.records import ChunkStatus, Job  # noqa: E402
from contract_review.doubles.offline_model import OfflineRuleModel  # noqa: E402
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission  # noqa: E402
from contract_review.operate.submission import SubmitRequest  # noqa: E402
from contract_review.review.analysts import analysts_for, run_analyst  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402
from review_local.embedded import synth  # noqa: E402
from review_local.stack import LocalStack  # noqa: E402

LOCAL = get_profile("local")
OBSERVER = "bench-observer"  # the bench's own AWS requests carry this app id and are not counted
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
POLLING = {"ReceiveMessage"}  # the event-source mapping's polling (Lambda's poller on AWS): reported apart


# --- AWS requests, counted at the moto server ---------------------------------------------------------------

class RequestCounter:
    """Counts every request the embedded moto server answers, by (service, operation)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def install(self) -> None:
        from moto import server

        original = server.DomainDispatcherApplication.__call__
        counter = self

        def counting(app: Any, environ: dict[str, Any], start_response: Any) -> Any:
            key = classify_request(environ)
            if key is not None:
                with counter.lock:
                    counter.counts[key] += 1
            return original(app, environ, start_response)
        server.DomainDispatcherApplication.__call__ = counting  # type: ignore[method-assign]

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self.lock:
            return Counter(self.counts)


def classify_request(environ: dict[str, Any]) -> tuple[str, str] | None:
    path = environ.get("PATH_INFO", "")
    if path.startswith("/moto-api") or OBSERVER in environ.get("HTTP_USER_AGENT", ""):
        return None
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        prefix, _, op = target.partition(".")
        service = "dynamodb" if prefix.startswith("DynamoDB") else "sqs" if prefix.startswith("AmazonSQS") else prefix
        return service, op
    query = environ.get("QUERY_STRING", "")
    if "Action=" in query:
        return "query", query.split("Action=", 1)[1].split("&", 1)[0]
    method = environ.get("REQUEST_METHOD", "GET")
    return "s3", {"GET": "GetObject", "PUT": "PutObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(
        method, method)


# --- the workload ---------------------------------------------------------------------------------------------

CUAD = ROOT.parent / "shared" / "data" / "cuad"


def document(n_chars: int, source: str = "samples") -> str:
    """About `n_chars` of contract text: the samples (or the CUAD contracts in ../shared, when there),
    repeated under numbered parts."""
    folder = CUAD if source == "cuad" else ROOT / "samples"
    if source == "cuad" and not folder.is_dir():
        raise SystemExit(f"--source cuad needs {folder} (absent here)")
    texts = [p.read_text() for p in sorted(folder.glob("*.txt")) if not p.name.startswith("CUAD_v1")]
    out, part = [], 0
    while sum(len(t) for t in out) < n_chars:
        part += 1
        out.append(f"\n\nPART {part}\n\n" + texts[part % len(texts)])
    return "".join(out)[:n_chars]


def calls_needed(text: str) -> tuple[int, int]:
    """Model calls a fault-free run needs (every analyst of every chunk, offline rule model), and the
    most calls one chunk needs in sequence (its critical path: locate, then assess, per analyst)."""
    model = OfflineRuleModel()
    total, longest = 0, 0
    for chunk in chunk_document(text, LOCAL.review):
        per = [run_analyst(s, chunk, lambda b, p: (p(model.invoke(b(None))), 1)).model_calls
               for s in analysts_for(LOCAL.review.analyst_count)]
        total += sum(per)
        longest = max(longest, max(per))
    return total, longest


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _wait(deps: Deps, job_ids: list[str], timeout: float) -> list[Job]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [deps.jobs.get(j) for j in job_ids]
        if all(j is not None and j.terminal for j in jobs):
            return [j for j in jobs if j is not None]
        time.sleep(0.2)
    raise TimeoutError(job_ids)


def _kill_one(deps: Deps, job_id: str, deadline_s: float) -> tuple[float, str] | None:
    """kill -9 the worker of a chunk that has checkpointed an analyst; (killed at, chunk id)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for c in deps.claims.for_job(job_id):
            if c.status is ChunkStatus.CLAIMED and c.checkpoints and c.claimed_by:
                try:
                    os.kill(int(c.claimed_by.split(":")[1]), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                return time.time(), c.chunk_id
        time.sleep(0.05)
    return None


def _oracle(deps: Deps, job: Job, text: str) -> dict[str, Any]:
    try:
        from tests.oracle import check_job
    except ImportError:
        return {"problems": ["tests/oracle.py absent"], "silently_incomplete": None}
    check = check_job(deps, job.job_id, text)
    return {"problems": check.problems, "silently_incomplete": check.silently_incomplete}


def simulated_bedrock(state: Path, args: argparse.Namespace, transient: float) -> tuple[Path, Path, FaultSpec]:
    """A run's state directory, its call ledger, and the simulated Bedrock every run (ours, the baseline) uses."""
    state.mkdir(parents=True, exist_ok=True)
    log = state / "calls.jsonl"
    spec = FaultSpec.simulated_bedrock(str(state / "quota"), requests_per_minute=args.rpm, median_ms=args.median_ms,
                                       p99_ms=args.p99_ms, window_s=args.window_s, transient_rate=transient,
                                       seed=11, call_log=str(log))
    return state, log, spec


def scenario(template: dict[str, Any], name: str, text: str, args: argparse.Namespace, work: Path,
             overrides: dict[str, Any], transient: float = 0.0, kill: bool = False) -> dict[str, Any]:
    state, log, spec = simulated_bedrock(work / name, args, transient)
    env = {"worker": {"PROFILE_OVERRIDES": json.dumps(overrides)}} if overrides else {}
    stack = LocalStack(faults=spec, template=template, state_dir=state, concurrency={"worker": args.workers},
                       extra_env=env)
    counter.counts.clear()
    stack.start()
    try:
        os.environ["AWS_SDK_UA_APP_ID"] = OBSERVER  # the bench's own clients: not counted
        deps = stack.deps()
        os.environ.pop("AWS_SDK_UA_APP_ID", None)
        base = counter.snapshot()
        t0 = time.monotonic()
        job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"quota-{name}")).job_id
        killed = _kill_one(deps, job_id, 60) if kill else None
        (job,) = _wait(deps, [job_id], args.timeout)
        makespan = time.monotonic() - t0
        requests = counter.snapshot() - base
        recovery_s = None
        if killed is not None:
            rec = deps.claims.get(job_id, killed[1])
            recovery_s = round(rec.claimed_at - killed[0], 2) if rec and rec.claimed_at else None
        return summarize(name, job.state.value, job.error_code, makespan, _ledger(log), requests, text, args,
                         overrides, transient, recovery_s, _oracle(deps, job, text))
    finally:
        stack.stop()


def baseline_scenario(name: str, text: str, args: argparse.Namespace, work: Path, transient: float = 0.0,
                      kill: bool = False) -> dict[str, Any]:
    """THE BASELINE (bench/baseline/handler.py: Powertools BatchProcessor + idempotency, fixed retries) on
    the same document, simulated Bedrock, quota, faults and kill; summarized like a pipeline run."""
    from tests.oracle import oracle_for

    state, log, spec = simulated_bedrock(work / name, args, transient)
    expected, needed = baseline.expected_by_chunk(oracle_for(text, LOCAL))
    counter.counts.clear()
    marks: dict[str, Counter[tuple[str, str]]] = {}
    run = baseline.run_baseline(profile=LOCAL, spec=spec, text=text, workers=args.workers,
                                timeout_s=args.baseline_timeout, state_dir=state, observer=OBSERVER, kill=kill,
                                on_start=lambda: marks.setdefault("base", counter.snapshot()),
                                expected=expected, needed_by_chunk=needed)
    requests = counter.snapshot() - marks["base"]
    out = summarize(name, run.state, None if run.state == "completed" else "(none: no job record)", run.makespan_s,
                    _ledger(log), requests, text, args, {"analyst_concurrency": 1}, transient, run.recovery_s,
                    run.oracle)
    out.update(baseline=True, chunks_done=run.chunks_done, dead_lettered=run.dead_lettered,
               worker_restarts=run.worker_restarts,
               retries={"max_attempts": baseline_handler_setting("MAX_ATTEMPTS"),
                        "wait_s": baseline_handler_setting("WAIT_S")})
    return out


def baseline_handler_setting(name: str) -> Any:
    """A constant of the baseline handler, read from its source (importing it needs its Lambda environment)."""
    import ast

    tree = ast.parse((ROOT / "bench" / "baseline" / "handler.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def summarize(name: str, state: str, error_code: str | None, makespan: float, calls: list[dict[str, Any]], requests: Counter[tuple[str, str]],
              text: str, args: argparse.Namespace, overrides: dict[str, Any], transient: float,
              recovery_s: float | None, oracle: dict[str, Any]) -> dict[str, Any]:
    needed, longest = calls_needed(text)
    quota_per_s = args.rpm / 60
    concurrency = overrides.get("analyst_concurrency", LOCAL.review.analyst_concurrency)
    critical = (2 if concurrency >= LOCAL.review.analyst_count else longest) * args.median_ms / 1000
    ideal = max(needed / quota_per_s, 2 * args.median_ms / 1000)
    outcomes = Counter(c["outcome"] for c in calls)
    span = (max(c["at"] for c in calls) - min(c["started_at"] for c in calls)) if calls else 0.0
    ok = outcomes.get("ok", 0)
    made = len(calls)
    model_calls = max(ok, 1)
    polling = {f"{s}.{o}": n for (s, o), n in requests.items() if o in POLLING}
    orchestration = {f"{s}.{o}": n for (s, o), n in sorted(requests.items()) if o not in POLLING}
    writes = sum(n for (s, o), n in requests.items() if s == "dynamodb" and o in WRITES)
    chunks = len(chunk_document(text, LOCAL.review))
    cost = prices.orchestration_usd(orchestration)
    polling_cost = prices.orchestration_usd(polling)
    ours_per_1k = prices.usd_per_1k_calls(cost.usd, model_calls)
    sfn_per_1k = prices.usd_per_1k_calls(prices.step_functions_usd(made, chunks), model_calls)
    return {
        "name": name, "analyst_concurrency": concurrency, "transient_rate": transient, "state": state,
        "error_code": error_code, "chars": len(text), "chunks": chunks, "makespan_s": round(makespan, 2), "ideal_s": round(ideal, 2),
        "makespan_vs_ideal": round(makespan / ideal, 2), "critical_path_bound_s": round(critical, 2),
        "model_call_span_s": round(span, 2),  # first call's start to last call's end: the rest is the pipeline's
        "span_vs_ideal": round(span / ideal, 2),
        "quota_bound_s": round(needed / quota_per_s, 2),
        "calls_needed": needed, "calls_made": made, "calls_ok": ok, "outcomes": dict(outcomes),
        "goodput": round(needed / made, 3) if made else None,
        "redone_work": round(max(ok - needed, 0) / needed, 3),
        "quota_utilisation": round(ok / makespan / quota_per_s, 3),
        "throttled_share": round(outcomes.get("ThrottlingException", 0) / made, 3) if made else None,
        "aws_requests": orchestration, "queue_polling": polling,
        "aws_requests_per_model_call": round(sum(orchestration.values()) / model_calls, 2),
        "dynamodb_writes_per_model_call": round(writes / model_calls, 2),
        "orchestration_usd_per_1k_calls": round(ours_per_1k, 5),
        "orchestration_usd_by_service_per_1k_calls": {k: round(prices.usd_per_1k_calls(v, model_calls), 5)
                                                      for k, v in sorted(cost.by_service.items())},
        "unpriced_requests": cost.unpriced,
        "queue_polling_usd_per_1k_calls": round(prices.usd_per_1k_calls(polling_cost.usd, model_calls), 5),
        "step_functions_transitions": prices.step_functions_transitions(made, chunks),
        "step_functions_usd_per_1k_calls": round(sfn_per_1k, 5),
        "orchestration_vs_step_functions": round(ours_per_1k / sfn_per_1k, 4) if sfn_per_1k else None,
        "recovery_s": recovery_s, "oracle_problems": oracle["problems"],
        "oracle_problem_count": len(oracle["problems"]) if oracle["problems"] is not None else None,
        "silently_incomplete": oracle["silently_incomplete"],
    }


# (label, run, key, comparison, bound) (the first targets). Retired by the token bench (the figures stay in the table):
# "<= 1 DynamoDB write per model call" and "orchestration <= 1/100 of Step Functions Standard": orchestration is
# about 1 % of the bill (model tokens are the rest), so neither measures what decides speed or money.
TARGETS = [
    ("goodput >= 0.94 (5 % faults, a kill)", "faults", "goodput", ">=", 0.94),
    ("redone work <= 1 % (5 % faults, a kill)", "faults", "redone_work", "<=", 0.01),
    ("makespan <= 1.15 x ideal (happy path)", "after", "makespan_vs_ideal", "<=", 1.15),
    ("makespan <= 1.3 x ideal (faults)", "faults", "makespan_vs_ideal", "<=", 1.3),
    ("quota utilisation >= 0.9 (happy path)", "after", "quota_utilisation", ">=", 0.9),
    ("throttled calls <= 5 % (happy path)", "after", "throttled_share", "<=", 0.05),
    ("0 silently incomplete", "faults", "silently_incomplete", "==", False),
]


def verdicts(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, run, key, op, bound in TARGETS:
        if run not in runs:
            continue
        value = runs[run][key]
        if op == "==":
            ok = value == bound
        else:
            ok = value is not None and (value >= bound if op == ">=" else value <= bound)
        out.append({"target": label, "run": run, "value": value, "verdict": "PASS" if ok else "FAIL"})
    return out


COLUMNS = [("run", "name"), ("conc", "analyst_concurrency"), ("state", "state"), ("makespan s", "makespan_s"),
           ("ideal s", "ideal_s"), ("x ideal", "makespan_vs_ideal"), ("calls span s", "model_call_span_s"),
           ("calls made", "calls_made"), ("needed", "calls_needed"), ("goodput", "goodput"),
           ("redone", "redone_work"), ("quota util", "quota_utilisation"), ("throttled", "throttled_share"),
           ("AWS req/call", "aws_requests_per_model_call"), ("DDB writes/call", "dynamodb_writes_per_model_call"),
           ("$/1k calls", "orchestration_usd_per_1k_calls"), ("SFN $/1k calls", "step_functions_usd_per_1k_calls"),
           ("x SFN", "orchestration_vs_step_functions"), ("recovery s", "recovery_s"),
           ("oracle problems", "oracle_problem_count")]
SCALING_COLUMNS = [("size", "chars"), ("chunks", "chunks"), ("calls needed", "calls_needed"),
                   ("makespan s", "makespan_s"), ("quota bound s", "quota_bound_s"), ("x ideal", "makespan_vs_ideal"),
                   ("calls span s", "model_call_span_s"), ("goodput", "goodput"), ("throttled", "throttled_share"),
                   ("AWS req/call", "aws_requests_per_model_call"),
                   ("DDB writes/call", "dynamodb_writes_per_model_call"), ("$/1k calls", "orchestration_usd_per_1k_calls"),
                   ("x SFN", "orchestration_vs_step_functions"), ("oracle problems", "oracle_problem_count")]
PAIRS = (("after", "baseline-clean"), ("faults", "baseline"))  # (ours, the baseline with the same faults and kills)


def print_table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for header, _ in columns:
        t.add_column(header, justify="right")
    for r in rows:
        t.add_row(*[str(r.get(k)) for _, k in columns])
    Console(width=250).print(t)


def comparisons(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for ours, base in PAIRS:
        if ours in runs and base in runs:
            rows = compare(runs[ours], runs[base])
            out[f"{ours}_vs_{base}"] = {"rows": [r.__dict__ for r in rows], "baseline_wins": baseline_wins(rows)}
    return out


def print_comparisons(comps: dict[str, Any]) -> None:
    for name, comp in comps.items():
        print_table(f"{name}: ours / baseline (same workload, faults and kills)",
                    [("figure", "figure"), ("ours", "ours"), ("baseline", "baseline"), ("ours / baseline", "ratio"),
                     ("better", "winner")], comp["rows"])
        wins = comp["baseline_wins"]
        print(f"the baseline wins on: {', '.join(wins)}" if wins else "the baseline wins on nothing")


counter = RequestCounter()


def git_state() -> dict[str, Any]:
    """The commit the run measured, and the files changed on top of it (others edit the same tree)."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    return {"head": git("rev-parse", "--short", "HEAD").strip(),
            "changed": [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="quota")
    ap.add_argument("--only", default="before,concurrent,after,faults")
    ap.add_argument("--rpm", type=float, default=600.0, help="requests-per-minute quota (600: 10 calls/s)")
    ap.add_argument("--median-ms", type=float, default=500.0)
    ap.add_argument("--p99-ms", type=float, default=900.0)
    ap.add_argument("--window-s", type=float, default=2.0, help="the quota's burst window (Bedrock: 60 s)")
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--chars", type=int, default=56_000, help="document size (56 KB: the first measurement)")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--baseline-timeout", type=float, default=420.0,
                    help="the baseline's deadline: a chunk not done by then counts as missing")
    ap.add_argument("--sizes", default="",
                    help="scaling series: document sizes in chars (e.g. 10000,100000,1000000); runs `after` at each")
    ap.add_argument("--source", choices=("samples", "cuad"), default="samples",
                    help="the contract text: the samples, or the CUAD contracts in ../shared/data/cuad")
    args = ap.parse_args()
    counter.install()
    template = synth("local")
    work = ROOT / ".review" / "bench-quota" / args.name  # per name: two runs at once must not delete each other's ledgers
    shutil.rmtree(work, ignore_errors=True)
    text = document(args.chars, args.source)
    paced = {"model_requests_per_minute": args.rpm, "worker_max_concurrency": args.workers}
    plans = {"before": ({"analyst_concurrency": 1}, 0.0, False),  # analysts one by one, calls not paced
             "concurrent": ({}, 0.0, False),  # analysts at once, calls not paced
             "after": (paced, 0.0, False),  # analysts at once, each worker paced to its share, AIMD
             "faults": (paced, 0.05, True)}
    baselines = {"baseline-clean": (0.0, False), "baseline": (0.05, True)}  # bench/baseline: Powertools alone
    runs: dict[str, dict[str, Any]] = {}
    if args.sizes:
        return scaling(template, args, work, paced)
    for name in args.only.split(","):
        print(f"{name}: {args.chars} chars of {args.source}, {args.rpm:g} requests/min shared by {args.workers} workers, "
              f"{args.median_ms:g} ms median", flush=True)
        if name in baselines:
            runs[name] = baseline_scenario(name, text, args, work, *baselines[name])
            continue
        overrides, transient, kill = plans[name]
        runs[name] = scenario(template, name, text, args, work, overrides, transient, kill)
    result: dict[str, Any] = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                          "platform": platform.platform()},
              "git": git_state(), "settings": vars(args), "runs": runs, "targets": verdicts(runs),
              "reproduce": f".venv/bin/python bench/quota.py --name {args.name} --only {args.only} --rpm {args.rpm:g} "
                           f"--source {args.source} --chars {args.chars}"}
    if "before" in runs and "after" in runs:
        b, a = runs["before"], runs["after"]
        result["after_vs_before"] = {"makespan": round(a["makespan_s"] / b["makespan_s"], 2),
                                     "calls_made": round(a["calls_made"] / max(b["calls_made"], 1), 2)}
    result["ours_vs_baseline"] = comparisons(runs)
    result["prices"] = {"as_of": prices.PRICES_AS_OF,
                        "usd_per_request": {f"{s}.{o}": v for (s, o), v in prices.USD_PER_REQUEST.items()},
                        "step_functions_standard_per_transition": prices.STEP_FUNCTIONS_STANDARD_PER_TRANSITION}
    out = ROOT / "bench" / "results" / f"{args.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(f"{args.name}: {args.chars} chars, {args.rpm:g} requests/min", COLUMNS, list(runs.values()))
    print_comparisons(result["ours_vs_baseline"])
    for v in result["targets"]:
        print(f"{v['verdict']}  {v['target']}: {v['value']}")
    print(f"wrote {out.relative_to(ROOT)}")


def scaling(template: dict[str, Any], args: argparse.Namespace, work: Path, paced: dict[str, Any]) -> None:
    """The scaling series: `after` (analysts at once, paced) at each size; AWS requests per model call should
    stay flat and the makespan follow calls needed / quota."""
    runs: dict[str, dict[str, Any]] = {}
    for size in (int(x) for x in args.sizes.split(",")):
        text = document(size, args.source)
        print(f"scaling: {size} chars of {args.source}, {args.rpm:g} requests/min", flush=True)
        runs[str(size)] = scenario(template, f"after-{size}", text, args, work, paced)
        out = ROOT / "bench" / "results" / f"{args.name}.json"  # after every size: a long series keeps what it has
        out.write_text(json.dumps({
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "git": git_state(), "settings": vars(args), "runs": runs,
            "reproduce": f".venv/bin/python bench/quota.py --name {args.name} --sizes {args.sizes} --rpm {args.rpm:g} "
                         f"--source {args.source}"}, indent=2) + "\n")
    print_table(f"{args.name}: scaling at {args.rpm:g} requests/min", SCALING_COLUMNS, list(runs.values()))
    print(f"wrote bench/results/{args.name}.json")


if __name__ == "__main__":
    main()
