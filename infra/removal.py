"""What a deleted stack, and a failed first create, leave behind.

A kept (non-disposable) stack retains its data on delete. On a failed create, CloudFormation keeps `Retain`
resources too, and a retry of the deploy would then meet them: a fixed name fails on "already exists", and every
attempt leaves tables, buckets, log groups and a key behind. So a resource without deletion protection is kept
with `RETAIN_ON_UPDATE_OR_DELETE` (CloudFormation `RetainExceptOnCreate`): deleted when its own create is rolled
back, kept when the stack is deleted or the resource replaced. The deletion-protected tables keep `RETAIN`: a
rollback cannot delete them (deletion protection refuses it, and the rollback would fail); docs/first-deploy.md
gives the command that removes them after a failed create.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy


def removal_policy(retain: bool, *, deletion_protected: bool = False) -> RemovalPolicy:
    """The removal policy of a resource of a stack that keeps its data (`retain`) or not."""
    if not retain:
        return RemovalPolicy.DESTROY
    return RemovalPolicy.RETAIN if deletion_protected else RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE
