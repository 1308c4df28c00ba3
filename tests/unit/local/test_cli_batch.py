"""`review submit --batch` and `review batch` (click's CliRunner) against the in-memory fakes: the Job API's
batches, bound to the CLI's principal (locally the API's first principal, so the API's token reads them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from contract_review.domain.ports import Queue
from contract_review.domain.principals import Caller
from contract_review.operate import api_batches
from review_local.batches import LOCAL_PRINCIPAL
from review_local.cli import Ctx, cli, render

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..inprocess import InProcess


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(render.console, "width", 400)


def run(world: FakeWorld, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), obj=Ctx(None, None, deps=world.deps))


def items_file(tmp_path: Path) -> Path:
    (tmp_path / "nda.txt").write_text(TEXT, encoding="utf-8")
    lines = [{"custom_id": "nda", "file": "nda.txt"},
             {"custom_id": "msa", "document": {"text": LONG_TEXT}, "metadata": {"matter": "M-9"}},
             {"custom_id": "empty", "document": {"text": "  "}}]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


def test_submit_batch_submits_each_item_and_names_the_rejected_one(tmp_path: Path):
    world = FakeWorld()
    # WHEN a JSONL batch with a bad item is submitted
    result = run(world, "submit", "--batch", str(items_file(tmp_path)))
    # THEN two jobs were sent, each line names its job or its error, and exit 1 names the rejected item
    assert result.exit_code == 1
    out = result.stdout
    batch_id = out.split()[1]
    assert out.startswith("batch batch-") and "  nda  job-" in out and "  msa  job-" in out
    assert "empty  rejected: input.empty_document" in out
    assert "1 item(s) rejected or not submitted (the others were submitted): empty" in result.stderr
    assert len(world.queues.sent[Queue.INTAKE]) == 2
    # AND the batch is the local API principal's: its manifest answers to it
    manifest = api_batches.batch_manifest(world.deps, Caller(LOCAL_PRINCIPAL), batch_id)
    assert [line.custom_id for line in manifest.items] == ["nda", "msa", "empty"]
    # AND once the jobs ran, `review batch` shows each item's state
    run_ = InProcess(world)
    for line in manifest.items:
        if line.job_id:
            run_.run(line.job_id)
    shown = run(world, "batch", batch_id)
    assert shown.exit_code == 0, shown.output
    assert "2 completed, 1 rejected" in shown.stdout and "(all ended)" in shown.stdout
    as_json = json.loads(run(world, "batch", batch_id, "--json").stdout)
    assert [i["status"] for i in as_json["items"]] == ["completed", "completed", "rejected"]


def test_the_same_batch_file_twice_is_one_batch(tmp_path: Path):
    world = FakeWorld()
    path = items_file(tmp_path)
    first, second = run(world, "submit", "--batch", str(path)), run(world, "submit", "--batch", str(path))
    assert first.stdout.split()[1] == second.stdout.split()[1]
    assert "(submitted before: the same batch)" in second.stdout
    assert len(world.queues.sent[Queue.INTAKE]) == 2


@pytest.mark.parametrize("content,args,message", [
    ("", [], "no items"),
    ('{"custom_id": "x", "file": "absent.txt"}', [], "absent.txt (item 'x')"),
    ('{"custom_id": "x", "document": {"text": "t"}}', ["extra.txt"], "not both"),
])
def test_batch_problems_are_one_line(tmp_path: Path, content: str, args: list[str], message: str):
    world = FakeWorld()
    path = tmp_path / "items.jsonl"
    path.write_text(content, encoding="utf-8")
    (tmp_path / "extra.txt").write_text(TEXT, encoding="utf-8")
    result = run(world, "submit", "--batch", str(path), *[str(tmp_path / a) for a in args])
    assert result.exit_code != 0 and message in result.stderr, result.output
    assert not world.queues.sent[Queue.INTAKE]


def test_an_unknown_batch_is_one_line():
    result = run(FakeWorld(), "batch", "batch-" + "0" * 20)
    assert result.exit_code == 1 and "no batch batch-00000000000000000000" in result.stderr


def test_submit_without_files_or_batch_is_a_usage_error():
    result = run(FakeWorld(), "submit")
    assert result.exit_code == 2 and "give FILE... or --batch ITEMS.jsonl" in result.stderr


def test_review_batch_takes_a_unique_prefix_of_the_batch_id_and_names_an_ambiguous_one(tmp_path: Path):
    # GIVEN two batches whose ids share their first characters (their manifests' names: batches/<id>.json)
    world = FakeWorld()
    batch_id = run(world, "submit", "--batch", str(items_file(tmp_path))).stdout.split()[1]
    twin = batch_id[:10] + "f" * (len(batch_id) - 10)
    world.artifacts.put_text(f"batches/{twin}.json", "{}")
    # WHEN `review batch` is given a prefix only this batch has, with or without `batch-`
    for given in (batch_id[:14], batch_id[len("batch-"):14]):
        shown = run(world, "batch", given, "--json")
        # THEN it is that batch, named whole
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["batchId"] == batch_id
    # AND a prefix both share is one line naming both, nothing shown
    both = run(world, "batch", batch_id[:10])
    assert both.exit_code == 1 and "is the start of 2 batch ids" in both.stderr
    assert batch_id in both.stderr and twin in both.stderr
    # AND a prefix nobody has is the unknown batch's line
    none = run(world, "batch", "batch-0000")
    assert none.exit_code == 1 and "no batch batch-0000" in none.stderr
