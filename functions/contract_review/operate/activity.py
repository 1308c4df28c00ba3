"""Model activity over time, for the status page's chart: calls, throttles and quota use of the settled chunks.

A throttle is a tier-1 retry of a code that slows the model's quota, as the error policy says
(`domain/policy.py` `slows_model_quota`): the chart counts what the pacing reacts to.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.errors import REGISTRY
from contract_review.domain.model import quota_tokens
from contract_review.domain.policy import slows_model_quota
from contract_review.domain.ports import Deps
from contract_review.domain.records import Job

THROTTLE_CODES = frozenset(code for code in REGISTRY if slows_model_quota(code))  # a tier-1 retry of one: a throttle
ACTIVITY_WINDOW_S = 3600.0  # the status page's chart: at most the last hour
ACTIVITY_BUCKETS = 30
ACTIVITY_MIN_BUCKET_S = 5.0


@dataclass(frozen=True)
class ChunkActivity:
    """What one settled chunk spent, at the time it settled: model calls, throttles (tier-1 retries of a
    throttle code), and the tokens its calls counted against the tokens-per-minute quota."""

    at: float
    calls: int
    throttles: int
    quota_tokens: int


class ActivityView(BaseModel):
    """Model calls, throttles and quota use over time, in equal buckets from `start` (the status page's chart).
    `quota_use`: each bucket's quota tokens per minute over `tokens_per_minute`, when the stack knows the quota it
    paces to (`-c model_tpm`, or the profile's); None when it paces to the quota the sweeper publishes."""

    start: float
    bucket_s: float
    calls: list[int]
    throttles: list[int]
    quota_tokens: list[int]
    tokens_per_minute: float | None = None
    quota_use: list[float] | None = None


def chunk_activity(job: Job, chunks: list[ChunkRecord], model_id: str) -> list[ChunkActivity]:
    """The job's settled chunks' activity (their records' counters, summed over their attempts)."""
    model = job.model_id or model_id
    return [ChunkActivity(at=c.settled_at, calls=c.n_calls,
                          throttles=sum(n for code, n in c.retries.items() if code in THROTTLE_CODES),
                          quota_tokens=quota_tokens(model, c.input_tokens, c.cache_write_tokens, c.output_tokens))
            for c in chunks if c.settled_at is not None]


def activity(points: list[ChunkActivity], now: float, tokens_per_minute: float | None,
             window_s: float = ACTIVITY_WINDOW_S, buckets: int = ACTIVITY_BUCKETS) -> ActivityView:
    """Bucket the chunks' activity from the first one within the window (at most `window_s` ago) to now."""
    recent = [p for p in points if p.at >= now - window_s]
    start = min((p.at for p in recent), default=now - ACTIVITY_MIN_BUCKET_S * buckets)
    bucket_s = max(ACTIVITY_MIN_BUCKET_S, -(-(now - start) // buckets))  # ceil: the last bucket holds `now`
    calls, throttles, tokens = [0] * buckets, [0] * buckets, [0] * buckets
    for p in recent:
        i = min(buckets - 1, int((p.at - start) // bucket_s))
        calls[i] += p.calls
        throttles[i] += p.throttles
        tokens[i] += p.quota_tokens
    use = [round(t * 60.0 / bucket_s / tokens_per_minute, 4) for t in tokens] if tokens_per_minute else None
    return ActivityView(start=start, bucket_s=bucket_s, calls=calls, throttles=throttles, quota_tokens=tokens,
                        tokens_per_minute=tokens_per_minute, quota_use=use)


def paced_tokens_per_minute(deps: Deps) -> float | None:
    """The tokens-per-minute quota the workers pace to, when the stack's settings say it (no AWS call)."""
    return deps.settings.model_tpm or deps.settings.profile.quota.model_tokens_per_minute



def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def axes(view: ActivityView) -> dict[str, float | str]:
    """The chart's axes: time from `start` to `end` (epoch s) along the bottom, and a count from 0 to `countMax`
    (the tallest bar: model calls or throttles in one bucket) up the side, `countLabel` naming what is counted."""
    return {"start": view.start, "end": view.start + view.bucket_s * len(view.calls),
            "countMax": max(1, *view.calls, *view.throttles),
            "countLabel": f"per {view.bucket_s:g} s"}


def caption(view: ActivityView) -> str:
    """The chart in one line: "12 model calls, 2 throttled in the last 5 min; peak 40.0 % of 60,000 tokens/min"."""
    line = (f"{sum(view.calls)} model calls, {sum(view.throttles)} throttled in the last "
            f"{_span(view.bucket_s * len(view.calls))}")
    if view.quota_use is not None and view.tokens_per_minute:
        line += f"; peak {100 * max(view.quota_use, default=0.0):.1f} % of {view.tokens_per_minute:,.0f} tokens/min"
    return line
