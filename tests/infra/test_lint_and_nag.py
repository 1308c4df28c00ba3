"""cfn-lint on the synthesized JSON, and proof that cdk-nag is active and fully acknowledged."""

from __future__ import annotations

import json

import pytest

from .conftest import FARGATE, LOCAL, PROD, Synth

# W3005 ("dependency already enforced by a GetAtt"): CDK adds an explicit DependsOn from every
# Lambda function to its role (and the role's policy) on top of the Role GetAtt. Harmless;
# emitted for every CDK Lambda function, not ours to change.
IGNORED_WARNINGS = {"W3005"}


@pytest.mark.parametrize("name", [LOCAL, PROD, FARGATE])
def test_cfn_lint_passes(synth: Synth, name: str) -> None:
    from cfnlint.api import ManualArgs, lint_file

    matches = lint_file(synth.template_path(name), config=ManualArgs(regions=["us-east-1", "eu-west-1"]))
    errors = [f"{m.rule.id} {m.message}" for m in matches if m.rule.id.startswith("E")]
    warnings = [f"{m.rule.id} {m.message}" for m in matches
                if not m.rule.id.startswith("E") and m.rule.id not in IGNORED_WARNINGS and not m.rule.id.startswith("I")]
    assert not errors, "\n".join(errors)
    assert not warnings, "\n".join(warnings)


def test_cdk_nag_report_is_clean(synth: Synth) -> None:
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    assert not [v for p in report.get("pluginReports", []) for v in p.get("violations", [])]


def test_acknowledgments_are_written_with_reasons(synth: Synth) -> None:
    t = synth.templates[PROD]
    acks = [(lid, rule) for lid, r in t["Resources"].items()
            for rule in r.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])]
    ours = [rule for _, rule in acks if rule["id"].startswith("AwsSolutions-")]
    assert {r["id"] for r in ours} >= {"AwsSolutions-L1"}
    assert any(r["id"].startswith("AwsSolutions-IAM5[Resource::<StorageArtifacts") for r in ours)
    assert all(len(r["reason"]) > 40 for r in ours)


def test_cdk_nag_fails_synth_on_an_unacknowledged_finding(tmp_path) -> None:
    import aws_cdk as cdk
    from aws_cdk import aws_sqs as sqs

    from infra import nag

    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Bad")
    sqs.Queue(stack, "NoDlqNoTls")  # AwsSolutions-SQS3 and SQS4
    nag.apply(app)
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = (tmp_path / "validation-report.json").read_text()
    assert "AwsSolutions-SQS3" in report and "AwsSolutions-SQS4" in report
