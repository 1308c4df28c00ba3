"""The model is configuration: the prod default (a global inference profile), and `-c model_id=...` with
a plain foundation-model id or a geographic inference profile, each change the functions' MODEL_ID,
the ModelId output and the Bedrock grants (invoke through the profile, and describe the id for the
job-fatal `model.id_rejected` check), read back from the synthesized templates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract_review.config.profile import get_profile
from contract_review.config.settings import ENV
from infra.monitoring import COST_TAG_KEY

from .conftest import (
    FARGATE,
    LOCAL,
    PROD,
    Synth,
    function_by_handler,
    getatt_id,
    policy_statements_for_role,
    resources,
    role_id,
)

DEFAULT = "global.anthropic.claude-sonnet-4-6"
PLAIN = "anthropic.claude-haiku-4-5-20251001-v1:0"
GEO = "us.anthropic.claude-sonnet-4-6"
NEWER = "global.anthropic.claude-sonnet-5-5"
BASE = "anthropic.claude-sonnet-4-6"


@pytest.fixture(scope="module")
def by_context(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Two more prod stacks in one app (one synth), each built from CDK context as `cdk deploy -c
    model_id=...` builds it: a plain foundation-model id and a geographic inference profile."""
    from infra import nag
    from infra.application import add_stack, new_app
    from infra.deploy_settings import DeploySettings

    app = new_app(outdir=str(tmp_path_factory.mktemp("cdk.out.models")))
    contexts = {"ModelPlain": {"model_id": PLAIN}, "ModelGeo": {"model_id": GEO, "model_tpm": "2000000"},
                "FleetFixed": {"worker_concurrency": "7", "daily_spend_cap_usd": "250"},
                "ModelKept": {"model_id": NEWER, "model_fallbacks": DEFAULT}}
    for name, ctx in contexts.items():
        context = {"profile": "prod", "stack_name": name, **ctx}
        add_stack(app, DeploySettings.from_context(context.get))
    nag.apply(app)  # a synth that succeeds has every cdk-nag finding acknowledged
    assembly = app.synth()
    return json.loads(json.dumps({n: assembly.get_stack_by_name(n).template for n in contexts}))


def _text(value: Any) -> str:
    return json.dumps(value)


def _bedrock(statements: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Bedrock statements by action."""
    out: dict[str, list[dict[str, Any]]] = {}
    for st in statements:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        for a in actions:
            if a.startswith("bedrock:"):
                out.setdefault(a, []).append(st)
    return out


def _worker_roles(t: dict[str, Any]) -> list[str]:
    _, worker = function_by_handler(t, "worker.handler")
    roles = [getatt_id(worker["Role"])]
    roles += [getatt_id(td["Properties"]["TaskRoleArn"]) for td in resources(t, "AWS::ECS::TaskDefinition").values()]
    return roles


def _on_the_id(statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The statements on the configured model id (not those on the stack's application profile: infra/inference.py)."""
    return [st for st in statements if "ModelProfile" not in _text(st)]


def _resources(st: dict[str, Any]) -> list[str]:
    res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
    return [_text(r) for r in res]


def _env_and_output(t: dict[str, Any], model_id: str) -> None:
    for h in ("intake", "worker", "aggregator", "sweeper", "collector"):
        _, fn = function_by_handler(t, f"{h}.handler")
        assert fn["Environment"]["Variables"][ENV["model_id"]] == model_id, h
    assert t["Outputs"]["ModelId"]["Value"] == model_id
    assert t["Outputs"]["ModelProvider"]["Value"] == "bedrock"


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_the_default_is_the_global_profile_invoked_through_itself_and_described(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    assert get_profile("prod").review.model_id == DEFAULT
    _env_and_output(t, DEFAULT)
    for role in _worker_roles(t):
        b = _bedrock(_on_the_id(policy_statements_for_role(t, role)))
        assert set(b) == {"bedrock:InvokeModel", "bedrock:GetInferenceProfile", "bedrock:GetFoundationModel"}
        profile_st, model_st = sorted(b["bedrock:InvokeModel"], key=lambda s: "Condition" in s)
        # the profile, in this account and region
        (profile,) = _resources(profile_st)
        assert f":inference-profile/{DEFAULT}" in profile and "AWS::Region" in profile and "AWS::AccountId" in profile
        # the model in this region and the region-less global model ARN, only through this profile
        in_region, global_model = _resources(model_st)
        assert f'"AWS::Region"}}, "::foundation-model/{BASE}"' in in_region
        assert global_model.endswith(f'":bedrock:::foundation-model/{BASE}"]]}}')
        condition = model_st["Condition"]["StringEquals"]["bedrock:InferenceProfileArn"]
        assert _text(condition) == profile
        assert ":bedrock:*:" not in _text(b)  # a global profile needs no region wildcard
        # describe: the one profile and the one model behind it
        (gp,) = b["bedrock:GetInferenceProfile"]
        assert _resources(gp) == [profile]
        (gm,) = b["bedrock:GetFoundationModel"]
        assert _resources(gm) == [in_region]


def test_no_other_function_may_call_bedrock(synth: Synth) -> None:
    t = synth.templates[PROD]
    for h in ("intake", "aggregator", "sweeper", "collector", "api"):
        _, fn = function_by_handler(t, f"{h}.handler")
        b = _bedrock(policy_statements_for_role(t, getatt_id(fn["Role"])))
        if h == "collector":  # batch inference jobs only (tests/infra/test_batch_iam.py): it invokes no model itself,
            # and names the model to read its batch minimum from Service Quotas (wiring.batch_min_records)
            assert set(b) == BATCH_JOB_ACTIONS | {"bedrock:GetFoundationModel", "bedrock:GetInferenceProfile"}, b
        elif h == "sweeper":  # names the model to read its quotas from Service Quotas, and publishes them
            assert set(b) == {"bedrock:GetFoundationModel", "bedrock:GetInferenceProfile"}, b
        else:
            assert not b, h


BATCH_JOB_ACTIONS = {"bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob",
                     "bedrock:StopModelInvocationJob", "bedrock:TagResource"}


def _batch_grants(t: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what the batch service role may invoke, what the collector may create a batch job of besides the jobs)."""
    from .conftest import batch_service_role_id

    invoke = [r for st in _bedrock(policy_statements_for_role(t, batch_service_role_id(t))).get(
        "bedrock:InvokeModel", []) for r in _resources(st)]
    assert all("Condition" not in st for st in _bedrock(policy_statements_for_role(t, batch_service_role_id(t))).get(
        "bedrock:InvokeModel", []))  # Bedrock's batch page names no condition key for it
    _, collector = function_by_handler(t, "collector.handler")
    (create,) = _bedrock(policy_statements_for_role(t, getatt_id(collector["Role"])))["bedrock:CreateModelInvocationJob"]
    return invoke, [r for r in _resources(create) if ":model-invocation-job/*" not in r]


def test_batch_jobs_run_the_stacks_model_through_its_profile(synth: Synth, by_context: dict[str, Any]) -> None:
    """The service role invokes nothing for a plain model id (Bedrock's batch page asks for S3 only) and, with an
    inference profile, the profile and its model where it routes (global: this region and the region-less ARN;
    geographic: any region); the collector may create jobs of that model or profile only."""
    invoke, create = _batch_grants(synth.templates[PROD])  # global
    assert len(invoke) == 3 and f":inference-profile/{DEFAULT}" in invoke[0]
    assert f'"AWS::Region"}}, "::foundation-model/{BASE}"' in invoke[1]
    assert invoke[2].endswith(f'":bedrock:::foundation-model/{BASE}"]]}}')
    assert create == [invoke[0], invoke[1]]
    invoke, create = _batch_grants(by_context["ModelGeo"])
    assert len(invoke) == 2 and f":inference-profile/{GEO}" in invoke[0]
    assert invoke[1].endswith(f'":bedrock:*::foundation-model/{BASE}"]]}}')
    assert len(create) == 2 and create[0] == invoke[0] and f'"::foundation-model/{BASE}"' in create[1]
    invoke, create = _batch_grants(by_context["ModelPlain"])
    assert invoke == [] and len(create) == 1 and f'"::foundation-model/{PLAIN}"' in create[0]
    # the geographic wildcard is acknowledged on the service role too, with its own reason
    acks = [rule for r in by_context["ModelGeo"]["Resources"].values()
            for rule in r.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])]
    assert any(a["id"].endswith(f"bedrock:*::foundation-model/{BASE}]") and "aws:SourceArn" in a["reason"]
               for a in acks)


def test_context_model_id_with_a_plain_model_id(by_context: dict[str, dict[str, Any]]) -> None:
    t = by_context["ModelPlain"]
    _env_and_output(t, PLAIN)
    (role,) = _worker_roles(t)
    b = _bedrock(_on_the_id(policy_statements_for_role(t, role)))
    assert set(b) == {"bedrock:InvokeModel", "bedrock:GetFoundationModel"}  # no profile to describe
    (invoke,) = b["bedrock:InvokeModel"]
    (describe,) = b["bedrock:GetFoundationModel"]
    (arn,) = _resources(invoke)
    assert f'"AWS::Region"}}, "::foundation-model/{PLAIN}"' in arn and "Condition" not in invoke
    assert _resources(describe) == [arn]
    assert DEFAULT not in _text(t) and BASE not in _text(b)


def test_a_redeploy_with_another_model_keeps_the_fallbacks_granted_for_the_jobs_in_flight(
        by_context: dict[str, dict[str, Any]]) -> None:
    """`-c model_id=NEW -c model_fallbacks=OLD`: jobs keep the model they were submitted on, so the workers are granted
    the old model too (invoke through its profile, describe) and told which models they may call."""
    t = by_context["ModelKept"]
    _env_and_output(t, NEWER)
    (role,) = _worker_roles(t)
    b = _bedrock(_on_the_id(policy_statements_for_role(t, role)))
    invoked = " ".join(r for st in b["bedrock:InvokeModel"] for r in _resources(st))
    assert f":inference-profile/{NEWER}" in invoked and f":inference-profile/{DEFAULT}" in invoked
    described = " ".join(r for st in b["bedrock:GetInferenceProfile"] for r in _resources(st))
    assert NEWER in described and DEFAULT in described
    _, worker = function_by_handler(t, "worker.handler")
    assert worker["Environment"]["Variables"][ENV["model_fallbacks"]] == DEFAULT
    # the other roles are granted no model they do not call
    _, intake = function_by_handler(t, "intake.handler")
    assert DEFAULT not in _text(policy_statements_for_role(t, getatt_id(intake["Role"])))


def test_context_model_id_with_a_geographic_profile(by_context: dict[str, dict[str, Any]]) -> None:
    t = by_context["ModelGeo"]
    _env_and_output(t, GEO)
    (role,) = _worker_roles(t)
    b = _bedrock(_on_the_id(policy_statements_for_role(t, role)))
    profile_st, model_st = sorted(b["bedrock:InvokeModel"], key=lambda s: "Condition" in s)
    (profile,) = _resources(profile_st)
    assert f":inference-profile/{GEO}" in profile
    # the destinations vary by source region: the model in any region, but only through this profile
    (any_region,) = _resources(model_st)
    assert any_region.endswith(f'":bedrock:*::foundation-model/{BASE}"]]}}')
    assert _text(model_st["Condition"]["StringEquals"]["bedrock:InferenceProfileArn"]) == profile
    assert [_resources(s) for s in b["bedrock:GetInferenceProfile"]] == [[profile]]
    # the region wildcard is acknowledged on the worker role, with its reason (synth would fail otherwise)
    acks = [rule for r in t["Resources"].values()
            for rule in r.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])]
    assert any(a["id"].endswith(f"bedrock:*::foundation-model/{BASE}]") and "InferenceProfileArn" in a["reason"]
               for a in acks)


def test_context_model_id_is_validated_and_defaults_to_the_profile() -> None:
    from infra.deploy_settings import DeploySettings

    assert DeploySettings.from_context({"profile": "prod"}.get).model_id == DEFAULT
    assert DeploySettings.from_context({"profile": "prod", "model_id": f" {GEO} "}.get).model_id == GEO
    for bad in ("arn:aws:bedrock:us-east-1::foundation-model/x", "claude", "global.anthropic claude"):
        with pytest.raises(ValueError, match="model_id"):
            DeploySettings.from_context({"profile": "prod", "model_id": bad}.get)


@pytest.mark.parametrize("context", [{"model_id": "amazon.nova-pro-v1:0"},
                                     {"model_id": "global.anthropic.claude-sonnet-9"},
                                     {"model_fallbacks": f"{NEWER},amazon.nova-pro-v1:0"}], ids=["plain", "profile", "fallback"])
def test_a_model_id_with_no_catalogue_row_is_refused_at_synth(context: dict[str, str]) -> None:
    """Its API, request rules, burndown and price are unknown: a prod synth refuses it in one line."""
    from infra.deploy_settings import DeploySettings

    with pytest.raises(ValueError, match="no row in the model catalogue"):
        DeploySettings.from_context({"profile": "prod", **context}.get)


def test_a_fallback_is_another_model_each_once() -> None:
    from infra.deploy_settings import DeploySettings

    for fallbacks in (DEFAULT, f"{NEWER},{NEWER}"):
        with pytest.raises(ValueError, match="each model once"):
            DeploySettings.from_context({"profile": "prod", "model_fallbacks": fallbacks}.get)
    kept = DeploySettings.from_context({"profile": "prod", "model_fallbacks": f" {NEWER} , "}.get)
    assert kept.model_fallbacks == (NEWER,)


def test_pacing_is_on_in_every_deploy_the_quota_from_context_or_as_the_sweeper_publishes_it(
        synth: Synth, by_context: dict[str, Any]) -> None:
    """With no `-c model_tpm` the workers pace to their model's quota as the sweeper publishes it from Service Quotas
    (not every worker at cold start): the sweeper's role may read Service Quotas and the model's name, and
    no worker role may; with `-c model_tpm`, the value reaches the workers' environment."""
    quotas = {"servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas"}

    def star_actions(t: dict[str, Any], role: str) -> set[str]:
        return {a for st in policy_statements_for_role(t, role) if st["Resource"] == "*"
                for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    for t in (synth.templates[PROD], synth.templates[FARGATE], by_context["ModelPlain"], by_context["ModelGeo"]):
        for role in _worker_roles(t):
            assert not quotas & star_actions(t, role), role
        sweeper = role_id(t, "sweeper")
        assert quotas <= star_actions(t, sweeper)
        assert "bedrock:GetFoundationModel" in {a for st in policy_statements_for_role(t, sweeper)
                                                for a in ([st["Action"]] if isinstance(st["Action"], str)
                                                          else st["Action"])}
    _, worker = function_by_handler(synth.templates[PROD], "worker.handler")
    assert ENV["model_tpm"] not in worker["Environment"]["Variables"]  # as the sweeper publishes it
    _, geo = function_by_handler(by_context["ModelGeo"], "worker.handler")
    assert geo["Environment"]["Variables"][ENV["model_tpm"]] == "2000000"
    assert by_context["ModelGeo"]["Outputs"]["ModelTpm"]["Value"] == "2000000"  # review preflight reads it
    assert "ModelTpm" not in synth.templates[PROD]["Outputs"]


def _esm_concurrency(t: dict[str, Any]) -> int:
    (esm,) = [r["Properties"] for r in resources(t, "AWS::Lambda::EventSourceMapping").values()
              if "ScalingConfig" in r["Properties"] and "Intake" not in json.dumps(r["Properties"]["EventSourceArn"])]
    return int(esm["ScalingConfig"]["MaximumConcurrency"])


def test_the_fleet_is_sized_to_the_quota_given_at_deploy_and_the_workers_profile_matches(
        synth: Synth, by_context: dict[str, Any]) -> None:
    """`-c model_tpm` sizes the worker fleet (config/fleet.py) and the fan-out window (twice it); the functions get
    the same numbers (PROFILE_OVERRIDES), so their pacers share the quota among that many workers. `-c
    worker_concurrency` sets it outright; with neither, the profile's 20 stand."""
    from contract_review.config.fleet import fleet_for_quota

    sized = fleet_for_quota(2_000_000).workers
    assert _esm_concurrency(by_context["ModelGeo"]) == sized and sized != 20
    _, worker = function_by_handler(by_context["ModelGeo"], "worker.handler")
    overrides = json.loads(worker["Environment"]["Variables"]["PROFILE_OVERRIDES"])
    assert overrides == {"worker_max_concurrency": sized, "fanout_window": 2 * sized,
                         "fanout_page": min(10, 2 * sized)}
    assert _esm_concurrency(by_context["FleetFixed"]) == 7
    assert _esm_concurrency(synth.templates[PROD]) == 20
    _, prod_worker = function_by_handler(synth.templates[PROD], "worker.handler")
    assert "PROFILE_OVERRIDES" not in prod_worker["Environment"]["Variables"]


# ---------------------------------------------------------------- the application inference profile, the spend alarms
def _app_profile(t: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((lid, profile),) = resources(t, "AWS::Bedrock::ApplicationInferenceProfile").items()
    return lid, profile["Properties"]


@pytest.mark.parametrize("name", [PROD, FARGATE])
def test_the_workers_call_the_model_through_an_application_profile_tagged_for_cost(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    lid, profile = _app_profile(t)
    arn = {"Fn::GetAtt": [lid, "InferenceProfileArn"]}
    # a copy of the configured system profile, carrying the stack's cost-allocation tag (what the budget filters on)
    assert {"Key": COST_TAG_KEY, "Value": name} in profile["Tags"]
    assert f":inference-profile/{DEFAULT}" in _text(profile["ModelSource"]["CopyFrom"])
    assert _text(profile["InferenceProfileName"]).count("AWS::Region") == 1  # account-wide names: the region in it
    # the worker sends its ARN (the configured id stays in MODEL_ID, the key for prices and quotas)
    if name == PROD:
        _, worker = function_by_handler(t, "worker.handler")
        assert worker["Environment"]["Variables"][ENV["invoke_model_id"]] == arn
    else:
        (task,) = resources(t, "AWS::ECS::TaskDefinition").values()
        env = {e["Name"]: e["Value"] for c in task["Properties"]["ContainerDefinitions"] for e in c.get("Environment", [])}
        assert env[ENV["invoke_model_id"]] == arn
    for h in ("intake", "aggregator", "sweeper", "collector", "api"):
        _, fn = function_by_handler(t, f"{h}.handler")
        assert ENV["invoke_model_id"] not in fn["Environment"]["Variables"], h
    # and may invoke through it: the profile itself, and the model behind it only through one of the two profiles
    for role in _worker_roles(t):
        via = [st for st in policy_statements_for_role(t, role) if lid in _text(st)]
        direct, behind = sorted(via, key=lambda st: "Condition" in st)
        assert direct["Action"] == "bedrock:InvokeModel" and direct["Resource"] == arn and "Condition" not in direct
        through = behind["Condition"]["StringEquals"]["bedrock:InferenceProfileArn"]
        assert through[0] == arn and f":inference-profile/{DEFAULT}" in _text(through[1])
        assert any(f"::foundation-model/{BASE}" in r for r in _resources(behind))
    assert t["Outputs"]["ModelProfileArn"]["Value"] == arn


def test_a_plain_model_id_is_copied_from_its_foundation_model_and_the_local_stack_has_none(
        synth: Synth, by_context: dict[str, dict[str, Any]]) -> None:
    _, profile = _app_profile(by_context["ModelPlain"])
    assert f'"AWS::Region"}}, "::foundation-model/{PLAIN}"' in _text(profile["ModelSource"]["CopyFrom"])
    assert not resources(synth.templates[LOCAL], "AWS::Bedrock::ApplicationInferenceProfile")  # the offline model


def _alarm(t: dict[str, Any], suffix: str) -> dict[str, Any] | None:
    found = [r["Properties"] for r in resources(t, "AWS::CloudWatch::Alarm").values()
             if str(r["Properties"].get("AlarmName", "")).endswith(f"-{suffix}")]
    return found[0] if found else None


def test_bedrocks_own_token_count_of_the_profile_is_alarmed_against_the_cap_and_the_quota(
        synth: Synth, by_context: dict[str, dict[str, Any]]) -> None:
    t = synth.templates[PROD]
    lid, _ = _app_profile(t)
    rate = _alarm(t, "token-spend-rate")
    assert rate is not None and rate["Threshold"] == 1000.0 / 8  # an hour that would spend the $1,000 cap in 8 hours
    metrics = {m["Id"]: m for m in rate["Metrics"]}
    for name, id_ in (("InputTokenCount", "tokens_in"), ("OutputTokenCount", "tokens_out"),
                      ("CacheReadInputTokenCount", "cache_read"), ("CacheWriteInputTokenCount", "cache_write")):
        stat = metrics[id_]["MetricStat"]
        assert stat["Metric"]["Namespace"] == "AWS/Bedrock" and stat["Metric"]["MetricName"] == name
        assert stat["Metric"]["Dimensions"] == [{"Name": "ModelId", "Value": {"Fn::GetAtt": [lid, "InferenceProfileArn"]}}]
        assert stat["Period"] == 3600 and stat["Stat"] == "Sum"
    # priced at the model's prices per token ($3 and $15 per million; cache reads $0.30, writes $3.75)
    assert metrics["expr_1"]["Expression"] == ("0.000003 * FILL(tokens_in, 0) + 0.000015 * FILL(tokens_out, 0) + "
                                               "0.0000003 * FILL(cache_read, 0) + 0.00000375 * FILL(cache_write, 0)")
    assert _alarm(t, "tokens-near-quota") is None  # the quota is read at runtime: not known at synth
    # with -c model_tpm: 80 % of the hour's quota, output tokens at the model's burndown
    quota = _alarm(by_context["ModelGeo"], "tokens-near-quota")
    assert quota is not None and quota["Threshold"] == 0.8 * 2_000_000 * 60
    assert {m["Id"]: m for m in quota["Metrics"]}["expr_1"]["Expression"] == \
        "1 * FILL(tokens_in, 0) + 5 * FILL(tokens_out, 0)"


def test_the_daily_spend_cap_reaches_every_function_that_admits_work_and_its_alarms(
        synth: Synth, by_context: dict[str, dict[str, Any]]) -> None:
    # the prod default, in every function's profile; -c daily_spend_cap_usd=250 in every function's overrides
    assert get_profile("prod").limits.daily_spend_cap_usd == 1000.0
    t = by_context["FleetFixed"]
    for h in ("intake", "worker", "aggregator", "sweeper", "collector", "api"):
        _, fn = function_by_handler(t, f"{h}.handler")
        assert json.loads(fn["Environment"]["Variables"]["PROFILE_OVERRIDES"])["daily_spend_cap_usd"] == 250.0, h
    assert json.loads(t["Outputs"]["ProfileOverrides"]["Value"])["daily_spend_cap_usd"] == 250.0  # the CLI's too
    held, near = _alarm(t, "spend-cap"), _alarm(t, "spend-near-cap")
    assert held is not None and held["MetricName"] == "SpendCapHeld" and held["Threshold"] == 1
    assert near is not None and near["MetricName"] == "DailySpendUsd" and near["Threshold"] == 200.0
    assert _alarm(t, "token-spend-rate")["Threshold"] == 250.0 / 8  # type: ignore[index]
