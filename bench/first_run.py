"""The first run on a fresh clone: `git clone` of this checkout, then `make demo`, timed, as a new user runs it.

Each run clones the checkout's HEAD (committed work only) into a temporary folder beside a copy of `../shared` (the
repository reads `../shared/data/cuad`), then runs `make venv` (the install: uv, or pip with `--installer pip`;
`npm ci`) and `make demo` (synthesize, deploy into the embedded AWS, review the samples), each timed; their sum is
what one `make demo` on a fresh clone takes. The package caches (uv's, pip's, npm's) are pointed at a folder of this
bench's own: empty for the first run of an installer (the cold cache, which downloads everything), kept for the runs
after it (the warm cache). Recorded per run: the 1-minute load average at its start (the machine may be shared), the
bytes received on the non-loopback network interfaces while it ran (machine-wide, so an upper bound on what it
downloaded), the cache folder's size after it, and the size of `.venv` and `node_modules` (the disk a checkout
needs). Results: bench/results/first-run.json; `make docs` renders them into the README (bench/publish.py).

    python bench/first_run.py                        # uv: 1 cold run, then 3 warm ones
    python bench/first_run.py --installer uv,pip     # the same for pip too (pip's own cache), for the comparison
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "first-run.json"
# What a new user's shell would not have: this checkout's venv, its imports, make's own variables.
DROPPED_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def du_bytes(*paths: Path) -> int:
    """Bytes on disk under the paths together (`du -sbc`: a file hard-linked from two of them counted once: uv links
    the venv's files to its cache)."""
    present = [str(p) for p in paths if p.exists()]
    if not present:
        return 0
    out = subprocess.run(["du", "-sbc", *present], capture_output=True, text=True, check=True)
    return int(out.stdout.splitlines()[-1].split()[0])


def rx_bytes() -> int:
    """Bytes received so far on every network interface but loopback (machine-wide)."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, counters = line.split(":", 1)
        if name.strip() != "lo":
            total += int(counters.split()[0])
    return total


def run_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p + "/" and "/node_modules/" not in p + "/")
    env.update(UV_CACHE_DIR=str(cache / "uv"), PIP_CACHE_DIR=str(cache / "pip"), npm_config_cache=str(cache / "npm"))
    return env


def timed_make(target: str, clone: Path, env: dict[str, str], log: Path, installer: str,
               timeout: float) -> tuple[float, int]:
    start = time.monotonic()
    with log.open("a") as out:
        proc = subprocess.run(["make", target, f"INSTALLER={installer}"], cwd=clone, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout)
    return round(time.monotonic() - start, 1), proc.returncode


def installer_used(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("installed the requirements with "):
            return line.removeprefix("installed the requirements with ").strip()
    return "unknown"


def one_run(work: Path, n: int, installer: str, cache: Path, cold: bool, timeout: float) -> dict[str, Any]:
    clone = work / f"clone-{n}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    log = work / f"run-{n}.log"
    env = run_env(cache)
    load = os.getloadavg()
    rx0 = rx_bytes()
    install_s, rc = timed_make("venv", clone, env, log, installer, timeout)
    demo_s, demo_rc = (0.0, rc) if rc else timed_make("demo", clone, env, log, installer, timeout)
    cloned = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
    row: dict[str, Any] = {
        "commit": cloned.stdout.strip(), "installer": installer, "cache": "cold" if cold else "warm",
        "installed_with": installer_used(log),
        "load_1m_at_start": round(load[0], 2), "load_5m_at_start": round(load[1], 2),
        "install_s": install_s, "demo_s": demo_s, "total_s": round(install_s + demo_s, 1),
        "exit_code": demo_rc, "network_rx_bytes": rx_bytes() - rx0,
        "cache_bytes_after": du_bytes(cache),
        "venv_bytes": du_bytes(clone / ".venv"), "node_modules_bytes": du_bytes(clone / "node_modules"),
        "checkout_and_cache_bytes": du_bytes(clone / ".venv", clone / "node_modules", cache),
    }
    if demo_rc:
        row["log_tail"] = log.read_text(errors="replace").splitlines()[-20:]
    shutil.rmtree(clone, ignore_errors=True)
    return row


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for installer in dict.fromkeys(r["installer"] for r in runs):
        mine = [r for r in runs if r["installer"] == installer and r["exit_code"] == 0]
        cold = [r for r in mine if r["cache"] == "cold"]
        warm = [r for r in mine if r["cache"] == "warm"]
        entry: dict[str, Any] = {"cold_runs": len(cold), "warm_runs": len(warm)}
        for name, rows in (("cold", cold), ("warm", warm)):
            if rows:
                entry[f"{name}_total_s_median"] = statistics.median(r["total_s"] for r in rows)
                entry[f"{name}_install_s_median"] = statistics.median(r["install_s"] for r in rows)
                entry[f"{name}_demo_s_median"] = statistics.median(r["demo_s"] for r in rows)
        if cold:
            entry["cold_network_rx_bytes"] = cold[0]["network_rx_bytes"]
            entry["cold_cache_bytes"] = cold[0]["cache_bytes_after"]
        if cold:
            entry["cold_checkout_and_cache_bytes"] = cold[0]["checkout_and_cache_bytes"]
        if mine:
            entry["venv_bytes"] = max(r["venv_bytes"] for r in mine)
            entry["node_modules_bytes"] = max(r["node_modules_bytes"] for r in mine)
        out[installer] = entry
    return out


def tool_version(*cmd: str) -> str:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unavailable ({exc})"


def _args_without_note(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip or arg == "--note" or arg.startswith("--note="):
            skip = arg == "--note"
            continue
        out.append(arg)
    return out


def write_results(args: argparse.Namespace, started: dt.datetime, runs: list[dict[str, Any]]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    results = {
        "what": "make demo on a fresh clone (git clone of the checkout, ../shared beside it): make venv + make demo",
        "command": "python bench/first_run.py " + " ".join(_args_without_note(sys.argv[1:])),
        "commit": commit.stdout.strip(), "date": started.date().isoformat(),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "node": tool_version("node", "--version"), "system": platform.platform()},
        "note": args.note, "runs": runs, "summary": summarise(runs),
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--installer", default="uv", help="comma-separated: uv, pip (default uv)")
    parser.add_argument("--warm", default="3", help="warm runs after each installer's cold one: N, or N,M per installer")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the ../shared to copy beside")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one make target may take")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="a sentence on the conditions, kept in the results")
    args = parser.parse_args()
    installers = [i.strip() for i in args.installer.split(",") if i.strip()]
    warms = [int(w) for w in args.warm.split(",")]
    warms = warms * len(installers) if len(warms) == 1 else warms
    if not set(installers) <= {"uv", "pip"} or len(warms) != len(installers):
        print("error: --installer takes uv and/or pip; --warm one count, or one per installer", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still removes its clones
    work = Path(tempfile.mkdtemp(prefix="first-run-"))
    runs: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.UTC)
    try:
        if args.shared.is_dir():
            shutil.copytree(args.shared, work / "shared", symlinks=True)
        n = 0
        for installer, warm in zip(installers, warms, strict=True):
            cache = work / f"cache-{installer}"
            cache.mkdir()
            for i in range(1 + warm):
                n += 1
                row = one_run(work, n, installer, cache, cold=i == 0, timeout=args.timeout)
                runs.append(row)
                print(json.dumps(row), flush=True)
                write_results(args, started, runs)  # after each run: an interrupted bench keeps what it measured
                if row["exit_code"]:
                    break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summarise(runs), indent=2))
    return 0 if runs and all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
