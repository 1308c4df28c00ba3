"""The model's daily token quota, held client-side: one `DailyQuota` per worker process, over the daily token
ledger every worker shares (`TokenLedger`, adapters/token_ledger.py: a DynamoDB counter per model per hour).

Why a ledger: Bedrock's daily quotas ("Model invocation max tokens per day for <model>", and the account's
"Cross-Model Max Tokens Per Day") throttle like the per-minute ones: a 429 ThrottlingException that does not say
which quota it hit (the message text is not a classifier, and the simulated Bedrock says "Too many tokens" for both).
A throttle stays `model.throttled`, backpressure bounded by the backpressure deadline; so, without a ledger, a day
of exhausted quota would dead-letter every chunk after 6 hours. With it:
- counting: each call that settles adds what it counted against the quota (`pacing.settled_tokens`: input + cache
  writes + output x the model's burndown, as the tokens pacer settles it) to this process's pending count, flushed
  to the current hour's counter with one atomic ADD every `daily_ledger_flush_s` and at the end of each chunk attempt;
- deciding: the sum of the last 24 hourly counters (one query, cached `daily_ledger_max_age_s`, plus this process's
  unflushed count) against the daily quota (the profile's, or Service Quotas' as the sweeper publishes it:
  model/quota_targets.py): at `daily_quota_threshold` (98 %) or more, a call is held: `model.daily_quota_exhausted`,
  backpressure the deadline does not bound (domain/policy.py), and the job shows it as a named waiting condition
  (pipeline/worker.py);
- re-probing: no reset time is assumed (a rolling window or a UTC day, raised or not: the client cannot know).
  The first worker to see the ledger full marks the hour the hold started (a conditional write on the model's
  control item); from the next hour on, once an hour one call per model is let through as a probe, claimed by a
  conditional write naming the hour. A probe that answers lifts the hold for every worker (the ledger counts from
  that hour on); one that fails (throttled, or anything else) spends the hour's probe: held another hour.
Per model only: the account-wide cross-model daily quota is printed by `review preflight` but not held to (this
ledger sees only this stack's calls of its own model, not the account's other models).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from contract_review.config.profile import Profile
from contract_review.domain.errors import ReviewError
from contract_review.domain.model import ModelResponse
from contract_review.domain.ports import TokenLedger
from contract_review.domain.records import Waiting
from contract_review.model.pacing import settled_tokens

log = logging.getLogger(__name__)

DAILY_QUOTA_CODE = "model.daily_quota_exhausted"
WAITING_CONDITION = "daily_token_quota"
WINDOW_HOURS = 24


@dataclass
class DailyQuota:
    ledger: TokenLedger
    model_id: str
    tokens_per_day: float
    source: str = ""  # where the quota came from (Service Quotas' row, the profile)
    threshold: float = 0.98
    bucket_s: float = 3600.0  # an hour: the counters' length and the probes' interval
    max_age_s: float = 60.0  # how long a read of the ledger is used
    flush_s: float = 60.0  # pending tokens are written at least this often while calls settle
    clock: Callable[[], float] = time.time
    _pending: int = 0
    _flushed_at: float | None = None
    _hours: dict[int, int] = field(default_factory=dict)
    _since_hour: int = 0
    _probe_hour: int | None = None
    _read_at: float = float("-inf")
    _probing: bool = False  # this process's call is the hour's probe
    _lift_owed: int | None = None  # a probe answered in this hour, its lift not written yet (retried: `_pay_lift`)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def for_profile(cls, ledger: TokenLedger, model_id: str, tokens_per_day: float, profile: Profile, *,
                    source: str = "", clock: Callable[[], float] = time.time) -> DailyQuota:
        q = profile.quota
        return cls(ledger, model_id, tokens_per_day, source, threshold=q.daily_quota_threshold,
                   bucket_s=q.daily_ledger_bucket_s, max_age_s=q.daily_ledger_max_age_s,
                   flush_s=q.daily_ledger_flush_s, clock=clock)

    # ------------------------------------------------------------------ the ledger as read
    def hour(self, now: float) -> int:
        return int(now // self.bucket_s)

    def _read(self, now: float) -> None:
        if now - self._read_at < self.max_age_s:
            return
        window = self.ledger.window(self.model_id, self.hour(now) - WINDOW_HOURS + 1)
        self._hours, self._since_hour, self._probe_hour = dict(window.hours), window.since_hour, window.probe_hour
        if self._lift_owed is not None:  # this process's probe answered: lifted here, whatever the ledger says yet
            self._since_hour, self._probe_hour = max(self._since_hour, self._lift_owed), None
        self._read_at = now

    def _stale(self) -> None:
        self._read_at = float("-inf")

    def used(self) -> int:
        """Tokens counted over the last 24 hours (from the last lift, when later), this process's unflushed ones
        included."""
        with self._lock:
            now = self.clock()
            self._read(now)
            return self._used(self.hour(now))

    def _used(self, hour: int) -> int:
        first = max(hour - WINDOW_HOURS + 1, self._since_hour)
        return sum(n for h, n in self._hours.items() if first <= h <= hour) + self._pending

    # ------------------------------------------------------------------ before and after a call
    def admit(self, step: str = "") -> bool:
        """Before a model call: False, the call goes on; True, it goes on as the hour's probe; or raises
        `model.daily_quota_exhausted` (the chunk is held)."""
        with self._lock:
            self._pay_lift()
            now = self.clock()
            hour = self.hour(now)
            self._read(now)
            used = self._used(hour)
            if used < self.threshold * self.tokens_per_day:
                return False
            if not self._probing:
                if self._probe_hour is None:  # the hold starts: the first probe is next hour's
                    if self.ledger.claim_probe(self.model_id, hour, None):
                        log.warning("daily token quota exhausted: holding", extra=self._log(used))
                    self._stale()
                elif self._probe_hour < hour:
                    won = self.ledger.claim_probe(self.model_id, hour, self._probe_hour)
                    self._stale()
                    if won:
                        self._probing = True
                        log.info("daily token quota: this call is the hour's probe", extra=self._log(used))
                        return True
            raise self._hold(now, used, step)

    def settled(self, response: ModelResponse, probe: bool = False) -> None:
        """A call answered: its tokens are counted; a probe's answer lifts the hold for every worker. Never raises
        for the ledger: the call was made and paid for, so a failed ledger write must neither lose its tokens nor
        make the call look failed (and be made again). Its tokens are pending until a flush writes them (a failed
        flush keeps them); a lift that fails is owed, written by the next flush or admission (logged meanwhile),
        and this process goes on as lifted."""
        with self._lock:
            now = self.clock()
            self._pending += settled_tokens(self.model_id, response)
            if self._flushed_at is None:
                self._flushed_at = now
            due = now - self._flushed_at >= self.flush_s
            if probe:
                self._probing = False
                self._lift_owed = self.hour(now)
                self._pay_lift()
        if due:
            self.flush()

    def _pay_lift(self) -> None:
        """Write the lift a probe's answer owes (`ledger.lift`); a failure keeps it owed (logged), and meanwhile
        this process counts from the probe's hour on, as the lift says (`_read` keeps it so until it is written)."""
        with self._lock:
            hour = self._lift_owed
            if hour is None:
                return
            try:
                self.ledger.lift(self.model_id, hour)
            except Exception:  # owed: the next flush or admission writes it; logged, not hidden
                log.warning("daily token quota: the probe answered but the lift was not written; retried",
                            exc_info=True, extra=self._log(0))
                self._since_hour, self._probe_hour = max(self._since_hour, hour), None
                return
            self._lift_owed = None
            self._stale()
            log.warning("daily token quota: the probe answered, the hold is lifted", extra=self._log(0))

    def failed(self, probe: bool = False) -> None:
        """A call failed (however): a probe that fails spends the hour's probe, and the hold goes on."""
        if probe:
            with self._lock:
                self._probing = False

    def flush(self) -> None:
        """Add this process's pending tokens to the current hour's counter (one atomic ADD), and write a lift a probe
        owes. A failed write keeps them pending for the next flush (logged): the ledger is an estimate, never a
        reason to fail a chunk."""
        self._pay_lift()
        with self._lock:
            now = self.clock()
            tokens, self._pending, self._flushed_at = self._pending, 0, now
        if not tokens:
            return
        hour = self.hour(now)
        try:
            self.ledger.add(self.model_id, hour, tokens)
        except Exception:  # the next flush tries again; logged, not hidden
            log.warning("daily token ledger not written", exc_info=True, extra={"tokens": tokens})
            with self._lock:
                self._pending += tokens
            return
        with self._lock:  # the cached read includes what this process just wrote
            self._hours[hour] = self._hours.get(hour, 0) + tokens

    # ------------------------------------------------------------------ what people see
    def waiting(self, since: float) -> Waiting:
        return Waiting(condition=WAITING_CONDITION, model_id=self.model_id, tokens_per_day=self.tokens_per_day,
                       since=since, detail=f"waiting for the daily token quota of {self.model_id} "
                       f"({self.tokens_per_day:,.0f} tokens/day), re-probed hourly")

    def _hold(self, now: float, used: int, step: str) -> ReviewError:
        next_probe = (self.hour(now) + 1) * self.bucket_s
        at = datetime.fromtimestamp(next_probe, tz=UTC).isoformat(timespec="seconds")
        return ReviewError.of(
            DAILY_QUOTA_CODE,
            f"the daily token quota of {self.model_id} is {used / self.tokens_per_day:.0%} used over the last 24 hours "
            f"({used:,} of {self.tokens_per_day:,.0f} tokens a day{'; ' + self.source if self.source else ''}): held; "
            f"one probe call an hour, the next after {at}", retry_after_s=max(1.0, next_probe - now), step=step)

    def _log(self, used: int) -> dict[str, object]:
        return {"model_id": self.model_id, "tokens_per_day": self.tokens_per_day, "used": used}
