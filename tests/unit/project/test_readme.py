"""README.md and the pages it sends a newcomer to stay true: the README is short (at most 300 lines) and its
commands exist (`make demo`, `make test`, the quickstart's `review` commands); docs/message-schema.md's message
examples are valid JSON that the published schema and intake accept, and its one-liners (a .txt file -> a message;
a message -> its job id) work and agree with the code; docs/api.md's caller policy names only routes the API serves;
and every `review` command and option docs/cli.md's table names exists."""

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
MESSAGES = (ROOT / "docs" / "message-schema.md").read_text(encoding="utf-8")
API_DOC = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
CLI_DOC = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
README_MAX_LINES = 300
SCHEMA = json.loads((ROOT / "docs" / "intake-message.schema.json").read_text(encoding="utf-8"))
SAMPLE = "samples/mutual-nda.txt"


def fenced(lang: str, text: str = MESSAGES) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def one_liner(prefix: str) -> list[str]:
    [line] = [line for line in MESSAGES.splitlines() if line.startswith(prefix)]
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


def test_the_readme_is_short_and_names_the_two_commands():
    # GIVEN the README  THEN a newcomer can hold it: at most 300 lines
    assert len(README.splitlines()) <= README_MAX_LINES
    # AND its two commands are targets of the Makefile
    [block] = [b for b in fenced("bash", README) if "make demo" in b]
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(encoding="utf-8"), flags=re.M))
    assert {line.split()[1] for line in block.splitlines()} == {"demo", "test"} <= targets


def review_words(line: str) -> list[str] | None:
    """The words after `review` in a shell line (its last `&&` part, comment dropped), the stack options left out."""
    words = line.split("#")[0].split("&&")[-1].split()
    if words[:1] != ["review"]:
        return None
    out, skip = [], False
    for word in words[1:]:
        if skip or word in {"--stack", "--region"}:
            skip = not skip
            continue
        out.append(word)
    return out


def test_the_readmes_review_commands_exist():
    # GIVEN every `review ...` line of the README's command blocks (the quickstart, deploy in brief)
    commands = [w for b in fenced("bash", README) for line in b.splitlines() if (w := review_words(line)) is not None]
    assert len(commands) >= 3
    for words in commands:
        # THEN each names an existing command
        cmd, path = command_of(words)
        assert path and not isinstance(cmd, click.Group), f"README: `review {' '.join(words)}` is no command"


def test_the_api_docs_caller_policy_names_only_routes_the_api_serves():
    [policy] = [json.loads(t) for t in fenced("json", API_DOC) if '"execute-api:Invoke"' in t]
    [statement] = policy["Statement"]
    assert statement["Effect"] == "Allow" and statement["Action"] == "execute-api:Invoke"
    for arn in statement["Resource"]:
        method, path = arn.split("/$default/", 1)[1].split("/", 1)
        assert any(m == method and re.fullmatch(re.sub(r"\{[^}]+\}", r"[^/]+", t), "/" + path.replace("*", "x"))
                   for m, t in api.ROUTES), arn


def test_message_schema_doc_json_examples_are_valid_messages():
    # GIVEN every ```json block of docs/message-schema.md
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


def test_message_schema_doc_inline_example_is_taken_in_under_the_formula_job_id():
    # GIVEN docs/message-schema.md's inline example (with an idempotency_key)
    [text] = [t for t in fenced("json") if '"text"' in t]
    message = json.loads(text)
    world = FakeWorld()
    # WHEN intake handles it  THEN the job id is the formula's, the metadata echoed
    result = handle_intake(world.deps, text, "m-1")
    assert result.state == "running" and result.job_id == job_id_for(message["idempotency_key"])
    job = world.jobs.get(result.job_id)
    assert job is not None and job.metadata == message["metadata"] and job.document_id == message["document_id"]


def test_message_schema_doc_one_liners_make_a_message_and_compute_its_job_id(tmp_path):
    # GIVEN docs/message-schema.md's one-liner that turns a .txt file into a message
    make = one_liner("python3 -c 'import json,sys;")
    assert SAMPLE in make
    run_python_one_liner(make, tmp_path)
    body = (tmp_path / "msg.json").read_text(encoding="utf-8")
    message = json.loads(body)
    # THEN the message is valid and carries the file's text exactly
    jsonschema.Draft202012Validator(SCHEMA).validate(message)
    assert message["document"]["text"] == (ROOT / SAMPLE).read_text(encoding="utf-8")
    # AND the page's job-id one-liner prints the id intake gives that message
    job_id = run_python_one_liner(one_liner("python3 -c 'import hashlib,json,sys;"), tmp_path).strip()
    world = FakeWorld()
    result = handle_intake(world.deps, body, "m-1")
    assert job_id == result.job_id == job_id_for(document_hash(message["document"]["text"]))
    # AND `review jobs --document-id` (the page's other way) names the document id the one-liner set
    assert f"review jobs --document-id {message['document_id']}" in MESSAGES


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_message_schema_doc_jq_one_liner_makes_the_same_message(tmp_path):
    [jq_line] = re.findall(r"`(jq -Rs [^`]+)`", MESSAGES)
    args = shlex.split(jq_line)
    at = args.index(">")
    out = subprocess.run(args[:at], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True).stdout
    message = json.loads(out)
    jsonschema.Draft202012Validator(SCHEMA).validate(message)
    assert message["document"]["text"] == (ROOT / SAMPLE).read_text(encoding="utf-8")


def command_of(words: list[str]) -> tuple[click.Command, list[str]]:
    """The command a doc's row names: its leading words that are (sub)commands of `review`."""
    cmd: click.Command = cli
    path: list[str] = []
    for word in words:
        if not isinstance(cmd, click.Group) or word not in cmd.commands:
            break
        cmd = cmd.commands[word]
        path.append(word)
    return cmd, path


def test_cli_doc_table_names_commands_and_options_that_exist():
    # GIVEN the rows of docs/cli.md's table
    rows = re.findall(r"^\| `review ([^`]+)` \|", CLI_DOC, flags=re.M)
    assert len(rows) >= 10
    for row in rows:
        cmd, path = command_of(row.split())
        # THEN each names an existing command (not just the group) ...
        assert path and not isinstance(cmd, click.Group), f"docs/cli.md: `review {row}` is no command"
        # ... and every --option it shows is an option of that command
        options = {o for p in cmd.params for o in getattr(p, "opts", [])}
        for opt in re.findall(r"--[a-z-]+", row):
            assert opt in options, f"docs/cli.md: `review {row}` names {opt}, which `review {' '.join(path)}` lacks"
