"""CDK infrastructure for the contract-review pipeline.

One stack (`ContractReviewStack`) wired from small constructs, all built from one
`contract_review.config.Profile`:

- `queues.QueueWithDlq`: a queue, its DLQ and DLQ alarm; owns the queue rules and fails synth
  when they are broken.
- `tables.ReviewTables`: the four DynamoDB tables.
- `storage.ArtifactBucket`: the artifacts bucket (+ its access-log bucket).
- `functions.PipelineFunction`: one Lambda function with its own role and log group.
- `fargate.FargateWorker`: the optional Fargate poller for the analysis queue.
- `nag`: cdk-nag wiring and every acknowledged finding, with its reason, in one place.

`application.create_app()` is the single entry used by `app.py` and by the tests.
"""
