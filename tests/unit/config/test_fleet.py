"""The worker fleet sized to the model quota (config/fleet.py): the formula the deploy uses."""

from __future__ import annotations

import math

import pytest

from contract_review.config import fleet
from contract_review.config.fleet import fleet_for_quota


def test_the_fleet_is_quota_calls_per_second_times_a_chunks_time_over_its_calls_with_a_margin():
    tpm, latency = 2_000_000, 5.0
    calls_per_s = tpm / 60 / fleet.QUOTA_TOKENS_PER_CALL
    chunk_s = fleet.CHUNK_LATENCIES * latency + fleet.CHUNK_OVERHEAD_S
    expected = math.ceil(calls_per_s * chunk_s / fleet.CALLS_PER_CHUNK * fleet.MARGIN)
    f = fleet_for_quota(tpm, latency)
    assert (f.workers, f.window) == (expected, 2 * expected)
    assert f.quota_calls_per_s == pytest.approx(calls_per_s, abs=0.01)


def test_a_larger_quota_or_slower_calls_need_more_workers_within_the_event_sources_bounds():
    assert fleet_for_quota(6_000_000).workers > fleet_for_quota(2_000_000).workers
    assert fleet_for_quota(2_000_000, 10.0).workers > fleet_for_quota(2_000_000, 5.0).workers
    assert fleet_for_quota(1_000).workers == fleet.MIN_WORKERS
    assert fleet_for_quota(1e12).workers == fleet.MAX_WORKERS


def test_a_deploy_sizes_the_fleet_from_context(monkeypatch):
    from infra.deploy_settings import DeploySettings

    sized = DeploySettings.from_context({"profile": "prod", "model_tpm": "2000000"}.get)
    assert sized.profile.functions.worker_max_concurrency == fleet_for_quota(2_000_000).workers
    assert sized.profile.fanout.fanout_window == 2 * sized.profile.functions.worker_max_concurrency
    fixed = DeploySettings.from_context({"profile": "prod", "model_tpm": "2000000", "worker_concurrency": "3"}.get)
    assert (fixed.profile.functions.worker_max_concurrency, fixed.profile.fanout.fanout_page) == (3, 6)
    default = DeploySettings.from_context({"profile": "prod"}.get)
    assert default.fleet_overrides == {} and default.profile.functions.worker_max_concurrency == 20
    with pytest.raises(ValueError, match="worker_concurrency"):
        DeploySettings.from_context({"profile": "prod", "worker_concurrency": "1"}.get)
    with pytest.raises(ValueError, match="whole number"):
        DeploySettings.from_context({"profile": "prod", "worker_concurrency": "2.5"}.get)
