"""The prompt layout before 2026-11-25 (commit 2bd48ea), for the bench's side by side only (bench/tokens.py
`old-layout`; never in a deploy, nor in the Lambda asset): the bench wraps the model itself, through the fault spec's
`model_wrapper` seam (`FaultSpec.model_wrapper = "bench.legacy_layout:old_layout"`).

Today's requests (review/analysts.py) share one prefix per chunk: one tool for both steps, the instructions for
every category, the excerpt, then the cache point. The old layout sent, per call: the analyst's own instructions
for one step as the system prompt (under any model's cache minimum: nothing cached), the step's own tool schema,
the excerpt and the located clauses in the user message, and maxTokens 2,048 for every step. `PerAnalystLayout`
rewrites each request into that shape before the simulated Bedrock sees it, so the same strict double counts,
reserves and caches the old requests as Bedrock would have. The rule model answers from the structured payload,
so the answers (and the findings) are the same under both layouts.

What it does not restore: the pipeline around the calls is today's (the pacer estimates today's request; the
warm-up gate runs a chunk's first call alone, which the old code did not).
"""

from __future__ import annotations

import dataclasses
import json

from contract_review.domain.model import JsonSchema, ModelClient, ModelRequest, ModelResponse
from contract_review.review.analysts import step_schemas

SYSTEM = ("You are a meticulous contract lawyer reviewing one excerpt of a contract. Quote clauses "
          "verbatim, exactly as they appear, and answer only through the provided tool.")
TASKS = {
    "locate": ("List every clause in the excerpt that answers one of these questions. "
               "Quote each clause verbatim (a full sentence or sub-clause)."),
    "assess": ("For each located clause (listed after the excerpt), give a risk score from 0 (benign) to 1 "
               "(severe) for the reviewing party and a one-sentence rationale. Keep each quote unchanged."),
}
MAX_TOKENS = 2048
Schemas = dict[str, JsonSchema]  # each step's own tool schema (review/analysts.py LocateOutput, AssessOutput)


def legacy_request(request: ModelRequest, schemas: Schemas) -> ModelRequest:
    """`request` as the old layout built it (review/analysts.py at 2bd48ea)."""
    payload = request.payload
    prompt = f"<excerpt>\n{payload['chunk_text']}\n</excerpt>"
    if request.step == "assess":
        prompt += f"\n\nLocated clauses: {json.dumps(payload.get('clauses', []))}"
    if payload.get("repair_hint"):
        prompt += f"\n\nYour previous answer was invalid: {payload['repair_hint']}\nAnswer again, valid this time."
    system = f"{SYSTEM}\n\nCategories: {json.dumps(payload['categories'])}\n\nTask: {TASKS[request.step]}"
    return dataclasses.replace(request, system=system, context="", prompt=prompt,
                               output_schema=schemas[request.step], max_tokens=MAX_TOKENS)


class PerAnalystLayout:
    """A model client that sends every request in the old layout (see the module's note)."""

    def __init__(self, inner: ModelClient, schemas: Schemas):
        self.inner, self.schemas = inner, schemas

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        return self.inner.invoke(legacy_request(request, self.schemas))


def old_layout(model: ModelClient) -> ModelClient:
    """The bench's wrapper (`FaultSpec.model_wrapper`): every request of `model`'s callers sent in the old layout."""
    return PerAnalystLayout(model, step_schemas())
