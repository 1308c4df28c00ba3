"""The Job API: an API Gateway HTTP API with IAM authorization in front of the API function
(`contract_review.handlers.api`, the Powertools resolver of `contract_review/operate/api.py`).

Every route requires a SigV4-signed request (`HttpIamAuthorizer`): the caller needs `execute-api:Invoke`
on the API (`JobApi.grant_invoke`), and the function binds each job to the caller's IAM ARN, which the
HTTP API passes in `requestContext.authorizer.iam.userArn`. One `$default` route sends everything to the
function (payload format 2.0), which answers 404/405 for paths and methods it does not serve. The stage
writes JSON access logs and is throttled, so a runaway client cannot use up the function's concurrency.
"""

from __future__ import annotations

import json

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from .functions import log_retention

THROTTLE_RATE_PER_S = 50  # steady requests per second over all routes of the stage
THROTTLE_BURST = 100
# What the access log records per request (one JSON line): who called what, and how it went.
ACCESS_LOG_FORMAT = {
    "requestId": "$context.requestId", "ip": "$context.identity.sourceIp", "caller": "$context.identity.userArn",
    "requestTime": "$context.requestTime", "method": "$context.httpMethod", "path": "$context.path",
    "routeKey": "$context.routeKey", "status": "$context.status", "responseLength": "$context.responseLength",
    "latencyMs": "$context.responseLatency", "integrationError": "$context.integrationErrorMessage",
}


class JobApi(Construct):
    """HTTP API (IAM auth) -> the API function. `url`: the base URL (stack output `ApiUrl`)."""

    def __init__(self, scope: Construct, construct_id: str, *, function: lambda_.IFunction, name: str,
                 log_retention_days: int, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention(log_retention_days),
                                         removal_policy=removal_policy)
        self.http_api = apigwv2.HttpApi(
            self, "HttpApi", api_name=f"{name}-jobs",
            description="contract-review Job API (IAM authorization; docs/openapi.yaml)",
            default_authorizer=authorizers.HttpIamAuthorizer(),
            default_integration=integrations.HttpLambdaIntegration(
                "Jobs", function, payload_format_version=apigwv2.PayloadFormatVersion.VERSION_2_0),
            create_default_stage=True,
        )
        stage = self.http_api.default_stage
        assert stage is not None
        cfn_stage = stage.node.default_child
        assert isinstance(cfn_stage, apigwv2.CfnStage)
        cfn_stage.access_log_settings = apigwv2.CfnStage.AccessLogSettingsProperty(
            destination_arn=self.access_logs.log_group_arn, format=json.dumps(ACCESS_LOG_FORMAT))
        cfn_stage.default_route_settings = apigwv2.CfnStage.RouteSettingsProperty(
            throttling_rate_limit=THROTTLE_RATE_PER_S, throttling_burst_limit=THROTTLE_BURST)
        # the default endpoint, from the API's id (not GetAtt ApiEndpoint: the local deploy into moto's
        # CloudFormation resolves a Ref to a type it skips, not a GetAtt)
        stack = Stack.of(self)
        self.url = f"https://{self.http_api.api_id}.execute-api.{stack.region}.{stack.url_suffix}"

    def grant_invoke(self, grantee: iam.IGrantable) -> None:
        """`execute-api:Invoke` on every route of the API: what a client principal needs."""
        iam.Grant.add_to_principal(grantee=grantee, actions=["execute-api:Invoke"],
                                   resource_arns=[self.http_api.arn_for_execute_api()])
