"""AWS adapters behind the ports: DynamoDB (jobs, claims), S3 (artifacts), SQS (queues).

Each method is one AWS call or one conditional write. Built once per process by
`wiring.build_deps` from a boto3 session, never at import."""
