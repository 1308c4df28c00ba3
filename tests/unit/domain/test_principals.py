"""Which principal a job binds to (contract_review/domain/principals.py): the role of an assumed-role session,
the person of an IAM Identity Center session, anything else as given."""

from __future__ import annotations

import pytest

from contract_review.domain.principals import Caller, canonical, owner, uploads_prefix

ACCOUNT = "111122223333"


@pytest.mark.parametrize("arn, bound", [
    # an assumed role (ECS task, CI run, instance profile): the session is stripped
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/Ingest/i-0abc123", f"arn:aws:sts::{ACCOUNT}:assumed-role/Ingest"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/ecsTask/5f0c7e9a1b2c4d", f"arn:aws:sts::{ACCOUNT}:assumed-role/ecsTask"),
    (f"arn:aws-us-gov:sts::{ACCOUNT}:assumed-role/Ci/run-7", f"arn:aws-us-gov:sts::{ACCOUNT}:assumed-role/Ci"),
    # IAM Identity Center: the session name is the person, so it stays
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Reviewer_0123abcd/alice@example.com",
     f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Reviewer_0123abcd/alice@example.com"),
    # an IAM user, the root user, a federated user: as given
    (f"arn:aws:iam::{ACCOUNT}:user/ops/alice", f"arn:aws:iam::{ACCOUNT}:user/ops/alice"),
    (f"arn:aws:iam::{ACCOUNT}:root", f"arn:aws:iam::{ACCOUNT}:root"),
    (f"arn:aws:sts::{ACCOUNT}:federated-user/bob", f"arn:aws:sts::{ACCOUNT}:federated-user/bob"),
])
def test_a_job_binds_to_the_principal_that_survives_a_new_session(arn: str, bound: str):
    assert canonical(arn) == bound
    assert Caller(arn).principal == bound


def test_two_sessions_of_one_role_own_the_same_jobs_and_uploads_and_two_people_of_one_sso_role_do_not():
    first, restarted = (Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/Ingest/{s}") for s in ("task-1", "task-2"))
    assert restarted.owns(first.principal)
    assert uploads_prefix(first.arn) == uploads_prefix(restarted.arn)
    alice, bob = (Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Reviewer_0a/{p}") for p in ("alice", "bob"))
    assert not bob.owns(alice.principal) and owner(alice.arn) != owner(bob.arn)
    other_role = Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/Other/task-1")
    assert not other_role.owns(first.principal)


def test_a_job_bound_to_a_full_session_before_the_rule_stays_readable_by_that_session_only():
    old_binding = f"arn:aws:sts::{ACCOUNT}:assumed-role/Ingest/task-1"
    assert Caller(old_binding).owns(old_binding)
    assert not Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/Ingest/task-2").owns(old_binding)
    assert not Caller(old_binding).owns(None)


def test_an_uploads_prefix_names_no_arn_and_sits_under_uploads_principals():
    prefix = uploads_prefix(f"arn:aws:iam::{ACCOUNT}:user/alice")
    assert prefix.startswith("uploads/principals/") and prefix.endswith("/")
    assert ACCOUNT not in prefix and "alice" not in prefix
