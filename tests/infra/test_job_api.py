"""The Job API on the synthesized template (infra/api.py): every route needs IAM authorization, the API
function is reached only through the HTTP API (payload 2.0), the stage logs every request and is throttled,
and the API's URL is a stack output."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.api import ACCESS_LOG_FORMAT, THROTTLE_BURST, THROTTLE_RATE_PER_S

from .conftest import LOCAL, PROD, Synth, function_by_handler, resources

STACKS = [LOCAL, PROD]


def _one(t: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    found = resources(t, kind)
    assert len(found) == 1, (kind, list(found))
    (lid, res), = found.items()
    return lid, res["Properties"]


@pytest.mark.parametrize("name", STACKS)
def test_every_route_needs_iam_authorization_and_reaches_the_api_function(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    api_id, api = _one(t, "AWS::ApiGatewayV2::Api")
    assert api["ProtocolType"] == "HTTP"
    routes = resources(t, "AWS::ApiGatewayV2::Route")
    assert routes, "no route"
    for route in routes.values():  # no route without authorization: an unsigned request never reaches the code
        assert route["Properties"]["AuthorizationType"] == "AWS_IAM", route
        assert route["Properties"]["ApiId"] == {"Ref": api_id}
    _, integration = _one(t, "AWS::ApiGatewayV2::Integration")
    fn_id, _ = function_by_handler(t, "contract_review.handlers.api.handler")
    assert integration["IntegrationType"] == "AWS_PROXY" and integration["PayloadFormatVersion"] == "2.0"
    assert integration["IntegrationUri"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    # the function may be invoked by this API only
    permissions = [p["Properties"] for p in resources(t, "AWS::Lambda::Permission").values()
                   if p["Properties"]["FunctionName"] == {"Fn::GetAtt": [fn_id, "Arn"]}]
    assert permissions and all(p["Principal"] == "apigateway.amazonaws.com" and api_id in json.dumps(p["SourceArn"])
                               for p in permissions)


@pytest.mark.parametrize("name", STACKS)
def test_the_stage_logs_every_request_and_is_throttled(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    _, stage = _one(t, "AWS::ApiGatewayV2::Stage")
    assert stage["StageName"] == "$default" and stage["AutoDeploy"] is True
    logs = stage["AccessLogSettings"]
    assert json.loads(logs["Format"]) == ACCESS_LOG_FORMAT and "$context.identity.userArn" in logs["Format"]
    log_group = logs["DestinationArn"]["Fn::GetAtt"][0]
    assert t["Resources"][log_group]["Type"] == "AWS::Logs::LogGroup"
    assert t["Resources"][log_group]["Properties"]["RetentionInDays"] >= 1
    assert stage["DefaultRouteSettings"] == {"ThrottlingBurstLimit": THROTTLE_BURST,
                                             "ThrottlingRateLimit": THROTTLE_RATE_PER_S}


@pytest.mark.parametrize("name", STACKS)
def test_the_api_url_is_an_output(synth: Synth, name: str) -> None:
    t = synth.templates[name]
    api_id, _ = _one(t, "AWS::ApiGatewayV2::Api")
    url = t["Outputs"]["ApiUrl"]["Value"]
    assert json.dumps(url).count(api_id) == 1 and "execute-api" in json.dumps(url)
