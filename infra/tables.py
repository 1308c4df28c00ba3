"""The six DynamoDB tables.

`dynamodb.Table` on purpose, not `TableV2`: TableV2 synthesizes `AWS::DynamoDB::GlobalTable`,
which moto's CloudFormation cannot create, and local runs deploy this very template into moto.
All tables: on-demand billing, point-in-time recovery, AWS-managed KMS encryption, TTL.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from contract_review.adapters.claims import LEASE_INDEX
from contract_review.adapters.job_tables import OPEN_INDEX, OPEN_STATE
from contract_review.adapters.model_control import KEY_ATTRIBUTE as CONTROL_KEY_ATTRIBUTE

from .removal import removal_policy

RECORD_TTL_ATTRIBUTE = "expires_at"  # epoch seconds, written by the repositories (contract_review/adapters)
CLAIMS_LEASE_INDEX = LEASE_INDEX  # sparse GSI of open claims, queried by the sweeper
JOBS_OPEN_INDEX = OPEN_INDEX  # sparse GSI of open (non-terminal) jobs, queried by the sweeper

S = dynamodb.AttributeType.STRING
N = dynamodb.AttributeType.NUMBER


@dataclass(frozen=True)
class TableSpec:
    construct_id: str
    partition_key: str
    sort_key: str | None = None
    ttl_attribute: str = RECORD_TTL_ATTRIBUTE
    sort_key_type: dynamodb.AttributeType = S


JOBS = TableSpec("JobsTable", "job_id")
CLAIMS = TableSpec("ClaimsTable", "job_id", "chunk_id")
CHECKPOINTS = TableSpec("CheckpointsTable", "pk", "analyst")
EVENTS = TableSpec("EventsTable", "job_id", "seq")
# the daily token ledger (adapters/token_ledger.py): a counter per model per hour, and one control item per model
TOKEN_LEDGER = TableSpec("TokenLedgerTable", "model", "hour", sort_key_type=N)
# the runtime control of the model (adapters/model_control.py): one item, written by compare-and-set on its version
# (`review quota`, the batch collector's off switch); later fields (a spend-cap hold, a model override) join it
CONTROL = TableSpec("ControlTable", CONTROL_KEY_ATTRIBUTE)


class ReviewTables(Construct):
    """jobs (+ `by-open-state` GSI), claims (+ `by-lease` GSI), checkpoints, events, the daily token ledger, the
    runtime control."""

    def __init__(self, scope: Construct, construct_id: str, *, retain: bool) -> None:
        super().__init__(scope, construct_id)
        self._retain = retain
        self.jobs = self._table(JOBS)
        # Sparse: only a job in a non-terminal state carries `open_state` (its state; removed by the write that
        # ends it), so the sweeper's query `open_state = "running" AND updated_at < T` reads open jobs only, and
        # its cost does not grow with the 30 days of ended jobs kept. Keys only: the sweeper reads each job
        # again (strongly consistent) before acting, since an index is eventually consistent.
        self.jobs.add_global_secondary_index(
            index_name=JOBS_OPEN_INDEX,
            partition_key=dynamodb.Attribute(name=OPEN_STATE, type=S),
            sort_key=dynamodb.Attribute(name="updated_at", type=N),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )
        self.claims = self._table(CLAIMS)
        # Sparse: only claimed chunks carry `lease_bucket`, so the sweeper's query
        # `lease_bucket = "open" AND claim_expires_at < now` reads open claims only.
        self.claims.add_global_secondary_index(
            index_name=CLAIMS_LEASE_INDEX,
            partition_key=dynamodb.Attribute(name="lease_bucket", type=S),
            sort_key=dynamodb.Attribute(name="claim_expires_at", type=N),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        self.checkpoints = self._table(CHECKPOINTS)
        self.events = self._table(EVENTS)
        self.token_ledger = self._table(TOKEN_LEDGER)
        self.control = self._table(CONTROL)

    def _table(self, spec: TableSpec) -> dynamodb.Table:
        return dynamodb.Table(
            self,
            spec.construct_id,
            partition_key=dynamodb.Attribute(name=spec.partition_key, type=S),
            sort_key=dynamodb.Attribute(name=spec.sort_key, type=spec.sort_key_type) if spec.sort_key else None,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=spec.ttl_attribute,
            deletion_protection=self._retain,
            removal_policy=removal_policy(self._retain, deletion_protected=True),
        )
