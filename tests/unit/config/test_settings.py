"""The one config object: profile rules, the resource table, Settings from the environment and from
stack outputs, the analysis config hash."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.config.profile import FLAT_FIELDS, PROFILES, Profile, get_profile
from contract_review.config.settings import ENV, OPTION_ENV, RESOURCES, Settings
from contract_review.doubles.spec import FaultSpec
from contract_review.review.analysts import job_config_hash

# AWS: an SQS queue feeding a Lambda needs visibility timeout >= 6 x the function timeout.
AWS_FACTOR = 6

# (function timeout field, visibility field of the queue that feeds it)
QUEUE_PAIRS = [
    ("worker_timeout_s", "analysis_visibility_s"),
    ("intake_timeout_s", "intake_visibility_s"),
    ("aggregator_timeout_s", "results_visibility_s"),
]


def full_env(**overrides: str) -> dict[str, str]:
    env = {
        "REVIEW_PROFILE": "prod",
        "JOBS_TABLE": "jobs",
        "CLAIMS_TABLE": "claims",
        "CHECKPOINTS_TABLE": "checkpoints",
        "EVENTS_TABLE": "events",
        "ARTIFACT_BUCKET": "artifacts-123",
        "INTAKE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/intake",
        "ANALYSIS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/analysis",
        "RESULTS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/results.fifo",
        "INTAKE_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/intake-dlq",
        "ANALYSIS_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/analysis-dlq",
        "RESULTS_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/results-dlq.fifo",
        "MODEL_PROVIDER": "bedrock",
        "MODEL_ID": "anthropic.claude-3-haiku-20240307-v1:0",
        "WORKER_KIND": "fargate",
    }
    env.update(overrides)
    return env


REQUIRED_VARS = ["REVIEW_PROFILE", "JOBS_TABLE", "CLAIMS_TABLE", "CHECKPOINTS_TABLE", "EVENTS_TABLE",
                 "ARTIFACT_BUCKET", "INTAKE_QUEUE_URL", "ANALYSIS_QUEUE_URL", "RESULTS_QUEUE_URL"]


def full_outputs(**overrides: str) -> dict[str, str]:
    """A stack's outputs as the CLI sees them: the resource outputs plus ones `Settings` ignores."""
    outputs = {
        "JobsTableName": "jobs",
        "ClaimsTableName": "claims",
        "CheckpointsTableName": "checkpoints",
        "EventsTableName": "events",
        "ArtifactBucketName": "artifacts-123",
        "IntakeQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/intake",
        "AnalysisQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/analysis",
        "ResultsQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/results.fifo",
        "IntakeDlqUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/intake-dlq",
        "AnalysisDlqUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/analysis-dlq",
        "ResultsDlqUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/results-dlq.fifo",
        "IdempotencyTableName": "idempotency",
        "JobEventsTopicArn": "arn:aws:sns:us-east-1:123456789012:job-events",
        "CompensationDlqUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/compensation-dlq",
        "ControlTableName": "control",
        "TokenLedgerTableName": "token-ledger",
        "IntakeQueueArn": "arn:aws:sqs:us-east-1:123456789012:intake",
        "ProfileName": "prod",
        "WorkerKind": "lambda",
    }
    outputs.update(overrides)
    return outputs


# --- profiles ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize(("timeout_field", "visibility_field"), QUEUE_PAIRS)
def test_every_profile_keeps_visibility_at_least_six_times_the_timeout(name, timeout_field, visibility_field):
    profile = PROFILES[name]
    flat = profile.flat()
    assert flat[visibility_field] >= AWS_FACTOR * flat[timeout_field]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_is_internally_consistent(name):
    p = PROFILES[name]
    assert p.name == name and get_profile(name) is p
    assert p.queues.max_receive_count >= 5  # AWS advice; throttling never burns receives
    assert p.recovery.claim_lease_s < p.queues.analysis_visibility_s  # a lapsed lease is seen before the message reappears
    assert p.tier1.model_retry.max_attempts >= 1 and p.tier1.tool_retry.max_attempts >= 1
    assert p.tier1.model_retry.base_s <= p.tier1.model_retry.cap_s and p.tier1.tool_retry.base_s <= p.tier1.tool_retry.cap_s
    # tier-1 sleeping for one chunk attempt must end before the message becomes visible again
    assert p.tier1.chunk_retry_budget_s < p.queues.analysis_visibility_s


@pytest.mark.parametrize(("timeout_field", "visibility_field"), QUEUE_PAIRS)
def test_a_profile_violating_the_visibility_rule_is_rejected(timeout_field, visibility_field):
    base = PROFILES["prod"].flat()
    timeout = base[timeout_field]
    # GIVEN a visibility one second short of 6 x timeout WHEN the profile is built THEN it fails
    with pytest.raises(ValidationError, match="visibility"):
        Profile(**{**base, visibility_field: AWS_FACTOR * timeout - 1})
    # AND exactly 6 x timeout is accepted
    ok = Profile(**{**base, visibility_field: AWS_FACTOR * timeout})
    assert ok.flat()[visibility_field] == AWS_FACTOR * timeout


def test_raising_the_worker_timeout_without_the_visibility_is_rejected():
    base = PROFILES["prod"].flat()
    with pytest.raises(ValidationError):
        Profile(**{**base, "worker_timeout_s": base["analysis_visibility_s"] // AWS_FACTOR + 1})


def test_a_lease_as_long_as_the_visibility_is_rejected():
    base = PROFILES["local"].flat()
    with pytest.raises(ValidationError, match="lease"):
        Profile(**{**base, "claim_lease_s": float(base["analysis_visibility_s"])})


def test_a_sweeper_reserve_that_leaves_the_sweep_no_time_is_rejected():
    base = PROFILES["prod"].flat()
    with pytest.raises(ValidationError, match="sweeper_reserve_s"):
        Profile(**{**base, "sweeper_reserve_s": base["sweeper_timeout_s"]})
    assert Profile(**{**base, "sweeper_reserve_s": base["sweeper_timeout_s"] - 1}).functions.sweeper_reserve_s > 0


def test_max_receive_count_below_one_is_rejected():
    with pytest.raises(ValidationError):
        Profile(**{**PROFILES["local"].model_dump(), "max_receive_count": 0})


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ValueError, match="local.*prod"):
        get_profile("staging")


# --- RESOURCES and ENV ------------------------------------------------------------------------------------

def test_resources_name_each_resource_once_in_every_namespace():
    for attr in ("field", "env", "output"):
        names = [getattr(r, attr) for r in RESOURCES]
        assert len(names) == len(set(names)), attr
    assert all(r.description for r in RESOURCES)
    # no resource variable collides with an option variable
    assert not {r.env for r in RESOURCES} & set(OPTION_ENV.values())
    assert not {r.field for r in RESOURCES} & set(OPTION_ENV)


def test_resources_and_options_are_exactly_the_settings_fields():
    fields = Settings.model_fields
    assert {r.field for r in RESOURCES} | set(OPTION_ENV) == set(fields)
    for r in RESOURCES:
        # a required resource has no default; an optional one defaults to "" (not deployed / not known)
        assert fields[r.field].is_required() is r.required, r.field
        if not r.required:
            assert fields[r.field].default == "", r.field


def test_env_is_the_options_plus_every_resource_variable():
    assert ENV == {**OPTION_ENV, **{r.field: r.env for r in RESOURCES}}
    assert set(REQUIRED_VARS) == {OPTION_ENV["profile"]} | {r.env for r in RESOURCES if r.required}
    # the side effects' idempotency table (saga.py): optional, like the DLQs (a function without it runs no saga)
    idem = next(r for r in RESOURCES if r.field == "idempotency_table")
    assert (idem.env, idem.required, Settings.model_fields["idempotency_table"].default) == ("IDEMPOTENCY_TABLE",
                                                                                           False, "")


# --- Settings.from_env ------------------------------------------------------------------------------------

def settings_to_env(s: Settings) -> dict[str, str]:
    """What infra/ puts on a function, rebuilt from a Settings (the inverse of from_env)."""
    env: dict[str, str] = {}
    for key, var in ENV.items():
        value = getattr(s, key)
        if key == "profile":
            env[var] = value.name
        elif value and not (key == "queue_uploads_prefix" and value == "uploads/"):  # infra/ leaves that default out
            env[var] = str(value)
    return env


def test_from_env_reads_every_variable():
    env = full_env()
    s = Settings.from_env(env)
    assert s.profile is PROFILES["prod"]
    assert (s.jobs_table, s.claims_table, s.checkpoints_table, s.events_table) == (
        "jobs", "claims", "checkpoints", "events")
    assert s.bucket == "artifacts-123"
    assert s.results_queue_url.endswith("results.fifo") and s.results_dlq_url.endswith("results-dlq.fifo")
    assert s.model_provider == "bedrock" and s.worker_kind == "fargate"
    assert s.effective_model_id == "anthropic.claude-3-haiku-20240307-v1:0"
    assert s.fault_spec is None


def test_from_env_round_trips():
    spec = FaultSpec(seed=3, transient_rate=0.2, always_fail_chunk="2", switch_file="/tmp/faults")
    env = full_env(REVIEW_PROFILE="local", FAULT_SPEC=spec.to_env(), MODEL_PROVIDER="offline", WORKER_KIND="lambda")
    s = Settings.from_env(env)
    assert s.fault_spec is not None and FaultSpec.model_validate_json(s.fault_spec) == spec
    # WHEN rendered back to an environment and read again THEN nothing is lost or changed
    again = Settings.from_env(settings_to_env(s))
    assert again == s
    assert settings_to_env(again) == env


def test_from_env_applies_defaults_for_optional_variables():
    env = {k: v for k, v in full_env().items() if k in REQUIRED_VARS}
    s = Settings.from_env(env)
    assert s.model_provider == "offline" and s.worker_kind == "lambda" and s.fault_spec is None
    # the offline provider pins the rule model's id on jobs, never a Bedrock id it does not call
    assert s.model_id == "" and s.effective_model_id == OFFLINE_MODEL_ID
    bedrock = s.model_copy(update={"model_provider": "bedrock"})
    assert bedrock.effective_model_id == PROFILES["prod"].review.model_id
    assert s.analysis_dlq_url == ""


@pytest.mark.parametrize("missing", REQUIRED_VARS)
def test_from_env_reports_a_missing_variable_by_name(missing):
    env = full_env()
    del env[missing]
    with pytest.raises(ValueError, match=missing):
        Settings.from_env(env)


def test_from_env_reports_all_missing_and_treats_empty_as_missing():
    env = full_env(JOBS_TABLE="")
    del env["ARTIFACT_BUCKET"]
    with pytest.raises(ValueError) as info:
        Settings.from_env(env)
    assert "JOBS_TABLE" in str(info.value) and "ARTIFACT_BUCKET" in str(info.value)
    assert "CLAIMS_TABLE" not in str(info.value)


def test_from_env_reads_only_the_mapping_given(monkeypatch):
    monkeypatch.setenv("JOBS_TABLE", "from-os-environ")
    monkeypatch.setenv("REVIEW_PROFILE", "local")
    assert Settings.from_env(full_env()).jobs_table == "jobs"
    with pytest.raises(ValueError):
        Settings.from_env({})


@pytest.mark.parametrize(("var", "value"), [("MODEL_PROVIDER", "openai"), ("WORKER_KIND", "ec2"),
                                            ("REVIEW_PROFILE", "staging")])
def test_from_env_rejects_bad_values(var, value):
    with pytest.raises(ValueError):
        Settings.from_env(full_env(**{var: value}))


def test_claim_lease_depends_on_worker_kind():
    lam = Settings.from_env(full_env(WORKER_KIND="lambda"))
    far = Settings.from_env(full_env(WORKER_KIND="fargate"))
    assert lam.claim_lease_s == PROFILES["prod"].recovery.claim_lease_s
    assert far.claim_lease_s == PROFILES["prod"].fargate.fargate_claim_lease_s


# --- Settings.from_outputs ---------------------------------------------------------------------------------

def test_from_outputs_reads_every_resource_output_and_ignores_the_others():
    s = Settings.from_outputs(full_outputs(), "local")
    assert s.profile is PROFILES["local"]
    for r in RESOURCES:
        assert getattr(s, r.field) == full_outputs()[r.output], r.field
    # the options are not stack outputs: defaults apply
    assert s.model_provider == "offline" and s.worker_kind == "lambda" and s.fault_spec is None and s.model_id == ""


def test_from_outputs_agrees_with_from_env():
    env = {r.env: full_outputs()[r.output] for r in RESOURCES} | {"REVIEW_PROFILE": "prod"}
    assert Settings.from_outputs(full_outputs(), "prod") == Settings.from_env(env)


@pytest.mark.parametrize("missing", [r.output for r in RESOURCES if r.required])
def test_from_outputs_names_a_missing_required_output(missing):
    outputs = full_outputs()
    del outputs[missing]
    with pytest.raises(ValueError, match=missing) as info:
        Settings.from_outputs(outputs, "prod")
    assert "missing" in str(info.value)
    others = [r.output for r in RESOURCES if r.output != missing]
    assert not [o for o in others if o in str(info.value)], "only the missing output is named"


@pytest.mark.parametrize("missing", [r for r in RESOURCES if not r.required], ids=lambda r: r.output)
def test_a_stack_from_before_an_optional_resource_still_serves_the_cli_without_it(missing):
    # GIVEN the outputs of a stack deployed before an optional resource existed (e.g. the token ledger)
    outputs = {k: v for k, v in full_outputs().items() if k != missing.output}
    # THEN the CLI's settings are built, without that resource (its feature off), the others intact
    s = Settings.from_outputs(outputs, "prod")
    assert getattr(s, missing.field) == ""
    assert s.jobs_table == full_outputs()["JobsTableName"]


def test_from_outputs_names_every_missing_output():
    outputs = {k: v for k, v in full_outputs().items() if k not in ("JobsTableName", "AnalysisQueueUrl")}
    with pytest.raises(ValueError) as info:
        Settings.from_outputs(outputs, "prod")
    assert "JobsTableName" in str(info.value) and "AnalysisQueueUrl" in str(info.value)
    assert "ClaimsTableName" not in str(info.value)
    with pytest.raises(ValueError, match="JobsTableName"):
        Settings.from_outputs({}, "prod")


def test_the_queue_uploads_prefix_comes_from_the_stack_output_and_defaults_to_uploads():
    assert Settings.from_outputs(full_outputs(), "prod").queue_uploads_prefix == "uploads/"
    restricted = Settings.from_outputs({**full_outputs(), "QueueUploadsPrefix": "uploads/queue/"}, "prod")
    assert restricted.queue_uploads_prefix == "uploads/queue/"


def test_from_outputs_rejects_an_unknown_profile():
    with pytest.raises(ValueError, match="staging"):
        Settings.from_outputs(full_outputs(), "staging")


# --- the job's analysis identity (review/analysts.py job_config_hash) -----------------------------------------

def test_job_config_hash_is_stable_and_changes_with_the_model_and_provider_not_the_prompt_label():
    base = Settings.from_env(full_env())
    h = job_config_hash(base)
    assert len(h) == 16 and h == job_config_hash(Settings.from_env(full_env()))
    # the model id changes outputs
    assert job_config_hash(Settings.from_env(full_env(MODEL_ID="anthropic.claude-3-opus"))) != h
    # the provider changes outputs
    assert job_config_hash(Settings.from_env(full_env(MODEL_PROVIDER="offline"))) != h
    # the prompt version is a label: the prompts themselves are in the identity (tests/unit/review/test_analysis_identity.py)
    relabelled = base.model_copy(update={"profile": base.profile.with_overrides(**{"prompt_version": "2027-01-01"})})
    assert job_config_hash(relabelled) == h


def test_job_config_hash_ignores_resource_names():
    a = job_config_hash(Settings.from_env(full_env()))
    b = job_config_hash(Settings.from_env(full_env(JOBS_TABLE="other-jobs", ARTIFACT_BUCKET="elsewhere",
                                                   WORKER_KIND="lambda")))
    assert a == b


def test_job_config_hash_uses_the_profile_model_when_no_override():
    no_override = {k: v for k, v in full_env().items() if k != "MODEL_ID"}
    explicit = full_env(MODEL_ID=PROFILES["prod"].review.model_id)
    assert job_config_hash(Settings.from_env(no_override)) == job_config_hash(Settings.from_env(explicit))


def test_a_bad_fault_spec_stops_the_model_being_built():
    """FAULT_SPEC belongs to the doubles (doubles/spec.py): wiring parses it when it builds the model, before
    any call, and a misspelt field is refused there."""
    from contract_review.wiring import build_model

    s = Settings.from_env(full_env(REVIEW_PROFILE="local", MODEL_PROVIDER="offline", FAULT_SPEC='{"sed": 1}'))
    with pytest.raises(ValidationError):
        build_model(s, session=None)


def test_fault_spec_env_round_trip_and_rejects_unknown_fields():
    spec = FaultSpec(seed=9, permanent_code="AccessDeniedException", throttle_quota_per_s=2.0,
                     throttle_state_dir="/tmp/q")
    assert FaultSpec.model_validate_json(spec.to_env()) == spec
    assert FaultSpec().to_env() == "{}"
    with pytest.raises(ValidationError):
        FaultSpec.model_validate_json('{"transient_rat": 0.5}')


def test_profile_overrides_change_named_fields_of_one_local_run_and_are_validated():
    env = full_env(REVIEW_PROFILE="local", PROFILE_OVERRIDES='{"analyst_concurrency": 1, "fanout_window": 20}')
    s = Settings.from_env(env)
    assert (s.profile.review.analyst_concurrency, s.profile.fanout.fanout_window) == (1, 20)
    assert s.profile.with_overrides(**{"analyst_concurrency": 11, "fanout_window": 8}) == PROFILES["local"]
    with pytest.raises(ValidationError):
        Settings.from_env(full_env(REVIEW_PROFILE="local", PROFILE_OVERRIDES='{"fanout_page": 99}'))


def test_the_profile_is_grouped_and_flat_names_keep_working():
    """GIVEN the grouped profile WHEN built or overridden with flat field names (PROFILE_OVERRIDES, from_flat,
    with_overrides) THEN each lands in its group, the validator still checks across groups, and a misspelt name
    is refused rather than ignored."""
    local = PROFILES["local"]
    assert local.recovery.claim_lease_s == local.flat()["claim_lease_s"] == 3.0
    assert set(FLAT_FIELDS.values()) == {"functions", "queues", "alarms", "recovery", "tier1", "review", "fanout",
                                         "quota", "side_effects", "limits", "fargate",
                                         "batch"}
    changed = local.with_overrides(claim_lease_s=2.0, fanout_window=20, poller_wait_s=1)
    assert (changed.recovery.claim_lease_s, changed.fanout.fanout_window, changed.fargate.poller_wait_s) == (2.0, 20, 1)
    assert Profile.from_flat(**local.flat()) == local
    env = full_env(REVIEW_PROFILE="local", PROFILE_OVERRIDES='{"max_receive_count": 7, "breaker_open_s": 9}')
    s = Settings.from_env(env)
    assert (s.profile.queues.max_receive_count, s.profile.quota.breaker_open_s) == (7, 9.0)
    with pytest.raises(ValidationError):  # the cross-group rule: the lease must be shorter than the visibility
        local.with_overrides(claim_lease_s=float(local.queues.analysis_visibility_s))
    with pytest.raises(ValidationError):
        local.with_overrides(claim_lease_sec=2.0)
