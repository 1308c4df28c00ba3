"""The quotas a worker process paces to (model/pacing.py) and holds its daily tokens to (model/daily_quota.py), and
where each came from. Asked at the start of every chunk (model/onion.py: the pacing and daily-quota layers), so a
quota the sweeper publishes reaches warm workers within the store's cache age, without a redeploy or a cold start.

Tokens per minute, first found wins:
1. `-c model_tpm` (MODEL_TPM), then the profile's `model_tokens_per_minute`: given at deploy, nothing read;
2. the model's quota as the sweeper published it from Service Quotas (`QuotaStore`, adapters/published_quotas.py;
   no worker reads Service Quotas);
3. the last published value this process read, when the store cannot be read now (the store keeps it);
4. before any value was read (the first sweep after the first deploy has not run yet; the store unreadable since this
   process started), or when Service Quotas names no tokens-per-minute quota for the model: the profile's
   `quota_fallback_tokens_per_minute` (prod: 100,000, docs/runbook.md "Riding the model quota"), low enough for any
   account's default quota of a current model, so a worker is never unpaced: it paces slow until it knows better.
(`review quota set N`, the operator's runtime control, replaces all of these while it is set: model/onion.py `PacedModel`.)

Daily tokens: the profile's `model_tokens_per_day`, else the published daily quota, else the last one read; before
any was read, a day at the fallback rate (`quota_fallback_tokens_per_minute` x 1,440). A published record that names
no daily quota for the model holds nothing (as before: Service Quotas lists no such quota for it).

The offline model has no quota: only values given at deploy apply to it (no store, no fallback).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract_review.config.settings import Settings
from contract_review.domain.ports import QuotaStore

MINUTES_PER_DAY = 1440


@dataclass(frozen=True)
class QuotaTargets:
    model_id: str
    tokens_per_minute_given: tuple[float, str] | None = None  # (value, where from): -c model_tpm or the profile
    tokens_per_day_given: tuple[float, str] | None = None  # the profile's
    store: QuotaStore | None = None  # the published quotas (None: the offline model, or no control table)
    fallback_tokens_per_minute: float | None = None  # before any value was read (None: no fallback, the offline model)

    @classmethod
    def for_settings(cls, settings: Settings, store: QuotaStore | None) -> QuotaTargets:
        q = settings.profile.quota
        bedrock = settings.model_provider == "bedrock"
        tpm = (settings.model_tpm, "MODEL_TPM (cdk deploy -c model_tpm)") if settings.model_tpm else \
            (q.model_tokens_per_minute, f"profile {settings.profile.name}") if q.model_tokens_per_minute else None
        tpd = (q.model_tokens_per_day, f"profile {settings.profile.name}") if q.model_tokens_per_day else None
        return cls(settings.effective_model_id, tpm, tpd, store if bedrock else None,
                   q.quota_fallback_tokens_per_minute if bedrock else None)

    def tokens_per_minute(self) -> tuple[float | None, str]:
        """The tokens-per-minute quota to pace to now, and where it came from (None: the offline model, unpaced)."""
        if self.tokens_per_minute_given is not None:
            return self.tokens_per_minute_given
        if self.fallback_tokens_per_minute is None:
            return None, "the offline model has no quota"
        published = self.store.get() if self.store is not None else None
        if published is not None and published.tokens_per_minute:
            return published.tokens_per_minute, f"published by the sweeper: {published.tokens_per_minute_quota}"
        why = published.tokens_per_minute_quota if published is not None else "no published quota read yet"
        return self.fallback_tokens_per_minute, f"fallback quota_fallback_tokens_per_minute ({why})"

    def tokens_per_day(self) -> tuple[float | None, str]:
        """The daily token quota to hold to now, and where it came from (None: nothing is held)."""
        if self.tokens_per_day_given is not None:
            return self.tokens_per_day_given
        if self.fallback_tokens_per_minute is None:
            return None, "the offline model has no quota"
        published = self.store.get() if self.store is not None else None
        if published is not None:
            return published.tokens_per_day, (f"published by the sweeper: {published.tokens_per_day_quota}"
                                              if published.tokens_per_day else published.tokens_per_day_quota)
        return (self.fallback_tokens_per_minute * MINUTES_PER_DAY,
                "fallback: a day at quota_fallback_tokens_per_minute (no published quota read yet)")
