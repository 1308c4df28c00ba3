"""Embedded AWS: a moto server, and the synthesized CDK template deployed into it.

The template is the contract: queues, tables and the bucket are created by moto's
CloudFormation from the very template `cdk deploy` would use. What moto cannot run (Lambda
functions, event source mappings, ECS, IAM, schedules, custom resources) is filtered out of the
deployed copy and emulated by `review_local.runtime` from the same template.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = ROOT / ".review"
LOCAL_JSON = Path(os.environ.get("REVIEW_LOCAL_JSON", STATE_DIR / "local.json"))  # override: tests
REGION = "us-east-1"
STACK_NAME = "ContractReview"
# Resource types moto's CloudFormation creates faithfully. Queue/bucket policies and alarms
# are not supported by moto (it skips them with a warning): tests/infra asserts them on the template.
# (+ the job-events SNS topic: the saga publishes to it; the alarm topic needs its KMS key and stays out)
DEPLOYABLE = {"AWS::SQS::Queue", "AWS::DynamoDB::Table", "AWS::S3::Bucket", "AWS::SNS::Topic"}
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


_DYNAMODB_LOCK = threading.Lock()


def serialize_dynamodb_requests() -> None:
    """Make moto's DynamoDB as atomic as DynamoDB: one request at a time.

    moto's server answers each request on its own thread and its DynamoDB backend takes no lock, so two
    concurrent `ADD n :one` can return the same number and lose an increment, and a response can fail
    with "dictionary changed size during iteration" (measured: tests/integration/test_embedded_aws.py).
    Every fence, counter and conditional write in this product relies on DynamoDB's single-item
    atomicity, so the emulator must keep it. Only DynamoDB is serialized: its requests take
    microseconds, while SQS long polls must not block each other. Idempotent (patched once per process).
    """
    from moto.dynamodb.responses import DynamoHandler

    if getattr(DynamoHandler.call_action, "serialized", False):
        return
    unlocked = DynamoHandler.call_action

    def call_action(self: Any) -> Any:
        with _DYNAMODB_LOCK:
            return unlocked(self)

    call_action.serialized = True  # type: ignore[attr-defined]  # a marker on the function object
    DynamoHandler.call_action = call_action  # type: ignore[method-assign]  # the patch itself


def cache_backend_lookup() -> None:
    """moto's server finds each request's backend, under one lock for all requests, by listing its own package
    directory (a listdir and some 150 isdir calls) and then trying its URL patterns in turn; the answer depends on the
    host name alone, so it is kept per host name. Idempotent (patched once per process)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    if getattr(DomainDispatcherApplication.get_backend_for_host, "cached", False):
        return
    uncached = DomainDispatcherApplication.get_backend_for_host
    known: dict[str | None, Any] = {}

    def get_backend_for_host(self: Any, host: str | None) -> Any:
        if host not in known:
            known[host] = uncached(self, host)
        return known[host]

    get_backend_for_host.cached = True  # type: ignore[attr-defined]  # a marker on the function object
    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host  # type: ignore[method-assign]  # the patch itself


class _TablesNotCopied:
    """`copy` as moto's DynamoDB backend module sees it once `roll_back_transactions_by_item` ran: a deep copy of
    a whole table returns the table itself (the rollback then restores items, not tables); anything else is
    copied as before."""

    copy = staticmethod(copy.copy)
    table: type = type(None)  # moto's Table, set by the patch

    @classmethod
    def deepcopy(cls, x: Any, memo: dict[int, Any] | None = None) -> Any:
        return x if isinstance(x, cls.table) else copy.deepcopy(x, memo)


def roll_back_transactions_by_item() -> None:
    """Make moto's TransactWriteItems cost what the transaction touches, not the size of its tables.

    moto deep-copies every table a transaction names before applying it, to put the copy back if the transaction
    is cancelled. Under the DynamoDB lock (`serialize_dynamodb_requests`), one transaction on the chunks table of a
    3,000-chunk job then copies every chunk while every other DynamoDB request waits; the soak's table grows all
    run, so each transaction costs more than the last. Here the rollback copies the items the transaction names
    (at most 100) before it runs and restores exactly those if it is cancelled: the same all-or-nothing outcome
    (tests/integration/test_embedded_aws.py), with requests serialized so no other write lands in between.
    Idempotent (patched once per process)."""
    from moto.dynamodb import models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    backend = models.DynamoDBBackend
    if getattr(backend.transact_write_items, "by_item", False):
        return
    whole_tables = backend.transact_write_items
    _TablesNotCopied.table = Table
    models.copy = _TablesNotCopied  # type: ignore[assignment]  # the backup of whole tables becomes a no-op

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = []
        for entry in transact_items:
            op = next(iter(entry.values()), None) or {}
            table = self.tables.get(op.get("TableName"))
            attrs = op.get("Key") or op.get("Item") or {}
            if table is None or table.hash_key_attr not in attrs:
                continue  # moto refuses it below, before anything is written
            hash_value = DynamoType(attrs[table.hash_key_attr])
            range_value = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr in attrs else None
            try:
                before = table.get_item(hash_value, range_value)
            except Exception:  # a malformed key: moto refuses it below, nothing written
                continue
            saved.append((table, hash_value, range_value, copy.deepcopy(before)))
        try:
            whole_tables(self, transact_items)
        except Exception:
            for table, hash_value, range_value, before in reversed(saved):  # the first copy of an item wins
                if range_value is None:
                    table.items.pop(hash_value, None)
                    if before is not None:
                        table.items[hash_value] = before
                else:
                    table.items[hash_value].pop(range_value, None)
                    if before is not None:
                        table.items[hash_value][range_value] = before
            raise

    transact_write_items.by_item = True  # type: ignore[attr-defined]  # a marker on the function object
    backend.transact_write_items = transact_write_items  # type: ignore[method-assign]  # the patch itself


def _inputs_hash(profile: str, context: dict[str, str]) -> str:
    h = hashlib.sha256(json.dumps([profile, sorted(context.items())]).encode())
    # infra reads the config, the S3 key scheme, the model-id rules and the fault spec from the Lambda asset, and
    # the template names the asset by its content: every file of both counts
    files = [ROOT / "app.py", ROOT / "cdk.json", ROOT / "functions/Dockerfile"]
    files += sorted((ROOT / "infra").rglob("*.py")) + sorted((ROOT / "functions").rglob("*.py"))
    for f in files:
        if f.exists() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def synth(profile: str = "local", context: dict[str, str] | None = None, stack_name: str = STACK_NAME) -> dict[str, Any]:
    """Synthesize the CDK app (cached by the hash of its inputs) and return the template."""
    context = {"profile": profile, "stack_name": stack_name, **(context or {})}
    outdir = STATE_DIR / "cdk.out" / _inputs_hash(profile, context)
    template_path = outdir / f"{stack_name}.template.json"
    outdir.parent.mkdir(parents=True, exist_ok=True)
    with open(outdir.parent / ".lock", "w") as lock:  # parallel test workers synthesize once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template_path.exists():
            _run_synth(outdir, context)
            _prune(outdir.parent, keep=6)
    return json.loads(template_path.read_text())


def _prune(cache: Path, keep: int) -> None:
    """Keep the newest `keep` synthesized assemblies (each holds a copy of the Lambda asset)."""
    dirs = sorted((d for d in cache.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for old in dirs[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def _run_synth(outdir: Path, context: dict[str, str]) -> None:
    template_path = outdir / f"{context['stack_name']}.template.json"
    env = {**os.environ, "CDK_OUTDIR": str(outdir), "CDK_CONTEXT_JSON": json.dumps(context),
           "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not template_path.exists():
        raise RuntimeError(f"cdk synth failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def moto_tags(resources: dict[str, Any]) -> None:
    """Tags as moto 5.2 reads them, where it differs from CloudFormation (in place): KMS keys' as TagKey/TagValue."""
    for res in resources.values():
        tags = res.get("Properties", {}).get("Tags")
        if res["Type"] == "AWS::KMS::Key" and isinstance(tags, list):
            res["Properties"]["Tags"] = [{"TagKey": t["Key"], "TagValue": t["Value"]} for t in tags]


def deployable_template(template: dict[str, Any]) -> dict[str, Any]:
    """The subset of the template moto can create, with outputs that only reference it."""
    resources = {k: v for k, v in template["Resources"].items() if v["Type"] in DEPLOYABLE}
    kept = set(resources)

    def refs(node: Any) -> set[str]:
        found: set[str] = set()
        if isinstance(node, dict):
            if "Ref" in node:
                found.add(node["Ref"])
            if "Fn::GetAtt" in node:
                target = node["Fn::GetAtt"]
                found.add(target[0] if isinstance(target, list) else target.split(".")[0])
            for v in node.values():
                found |= refs(v)
        elif isinstance(node, list):
            for v in node:
                found |= refs(v)
        return found

    params = set(template.get("Parameters", {}))
    pseudo = {r for r in refs(resources) if r.startswith("AWS::")}
    for name, res in list(resources.items()):
        missing = refs(res) - kept - params - pseudo
        if missing:  # e.g. a policy naming a function role: drop the dependent resource, not the stack
            del resources[name]
    moto_tags(resources)
    for res in resources.values():
        deps = res.get("DependsOn")
        if deps:
            deps = [deps] if isinstance(deps, str) else deps
            res["DependsOn"] = [d for d in deps if d in resources]
            if not res["DependsOn"]:
                del res["DependsOn"]
    outputs = {k: v for k, v in template.get("Outputs", {}).items() if refs(v) <= set(resources) | params}
    out = {k: v for k, v in template.items() if k not in ("Resources", "Outputs", "Conditions", "Parameters")}
    # Only the parameters the kept part still uses: moto resolves every SSM-typed parameter on create,
    # and e.g. the public Powertools layer parameter (for the functions, not deployed) is not in moto.
    used = refs([resources, outputs, template.get("Rules", {}), template.get("Conditions", {})])
    out["Parameters"] = {k: v for k, v in template.get("Parameters", {}).items() if k in used}
    out["Resources"] = resources
    out["Outputs"] = outputs
    if "Conditions" in template:
        out["Conditions"] = template["Conditions"]
    return out


@dataclass
class EmbeddedAws:
    """A moto server on 127.0.0.1 (random port) with the stack deployed into it."""

    region: str = REGION
    stack_name: str = STACK_NAME
    server: Any = None
    endpoint: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    physical: dict[str, str] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)

    def start(self) -> EmbeddedAws:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request access log
        serialize_dynamodb_requests()
        roll_back_transactions_by_item()
        cache_backend_lookup()

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        # moto's backends are process-global: a new embedded AWS starts empty (one at a time per process)
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def session(self) -> boto3.Session:
        return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                             aws_session_token="testing", region_name=self.region)

    def client(self, service: Any) -> Any:
        return self.session().client(service, endpoint_url=self.endpoint)

    def deploy(self, template: dict[str, Any]) -> dict[str, str]:
        self.template = template
        ssm = self.client("ssm")
        ssm.put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String", Overwrite=True)
        cfn = self.client("cloudformation")
        cfn.create_stack(StackName=self.stack_name, TemplateBody=json.dumps(deployable_template(template)),
                         Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"])
        deadline = time.time() + 60
        while True:
            stack = cfn.describe_stacks(StackName=self.stack_name)["Stacks"][0]
            status = stack["StackStatus"]
            if status.endswith("_COMPLETE") and "ROLLBACK" not in status:
                break
            if "FAILED" in status or "ROLLBACK" in status or time.time() > deadline:
                raise RuntimeError(f"stack deploy into moto failed: {status} {stack.get('StackStatusReason', '')}")
            time.sleep(0.2)
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        self.physical = {r["LogicalResourceId"]: r["PhysicalResourceId"]
                         for r in cfn.describe_stack_resources(StackName=self.stack_name)["StackResources"]
                         if r.get("LogicalResourceId") and r.get("PhysicalResourceId")}
        return self.outputs

    def write_local_json(self, path: Path = LOCAL_JSON, extra: dict[str, Any] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"endpoint": self.endpoint, "region": self.region, "stack_name": self.stack_name,
                                    "outputs": self.outputs, **(extra or {})}, indent=2))

    # -- resolving template expressions against the deployed stack --------------------------
    def resolve(self, node: Any) -> Any:
        """Resolve Ref / Fn::GetAtt / Fn::Join / Fn::Sub the way CloudFormation would (for env vars)."""
        if isinstance(node, dict):
            if "Ref" in node:
                name = node["Ref"]
                return {"AWS::Region": self.region, "AWS::AccountId": "123456789012", "AWS::Partition": "aws",
                        "AWS::StackName": self.stack_name, "AWS::URLSuffix": "amazonaws.com"}.get(name) \
                    or self.physical.get(name, name)
            if "Fn::GetAtt" in node:
                target = node["Fn::GetAtt"]
                logical, attr = target if isinstance(target, list) else target.split(".", 1)
                return self._get_att(logical, attr)
            if "Fn::Join" in node:
                sep, parts = node["Fn::Join"]
                return sep.join(str(self.resolve(p)) for p in parts)
            if "Fn::Sub" in node:
                text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
                for var in ("AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::StackName"):
                    text = text.replace("${" + var + "}", str(self.resolve({"Ref": var})))
                return text
            return {k: self.resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v) for v in node]
        return node

    def _get_att(self, logical: str, attr: str) -> str:
        res = self.template["Resources"][logical]
        phys = self.physical.get(logical, "")
        if res["Type"] == "AWS::SQS::Queue":
            name = phys.rsplit("/", 1)[-1]
            return {"Arn": f"arn:aws:sqs:{self.region}:123456789012:{name}", "QueueName": name,
                    "QueueUrl": phys}[attr]
        if res["Type"] == "AWS::DynamoDB::Table":
            return {"Arn": f"arn:aws:dynamodb:{self.region}:123456789012:table/{phys}"}.get(attr, phys)
        if res["Type"] == "AWS::S3::Bucket":
            return {"Arn": f"arn:aws:s3:::{phys}", "DomainName": f"{phys}.s3.amazonaws.com"}.get(attr, phys)
        if res["Type"] == "AWS::IAM::Role" and attr == "Arn":  # not deployed (moto does not enforce IAM): named by its
            return f"arn:aws:iam::123456789012:role/{logical}"  # logical id, as the batch stand-in is handed it
        return f"{logical}.{attr}"


def local_json_path() -> Path:
    """Where `review up` / `make demo` describe the local stack (REVIEW_LOCAL_JSON overrides; read now)."""
    return Path(os.environ.get("REVIEW_LOCAL_JSON", STATE_DIR / "local.json"))


def load_local_json(path: Path | None = None) -> dict[str, Any]:
    path = path or local_json_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: no local stack is running; start one with `review up` "
                                "(or use a deployed one with --stack NAME)")
    try:
        info = json.loads(path.read_text())
    except ValueError:
        info = None
    if not isinstance(info, dict) or not {"endpoint", "region", "outputs"} <= set(info):
        raise FileNotFoundError(f"{path} is not a local stack description: start the stack again with `review up`")
    return info
