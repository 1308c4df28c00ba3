"""The Job API page's caller policy (docs/api.md) allows exactly the calls of its curl sessions, judged by the policy
evaluator the role-coverage test uses (tests/infra/aws_calls.py `allowed`: API Gateway enforces it on AWS; moto does
not enforce IAM, so nothing else would notice a policy that drifted from the routes a caller needs).

Both are read from docs/api.md itself: the one ```json block with `execute-api:Invoke` (its placeholders filled in as a
reader would) and every `curl` of the two ```bash sessions that goes to `$API` (submit, events, status, cancel; upload,
submit, status, report). Each call becomes the ARN API Gateway checks (`arn:aws:execute-api:REGION:ACCOUNT:API_ID/
$default/METHOD/path`). The sessions run as written against the local stack in tests/integration/test_api.py (the
owner reads its report, the other principal gets 404).

- every call of the sessions is allowed;
- no route of the API that the sessions do not use is (`contract_review.operate.api.ROUTES`), nor another method;
- the same calls on another API, stage, region or account are refused;
- the routes the page says to add "for callers that use them" are exactly the rest of the API's routes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from contract_review.operate.api import ROUTES

from .aws_calls import ACCOUNT, REGION, Need, allowed

README = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")  # the Job API page
API_ID, JOB, BATCH = "a1b2c3d4e5", "job-0123456789abcdef0123", "batch-0123456789abcdef"
INVOKE = "execute-api:Invoke"


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def readme_policy() -> list[dict[str, Any]]:
    """The README's caller policy, REGION, ACCOUNT and API_ID filled in (as a reader fills them)."""
    [text] = [b for b in _fenced("json") if f'"{INVOKE}"' in b]
    left = set(re.findall(r"\b[A-Z][A-Z_]{3,}\b", text)) - {"REGION", "ACCOUNT", "API_ID"} - {m for m, _ in ROUTES}
    assert not left, f"the README's caller policy has placeholders this test cannot fill: {left}"
    for placeholder, value in (("API_ID", API_ID), ("REGION", REGION), ("ACCOUNT", ACCOUNT)):
        text = re.sub(rf"\b{placeholder}\b", value, text)
    statements: list[dict[str, Any]] = json.loads(text)["Statement"]
    return statements


def session_calls() -> list[tuple[str, str]]:
    """(method, path) of every `curl` to `$API` in the README's two Job API sessions, `$JOB` a job id."""
    blocks = [b for b in _fenced("bash") if "text/event-stream" in b or '"$API/uploads"' in b]
    assert len(blocks) == 2, "README: the submit/cancel session and the upload/report session"
    calls = []
    for line in "\n".join(blocks).splitlines():
        for curl in re.findall(r"\bcurl\b[^|;]*?\"\$API(/[^\"?]*)", line):
            segment = line[line.index("curl"):]
            method = re.search(r"-X\s+([A-Z]+)", segment.split('"$API')[0])
            calls.append((method.group(1) if method else "GET", curl.replace("$JOB", JOB)))
    return calls


def route_of(method: str, path: str) -> tuple[str, str] | None:
    for m, template in ROUTES:
        if m == method and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
            return m, template
    return None


def instance(template: str) -> str:
    return template.replace("{jobId}", JOB).replace("{batchId}", BATCH)


def arn(method: str, path: str, *, api: str = API_ID, stage: str = "$default", region: str = REGION,
        account: str = ACCOUNT) -> str:
    return f"arn:aws:execute-api:{region}:{account}:{api}/{stage}/{method}{path}"


def may(method: str, path: str, **where: str) -> bool:
    return allowed(readme_policy(), Need(INVOKE, arn(method, path, **where)))


def test_the_readme_caller_policy_allows_every_call_of_the_readme_sessions() -> None:
    calls = session_calls()
    # the sessions were read: submit, events, status, cancel, upload, report (each a route the API serves)
    assert {route_of(m, p) for m, p in calls} == {
        ("POST", "/jobs"), ("GET", "/jobs/{jobId}/events"), ("GET", "/jobs/{jobId}"), ("POST", "/jobs/{jobId}/cancel"),
        ("POST", "/uploads"), ("GET", "/jobs/{jobId}/report")}, calls
    refused = [(m, p) for m, p in calls if not may(m, p)]
    assert not refused, f"the README's caller policy refuses calls of its own session: {refused}"


def test_the_readme_caller_policy_allows_no_route_the_sessions_do_not_use() -> None:
    used = {route_of(m, p) for m, p in session_calls()}
    for method, template in ROUTES:
        assert may(method, instance(template)) == ((method, template) in used), (method, template)
    for _, template in ROUTES:  # a method the API does not serve on a path is not allowed either
        for method in ("PUT", "PATCH", "DELETE"):
            assert not may(method, instance(template)), (method, template)


def test_the_readme_caller_policy_names_one_api_in_one_stage_region_and_account() -> None:
    for method, path in session_calls():
        assert may(method, path)
        assert not may(method, path, api="zz9zz9zz9z"), (method, path)
        assert not may(method, path, stage="test"), (method, path)
        assert not may(method, path, region="eu-west-1"), (method, path)
        assert not may(method, path, account="210987654321"), (method, path)


def test_the_routes_the_readme_says_to_add_are_the_rest_of_the_api() -> None:
    # GIVEN the README's sentence after the policy: "add `POST/jobs/*/approval`, ... for callers that use them"
    after = README[README.index(f'"{INVOKE}"'):]
    sentence = after[after.index("(`API_ID` is"):after.index("for callers that use them")]
    added = re.findall(r"`([A-Z]+/[^`]+)`", sentence)
    assert added, sentence
    policy = readme_policy()
    prefix = arn("", "").removesuffix("/")  # arn:aws:execute-api:REGION:ACCOUNT:API_ID/$default
    wider = [*policy, {"Effect": "Allow", "Action": INVOKE, "Resource": [f"{prefix}/{a}" for a in added]}]
    # THEN the policy with them allows every route of the API
    for method, template in ROUTES:
        assert allowed(wider, Need(INVOKE, arn(method, instance(template)))), (method, template)
