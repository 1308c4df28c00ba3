"""Fixed numbers the services impose, and names every layer shares."""

LAMBDA_VISIBILITY_FACTOR = 6  # AWS: queue visibility >= 6 x function timeout for Lambda ESMs
SQS_MAX_VISIBILITY_S = 12 * 3600  # SQS: the longest visibility timeout (queue default or ChangeMessageVisibility)
# Lambda: an SQS event source mapping's ScalingConfig.MaximumConcurrency range
ESM_MIN_CONCURRENCY, ESM_MAX_CONCURRENCY = 2, 1000
# Lambda: the account's concurrency (default quota "Concurrent executions", L-B99A9384, 1,000 per region; new
# accounts may start lower, 10), of which reservations may leave no less than this unreserved
LAMBDA_MIN_UNRESERVED = 100
LAMBDA_CONCURRENCY_QUOTA_CODE = "L-B99A9384"
# The Powertools layer the functions use: its ARN is read at deploy time from AWS's public SSM parameter
# `<path>/<version>` (infra/functions.py builds the path from the runtime and architecture; a test keeps them equal)
POWERTOOLS_LAYER_PARAMETER_PATH = "/aws/service/powertools/python/arm64/python3.12"
POWERTOOLS_LAYER_VERSION = "3.37.0"  # the release pinned in requirements.txt (infra/deploy_settings.py)
FARGATE_MAX_STOP_TIMEOUT_S = 120  # ECS: the longest stopTimeout a Fargate container may have
OFFLINE_MODEL_ID = "offline-rules-v1"  # the deterministic rule model (doubles/offline_model.py), not an LLM
# SQS: one message, and the sum of one SendMessageBatch, at most 256 KiB (the queues keep the default
# MaximumMessageSize). Sizes are counted in UTF-8 bytes of the body.
SQS_MAX_MESSAGE_BYTES = 262_144
JSON_MAX_BYTES_PER_CHAR = 6  # JSON escapes a control character as \u001f; other characters are <= 4 UTF-8 bytes
ANALYSIS_MESSAGE_FIXED_BYTES = 4_096  # an analysis message without its text: ids, counters, resume_from (generous)

# The AWS SDK calls (DynamoDB, S3, SQS: wiring.aws_client_config): botocore's standard retry mode, its attempts in
# total, and its timeouts.
AWS_CALL_ATTEMPTS = 5
AWS_CONNECT_TIMEOUT_S = 5
AWS_READ_TIMEOUT_S = 30
# The scheduled functions that run one at a time: reserved concurrency 1 each (a run never overlaps the next, and
# batch work never takes the recovery sweeper's turn), no asynchronous retries (infra/stack.py; docs/infrastructure.md
# "Concurrency"). `review preflight` counts their reservations with the worker's.
ONE_AT_A_TIME_FUNCTIONS = ("sweeper", "collector")
