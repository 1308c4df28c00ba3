"""The local tools: the `review` CLI, the local stack, the status page and the Job API on loopback. They reach the
product's use cases through `contract_review.operate` (the import contract in pyproject.toml)."""
