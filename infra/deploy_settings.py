"""What one synth needs beyond the profile: read from CDK context, validated once."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from contract_review.config.catalogue import refused_id
from contract_review.config.constants import ESM_MAX_CONCURRENCY, ONE_AT_A_TIME_FUNCTIONS, POWERTOOLS_LAYER_VERSION
from contract_review.config.fleet import CALL_LATENCY_S, MAX_WORKERS, MIN_WORKERS, fleet_for_quota
from contract_review.config.profile import Profile, get_profile
from contract_review.config.settings import ticket_url_problem
from contract_review.domain.keys import UPLOADS_PREFIX
from contract_review.domain.principals import PRINCIPAL_UPLOADS_PREFIX
from contract_review.doubles.spec import FaultSpec

from .queues import max_name_prefix

DEFAULT_STACK_NAME = "ContractReview"
# The monthly cost budget's default (USD): ~1,000 contracts of 100 KB a month of model tokens (docs/cost.md) plus
# headroom; `-c monthly_budget_usd=N` sets it, `none` deploys without one.
DEFAULT_MONTHLY_BUDGET_USD = 5000.0
WorkerKind = Literal["lambda", "fargate"]
ModelProvider = Literal["offline", "bedrock", "simulated"]

# Powertools for AWS Lambda (Python) v3 public layer, python3.12 / arm64: CloudFormation reads its
# ARN at deploy time from the public SSM parameter /aws/service/powertools/python/arm64/python3.12/
# <version> (infra/functions.py; `review preflight` checks it exists in the region). The default is the release
# pinned in requirements.txt (a test keeps them equal), so the layer runs the library the tests and the Fargate
# image run; `-c powertools_version=latest` follows the newest release instead. (config/constants.py holds it, so
# `review preflight` names the same parameter without importing the CDK app.)
POWERTOOLS_VERSION = POWERTOOLS_LAYER_VERSION

# CloudFormation stack names allow 128 characters, but every queue is named `<stack>-<purpose>...`
# and SQS allows 80: the longest, `<stack>-results-dlq.fifo`, leaves 63 for the stack name.
MAX_STACK_NAME = max_name_prefix()
_STACK_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
_POWERTOOLS_VERSION_RE = re.compile(r"^(latest|\d+\.\d+\.\d+)$")
_QUEUE_UPLOADS_RE = re.compile(r"^uploads/([A-Za-z0-9!_.*'()-]+/)*$")
_SECRET_ARN_RE = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+$")
_SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")  # Secrets Manager's characters for a secret name
_SECRET_SUFFIX_RE = re.compile(r"-[A-Za-z0-9]{6}$")  # what Secrets Manager appends to a secret's name in its ARN
_KMS_KEY_ARN_RE = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# An image reference pinned by its digest (`python:3.12-slim@sha256:<64 hex>`, or a mirror's in your own ECR): what
# `-c fargate_base_image` takes, so the Fargate image is built FROM exactly the bytes that were resolved and reviewed
_DIGEST_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
# A Bedrock foundation-model id (anthropic.claude-sonnet-4-6, amazon.nova-pro-v1:0) or a cross-region
# inference profile id (global.anthropic.claude-sonnet-4-6); ARNs are not taken (the grants are built from ids).
_MODEL_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[A-Za-z0-9][A-Za-z0-9_.-]*)+(:[0-9A-Za-z]+)*$")


class DeploySettingsError(ValueError):
    """A deploy option (`-c NAME=...`) that cannot be deployed: the message says which and what it takes."""


NO_ALARM_EMAIL = "none"  # `-c alarm_email=none`: no email subscriber, on purpose (subscribe AlarmTopicArn yourself)


@dataclass(frozen=True)
class DeploySettings:
    profile: Profile
    stack_name: str = DEFAULT_STACK_NAME
    worker_kind: WorkerKind = "lambda"
    model_provider: ModelProvider = "bedrock"
    powertools_version: str = POWERTOOLS_VERSION
    # `-c alarm_email=...`: subscribed to the alarm topic (confirm the email AWS sends); `none`: no subscriber, said
    # explicitly (a kept stack must name one or the other: `require_alarm_destination`)
    alarm_email: str = ""
    fault_spec: FaultSpec | None = None
    auto_delete_objects: bool = False
    # The Bedrock model or inference profile id (`-c model_id=...`); empty: the profile's model_id.
    model_id: str = ""
    # Other models the workers are granted (`-c model_fallbacks=ID,ID`): a job keeps the model it was submitted on,
    # so after a redeploy with another model_id the jobs in flight on the old one finish on it only if it is here.
    model_fallbacks: tuple[str, ...] = ()
    # The external ticket system's base URL (`-c ticket_url=https://...`): the saga opens a review ticket there
    # for high-risk findings. Empty: the ticket step is skipped, with an event saying so.
    ticket_url: str = ""
    # The Secrets Manager secret holding the ticket system's credentials (`-c ticket_secret_arn=ARN`; JSON
    # `{"bearer_token": ...}` or `{"header": ..., "value": ...}`, adapters/tickets.py): the functions that call the
    # ticket system may read exactly this secret. A complete ARN (ending in Secrets Manager's 6-character suffix)
    # is granted as is; an ARN without the suffix as `ARN-??????` (the one secret of that name); a bare secret name
    # as that name's secret in the stack's own account and region (the template stays environment-agnostic).
    ticket_secret_arn: str = ""
    # The customer-managed KMS key the secret is encrypted with (`-c ticket_secret_kms_key=KEY_ARN`), if any: the
    # same functions may decrypt with it through Secrets Manager only. None needed for the AWS-managed key.
    ticket_secret_kms_key: str = ""
    # The model's tokens-per-minute quota the workers pace to (`-c model_tpm=N`): when not given, each worker
    # process reads it from Service Quotas at cold start (the stack grants that read), so pacing is on either way.
    model_tpm: float | None = None
    # The worker fleet (`-c worker_concurrency=W`); None: sized to `model_tpm` when given (config/fleet.py, at
    # `call_latency_s` a call), else the profile's. The fan-out window follows at twice the fleet.
    worker_concurrency: int | None = None
    call_latency_s: float = CALL_LATENCY_S
    # Where senders to the intake queue may put the documents they name by s3_uri (`-c queue_uploads_prefix=
    # uploads/queue/`): any key under it, never under `uploads/principals/` (the Job API callers' own uploads).
    queue_uploads_prefix: str = UPLOADS_PREFIX
    # The intake mapping's MaximumConcurrency (`-c intake_max_concurrency=N`, 2..1000); None: the profile's.
    intake_max_concurrency: int | None = None
    # The worker function's reserved concurrency (`-c worker_reserved_concurrency=N`); None: its maximum (the
    # mapping's MaximumConcurrency, `worker_max_concurrency`), so the worker always has its fleet and never takes
    # more; 0: no reservation (an account with too little concurrency to spare; docs/infrastructure.md).
    worker_reserved_concurrency: int | None = None
    # Spend limits changed from the profile's (`-c default_budget_usd=N`, `-c principal_daily_spend_usd=N`,
    # `-c api_requests_per_minute=N`; `none` turns one off): the functions' profile and the CLI's follow them.
    limit_overrides: dict[str, float | None] = field(default_factory=dict)
    # The monthly AWS Budgets cost budget on the stack's `review-stack` tag (`-c monthly_budget_usd=N`, `none`: no
    # budget); None: DEFAULT_MONTHLY_BUDGET_USD, except on the local stack (moto has no AWS Budgets).
    monthly_budget_usd: float | None = None
    # The Fargate image's base (`-c fargate_base_image=python:3.12-slim@sha256:...`, docs/infrastructure.md "The Fargate
    # worker" resolves it): passed to functions/Dockerfile as its BASE_IMAGE build argument. Empty: the Dockerfile's
    # default, the `python:3.12-slim` tag, which moves with every rebuild of that image (not pinned).
    fargate_base_image: str = ""

    def __post_init__(self) -> None:
        if not self.model_id:
            object.__setattr__(self, "model_id", self.profile.review.model_id)  # frozen: resolved once, here
        if self.worker_concurrency is not None and not MIN_WORKERS <= self.worker_concurrency <= MAX_WORKERS:
            raise DeploySettingsError(f"worker_concurrency {self.worker_concurrency}: within {MIN_WORKERS}..{MAX_WORKERS}")
        if not 0 < self.call_latency_s <= 900:
            raise DeploySettingsError(f"call_latency_s {self.call_latency_s}: seconds a model call takes, such as 5")
        overrides = self.fleet_overrides
        if overrides:  # the stack, the workers (PROFILE_OVERRIDES) and the pacers all see the sized fleet
            object.__setattr__(self, "profile", self.profile.with_overrides(**overrides))
        self._apply_concurrency()
        self._apply_limits()
        self._check_models()
        if not _STACK_NAME_RE.match(self.stack_name) or len(self.stack_name) > MAX_STACK_NAME:
            raise DeploySettingsError(f"stack_name {self.stack_name!r}: letters, digits and '-', letter first, at most "
                                      f"{MAX_STACK_NAME} characters (queue names `<stack>-results-dlq.fifo` are limited to 80)")
        if not _POWERTOOLS_VERSION_RE.match(self.powertools_version):
            raise DeploySettingsError(f"powertools_version {self.powertools_version!r}: a release such as "
                                      f"{POWERTOOLS_VERSION!r}, or 'latest'")
        if self.alarm_email not in ("", NO_ALARM_EMAIL) and not _EMAIL_RE.match(self.alarm_email):
            raise DeploySettingsError(f"alarm_email {self.alarm_email!r} is not an email address")
        if self.worker_kind not in ("lambda", "fargate"):
            raise DeploySettingsError(f"worker must be 'lambda' or 'fargate', not {self.worker_kind!r}")
        if self.model_provider not in ("offline", "bedrock", "simulated"):
            raise DeploySettingsError(f"model_provider must be 'offline', 'bedrock' or 'simulated' (the strict simulated "
                                      f"Bedrock, tests and demos only), not {self.model_provider!r}")
        if self.model_provider == "simulated" and self.profile.name == "prod":
            raise DeploySettingsError("model_provider 'simulated' (the strict simulated Bedrock) is for demos and "
                                      "tests only; never in the prod profile")
        if self.fault_spec is not None and self.profile.name == "prod":
            raise DeploySettingsError("fault_spec is for demos and tests only; never in the prod profile")
        self._check_tickets()
        if self.model_tpm is not None and not 0 < self.model_tpm <= 1e9:
            raise DeploySettingsError(f"model_tpm {self.model_tpm!r}: the model's tokens-per-minute quota, such as 2000000")
        self._check_uploads()
        self._check_base_image()
        if self.auto_delete_objects and not self.is_disposable:
            raise DeploySettingsError("auto_delete_objects is only allowed for the local profile")

    def _check_models(self) -> None:
        """`model_id` and each of `model_fallbacks`: a Bedrock id (not an ARN) with a catalogue row, each once."""
        if not _MODEL_ID_RE.match(self.model_id):
            raise DeploySettingsError(f"model_id {self.model_id!r}: a Bedrock model id or inference profile id, such as "
                                      f"{self.profile.review.model_id!r} (not an ARN)")
        for model_id in (self.model_id, *self.model_fallbacks):
            if not _MODEL_ID_RE.match(model_id):
                raise DeploySettingsError(f"model_fallbacks: {model_id!r} is not a Bedrock model or inference profile id")
            refused = refused_id(model_id)
            if refused is not None:
                raise DeploySettingsError(refused)
        if self.model_id in self.model_fallbacks or len(set(self.model_fallbacks)) < len(self.model_fallbacks):
            raise DeploySettingsError(f"model_fallbacks {','.join(self.model_fallbacks)}: each model once, and not "
                                      f"model_id {self.model_id} itself")

    def _check_uploads(self) -> None:
        prefix = self.queue_uploads_prefix
        if not _QUEUE_UPLOADS_RE.match(prefix) or prefix.startswith(PRINCIPAL_UPLOADS_PREFIX):
            raise DeploySettingsError(f"queue_uploads_prefix {prefix!r}: {UPLOADS_PREFIX} or a folder under it ending in '/', "
                                      f"such as uploads/queue/ (not under {PRINCIPAL_UPLOADS_PREFIX})")

    def _check_base_image(self) -> None:
        image = self.fargate_base_image
        if image and self.worker_kind != "fargate":
            raise DeploySettingsError("fargate_base_image is the Fargate worker's base image: give -c worker=fargate too")
        if image and not _DIGEST_IMAGE_RE.match(image):
            raise DeploySettingsError(f"fargate_base_image {image!r}: an image pinned by digest, such as "
                                      "python:3.12-slim@sha256:<64 hex digits> (docker buildx imagetools inspect "
                                      "python:3.12-slim prints it)")

    def _apply_limits(self) -> None:
        """The spend limits given into the profile; the monthly budget's default (none on the local stack)."""
        if self.limit_overrides:
            object.__setattr__(self, "profile", self.profile.with_overrides(**self.limit_overrides))
        if self.monthly_budget_usd is None and not self.is_disposable:
            object.__setattr__(self, "monthly_budget_usd", DEFAULT_MONTHLY_BUDGET_USD)

    def _apply_concurrency(self) -> None:
        """`-c intake_max_concurrency` into the profile (which checks 2..1000); `-c worker_reserved_concurrency`: 0, or
        at least the worker's maximum concurrency (less would throttle its own mapping)."""
        if self.intake_max_concurrency is not None:
            object.__setattr__(self, "profile", self.profile.with_overrides(
                intake_max_concurrency=self.intake_max_concurrency))
        workers = self.profile.functions.worker_max_concurrency
        reserved = self.worker_reserved_concurrency
        if reserved is not None and reserved != 0 and not workers <= reserved <= ESM_MAX_CONCURRENCY:
            raise DeploySettingsError(f"worker_reserved_concurrency {reserved}: 0 (none) or within {workers}..{ESM_MAX_CONCURRENCY}"
                                      f" (at least the worker's maximum concurrency {workers}: the mapping would be throttled)")

    def _check_tickets(self) -> None:
        """`https://` (http only to loopback), and a secret ARN (and its KMS key) only with a ticket system."""
        problem = ticket_url_problem(self.ticket_url) if self.ticket_url else None
        if problem:
            raise DeploySettingsError(problem)
        if self.ticket_secret_arn and not self.ticket_url:
            raise DeploySettingsError("ticket_secret_arn is the ticket system's credentials: give ticket_url too")
        secret = self.ticket_secret_arn
        if secret and not (_SECRET_ARN_RE.match(secret) or _SECRET_NAME_RE.match(secret)):
            raise DeploySettingsError(f"ticket_secret_arn {secret!r}: a Secrets Manager secret ARN such as "
                                      "arn:aws:secretsmanager:eu-west-1:123456789012:secret:contract-review/tickets-AbCdEf, or "
                                      "the secret's name in the stack's account and region")
        if self.ticket_secret_kms_key and not self.ticket_secret_arn:
            raise DeploySettingsError("ticket_secret_kms_key is the key of the ticket secret: give ticket_secret_arn too")
        if self.ticket_secret_kms_key and not _KMS_KEY_ARN_RE.match(self.ticket_secret_kms_key):
            raise DeploySettingsError(f"ticket_secret_kms_key {self.ticket_secret_kms_key!r}: a KMS key ARN such as "
                                      "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab")

    @property
    def fleet_overrides(self) -> dict[str, int]:
        """The profile fields the fleet sizing changes (empty: the profile's numbers stand)."""
        if self.worker_concurrency is not None:
            workers = self.worker_concurrency
        elif self.model_tpm is not None:
            workers = fleet_for_quota(self.model_tpm, self.call_latency_s).workers
        else:
            return {}
        window = 2 * workers
        return {"worker_max_concurrency": workers, "fanout_window": window,
                "fanout_page": min(self.profile.fanout.fanout_page, window)}

    @property
    def profile_overrides(self) -> dict[str, object]:
        """Every profile field this deploy changes (the functions' PROFILE_OVERRIDES, the ProfileOverrides output)."""
        return {**self.fleet_overrides, **self.limit_overrides}

    @property
    def ticket_secret_resource(self) -> str:
        """The resource `secretsmanager:GetSecretValue` is granted on: a complete ARN as given, `ARN-??????` for one
        given without its suffix (AWS's form for "this secret, whatever suffix it was created with"), `NAME-??????`
        for a bare name (the stack builds the ARN around it in its own account and region)."""
        secret = self.ticket_secret_arn
        if not secret or (secret.startswith("arn:") and _SECRET_SUFFIX_RE.search(secret)):
            return secret
        return secret + "-??????"

    @property
    def reserved_concurrency(self) -> dict[str, int]:
        """Function service -> its reserved concurrency (what the stack takes out of the account's pool). The sweeper
        and the batch collector reserve 1 each: one run at a time (ONE_AT_A_TIME_FUNCTIONS). The Lambda worker reserves
        its maximum unless told otherwise; a Fargate stack's worker function has no mapping, so it reserves nothing."""
        one_at_a_time = dict.fromkeys(ONE_AT_A_TIME_FUNCTIONS, 1)
        if self.worker_kind != "lambda":
            return one_at_a_time
        reserved = self.worker_reserved_concurrency
        if reserved is None:
            reserved = self.profile.functions.worker_max_concurrency
        return {"worker": reserved, **one_at_a_time} if reserved else one_at_a_time

    @property
    def alarm_subscriber(self) -> str:
        """The address the alarm topic emails; empty: none."""
        return "" if self.alarm_email == NO_ALARM_EMAIL else self.alarm_email

    def require_alarm_destination(self) -> None:
        """A kept (prod) stack's alarms must reach a person: refuse a deploy that names no alarm address and does not
        say `none` either (the synth entry calls it; a stack's alarms otherwise notify a topic nobody reads)."""
        if not self.is_disposable and not self.alarm_email:
            raise DeploySettingsError(
                "alarm_email: the prod profile's alarms would reach nobody. Deploy with -c alarm_email=you@example.com "
                "(or put \"alarm_email\" in cdk.json's context once), or -c alarm_email=none to subscribe the "
                "AlarmTopicArn output yourself")

    @property
    def is_disposable(self) -> bool:
        """Local deployments are thrown away (DESTROY); everything else keeps its data (RETAIN)."""
        return self.profile.name == "local"

    @classmethod
    def from_context(cls, get: Any) -> DeploySettings:
        """Build from CDK context; `get` is `node.try_get_context`. Values from `-c` arrive as strings."""
        profile = get_profile(str(get("profile") or "prod"))
        provider = get("model_provider") or ("offline" if profile.name == "local" else "bedrock")
        fault = get("fault_spec")
        return cls(
            profile=profile,
            stack_name=str(get("stack_name") or DEFAULT_STACK_NAME),
            # checked in __post_init__, with a message naming the allowed values
            worker_kind=cast(WorkerKind, str(get("worker") or "lambda")),
            fargate_base_image=str(get("fargate_base_image") or "").strip(),
            model_provider=cast(ModelProvider, str(provider)),
            powertools_version=str(get("powertools_version") or POWERTOOLS_VERSION).strip(),
            alarm_email=str(get("alarm_email") or "").strip(),
            fault_spec=FaultSpec.model_validate_json(fault if isinstance(fault, str) else json.dumps(fault)) if fault else None,
            auto_delete_objects=_truthy(get("auto_delete_objects")),
            model_id=str(get("model_id") or "").strip(),
            model_fallbacks=tuple(m.strip() for m in str(get("model_fallbacks") or "").split(",") if m.strip()),
            ticket_url=str(get("ticket_url") or "").strip(),
            ticket_secret_arn=str(get("ticket_secret_arn") or "").strip(),
            ticket_secret_kms_key=str(get("ticket_secret_kms_key") or "").strip(),
            model_tpm=_number(get("model_tpm"), "model_tpm"),
            worker_concurrency=_whole(get("worker_concurrency"), "worker_concurrency"),
            call_latency_s=_number(get("call_latency_s"), "call_latency_s") or CALL_LATENCY_S,
            queue_uploads_prefix=str(get("queue_uploads_prefix") or UPLOADS_PREFIX).strip(),
            intake_max_concurrency=_whole(get("intake_max_concurrency"), "intake_max_concurrency"),
            worker_reserved_concurrency=_whole(get("worker_reserved_concurrency"), "worker_reserved_concurrency"),
            limit_overrides={name: _limit(get(name), name) for name in LIMIT_OPTIONS if get(name) is not None},
            monthly_budget_usd=(0.0 if str(get("monthly_budget_usd")).strip().lower() == "none" else
                                _limit(get("monthly_budget_usd"), "monthly_budget_usd")) if get("monthly_budget_usd")
            is not None else None,
        )


LIMIT_OPTIONS = ("default_budget_usd", "principal_daily_spend_usd", "daily_spend_cap_usd", "api_requests_per_minute")


def _limit(value: Any, name: str) -> float | None:
    """A spend limit from `-c NAME=...`: a number, or `none` (that limit off)."""
    if str(value).strip().lower() == "none":
        return None
    number = _number(value, name)
    if number is None or number <= 0:
        raise DeploySettingsError(f"{name} {value!r}: a positive number, or none")
    return int(number) if name == "api_requests_per_minute" and number.is_integer() else number


def _number(value: Any, name: str) -> float | None:
    if value is None or str(value).strip() == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise DeploySettingsError(f"{name} {value!r}: a number") from None


def _whole(value: Any, name: str) -> int | None:
    number = _number(value, name)
    if number is not None and not number.is_integer():
        raise DeploySettingsError(f"{name} {value!r}: a whole number")
    return int(number) if number is not None else None


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on") if value is not None else False
