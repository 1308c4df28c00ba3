"""CDK infrastructure for the contract-review pipeline.

One stack (`ContractReviewStack`) wired from small constructs, all built from one
`contract_review.config.profile.Profile`:

- `queues.QueueWithDlq`: a queue, its DLQ (redrive-allow: its source only) and their alarms; owns
  the queue rules and fails synth when they are broken.
- `monitoring.AlarmTopic` / `monitoring.Monitoring`: the SNS topic every alarm notifies, the
  function/backpressure/stuck-job alarms and the dashboard.
- `permissions.ACCESS`: per role, the actions its code calls on each resource.
- `tables.ReviewTables`: the six DynamoDB tables (jobs, claims, checkpoints, events, the daily token ledger, the runtime
  control).
- `storage.ArtifactBucket`: the artifacts bucket (+ its access-log bucket).
- `functions.PipelineFunction`: one Lambda function with its own role and log group.
- `fargate.FargateWorker`: the optional Fargate poller for the analysis queue (backlog scaling,
  scale-in protection).
- `nag`: cdk-nag wiring and every acknowledged finding, with its reason, in one place.

`application.create_app()` is the single entry used by `app.py` and by the tests.
"""
