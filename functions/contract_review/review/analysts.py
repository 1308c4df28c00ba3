"""The specialist analysts: the risk categories (`CATEGORIES`), the analysts that ask about them (`ANALYSTS`,
each a sequence of model calls), and the analysis identity their checkpoints are reused under.

An analyst runs two steps over one chunk:
1. `locate`: quote the clauses of the chunk that belong to its categories (verbatim);
2. `assess`: score each located clause (0-1 risk) with a one-line rationale.
Each step's output is validated against a schema; quotes must appear verbatim in the chunk
(their offsets are computed here, never trusted from the model). A failure to validate is a
semantic error (`model.output_invalid`); a refusal is a policy error (`model.refused`).

The prompt is laid out for Bedrock's prompt cache (domain/model.py `ModelRequest`): one tool for every
call, the shared instructions (every category, both steps) and the excerpt come first and are the same
for all of a chunk's calls, so they are one cached prefix per chunk; each analyst's categories and task,
and for `assess` the located clauses, follow the cache point.

This file is the one place a category is added (docs/extending.md): its `Category`, and its key in
an analyst's `categories` (an existing analyst; or a new `AnalystSpec`, which the profiles'
`analyst_count` then counts). Everything else that counts or lists categories and analysts derives
them from `CATEGORIES` and `ANALYSTS`; the offline rule model needs the category's rules
(doubles/offline_model.py `PATTERNS`, `EXAMPLES`).

The analysis identity (`analyst_identity`): a checkpoint of an analyst's output is reused only under
the identity it was made with, derived from everything that shapes that output: the requests the
analyst sends, rendered by `build_step` itself for a fixed placeholder excerpt (the shared instructions
read for its own categories' keys, titles and questions, its task, the output schema, maxTokens,
temperature) plus the model id and provider. A change to one category
re-runs the analysts that ask it and no other; nothing has to be remembered to bump.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract_review.config.settings import Settings
from contract_review.domain.errors import ErrorEnvelope, ReviewError
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
    """The findings artifact of one settled chunk (S3: `keys.findings_key`)."""

    chunk_id: str
    chunk_index: int
    findings: list[Finding]


class AnalystOutput(BaseModel):
    analyst: str
    status: str  # ok | refused | failed
    findings: list[Finding]
    model_calls: int
    error_code: str | None = None
    model_id: str = ""  # the model that answered it (a job that fell back runs on more than one); "": not recorded


class Answer(BaseModel):
    """The one tool every call answers through, whatever the analyst and the step: `clauses` to locate,
    `findings` to assess (each step's answer is then validated as LocateOutput / AssessOutput). One tool
    definition and one tool choice keep the cached prefix the same for all of a chunk's calls (a changed tool
    is a different prefix on Bedrock)."""

    clauses: list[Located] | None = Field(default=None, description="step locate: the clauses found")
    findings: list[Assessed] | None = Field(default=None, description="step assess: the located clauses, scored")


SCHEMA = Answer.model_json_schema()


def step_schemas() -> dict[str, dict[str, Any]]:
    """Each step's answer schema on its own (the layout before 2026-11-25 sent these as two tools)."""
    return {"locate": LocateOutput.model_json_schema(), "assess": AssessOutput.model_json_schema()}
SYSTEM = ("You are a meticulous contract lawyer reviewing one excerpt of a contract with a team of analysts, "
          "each answering for some of the categories below. Quote clauses verbatim, exactly as they appear in the "
          "excerpt, and answer only through the provided tool.")
TASKS = {
    "locate": ("List every clause in the excerpt that answers one of your categories' questions, in `clauses`. "
               "Quote each clause verbatim (a full sentence or sub-clause)."),
    "assess": ("For each located clause (listed below), give in `findings` a risk score from 0 (benign) to 1 "
               "(severe) for the reviewing party and a one-sentence rationale. Keep each quote unchanged."),
}
# Each step's maxTokens, sized to its answer (a locate answer is quotes only; an assessment adds a score and a
# rationale to each): Bedrock reserves maxTokens against the tokens-per-minute quota while a call runs. An
# answer that stops on max_tokens is asked again once with twice as many.
MAX_TOKENS = {"locate": 1024, "assess": 2048}
TEMPERATURE = 0.0  # each call's temperature


ParsedItems = list[Located]  # locate -> Located; assess -> Assessed (a Located with a score)


def categories_of(spec: AnalystSpec) -> tuple[Category, ...]:
    """The categories the analyst asks about, in its order."""
    return tuple(CATEGORY_BY_KEY[k] for k in spec.categories)


def _asked(categories: Sequence[Category]) -> list[dict[str, str]]:
    """What the model is told of each category: its key, title and question (not its CUAD mapping)."""
    return [{"key": c.key, "title": c.title, "question": c.question} for c in categories]


def build_request(spec: AnalystSpec, step: str, chunk: Chunk, prior: ParsedItems | None,
                  repair_hint: str | None, max_tokens: int | None = None) -> ModelRequest:
    """One call, laid out for the prompt cache (domain/model.py ModelRequest): the shared instructions and the
    excerpt first, the same for all of the chunk's calls; then this analyst's categories and task (and, to
    assess, the located clauses; a repair: why the last answer was invalid)."""
    cats = _asked(categories_of(spec))
    payload: dict[str, Any] = {"categories": cats, "chunk_text": chunk.text, "chunk_index": chunk.index}
    prompt = task_prompt(spec, step)
    if step == "assess":
        clauses = [Located(category=p.category, quote=p.quote).model_dump() for p in prior or []]
        payload["clauses"] = clauses
        prompt += f"\n\nLocated clauses: {json.dumps(clauses)}"
    if repair_hint:
        payload["repair_hint"] = repair_hint
        prompt += f"\n\nYour previous answer was invalid: {repair_hint}\nAnswer again, valid this time."
    return ModelRequest(analyst=spec.name, step=step, system=instructions(), context=excerpt(chunk), prompt=prompt,
                        payload=payload, output_schema=SCHEMA, chunk_id=chunk.chunk_id,
                        max_tokens=max_tokens or MAX_TOKENS[step], temperature=TEMPERATURE)


def excerpt(chunk: Chunk) -> str:
    """The shared context of all of a chunk's calls: the chunk's text in one block its text cannot close. The
    document is data: a text that holds something like the tag (`</excerpt>`, `< /EXCERPT`) would otherwise end
    the block early and go on as if it were instructions, so its block is named by the text's own digest,
    which the text does not contain. A text without it keeps the plain tag (the same prefix as before)."""
    tag = _excerpt_tag(chunk.text)
    return f"<{tag}>\n{chunk.text}\n</{tag}>"


_TAG_LIKE = re.compile(r"<\s*/?\s*excerpt", re.IGNORECASE)


def _excerpt_tag(text: str) -> str:
    if not _TAG_LIKE.search(text):
        return "excerpt"
    salt = 0
    while True:  # a text that holds its own digest is a SHA-256 preimage: the loop ends at once
        tag = f"excerpt-{hashlib.sha256(f'{salt}:{text}'.encode()).hexdigest()[:16]}"
        if tag not in text.lower():
            return tag
        salt += 1


def instructions() -> str:
    """The shared instructions, the same for every analyst, step and chunk: the system prompt, part of the
    cached prefix (model/bedrock.py). Every category and both steps are described here, so that the part of a
    call that differs by analyst (its categories, its task) can follow the cache point."""
    return _instructions(SYSTEM, tuple(TASKS.items()), CATEGORIES)


@functools.cache
def _instructions(system: str, tasks: tuple[tuple[str, str], ...], categories: tuple[Category, ...]) -> str:
    """Cached by content: a category whose question changed renders anew."""
    steps = "\n".join(f"- {step}: {task}" for step, task in tasks)
    return f"{system}\n\nCategories: {json.dumps(_asked(categories))}\n\nSteps:\n{steps}"


def task_prompt(spec: AnalystSpec, step: str) -> str:
    """This analyst's part, after the cache point: its categories and the step to do now."""
    return (f"You are the {spec.name} analyst. Your categories: {json.dumps(list(spec.categories))}.\n"
            f"Step {step}: {TASKS[step]}")


def parse_response(spec: AnalystSpec, step: str, chunk: Chunk, response: ModelResponse) -> ParsedItems:
    """Validate one step's answer; raise `model.refused` / `model.output_invalid` envelopes."""
    if response.stop_reason in ("content_filtered", "guardrail_intervened"):
        raise ReviewError.of("model.refused", f"stopReason={response.stop_reason}", step=f"{spec.name}.{step}")
    if response.stop_reason == "max_tokens":  # the answer was cut: asked again with more room (`build_step`)
        raise ReviewError.of("model.output_invalid", "stopReason=max_tokens", provider_code="max_tokens",
                             step=f"{spec.name}.{step}")
    if response.stop_reason in ("malformed_model_output", "malformed_tool_use"):
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


StepCaller = Callable[[Callable[[ErrorEnvelope | None], ModelRequest], Callable[[ModelResponse], ParsedItems]],
                      tuple[ParsedItems, int]]


def build_step(spec: AnalystSpec, step: str, chunk: Chunk, prior: ParsedItems | None,
               invalid: ErrorEnvelope | None) -> ModelRequest:
    """The step's request, or its one repair after an invalid answer (`invalid`): an answer cut at maxTokens is
    asked again with twice the room; any other gets the validation error fed back."""
    if invalid is not None and invalid.provider_code == "max_tokens":
        return build_request(spec, step, chunk, prior, None, max_tokens=2 * MAX_TOKENS[step])
    return build_request(spec, step, chunk, prior, invalid.message if invalid is not None else None)


def run_analyst(spec: AnalystSpec, chunk: Chunk, call_step: StepCaller) -> AnalystOutput:
    """Run the analyst's steps. `call_step(build, parse)` owns retries; returns (parsed, calls)."""
    prior: ParsedItems | None = None
    calls = 0
    for step in STEPS:
        if step == "assess" and not prior:
            return AnalystOutput(analyst=spec.name, status="ok", findings=[], model_calls=calls)
        build = functools.partial(build_step, spec, step, chunk, prior)
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
    sends, rendered by `build_step` itself for a placeholder excerpt (each step: first answer, repair, and the
    retry with more room), so it cannot drift from what is sent: the shared instructions, the analyst's task
    with its categories, the payload (its categories' keys, titles and questions), the output schema,
    maxTokens and temperature. One part is narrowed: the shared system prompt describes every category (so
    all of a chunk's calls share one cached prefix), but an analyst answers only for its own, so its identity
    takes the system prompt as rendered for its own categories: another analyst's question does not re-run it.
    Not the categories' CUAD mapping nor whether the analyst is mandatory: they shape the report, not the output."""
    located = [Located(category=k, quote=_PLACEHOLDER) for k in spec.categories]
    invalid = (None, ErrorEnvelope.of("model.output_invalid", _PLACEHOLDER_HINT),
               ErrorEnvelope.of("model.output_invalid", "stopReason=max_tokens", provider_code="max_tokens"))
    rendered = [build_step(spec, step, _PLACEHOLDER_CHUNK, located if step == "assess" else None, previous)
                for step in STEPS for previous in invalid]
    own = own_instructions(spec)
    requests = [{**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}, "system": own} for r in rendered]
    return {"model_id": model_id, "provider": provider, "requests": requests}


def own_instructions(spec: AnalystSpec) -> str:
    """The shared instructions as they would read for this analyst's categories alone (its identity's view)."""
    return _instructions(SYSTEM, tuple(TASKS.items()), categories_of(spec))


def _digest(value: object) -> str:
    """16 hex digits of the SHA-256 of canonical JSON (sorted keys): the same in every process."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def analyst_identity(spec: AnalystSpec, model_id: str, provider: str) -> str:
    """The analyst's identity: what its checkpoints are stored under (`config_hash`) and reused only on."""
    return _digest(identity_material(spec, model_id, provider))


def analysis_identities(settings: Settings, specs: Sequence[AnalystSpec], model_id: str = "") -> dict[str, str]:
    """Analyst name -> identity, under `model_id` (the model the analysts run on: a job's; "": the settings' effective
    model) and the settings' provider."""
    return {s.name: analyst_identity(s, model_id or settings.effective_model_id, settings.model_provider)
            for s in specs}


def job_identity(identities: Mapping[str, str]) -> str:
    """A hash over analysts' identities (name -> identity): it changes when any of them does."""
    return _digest(dict(identities))


def job_config_hash(settings: Settings, model_id: str = "") -> str:
    """What a new job records as its `config_hash` (and its messages as `checkpoint_version`): `job_identity`
    over the analysts it will run, under `model_id` (the job's; "": the settings' model). For reporting and events;
    checkpoints are matched per analyst."""
    return job_identity(analysis_identities(settings, analysts_for(settings.profile.review.analyst_count), model_id))
