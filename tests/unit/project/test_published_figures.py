"""Published figures are rendered from their results files (bench/publish.py), never typed by hand: each page's
generated block is what its results file renders now; the first-run figures (bench/first_run.py) say what was
measured, how often and under which load, and a block's markers bound what the generator may rewrite."""

from __future__ import annotations

import json
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


# ---- every figure from its results file, with the conditions that file records --------------------------------------

@pytest.mark.parametrize("page", publish.PAGES, ids=str)
def test_no_page_holds_a_hand_typed_figure_outside_its_generated_blocks(page: Path) -> None:
    found = publish.hand_typed(str(page), (ROOT / page).read_text(encoding="utf-8"))
    assert found == [], "hand-typed figures (render them from a results file, or say them without a number):\n" + \
        "\n".join(found)


def test_the_scan_finds_each_kind_of_hand_typed_figure_and_skips_generated_blocks_and_code() -> None:
    page = ("It costs $1.73 and took 9 minutes, x1.34 faster, ×1.75 dearer, 4.2 % throttled, 3.7 s to recover,\n"
            "1/8 of Step Functions.\n"
            "<!-- BEGIN fig: generated -->\n$2.89 in 544 s, x0.60, 19.7 %\n<!-- END fig -->\n"
            "`--median-ms 800` and\n```\nmake bench   # ~4.5 minutes\n```\nnever $0.\n")
    found = " ".join(publish.hand_typed("some/page.md", page))
    for figure in ("'$1.73'", "'9 minutes'", "'x1.34'", "'×1.75'", "'4.2 %'", "'3.7 s'", "'1/8'"):
        assert figure in found
    for inside in ("$2.89", "544 s", "x0.60", "19.7 %", "800", "4.5 minutes", "$0"):
        assert inside not in found


def test_the_allow_list_admits_a_price_or_a_setting_only_on_its_own_page_and_in_its_own_words() -> None:
    line = "hour, $0.01975 for 0.5 vCPU and 1 GB on Linux/ARM, and it cost $0.01975 in all\n"
    found = publish.hand_typed("docs/cost.md", line)
    assert len(found) == 1 and "'$0.01975'" in found[0]  # the price passes, the same amount as a result does not
    assert len(publish.hand_typed("bench/README.md", line)) == 2


def test_a_block_is_stale_once_its_results_file_changes(tmp_path: Path) -> None:
    block = next(b for b in publish.BLOCKS if b.page == Path("README.md") and b.name == "cost")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    tokens = json.loads((ROOT / publish.TOKENS).read_text(encoding="utf-8"))
    (tmp_path / publish.TOKENS).write_text(json.dumps(tokens), encoding="utf-8")
    now, wanted = publish.rendered(block, root=tmp_path)
    assert now == wanted
    tokens["runs"]["cached"]["model_usd_per_100kb"] = 2.05
    (tmp_path / publish.TOKENS).write_text(json.dumps(tokens), encoding="utf-8")
    now, wanted = publish.rendered(block, root=tmp_path)
    assert now != wanted and "$2.05" in wanted and "$2.05" not in now


def test_conditions_say_what_the_file_does_not_record_and_claim_nothing_it_does_not() -> None:
    bare = {"machine": {"cpus": 2}, "throughput": {}, "recovery": {}}
    text = publish.recorded(bare, "bench/results/x.json")
    assert text == "`bench/results/x.json`, no commit recorded, no date recorded, 2 cores, load not recorded"
    assert publish.model_conditions(bare).startswith("an instant model")
    full = {"git": {"head": "abc1234def", "changed": []}, "date": "2026-12-01",
            "machine": {"cpus": 2, "load_1min_at_start": 6.1},
            "settings": {"median_ms": 800.0, "p99_ms": 2000.0, "tpm": 600000.0, "window_s": 10.0,
                         "answer_median": 150.0, "answer_p99": 600.0}}
    assert publish.recorded(full, "f.json") == "`f.json`, commit abc1234, 2026-12-01, 2 cores, 1-minute load 6.1 at the start"
    model = publish.model_conditions(full)
    assert "latency median 800 ms, p99 2000 ms" in model and "600,000 tokens/min in a 10 s window" in model
    assert "answers of median 150 tokens" in model and "instant" not in model


def test_a_figure_measured_with_an_instant_model_says_so_where_it_is_quoted() -> None:
    files = {publish.LARGE: json.loads((ROOT / publish.LARGE).read_text(encoding="utf-8")),
             publish.PRIORITY: json.loads((ROOT / publish.PRIORITY).read_text(encoding="utf-8"))}
    large = " ".join(publish.render_large(files).split())
    priority = " ".join(publish.render_priority(files).split())
    assert "an instant model" in large and "no quota" in large
    assert "an instant model" in priority and "median of 3 batches" in priority and "spread" in priority


def test_a_faults_row_says_how_many_calls_did_fail_not_only_the_rate_asked() -> None:
    q = {"settings": {"median_ms": 500.0, "p99_ms": 900.0, "rpm": 600.0, "window_s": 2.0, "workers": 20,
                      "chars": 16000}, "machine": {"cpus": 2},
         "runs": {"faults": {"transient_rate": 0.05, "outcomes": {"ok": 73}, "recovery_s": 3.9, "makespan_s": 14.0,
                             "makespan_vs_ideal": 1.9, "model_call_span_s": 11.0, "calls_made": 73,
                             "calls_needed": 73, "goodput": 1.0, "redone_work": 0.0, "quota_utilisation": 0.5,
                             "throttled_share": 0.0}}}
    path = Path("bench/results/q.json")
    assert "| faults | 5 % asked, 0 failed, kill -9 |" in publish.quota_renderer(path)({path: q})
