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
- `sdk_layer.sdk_layer`: the functions' layer of the boto3/botocore requirements.txt pins.
- `fargate.FargateWorker`: the optional Fargate poller for the analysis queue (backlog scaling,
  scale-in protection).
- `nag`: cdk-nag wiring and every acknowledged finding, with its reason, in one place.

`application.create_app()` is the single entry used by `app.py` and by the tests.

The CDK runs on the Node that package.json pins (the npm package `node`, an LTS release: `npm ci` puts it in
node_modules/.bin), not on whatever Node the machine has: `npx cdk` finds it first on the PATH it gives the CLI, and
aws-cdk-lib's jsii runtime, started by the first `import aws_cdk` in this process, is told by `JSII_NODE` (set here,
before any module of this package imports aws_cdk; an explicit JSII_NODE wins). Without node_modules (no `npm ci`
yet), jsii starts the `node` on PATH.
"""

import os
from pathlib import Path

PINNED_NODE = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "node"
if PINNED_NODE.exists():
    os.environ.setdefault("JSII_NODE", str(PINNED_NODE))
