"""Published figures are rendered from their results files (bench/publish.py), never typed by hand: each page's
generated block is what its results file renders now; the first-run figures (bench/first_run.py) say what was
measured, how often and under which load, and a block's markers bound what the generator may rewrite."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import first_run, publish  # noqa: E402


@pytest.mark.parametrize("block", publish.BLOCKS, ids=lambda b: f"{b.page}:{b.name}")
def test_every_generated_block_is_what_its_results_file_renders(block: publish.Block) -> None:
    now, wanted = publish.rendered(block)
    assert now == wanted, f"{block.page}'s {block.name} block is stale; regenerate with: make docs"


def run(installer: str, cache: str, total: float, load: float, exit_code: int = 0, **extra: Any) -> dict[str, Any]:
    return {"installer": installer, "cache": cache, "load_1m_at_start": load, "install_s": total - 40.0,
            "demo_s": 40.0, "total_s": total, "exit_code": exit_code, "network_rx_bytes": 310_000_000,
            "cache_bytes_after": 700_000_000, "venv_bytes": 900_000_000, "node_modules_bytes": 240_000_000,
            "checkout_and_cache_bytes": 1_800_000_000, **extra}


def results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"command": "python bench/first_run.py", "commit": "abc1234", "date": "2026-12-01",
            "machine": {"nproc": 2, "python": "3.11.7", "node": "v20", "system": "Linux"}, "note": "",
            "runs": runs, "summary": first_run.summarise(runs)}


def test_the_summary_takes_medians_of_the_completed_runs_of_each_installer() -> None:
    runs = [run("uv", "cold", 200, 1.0), run("uv", "warm", 100, 2.0), run("uv", "warm", 130, 3.0),
            run("uv", "warm", 90, 4.0), run("uv", "warm", 10, 4.0, exit_code=2),
            run("pip", "cold", 500, 5.0), run("pip", "warm", 300, 6.0)]
    summary = first_run.summarise(runs)
    assert summary["uv"]["warm_runs"] == 3 and summary["uv"]["warm_total_s_median"] == 100  # the failed run left out
    assert summary["uv"]["cold_total_s_median"] == 200 and summary["uv"]["cold_network_rx_bytes"] == 310_000_000
    assert summary["pip"]["cold_install_s_median"] == 460 and summary["pip"]["warm_runs"] == 1


def test_the_readme_states_time_cold_and_warm_runs_load_and_disk() -> None:
    text = publish.render_readme_first_run(results(
        [run("uv", "cold", 200, 1.5), run("uv", "warm", 100, 2.25), run("uv", "warm", 130, 3.0),
         run("uv", "warm", 90, 4.0)]))
    text = " ".join(text.split())  # unwrapped
    assert "**1 min 40 s** with a warm package cache (median of 3 runs)" in text
    assert "**3 min 20 s** with a cold one, which received 310 MB over the network" in text
    assert "1.1 GB of disk (`.venv` 900 MB, `node_modules` 240 MB), 1.8 GB with the package caches" in text
    assert ("commit abc1234, 2026-12-01, 2 cores, 1-minute load average 1.5 to 4 as the runs started (above the core "
            "count: the machine was busy with other work)") in " ".join(text.split())


def test_fewer_warm_runs_than_asked_are_said_so() -> None:
    text = " ".join(publish.render_readme_first_run(results([run("uv", "cold", 200, 1.0),
                                                             run("uv", "warm", 100, 1.0)])).split())
    assert "with a warm package cache (one run)" in text and "median" not in text
    assert "load average 1 as the runs started;" in " ".join(text.split())  # not above the 2 cores: not called busy


def test_the_bench_page_lists_every_run_and_what_uv_saved_over_pip() -> None:
    text = publish.render_bench_first_run(results(
        [run("uv", "cold", 200, 1.0), run("uv", "warm", 100, 1.0), run("pip", "cold", 500, 2.0),
         run("pip", "warm", 50, 2.0, exit_code=2)]))
    assert text.count("\n| uv |") == 2 and text.count("\n| pip |") == 2
    assert "| pip | warm | 2 | 10 s | 40 s | 50 s (failed: exit 2) |" in text
    assert "- The install with a cold cache: uv 2 min 40 s, pip 7 min 40 s (5 min 0 s saved)." in text.replace("\n", " ")
    assert "warm cache: uv" not in text  # pip has no completed warm run to compare with


def test_fill_rewrites_between_the_markers_only_and_refuses_a_page_without_them() -> None:
    page = "before\n<!-- BEGIN fig: generated -->\nold\n<!-- END fig -->\nafter\n"
    assert publish.fill(page, "fig", "new\n") == "before\n<!-- BEGIN fig: generated -->\nnew\n<!-- END fig -->\nafter\n"
    with pytest.raises(publish.MissingMarkers):
        publish.fill("no markers here\n", "fig", "new\n")
    with pytest.raises(publish.MissingMarkers):
        publish.fill(page + page, "fig", "new\n")
