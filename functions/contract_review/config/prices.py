"""The dated list prices a job's cost is computed from (docs/cost.md; `domain/cost.py`): the models' prices are
their catalogue rows' (config/catalogue.py), the AWS services' are here."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict

from contract_review.config.catalogue import CATALOGUE, DEAREST, OFFLINE_AS, ModelPrice
from contract_review.config.constants import OFFLINE_MODEL_ID


class PriceTable(BaseModel):
    """The dated list prices a job's cost is computed from (cost.py). docs/cost.md states the date and the
    sources, and a test keeps it equal to this table. Prices change: edit both, with the new date."""

    model_config = ConfigDict(frozen=True)

    as_of: str  # the date the prices were transcribed (ISO)
    region: str  # the region the AWS list prices are for
    # Bedrock, by foundation-model id (an inference profile id is priced as its model: `cost.model_price`): the
    # catalogue rows whose price a public AWS page confirms
    models: dict[str, ModelPrice]
    # What a model without a confirmed price (an unverified row, an uncatalogued id) is priced at: the dearest
    # catalogued price, so a budget or a spend cap never reads it cheaper than it may be (never $0)
    unconfirmed: ModelPrice
    unconfirmed_as: str  # the row that price is
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


# The models' prices: their catalogue rows (each with its source and date). The services' transcribed on 2026-11-22
# from https://aws.amazon.com/dynamodb/pricing/on-demand/, https://aws.amazon.com/sqs/pricing/,
# https://aws.amazon.com/s3/pricing/ and https://aws.amazon.com/lambda/pricing/ (us-east-1; free tiers left
# out). docs/cost.md repeats them; tests/unit/domain/test_cost.py keeps the two equal.
PRICES = PriceTable(
    as_of="2026-11-22",
    region="us-east-1",
    models={model_id: row.price for model_id, row in CATALOGUE.items()
            if row.price is not None and "price" not in row.unverified},
    unconfirmed=DEAREST.price,
    unconfirmed_as=DEAREST.model_id,
    priced_as={OFFLINE_MODEL_ID: OFFLINE_AS},
    regional_premium=Decimal("0.10"),
    regional_premium_models=tuple(model_id for model_id, row in CATALOGUE.items() if row.regional_premium),
    dynamodb_write_per_million=Decimal("0.625"),
    dynamodb_read_per_million=Decimal("0.125"),
    sqs_standard_per_million=Decimal("0.40"),
    sqs_fifo_per_million=Decimal("0.50"),
    s3_write_per_1k=Decimal("0.005"),
    s3_read_per_1k=Decimal("0.0004"),
    lambda_request_per_million=Decimal("0.20"),
    lambda_gb_second=Decimal("0.0000133334"),  # arm64 (x86: 0.0000166667)
)
