"""The model catalogue: one row per model the workers may call, and every fact the code uses about it.

A row says how a call reaches the model (the bedrock-runtime API and the Messages body's `anthropic_version`), what
the model accepts (a forced tool choice, sampling parameters, thinking modes), how Bedrock counts it (output burndown
against tokens per minute, whether `maxTokens` is reserved at the burndown, the minimum cacheable prefix), what it
costs (on demand, cache, batch) and where it is in its lifecycle, each value with the public page it was read from
and the date. A value no public AWS page confirms is listed in `unverified`: the row then holds the strictest value
known for it (tests/unit/config/test_catalogue.py checks that), and the bench says so.

Everything else reads this table: the Bedrock clients (model/bedrock.py), the strict simulated Bedrock
(doubles/bedrock_runtime.py, doubles/bedrock_sim.py), the price table (config/prices.py), pacing, admission, the
fleet formula, preflight and the synth check. Adding a model is adding a row here. An id with no row is refused by
a prod synth (infra/deploy_settings.py); at run time it gets `STRICTEST`: the strictest known value of every fact,
priced at the dearest known row (never $0).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict

from contract_review.config.constants import OFFLINE_MODEL_ID

# Cross-region inference profile ids carry a geography prefix (us.anthropic..., eu.amazon...); `global.` profiles
# route to every commercial region.
INFERENCE_PROFILE_PREFIXES = ("us.", "eu.", "apac.", "us-gov.", "jp.", "au.", "ca.", "global.")
GLOBAL_PROFILE_PREFIX = "global."

Api = Literal["converse", "messages"]
# manual: `thinking.budget_tokens` accepted (and thinking off by default); adaptive: only adaptive thinking;
# always: adaptive thinking always on. The analysts send no thinking block, which every mode accepts.
Thinking = Literal["manual", "adaptive", "always"]
MESSAGES_VERSION = "bedrock-2023-05-31"  # the Messages body's anthropic_version every Claude model on Bedrock takes


class ModelPrice(BaseModel):
    """One model's on-demand list price, USD per 1,000 tokens."""

    model_config = ConfigDict(frozen=True)

    input_per_1k: Decimal
    output_per_1k: Decimal
    cache_read_per_1k: Decimal  # Bedrock prompt caching: tokens read from the cache
    cache_write_per_1k: Decimal  # tokens written to the cache (5-minute TTL)
    # Bedrock batch inference (docs/batch-inference.md): None when the model has no batch price
    batch_input_per_1k: Decimal | None = None
    batch_output_per_1k: Decimal | None = None

    @property
    def batch(self) -> bool:
        """Whether the table prices this model's batch inference."""
        return self.batch_input_per_1k is not None and self.batch_output_per_1k is not None


def per_million(input_usd: str, output_usd: str, *, batch: bool = True) -> ModelPrice:
    """Anthropic's price shape on Bedrock, from the per-million list prices: cache reads 0.1 x input, 5-minute
    cache writes 1.25 x input, batch 50 % of on demand."""
    i, o = Decimal(input_usd) / 1000, Decimal(output_usd) / 1000
    return ModelPrice(input_per_1k=i, output_per_1k=o, cache_read_per_1k=i / 10, cache_write_per_1k=i * Decimal("1.25"),
                      batch_input_per_1k=i / 2 if batch else None, batch_output_per_1k=o / 2 if batch else None)


class Source(BaseModel):
    """Where a row's values were read."""

    model_config = ConfigDict(frozen=True)

    url: str
    read: str  # ISO date the page was read
    says: str  # which values it gives


class ModelRow(BaseModel):
    """One model on Bedrock: how it is called, what it accepts, how it is counted and priced."""

    model_config = ConfigDict(frozen=True)

    model_id: str  # the foundation-model id (an inference profile id is its model with a geography prefix)
    name: str
    profiles: tuple[str, ...]  # the inference-profile prefixes Bedrock serves it under ("global.", "us.", ...)
    # How the workers call it on bedrock-runtime: Converse, or InvokeModel with the Anthropic Messages body
    # (model/bedrock.py has a client for each)
    api: Api = "converse"
    anthropic_version: str = MESSAGES_VERSION  # the Messages body's version field
    forced_tool_choice: bool = True  # False: a forced tool choice is a 400; the tool is offered and asked for
    sampling: bool = True  # False: a `temperature`/`top_p`/`top_k` is a 400; none is sent
    thinking: Thinking = "manual"
    min_cache_tokens: int  # the shortest prefix the prompt cache keeps (a shorter one is silently not cached)
    output_burndown: int  # one output token counts this many against tokens per minute
    reserve_at_burndown: bool = False  # True: `maxTokens` is reserved x the burndown at admission (else x 1)
    tool_prompt_tokens: int = 313  # the tool-use system prompt Bedrock adds to a call with tools
    # Its list price as read (`sources`); with "price" in `unverified` (not on AWS's pricing page) it is shown, not
    # used: such a model is priced at the dearest catalogued price (config/prices.py)
    price: ModelPrice
    regional_premium: bool = False  # its geographic profiles cost `PriceTable.regional_premium` more
    batch: bool = True  # Bedrock batch inference serves it
    released: str = ""  # ISO dates of its lifecycle on Bedrock
    legacy_on: str = ""
    end_of_life_on: str = ""
    sources: tuple[Source, ...] = ()
    unverified: frozenset[str] = frozenset()  # fields no public AWS page confirms (the strictest known value held)


_PRICING = "https://aws.amazon.com/bedrock/pricing/"
_CACHING = "https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html"
_BURNDOWN = "https://docs.aws.amazon.com/bedrock/latest/userguide/quotas-token-burndown.html"
_RESERVATION = ("https://github.com/aws/agent-toolkit-for-aws/blob/main/skills/core-skills/amazon-bedrock/references/"
                "quota-health.md")
_TOOL_TOKENS = "https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/overview#pricing"
_MESSAGES = ("https://docs.aws.amazon.com/bedrock/latest/userguide/"
             "model-parameters-anthropic-claude-messages-request-response.html")
_IDS = "https://platform.claude.com/docs/en/about-claude/models/model-ids-and-versions"
_CARD = "https://docs.aws.amazon.com/bedrock/latest/userguide/model-card-anthropic-claude-{}.html"
_READ = "2026-11-29"
# The facts every 4.x row shares: the Converse and Messages request rules of Claude 4 on Bedrock (a forced tool
# choice, temperature), output burndown 5, maxTokens reserved at x1, the tool-use prompt.
_CLAUDE_4 = (Source(url=_MESSAGES, read=_READ, says="Messages body, anthropic_version bedrock-2023-05-31, tool_choice "
                                                    "tool, temperature"),
             Source(url=_BURNDOWN, read="2026-11-22", says="output burndown 5 for the Claude 4 family"),
             Source(url=_RESERVATION, read=_READ, says="reserved at admission: input + cache + maxTokens (x1)"),
             Source(url=_TOOL_TOKENS, read="2026-11-22", says="313 tool-use system prompt tokens, Claude 4"),
             Source(url=_IDS, read=_READ, says="Bedrock model ids"))
# What is known of the 5.x family on Bedrock only from Anthropic's pages and third parties (read 2026-11-29):
# output burndown 10 for Sonnet 5, Opus 5, Opus 5.5 and Fable 5.1 (quoted from AWS's burndown page by third
# parties; the page's list was not readable), forced tool choice rejected by Sonnet 5.5 and Fable 5.1, sampling
# parameters rejected by Sonnet 5 and restricted by Fable 5.1, the Messages API the documented path. Until an AWS page
# confirms them each unverified value holds the strictest known: messages, no forced tool, no sampling, the highest
# known burndown (15, Claude Opus 4.8), maxTokens reserved at the burndown, the largest cache minimum, no batch.
_STRICT_5X = ModelRow(model_id="", name="", profiles=(), api="messages", forced_tool_choice=False, sampling=False,
                      thinking="adaptive", min_cache_tokens=4096, output_burndown=15, reserve_at_burndown=True,
                      price=per_million("0", "0", batch=False), regional_premium=True, batch=False)
_UNVERIFIED_5X = frozenset({"api", "forced_tool_choice", "sampling", "min_cache_tokens", "output_burndown",
                            "reserve_at_burndown", "batch", "price"})

_ROWS: tuple[ModelRow, ...] = (
    # ---- Claude 4.x: the rows this stack has run on (the default: Sonnet 4.6, whose request rules are confirmed)
    ModelRow(
        model_id="anthropic.claude-sonnet-4-6", name="Claude Sonnet 4.6", profiles=("global.", "us.", "eu.", "jp.", "au."),
        min_cache_tokens=2048, output_burndown=5, price=per_million("3", "15"), regional_premium=True,
        sources=(Source(url=_PRICING, read="2026-11-22", says="on-demand, cache and batch prices (us-east-1)"),
                 *_CLAUDE_4,
                 Source(url=_CACHING, read="2026-11-22",
                        says="minimum cacheable prefix: Anthropic says 1,024, users observe 2,048 on Bedrock")),
        unverified=frozenset({"min_cache_tokens"})),
    ModelRow(
        model_id="anthropic.claude-sonnet-4-5-20250929-v1:0", name="Claude Sonnet 4.5",
        profiles=("global.", "us.", "eu.", "jp.", "au."),
        min_cache_tokens=1024, output_burndown=5, price=per_million("3", "15"), regional_premium=True,
        released="2025-09-29",
        sources=(Source(url=_PRICING, read="2026-11-22", says="on-demand, cache and batch prices (us-east-1)"),
                 *_CLAUDE_4, Source(url=_CACHING, read="2026-11-22", says="minimum cacheable prefix 1,024"))),
    ModelRow(
        model_id="anthropic.claude-haiku-4-5-20251001-v1:0", name="Claude Haiku 4.5",
        profiles=("global.", "us.", "eu."),
        min_cache_tokens=4096, output_burndown=5, price=per_million("1", "5"), regional_premium=True,
        sources=(Source(url=_PRICING, read="2026-11-22", says="on-demand, cache and batch prices (us-east-1)"),
                 *_CLAUDE_4, Source(url=_CACHING, read="2026-11-22", says="minimum cacheable prefix 4,096"))),
    ModelRow(
        model_id="anthropic.claude-opus-4-6-v1", name="Claude Opus 4.6", profiles=("global.", "us.", "eu.", "jp."),
        api="messages", min_cache_tokens=4096, output_burndown=5, price=per_million("5", "25"), regional_premium=True,
        sources=(*_CLAUDE_4, Source(url=_CACHING, read="2026-11-22", says="minimum cacheable prefix 4,096"),
                 Source(url="https://platform.claude.com/docs/en/about-claude/pricing", read=_READ,
                        says="$5 / $25 per million tokens (Anthropic's list price; not read on the Bedrock page)")),
        unverified=frozenset({"price"})),
    # ---- Claude 5.x: every value that affects a request is unverified on AWS (_STRICT_5X)
    _STRICT_5X.model_copy(update=dict(
        model_id="anthropic.claude-sonnet-5-5", name="Claude Sonnet 5.5", profiles=("global.", "us."),
        price=per_million("2", "10", batch=False), released="2026-09-28",
        sources=(Source(url="https://platform.claude.com/docs/en/models/sonnet-5-5/overview", read=_READ,
                        says="$2 / $10 per million tokens; forced tool use returns an error (Anthropic)"),
                 Source(url="https://github.com/vercel/ai/releases/tag/@ai-sdk%2Famazon-bedrock@5.0.99", read=_READ,
                        says="Bedrock id anthropic.claude-sonnet-5-5, us. and global. profiles (third party)")),
        unverified=_UNVERIFIED_5X)),
    _STRICT_5X.model_copy(update=dict(
        model_id="anthropic.claude-sonnet-5", name="Claude Sonnet 5", profiles=("global.", "us.", "eu.", "jp.", "au."),
        price=per_million("2", "10", batch=False), released="2026-06-30",
        legacy_on="2026-09-28",
        sources=(Source(url="https://platform.claude.com/docs/models/sonnet-5/migration-guide", read=_READ,
                        says="non-default temperature/top_p/top_k and manual thinking return 400 (Anthropic)"),
                 Source(url="https://platform.claude.com/docs/en/models/sonnet-5/overview", read=_READ,
                        says="legacy; $2 / $10 per million tokens (Anthropic)")),
        unverified=_UNVERIFIED_5X)),
    _STRICT_5X.model_copy(update=dict(
        model_id="anthropic.claude-opus-5-5", name="Claude Opus 5.5", profiles=("global.",),
        price=per_million("4", "20", batch=False), released="2026-09-22",
        end_of_life_on="2027-09-22",
        sources=(Source(url=_CARD.format("opus-5-5"), read=_READ,
                        says="launched 2026-09-22, end of life no earlier than 2027-09-22; adaptive thinking always "
                             "on; the Messages API on bedrock-runtime"),
                 Source(url="https://platform.claude.com/docs/en/models/opus-5-5/migration-guide", read=_READ,
                        says="$4 / $20 per million tokens (Anthropic)")),
        unverified=_UNVERIFIED_5X - {"api"})),
    _STRICT_5X.model_copy(update=dict(
        model_id="anthropic.claude-fable-5-1", name="Claude Fable 5.1", profiles=("global.", "us."),
        thinking="always", price=per_million("10", "50", batch=False), regional_premium=True,
        released="2026-09-01",
        sources=(Source(url=_CARD.format("fable-5-1"), read=_READ,
                        says="launched 2026-09-01; temperature only 1.0 or unset, top_k rejected; thinking always on"),
                 Source(url="https://platform.claude.com/docs/models/fable-5/migration-guide", read=_READ,
                        says="tool_choice auto or none only (Anthropic)")),
        unverified=_UNVERIFIED_5X - {"sampling"})),
)

CATALOGUE: dict[str, ModelRow] = {row.model_id: row for row in _ROWS}

# The default model (read 2026-11-29): the newest Sonnet whose row has no unverified value that decides whether a
# request is accepted (API, tool choice, sampling): Claude Sonnet 4.6, through its global profile. Sonnet 5.5, newer,
# is catalogued with those values unverified (the strictest sent); when an AWS page confirms them it becomes the
# default. Claude Sonnet 4.6 is served by Converse with an ARN-versioned id (profiles global/us/eu/jp): Anthropic,
# "Claude on Amazon Bedrock (legacy)", https://platform.claude.com/docs/en/build-with-claude/claude-on-amazon-bedrock-legacy;
# AWS, https://docs.aws.amazon.com/bedrock/latest/userguide/inference-profiles-support.html.
DEFAULT_MODEL_ID = "global.anthropic.claude-sonnet-4-6"
CORRECTNESS = ("api", "forced_tool_choice", "sampling")  # the row's values a request's acceptance depends on

# The offline rule model (not an LLM, free) is counted and priced as the default Bedrock model, so a local run
# shows what its calls would cost and how they would be counted there.
OFFLINE_AS = "anthropic.claude-sonnet-4-6"


def is_inference_profile(model_id: str) -> bool:
    return model_id.startswith(INFERENCE_PROFILE_PREFIXES)


def base_model_id(model_id: str) -> str:
    """The foundation model behind a cross-region inference profile id (the id itself otherwise)."""
    return model_id.split(".", 1)[1] if is_inference_profile(model_id) else model_id


def catalogued(model_id: str) -> ModelRow | None:
    """The row of a model id or inference profile id (the offline model: the row it is simulated as); None when the
    catalogue has none."""
    return CATALOGUE.get(OFFLINE_AS if model_id == OFFLINE_MODEL_ID else base_model_id(model_id))


# the row whose price stands for a model without a price confirmed on AWS's pricing page
DEAREST = max(_ROWS, key=lambda r: (r.price.output_per_1k, r.price.input_per_1k))

# An id with no row: the strictest known value of every fact (a cache, a quota or a request never kinder than a real
# model's), priced at the dearest known row.
# Its requests are ones every model takes: Converse (Bedrock's API for every model), the tool offered and asked for
# (not forced), no sampling parameter.
STRICTEST = ModelRow(
    model_id="", name="an uncatalogued model", profiles=(), api="converse",
    forced_tool_choice=False, sampling=False, thinking="adaptive",
    min_cache_tokens=max(r.min_cache_tokens for r in _ROWS), output_burndown=max(r.output_burndown for r in _ROWS),
    reserve_at_burndown=True, tool_prompt_tokens=max(r.tool_prompt_tokens for r in _ROWS), price=DEAREST.price,
    batch=False, unverified=frozenset(ModelRow.model_fields) - {"model_id", "name"})


def row_for(model_id: str) -> ModelRow:
    """The row the code acts on for `model_id`: its catalogue row, else `STRICTEST`."""
    return catalogued(model_id) or STRICTEST


def refused_id(model_id: str) -> str | None:
    """Why a configured model id is refused (a deploy, `review model use`), None when the catalogue has its row."""
    if catalogued(model_id) is not None:
        return None
    known = ", ".join(sorted(CATALOGUE))
    return (f"model id {model_id!r} has no row in the model catalogue (functions/contract_review/config/catalogue.py): "
            f"its API, request rules, quota burndown and price are unknown. Catalogued models: {known} (as ids or "
            f"with an inference-profile prefix such as 'global.'); add a row to use another")


def render_markdown() -> str:
    """docs/models.md: the catalogue as a page (`make docs`; a test keeps the committed page equal to this)."""
    default = DEFAULT_MODEL_ID
    lines = ["# Models", "",
             "<!-- generated by `make docs` from functions/contract_review/config/catalogue.py; do not edit -->", "",
             "The model catalogue: every model the workers may call, and what the code knows about it. A deploy with a",
             "model id that has no row is refused (`cdk deploy -c model_id=...`); to use another model, add its row.",
             f"The default is `{default}`: the newest Sonnet whose request rules (API, tool choice, sampling) a",
             "public AWS page confirms, as read on the dates below.", "",
             "A job keeps the model it was taken in on. A deploy may grant more than one (`-c model_fallbacks=ID,ID`):",
             "a job whose model is refused as unavailable moves to the next (`job.model_switched`), and `review model",
             "use ID` switches the stack with no redeploy (deploying.md, runbook.md \"A model disappears\").", "",
             "Values marked * are not confirmed on a public AWS page: the row holds the strictest value known",
             "(a Messages body, the tool offered not forced, no sampling parameter, the highest known burndown,",
             "`maxTokens` reserved at the burndown, the largest cache minimum, no batch) and a price not on AWS's",
             "pricing page is charged at the dearest catalogued price "
             f"(`{DEAREST.model_id}`), never less.", "",
             "| Model | Id | Profiles | API | Forced tool | Sampling | Burndown | Reserve | Cache min | "
             "$ in / out per M | Batch | Released | Legacy | End of life |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def mark(row: ModelRow, field: str, text: str) -> str:
        return f"{text}*" if field in row.unverified else text

    for r in _ROWS:
        reserve = "x burndown" if r.reserve_at_burndown else "x 1"
        price = f"{float(r.price.input_per_1k * 1000):.2f} / {float(r.price.output_per_1k * 1000):.2f}"
        lines.append(" | ".join([
            f"| {r.name}", f"`{r.model_id}`", " ".join(f"`{p}`" for p in r.profiles), mark(r, "api", r.api),
            mark(r, "forced_tool_choice", "yes" if r.forced_tool_choice else "no"),
            mark(r, "sampling", "yes" if r.sampling else "no"), mark(r, "output_burndown", f"{r.output_burndown}x"),
            mark(r, "reserve_at_burndown", reserve), mark(r, "min_cache_tokens", f"{r.min_cache_tokens:,}"),
            mark(r, "price", price), mark(r, "batch", "yes" if r.batch else "no"), r.released or "-",
            r.legacy_on or "-", (r.end_of_life_on or "-") + " |"]))
    lines += ["", "## Sources", ""]
    for r in _ROWS:
        lines.append(f"- **{r.name}**")
        lines += [f"  - {s.says} ({s.url}, read {s.read})" for s in r.sources]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
