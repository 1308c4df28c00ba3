"""Sizing the worker fleet to the model quota (docs/runbook.md "Sizing the fleet to the quota").

A fleet smaller than the quota leaves it unused (a burst of contracts drains slower than it could); a larger
one only queues at the pacers. The number of workers that keeps the quota busy is about

    workers = quota calls per second x the time a chunk takes / the calls a chunk makes x margin
    the time a chunk takes = 6 call latencies (three rounds, each waiting for the slowest of up to 11 calls,
                             about twice the median) + the pipeline's own time per chunk

with quota calls per second = tokens per minute / 60 / the quota tokens a call counts. The fan-out window
(the chunks of one job in flight) is twice the fleet, as the profiles have it (20 and 40). `cdk deploy -c
model_tpm=N` sizes the fleet so (infra/deploy_settings.py), `-c worker_concurrency=W` sets it outright, and
with neither the profile's numbers stand (the workers still pace to the quota the sweeper publishes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The assumptions, from the prompt layout (review/analysts.py) and Bedrock's accounting (domain/model.py):
CALLS_PER_CHUNK = 17  # 11 analysts: 11 locate calls, and an assess call for those that found a clause (11-22)
# The warm-up call, then every analyst's locate at once, then every assess at once: a round lasts as long as its
# slowest call, about twice the median latency for 11 calls (lognormal, p99 ~2.5 x the median).
CHUNK_LATENCIES = 6
# Claim, checkpoints, findings, messages: measured 2.5 s a chunk on the local stack (moto on 2 busy cores; the knee
# in bench/results/tokens-knee.json: 3 workers left the quota idle, 4 kept it busy); less on AWS.
CHUNK_OVERHEAD_S = 2.5
# Quota tokens per call: the analyst's uncached part (~200), its share of the chunk's one cache write (~2,300 / 17)
# and 5 x an LLM-like answer of ~250 tokens; cache reads count nothing once a call is settled.
QUOTA_TOKENS_PER_CALL = 1_600
CALL_LATENCY_S = 5.0  # a Claude Sonnet call answering a few hundred tokens; `-c call_latency_s=S`
MARGIN = 1.25  # latency varies; the pacers, not the fleet, hold the quota
MIN_WORKERS, MAX_WORKERS = 2, 1000  # Lambda event source mapping MaximumConcurrency: 2..1000


@dataclass(frozen=True)
class Fleet:
    workers: int  # the worker's maximum concurrency (Lambda ESM) or the Fargate service's maximum tasks
    window: int  # the fan-out window: chunks of one job in flight
    quota_calls_per_s: float  # what the quota allows, at QUOTA_TOKENS_PER_CALL


def fleet_for_quota(tokens_per_minute: float, call_latency_s: float = CALL_LATENCY_S) -> Fleet:
    calls_per_s = tokens_per_minute / 60 / QUOTA_TOKENS_PER_CALL
    chunk_s = CHUNK_LATENCIES * call_latency_s + CHUNK_OVERHEAD_S
    workers = math.ceil(calls_per_s * chunk_s / CALLS_PER_CHUNK * MARGIN)
    workers = max(MIN_WORKERS, min(MAX_WORKERS, workers))
    return Fleet(workers=workers, window=2 * workers, quota_calls_per_s=round(calls_per_s, 2))
