"""The local template deploys into moto's CloudFormation (what the local runtime does)."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import pytest

from contract_review.config.settings import Settings

from .conftest import LOCAL, Synth, resources

REGION = "us-east-1"


def test_local_template_deploys_into_moto(synth: Synth, monkeypatch: pytest.MonkeyPatch) -> None:
    from review_local.embedded import moto_tags

    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    template = synth.templates[LOCAL]

    with moto.mock_aws(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # moto warns about the resource types it skips
        ssm = boto3.client("ssm", region_name=REGION)
        ssm.put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        # AWS's public parameters (the Powertools layer ARN) are resolved at deploy time; moto has none
        # and reserves /aws/service/, so the copy deployed here reads a stand-in parameter instead
        layer = f"arn:aws:lambda:{REGION}:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-arm64:1"
        template = json.loads(json.dumps(template))
        for name, param in template["Parameters"].items():
            if param["Type"] == "AWS::SSM::Parameter::Value<String>" and param["Default"].startswith("/aws/service/"):
                param["Default"] = f"/test/{name}"
                ssm.put_parameter(Name=param["Default"], Value=layer, Type="String")
        moto_tags(template["Resources"])  # KMS tags as moto 5.2 reads them
        account = boto3.client("sts", region_name=REGION).get_caller_identity()["Account"]
        s3 = boto3.client("s3", region_name=REGION)
        assets = f"cdk-hnb659fds-assets-{account}-{REGION}"
        s3.create_bucket(Bucket=assets)
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("placeholder.py", "")
        for fn in resources(template, "AWS::Lambda::Function").values():
            s3.put_object(Bucket=assets, Key=fn["Properties"]["Code"]["S3Key"], Body=archive.getvalue())

        cfn = boto3.client("cloudformation", region_name=REGION)
        cfn.create_stack(StackName=LOCAL, TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        stack = cfn.describe_stacks(StackName=LOCAL)["Stacks"][0]
        assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}

        sqs = boto3.client("sqs", region_name=REGION)
        results = sqs.get_queue_attributes(QueueUrl=outputs["ResultsQueueUrl"], AttributeNames=["All"])["Attributes"]
        assert outputs["ResultsQueueUrl"].endswith(f"/{LOCAL}-results.fifo")
        assert results["FifoQueue"] == "true"
        assert json.loads(results["RedrivePolicy"])["maxReceiveCount"] == synth.profiles[LOCAL].queues.max_receive_count
        analysis = sqs.get_queue_attributes(QueueUrl=outputs["AnalysisQueueUrl"], AttributeNames=["All"])["Attributes"]
        assert int(analysis["VisibilityTimeout"]) == synth.profiles[LOCAL].queues.analysis_visibility_s

        ddb = boto3.client("dynamodb", region_name=REGION)
        claims = ddb.describe_table(TableName=outputs["ClaimsTableName"])["Table"]
        assert [g["IndexName"] for g in claims["GlobalSecondaryIndexes"]] == ["by-lease"]
        s3.head_bucket(Bucket=outputs["ArtifactBucketName"])

        # the deployed outputs are all the CLI needs: every config.RESOURCES output is there
        settings = Settings.from_outputs(outputs, "local")
        assert settings.claims_table == outputs["ClaimsTableName"]
        assert settings.results_dlq_url == outputs["ResultsDlqUrl"] and settings.results_dlq_url.endswith(".fifo")


def test_the_runtime_deploys_only_what_moto_can_create(synth: Synth) -> None:
    """`deployable_template` (review up, the integration tests) keeps the queues, tables and bucket,
    and drops what only the functions use, such as the public Powertools layer parameter."""
    from review_local.embedded import DEPLOYABLE, deployable_template

    template = synth.templates[LOCAL]
    assert any(p["Default"].startswith("/aws/service/powertools/") for p in template["Parameters"].values())
    out = deployable_template(template)
    assert {r["Type"] for r in out["Resources"].values()} == DEPLOYABLE
    assert not any(p.get("Default", "").startswith("/aws/service/") for p in out["Parameters"].values())
    assert {"IntakeQueueUrl", "AnalysisDlqUrl", "ResultsQueueUrl", "ArtifactBucketName"} <= set(out["Outputs"])
