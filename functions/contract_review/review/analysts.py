"""The specialist analysts: the risk categories (`CATEGORIES`), the analysts that ask about them (`ANALYSTS`,
each a sequence of model calls), and the analysis identity their checkpoints are reused under.

An analyst runs two steps over one chunk:
1. `locate`: quote the clauses of the chunk that belong to its categories (verbatim);
2. `assess`: score each located clause (0-1 risk) with a one-line rationale.
Each step's output is validated against a schema; quotes must appear verbatim in the chunk
(their offsets are computed here, never trusted from the model). A failure to validate is a
semantic error (`model.output_invalid`); a refusal is a policy error (`model.refused`).

This file is the one place a category is added (docs/extending.md): its `Category`, and its key in
an analyst's `categories` (an existing analyst; or a new `AnalystSpec`, which the profiles'
`analyst_count` then counts). Everything else that counts or lists categories and analysts derives
them from `CATEGORIES` and `ANALYSTS`; the offline rule model needs the category's rules
(doubles/offline_model.py `PATTERNS`, `EXAMPLES`).

The analysis identity (`analyst_identity`): a checkpoint of an analyst's output is reused only under
the identity it was made with, derived from everything that shapes that output: the requests the
analyst sends, rendered by `build_request` itself for a fixed placeholder excerpt (system prompt and
step instructions with its categories' keys, titles and questions, the user-message template, the
output schemas, maxTokens, temperature) plus the model id and provider. A change to one category
re-runs the analysts that ask it and no other; nothing has to be remembered to bump.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract_review.config.settings import Settings
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.review.chunking import Chunk


@dataclass(frozen=True)
class Category:
    key: str
    title: str
    cuad: tuple[str, ...]  # CUAD v1 categories this maps onto (ground truth), may be empty
    question: str


CATEGORIES: tuple[Category, ...] = (
    Category("liability_cap", "Limitation of liability", ("Cap On Liability",),
             "Does a clause cap or exclude a party's liability or damages?"),
    Category("uncapped_liability", "Uncapped liability", ("Uncapped Liability",),
             "Is any liability carved out of the cap or stated to be unlimited?"),
    Category("indemnification", "Indemnification", (),
             "Who must indemnify, defend or hold harmless whom, and for what?"),
    Category("termination", "Termination rights", ("Termination For Convenience",),
             "Can a party terminate without cause or for convenience, and on what notice?"),
    Category("renewal", "Term and renewal", ("Renewal Term", "Notice Period To Terminate Renewal"),
             "Does the agreement renew automatically, and how is renewal prevented?"),
    Category("restrictive_covenants", "Exclusivity and restrictive covenants",
             ("Non-Compete", "Exclusivity", "No-Solicit Of Customers", "No-Solicit Of Employees"),
             "Does a party promise not to compete, solicit, or deal with others?"),
    Category("assignment", "Assignment and change of control", ("Anti-Assignment", "Change Of Control"),
             "May a party assign the agreement, and what happens on a change of control?"),
    Category("ip_ownership", "Intellectual property ownership", ("Ip Ownership Assignment", "Joint Ip Ownership"),
             "Who owns intellectual property created under the agreement?"),
    Category("license_grant", "License grant", ("License Grant", "Non-Transferable License",
                                                "Irrevocable Or Perpetual License"),
             "What license is granted, to whom, and on what terms?"),
    Category("governing_law", "Governing law and disputes", ("Governing Law",),
             "Which law governs and where are disputes resolved?"),
    Category("audit_rights", "Audit and inspection rights", ("Audit Rights",),
             "May a party audit or inspect the other's books, records or facilities?"),
    Category("commitments", "Minimum commitments and liquidated damages",
             ("Minimum Commitment", "Liquidated Damages"),
             "Is there a minimum purchase/volume commitment or a liquidated-damages amount?"),
)
CATEGORY_BY_KEY = {c.key: c for c in CATEGORIES}


@dataclass(frozen=True)
class AnalystSpec:
    name: str
    categories: tuple[str, ...]
    mandatory: bool  # coverage policy: a mandatory gap fails the job, an optional one is listed


ANALYSTS: tuple[AnalystSpec, ...] = (
    AnalystSpec("liability", ("liability_cap", "uncapped_liability"), True),
    AnalystSpec("indemnity", ("indemnification",), True),
    AnalystSpec("termination", ("termination",), True),
    AnalystSpec("renewal", ("renewal",), True),
    AnalystSpec("restrictive_covenants", ("restrictive_covenants",), True),
    AnalystSpec("assignment", ("assignment",), True),
    AnalystSpec("ip", ("ip_ownership",), True),
    AnalystSpec("licensing", ("license_grant",), False),
    AnalystSpec("disputes", ("governing_law",), False),
    AnalystSpec("audit", ("audit_rights",), False),
    AnalystSpec("commercial", ("commitments",), False),
)
STEPS = ("locate", "assess")


def analysts_for(count: int) -> tuple[AnalystSpec, ...]:
    if not 1 <= count <= len(ANALYSTS):
        raise ValueError(f"analyst_count must be 1..{len(ANALYSTS)}")
    return ANALYSTS[:count]


# --- structured outputs -------------------------------------------------------------------
class Located(BaseModel):
    model_config = ConfigDict(extra="ignore")
    category: str
    quote: str = Field(min_length=1)


class LocateOutput(BaseModel):
    clauses: list[Located]


class Assessed(Located):
    score: float = Field(ge=0.0, le=1.0)
    rationale: str = Field(min_length=1, max_length=1000)


class AssessOutput(BaseModel):
    findings: list[Assessed]


class Finding(BaseModel):
    """A finding as stored in checkpoints and reports. Offsets are document offsets."""

    category: str
    score: float
    quote: str
    start: int
    end: int
    rationale: str
    analyst: str
    chunk_id: str
    chunk_index: int
    status: str = "ok"  # ok | refused


class ChunkFindings(BaseModel):
    """The findings artifact of one settled chunk (S3: `records.findings_key`)."""

    chunk_id: str
    chunk_index: int
    findings: list[Finding]


class AnalystOutput(BaseModel):
    analyst: str
    status: str  # ok | refused | failed
    findings: list[Finding]
    model_calls: int
    error_code: str | None = None


_SCHEMAS = {"locate": LocateOutput.model_json_schema(), "assess": AssessOutput.model_json_schema()}
SYSTEM = ("You are a meticulous contract lawyer reviewing one excerpt of a contract. Quote clauses "
          "verbatim, exactly as they appear, and answer only through the provided tool.")
TASKS = {
    "locate": ("List every clause in the excerpt that answers one of these questions. "
               "Quote each clause verbatim (a full sentence or sub-clause)."),
    "assess": ("For each located clause (listed after the excerpt), give a risk score from 0 (benign) to 1 "
               "(severe) for the reviewing party and a one-sentence rationale. Keep each quote unchanged."),
}
MAX_TOKENS = 2048  # each call's maxTokens
TEMPERATURE = 0.0  # each call's temperature


ParsedItems = list[Located]  # locate -> Located; assess -> Assessed (a Located with a score)


def categories_of(spec: AnalystSpec) -> tuple[Category, ...]:
    """The categories the analyst asks about, in its order."""
    return tuple(CATEGORY_BY_KEY[k] for k in spec.categories)


def _asked(categories: Sequence[Category]) -> list[dict[str, str]]:
    """What the model is told of each category: its key, title and question (not its CUAD mapping)."""
    return [{"key": c.key, "title": c.title, "question": c.question} for c in categories]


def build_request(spec: AnalystSpec, step: str, chunk: Chunk, prior: ParsedItems | None,
                  repair_hint: str | None) -> ModelRequest:
    cats = _asked(categories_of(spec))
    payload: dict[str, Any] = {"categories": cats, "chunk_text": chunk.text, "chunk_index": chunk.index}
    prompt = f"<excerpt>\n{chunk.text}\n</excerpt>"
    if step == "assess":
        clauses = [Located(category=p.category, quote=p.quote).model_dump() for p in prior or []]
        payload["clauses"] = clauses
        prompt += f"\n\nLocated clauses: {json.dumps(clauses)}"
    if repair_hint:
        payload["repair_hint"] = repair_hint
        prompt += f"\n\nYour previous answer was invalid: {repair_hint}\nAnswer again, valid this time."
    return ModelRequest(analyst=spec.name, step=step, system=instructions(spec, step), prompt=prompt,
                        payload=payload, output_schema=_SCHEMAS[step], chunk_id=chunk.chunk_id,
                        max_tokens=MAX_TOKENS, temperature=TEMPERATURE)


def instructions(spec: AnalystSpec, step: str) -> str:
    """The analyst's fixed instructions for one step, the same for every chunk of every document: the system
    prompt, sent as a cached prompt prefix (model/bedrock.py). Only the excerpt (and, to assess, the located
    clauses) follows in the user message."""
    return _instructions(SYSTEM, TASKS[step], categories_of(spec))


@functools.cache
def _instructions(system: str, task: str, categories: tuple[Category, ...]) -> str:
    """Cached by content, not by analyst: a category whose question changed renders anew."""
    return f"{system}\n\nCategories: {json.dumps(_asked(categories))}\n\nTask: {task}"


def parse_response(spec: AnalystSpec, step: str, chunk: Chunk, response: ModelResponse) -> ParsedItems:
    """Validate one step's answer; raise `model.refused` / `model.output_invalid` envelopes."""
    if response.stop_reason in ("content_filtered", "guardrail_intervened"):
        raise ReviewError.of("model.refused", f"stopReason={response.stop_reason}", step=f"{spec.name}.{step}")
    if response.stop_reason in ("max_tokens", "malformed_model_output", "malformed_tool_use"):
        raise ReviewError.of("model.output_invalid", f"stopReason={response.stop_reason}", step=f"{spec.name}.{step}")
    try:
        model = (LocateOutput if step == "locate" else AssessOutput).model_validate_json(response.text)
    except ValidationError as exc:
        raise ReviewError.of("model.output_invalid", _short(exc), step=f"{spec.name}.{step}") from exc
    items: ParsedItems = list(model.clauses) if isinstance(model, LocateOutput) else list(model.findings)
    for item in items:
        if item.category not in spec.categories:
            raise ReviewError.of("model.output_invalid", f"category {item.category!r} not asked for",
                                 step=f"{spec.name}.{step}")
        if item.quote not in chunk.text:
            raise ReviewError.of("model.output_invalid", "a quote is not verbatim from the excerpt",
                                 step=f"{spec.name}.{step}")
    return items


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['type']}" for e in exc.errors()[:5])


def to_findings(spec: AnalystSpec, chunk: Chunk, assessed: ParsedItems) -> list[Finding]:
    findings = []
    seen: set[tuple[str, int]] = set()
    for a in assessed:
        if not isinstance(a, Assessed):
            continue
        local = chunk.text.find(a.quote)
        key = (a.category, local)
        if key in seen:
            continue
        seen.add(key)
        start = chunk.start + local
        findings.append(Finding(category=a.category, score=round(a.score, 3), quote=a.quote,
                                start=start, end=start + len(a.quote), rationale=a.rationale,
                                analyst=spec.name, chunk_id=chunk.chunk_id, chunk_index=chunk.index))
    return findings


StepCaller = Callable[[Callable[[str | None], ModelRequest], Callable[[ModelResponse], ParsedItems]],
                      tuple[ParsedItems, int]]


def _build_step(spec: AnalystSpec, step: str, chunk: Chunk, prior: ParsedItems | None,
                hint: str | None) -> ModelRequest:
    return build_request(spec, step, chunk, prior, hint)


def run_analyst(spec: AnalystSpec, chunk: Chunk, call_step: StepCaller) -> AnalystOutput:
    """Run the analyst's steps. `call_step(build, parse)` owns retries; returns (parsed, calls)."""
    prior: ParsedItems | None = None
    calls = 0
    for step in STEPS:
        if step == "assess" and not prior:
            return AnalystOutput(analyst=spec.name, status="ok", findings=[], model_calls=calls)
        build = functools.partial(_build_step, spec, step, chunk, prior)
        parse = functools.partial(parse_response, spec, step, chunk)
        parsed, n = call_step(build, parse)
        calls += n
        prior = parsed
    return AnalystOutput(analyst=spec.name, status="ok", findings=to_findings(spec, chunk, prior or []),
                         model_calls=calls)


def refused_output(spec: AnalystSpec, chunk: Chunk, calls: int) -> AnalystOutput:
    """Policy fallback: the analyst records that it was refused rather than retrying."""
    return AnalystOutput(analyst=spec.name, status="refused", findings=[], model_calls=calls,
                         error_code="model.refused")


# --- the analysis identity -------------------------------------------------------------------
_PLACEHOLDER = "<the excerpt>"
_PLACEHOLDER_CHUNK = Chunk(index=0, chunk_id="analysis-identity", start=0, end=len(_PLACEHOLDER), text=_PLACEHOLDER)
_PLACEHOLDER_HINT = "<why the previous answer was invalid>"


def identity_material(spec: AnalystSpec, model_id: str, provider: str) -> dict[str, Any]:
    """Everything that shapes the analyst's output: the model (id and provider) and every request the analyst
    sends, rendered by `build_request` itself for a placeholder excerpt (each step, first answer and repair),
    so it cannot drift from what is sent: the system prompt (instructions and its categories' keys, titles and
    questions), the user-message template, the payload, the output schema, maxTokens and temperature. Not the
    categories' CUAD mapping nor whether the analyst is mandatory: they shape the report, not the output."""
    located = [Located(category=k, quote=_PLACEHOLDER) for k in spec.categories]
    rendered = [build_request(spec, step, _PLACEHOLDER_CHUNK, located if step == "assess" else None, hint)
                for step in STEPS for hint in (None, _PLACEHOLDER_HINT)]
    requests = [{f.name: getattr(r, f.name) for f in dataclasses.fields(r)} for r in rendered]  # every field
    return {"model_id": model_id, "provider": provider, "requests": requests}


def _digest(value: object) -> str:
    """16 hex digits of the SHA-256 of canonical JSON (sorted keys): the same in every process."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def analyst_identity(spec: AnalystSpec, model_id: str, provider: str) -> str:
    """The analyst's identity: what its checkpoints are stored under (`config_hash`) and reused only on."""
    return _digest(identity_material(spec, model_id, provider))


def analysis_identities(settings: Settings, specs: Sequence[AnalystSpec]) -> dict[str, str]:
    """Analyst name -> identity, under the settings' model (its effective model id and provider)."""
    return {s.name: analyst_identity(s, settings.effective_model_id, settings.model_provider) for s in specs}


def job_identity(identities: Mapping[str, str]) -> str:
    """A hash over analysts' identities (name -> identity): it changes when any of them does."""
    return _digest(dict(identities))


def job_config_hash(settings: Settings) -> str:
    """What a new job records as its `config_hash` (and its messages as `checkpoint_version`): `job_identity`
    over the analysts it will run, under the settings' model. For reporting and events; checkpoints are
    matched per analyst."""
    return job_identity(analysis_identities(settings, analysts_for(settings.profile.review.analyst_count)))
