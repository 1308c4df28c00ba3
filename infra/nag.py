"""cdk-nag (AwsSolutions pack) and every acknowledged finding, with its reason, in one place."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def apply(app: App) -> None:
    """Run the AwsSolutions pack on the whole app; any unacknowledged finding fails synth."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True, write_suppressions_to_cloud_formation=True))


def _ack(scope: IConstruct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def acknowledge(stack: Stack) -> None:
    pass
