"""One registry of stable error codes, and the envelope every failure becomes.

Classification reads structured fields only: botocore error codes, HTTP status codes, our own
exception types. Never message text. What each code does next is its row in the recovery policy (policy.py);
`docs/error-codes.md` is generated from both (`python -m contract_review.domain.policy`), and a test keeps
them equal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from pydantic import BaseModel, ConfigDict

from contract_review.domain.policy import recovery


class ErrorClass(StrEnum):
    TRANSIENT = "transient"  # may succeed if tried again: how, each code's row in policy.py says
    PERMANENT = "permanent"  # never retried
    SEMANTIC = "semantic"  # output failed validation: one repair attempt, then permanent
    POLICY = "policy"  # model refused / filtered: configured fallback, never retried
    STATE = "state"  # ownership or lifecycle conflict: stop work, let the owner finish


@dataclass(frozen=True)
class ErrorCode:
    code: str
    cls: ErrorClass
    cause: str
    recovery: str
    job_fatal: bool = False  # one occurrence fails the whole job (no other chunk can succeed)

    @property
    def retryable(self) -> bool:
        """Whether a later try may succeed: the code's row in the recovery policy says (policy.py), not this one."""
        return recovery(self.code).retryable


_CODES = [
    ErrorCode("model.throttled", ErrorClass.TRANSIENT,
              "The model provider rejected the call for quota (HTTP 429 ThrottlingException / ModelNotReadyException; Bedrock: \"Too many requests\" for the requests-per-minute quota, \"Too many tokens\" for tokens-per-minute, no Retry-After header).",
              "Backpressure, not failure: retried in the worker with full-jitter backoff (a Retry-After, when a provider sends one, is a floor), then the chunk is requeued with a delay. Never burns the receive count or the poison budget; bounded by the backpressure deadline (runtime.backpressure_exhausted)."),
    ErrorCode("model.unavailable", ErrorClass.TRANSIENT,
              "The model provider failed (HTTP 5xx: ServiceUnavailableException, InternalServerException).",
              "Retried with full-jitter backoff (tier 1), then by queue redelivery (tier 2) after a backoff growing to "
              "minutes (prod 15-30 s, then doubling to 2-4 min); the 5th failed attempt dead-letters the chunk, so a "
              "provider outage shorter than ~3.5 minutes dead-letters nothing. After a longer one: `review dlq "
              "redrive --all` (or `review retry JOB`) once it is over."),
    ErrorCode("model.timeout", ErrorClass.TRANSIENT,
              "The model call timed out (HTTP 408 ModelTimeoutException, or the client read timeout).",
              "Retried like model.unavailable. Check the model read timeout if it persists."),
    ErrorCode("model.output_invalid", ErrorClass.SEMANTIC,
              "The model's output failed schema validation, was truncated (stopReason max_tokens) or malformed.",
              "One repair attempt with the validation error fed back; then permanent for that analyst."),
    ErrorCode("model.refused", ErrorClass.POLICY,
              "The model refused or its output was filtered (stopReason content_filtered / guardrail_intervened).",
              "The analyst records a `refused` finding (policy fallback); the chunk is not retried. Coverage shows it."),
    ErrorCode("model.access_denied", ErrorClass.PERMANENT,
              "The account or role may not invoke the model (HTTP 403 AccessDeniedException).",
              "The job fails at once. Grant bedrock:InvokeModel on the model and enable model access, then "
              "`review retry JOB` (or submit the same document again with `review submit`, which does the same): "
              "the job runs again, keeping its finished chunks and checkpoints.",
              job_fatal=True),
    ErrorCode("model.not_found", ErrorClass.PERMANENT,
              "The model id does not exist in this region (ResourceNotFoundException).",
              "The job fails at once. Pick a current model id, redeploy with `cdk deploy -c model_id=ID`, then "
              "`review retry JOB` (checkpoints made with another model are not reused).",
              job_fatal=True),
    ErrorCode("model.id_rejected", ErrorClass.PERMANENT,
              "Bedrock will not serve the configured model id: unknown in this region, retired (lifecycle not "
              "ACTIVE), or not invocable by that id (it needs an inference profile). Decided by asking the Bedrock "
              "control plane (GetInferenceProfile / GetFoundationModel) after Converse failed with "
              "ValidationException, ResourceNotFoundException or AccessDeniedException; never from the error text.",
              "Pick a current model or inference profile id (`review preflight --model-id ID` checks one), redeploy "
              "with `cdk deploy -c model_id=ID`, enable access to the model in the Bedrock console, then "
              "`review retry JOB` (checkpoints made with another model are not reused). The job fails at once; the "
              "message names the rejected id.", job_fatal=True),
    ErrorCode("model.not_granted", ErrorClass.PERMANENT,
              "The job runs on the model it recorded at intake (jobs keep their model), and this deploy does not "
              "grant that model: it was redeployed with another `-c model_id` without the job's model in "
              "`-c model_fallbacks`. Decided before any call: no call is made.",
              "Redeploy with `-c model_fallbacks=<the job's model id>` (the message names it) to let the job finish on "
              "its model, then `review retry JOB`: its finished chunks and checkpoints are kept. Or cancel it and "
              "submit the document again, to review it on the new model.", job_fatal=True),
    ErrorCode("model.not_catalogued", ErrorClass.PERMANENT,
              "A model id with no row in the model catalogue (functions/contract_review/config/catalogue.py; "
              "docs/models.md): its API, request rules, quota burndown and price are unknown. Refused before anything "
              "is written: by `review model use` (and by a synth with `-c model_id` / `-c model_fallbacks`).",
              "Use a catalogued id (the message lists them; an inference-profile prefix such as `global.` is "
              "accepted), or add the model's row to the catalogue."),
    ErrorCode("model.request_invalid", ErrorClass.PERMANENT,
              "The provider rejected the request (HTTP 400 ValidationException).",
              "A bug or an input the model cannot take; the chunk fails permanently and the job ends `failed` "
              "(job.chunks_missing). Inspect the envelope, fix the cause, then `review retry JOB`."),
    ErrorCode("model.circuit_open", ErrorClass.STATE,
              "The worker's circuit breaker for the model is open: its recent calls failed in a row (provider 5xx "
              "or timeouts), so no call is sent until it half-opens (breaker.py).",
              "Nothing to do: the chunk is released as backpressure (checkpoints kept, no attempt spent) and comes "
              "back after at least the time the breaker stays open; one probe call half-opens it and a success "
              "closes it. Sustained: the provider is failing; see its health page. Bounded by the backpressure "
              "deadline (runtime.backpressure_exhausted)."),
    ErrorCode("model.paused", ErrorClass.STATE,
              "An operator paused the model (`review quota pause`): no model call starts while it is paused (the "
              "workers read the pause within the profile's model_control_max_age_s, prod 60 s).",
              "`review quota resume`. Meanwhile each chunk is held as backpressure: checkpoints kept, requeued with a "
              "growing delay, no failure counted, and the backpressure deadline does not dead-letter it for the "
              "pause."),
    ErrorCode("model.spend_capped", ErrorClass.STATE,
              "The stack's recorded model spend of the UTC day reached its daily spend cap (profile "
              "daily_spend_cap_usd, `-c daily_spend_cap_usd=N`; domain/spend_cap.py): the sweeper set the spend-cap "
              "hold in the runtime control and no model call starts until 00:00 UTC.",
              "Nothing is lost: each chunk is held as backpressure (checkpoints kept, no failure counted, not "
              "dead-lettered for the hold) and goes on at 00:00 UTC. To go on today: `review quota resume "
              "--override-cap` (lifts the cap for the rest of the UTC day); to change the cap: `npx cdk deploy "
              "-c daily_spend_cap_usd=<usd>` (docs/cost.md \"The stack's daily spend cap\")."),
    ErrorCode("model.switched", ErrorClass.STATE,
              "The job moved to the next model of the deploy's fallback chain (`-c model_fallbacks`; "
              "pipeline/fallback.py): its model was refused as unavailable (model.access_denied, model.not_found, "
              "model.id_rejected: access revoked, suspended, retired; decided from those codes, never the message), "
              "or held by its own daily token quota longer than fallback_after_daily_hold_s; or an operator switched "
              "the stack's model (`review model use ID`). The job records `job.model_switched` with the reason.",
              "Nothing: the chunk is requeued at once and goes on with the next model; the checkpoints its analysts "
              "made on the earlier model are kept (nothing runs or is billed twice). `review status JOB` names the "
              "models; `review model use ID` / `review model reset` set the model by hand."),
    ErrorCode("model.daily_quota_exhausted", ErrorClass.STATE,
              "The model's daily token quota (Service Quotas: \"Model invocation max tokens per day for <model>\"; "
              "or the profile's model_tokens_per_day) is at least daily_quota_threshold (prod 98 %) used over the "
              "last 24 hours, as the stack's own daily token ledger counts it (a DynamoDB counter per model per "
              "hour that every worker adds the tokens its calls counted to). Decided from the ledger against the "
              "quota, never from a throttle's text: Bedrock's throttle does not say which quota it hit.",
              "Nothing, or raise the quota: each chunk is held as backpressure (checkpoints kept, requeued with "
              "the longest delay, no failure counted, no model call made) and the backpressure deadline does not "
              "dead-letter it for the hold; the job shows `waiting: daily token quota of MODEL, re-probed "
              "hourly` (`review status`, GET /jobs/{id}). Once an hour one call per model is let through as a probe: "
              "when it succeeds (the quota reset, or was raised) the hold lifts for every worker within "
              "daily_ledger_max_age_s; when it fails the hold lasts another hour. To end it sooner: raise the quota "
              "in Service Quotas (docs/runbook.md \"Daily token quota exhausted\")."),
    ErrorCode("control.contended", ErrorClass.TRANSIENT,
              "A write of the runtime control (`review quota ...`, or the batch collector turning a model's batch "
              "lane off) lost its compare-and-set to other writers every time it tried (adapters/model_control.py "
              "CONTROL_WRITE_ATTEMPTS in a row): each attempt read the control again and found it changed.",
              "Nothing was written by this command: run it again (`review quota show` says what the control holds "
              "now). The collector tries again at its next run."),
    ErrorCode("batch.request_invalid", ErrorClass.PERMANENT,
              "A batch inference job was asked for with records it cannot take (two records share a recordId).",
              "A defect in whoever built the records (docs/batch-inference.md): nothing is submitted; fix the caller."),
    ErrorCode("batch.job_failed", ErrorClass.TRANSIENT,
              "A Bedrock batch inference job ended without an output to rely on (status Failed, Stopped or Expired: "
              "too few records, a bad record file, the service role, its timeout).",
              "Nothing to do: its chunks go back to be batched again by themselves (event `batch.returned`); a chunk "
              "whose batches failed `batch_max_failures` times goes on demand. `GetModelInvocationJob`'s `message` "
              "says why (`review status JOB` shows the batch job); docs/batch-inference.md."),
    ErrorCode("batch.record_failed", ErrorClass.TRANSIENT,
              "One record of a batch inference job was answered with an error, or has no line in the job's output "
              "(a partially completed job).",
              "Nothing to do: the record is asked again in the next batch job by itself; a chunk whose batches left "
              "records unanswered `batch_max_failures` times goes on demand. docs/batch-inference.md."),
    ErrorCode("batch.refused", ErrorClass.PERMANENT,
              "Bedrock refused to create a batch inference job for good (CreateModelInvocationJob answered "
              "ValidationException, AccessDeniedException or ResourceNotFoundException: the model or inference "
              "profile is not offered in batch in this region, the role may not, or what it names does not exist; "
              "ServiceQuotaExceededException, too many batch jobs in flight, is backed off instead). No offline check proves a profile is accepted by batch: there is "
              "no dry run.",
              "Nothing to do for the jobs: the chunks of the refused batch job go on demand at once (event "
              "`batch.refused` with Bedrock's reason), and the batch lane is turned off for the model (`review quota "
              "show` says why): `inference: batch` jobs are admitted and run on demand, each with a "
              "`batch.unavailable` event. Fix the cause (`review preflight` shows the model's batch quota row; pick a "
              "model or profile offered in batch, or raise the quota), then `review quota batch --on`. "
              "docs/batch-inference.md."),
    ErrorCode("input.invalid", ErrorClass.PERMANENT,
              "The intake message is not valid JSON or violates the intake schema v1.",
              "Fix the message (see docs/intake-message.schema.json) and send it again. Never retried."),
    ErrorCode("input.empty_document", ErrorClass.PERMANENT,
              "The document has no text (empty, or only whitespace, control characters and invisible format characters "
              "such as zero-width spaces, BOMs and bidi marks).", "Send a document with text."),
    ErrorCode("input.undecodable", ErrorClass.PERMANENT,
              "The document is not UTF-8 plain text: another encoding (a UTF-16 or UTF-32 byte-order mark names "
              "it), a binary file (PDF, Word, ZIP), or markup (RTF, an HTML page) that would be reviewed tags and all "
              "(domain/plain_text.py; the message says which, from the bytes).",
              "Convert the document to UTF-8 plain text (the message gives the command) and send it again."),
    ErrorCode("input.document_missing", ErrorClass.PERMANENT,
              "The s3_uri points at an object that does not exist or may not be read.",
              "Upload the document first, to the stack's bucket, and reference it."),
    ErrorCode("input.document_forbidden", ErrorClass.PERMANENT,
              "The s3_uri points outside the stack's own bucket and its `uploads/` prefix (intake reads nothing else).",
              "Upload the document to s3://<ArtifactBucketName>/uploads/ and send its s3_uri."),
    ErrorCode("input.too_large", ErrorClass.PERMANENT,
              "The document exceeds the maximum size: inline text over 200,000 characters, or an s3_uri object "
              "over 5 MB.",
              "Send inline text over the limit through `s3_uri` (upload it to uploads/; `review submit` does this); "
              "split a document over 5 MB."),
    ErrorCode("input.key_conflict", ErrorClass.PERMANENT,
              "The idempotency key is already the key of a job for another document (a different SHA-256): the "
              "key names one job, and a job never mixes two documents.",
              "Nothing of the existing job is touched; the message is put on the intake DLQ with this envelope and the "
              "existing job records an `intake.key_conflict` event. Send the document with its own idempotency key "
              "(or none: the SHA-256 of the text is the default key). `review dlq redrive` skips it."),
    ErrorCode("aws.throttled", ErrorClass.TRANSIENT,
              "An AWS API throttled us (ThrottlingException, ProvisionedThroughputExceededException, RequestLimitExceeded...).",
              "Retried by botocore (standard mode: 5 attempts, jittered exponential backoff). If it persists in the "
              "analysis worker it is backpressure like model.throttled: checkpoints kept, the chunk requeued with a "
              "growing delay, no failure counted, bounded by the backpressure deadline. In intake and the aggregator "
              "the message is retried by its queue."),
    ErrorCode("aws.unavailable", ErrorClass.TRANSIENT,
              "An AWS API failed with HTTP 5xx or the connection failed.",
              "Retried by botocore (standard mode, 5 attempts), then by the queue (tier 2, a failed attempt)."),
    ErrorCode("aws.access_denied", ErrorClass.PERMANENT,
              "A function's role lacks a permission (AccessDenied).",
              "The job fails at once. Fix the grant in infra/ and redeploy, then `review retry JOB`.",
              job_fatal=True),
    ErrorCode("aws.client_error", ErrorClass.PERMANENT,
              "An AWS API rejected a request for another reason (HTTP 4xx).",
              "Inspect provider_code; it is a bug. The chunk fails (the job ends `failed`, job.chunks_missing): once "
              "fixed and deployed, `review retry JOB`."),
    ErrorCode("runtime.lease_lost", ErrorClass.STATE,
              "This worker's claim on the chunk lapsed and another worker took it (fencing token moved on).",
              "None: the new owner finishes the chunk. The stale worker's writes were rejected."),
    ErrorCode("runtime.worker_lost", ErrorClass.TRANSIENT,
              "A worker died while holding the chunk (crash, kill -9, out of memory) and left no error behind.",
              "The sweeper re-enqueues the chunk after its lease lapses, counting a failed attempt; after the poison "
              "budget it is dead-lettered (fix the crash, then `review dlq redrive` or `review retry JOB`). A lease "
              "that lapsed after the invocation's recorded deadline is a function timeout, not a crash: released as "
              "runtime.time_exhausted without a failure."),
    ErrorCode("runtime.retry_budget_exhausted", ErrorClass.TRANSIENT,
              "Tier-1 retries used the chunk's retry budget (seconds of backoff) or its attempts.",
              "The chunk goes back to the queue (tier 2) with its checkpoints saved."),
    ErrorCode("runtime.checkpoint_missing", ErrorClass.STATE,
              "A checkpoint referenced by a record could not be loaded (S3 object missing).",
              "The analyst is re-run; an event records it."),
    ErrorCode("runtime.time_exhausted", ErrorClass.TRANSIENT,
              "The function's remaining time could not fit another model call (or the invocation reached its timeout).",
              "Checkpoints are kept and the chunk is handed back (requeued fresh) without counting a failure. Only when "
              "the attempt saw transient errors (cause_code) and checkpointed nothing does it count as a failed "
              "attempt. Repeated handoffs without progress end at the backpressure deadline."),
    ErrorCode("runtime.backpressure_exhausted", ErrorClass.PERMANENT,
              "A chunk made no progress (no analyst checkpointed) under backpressure (throttling, running out of "
              "time, function timeouts) for longer than the profile's backpressure deadline (prod 6 h).",
              "The chunk is dead-lettered; the message says for how long and after how many requeues, cause_code "
              "names the last backpressure error. Raise the model (or DynamoDB) quota or lower the worker "
              "concurrency, then `review dlq redrive` (or `review retry JOB`)."),
    ErrorCode("runtime.dead_lettered", ErrorClass.PERMANENT,
              "A chunk exhausted its receive count or poison budget and was dead-lettered.",
              "Inspect with `review dlq list` / `review dlq show`, fix the cause, then `review dlq redrive` or "
              "`review retry JOB` (which needs no DLQ message: it reopens the job from its chunk records, keeping "
              "finished chunks and checkpoints)."),
    ErrorCode("runtime.receives_exhausted", ErrorClass.TRANSIENT,
              "The analysis queue moved a chunk's message to its DLQ after maxReceiveCount receives while the chunk "
              "still had attempt budget: the receives were not failed attempts (Lambda throttling of the event "
              "source, errors before the claim).",
              "None needed: the sweeper sends the chunk again as backpressure (delayed, no failure counted) and "
              "removes the DLQ copy; a chunk that keeps coming back ends at the backpressure deadline "
              "(runtime.backpressure_exhausted)."),
    ErrorCode("runtime.intake_exhausted", ErrorClass.TRANSIENT,
              "Intake never finished a document's intake message (a crash, a function timeout or a transient error "
              "on every delivery) and the queue moved it to the intake DLQ; the sweeper fails the `queued` job with "
              "this code and puts the message back on the intake DLQ with the job id and this envelope.",
              "Look at the intake function's logs for the message id; fix the cause, then `review retry JOB` (or "
              "`review dlq redrive MESSAGE_ID`): the job goes back to `queued` and its intake message is sent again. "
              "Without the DLQ message, `review submit FILE` with the same document does the same."),
    ErrorCode("runtime.internal", ErrorClass.PERMANENT,
              "An unexpected exception in our code (a bug).", "Inspect the envelope's provider_code (exception type) and logs."),
    ErrorCode("job.chunks_missing", ErrorClass.PERMANENT,
              "The job ended with mandatory analyst coverage missing on some chunks (a chunk that failed "
              "permanently, or a mandatory analyst that refused or whose output stayed invalid).",
              "`review status JOB` lists each missing chunk and gap with its error; fix the cause, then `review retry "
              "JOB`: failed chunks run again, and the analysts with a mandatory gap run again on their chunks; "
              "finished chunks and the other checkpoints are kept."),
    ErrorCode("job.cancelled", ErrorClass.STATE, "The job was cancelled.",
              "Nothing, if you meant it: work stopped and its side effects were undone. To resume it: `review retry "
              "JOB` (or the same document again): it continues from its checkpoints, its cancelled chunks run again."),
    ErrorCode("job.budget_exceeded", ErrorClass.POLICY,
              "The job's recorded cost (model tokens x the model's price + orchestration requests x list prices, "
              "docs/cost.md) reached the budget it was submitted with (`budget_usd`). Checked by the aggregator "
              "each time a chunk settles.",
              "The job was stopped like a cancel: no model call started after the stop was seen, chunks in flight "
              "settled `cancelled` within one model call, no report was written and no side effect ran; it ends "
              "`cancelled` with this code, its cost on the job (`review status JOB`). To finish the review: `review retry "
              "JOB --budget-usd N` with N above what it has cost continues it from its checkpoints (its cancelled "
              "chunks run again, its done ones are kept)."),
    ErrorCode("job.budget_insufficient", ErrorClass.POLICY,
              "The document's estimated cost (its chunks x the calls each makes x the tokens of the prompt layout "
              "and of an LLM-like answer, at the dated price table: `cost.estimate_document`) is over the budget "
              "it was submitted with. Refused before any model call: by `review submit` and `POST /jobs` (422) "
              "before anything is sent, by intake for a message sent to the queue (the job ends `failed`).",
              "Send the document again with a budget of at least the estimate the message states (or without one); "
              "under the same idempotency key it replaces the refused job. Nothing ran and nothing was charged."),
    ErrorCode("sideeffect.failed", ErrorClass.TRANSIENT,
              "A side effect of a finished review failed for good: the external ticket system, SNS or EventBridge "
              "answered an error (HTTP 5xx, or a 4xx such as 422 for an idempotency key sent again with other "
              "parameters) or could not be reached, on every tier-1 attempt. `step` names the call (ticket.open, "
              "report.publish, ticket.lookup, ticket.close); http_status and provider_code say how it failed.",
              "The saga stops and the job fails with this code: `compensating` while the steps started or done are "
              "compensated (the ticket closed with a comment, a \"Review withdrawn\" event published), then `failed`. Fix the cause (the ticket system, "
              "`-c ticket_url`, the topic), then `review retry JOB`: the report is written again and the side effects "
              "run again; a step that was compensated runs as a new one (a new ticket, the closed one stays closed), "
              "the others keep their keys, so nothing is done twice."),
    ErrorCode("sideeffect.unauthorized", ErrorClass.PERMANENT,
              "The external ticket system refused our credentials (HTTP 401 or 403), again after the secret was "
              "read once more (a rotation is picked up that way), or the credentials could not be read: the secret "
              "that `-c ticket_secret_arn` names is missing, not readable by the function (AccessDenied), or not "
              "`{\"bearer_token\": \"...\"}` nor `{\"header\": \"X-API-Key\", \"value\": \"...\"}`. Nothing was written. "
              "Distinct from a rejected request (sideeffect.failed with a 4xx).",
              "The saga stops and the job fails with this code (what was done is compensated, as for "
              "sideeffect.failed). Put a valid credential in the secret: `aws secretsmanager put-secret-value "
              "--secret-id <ticket_secret_arn> --secret-string '{\"bearer_token\": \"<token>\"}'` (no redeploy: the "
              "functions read it again within ticket_secret_max_age_s, prod 300 s, and at once on a 401/403); a stack "
              "without credentials: `npx cdk deploy -c profile=prod -c ticket_url=<url> -c ticket_secret_arn=<arn>` (docs/runbook.md "
              "\"Ticket system credentials\"). Then `review retry JOB`."),
    ErrorCode("sideeffect.ambiguous", ErrorClass.STATE,
              "A side effect's request was sent but its answer never came (a read timeout, a dropped connection): "
              "it may or may not have happened. The ticket is then looked up by its idempotency key; this code "
              "stays only when the lookup cannot tell (no ticket under the key, or the lookup fails).",
              "The job waits in `waiting_approval` with the evidence (`Job.approval`: step, key, this envelope, what "
              "the lookup said, expires_at). Look the key up in the ticket system, then `review approve JOB` (the "
              "step is retried with the same key, which the ticket system dedups, and the job goes on) or `review "
              "reject JOB` (the job fails with job.approval_rejected and what was done is compensated)."),
    ErrorCode("sideeffect.compensation_failed", ErrorClass.TRANSIENT,
              "Undoing a side effect of a cancelled or failed job (closing its ticket, publishing \"Review "
              "withdrawn\") failed on every attempt; cause_code is the last error.",
              "The compensation order (job, step, keys, arguments) is on the compensation DLQ with this envelope, "
              "its alarm fires, and the job's step is marked `compensation_failed`: never assumed undone. Fix the "
              "cause, then `review compensations --redrive` (`saga.redrive_compensations`): each compensation keeps "
              "its own key, so a repeat closes or withdraws nothing twice."),
    ErrorCode("job.approval_rejected", ErrorClass.POLICY,
              "A person rejected a job waiting for approval (a side effect whose outcome stayed unknown).",
              "The job fails with this code: `compensating` while its side effects are compensated (the unknown "
              "one too, looked up by its key), then `failed`. Nothing to repair: it was a decision."),
    ErrorCode("job.approval_expired", ErrorClass.POLICY,
              "Nobody approved or rejected a job waiting for approval before its `expires_at` (profile "
              "approval_ttl_s after the request).",
              "The sweeper fails the job with this code (`compensating`, then `failed`) and its side effects are "
              "compensated, as for a rejection. Decide sooner, or raise approval_ttl_s."),
    # the spend limits (operate/limits.py): refusals at admission, never a job's state
    ErrorCode("quota.spend_exceeded", ErrorClass.POLICY,
              "A Job API submission whose estimate would take its principal's admissions of the UTC day over the "
              "stack's daily cap (profile principal_daily_spend_usd: prod $500; `-c principal_daily_spend_usd=N`). "
              "Refused before it was queued: no job, no model call.",
              "Send it after 00:00 UTC (the 429 answer's Retry-After says when), split the work over days, or have "
              "the operator raise the cap: `npx cdk deploy -c principal_daily_spend_usd=<usd>` (docs/cost.md "
              "\"Spend limits\"). A replay of a submission already admitted is never refused."),
    ErrorCode("quota.spend_cap", ErrorClass.POLICY,
              "A job whose estimate would take the stack's admissions of the UTC day over its daily spend cap "
              "(profile daily_spend_cap_usd: prod $1,000; `-c daily_spend_cap_usd=N`), whoever sent it.",
              "The Job API refuses it (429, Retry-After until 00:00 UTC; nothing queued): send it again then. A job "
              "sent to the intake queue (or with `review submit`) is not failed: it stays `queued`, waiting with "
              "condition spend_cap, and the sweeper starts it after 00:00 UTC. `review quota resume --override-cap` "
              "lifts the cap for the rest of the UTC day (the waiting jobs start within a sweep); to change it: "
              "`npx cdk deploy -c daily_spend_cap_usd=<usd>`. A job whose estimate alone is over the cap could never "
              "start: refused for good (the Job API's 422, a failed job from the queue); split the document or raise "
              "the cap, then send it again (the same key replaces the failed job)."),
    ErrorCode("api.unauthenticated", ErrorClass.PERMANENT,
              "A Job API request carried no authenticated principal (on AWS the HTTP API's IAM authorization lets "
              "no unsigned request through; locally: no bearer token, or an unknown one).",
              "Sign the request with SigV4 for service execute-api (AWS; the caller needs execute-api:Invoke on the "
              "API) or send `Authorization: Bearer <api_token>` from .review/local.json (local), then send it again."),
    ErrorCode("api.not_found", ErrorClass.PERMANENT,
              "No such job, batch or route, or the job or batch belongs to another principal (the API does not "
              "reveal which).",
              "Check the id (the jobId and statusUrl your POST returned) and call as the principal that submitted "
              "it. A job sent straight to the intake queue has no principal and is not visible through the API: "
              "`review status JOB` shows it."),
    ErrorCode("api.conflict", ErrorClass.STATE,
              "The job's state does not allow the action: cancelling a job that has ended, an approval for a job "
              "that is not waiting for one, a retry with nothing to retry, the report of a job that has none yet (it "
              "is written when the job completes), or any action on a job intake has not taken in yet.",
              "Read the job (GET /jobs/{id}); the message says why. For a job intake has not taken in yet the "
              "answer carries Retry-After: send the request again then. Otherwise nothing to do: the job goes on "
              "or has ended."),
    ErrorCode("api.rate_limited", ErrorClass.TRANSIENT,
              "A principal sent more Job API requests in a minute than the stack takes from one principal (profile "
              "api_requests_per_minute: prod 600; `-c api_requests_per_minute=N`), counted in the function.",
              "Wait for the answer's Retry-After (the next minute) and send it again; poll a job's events with "
              "`?after=SEQ` (or the local event stream) rather than in a tight loop. Nothing was done."),
    ErrorCode("api.invalid_request", ErrorClass.PERMANENT,
              "A Job API request the API does not take as sent: a bad query parameter, Idempotency-Key or approval "
              "body, or a method the route does not serve (405).",
              "Fix the request as the message says (docs/openapi.yaml) and send it again."),
]

REGISTRY: dict[str, ErrorCode] = {c.code: c for c in _CODES}


class ErrorEnvelope(BaseModel):
    """The data form of every failure. Stored on chunk and job records and in DLQ attributes."""

    model_config = ConfigDict(frozen=True)

    error_code: str
    error_class: ErrorClass
    retryable: bool
    retry_after_s: float | None = None
    http_status: int | None = None
    provider_code: str | None = None
    message: str = ""
    step: str = ""
    attempt: int = 0
    cause_code: str | None = None  # for wrapper codes (retry budget exhausted): the error behind it
    first_seen_at: float = 0.0
    last_seen_at: float = 0.0

    @classmethod
    def of(cls, code: str, message: str = "", **kw: Any) -> ErrorEnvelope:
        spec = REGISTRY[code]
        now = time.time()
        kw.setdefault("first_seen_at", now)
        kw.setdefault("last_seen_at", now)
        return cls(error_code=code, error_class=spec.cls, retryable=spec.retryable, message=message[:500], **kw)

    @property
    def job_fatal(self) -> bool:
        return REGISTRY[self.error_code].job_fatal


class ReviewError(Exception):
    """An exception that already carries its envelope."""

    def __init__(self, envelope: ErrorEnvelope):
        super().__init__(f"{envelope.error_code}: {envelope.message}")
        self.envelope = envelope

    @classmethod
    def of(cls, code: str, message: str = "", **kw: Any) -> ReviewError:
        return cls(ErrorEnvelope.of(code, message, **kw))


class LeaseLost(ReviewError):
    def __init__(self, message: str = "fencing token moved on"):
        super().__init__(ErrorEnvelope.of("runtime.lease_lost", message))


# --- classification --------------------------------------------------------------------
_MODEL_CODES = {
    "ThrottlingException": "model.throttled",
    "ModelNotReadyException": "model.throttled",
    "ServiceQuotaExceededException": "model.throttled",
    "TooManyRequestsException": "model.throttled",
    "ServiceUnavailableException": "model.unavailable",
    "InternalServerException": "model.unavailable",
    "ModelErrorException": "model.unavailable",
    "ModelTimeoutException": "model.timeout",
    "ValidationException": "model.request_invalid",
    "AccessDeniedException": "model.access_denied",
    "ResourceNotFoundException": "model.not_found",
}
_AWS_THROTTLE = {
    "ThrottlingException", "Throttling", "ThrottledException", "RequestLimitExceeded",
    "ProvisionedThroughputExceededException", "RequestThrottled", "SlowDown", "TooManyRequestsException",
    "RequestThrottledException", "LimitExceededException",
}
_AWS_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "KMS.AccessDeniedException"}
_MODEL_STATUS = {429: "model.throttled", 408: "model.timeout", 403: "model.access_denied", 404: "model.not_found"}


def _retry_after(response: dict[str, Any]) -> float | None:
    headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    raw = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None  # an HTTP-date Retry-After: ignored, backoff applies


def may_be_billed(exc: BaseException) -> bool:
    """A model call that failed after its request reached the service, with no answer to measure: the client's read
    timeout (the request was sent; the service may have run it to the end and bills it all the same). A connect
    timeout never reached it; an error the service answered (a throttle, a 5xx, its own 408) is not billed as far as
    its documentation says."""
    from botocore.exceptions import ReadTimeoutError

    return isinstance(exc, ReadTimeoutError)


def classify(exc: BaseException, *, step: str = "", attempt: int = 0, model_call: bool = False) -> ErrorEnvelope:
    """Turn any exception into an envelope, from structured fields only."""
    from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ReviewError):
        return exc.envelope.model_copy(update={"step": exc.envelope.step or step, "attempt": attempt or exc.envelope.attempt})
    if isinstance(exc, ClientError):
        response = cast(dict[str, Any], exc.response)
        provider_code = str((response.get("Error") or {}).get("Code", ""))
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        status = int(status) if status is not None else None
        if model_call:
            code = _MODEL_CODES.get(provider_code) or _MODEL_STATUS.get(status or 0)
            if code is None:
                code = "model.unavailable" if (status or 500) >= 500 else "model.request_invalid"
        elif provider_code in _AWS_THROTTLE or status == 429:
            code = "aws.throttled"
        elif provider_code in _AWS_DENIED or status == 403:
            code = "aws.access_denied"
        elif status is not None and status >= 500:
            code = "aws.unavailable"
        else:
            code = "aws.client_error"
        return ErrorEnvelope.of(
            code, str(exc), http_status=status, provider_code=provider_code or None,
            retry_after_s=_retry_after(response), step=step, attempt=attempt,
        )
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, TimeoutError)):
        return ErrorEnvelope.of("model.timeout" if model_call else "aws.unavailable", str(exc),
                                provider_code=type(exc).__name__, step=step, attempt=attempt)
    if isinstance(exc, (BotoConnectionError, ConnectionError)):
        return ErrorEnvelope.of("model.unavailable" if model_call else "aws.unavailable", str(exc),
                                provider_code=type(exc).__name__, step=step, attempt=attempt)
    # The type only: an arbitrary exception's text may quote document content (pydantic inputs...).
    return ErrorEnvelope.of("runtime.internal", f"unexpected {type(exc).__name__}", provider_code=type(exc).__name__,
                            step=step, attempt=attempt)


def classify_batch_submit(exc: BaseException) -> ErrorEnvelope:
    """A failed CreateModelInvocationJob: `batch.refused` (not retryable) for the error codes that refuse the job for
    good (domain/batch_inference.py REFUSALS, from the botocore error code: never the message); `aws.throttled` for a batch
    quota in use (BACKOFFS: it frees as jobs end); else what `classify` makes of it (throttling, 5xx, a connection:
    retried with backoff)."""
    from botocore.exceptions import ClientError

    from contract_review.domain.batch_inference import BACKOFFS, REFUSALS

    if isinstance(exc, ClientError):
        response = cast(dict[str, Any], exc.response)
        provider_code = str((response.get("Error") or {}).get("Code", ""))
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if provider_code in REFUSALS or provider_code in BACKOFFS:
            said = str((response.get("Error") or {}).get("Message", "")) or "no message"  # Bedrock's, not botocore's
            return ErrorEnvelope.of("batch.refused" if provider_code in REFUSALS else "aws.throttled",
                                    f"{provider_code}: {said}", provider_code=provider_code,
                                    http_status=int(status) if status is not None else None, step="batch.submit")
    return classify(exc, step="batch.submit")
