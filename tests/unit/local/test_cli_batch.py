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
    assert f"{tmp_path / 'items.jsonl'} line 3 (empty): input.empty_document: document has no text" in out
    assert f"1 of 3 item(s) of {tmp_path / 'items.jsonl'} rejected (the other 2 submitted): line 3 (empty)" in result.stderr
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
    ('\n{"custom_id": "x", "file": "absent.txt"}', [], "line 2 (x): input.document_missing: "),
    ('{"custom_id": "x", "document": {"text": "t"}}', ["extra.txt"], "not both"),
])
def test_batch_problems_are_one_line(tmp_path: Path, content: str, args: list[str], message: str):
    world = FakeWorld()
    path = tmp_path / "items.jsonl"
    path.write_text(content, encoding="utf-8")
    (tmp_path / "extra.txt").write_text(TEXT, encoding="utf-8")
    result = run(world, "submit", "--batch", str(path), *[str(tmp_path / a) for a in args])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, TypeError | KeyError | ValueError)
    assert not world.queues.sent[Queue.INTAKE]


def test_every_bad_line_of_a_batch_file_is_one_line_naming_its_file_line_and_the_others_are_submitted(tmp_path: Path):
    # GIVEN a JSON Lines file with a blank line, a line that is not JSON, a missing file, a bad metadata value and a
    # repeated custom_id between two good items
    (tmp_path / "nda.txt").write_text(TEXT, encoding="utf-8")
    lines = ['{"custom_id": "nda", "file": "nda.txt"}', "", "{this is not json",
             '{"custom_id": "gone", "file": "absent.txt"}',
             json.dumps({"custom_id": "msa", "document": {"text": LONG_TEXT}, "metadata": {"a": {"x": 1}}}),
             json.dumps({"custom_id": "long", "document": {"text": LONG_TEXT}}),
             json.dumps({"custom_id": "nda", "document": {"text": LONG_TEXT + " again"}})]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    world = FakeWorld()
    # WHEN it is submitted
    result = run(world, "submit", "--batch", str(path))
    # THEN no traceback: exit 1, the two good items sent as jobs
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert len(world.queues.sent[Queue.INTAKE]) == 2
    assert "  nda  job-" in result.stdout and "  long  job-" in result.stdout
    # AND each bad one is one line naming its line in the file (blank lines counted), its code and why, in words
    rejected = [line.strip() for line in result.stdout.splitlines() if str(path) in line]
    assert rejected == [
        f"{path} line 3: input.invalid: not JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path} line 4 (gone): input.document_missing: {tmp_path / 'absent.txt'}: No such file or directory",
        f"{path} line 5 (msa): input.invalid: metadata.a must be a string, true or false, a whole number, a number or "
        "a list, not an object.",
        f"{path} line 7 (nda): input.invalid: custom_id 'nda' appears twice in the batch"]
    assert "function-after" not in result.output and "_dynamo_number" not in result.output
    assert result.stderr.strip() == (f"Error: 4 of 6 item(s) of {path} rejected (the other 2 submitted): line 3, "
                                     "line 4 (gone), line 5 (msa), line 7 (nda)")
    # AND the batch's manifest keeps each item's place, so `review batch` and GET /batches/{id} say the same
    batch_id = result.stdout.split()[1]
    manifest = api_batches.batch_manifest(world.deps, Caller(LOCAL_PRINCIPAL), batch_id)
    assert manifest is not None
    assert [(i.where, i.job_id is not None) for i in manifest.items] == [
        ("line 1", True), ("line 3", False), ("line 4", False), ("line 5", False), ("line 6", True), ("line 7", False)]
    # AND --json says the same, as records
    as_json = json.loads(run(FakeWorld(), "submit", "--batch", str(path), "--json").stdout)
    assert [(i["where"], (i["error"] or {}).get("code")) for i in as_json["items"]] == [
        ("line 1", None), ("line 3", "input.invalid"), ("line 4", "input.document_missing"),
        ("line 5", "input.invalid"), ("line 6", None), ("line 7", "input.invalid")]


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
