"""The dated list prices a job's cost is computed from (docs/cost.md; `domain/cost.py`)."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict

from contract_review.config.constants import OFFLINE_MODEL_ID


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


class PriceTable(BaseModel):
    """The dated list prices a job's cost is computed from (cost.py). docs/cost.md states the date and the
    sources, and a test keeps it equal to this table. Prices change: edit both, with the new date."""

    model_config = ConfigDict(frozen=True)

    as_of: str  # the date the prices were transcribed (ISO)
    region: str  # the region the AWS list prices are for
    # Bedrock, by foundation-model id (an inference profile id is priced as its model: `cost.model_price`)
    models: dict[str, ModelPrice]
    # A model id priced as another one: the offline rule model (not an LLM, free) is priced as the default
    # Bedrock model, so a local run shows what its tokens would cost there.
    priced_as: dict[str, str]
    # Geographic cross-region inference profiles (us., eu., jp., ...) of these models cost this much more than
    # the global profile (AWS: "10% premium" for regional endpoints of Claude Sonnet 4.5 and later).
    regional_premium: Decimal
    regional_premium_models: tuple[str, ...]
    dynamodb_write_per_million: Decimal  # on-demand write request units
    dynamodb_read_per_million: Decimal  # on-demand read request units
    sqs_standard_per_million: Decimal  # requests (64 KB chunks)
    sqs_fifo_per_million: Decimal
    s3_write_per_1k: Decimal  # PUT, COPY, POST, LIST (S3 Standard)
    s3_read_per_1k: Decimal  # GET and all other requests
    lambda_request_per_million: Decimal
    lambda_gb_second: Decimal  # arm64 (every function of the stack runs on Graviton), first pricing tier


# Transcribed on 2026-11-22 from https://aws.amazon.com/bedrock/pricing/ (Anthropic, on-demand and prompt
# caching), https://aws.amazon.com/dynamodb/pricing/on-demand/, https://aws.amazon.com/sqs/pricing/,
# https://aws.amazon.com/s3/pricing/ and https://aws.amazon.com/lambda/pricing/ (us-east-1; free tiers left
# out). docs/cost.md repeats them; tests/unit/domain/test_cost.py keeps the two equal. Batch inference (the same page,
# "Batch"): 50 % of the on-demand input and output prices for these models.
PRICES = PriceTable(
    as_of="2026-11-22",
    region="us-east-1",
    models={
        "anthropic.claude-sonnet-4-6": ModelPrice(input_per_1k=Decimal("0.003"), output_per_1k=Decimal("0.015"),
                                                  cache_read_per_1k=Decimal("0.0003"),
                                                  cache_write_per_1k=Decimal("0.00375"),
                                                  batch_input_per_1k=Decimal("0.0015"),
                                                  batch_output_per_1k=Decimal("0.0075")),
        "anthropic.claude-sonnet-4-5-20250929-v1:0": ModelPrice(
            input_per_1k=Decimal("0.003"), output_per_1k=Decimal("0.015"), cache_read_per_1k=Decimal("0.0003"),
            cache_write_per_1k=Decimal("0.00375"), batch_input_per_1k=Decimal("0.0015"),
            batch_output_per_1k=Decimal("0.0075")),
        "anthropic.claude-haiku-4-5-20251001-v1:0": ModelPrice(
            input_per_1k=Decimal("0.001"), output_per_1k=Decimal("0.005"), cache_read_per_1k=Decimal("0.0001"),
            cache_write_per_1k=Decimal("0.00125"), batch_input_per_1k=Decimal("0.0005"),
            batch_output_per_1k=Decimal("0.0025")),
    },
    priced_as={OFFLINE_MODEL_ID: "anthropic.claude-sonnet-4-6"},
    regional_premium=Decimal("0.10"),
    regional_premium_models=("anthropic.claude-sonnet-4-6", "anthropic.claude-sonnet-4-5-20250929-v1:0",
                             "anthropic.claude-haiku-4-5-20251001-v1:0"),
    dynamodb_write_per_million=Decimal("0.625"),
    dynamodb_read_per_million=Decimal("0.125"),
    sqs_standard_per_million=Decimal("0.40"),
    sqs_fifo_per_million=Decimal("0.50"),
    s3_write_per_1k=Decimal("0.005"),
    s3_read_per_1k=Decimal("0.0004"),
    lambda_request_per_million=Decimal("0.20"),
    lambda_gb_second=Decimal("0.0000133334"),  # arm64 (x86: 0.0000166667)
)
