"""`python app.py` without the CDK CLI: CDK_OUTDIR + CDK_CONTEXT_JSON, exactly as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plain_python_app_synthesizes_into_cdk_outdir(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CDK_OUTDIR": str(tmp_path),
        "CDK_CONTEXT_JSON": json.dumps({"profile": "local", "stack_name": "EntryCheck"}),
    }
    proc = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    template = json.loads((tmp_path / "EntryCheck.template.json").read_text())
    assert template["Outputs"]["ProfileName"]["Value"] == "local"
    fifo = {r["Properties"].get("QueueName") for r in template["Resources"].values() if r["Type"] == "AWS::SQS::Queue"}
    assert "EntryCheck-results.fifo" in fifo
    # cdk.json's feature flags are applied without the CLI too
    assert "Node 20 is end-of-life" not in proc.stderr


def test_a_prod_synth_without_an_alarm_address_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CDK_OUTDIR": str(tmp_path), "CDK_CONTEXT_JSON": json.dumps({"profile": "prod"})}
    proc = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "jsii" not in line.lower()]
    assert lines == [lines[0]] and lines[0].startswith("app.py: alarm_email:") and "-c alarm_email=none" in lines[0]
    assert not list(tmp_path.glob("*.template.json"))  # nothing synthesized
