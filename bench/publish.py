"""Published figures, rendered from their results files: never typed by hand.

A page holds a generated block between two markers, `<!-- BEGIN NAME: ... -->` and `<!-- END NAME -->`; `make docs`
(`python bench/publish.py`) rewrites what lies between them from the results file, and a test
(tests/unit/project/test_docs.py) fails when a page's block differs from what its results file renders now.

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


@dataclass(frozen=True)
class Block:
    page: Path
    name: str
    results: Path
    render: Callable[[dict[str, Any]], str]


BLOCKS = (
    Block(Path("README.md"), "first-run", FIRST_RUN, render_readme_first_run),
    Block(Path("bench/README.md"), "first-run", FIRST_RUN, render_bench_first_run),
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
    results = json.loads((root / block.results).read_text(encoding="utf-8"))
    return text, fill(text, block.name, block.render(results))


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
    if args.check and stale:
        print("stale: " + ", ".join(stale) + "; regenerate with: make docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
