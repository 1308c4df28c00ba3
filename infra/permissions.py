"""Least-privilege grants: per role, exactly the actions its code calls, on exactly the resources.

`ACCESS` is the one table: role -> (resource, actions, why). The stack grants from it
(`grant_access`), and tests/infra/test_role_coverage.py runs every use case against moto with a
botocore hook recording each call per role, then checks both ways on the synthesized template:
every recorded call is allowed on its resource, and every granted action is one the code was
seen calling (the only exceptions are listed there with their reasons: the event source mapping's
own polling, log and X-Ray writes).

Resources are named by key (`table:jobs`, `index:claims/by-lease`, `objects:uploads/`, `bucket`,
`queue:analysis`, `dlq:analysis`); the stack maps each key to an ARN (`ContractReviewStack.arns`).
No CDK `grant_*` helper is used for data: they add actions the code never calls (`s3:GetObject*`,
`s3:List*`, `dynamodb:DeleteItem`, `sqs:GetQueueUrl`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

from contract_review.domain.keys import (
    BATCH_ANSWERS_PREFIX,
    BATCH_JOBS_PREFIX,
    BATCH_OPEN_PREFIX,
    BATCH_PENDING_PREFIX,
    BATCH_PREFIX,
)
from contract_review.domain.model import GLOBAL_PROFILE_PREFIX, base_model_id, is_inference_profile

from .tables import CLAIMS_LEASE_INDEX, JOBS_OPEN_INDEX


@dataclass(frozen=True)
class Access:
    """Actions on one of the stack's resources, and why the code needs them."""

    target: str
    actions: tuple[str, ...]
    why: str


GET, PUT, UPDATE, QUERY = (f"dynamodb:{a}" for a in ("GetItem", "PutItem", "UpdateItem", "Query"))
DELETE_ITEM = "dynamodb:DeleteItem"
CONDITION_CHECK = "dynamodb:ConditionCheckItem"
BATCH_GET = "dynamodb:BatchGetItem"
# Appending a job event (adapters/job_events.py record_event): read the job's counter item (GetItem), then write it
# (UpdateItem) and the event (PutItem) in one TransactWriteItems, which IAM checks per item action.
EVENTS_APPEND = (GET, PUT, UPDATE)
PUBLISH, PUT_EVENTS = "sns:Publish", "events:PutEvents"
GET_OBJECT, PUT_OBJECT, DELETE_OBJECT, LIST_BUCKET = "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"
SEND, RECEIVE, DELETE, CHANGE_VISIBILITY, QUEUE_ATTRIBUTES = (f"sqs:{a}" for a in (
    "SendMessage", "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility", "GetQueueAttributes"))
# GetObject answers 404 (NoSuchKey) for a missing key only to a caller that may list the bucket;
# without it S3 says 403, and a missing object would read as a permissions problem.
PRINCIPAL_UPLOADS = "objects:uploads/principals/"  # the Job API's callers' own uploads (domain/principals.py)
_LIST = Access("bucket", (LIST_BUCKET,), "a missing object answers 404, not 403 (implied by GetObject)")
LEASE_INDEX = f"index:claims/{CLAIMS_LEASE_INDEX}"
OPEN_JOBS_INDEX = f"index:jobs/{JOBS_OPEN_INDEX}"
# Bedrock batch inference (docs/batch-inference.md; keys: domain/keys.py BATCH_*): a batch-mode chunk's worker hands its
# records to the collector and reads the answers back; the collector (its own function) owns the rest of batch/.
BATCH_PENDING, BATCH_ANSWERS, BATCH_OPEN, BATCH_ALL = (f"objects:{p}" for p in (
    BATCH_PENDING_PREFIX, BATCH_ANSWERS_PREFIX, BATCH_OPEN_PREFIX, f"{BATCH_PREFIX}/"))
BATCH_WORKER = (
    Access(BATCH_PENDING, (PUT_OBJECT,), "batch inference: hand a batch-mode chunk's model requests to the collector"),
    Access(BATCH_ANSWERS, (GET_OBJECT,), "batch inference: read the answers the collector joined back"),
)
# The runtime control (adapters/model_control.py): for every role whose code reads it (the worker: before each model
# call; with it, the model's quotas the sweeper publishes: adapters/published_quotas.py).
CONTROL_READ = Access("table:control", (GET,), "the runtime control (review quota, review model): a pause, a quota, the "
                                               "model an operator switched to, the batch lane's off switch (one item, "
                                               "cached model_control_max_age_s); the worker: "
                                               "the model's quotas the sweeper published (their own item, cached alike)")
# The batch collector reads the runtime control (a pause stops the batch lane) and turns a model's batch lane off on
# a refusal (`ModelControls.update`: read consistently, then a conditional UpdateItem of its field). For the role that
# runs `batch.collect` once its code reads and writes the control (the grant follows the code: test_role_coverage.py).
CONTROL_COLLECTOR = (
    Access("table:control", (GET, UPDATE), "the runtime control: a pause stops the batch lane; a refused batch job "
                                           "turns the model's batch lane off (compare-and-set on its version)"),
)

# What a chunk counted on its job spent, added to the stack's recorded spend of the day (domain/spend_cap.py): for
# every role whose code counts settled chunks (lifecycle.count_settled) and has no other ledger write.
SPEND_RECORD = Access("table:token-ledger", (UPDATE,), "the stack's daily spend cap: add what each chunk it counts "
                                                        "spent to the day's recorded spend (ADD)")

INTAKE = (
    Access("table:jobs", (PUT, GET, UPDATE), "create the job (conditional put), read a duplicate's, start it"),
    Access("table:events", EVENTS_APPEND, "record job events (the counter read, then it and the event written in one transaction)"),
    Access("table:claims", (PUT,), "create one chunk record per chunk"),
    Access("objects:uploads/", (GET_OBJECT,), "read a document submitted by s3_uri (the stack's uploads/ only; the "
                                              "sender's own area, checked in admission)"),
    Access("objects:submissions/", (GET_OBJECT,), "take a message's principal only when the Job API's submission "
                                                  "record vouches for it"),
    Access("objects:documents/", (PUT_OBJECT,), "store the document the chunks are cut from, and its fan-out plan"),
    _LIST,
    Access("queue:analysis", (SEND,), "send the first page of chunk messages"),
    Access("dlq:intake", (SEND,), "dead-letter input without a job key, with its error envelope"),
    CONTROL_READ,  # a batch-mode job whose model's batch lane is off is admitted on demand (`batch.unavailable`)
    Access("table:token-ledger", (PUT, UPDATE), "the stack's daily spend cap: take the job's estimate from the day's "
                                                "allowance with the record of that job's charge (one transaction: "
                                                "the Job API's charge of the same job is seen, not taken again)"),
)
WORKER = (
    Access("table:jobs", (GET, UPDATE, BATCH_GET), "read the job; fail it on a job-fatal error; priority: read the "
                                                   "running jobs the index names, 100 a request (BatchGetItem)"),
    Access(OPEN_JOBS_INDEX, (QUERY,), "priority: is an interactive job open (then a bulk chunk gives way)? The "
                                      "running jobs' keys (pipeline/priority.py)"),
    Access("table:events", EVENTS_APPEND, "record chunk events (the counter read, then it and the event written in one transaction)"),
    Access("table:claims", (GET, UPDATE), "claim, heartbeat, checkpoint-commit, release and settle (fenced)"),
    Access("table:checkpoints", (PUT, QUERY), "write the analysts' checkpoints (one item per group committed "
                                              "together); load those of the committed fences on resume"),
    Access("objects:findings/", (PUT_OBJECT,), "write the chunk's findings"),
    Access("objects:checkpoints/", (PUT_OBJECT, GET_OBJECT), "large analyst outputs"),
    _LIST,
    Access("queue:analysis", (SEND, CHANGE_VISIBILITY), "requeue under backpressure; heartbeat and tier-2 backoff"),
    Access("dlq:analysis", (SEND,), "dead-letter a chunk whose poison budget is spent"),
    Access("queue:results", (SEND,), "announce a settled chunk"),
    CONTROL_READ,
    Access("table:token-ledger", (QUERY, UPDATE), "the daily token ledger: add what the calls counted to the "
                                                  "hour's counter (ADD), read the last 24 hours (one query), start "
                                                  "a hold, claim the hour's probe and lift the hold (conditional)"),
) + BATCH_WORKER
# The job's side effects (contract_review/sideeffects/saga.py), run by the aggregator and by the sweeper (the finalize of a
# stalled job; an expired approval's compensation). Powertools idempotency never reads with GetItem: a failed
# conditional put returns the existing record (ReturnValuesOnConditionCheckFailure).
SIDE_EFFECTS = (
    Access("table:idempotency", (PUT, UPDATE, DELETE_ITEM), "Powertools idempotency: a step's in-progress record "
                                                            "(conditional put), its outcome, freed when it failed"),
    Access("topic:job-events", (PUBLISH,), "publish \"Review completed\" and \"Review withdrawn\" for integrators"),
    Access("bus:default", (PUT_EVENTS,), "the same events on the account's default EventBridge bus"),
    Access("dlq:compensation", (SEND,), "dead-letter a compensation that exhausted its retries, with its envelope"),
    Access("objects:reports/", (GET_OBJECT,), "the report a resumed saga (after an approval) names in its steps"),
)
AGGREGATOR = (
    Access("table:jobs", (GET, UPDATE), "count settled chunks (one transaction with the chunk record), end the job"),
    Access("table:events", EVENTS_APPEND, "record job events (the counter read, then it and the event written in one transaction)"),
    Access("table:claims", (GET, QUERY, PUT, UPDATE), "check a result against its chunk; read all chunks at the "
                                                       "end; create the chunk records of the next page; settle a "
                                                       "cancelled or over-budget job's idle chunks (fenced); mark a "
                                                       "chunk counted (one transaction with the job item)"),
    Access("objects:findings/", (GET_OBJECT,), "assemble the findings"),
    Access("objects:reports/", (PUT_OBJECT,), "write report.json and report.md"),
    Access("objects:documents/", (GET_OBJECT,), "the fan-out plan, and the next page's text (one ranged GET)"),
    _LIST,
    Access("queue:analysis", (SEND,), "send the next page of chunk messages as the job's window empties"),
    SPEND_RECORD,
) + SIDE_EFFECTS
# Step 1 of the sweep (lapsed claims), which a Fargate poller also runs in-process (sweeper.sweep_claims): on top
# of the worker's grants, only the lease index and the stored document a lost chunk's message is rebuilt from.
SWEEP_CLAIMS = (
    Access(LEASE_INDEX, (QUERY,), "find lapsed claims"),
    Access("objects:documents/", (GET_OBJECT,), "rebuild a lost chunk's message from the stored document"),
)
SWEEPER = (
    Access(LEASE_INDEX, (QUERY,), "find lapsed claims"),
    Access("table:claims", (QUERY, GET, UPDATE, PUT), "a stalled job's chunks; release or settle (fenced); mark "
                                                      "one counted, or not, with the job's count (one transaction); "
                                                      "create the first page's records of a job it starts (one held "
                                                      "for the daily spend cap, or whose fan-out never started)"),
    Access(OPEN_JOBS_INDEX, (QUERY,), "find open jobs idle for a while: stalled, cancelling, compensating, waiting "
                                      "for approval, queued (a sparse index: no scan)"),
    Access("table:jobs", (GET, UPDATE), "read each job the index names again (the index lags), act on it"),
    Access("table:events", EVENTS_APPEND, "record what the sweep did (the counter read, then it and the event written in one transaction)"),
    Access("objects:documents/", (GET_OBJECT,), "rebuild a chunk's message from the stored document"),
    Access("objects:findings/", (GET_OBJECT,), "finalize a stalled job whose chunks are all settled and counted"),
    Access("objects:reports/", (PUT_OBJECT,), "that job's report.json and report.md"),
    _LIST,
    Access("queue:analysis", (SEND, QUEUE_ATTRIBUTES), "requeue lapsed and lost chunks, and those whose receives "
                                                       "were burned; its depth tells a backlog from a lost message"),
    Access("dlq:analysis", (RECEIVE, SEND, DELETE), "read dead letters to explain them; dead-letter; remove a copy "
                                                    "it sent again, or that nothing will act on any more"),
    Access("dlq:intake", (QUEUE_ATTRIBUTES, RECEIVE, SEND, DELETE),
           "find the intake message of a job stuck `queued` (only when the DLQ holds something), and put it back "
           "naming the job and the error"),
    Access("queue:results", (SEND,), "announce chunks it settled"),
    Access("table:token-ledger", (GET, PUT, UPDATE), "the stack's daily spend cap: read the day's spend; add what "
                                                     "the chunks it counts spent; admit a job held for the cap "
                                                     "(its charge and record in one transaction)"),
    Access("table:control", (GET, UPDATE), "the stack's daily spend cap: set the spend-cap hold once the day's "
                                           "recorded spend reached it (compare-and-set on its version); publish the "
                                           "model's quotas for the workers when they changed (their own item, "
                                           "compare-and-set alike)"),
) + SIDE_EFFECTS
# The batch collector (pipeline/collector.py, pipeline/batch_inference_collect.py `collect`; its own function): over the running batch-mode
# jobs, track the batch jobs holding their parked chunks, return the answers of those that ended, pack and submit the
# chunks waiting for a batch. Bedrock's own calls (create, read, stop a job; pass the service role) are infra/batch.py's.
COLLECTOR = (
    Access(OPEN_JOBS_INDEX, (QUERY,), "find the running jobs (a sparse index: no scan), then keep the batch-mode ones"),
    Access("table:jobs", (GET, UPDATE), "read each job the index names again (the index lags), and a member's job "
                                        "the run did not list; touch a job whose chunks wait in batch jobs (tracked, "
                                        "not stalled); add a batch job's unused answers to a job (with its event)"),
    Access("table:claims", (QUERY, GET, UPDATE), "a job's chunks (the parked ones); a batch job's member read again "
                                                 "before it is stopped, dropped or released; tag a chunk with its "
                                                 "batch job, return it pending with its answers, or on demand "
                                                 "(conditional on its fence)"),
    Access("table:events", EVENTS_APPEND, "record batch.submitted, batch.returned, batch.on_demand, batch.unused (the "
                                          "counter read, then it and the event written in one transaction)"),
    Access("table:token-ledger", (PUT, UPDATE), "spend limits: a batch job's answers nobody took counted toward the "
                                                "principal's spend of the day, with the record of that charge (one "
                                                "transaction: a retried collect takes nothing again)"),
    Access(BATCH_ALL, (GET_OBJECT, PUT_OBJECT),
           "read the pending records, write a job's input file and its manifest, read Bedrock's output, write the "
           "answers (all of batch/ expires with the job records)"),
    Access(BATCH_OPEN, (DELETE_OBJECT,), "remove an ended batch job's open marker (batch/jobs/open/<token>: the "
                                         "batch jobs still followed, listed each run); nothing else is deleted"),
    Access("objects:documents/", (GET_OBJECT,), "rebuild a returned chunk's message from the stored document"),
    _LIST,
    Access("queue:analysis", (SEND,), "send a returned chunk's message (its answers replayed, or its calls on demand)"),
) + CONTROL_COLLECTOR
# The Job API (contract_review/operate/api.py): submit and read jobs and batches; cancel, decide, retry (redrive.retry).
API = (
    Access("table:jobs", (GET, UPDATE, CONDITION_CHECK), "read a job; cancel, approve or reject it; reopen it "
                                                          "(retry: each counted mark rebuilt in a transaction with a "
                                                          "check of the job's transition condition)"),
    Access("table:events", (*EVENTS_APPEND, QUERY), "read a job's events after a sequence number (and its last); "
                                                "record what was done (the counter, then it and the event together)"),
    Access("table:claims", (QUERY, GET, UPDATE), "retry: a job's chunks; reset failed and dead-lettered ones (a "
                                                 "running job's: each read again first), uncount them (one "
                                                 "transaction with the job), rebuild a reopened job's counted marks"),
    Access("objects:submissions/", (GET_OBJECT, PUT_OBJECT), "bind a job to its principal until intake records it"),
    Access("objects:batches/", (GET_OBJECT, PUT_OBJECT), "batch manifests"),
    Access(f"objects:{BATCH_JOBS_PREFIX}", (GET_OBJECT,), "a batch-mode job's status: the batch jobs holding its "
                                                          "calls (pipeline/batch_inference.py batches_of)"),
    Access("table:token-ledger", (PUT, UPDATE), "spend limits: take a submission's estimate from its principal's "
                                                 "and the stack's daily allowances with the record of that job's "
                                                 "charge (one transaction: a replay takes nothing again), give it "
                                                 "back when the admission fails, count its requests a minute "
                                                 "(operate/limits.py, domain/spend_cap.py)"),
    Access("table:control", (GET,), "the stack's daily spend cap: lifted for today by an operator? (read only when "
                                    "the cap would refuse a submission)"),
    Access(PRINCIPAL_UPLOADS, (GET_OBJECT, PUT_OBJECT), "read a document sent by s3_uri (to hash it); claim-check a "
                                                        "large text; presign POST /uploads (all in the callers' "
                                                        "own uploads/principals/<owner>/)"),
    Access("objects:documents/", (GET_OBJECT,), "retry: rebuild chunk messages from the stored document"),
    Access("objects:reports/", (GET_OBJECT,), "GET /jobs/{id}/report: the owner reads the report through a GET this "
                                              "role presigns (S3 checks the signer's grant)"),
    _LIST,
    Access("queue:intake", (SEND,), "send the intake message of a submitted job; retry a job failed in intake"),
    Access("queue:analysis", (SEND,), "retry: send the reset chunks"),
    Access("queue:results", (SEND,), "cancel, approve, reject: a control message to the job's aggregator"),
    Access("dlq:analysis", (RECEIVE, DELETE, CHANGE_VISIBILITY), "retry: remove the job's dead letters, leave the "
                                                                 "others visible"),
    Access("dlq:intake", (RECEIVE, DELETE, CHANGE_VISIBILITY), "retry of a job failed in intake: take its message "
                                                               "back from the intake DLQ"),
)
# The Fargate poller is its own event source mapping, runs the worker, and sweeps lapsed claims in-process (jobs are
# the sweeper Lambda's: no DLQ reads, no job queries from every task).
POLLER = (
    Access("queue:analysis", (RECEIVE, DELETE, CHANGE_VISIBILITY), "poll the analysis queue; acknowledge"),
)
ACCESS: dict[str, tuple[Access, ...]] = {
    "intake": INTAKE, "worker": WORKER, "aggregator": AGGREGATOR, "sweeper": SWEEPER, "collector": COLLECTOR,
    "api": API,
    "fargate": WORKER + SWEEP_CLAIMS + POLLER,
}


def merged(accesses: Iterable[Access]) -> dict[str, tuple[str, ...]]:
    """target -> the sorted union of its actions."""
    out: dict[str, set[str]] = {}
    for a in accesses:
        out.setdefault(a.target, set()).update(a.actions)
    return {t: tuple(sorted(acts)) for t, acts in sorted(out.items())}


def grant_access(grantee: iam.IGrantable, arns: Mapping[str, str], accesses: Iterable[Access]) -> None:
    """One statement per resource: exactly the actions the table lists for it."""
    for target, actions in merged(accesses).items():
        iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=[arns[target]])


def profile_arn(stack: Stack, model_id: str) -> str:
    return stack.format_arn(service="bedrock", resource="inference-profile", resource_name=model_id,
                            arn_format=ArnFormat.SLASH_RESOURCE_NAME)


def foundation_model_arn(stack: Stack, model_id: str, region: str) -> str:
    """`region` "" gives the region-less ARN (arn:aws:bedrock:::foundation-model/...) of a global profile."""
    return stack.format_arn(
        service="bedrock",
        region=region,
        account="",
        resource="foundation-model",
        resource_name=model_id,
        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
    )


def _invoke_statements(stack: Stack, model_id: str) -> list[iam.PolicyStatement]:
    """`bedrock:InvokeModel` for `model_id`, as narrow as IAM allows.

    - a foundation-model id: that model in this region;
    - a geographic inference profile (`us.`, `eu.`, ...): the profile, and its foundation model in
      any region (the destinations depend on the source region and grow over time, so IAM can only
      say `*`), usable only through this profile (`bedrock:InferenceProfileArn`);
    - a global profile (`global.`): the profile, its model in this region and the region-less global
      model ARN, usable only through this profile (AWS, "Global cross-Region inference", IAM policy
      requirements: https://docs.aws.amazon.com/bedrock/latest/userguide/global-cross-region-inference.html).
    """
    invoke = ["bedrock:InvokeModel"]
    if not is_inference_profile(model_id):
        return [iam.PolicyStatement(actions=invoke, resources=[foundation_model_arn(stack, model_id, stack.region)])]
    base, profile = base_model_id(model_id), profile_arn(stack, model_id)
    regions = [stack.region, ""] if model_id.startswith(GLOBAL_PROFILE_PREFIX) else ["*"]
    return [
        iam.PolicyStatement(actions=invoke, resources=[profile]),
        iam.PolicyStatement(actions=invoke, resources=[foundation_model_arn(stack, base, r) for r in regions],
                            conditions={"StringEquals": {"bedrock:InferenceProfileArn": profile}}),
    ]


def _describe_statements(stack: Stack, model_id: str) -> list[iam.PolicyStatement]:
    """What the worker asks the Bedrock control plane when Converse fails in a way the model id may
    cause (model/bedrock.py ModelIdCheck): GetInferenceProfile on the profile, GetFoundationModel on the
    model in this region. Both are scoped to the one id."""
    model = iam.PolicyStatement(actions=["bedrock:GetFoundationModel"],
                                resources=[foundation_model_arn(stack, base_model_id(model_id), stack.region)])
    if not is_inference_profile(model_id):
        return [model]
    return [iam.PolicyStatement(actions=["bedrock:GetInferenceProfile"], resources=[profile_arn(stack, model_id)]),
            model]


# The model's quotas (model/quotas.py), read by the sweeper to publish them for the workers (pipeline/sweeper.py
# publish_quotas), and by the batch collector (its minimum records per job). Service Quotas' list actions take no
# resource ARN: "*" is the only resource they accept.
QUOTA_READ = iam.PolicyStatement(actions=["servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas"],
                                 resources=["*"])


def grant_bedrock(grantee: iam.IGrantable, stack: Stack, model_id: str) -> None:
    """Invoke `model_id` through Converse and describe it (the job-fatal `model.id_rejected` check). Its quotas are
    the sweeper's to read (`grant_quota_read`): the workers pace to what the sweeper publishes."""
    for statement in _invoke_statements(stack, model_id) + _describe_statements(stack, model_id):
        grantee.grant_principal.add_to_principal_policy(statement)


def grant_quota_read(grantee: iam.IGrantable, stack: Stack, model_id: str) -> None:
    """Read the model's quotas as Service Quotas names them (wiring.quota_reader): the model's name from the Bedrock
    control plane (GetFoundationModel; GetInferenceProfile for a profile id), then Service Quotas' lists."""
    for statement in _describe_statements(stack, model_id) + [QUOTA_READ]:
        grantee.grant_principal.add_to_principal_policy(statement)


def grant_ticket_secret(grantee: iam.IGrantable, stack: Stack, secret_resource: str, kms_key_arn: str = "") -> None:
    """Read the ticket system's credentials (adapters/tickets.py `SecretCredentials`): GetSecretValue on exactly that
    secret (`DeploySettings.ticket_secret_resource`), and kms:Decrypt with its customer-managed key when one is named,
    only as Secrets Manager's caller in this region (`kms:ViaService`)."""
    grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
        actions=["secretsmanager:GetSecretValue"], resources=[secret_resource]))
    if kms_key_arn:
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["kms:Decrypt"], resources=[kms_key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{stack.region}.amazonaws.com"}}))
