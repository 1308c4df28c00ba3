"""Local Lambda runtime: an event-source-mapping emulator with real worker processes.

From the synthesized template it reads every `AWS::Lambda::Function` (handler, timeout, memory,
environment) and every `AWS::Lambda::EventSourceMapping` (queue, batch size,
`ReportBatchItemFailures`, `ScalingConfig.MaximumConcurrency`) plus the scheduled functions (every target of an
`AWS::Events::Rule`: the sweeper and the batch collector), each one sandbox at a time, as their reserved concurrency
of 1 keeps them on AWS.
Each concurrent "sandbox" is a separate OS process (`review_local.sandbox`) that polls
its queue, invokes the real handler with a Lambda-shaped SQS event and context, and applies the
partial batch response the way Lambda does. A crashed or timed-out sandbox is replaced, as
Lambda would; `kill -9` on one is a real crash.

Sandboxes are forked from Python's multiprocessing forkserver, one per process that runs stacks, which has
imported boto3, Powertools, pydantic and the core once (`PRELOAD`): a new sandbox costs a fork, not the ~1.5 s
of CPU those imports take (ten sandboxes a stack). Nothing else is shared: the forkserver creates no client and
reads no environment; each sandbox sets its own environment and only then imports its handler module. As with
any multiprocessing start method but fork, a script that starts a runtime keeps its work under
`if __name__ == "__main__":` (a sandbox imports the script's module; every entry point here does).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess
from pathlib import Path

from . import sandbox
from .embedded import FAKE_CREDENTIALS, ROOT, EmbeddedAws


@dataclass
class FunctionSpec:
    logical_id: str
    name: str  # short role: intake | worker | aggregator | sweeper | collector | api
    handler: str
    timeout_s: int
    memory_mb: int
    env: dict[str, str]
    queue_url: str = ""  # empty for scheduled functions
    queue_arn: str = ""
    batch_size: int = 10
    report_batch_item_failures: bool = False
    concurrency: int = 1
    fifo: bool = False
    schedule_s: float = 0.0  # > 0: invoked on a schedule (the sweeper, the batch collector)


def function_specs(aws: EmbeddedAws, sweep_interval_s: float, default_concurrency: int = 2) -> list[FunctionSpec]:
    tpl = aws.template["Resources"]
    functions = {k: v for k, v in tpl.items() if v["Type"] == "AWS::Lambda::Function"
                 and str(v["Properties"].get("Handler", "")).startswith("contract_review.handlers.")}
    specs: dict[str, FunctionSpec] = {}
    for logical, res in functions.items():
        p = res["Properties"]
        env = {k: str(v) for k, v in aws.resolve(p.get("Environment", {}).get("Variables", {})).items()}
        specs[logical] = FunctionSpec(logical_id=logical, name=p["Handler"].split(".")[2], handler=p["Handler"],
                                      timeout_s=int(p.get("Timeout", 3)), memory_mb=int(p.get("MemorySize", 128)),
                                      env=env)
    mapped: list[FunctionSpec] = []
    for res in tpl.values():
        if res["Type"] != "AWS::Lambda::EventSourceMapping":
            continue
        p = res["Properties"]
        fn = p["FunctionName"]["Ref"] if isinstance(p["FunctionName"], dict) else p["FunctionName"]
        spec = specs.pop(fn, None)
        if spec is None:
            continue
        arn = aws.resolve(p["EventSourceArn"])
        queue_name = arn.rsplit(":", 1)[-1]
        spec.queue_arn = arn
        spec.queue_url = f"{aws.endpoint}/123456789012/{queue_name}"
        spec.batch_size = int(p.get("BatchSize", 10))
        spec.report_batch_item_failures = "ReportBatchItemFailures" in p.get("FunctionResponseTypes", [])
        spec.concurrency = int(p.get("ScalingConfig", {}).get("MaximumConcurrency", default_concurrency))
        spec.fifo = queue_name.endswith(".fifo")
        mapped.append(spec)
    scheduled = {_target_id(target["Arn"])
                 for res in tpl.values() if res["Type"] == "AWS::Events::Rule"
                 for target in res["Properties"].get("Targets", [])}
    for logical, spec in specs.items():  # functions without a queue: those an EventBridge rule invokes
        if logical in scheduled:
            spec.schedule_s = sweep_interval_s  # the template's rate is whole minutes; locally every interval
            mapped.append(spec)
    mapped.extend(_fargate_pollers(aws, default_concurrency))
    return mapped


def _target_id(arn: object) -> str:
    """The logical id of the function a rule's target names (`{"Fn::GetAtt": [id, "Arn"]}`)."""
    return str(arn["Fn::GetAtt"][0]) if isinstance(arn, dict) and "Fn::GetAtt" in arn else ""


POLLER = "contract_review.handlers.poller.main"


def _fargate_pollers(aws: EmbeddedAws, tasks: int) -> list[FunctionSpec]:
    """`-c worker=fargate`: the ECS task definition's container runs as local poller processes."""
    out = []
    for logical, res in aws.template["Resources"].items():
        if res["Type"] != "AWS::ECS::TaskDefinition":
            continue
        for c in res["Properties"].get("ContainerDefinitions", []):
            env = {e["Name"]: str(aws.resolve(e["Value"])) for e in c.get("Environment", [])}
            if "ANALYSIS_QUEUE_URL" not in env:
                continue
            out.append(FunctionSpec(logical_id=logical, name="worker", handler=POLLER, timeout_s=0,
                                    memory_mb=int(res["Properties"].get("Memory", 1024)), env=env,
                                    concurrency=tasks))
    return out


# Imported once by the forkserver (none reads the environment at import); the handler modules are not: they do.
PRELOAD = ["boto3", "botocore.client", "aws_xray_sdk.core", "pydantic", "aws_lambda_powertools",
           "aws_lambda_powertools.metrics", "aws_lambda_powertools.utilities.batch",
           "aws_lambda_powertools.utilities.data_classes.sqs_event", "contract_review.wiring",
           "contract_review.config.settings", "contract_review.pipeline.worker",
           "contract_review.pipeline.batch_inference_collect",
           "contract_review.sideeffects.saga", "review_local.sandbox"]


_FORKSERVER_LOCK = threading.Lock()


def _forkserver() -> multiprocessing.context.ForkServerContext:
    """The forkserver, started on first use with PRELOAD imported. It sees the environment of this process when it
    starts, not this process's sys.path: PYTHONPATH names the code for that start only."""
    ctx = multiprocessing.get_context("forkserver")
    with _FORKSERVER_LOCK:
        ctx.set_forkserver_preload(PRELOAD)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "functions"), str(ROOT), *filter(None, [before])])
        try:
            forkserver.ensure_running()
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before
    return ctx


class SandboxProcess:
    """A forked sandbox, with the part of `subprocess.Popen` the runtime uses (poll, terminate, kill, wait)."""

    def __init__(self, proc: BaseProcess) -> None:
        self._proc = proc
        self.pid: int = proc.pid or 0

    def poll(self) -> int | None:
        return self._proc.exitcode

    def terminate(self) -> None:
        self._proc.terminate()

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"sandbox {self.pid}", timeout or 0.0)
        return self._proc.exitcode


@dataclass
class Sandbox:
    spec: FunctionSpec
    slot: int
    proc: SandboxProcess | None = None
    restarts: int = 0


@dataclass
class LocalRuntime:
    """Supervises the sandboxes. `env_overrides` adds e.g. FAULT_SPEC to a function's environment."""

    aws: EmbeddedAws
    specs: list[FunctionSpec]
    env_overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    concurrency: dict[str, int] = field(default_factory=dict)  # override per function name
    log_dir: Path = ROOT / ".review" / "logs"
    sandboxes: list[Sandbox] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _env(self, spec: FunctionSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(FAKE_CREDENTIALS)
        env.update({"AWS_ENDPOINT_URL": self.aws.endpoint, "AWS_DEFAULT_REGION": self.aws.region,
                    "AWS_REGION": self.aws.region, "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id,
                    "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout_s),
                    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
                    "POWERTOOLS_METRICS_DISABLED": "false", "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT)])})
        env.update(spec.env)
        env.update(self.env_overrides.get(spec.name, {}))
        return env

    def _spawn(self, box: Sandbox) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{box.spec.name}-{box.slot}.log"
        # daemon: if the process that runs the stack exits without stopping it, its sandboxes end with it
        proc = _forkserver().Process(target=sandbox.forked, daemon=True, name=f"{box.spec.name}-{box.slot}",
                                     args=(asdict(box.spec), self._env(box.spec), str(ROOT), str(log)))
        proc.start()
        box.proc = SandboxProcess(proc)

    def start(self) -> LocalRuntime:
        for spec in self.specs:
            n = self.concurrency.get(spec.name, 1 if spec.schedule_s else spec.concurrency)
            for slot in range(n):
                box = Sandbox(spec, slot)
                self._spawn(box)
                self.sandboxes.append(box)
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="sandbox-supervisor")
        self._thread.start()
        return self

    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            for box in self.sandboxes:
                if box.proc is not None and box.proc.poll() is not None and not self._stop.is_set():
                    box.restarts += 1  # crashed, killed or timed out: Lambda starts a new sandbox
                    self._spawn(box)

    def scale(self, name: str, n: int) -> None:
        """Add sandboxes for function `name` until it has `n` (tests use it to start workers late)."""
        spec = next(s for s in self.specs if s.name == name)
        have = [b for b in self.sandboxes if b.spec.name == name]
        for slot in range(len(have), n):
            box = Sandbox(spec, slot)
            self._spawn(box)
            self.sandboxes.append(box)

    def pids(self, name: str) -> list[int]:
        return [b.proc.pid for b in self.sandboxes if b.spec.name == name and b.proc and b.proc.poll() is None]

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        for box in self.sandboxes:
            if box.proc and box.proc.poll() is None:
                try:
                    os.killpg(box.proc.pid, signal.SIGCONT)
                    box.proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.time() + timeout
        for box in self.sandboxes:
            if box.proc:
                try:
                    box.proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    box.proc.kill()
                    box.proc.wait()
