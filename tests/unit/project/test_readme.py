"""README.md stays true: its message examples are valid JSON that the published schema and intake
accept, its one-liners (a .txt file -> a message; a message -> its job id) work and agree with the
code, and every `review` command and option its CLI table names exists."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import jsonschema
import pytest

from contract_review.domain.messages import parse_intake
from contract_review.domain.records import job_id_for
from contract_review.operate import api
from contract_review.pipeline.intake import handle_intake
from contract_review.review.chunking import document_hash
from review_local.cli import cli

from ..fakes import FakeWorld

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SCHEMA = json.loads((ROOT / "docs" / "intake-message.schema.json").read_text(encoding="utf-8"))
SAMPLE = "samples/mutual-nda.txt"


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def one_liner(prefix: str) -> list[str]:
    [line] = [line for line in README.splitlines() if line.startswith(prefix)]
    return shlex.split(line)


def run_python_one_liner(args: list[str], tmp_path: Path) -> str:
    """Run a README `python3 -c ...` line (from the repository root), its `> file` redirect honoured."""
    out_file = None
    if ">" in args:
        at = args.index(">")
        args, out_file = args[:at], args[at + 1]
    args = [sys.executable, *[str(tmp_path / a) if a == "msg.json" else a for a in args[1:]]]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    if out_file:
        (tmp_path / out_file).write_text(proc.stdout, encoding="utf-8")
    return proc.stdout


def test_the_readmes_api_caller_policy_names_only_routes_the_api_serves():
    [policy] = [json.loads(t) for t in fenced("json") if '"execute-api:Invoke"' in t]
    [statement] = policy["Statement"]
    assert statement["Effect"] == "Allow" and statement["Action"] == "execute-api:Invoke"
    for arn in statement["Resource"]:
        method, path = arn.split("/$default/", 1)[1].split("/", 1)
        assert any(m == method and re.fullmatch(re.sub(r"\{[^}]+\}", r"[^/]+", t), "/" + path.replace("*", "x"))
                   for m, t in api.ROUTES), arn


def test_readme_json_examples_are_valid_messages():
    # GIVEN every ```json block of the README
    examples = [t for t in fenced("json") if '"schema_version"' in t]  # (the others: an IAM policy)
    assert len(examples) >= 2  # inline and s3_uri
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for text in examples:
        # THEN each parses as JSON (no comments), the published schema accepts it, and so does intake's parser
        message = json.loads(text)
        validator.validate(message)
        parsed = parse_intake(text)
        assert parsed.schema_version == 1
    # AND between them they show both document forms
    forms = {next(iter(json.loads(t)["document"])) for t in examples}
    assert forms == {"text", "s3_uri"}


def test_readme_inline_example_is_taken_in_under_the_formula_job_id():
    # GIVEN the README's inline example (with an idempotency_key)
    [text] = [t for t in fenced("json") if '"text"' in t]
    message = json.loads(text)
    world = FakeWorld()
    # WHEN intake handles it  THEN the job id is the formula's, the metadata echoed
    result = handle_intake(world.deps, text, "m-1")
    assert result.state == "running" and result.job_id == job_id_for(message["idempotency_key"])
    job = world.jobs.get(result.job_id)
    assert job is not None and job.metadata == message["metadata"] and job.document_id == message["document_id"]


def test_readme_one_liners_make_a_message_and_compute_its_job_id(tmp_path):
    # GIVEN the README's one-liner that turns a .txt file into a message
    make = one_liner("python3 -c 'import json,sys;")
    assert SAMPLE in make
    run_python_one_liner(make, tmp_path)
    body = (tmp_path / "msg.json").read_text(encoding="utf-8")
    message = json.loads(body)
    # THEN the message is valid and carries the file's text exactly
    jsonschema.Draft202012Validator(SCHEMA).validate(message)
    assert message["document"]["text"] == (ROOT / SAMPLE).read_text(encoding="utf-8")
    # AND the README's job-id one-liner prints the id intake gives that message
    job_id = run_python_one_liner(one_liner("python3 -c 'import hashlib,json,sys;"), tmp_path).strip()
    world = FakeWorld()
    result = handle_intake(world.deps, body, "m-1")
    assert job_id == result.job_id == job_id_for(document_hash(message["document"]["text"]))
    # AND `review jobs --document-id` (the README's other way) names the document id the one-liner set
    assert f"review jobs --document-id {message['document_id']}" in README


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_readme_jq_one_liner_makes_the_same_message(tmp_path):
    [jq_line] = re.findall(r"`(jq -Rs [^`]+)`", README)
    args = shlex.split(jq_line)
    at = args.index(">")
    out = subprocess.run(args[:at], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True).stdout
    message = json.loads(out)
    jsonschema.Draft202012Validator(SCHEMA).validate(message)
    assert message["document"]["text"] == (ROOT / SAMPLE).read_text(encoding="utf-8")


def command_of(words: list[str]) -> tuple[click.Command, list[str]]:
    """The command a README row names: its leading words that are (sub)commands of `review`."""
    cmd: click.Command = cli
    path: list[str] = []
    for word in words:
        if not isinstance(cmd, click.Group) or word not in cmd.commands:
            break
        cmd = cmd.commands[word]
        path.append(word)
    return cmd, path


def test_readme_cli_table_names_commands_and_options_that_exist():
    # GIVEN the rows of the README's CLI table
    rows = re.findall(r"^\| `review ([^`]+)` \|", README, flags=re.M)
    assert len(rows) >= 10
    for row in rows:
        cmd, path = command_of(row.split())
        # THEN each names an existing command (not just the group) ...
        assert path and not isinstance(cmd, click.Group), f"README: `review {row}` is no command"
        # ... and every --option it shows is an option of that command
        options = {o for p in cmd.params for o in getattr(p, "opts", [])}
        for opt in re.findall(r"--[a-z-]+", row):
            assert opt in options, f"README: `review {row}` names {opt}, which `review {' '.join(path)}` lacks"
