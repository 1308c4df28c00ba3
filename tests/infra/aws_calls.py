"""The AWS calls the code makes, recorded, and the IAM question they raise.

`Recorder` hooks a boto3 session (`before-parameter-build`: the operation and the caller's
parameters, before anything is sent) and files every call under the role whose code is running
(`with recorder.acting_as("worker"): ...`), with the shipped module that made it: the innermost
frame of the call's stack under `functions/` or `review_local/` (`origin`; None when no shipped code
is on the stack: the test itself called the client). A grant only counts as used by a call shipped
code made (tests/infra/test_role_coverage.py): a test cannot manufacture the use it checks for.
`requirements()` maps one call to the IAM actions and resource ARNs it needs (a table: a call it does
not know fails the test, so the table cannot fall behind the code). `allowed()` evaluates
identity-policy statements of the synthesized template the way IAM does for an Allow: action and
resource patterns with `*`/`?`, StringEquals conditions.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import contract_review
import review_local

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
    # who made it: a shipped module ("functions/contract_review/pipeline/batch_inference_collect.py:collect"), a component a role's
    # grant serves outside our code (DECLARED), or None: no shipped code on the stack (the test called the client)
    origin: str | None = None

    @property
    def by_the_code(self) -> bool:
        """Made by shipped code, or by a component outside our code that the role's grant serves (DECLARED)."""
        return self.origin is not None and (self.origin.startswith(SHIPPED_PREFIXES) or
                                            self.origin.removeprefix("declared:") in DECLARED)


# Where shipped code lives: the Lambda asset and the local runtime (the batch stand-in plays Bedrock with the service
# role from review_local/batch_service.py); the paths as this process imported them (a worktree or an install)
SHIPPED = {"functions": Path(contract_review.__file__).resolve().parent.parent,
           "review_local": Path(next(iter(review_local.__path__))).resolve()}  # a namespace package
SHIPPED_PREFIXES = ("functions/", "review_local/")
# Calls a role's grant serves that no boto3 client of ours makes, by the component that makes each (the fixture adds them
# with `Recorder.add(..., origin=declared(...))`), so they count as used without a test pretending to be the code.
DECLARED = {
    "ecs-agent": "the ECS agent, on the poller's request (adapters/task_protection.py), with the task role",
    "xray-daemon": "the X-Ray daemon sidecar (infra/fargate.py), sending the poller's segments with the task role",
    "bedrock": "Bedrock, running a batch job's model with the batch service role (infra/batch.py)",
    "presigned-post": "a Job API caller's upload through the presigned POST the API signed (operate/api.py): S3 checks "
                      "the signer's grant",
    "presigned-get": "a Job API caller's read of its report through the presigned GET the API signed (operate/api.py "
                     "GET /jobs/{id}/report): S3 checks the signer's grant",
}


def declared(component: str) -> str:
    assert component in DECLARED, component
    return f"declared:{component}"


def _shipped_frame(frame: FrameType | None) -> str | None:
    """The innermost frame under a shipped directory, as "functions/...py:function" (None: none on the stack)."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        for name, root in SHIPPED.items():
            if path.is_relative_to(root):
                return f"{name}/{path.relative_to(root).as_posix()}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _in_transfer(frame: FrameType | None) -> bool:
    while frame is not None:
        if "s3transfer" in Path(frame.f_code.co_filename).parts or \
                frame.f_code.co_filename.endswith(str(Path("boto3", "s3", "inject.py"))):
            return True
        frame = frame.f_back
    return False


def origin_of(frame: FrameType | None) -> str | None:
    """Who made the call on `frame`'s stack: its innermost shipped frame. A call from one of boto3's managed-transfer
    threads (s3transfer: `upload_fileobj`'s parts) has none of its own: it is the shipped code's that started the
    transfer and waits for it on another thread (its stack is in s3transfer too)."""
    shipped = _shipped_frame(frame)
    if shipped is not None or not _in_transfer(frame):
        return shipped
    me = threading.get_ident()
    waiting = [origin for ident, top in sys._current_frames().items()
               if ident != me and _in_transfer(top) and (origin := _shipped_frame(top)) is not None]
    return f"{waiting[0]} (managed transfer)" if len(set(waiting)) == 1 else None


@dataclass
class Recorder:
    role: str | None = None
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # our code reads a missing key as 404 (which takes s3:ListBucket); Bedrock, recorded as the batch service role
    # (the stand-in's S3 calls), reads only the files it has just listed
    missing_key_404: bool = True
    # a resource's tags as IAM sees them (aws:ResourceTag/...): a batch job's, from the batch stand-in
    resource_tags: Callable[[str], Mapping[str, str]] = lambda _arn: {}

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

    def add(self, role: str, service: str, operation: str, params: Mapping[str, Any], *, origin: str | None) -> None:
        call = Call(role, service, operation,
                    tuple(requirements(service, operation, params, missing_key_404=self.missing_key_404,
                                       resource_tags=self.resource_tags)), origin)
        with self._lock:
            self.calls.append(call)

    def _hook(self, params: Mapping[str, Any], model: Any, context: Mapping[str, Any] | None = None,
              **_: Any) -> None:
        if (context or {}).get("is_presign_request"):
            return  # signing calls nothing; the upload it signs is recorded by the scenario that makes it
        if self.role is not None:
            self.add(self.role, model.service_model.service_name, model.name, params, origin=origin_of(sys._getframe(1)))

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


def _bedrock(op: str, p: Mapping[str, Any], resource_tags: Callable[[str], Mapping[str, str]]) -> list[Need]:
    if op == "CreateModelInvocationJob":
        # the new job (its id is Bedrock's: any id), the model or profile it names, and passing its service role to
        # Bedrock (iam:PassedToService); with `tags`, TagResource on the new job with each tag as aws:RequestTag (the
        # Service Authorization Reference lists bedrock:TagResource for a create that tags; AWS's "Required permissions
        # for batch inference" grants it to the identity that submits)
        model_id = str(p["modelId"])
        model = [n.resource for n in _model(model_id) if not n.context] + \
            [f"arn:aws:bedrock:{REGION}::foundation-model/{model_id.partition('.')[2]}"
             for n in _model(model_id) if n.context]
        tags = tuple((f"aws:RequestTag/{t['key']}", str(t["value"])) for t in p.get("tags") or [])
        return [Need("bedrock:CreateModelInvocationJob", _job("new0job0id00")),
                *(Need("bedrock:CreateModelInvocationJob", m) for m in model),
                *([Need("bedrock:TagResource", _job("new0job0id00"), tags)] if tags else []),
                Need("iam:PassRole", str(p["roleArn"]), (("iam:PassedToService", BEDROCK_SERVICE),))]
    if op == "GetModelInvocationJob":
        return [Need(f"bedrock:{op}", _job(str(p["jobIdentifier"])))]
    if op == "StopModelInvocationJob":  # authorized on the job with its tags (aws:ResourceTag)
        job = _job(str(p["jobIdentifier"]))
        return [Need(f"bedrock:{op}", job, tuple((f"aws:ResourceTag/{k}", v)
                                                 for k, v in sorted(resource_tags(job).items())))]
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


def _service_quotas(op: str, p: Mapping[str, Any]) -> list[Need]:
    """The model's quotas, read by name (model/quotas.py): Service Quotas' list actions take no resource ARN."""
    if op not in ("ListServiceQuotas", "ListAWSDefaultServiceQuotas"):
        raise KeyError(op)
    return [Need(f"servicequotas:{op}", "*")]


_SERVICES: dict[str, Callable[[str, Mapping[str, Any]], list[Need]]] = {
    "dynamodb": _dynamodb, "s3": _s3, "sqs": _sqs, "bedrock-runtime": _bedrock_runtime,
    "ecs-agent": _ecs_agent, "xray-daemon": _xray_daemon, "sns": _sns, "events": _events, "secretsmanager": _secretsmanager,
    "cloudformation": _cloudformation, "service-quotas": _service_quotas,
}


def requirements(service: str, operation: str, params: Mapping[str, Any], *, missing_key_404: bool = True,
                 resource_tags: Callable[[str], Mapping[str, str]] = lambda _arn: {}) -> list[Need]:
    try:
        if service == "s3":
            return _s3(operation, params, missing_key_404)
        if service == "bedrock":
            return _bedrock(operation, params, resource_tags)
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
