"""The AWS calls the code makes, recorded, and the IAM question they raise.

`Recorder` hooks a boto3 session (`before-parameter-build`: the operation and the caller's
parameters, before anything is sent) and files every call under the role whose code is running
(`with recorder.acting_as("worker"): ...`). `requirements()` maps one call to the IAM actions and
resource ARNs it needs (a table: a call it does not know fails the test, so the table cannot fall
behind the code). `allowed()` evaluates identity-policy statements of the synthesized template the
way IAM does for an Allow: action and resource patterns with `*`/`?`, StringEquals conditions.
"""

from __future__ import annotations

import contextlib
import fnmatch
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

REGION, ACCOUNT = "us-east-1", "123456789012"  # the embedded moto stack (review_local.embedded)


@dataclass(frozen=True)
class Need:
    """One IAM check a call causes: `action` on `resource`, with these condition-key values."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Call:
    role: str
    service: str
    operation: str
    needs: tuple[Need, ...]


@dataclass
class Recorder:
    role: str | None = None
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # our code reads a missing key as 404 (which takes s3:ListBucket); Bedrock, recorded as the batch service role
    # (the stand-in's S3 calls), reads only the files it has just listed
    missing_key_404: bool = True

    def attach(self, session: Any) -> None:
        """Before any client of `session` is created (clients copy the session's event handlers)."""
        session.events.register("before-parameter-build", self._hook)

    @contextlib.contextmanager
    def acting_as(self, role: str) -> Iterator[None]:
        previous, self.role = self.role, role
        try:
            yield
        finally:
            self.role = previous

    def add(self, role: str, service: str, operation: str, params: Mapping[str, Any]) -> None:
        call = Call(role, service, operation,
                    tuple(requirements(service, operation, params, missing_key_404=self.missing_key_404)))
        with self._lock:
            self.calls.append(call)

    def _hook(self, params: Mapping[str, Any], model: Any, context: Mapping[str, Any] | None = None,
              **_: Any) -> None:
        if (context or {}).get("is_presign_request"):
            return  # signing calls nothing; the upload it signs is recorded by the scenario that makes it
        if self.role is not None:
            self.add(self.role, model.service_model.service_name, model.name, params)

    def of(self, *roles: str) -> list[Call]:
        return [c for c in self.calls if c.role in roles]


# ------------------------------------------------------------------------ call -> IAM
def _table(name: str) -> str:
    return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"


def _queue(url_or_name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url_or_name.rstrip('/').rsplit('/', 1)[-1]}"


def _model(model_id: str) -> list[Need]:
    """Converse/InvokeModel on a model id: the profile and its model in this region (through the
    profile), or the foundation model in this region."""
    if model_id.startswith("arn:"):
        return [Need("bedrock:InvokeModel", model_id)]
    prefix, _, base = model_id.partition(".")
    if prefix in ("us", "eu", "apac", "jp", "au", "ca", "global", "us-gov"):
        profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model_id}"
        return [Need("bedrock:InvokeModel", profile),
                Need("bedrock:InvokeModel", f"arn:aws:bedrock:{REGION}::foundation-model/{base}",
                     (("bedrock:InferenceProfileArn", profile),))]
    return [Need("bedrock:InvokeModel", f"arn:aws:bedrock:{REGION}::foundation-model/{model_id}")]


def _dynamodb(op: str, p: Mapping[str, Any]) -> list[Need]:
    if op in ("BatchGetItem", "BatchWriteItem"):
        return [Need(f"dynamodb:{op}", _table(t)) for t in p["RequestItems"]]
    if op in ("TransactWriteItems", "TransactGetItems"):  # IAM checks each item's own action on its table
        actions = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem",
                   "Get": "GetItem"}
        return [Need(f"dynamodb:{actions[kind]}", _table(body["TableName"]))
                for item in p["TransactItems"] for kind, body in item.items()]
    arn = _table(p["TableName"])
    if p.get("IndexName"):
        arn += f"/index/{p['IndexName']}"
    return [Need(f"dynamodb:{op}", arn)]


_S3_OBJECT = {"GetObject": "s3:GetObject", "HeadObject": "s3:GetObject", "PutObject": "s3:PutObject",
              "DeleteObject": "s3:DeleteObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
              "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload"}
_S3_BUCKET = {"ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket", "HeadBucket": "s3:ListBucket"}


def _s3(op: str, p: Mapping[str, Any], missing_key_404: bool = True) -> list[Need]:
    bucket = f"arn:aws:s3:::{p['Bucket']}"
    if op in _S3_BUCKET:  # a listing's prefix is the s3:prefix condition key
        return [Need(_S3_BUCKET[op], bucket, (("s3:prefix", str(p["Prefix"])),) if p.get("Prefix") else ())]
    if op == "DeleteObjects":  # authorized per key
        return [Need("s3:DeleteObject", f"{bucket}/{o['Key']}") for o in p["Delete"]["Objects"]]
    needs = [Need(_S3_OBJECT[op], f"{bucket}/{p['Key']}")]
    if _S3_OBJECT[op] == "s3:GetObject" and missing_key_404:  # a missing key answers 404 only with ListBucket
        needs.append(Need("s3:ListBucket", bucket))
    return needs


_SQS = {"SendMessage": "sqs:SendMessage", "SendMessageBatch": "sqs:SendMessage", "ReceiveMessage": "sqs:ReceiveMessage",
        "DeleteMessage": "sqs:DeleteMessage", "DeleteMessageBatch": "sqs:DeleteMessage",
        "ChangeMessageVisibility": "sqs:ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
        "GetQueueAttributes": "sqs:GetQueueAttributes", "GetQueueUrl": "sqs:GetQueueUrl"}


def _sqs(op: str, p: Mapping[str, Any]) -> list[Need]:
    return [Need(_SQS[op], _queue(p.get("QueueUrl") or p["QueueName"]))]


def _bedrock_runtime(op: str, p: Mapping[str, Any]) -> list[Need]:
    needs = _model(p["modelId"])
    if op in ("ConverseStream", "InvokeModelWithResponseStream"):
        return [Need("bedrock:InvokeModelWithResponseStream", n.resource, n.context) for n in needs]
    if op not in ("Converse", "InvokeModel"):
        raise KeyError(op)
    return needs


BEDROCK_SERVICE = "bedrock.amazonaws.com"


def _job(identifier: str) -> str:
    """A model invocation job's ARN (GetModelInvocationJob takes the ARN or the id)."""
    if identifier.startswith("arn:"):
        return identifier
    return f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{identifier}"


def _bedrock(op: str, p: Mapping[str, Any]) -> list[Need]:
    if op == "CreateModelInvocationJob":
        # the new job (its id is Bedrock's: any id), the model or profile it names, and passing its service role to
        # Bedrock (iam:PassedToService)
        model_id = str(p["modelId"])
        model = [n.resource for n in _model(model_id) if not n.context] + \
            [f"arn:aws:bedrock:{REGION}::foundation-model/{model_id.partition('.')[2]}"
             for n in _model(model_id) if n.context]
        return [Need("bedrock:CreateModelInvocationJob", _job("new0job0id00")),
                *(Need("bedrock:CreateModelInvocationJob", m) for m in model),
                Need("iam:PassRole", str(p["roleArn"]), (("iam:PassedToService", BEDROCK_SERVICE),))]
    if op in ("GetModelInvocationJob", "StopModelInvocationJob"):
        return [Need(f"bedrock:{op}", _job(str(p["jobIdentifier"])))]
    if op == "ListModelInvocationJobs":  # no resource type
        return [Need("bedrock:ListModelInvocationJobs", "*")]
    if op == "GetFoundationModel":
        return [Need("bedrock:GetFoundationModel",
                     f"arn:aws:bedrock:{REGION}::foundation-model/{p['modelIdentifier']}")]
    if op == "GetInferenceProfile":
        return [Need("bedrock:GetInferenceProfile",
                     f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{p['inferenceProfileIdentifier']}")]
    raise KeyError(op)


def _ecs_agent(op: str, p: Mapping[str, Any]) -> list[Need]:
    """The agent endpoint: the agent calls UpdateTaskProtection on this task with the task role."""
    if op != "UpdateTaskProtection":
        raise KeyError(op)
    return [Need("ecs:UpdateTaskProtection", f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{p['cluster']}/{p['task']}")]


XRAY_DAEMON_CALLS = ("PutTraceSegments", "PutTelemetryRecords", "GetSamplingRules", "GetSamplingTargets")


def _xray_daemon(op: str, p: Mapping[str, Any]) -> list[Need]:
    """The Fargate task's X-Ray daemon sidecar: it uploads the poller's segments and proxies its sampling
    rules with the task role. X-Ray has no resource-level permissions: the resource is `*`."""
    if op not in XRAY_DAEMON_CALLS:
        raise KeyError(op)
    return [Need(f"xray:{op}", "*")]


def _sns(op: str, p: Mapping[str, Any]) -> list[Need]:
    if op != "Publish":
        raise KeyError(op)
    return [Need("sns:Publish", p["TopicArn"])]


def _events(op: str, p: Mapping[str, Any]) -> list[Need]:
    """PutEvents is authorized per entry on its bus (the default bus when none is named)."""
    if op != "PutEvents":
        raise KeyError(op)
    buses = {e.get("EventBusName") or "default" for e in p["Entries"]}
    return [Need("events:PutEvents", b if b.startswith("arn:") else f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{b}")
            for b in sorted(buses)]


def _secretsmanager(op: str, p: Mapping[str, Any]) -> list[Need]:
    """GetSecretValue is authorized on the secret's complete ARN (the code passes it: TICKET_SECRET_ARN)."""
    if op != "GetSecretValue":
        raise KeyError(op)
    secret = str(p["SecretId"])
    return [Need("secretsmanager:GetSecretValue",
                 secret if secret.startswith("arn:") else f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{secret}")]


def _cloudformation(op: str, p: Mapping[str, Any]) -> list[Need]:
    """`review --stack NAME` finds the stack's outputs (the operator's credentials; no function role calls it)."""
    if op != "DescribeStacks":
        raise KeyError(op)
    return [Need("cloudformation:DescribeStacks", f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{p['StackName']}/*")]


_SERVICES: dict[str, Callable[[str, Mapping[str, Any]], list[Need]]] = {
    "dynamodb": _dynamodb, "s3": _s3, "sqs": _sqs, "bedrock-runtime": _bedrock_runtime, "bedrock": _bedrock,
    "ecs-agent": _ecs_agent, "xray-daemon": _xray_daemon, "sns": _sns, "events": _events, "secretsmanager": _secretsmanager,
    "cloudformation": _cloudformation,
}


def requirements(service: str, operation: str, params: Mapping[str, Any], *,
                 missing_key_404: bool = True) -> list[Need]:
    try:
        if service == "s3":
            return _s3(operation, params, missing_key_404)
        return _SERVICES[service](operation, params)
    except KeyError as exc:
        raise AssertionError(f"the code calls {service}:{operation}, which tests/infra/aws_calls.py cannot map to "
                             f"IAM yet ({exc!r}): add it, with the resource it needs") from None


# ------------------------------------------------------------------------ evaluating a policy
def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(pattern: str, value: str, *, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern)


def _conditions_hold(condition: Mapping[str, Any] | None, context: Mapping[str, str]) -> bool:
    """StringEquals, and StringLike / ArnLike (`*`, `?` wildcards); a key the request does not carry fails the test
    (as IAM does without IfExists). Any other operator is not evaluated here: treated as not granting."""
    for operator, tests in (condition or {}).items():
        if operator not in ("StringEquals", "StringLike", "ArnLike"):
            return False
        for key, expected in tests.items():
            value = context.get(key)
            if value is None:
                return False
            if operator == "StringEquals" and value not in _as_list(expected):
                return False
            if operator != "StringEquals" and not any(_matches(str(e), value) for e in _as_list(expected)):
                return False
    return True


def allowed(statements: list[dict[str, Any]], need: Need) -> bool:
    """Whether some Allow statement (resources already resolved to strings) grants `need`."""
    context = dict(need.context)
    for st in statements:
        if st.get("Effect") != "Allow" or "NotAction" in st or "NotResource" in st:
            continue
        if not any(_matches(a, need.action, case=False) for a in _as_list(st["Action"])):
            continue
        if not any(_matches(r, need.resource) for r in _as_list(st["Resource"])):
            continue
        if _conditions_hold(st.get("Condition"), context):
            return True
    return False
