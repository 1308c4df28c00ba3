"""THE BASELINE, not product code: what a serverless developer writes with Powertools alone.

`handler.py` is its Lambda handler; `bench/quota.py --only ...,baseline` runs it beside the pipeline."""
