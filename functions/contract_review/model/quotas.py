"""The model's Bedrock quotas, as Service Quotas names them: what the sweeper reads and publishes for the workers to
pace to (`published`; adapters/published_quotas.py), and what `review preflight` prints.

Service Quotas has no model-id dimension and the quota codes differ per model and region, so quotas are
found by name (no code is hard-coded). Bedrock's current names (Service Quotas console, service "Amazon
Bedrock"), with the older "... model inference ..." spelling still matched:
- "On-demand InvokeModel tokens per minute for <model>" (a foundation-model id),
- "Cross-Region InvokeModel tokens per minute for <model>" (a geographic inference profile: us., eu., ...),
- "Global Cross-Region InvokeModel tokens per minute for <model>" (a global. profile; the cross-region row
  when there is none),
- "Model invocation max tokens per day for <model>", and the account-wide "Cross-Model Max Tokens Per Day".
`<model>` is the model's display name ("Anthropic Claude Sonnet 4.6", from GetFoundationModel). Requests-per-
minute rows are still listed by preflight, but Bedrock no longer enforces them on bedrock-runtime: the
workers pace by tokens. ListServiceQuotas leaves out quotas with no applied value, so AWS's defaults
(ListAWSDefaultServiceQuotas) fill what is missing.

Batch inference (docs/batch-inference.md): "Minimum number of records per batch inference job" (per model,
"... for <model>", or one row for the account), read by `read_batch_quota`. ListFoundationModels cannot say whether a
model is offered in batch (its `inferenceTypesSupported` enum is ON_DEMAND | PROVISIONED only), so a batch quota
named for the model in the region is taken as the sign that it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from contract_review.domain.control_records import PublishedQuotas
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, is_inference_profile

SERVICE_CODE = "bedrock"
What = Literal["tokens_per_minute", "requests_per_minute", "tokens_per_day", "account_tokens_per_day",
               "batch_min_records"]

_PER_MINUTE = {  # (kind) -> the name prefixes of its per-minute rows, newest spelling first; {per}: tokens|requests
    "on-demand": ("on-demand invokemodel {per} per minute for ", "on-demand model inference {per} per minute for "),
    "cross-region": ("cross-region invokemodel {per} per minute for ",
                     "cross-region model inference {per} per minute for "),
    "global cross-region": ("global cross-region invokemodel {per} per minute for ",
                            "global cross-region model inference {per} per minute for "),
}
_PER_DAY = ("model invocation max tokens per day for ",)
_ACCOUNT_PER_DAY = "cross-model max tokens per day"


@dataclass(frozen=True)
class QuotaRow:
    what: What
    name: str
    code: str
    value: float
    adjustable: bool
    source: str  # "applied" (this account) | "AWS default"


@dataclass(frozen=True)
class ModelQuotas:
    model_id: str
    kind: str  # on-demand | cross-region | global cross-region
    rows: tuple[QuotaRow, ...]

    def value(self, what: What) -> float | None:
        return next((r.value for r in self.rows if r.what == what), None)

    @property
    def tokens_per_minute(self) -> float | None:
        return self.value("tokens_per_minute")


def quota_kind(model_id: str) -> str:
    """Which Service Quotas family throttles calls to `model_id`."""
    if model_id.startswith(GLOBAL_PROFILE_PREFIX):
        return "global cross-region"
    return "cross-region" if is_inference_profile(model_id) else "on-demand"


def _normalized(label: str) -> str:
    """A quota's model label, comparable to the model's name: case, a trailing note in parentheses and a
    trailing " V1" ignored (not " v2": "Claude 3.5 Sonnet v2" is another model than "Claude 3.5 Sonnet")."""
    label = label.split(" (", 1)[0] if label.rstrip().endswith(")") else label
    words = label.lower().split()
    if len(words) > 1 and words[-1] == "v1":  # "V1" is the model's first version; a "v2" is another model
        words = words[:-1]
    return " ".join(words)


def _what(name: str, kind: str, model: str) -> What | None:
    lower = name.lower()
    if lower == _ACCOUNT_PER_DAY:
        return "account_tokens_per_day"
    for prefix in _PER_DAY:
        if lower.startswith(prefix) and _normalized(name[len(prefix):]) == model:
            return "tokens_per_day"
    per_minute: tuple[tuple[str, What], ...] = (("tokens", "tokens_per_minute"), ("requests", "requests_per_minute"))
    for per, what in per_minute:
        for pattern in _PER_MINUTE[kind]:
            prefix = pattern.format(per=per)
            if lower.startswith(prefix) and _normalized(name[len(prefix):]) == model:
                return what
    return None


def match_model_quotas(quotas: Iterable[dict[str, Any]], model_id: str, display_name: str,
                       source: str) -> list[QuotaRow]:
    """The rows of one model (and the account-wide daily one) among Service Quotas' `Quotas` items. A
    global profile's per-minute rows fall back to the cross-region ones. Variants such as "... 1M Context
    Length" are other quotas and are not matched."""
    items = list(quotas)
    model, kind = _normalized(display_name), quota_kind(model_id)
    found = _rows(items, kind, model, source)
    if kind == "global cross-region":  # a per-minute row the global family lacks: the cross-region one
        have = {r.what for r in found}
        found += [r for r in _rows(items, "cross-region", model, source)
                  if r.what.endswith("per_minute") and r.what not in have]
    return found


def _rows(items: list[dict[str, Any]], kind: str, model: str, source: str) -> list[QuotaRow]:
    out: list[QuotaRow] = []
    for q in items:
        name = str(q.get("QuotaName", ""))
        what = _what(name, kind, model)
        if what is not None and what not in {r.what for r in out}:
            out.append(QuotaRow(what=what, name=name, code=str(q.get("QuotaCode", "")), value=float(q.get("Value", 0.0)),
                                adjustable=bool(q.get("Adjustable")), source=source))
    return out


def _paginate(client: Any, operation: str) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(operation).paginate(ServiceCode=SERVICE_CODE):
        yield from page.get("Quotas", [])


def read_model_quotas(client: Any, model_id: str, display_name: str) -> ModelQuotas:
    """The model's quotas from a service-quotas client: this account's applied values, AWS's defaults for
    what has none. Raises what the client raises (the caller decides what an unreadable quota means)."""
    found = match_model_quotas(_paginate(client, "list_service_quotas"), model_id, display_name, "applied")
    wanted: set[What] = {"tokens_per_minute", "requests_per_minute", "tokens_per_day", "account_tokens_per_day"}
    missing = wanted - {r.what for r in found}
    if missing:
        defaults = match_model_quotas(_paginate(client, "list_aws_default_service_quotas"), model_id, display_name,
                                      "AWS default")
        found += [r for r in defaults if r.what in missing]
    order = ("tokens_per_minute", "requests_per_minute", "tokens_per_day", "account_tokens_per_day")
    return ModelQuotas(model_id=model_id, kind=quota_kind(model_id),
                       rows=tuple(sorted(found, key=lambda r: order.index(r.what))))


BATCH_MIN_RECORDS = "minimum number of records per batch inference job"


def match_batch_quota(quotas: Iterable[dict[str, Any]], display_name: str, source: str) -> QuotaRow | None:
    """The "Minimum number of records per batch inference job" row for the model (`... for <model>`), else the
    account-wide one (no model in its name), among Service Quotas' `Quotas` items; None when neither is there."""
    model = _normalized(display_name)
    general: QuotaRow | None = None
    for q in quotas:
        name = str(q.get("QuotaName", ""))
        lower = name.lower()
        if not lower.startswith(BATCH_MIN_RECORDS):
            continue
        rest = name[len(BATCH_MIN_RECORDS):]
        row = QuotaRow(what="batch_min_records", name=name, code=str(q.get("QuotaCode", "")),
                       value=float(q.get("Value", 0.0)), adjustable=bool(q.get("Adjustable")), source=source)
        if rest.lower().startswith(" for ") and _normalized(rest[len(" for "):]) == model:
            return row
        if not rest.strip():
            general = general or row
    return general


def read_batch_quota(client: Any, display_name: str) -> QuotaRow | None:
    """The model's minimum records per batch job: this account's applied value, else AWS's default. Raises what the
    client raises."""
    found = match_batch_quota(_paginate(client, "list_service_quotas"), display_name, "applied")
    if found is None:
        found = match_batch_quota(_paginate(client, "list_aws_default_service_quotas"), display_name, "AWS default")
    return found


def published(quotas: ModelQuotas, display_name: str, read_at: float, by: str = "sweeper") -> PublishedQuotas:
    """What the sweeper publishes for the workers (records.PublishedQuotas): the model's tokens-per-minute and daily
    token quotas, each with the name of its row and where its value came from, or None and why not."""
    def row(what: What, label: str) -> tuple[float | None, str]:
        found = next((r for r in quotas.rows if r.what == what), None)
        if found is None:
            return None, f"no {quotas.kind} {label} quota named for {display_name!r} in Service Quotas"
        return found.value, f"Service Quotas: {found.name} ({found.source})"
    tpm, tpm_quota = row("tokens_per_minute", "tokens-per-minute")
    tpd, tpd_quota = row("tokens_per_day", "daily tokens")
    return PublishedQuotas(model_id=quotas.model_id, tokens_per_minute=tpm, tokens_per_minute_quota=tpm_quota,
                           tokens_per_day=tpd, tokens_per_day_quota=tpd_quota, read_at=read_at, by=by)
