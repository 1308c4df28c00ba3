"""The stack's application inference profile: the model calls the workers make, tagged as this stack's.

On-demand calls through a system-defined inference profile (`global.`, `us.`, `eu.`) or a foundation model carry no
resource tag, so neither Cost Explorer nor the stack's budget (monitoring.CostBudget, filtered on `review-stack`)
could see the Bedrock bill, which is almost all of it. An application inference profile copies the configured model
source (the system profile, or the foundation model in this region) and carries the stack's cost tag: the workers
send its ARN as the `modelId` (Settings.invoke_model_id, MODEL_INVOKE_ID), and its usage is billed under the tag
(once the tag is activated as a cost-allocation tag, from the payer account: docs/cost.md).

The configured model id stays the key for prices, traits and quotas (the profile's ARN hides the model); the ARN is
only what is sent. Assumed, not confirmed by a page we can read (docs/first-deploy.md checks both on a first deploy):
- Bedrock's CloudWatch metrics (`AWS/Bedrock` InputTokenCount, OutputTokenCount) carry the ARN sent as their
  `ModelId` dimension (the token alarms, monitoring.py, watch that series);
- batch inference (`CreateModelInvocationJob`) is not sent through it: batch jobs keep the configured id and are
  tagged with the stack's tag themselves (pipeline/batch_inference.py, infra/batch.py).

Only for the Bedrock provider: the offline model (the local stack) has nothing to profile.
"""

from __future__ import annotations

from aws_cdk import CfnTag, Stack
from aws_cdk import aws_bedrock as bedrock
from aws_cdk import aws_iam as iam
from constructs import Construct

from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id, is_inference_profile

from .permissions import foundation_model_arn, profile_arn


def model_source_arn(stack: Stack, model_id: str) -> str:
    """What the application profile copies: the system-defined profile, or the foundation model in this region."""
    if is_inference_profile(model_id):
        return profile_arn(stack, model_id)
    return foundation_model_arn(stack, model_id, stack.region)


class ApplicationProfile(Construct):
    """An application inference profile copying `model_id`, tagged `tag` (the stack's cost-allocation tag)."""

    def __init__(self, scope: Construct, construct_id: str, *, model_id: str, tag: tuple[str, str]) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.model_id = model_id
        self.source_arn = model_source_arn(stack, model_id)
        self.profile = bedrock.CfnApplicationInferenceProfile(
            self, "Profile",
            # account-wide and unique per region: the stack and region in it ([0-9a-zA-Z] with single separators)
            inference_profile_name=f"{stack.stack_name}-{stack.region}",
            # (the description's pattern: [0-9a-zA-Z:.] with single separators between them)
            description=f"contract-review {stack.stack_name} workers calls to {model_id}",
            model_source=bedrock.CfnApplicationInferenceProfile.InferenceProfileModelSourceProperty(
                copy_from=self.source_arn),
            tags=[CfnTag(key=tag[0], value=tag[1])])
        self.arn = self.profile.attr_inference_profile_arn

    def grant_invoke(self, grantee: iam.IGrantable) -> None:
        """`bedrock:InvokeModel` through the profile: on the profile itself, and on what it routes to (the system
        profile and its foundation models, or the foundation model) only when the request came through one of the two
        profiles (`bedrock:InferenceProfileArn`). The grants on the configured id (permissions.grant_bedrock) stay:
        `review preflight` and batch jobs use it."""
        stack = Stack.of(self)
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["bedrock:InvokeModel"], resources=[self.arn]))
        base = base_model_id(self.model_id)
        # as the grants on the configured id (permissions._invoke_statements): a global profile's model in this region
        # and its region-less ARN; a geographic profile's in any region; a foundation model in this region
        regions = ([stack.region, ""] if self.model_id.startswith(GLOBAL_PROFILE_PREFIX) else ["*"]) \
            if is_inference_profile(self.model_id) else [stack.region]
        via = [self.arn] + ([self.source_arn] if is_inference_profile(self.model_id) else [])
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["bedrock:InvokeModel"],
            resources=([self.source_arn] if is_inference_profile(self.model_id) else [])
            + [foundation_model_arn(stack, base, r) for r in regions],
            conditions={"StringEquals": {"bedrock:InferenceProfileArn": via}}))
