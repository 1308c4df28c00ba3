"""Cost per job (cost.py): the dated price table and its page, pricing, the request meter, the simulated
prompt cache, Bedrock's cache usage, and a job's usage counted once when its chunks settle."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from contract_review.config.prices import PRICES
from contract_review.config.profile import Profile
from contract_review.domain import cost
from contract_review.domain.model import prefix_tokens
from contract_review.domain.records import Usage
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.model.bedrock import BedrockConverseModel, bedrock_client_config
from contract_review.review.analysts import ANALYSTS, CATEGORIES, build_request, instructions
from contract_review.review.chunking import Chunk

from ..fakes import FakeClock

DOC = Path(__file__).resolve().parents[3] / "docs" / "cost.md"
CHUNK = Chunk(index=0, chunk_id="c0", start=0, end=60,
              text="Either party may terminate this Agreement for convenience on 30 days notice.")


# --- the price table and its page ----------------------------------------------------------------------

def _rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[1]) <= {"-"}:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_cost_page_states_the_price_tables_date_and_every_price():
    # GIVEN docs/cost.md WHEN it is read THEN its date and every price equal the config's table, and back
    text = DOC.read_text()
    assert f"Prices as of: **{PRICES.as_of}**" in text
    rows = _rows(text)
    for model, p in PRICES.models.items():
        assert [Decimal(x) if x not in ("", "-") else None for x in rows[model]] == [
            p.input_per_1k, p.output_per_1k, p.cache_read_per_1k, p.cache_write_per_1k, p.batch_input_per_1k,
            p.batch_output_per_1k], model
    aws = {"DynamoDB write request unit, per million": PRICES.dynamodb_write_per_million,
           "DynamoDB read request unit, per million": PRICES.dynamodb_read_per_million,
           "SQS standard request, per million": PRICES.sqs_standard_per_million,
           "SQS FIFO request, per million": PRICES.sqs_fifo_per_million,
           "S3 PUT, COPY, POST, LIST, per 1,000": PRICES.s3_write_per_1k,
           "S3 GET and other requests, per 1,000": PRICES.s3_read_per_1k,
           "Lambda request, per million": PRICES.lambda_request_per_million,
           "Lambda GB-second": PRICES.lambda_gb_second}
    for item, price in aws.items():
        assert Decimal(rows[item][0]) == price, item
    priced_rows = {k for k in rows if k.startswith("anthropic.")}
    assert priced_rows == set(PRICES.models)  # no price on the page that the config lacks
    assert f"**{int(PRICES.regional_premium * 100)} %**" in text
    assert re.search(r"is priced as `anthropic\.claude-sonnet-4-6`", text) and \
        PRICES.priced_as["offline-rules-v1"] == "anthropic.claude-sonnet-4-6"


def test_batch_tokens_cost_half_the_on_demand_price_and_an_unconfirmed_model_has_no_batch_price():
    # GIVEN a chunk's tokens WHEN priced through batch inference THEN input and output cost half the on-demand price
    usage = Usage(input_tokens=10_000, output_tokens=2_000)
    for model in PRICES.models:
        priced = cost.model_price(PRICES, model)
        on_demand = cost.model_cost_usd(priced, usage)
        assert cost.batch_cost_usd(priced, usage) == on_demand / 2, model
    # the offline model is priced as the default Bedrock model, in batch too; a regional profile keeps its premium
    assert cost.batch_cost_usd(cost.model_price(PRICES, "offline-rules-v1"), usage) == Decimal("0.0300")
    assert cost.batch_cost_usd(cost.model_price(PRICES, "us.anthropic.claude-sonnet-4-6"), usage) == \
        Decimal("0.0300") * Decimal("1.10")
    batch = cost.batch_usage(PRICES, "anthropic.claude-sonnet-4-6", usage)
    assert batch is not None and batch.model_micro_usd == 30_000 and batch.input_tokens == 10_000
    # a model without a confirmed batch price: None (the collector then charges the on-demand price)
    assert cost.batch_cost_usd(cost.model_price(PRICES, "anthropic.claude-opus-4-6-v1"), usage) is None
    no_batch = PRICES.models["anthropic.claude-sonnet-4-6"].model_copy(
        update={"batch_input_per_1k": None, "batch_output_per_1k": None})
    assert not no_batch.batch
    assert cost.batch_cost_usd(cost.PricedModel(no_batch, "x", Decimal(0)), usage) is None


def test_every_profile_carries_the_price_table():
    assert Profile.model_fields["prices"].default == PRICES


# --- pricing ---------------------------------------------------------------------------------------------

def test_model_tokens_are_priced_per_kind_and_inference_profiles_as_their_model():
    tokens = Usage(input_tokens=1000, output_tokens=1000, cache_read_tokens=1000, cache_write_tokens=1000)
    glob = cost.model_price(PRICES, "global.anthropic.claude-sonnet-4-6")
    # 0.003 + 0.015 + 0.0003 + 0.00375 USD
    assert cost.model_cost_usd(glob, tokens) == Decimal("0.02205")
    assert glob.priced_as == "anthropic.claude-sonnet-4-6" and glob.premium == 0
    us = cost.model_price(PRICES, "us.anthropic.claude-sonnet-4-6")  # a geographic profile: 10 % more
    assert cost.model_cost_usd(us, tokens) == Decimal("0.02205") * Decimal("1.10")
    offline = cost.model_price(PRICES, "offline-rules-v1")
    assert offline.priced_as == "anthropic.claude-sonnet-4-6"
    # a model without a price confirmed on AWS's page (uncatalogued, or its row's price unverified): the dearest
    # catalogued price, never $0
    for model_id in ("mistral.unknown-v9", "global.anthropic.claude-sonnet-5-5"):
        unconfirmed = cost.model_price(PRICES, model_id)
        assert unconfirmed.price == PRICES.unconfirmed and PRICES.unconfirmed_as in unconfirmed.priced_as
        assert cost.model_cost_usd(unconfirmed, tokens) > cost.model_cost_usd(glob, tokens) > 0


def test_requests_are_priced_by_class_in_integer_micro_dollars():
    requests = Counter({cost.DYNAMODB_WRITE: 1_000_000, cost.SQS_FIFO: 2_000_000, cost.S3_WRITE: 1000,
                        cost.S3_READ: 1000, cost.FREE: 50})
    usd = cost.request_cost_usd(PRICES, requests, Decimal(10))  # + 10 GB-s of Lambda
    assert usd == Decimal("0.625") + Decimal("1.00") + Decimal("0.005") + Decimal("0.0004") + Decimal("0.000133334")
    assert cost.micro_usd(usd) == 1_630_533  # rounded to the micro-dollar (half up), never a float
    assert cost.format_usd(1_630_533) == "$1.630533"


# --- the request meter (a botocore hook) --------------------------------------------------------------------

def test_the_meter_counts_each_api_call_of_a_hooked_client_into_the_open_attempt():
    meter = cost.RequestMeter()
    ddb = meter.hook(boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x",
                                  aws_secret_access_key="x"))
    sqs = meter.hook(boto3.client("sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"))
    with Stubber(ddb) as d, Stubber(sqs) as q:
        d.add_response("get_item", {})
        d.add_response("update_item", {})
        d.add_response("get_item", {})
        q.add_response("send_message", {"MessageId": "m", "MD5OfMessageBody": "x"})
        ddb.get_item(TableName="t", Key={"k": {"S": "1"}})  # before any attempt: the process's only
        with meter.attempt() as counter:
            ddb.update_item(TableName="t", Key={"k": {"S": "1"}})
            ddb.get_item(TableName="t", Key={"k": {"S": "1"}})
            sqs.send_message(QueueUrl="https://sqs/123/results.fifo", MessageBody="{}", MessageGroupId="g")
    assert counter.snapshot() == Counter({cost.DYNAMODB_WRITE: 1, cost.DYNAMODB_READ: 1, cost.SQS_FIFO: 1})
    assert counter.total == 3 and meter.process.total == 4


def test_a_thread_excluded_from_the_meter_is_not_counted_into_the_attempt():
    meter = cost.RequestMeter()
    ddb = meter.hook(boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x",
                                  aws_secret_access_key="x"))
    with Stubber(ddb) as d:
        d.add_response("get_item", {})
        d.add_response("get_item", {})

        def sweep() -> None:
            meter.exclude_current_thread()
            ddb.get_item(TableName="t", Key={"k": {"S": "1"}})

        with meter.attempt() as counter:
            t = threading.Thread(target=sweep)
            t.start()
            t.join()
            other = threading.Thread(target=lambda: ddb.get_item(TableName="t", Key={"k": {"S": "2"}}))
            other.start()  # an analyst or heartbeat thread of the attempt: counted
            other.join()
    assert counter.total == 1 and meter.process.total == 2


# --- prompt caching ---------------------------------------------------------------------------------------

def test_every_call_about_a_chunk_shares_one_prefix_and_the_analysts_part_follows_it():
    """The prompt cache's layout: one tool, the shared instructions and the excerpt are the same for every
    analyst and both steps of a chunk (one cached prefix per chunk); the analyst's task follows."""
    requests = [build_request(spec, step, CHUNK, [] if step == "assess" else None, None)
                for spec in ANALYSTS for step in ("locate", "assess")]
    assert len({(r.system, r.context, json.dumps(r.output_schema)) for r in requests}) == 1
    req = requests[4]
    assert req.system == instructions() and CHUNK.text not in req.system
    assert all(c.question in req.system for c in CATEGORIES)  # every category: the same system for all analysts
    assert req.context == f"<excerpt>\n{CHUNK.text}\n</excerpt>" and CHUNK.text not in req.prompt
    assert req.analyst in req.prompt and "Step locate" in req.prompt
    other = Chunk(index=1, chunk_id="c1", start=60, end=80, text="This Agreement renews automatically.")
    assert build_request(ANALYSTS[2], "locate", other, None, None).system == req.system  # the same for every chunk


def test_the_offline_model_reports_the_cache_a_prefix_over_the_minimum_would_get():
    """The accounting at work with a minimum small enough for the analysts' prefix (tests only: by default the
    minimum is Bedrock's, which the analysts' prefixes do not reach; see the next test)."""
    clock = FakeClock()
    model = OfflineRuleModel(SimulatedPromptCache(ttl_s=300, min_tokens=1, clock=clock))
    req = build_request(ANALYSTS[2], "locate", CHUNK, None, None)
    first = model.invoke(req)
    second = model.invoke(req)
    prefix = prefix_tokens(model.model_id, req)
    assert prefix > 313  # Bedrock's tool-use system prompt, the tool definition and the instructions
    assert (first.cache_write_tokens, first.cache_read_tokens) == (prefix, 0)
    assert (second.cache_write_tokens, second.cache_read_tokens) == (0, prefix)
    assert first.input_tokens == second.input_tokens == len(req.prompt) // 4  # the rest: uncached input
    other_step = model.invoke(build_request(ANALYSTS[2], "assess", CHUNK, [], None))
    other_analyst = model.invoke(build_request(ANALYSTS[5], "locate", CHUNK, None, None))
    assert other_step.cache_read_tokens == other_analyst.cache_read_tokens == prefix  # one prefix per chunk
    clock.advance(301)
    assert model.invoke(req).cache_write_tokens == prefix  # expired: written again


def test_by_default_the_analysts_prefix_is_under_bedrocks_minimum_and_nothing_is_cached():
    model = OfflineRuleModel()
    req = build_request(ANALYSTS[2], "locate", CHUNK, None, None)
    assert prefix_tokens(model.model_id, req) < model.prompt_cache.minimum(model.model_id) == 2048
    answers = [model.invoke(req) for _ in range(2)]
    assert all((a.cache_read_tokens, a.cache_write_tokens) == (0, 0) for a in answers)
    assert answers[0].input_tokens == len(req.prompt) // 4 + prefix_tokens(model.model_id, req)


def test_bedrock_cache_usage_is_read_from_the_converse_answer():
    client = boto3.client("bedrock-runtime", region_name="us-east-1", config=bedrock_client_config(120),
                          aws_access_key_id="x", aws_secret_access_key="x")
    req = build_request(ANALYSTS[0], "locate", CHUNK, None, None)
    with Stubber(client) as stub:
        stub.add_response("converse", {
            "output": {"message": {"role": "assistant", "content": [{"text": '{"clauses": []}'}]}},
            "stopReason": "end_turn", "metrics": {"latencyMs": 5},
            "usage": {"inputTokens": 40, "outputTokens": 7, "totalTokens": 1547, "cacheReadInputTokens": 1500,
                      "cacheWriteInputTokens": 0}})
        answer = BedrockConverseModel(client, "global.anthropic.claude-sonnet-4-6").invoke(req)
    assert (answer.input_tokens, answer.output_tokens, answer.cache_read_tokens, answer.cache_write_tokens) == (
        40, 7, 1500, 0)




def test_the_budget_estimate_counts_a_cached_prefix_once_and_an_uncached_one_with_every_call():
    from contract_review.config.prices import PRICES
    from contract_review.domain.cost import ESTIMATE_ANALYST_PART_TOKENS, ESTIMATE_ANSWER_TOKENS, estimate_document

    model = "global.anthropic.claude-sonnet-4-6"
    cached = estimate_document(PRICES, model, [2_200], calls_per_chunk=17, min_cache_tokens=2_048)
    assert (cached.cache_write_tokens, cached.cache_read_tokens) == (2_200, 2_200 * 16)
    assert cached.input_tokens == 17 * ESTIMATE_ANALYST_PART_TOKENS and cached.output_tokens == 17 * ESTIMATE_ANSWER_TOKENS
    uncached = estimate_document(PRICES, model, [1_800], calls_per_chunk=17, min_cache_tokens=2_048)
    assert uncached.cache_write_tokens == uncached.cache_read_tokens == 0
    assert uncached.input_tokens == 17 * (1_800 + ESTIMATE_ANALYST_PART_TOKENS)
    assert uncached.model_micro_usd > cached.model_micro_usd > 0  # the cache pays even for a shorter prefix
    two = estimate_document(PRICES, model, [2_200, 2_200], calls_per_chunk=17, min_cache_tokens=2_048)
    assert two.model_micro_usd == pytest.approx(2 * cached.model_micro_usd, abs=1)
