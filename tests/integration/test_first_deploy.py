"""docs/first-deploy.md's procedure, as an operator follows it: every command of its steps is accounted for here.

The `review` commands run as written against a local stack (real worker processes on embedded AWS; the local stack in
place of `--stack ContractReview`, the one change), and each step's check is asserted on what they print. What needs a
real account is named below with why (`AWS_ONLY`) or with the test that runs it with botocore's Stubber
(`ELSEWHERE`): a command added to the procedure that is in neither list fails this test until it is run somewhere.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from review_local.cli import Ctx, cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "first-deploy.md"
STACK = ["--stack", "ContractReview"]

# commands that need a real account, and why
AWS_ONLY = {
    "aws iam create-service-linked-role": "IAM service-linked roles (moto runs no ECS)",
    "npx cdk bootstrap": "the CDK's bootstrap stack in a real account",
    "aws cloudwatch set-alarm-state": "an email from a real alarm",
    "aws cloudwatch list-metrics": "Bedrock's own metrics",
    "aws bedrock list-tags-for-resource": "a real application inference profile",
    "aws ce update-cost-allocation-tags-status": "Cost Explorer, from the payer account",
    "export AWS_PROFILE": "the operator's own credentials",
}
# commands run by another test, with what it runs them against
ELSEWHERE = {
    "make venv": "every CI run (.ci/run -> make test)",
    "source .venv/bin/activate": "every CI run",
    "make deploy": "tests/unit/project/test_toolchain.py: the real Makefile, preflight first, its exit code gating the deploy",
    "review --stack ContractReview preflight": "tests/unit/local/test_preflight*.py: a deployed stack's preflight (Stubber)",
}


def procedure_commands() -> list[str]:
    """Every command line of the procedure's bash blocks, in order (comments and blank lines dropped)."""
    text = DOC.read_text()
    section = text[text.index("## The procedure"):text.index("\n## ", text.index("## The procedure") + 5)]
    lines = [ln.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S) for ln in block.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _covered(command: str) -> bool:
    return any(command.startswith(prefix) for prefix in (*AWS_ONLY, *ELSEWHERE))


def test_every_command_of_the_procedure_is_run_here_or_named_where_it_is_run() -> None:
    commands = procedure_commands()
    assert len(commands) >= 12, commands  # the procedure's steps, read from the doc
    local = [c for c in commands if not _covered(c)]
    assert local and all(c.startswith("review --stack ContractReview ") for c in local), local
    # every entry of the lists is still in the procedure (a command removed from the doc leaves no stale excuse)
    assert all(any(c.startswith(prefix) for c in commands) for prefix in (*AWS_ONLY, *ELSEWHERE))


def test_the_procedures_review_commands_run_as_written_against_a_local_stack(make_stack) -> None:
    stack = make_stack()
    deps = stack.deps()
    job_id = ""
    outputs: dict[str, str] = {}
    for command in procedure_commands():
        if _covered(command):
            continue
        args = shlex.split(command)[1:]
        assert args[:2] == STACK, command
        args = [job_id if a == "JOB" else a for a in args[2:]]
        result = CliRunner().invoke(cli, args, obj=Ctx(None, None, deps=deps), catch_exceptions=False)
        assert result.exit_code == 0, (command, result.output)
        outputs[args[0] if args[0] != "quota" else "quota"] = result.output
        if args[0] == "submit":
            (job_id,) = set(re.findall(r"job-[0-9a-f]{20,}", result.output))
    # step 7's checks: the job completed, with its calls and cost, nothing holding it; the report quotes the contract
    assert job_id and "completed" in outputs["submit"], outputs["submit"]
    assert f"{job_id} is completed" in outputs["status"] and "cost:" in outputs["status"]
    assert "held:" not in outputs["status"]
    nda = " ".join((ROOT / "samples" / "mutual-nda.txt").read_text().split())
    quotes = re.findall(r"\): > (.{20,}?)\s*$", outputs["report"], re.M)  # "- **Title** (score, chars a-b): > quote"
    assert quotes and all(" ".join(q.split()) in nda for q in quotes if "shortened" not in q), quotes[:5]
    # step 8's: the model runs, nothing holds it
    assert "model: running" in outputs["quota"] and "HELD" not in outputs["quota"], outputs["quota"]
