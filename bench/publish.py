"""Published figures, rendered from their results files: never typed by hand.

A page holds a generated block between two markers, `<!-- BEGIN NAME: ... -->` and `<!-- END NAME -->`; `make docs`
(`python bench/publish.py`) rewrites what lies between them from the results file, and a test
(tests/unit/project/test_published_figures.py) fails when a page's block differs from what its results file renders now.

    python bench/publish.py            # rewrite every block
    python bench/publish.py --check    # exit 1, naming the stale blocks, if any differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIRST_RUN = Path("bench/results/first-run.json")


def minutes(seconds: float) -> str:
    """126.4 -> '2 min 6 s'; 48 -> '48 s'."""
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def megabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{round(n / 1e6)} MB"


def _loads(runs: list[dict[str, Any]]) -> str:
    loads = sorted(r["load_1m_at_start"] for r in runs)
    return f"{loads[0]:g}" if loads[0] == loads[-1] else f"{loads[0]:g} to {loads[-1]:g}"


def _conditions(results: dict[str, Any]) -> str:
    cores = results["machine"]["nproc"]
    commits = sorted({r.get("commit", results["commit"]) for r in results["runs"]}) or [results["commit"]]
    busy = max((r["load_1m_at_start"] for r in results["runs"]), default=0) > cores
    return (f"commit {', '.join(commits)}, {results['date']}, {cores} cores, 1-minute load average "
            f"{_loads(results['runs'])} as the runs started{' (above the core count: the machine was busy with other work)' if busy else ''}")


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False) + "\n"


def _timing(summary: dict[str, Any]) -> str:
    parts = []
    if summary.get("warm_runs"):
        n = summary["warm_runs"]
        parts.append(f"**{minutes(summary['warm_total_s_median'])}** with a warm package cache "
                     f"({'median of ' + str(n) + ' runs' if n > 1 else 'one run'})")
    if summary.get("cold_runs"):
        parts.append(f"**{minutes(summary['cold_total_s_median'])}** with a cold {'one' if parts else 'package cache'}, "
                     "which received "
                     f"{megabytes(summary['cold_network_rx_bytes'])} over the network")
    return " and ".join(parts) if parts else "no completed run"


def render_readme_first_run(results: dict[str, Any]) -> str:
    """The README's lines: the time a fresh clone's `make demo` takes and the disk it needs."""
    uv = results["summary"]["uv"]
    return _wrap(
        f"On a fresh clone, `make demo` (install included) took {_timing(uv)}. It needs "
        f"{megabytes(uv['venv_bytes'] + uv['node_modules_bytes'])} of disk (`.venv` {megabytes(uv['venv_bytes'])}, "
        f"`node_modules` {megabytes(uv['node_modules_bytes'])}), {megabytes(uv['cold_checkout_and_cache_bytes'])} "
        "with the package caches it leaves in your home folder (uv hard-links the files of `.venv` from its cache). "
        f"Measured by `bench/first_run.py` on {_conditions(results)}; every run: "
        "[bench/README.md](bench/README.md#make-demo-on-a-fresh-clone).")


def render_bench_first_run(results: dict[str, Any]) -> str:
    """bench/README.md's section: every run, and uv beside pip where pip was measured."""
    lines = [_wrap(
        f"Measured by `{results['command'].split(' --note')[0]}` on {_conditions(results)} (machine: {results['machine']['system']}, "
        f"Python {results['machine']['python']}, Node {results['machine']['node']}). Each run is a `git clone` of "
        "the checkout beside a copy of `../shared`, then `make venv` (the install) and `make demo`, timed; the "
        "package caches sit in a folder of the bench's own, empty before an installer's first (cold) run and kept "
        "for its warm runs. \"Received\" counts every byte the machine's network interfaces took in while the run "
        "went (an upper bound on its downloads).").rstrip("\n"),
    ]
    if results.get("note"):
        lines += ["", _wrap(results["note"].rstrip(".") + ".").rstrip("\n")]
    lines += ["", "| installer | cache | load at start | install | demo | total | received | `.venv` | `node_modules` |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        failed = "" if r["exit_code"] == 0 else f" (failed: exit {r['exit_code']})"
        lines.append(f"| {r['installer']} | {r['cache']} | {r['load_1m_at_start']:g} | {minutes(r['install_s'])} | "
                     f"{minutes(r['demo_s'])} | {minutes(r['total_s'])}{failed} | "
                     f"{megabytes(r['network_rx_bytes'])} | {megabytes(r['venv_bytes'])} | "
                     f"{megabytes(r['node_modules_bytes'])} |")
    summary = results["summary"]
    lines.append("")
    for installer, s in summary.items():
        lines.append(_wrap(f"- {installer}: {_timing(s)}.").rstrip("\n"))
    uv, pip = summary.get("uv", {}), summary.get("pip", {})
    for cache in ("cold", "warm"):
        key = f"{cache}_install_s_median"
        if key in uv and key in pip:
            lines.append(f"- The install with a {cache} cache: uv {minutes(uv[key])}, pip {minutes(pip[key])} "
                         f"({minutes(pip[key] - uv[key])} saved).")
    return "\n".join(lines) + "\n"


# ---- conditions, as each results file records them (never more) -------------------------------------------------

def _get(d: dict[str, Any], *paths: str) -> Any:
    for path in paths:
        cur: Any = d
        for key in path.split("."):
            cur = cur.get(key) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
    return None


def recorded(results: dict[str, Any], path: str) -> str:
    """What the file records of where and how it ran: commit, date, cores, load, model. Only what it records;
    what it does not is said so."""
    parts = [f"`{path}`"]
    commit = _get(results, "commit", "git.head", "git", "after_commit", "calibration.git")
    if isinstance(commit, str):
        changed = _get(results, "git.changed") or []
        parts.append(f"commit {commit[:7]}" + (f" with uncommitted changes to {len(changed)} files" if changed else ""))
    else:
        parts.append("no commit recorded")
    parts.append(str(results["date"]) if results.get("date") else "no date recorded")
    cores = _get(results, "machine.cpus", "machine.nproc", "cpus", "calibration.machine.cpus")
    parts.append(f"{cores} cores" if cores else "cores not recorded")
    load = _get(results, "machine.load_1min_at_start", "machine.loadavg_start")
    if isinstance(load, list):
        load = load[0]
    end = _get(results, "load_avg_1m_at_end", "machine.loadavg_end")
    if isinstance(end, list):
        end = end[0]
    if load is not None:
        parts.append(f"1-minute load {load:g} at the start" + (f", {end:g} at the end" if end is not None else ""))
    elif end is not None:
        parts.append(f"1-minute load {end:g} at the end")
    else:
        parts.append("load not recorded")
    return ", ".join(parts)


def model_conditions(results: dict[str, Any]) -> str:
    """The model side as the file records it: the simulated Bedrock's latency, quota, window and answer lengths, or
    the offline rule model with no latency (an instant model) where the file records no latency setting."""
    s = results.get("settings") or {}
    if "median_ms" not in s:
        return "an instant model (the offline rule model; the file records no model latency)"
    out = [f"the simulated Bedrock (a stand-in), latency median {s['median_ms']:g} ms, p99 {s['p99_ms']:g} ms, "
           "the same whatever the answer's length"]
    if s.get("tpm"):
        out.append(f"{s['tpm']:,.0f} tokens/min in a {s['window_s']:g} s window (Bedrock's is a minute)")
    if s.get("rpm"):
        out.append(f"{s['rpm']:,.0f} requests/min in a {s['window_s']:g} s window")
    if s.get("answer_median"):
        out.append(f"answers of median {s['answer_median']:g} tokens, p99 {s['answer_p99']:g}")
    out.append("no capacity throttles below the quota, 5xx or timeouts injected unless a row says faults")
    return "; ".join(out)


def _measured(results: dict[str, Any], path: str) -> str:
    return f"Recorded in {recorded(results, path)}; {model_conditions(results)}."


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _usd(x: float | str) -> str:
    return f"${float(x):,.2f}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
           ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]


def _lines(*items: str | list[str]) -> str:
    out: list[str] = []
    for it in items:
        out.extend(it if isinstance(it, list) else [_wrap(it).rstrip("\n")])
    return "\n".join(out) + "\n"


# ---- renderers ------------------------------------------------------------------------------------------------------

TOKENS, ANS100, ANS300 = (Path("bench/results/tokens.json"), Path("bench/results/tokens-answers-100.json"),
                          Path("bench/results/tokens-answers-300.json"))


def _cached(r: dict[str, Any]) -> dict[str, Any]:
    return dict(r["runs"]["cached"])


def render_readme_cost(files: dict[Path, dict[str, Any]]) -> str:
    t = files[TOKENS]
    c = _cached(t)
    return _lines(
        f"What a document costs (about {_usd(c['model_usd_per_100kb'])} of model tokens for a 100 KB contract with "
        f"{t['assumed']['model_id']} at the prices of {t['assumed']['prices_as_of']}, an estimate measured against the "
        f"simulated Bedrock with answers of median {t['settings']['answer_median']:g} tokens; {recorded(t, str(TOKENS))}) "
        "and the spend limits: [docs/cost.md](docs/cost.md).")


def render_cost_page(files: dict[Path, dict[str, Any]]) -> str:
    t, a300 = files[TOKENS], files[ANS300]
    c, c300 = _cached(t), _cached(a300)
    return _lines(
        f"About **{_usd(c['model_usd_per_100kb'])} of model tokens and ${c['aws_usd_per_100kb']:.3f} of counted AWS "
        f"requests (Lambda GB-seconds included) for a 100 KB contract** ({c['calls_needed']} model calls) with "
        f"{t['assumed']['model_id']} at the list prices of {t['assumed']['prices_as_of']} (`config/prices.py`), "
        f"measured by `bench/tokens.py` against the **simulated** Bedrock (a stand-in, not Bedrock). Answers are "
        f"{c['output_share_of_model_usd'] * 100:.0f} % of it. With answers of median "
        f"{a300['settings']['answer_median']:g} tokens the same contract cost {_usd(c300['model_usd_per_100kb'])} "
        f"({recorded(a300, str(ANS300))}). {_measured(t, str(TOKENS))} **These are estimates**: check the real "
        "per-call figures on your first deploy ([first-deploy.md](first-deploy.md)).")


def render_tokens(files: dict[Path, dict[str, Any]]) -> str:
    t = files[TOKENS]
    rows = []
    for name, r in t["runs"].items():
        rows.append([name, r["workers"], r["makespan_s"], r["makespan_vs_token_bound"],
                     f"{r['attempts']} ({r['calls_needed']} needed)", _pct(r["throttled_share"]),
                     f"{r['quota_tokens_per_call']:,}", r["cache_read_share"], _usd(r["model_usd_per_100kb"]),
                     f"${r['aws_usd_per_100kb']:.4f}"])
    return _lines(
        _measured(t, str(TOKENS)) + f" Assumed: {t['assumed']['model_id']}, cache minimum "
        f"{t['assumed']['min_cache_tokens']:,} tokens, output burndown x{t['assumed']['output_burndown']}, prices of "
        f"{t['assumed']['prices_as_of']}.", [""],
        _table(["run", "workers", "makespan s", "x token bound", "attempts", "throttled", "quota tokens / call",
                "cache-read share", "model $ / 100 KB", "AWS requests $ / 100 KB"], rows),
        [""], [f"- {x['target']} ({x['run']}): {x['value']:g}, {x['verdict']}" for x in t["targets"]])


def render_tokens_answers(files: dict[Path, dict[str, Any]]) -> str:
    rows = []
    for path in (ANS100, TOKENS, ANS300):
        r = files[path]
        c, s = _cached(r), r["settings"]
        rows.append([f"{s['answer_median']:g} / {s['answer_p99']:g} (`{path}`)", _usd(c["model_usd_per_100kb"]),
                     f"{c['output_share_of_model_usd'] * 100:.0f} %", f"{c['quota_tokens_per_call']:,}",
                     c["makespan_vs_token_bound"], _pct(c["throttled_share"]),
                     recorded(r, str(path)).split(", ", 1)[1]])
    return _lines(_table(["answer tokens, median / p99", "model $ / 100 KB", "answers' share", "quota tokens / call",
                          "x token bound", "throttled", "recorded"], rows),
                  [""], _measured(files[TOKENS], str(TOKENS)).replace(
                      "answers of median", "(the default run's) answers of median"))


def render_tokens_knee(files: dict[Path, dict[str, Any]]) -> str:
    path = Path("bench/results/tokens-knee.json")
    k = files[path]
    rows = [[r["workers"], r["makespan_s"], r["makespan_vs_token_bound"], _pct(r["throttled_share"])]
            for r in k["runs"].values()]
    return _lines(_table(["workers", "makespan s", "x token bound", "throttled"], rows), [""],
                  _measured(k, str(path)))


LATEST = Path("bench/results/latest.json")


def render_run(files: dict[Path, dict[str, Any]]) -> str:
    r = files[LATEST]
    tp, rec = r["throughput"], r["recovery"]
    ours = rec["ours"]
    base = rec["baseline_visibility_timeout"]
    text = (f"Last run: 5 % transient faults cost x{tp['calls_ratio']:g} model calls and x{tp['wall_ratio']:g} wall "
            f"time against the fault-free run; recovery after `kill -9` {ours['recovery_s']:g} s against a "
            f"{rec['ideal_bound_s']:g} s bound (lease + sweep); the killed chunk cost {ours['chunk_calls_total']} model "
            f"calls where a clean run needs {ours['chunk_calls_clean_run']}, and "
            f"{len(ours['analysts_rerun_after_kill'])} checkpointed analysts re-ran. ")
    text += (f"The visibility-timeout baseline: {base['recovery_s']:g} s." if base else
             "This run had no visibility-timeout baseline (`make bench-recovery-baseline` runs it).")
    return _lines(text + f" Recorded in {recorded(r, str(LATEST))}; {model_conditions(r)}.")


def _quota_rows(q: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for name, r in q["runs"].items():
        failed = sum(n for k, n in r.get("outcomes", {}).items() if k not in ("ok", "ThrottlingException"))
        faults = f"{r['transient_rate'] * 100:g} % asked, {failed} failed" if r.get("transient_rate") else "none"
        if r.get("recovery_s") is not None:
            faults += ", kill -9"
        rows.append([name, faults, r["makespan_s"], r["makespan_vs_ideal"], r["model_call_span_s"], r["calls_made"],
                     r["calls_needed"], r["goodput"], _pct(r["redone_work"]), r["quota_utilisation"],
                     _pct(r["throttled_share"]), r.get("aws_requests_per_model_call"),
                     r.get("dynamodb_writes_per_model_call"), r.get("orchestration_usd_per_1k_calls"),
                     r.get("orchestration_vs_step_functions"), r.get("recovery_s")])
    return rows


def quota_renderer(path: Path) -> Callable[[dict[Path, dict[str, Any]]], str]:
    def render(files: dict[Path, dict[str, Any]]) -> str:
        q = files[path]
        out: list[str | list[str]] = [
            _table(["run", "faults", "makespan s", "x ideal", "call span s", "calls made", "needed", "goodput", "redone",
                    "quota util", "throttled", "AWS req / call", "DDB writes / call", "orchestration $ / 1k calls",
                    "x Step Functions (requests only)", "recovery s"], _quota_rows(q)), [""],
            _measured(q, str(path)) + f" {q['settings']['workers']} workers, {q['settings']['chars']:,} characters; "
            "faults as the file records them per run: the rate asked (`transient_rate`), the calls that did fail "
            "other than by a quota throttle (`outcomes`), a kill where a recovery is recorded. Orchestration dollars count the AWS requests only: our Lambda GB-seconds are not "
            "in them, nor in the Step Functions comparison."]
        if q.get("targets"):
            out += [[""], [f"- {x['target']} ({x['run']}): {x['value']:g}, {x['verdict']}" for x in q["targets"]]]
        for key, label in (("faults_vs_baseline", "with faults and a kill"),
                           ("after_vs_baseline-clean", "without faults")):
            cmp_ = (q.get("ours_vs_baseline") or {}).get(key)
            if cmp_:
                out += [[""], f"Ours / baseline {label}: " + "; ".join(
                    f"{row['figure']} x{row['ratio']:g} ({row['winner']} wins)" if row["winner"] not in ("tie", "n/a")
                    else f"{row['figure']} {row['winner']}" for row in cmp_["rows"] if row["ratio"] is not None) + "."]
        return _lines(*out)
    return render


SCALING, SCALING_5MB = Path("bench/results/scaling.json"), Path("bench/results/scaling-5mb-rerun.json")


def render_scaling(files: dict[Path, dict[str, Any]]) -> str:
    rows = []
    for path in (SCALING, SCALING_5MB):
        for size, r in files[path]["runs"].items():
            rows.append([f"{int(size) // 1000:,} KB", r["chunks"], f"{r['calls_needed']:,}", r["makespan_s"],
                         r["quota_bound_s"], r["makespan_vs_ideal"], r["model_call_span_s"], r["goodput"],
                         _pct(r["throttled_share"]), r["aws_requests_per_model_call"],
                         r["dynamodb_writes_per_model_call"], r["orchestration_usd_per_1k_calls"],
                         r["oracle_problem_count"]])
    return _lines(_table(["size", "chunks", "calls needed", "makespan s", "quota bound s", "x ideal", "call span s",
                          "goodput", "throttled", "AWS req / call", "DDB writes / call", "orchestration $ / 1k calls",
                          "oracle problems"], rows), [""],
                  _measured(files[SCALING], str(SCALING)) + " The 5 MB row: "
                  f"{recorded(files[SCALING_5MB], str(SCALING_5MB))}.")


BATCH = Path("bench/results/batch.json")


def render_batch(files: dict[Path, dict[str, Any]]) -> str:
    b = files[BATCH]
    rows = []
    for mode in ("on_demand", "batch"):
        r = b[mode]
        rows.append([mode.replace("_", " "), f"${r['model_usd_per_100kb']:.4f}", r["model_calls"],
                     f"{r['input_tokens']:,} / {r['cache_read_tokens']:,} / {r['cache_write_tokens']:,} / "
                     f"{r['output_tokens']:,}", r["batch_jobs"]])
    rows.append(["**batch / on demand**", f"**x{b['batch_vs_on_demand_model_cost']:g}**", "", "", ""])
    rows.append(["batch / its bound (the on-demand tokens at the batch price)", f"x{b['batch_vs_bound']:g}", "", "",
                 ""])
    return _lines(_table(["mode", "model cost per 100 KB", "calls", "input / cache-read / cache-write / output tokens",
                          "batch jobs"], rows), [""],
                  f"Recorded in {recorded(b, str(BATCH))}; {model_conditions(b)}: its answers are the rule model's "
                  "own, much shorter than an LLM's, which favours on demand (answers cost the same on both lanes at "
                  "their price; the prompt side is where the cache saves). Not measured with LLM-like answers.")


def render_batch_cost_line(files: dict[Path, dict[str, Any]]) -> str:
    b = files[BATCH]
    return _lines(f"Measured with the offline rule model's short answers, a 100 KB contract cost "
                  f"x{b['batch_vs_on_demand_model_cost']:g} in batch against on demand (`make bench-batch`; "
                  f"{recorded(b, str(BATCH))}); with longer, LLM-like answers the ratio falls, since answers get "
                  "the full discount ([batch-inference.md](batch-inference.md#when-to-use-which)).")


BURST, BURST_LOCAL, CALIB = (Path("bench/results/burst_sim.json"), Path("bench/results/burst_sim_local.json"),
                             Path("bench/results/burst_calibration.json"))


def render_burst(files: dict[Path, dict[str, Any]]) -> str:
    rows = []
    for sc in files[BURST]["scenarios"]:
        for r in sc["runs"]:
            rows.append([f"{sc['contracts']:,} ({sc['chunks']:,} chunks)", sc["workers"], sc["bound"], r["rule"],
                         r["makespan_h"], r["queue_age_h"]["max"], f"{r['duplicate_messages']:,}",
                         r["duplicates_per_chunk"], r["worker_hours_on_duplicates"],
                         r["results_fifo"]["peak_sends_per_s"], r.get("lost_recovered_after_h")])
    p = files[BURST]["scenarios"][0]["params"]
    c = files[CALIB]
    return _lines(_table(["burst", "fleet", "bound", "rule", "makespan h", "max queue age h", "duplicate messages",
                          "per chunk", "worker h on duplicates", "results sends/s, peak", "lost: recovered at h"],
                         rows), [""],
                  f"Simulated (no AWS) by `bench/burst_sim.py` with its parameters as the file records them: "
                  f"{p['tpm']:,} tokens/min, {p['call_latency_s']:g} s a model call (assumed), "
                  f"{p['quota_tokens_per_call']:,} quota tokens a call, seed {p['seed']}; `{BURST}` records no "
                  "commit, date or machine.", [""],
                  f"Calibration on the local stack (`bench/burst_calibrate.py`): {c['contracts']} contracts "
                  f"({c['chunks']} chunks) on {c['workers']} worker took {c['makespan_s']:g} s, a chunk "
                  f"{c['chunk_s']['mean']:.2f} s on average (p95 {c['chunk_s']['p95']:.2f} s), "
                  f"{c['chunks_resent']['events']} chunk messages re-sent; {recorded(c, str(CALIB))}; "
                  f"{model_conditions(c)}.")


LARGE = Path("bench/results/large.json")


def render_large(files: dict[Path, dict[str, Any]]) -> str:
    g = files[LARGE]
    parts = []
    for r in g["large"]:
        parts.append(f"a {megabytes(r['bytes'])} contract ({r['chunks']:,} chunks) was `running` after "
                     f"{r['queued_to_running_s']:g} s, its first chunk settled after {r['first_chunk_settled_s']:g} s, "
                     f"and it ended `{r['state']}` after {r['completed_s']:g} s ({r['chunks_per_s']:g} chunks/s), "
                     f"{len(r['oracle']['problems'])} oracle problems")
    f = g["fairness"]
    return _lines("Last run: " + "; ".join(parts) + f". Fairness: a {f['small']['bytes'] // 1000} KB contract took "
                  f"{f['small']['alone_s']:g} s alone and {f['small']['behind_big_s']:g} s behind a "
                  f"{megabytes(f['big']['bytes'])} one (x{f['ratio_behind_vs_alone']:g}). These times are the embedded "
                  f"AWS's own speed with {model_conditions(g)} and no quota: not what the same document takes under a "
                  f"model quota (the token bench's bound: quota tokens per call x calls / quota rate). Recorded in "
                  f"{recorded(g, str(LARGE))}.")


SOAK = Path("bench/results/soak.json")


def render_soak(files: dict[Path, dict[str, Any]]) -> str:
    k = files[SOAK]
    s = k["summary"]
    zero = {**s["must_be_zero"]}
    large = k["phases"]["large"]
    return _lines(
        f"Last run: {s['jobs']} jobs, {s['chunks']:,} chunks, {k['wall_s']:g} s of phases + {k['check_s']:g} s of "
        f"checks. Must-be-zero counts: " + ", ".join(f"{n.replace('_', ' ')} {v}" for n, v in zero.items()) +
        ". Jobs by state: " + ", ".join(f"{n} {v}" for n, v in s["jobs_by_state"].items()) +
        f". {k['model_calls']['total']:,} model calls, {s['tier1_retries']:,} tier-1 retries, {s['repairs']} repairs; "
        + ", ".join(f"{v:,} {n}" for n, v in k["chaos"].items()) +
        f". The {megabytes(large['large_bytes'])} contract ({large['large_chunks']} chunks) ended "
        f"`{large['large_state']}` after {large['large_completed_after_s']:g} s; the "
        f"{large['small_behind_large_s']['n']} small documents behind it took at most "
        f"{large['small_behind_large_s']['max']:g} s each. Recorded in {recorded(k, str(SOAK))}; "
        f"{model_conditions(k)} apart from the injected faults.")


UNITS = Path("bench/results/item_units.json")


def render_item_units(files: dict[Path, dict[str, Any]]) -> str:
    u = files[UNITS]
    rows = []
    for side in ("before", "after"):
        for item, v in u[side]["5mb"]["items"].items():
            rows.append([item, side, f"{v.get('bytes', '')}", v.get("writes_per_chunk"), v.get("units_per_write"),
                         v.get("wcu_per_s"), v.get("reads_per_chunk"), v.get("units_per_consistent_read"),
                         v.get("rcu_per_s")])
    return _lines(_table(["item", "", "bytes", "writes/chunk", "WCU/write", "WCU/s", "reads/chunk", "RCU/read",
                          "RCU/s"], rows), [""],
                  f"COMPUTED, not measured on DynamoDB: {u['label']}. Before = `{u['before_ref']}` as the run found "
                  f"it, after = commit {u['after_commit']}; {u['chunk_s']:g} s a chunk assumed; `{UNITS}` records no "
                  "date or machine.")


TX = Path("bench/results/embedded_transactions.json")


def render_transactions(files: dict[Path, dict[str, Any]]) -> str:
    x = files[TX]
    return _lines(_table(["table items", "moto as shipped, ms", "rolled back by item, ms", "ratio"],
                         [[f"{r['items']:,}", r["shipped_ms"], r["by_item_ms"], f"x{r['ratio']:g}"]
                          for r in x["rows"]]), [""],
                  f"Client-timed over {x['transactions_per_size']} transactions per size; recorded in "
                  f"{recorded(x, str(TX))}.")


PRIORITY = Path("bench/results/priority.json")


def render_priority(files: dict[Path, dict[str, Any]]) -> str:
    p = files[PRIORITY]
    i = p["interactive"]
    per = p["ratio_per_batch"]
    faster = p["ratio_per_batch_vs_faster_alone"]
    return _lines(
        f"Last run: **x{p['ratio_behind_vs_alone']:g}** (median of {len(per)} batches; target <= "
        f"{p['target_ratio']:g}: {p['verdict']}), per batch " + ", ".join(f"x{v:g}" for v in per) +
        f" (spread x{min(per):g} to x{max(per):g}); over the faster run alone beside each, "
        + ", ".join(f"x{v:g}" for v in faster) + f". The {i['bytes'] // 1000} KB interactive contract "
        f"({i['chunks']} chunks) took " + ", ".join(f"{v:g}" for v in i["alone_s"]) + " s alone and " +
        ", ".join(f"{v:g}" for v in i["behind_bulk_s"]) + f" s behind {p['bulk']['jobs']} bulk contracts of "
        f"{p['bulk']['bytes_each'] // 1000} KB. Measured with {model_conditions(p)}: the effect of queueing behind "
        "bulk on a model that answers at once, not with a model's latency; the spread between batches is as large as "
        f"the effect. Recorded in {recorded(p, str(PRIORITY))}.")


COST = Path("bench/results/cost.json")


def render_cost_py(files: dict[Path, dict[str, Any]]) -> str:
    c = files[COST]
    k = c["per_kb"]
    return _lines(f"Last run: {k['calls']:.2f} calls, ~{k['input_tokens']:,.0f} input and ~{k['output_tokens']:,.0f} "
                  f"output tokens per KB, ${k['usd']:.3f} per KB at ${c['usd_per_1k']['input']:g} / "
                  f"${c['usd_per_1k']['output']:g} per 1k tokens, with the offline rule model's own answers (much "
                  f"shorter than an LLM's) and no prompt cache; recorded in {recorded(c, str(COST))}.")


@dataclass(frozen=True)
class Block:
    page: Path
    name: str
    results: tuple[Path, ...]
    render: Callable[[dict[Path, dict[str, Any]]], str]


def _one(render: Callable[[dict[str, Any]], str], path: Path) -> Callable[[dict[Path, dict[str, Any]]], str]:
    return lambda files: render(files[path])


_BR = Path("bench/README.md")
_QMB, _QB, _Q = (Path("bench/results/quota-make-bench.json"), Path("bench/results/quota-baseline.json"),
                 Path("bench/results/quota.json"))
_Q100, _QCUAD, _QSEED = (Path("bench/results/quota-100.json"), Path("bench/results/quota-cuad.json"),
                         Path("bench/results/quota-seed22.json"))

BLOCKS = (
    Block(Path("README.md"), "first-run", (FIRST_RUN,), _one(render_readme_first_run, FIRST_RUN)),
    Block(Path("README.md"), "cost", (TOKENS,), render_readme_cost),
    Block(Path("docs/cost.md"), "cost", (TOKENS, ANS300), render_cost_page),
    Block(Path("docs/cost.md"), "batch", (BATCH,), render_batch_cost_line),
    Block(_BR, "first-run", (FIRST_RUN,), _one(render_bench_first_run, FIRST_RUN)),
    Block(_BR, "cost-py", (COST,), render_cost_py),
    Block(_BR, "run", (LATEST,), render_run),
    Block(_BR, "tokens", (TOKENS,), render_tokens),
    Block(_BR, "tokens-answers", (TOKENS, ANS100, ANS300), render_tokens_answers),
    Block(_BR, "tokens-knee", (Path("bench/results/tokens-knee.json"),), render_tokens_knee),
    Block(_BR, "quota", (_Q,), quota_renderer(_Q)),
    Block(_BR, "quota-100", (_Q100,), quota_renderer(_Q100)),
    Block(_BR, "quota-cuad", (_QCUAD,), quota_renderer(_QCUAD)),
    Block(_BR, "quota-seed22", (_QSEED,), quota_renderer(_QSEED)),
    Block(_BR, "baseline-16kb", (_QMB,), quota_renderer(_QMB)),
    Block(_BR, "baseline-56kb", (_QB,), quota_renderer(_QB)),
    Block(_BR, "scaling", (SCALING, SCALING_5MB), render_scaling),
    Block(_BR, "burst", (BURST, CALIB), render_burst),
    Block(_BR, "large", (LARGE,), render_large),
    Block(_BR, "soak", (SOAK,), render_soak),
    Block(_BR, "batch", (BATCH,), render_batch),
    Block(_BR, "item-units", (UNITS,), render_item_units),
    Block(_BR, "transactions", (TX,), render_transactions),
    Block(_BR, "priority", (PRIORITY,), render_priority),
)


class MissingMarkers(ValueError):
    pass


def fill(text: str, name: str, body: str) -> str:
    """text with what lies between NAME's markers replaced by body."""
    pattern = re.compile(rf"(<!-- BEGIN {re.escape(name)}\b[^\n]*-->\n)(.*?)(<!-- END {re.escape(name)} -->)", re.S)
    if len(pattern.findall(text)) != 1:
        raise MissingMarkers(f"expected one '<!-- BEGIN {name}: ... -->' ... '<!-- END {name} -->' pair")
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), text)


def rendered(block: Block, root: Path = ROOT) -> tuple[str, str]:
    """(the page as it is, the page as its results file renders it)."""
    text = (root / block.page).read_text(encoding="utf-8")
    files = {path: json.loads((root / path).read_text(encoding="utf-8")) for path in block.results}
    return text, fill(text, block.name, block.render(files))



# ---- hand-typed figures: none outside the generated blocks ------------------------------------------------------

PAGES = (Path("README.md"), Path("docs/cost.md"), Path("bench/README.md"))

# A dollar amount (not $0), a ratio written xN or ×N, a percentage, a duration, a fraction such as 1/8.
FIGURE = re.compile(r"\$(?!0(?!\.?\d))\d[\d,]*(?:\.\d+)?|(?<![\w/.-])[x×]\d+(?:\.\d+)?(?!\w)|×\s\d|"
                    r"\b\d+(?:\.\d+)?\s?%|\b\d[\d,]*(?:\.\d+)?\s?(?:ms|s|seconds?|min|minutes?|hours?|h|days?)\b|"
                    r"\b1/\d+\b")

# The only figures a page may type by hand: prices, limits and settings (inputs a reader sets or AWS publishes),
# never a measurement. (page, a pattern matching the figure in its context, why it is not a bench figure)
NOT_BENCH_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("docs/cost.md", r"\*\*10 %\*\* more|50 % of the on-demand", "AWS's price rules (the price table's section)"),
    ("docs/cost.md", r"\$0\.01975 for 0\.5 vCPU|\$0\.005 for its public IPv4", "AWS Fargate list prices"),
    ("docs/cost.md", r"\| \$[\d,]+ \| (?:\$[\d,]+|none) \||at 80 % of actual and 100 % of forecast|"
                     r"Why \$1,000 in prod|local stack's \$100,000", "the spend limits' configured values"),
    ("docs/cost.md", r"prod 40 s, local 1 s|within 24 hours|cap in 8 hours|\(80 % of the hour's quota",
     "profile settings, alarm thresholds and AWS's documented delay"),
    ("bench/README.md", r"lease 3 s, sweep 1 s, analysis visibility 120 s|function timeout 20 s|visibility timeout 120 s"
                        r"|3 attempts,? 0\.5 s apart|\d+ s a chunk|retention of 4 days", "profile and baseline settings"),
    ("bench/README.md", r"with 5 % transient|(?:'s|the phase-1 faults plus|and) \d+ % (?:transient|malformed|permanent)"
                        r"|^\d % transient model faults|40 % of them|50 % discount",
     "fault rates and a discount a bench is set to, not measured"),
    ("bench/README.md", r"again \d+ s later|every ~\d+ s|lease \+ 2 s|every 2 s two|the 260 s grace",
     "the soak's chaos schedule"),
)


def hand_typed(page: str, text: str) -> list[str]:
    """The figures typed by hand on a page: outside its generated blocks, code and the allow-list above."""
    text = re.sub(r"<!-- BEGIN ([\w-]+)\b[^\n]*-->\n.*?<!-- END \1 -->|^```.*?^```|`[^`]+`",
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S | re.M)
    allowed = [re.compile(rx) for p, rx, _ in NOT_BENCH_FIGURES if p == page]
    found = []
    for n, line in enumerate(text.split("\n"), 1):
        spans = [m.span() for rx in allowed for m in rx.finditer(line.strip())]
        offset = len(line) - len(line.lstrip())
        for m in FIGURE.finditer(line):
            a, b = m.start() - offset, m.end() - offset
            if not any(s <= a and b <= e for s, e in spans):
                found.append(f"{page}:{n}: {m.group(0)!r} in {line.strip()!r}")
    return found

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which blocks are stale (exit 1 if any)")
    args = parser.parse_args()
    stale = []
    for block in BLOCKS:
        try:
            now, wanted = rendered(block)
        except (OSError, ValueError) as exc:
            print(f"error: {block.page} ({block.name}): {exc}", file=sys.stderr)
            return 1
        if now != wanted:
            stale.append(f"{block.page} ({block.name})")
            if not args.check:
                (ROOT / block.page).write_text(wanted, encoding="utf-8")
    typed = [f for page in PAGES for f in hand_typed(str(page), (ROOT / page).read_text(encoding="utf-8"))]
    for figure in typed:
        print(f"hand-typed figure (render it from its results file, or say it without a number): {figure}",
              file=sys.stderr)
    if typed:
        return 1
    if args.check and stale:
        print("stale: " + ", ".join(stale) + "; regenerate with: make docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
