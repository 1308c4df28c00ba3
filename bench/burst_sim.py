"""A burst of contracts against the model quota and the worker fleet: a discrete-event simulation of the
analysis queue, the workers, the quota and the sweeper's stall reconciler, with the old rule and the new
one side by side (a backlog is never mistaken for loss).

    .venv/bin/python bench/burst_sim.py                      # 1,000 and 10,000 contracts, ~1 minute
    .venv/bin/python bench/burst_sim.py --bursts 1000 --workers 20 --tpm 2000000 --loss-rate 0.0001
    .venv/bin/python bench/burst_sim.py --local              # replays bench/results/burst_calibration.json

Plain Python (heapq, no simulation library): events are a worker taking the next message, a chunk
settling and a sweep; the queue is first in, first out (a standard SQS queue only roughly is: the
queue-age figures are those of an orderly queue). What it models, and where each number comes from
(every default is printed and written with the results):

- contracts: drawn (seeded) from the CUAD contracts in ../shared/data/cuad (else our samples/), each
  split by the real chunker with the prod profile (4,000-character chunks): the chunk counts are exact;
- a chunk makes 15.4 model calls (bench/results/quota.json, `after`: 215 calls needed for 14 chunks) of
  1,320 quota tokens each (bench/results/tokens.json, `cached`: quota tokens per call under the cached
  layout, simulated Bedrock) against a tokens-per-minute quota (default 2,000,000, the runbook's
  example; an account's own is in Service Quotas), of which the pacers use 1/1.17 (tokens.json,
  `cached`: makespan 1.17 x the token bound);
- a chunk takes at least 6 call latencies + 2.5 s on its worker (config/fleet.py: three rounds of calls,
  each as long as its slowest; the 2.5 s of claim, checkpoints and messages measured on the local stack)
  with 5 s a call (fleet.py's assumption for a Claude Sonnet call on Bedrock: not measured here), and no
  less than its share of the quota: the quota is a fluid server the chunks reserve in start order;
- the fleet: 20 workers (the prod profile's maximum concurrency) or what `config/fleet.py` sizes for the
  quota (`--workers`); the fan-out window is twice the fleet, refilled by pages of 10 (prod profile);
- the sweeper looks every 60 s and reconciles a job without progress for 1,200 s (prod profile).
  Old rule: every pending chunk nobody holds gets a fresh message (nothing is released in this model:
  the pacers keep throttling away). New rule (pipeline/sweeper.py `message_lost`): only a chunk whose
  message is past the queue's retention less a stall period, or any pending chunk's once the queue held
  no message at all (visible or in flight) when the sweep began. `new+age` (only in the runs with lost
  messages; not in the product, see bench/README.md) also reads the queue's oldest-message age (CloudWatch
  ApproximateAgeOfOldestMessage, here the head of the queue): a chunk whose message is older than the
  queue's oldest by more than a stall period lost it;
- a duplicate message costs its worker 0.1 s (a receive, the job read, the failed claim, the result
  re-announced for a settled chunk, the delete: 5 AWS requests; an assumption, small beside a chunk's
  32.5 s) and, for a chunk already settled, one more SendMessage on the results FIFO queue;
- `--loss-rate`: the share of chunk messages lost between the chunk record and the send (a crash), to
  show what the new rule costs when a message really is lost.

Not modelled: intake's own time (every contract is fanned out at t=0 in submission order), throttling
and backpressure requeues (the pacers hold the quota), the daily token quota, the aggregator's time.

Results: bench/results/burst_sim.json; a table per burst on stdout.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from contract_review.config.fleet import fleet_for_quota  # noqa: E402
from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402

PROD = get_profile("prod")
CUAD = ROOT.parent / "shared" / "data" / "cuad"
OUT = ROOT / "bench" / "results" / "burst_sim.json"
DAY = 86400.0
DUPLICATE_RUN_S = 1.0  # a worker takes duplicates for at most this long in one go (the model's time step for them)
HORIZON_S = 60 * DAY  # a run that has not ended by then stops (and says so: fewer jobs completed)
FIFO_SEND_LIMIT_PER_S = 300  # a FIFO queue without high throughput mode: 300 SendMessage calls/s (no batching)


@dataclass(frozen=True)
class Params:
    tpm: float = 2_000_000  # the model's tokens-per-minute quota (runbook example)
    quota_tokens_per_call: float = 1_320  # bench/results/tokens.json `cached`
    calls_per_chunk: float = 215 / 14  # bench/results/quota.json `after`
    pacing_efficiency: float = 1 / 1.17  # tokens.json `cached`: makespan 1.17 x the token bound
    call_latency_s: float = 5.0  # config/fleet.py CALL_LATENCY_S (an assumption for Bedrock)
    chunk_latencies: int = 6  # config/fleet.py CHUNK_LATENCIES
    chunk_overhead_s: float = 2.5  # config/fleet.py CHUNK_OVERHEAD_S (measured on the local stack)
    workers: int = PROD.functions.worker_max_concurrency
    window: int = 2 * PROD.functions.worker_max_concurrency
    page: int = PROD.fanout.fanout_page
    stall_s: float = PROD.recovery.stall_after_s
    sweep_s: float = PROD.recovery.sweep_interval_s
    retention_s: float = PROD.queues.queue_retention_days * DAY
    duplicate_s: float = 0.1  # worker time a duplicate message costs (assumption)
    duplicate_requests: int = 5  # AWS requests per duplicate (receive, job read, claim, re-announce, delete)
    loss_rate: float = 0.0
    seed: int = 17

    @property
    def chunk_s(self) -> float:
        return self.chunk_latencies * self.call_latency_s + self.chunk_overhead_s

    @property
    def quota_tokens_per_s(self) -> float:
        return self.tpm / 60 * self.pacing_efficiency

    @property
    def tokens_per_chunk(self) -> float:
        return self.calls_per_chunk * self.quota_tokens_per_call


def corpus() -> tuple[str, list[int]]:
    """The chunk count of each contract the burst is drawn from (prod chunking)."""
    files = sorted(CUAD.glob("cuad_*.txt")) if CUAD.is_dir() else []
    source = "cuad" if files else "samples"
    files = files or sorted((ROOT / "samples").glob("*.txt"))
    return source, [len(chunk_document(f.read_text(errors="replace"), PROD.review)) for f in files]


@dataclass
class Job:
    chunks: int
    fanned_out: int = 0
    settled: int = 0
    updated_at: float = 0.0
    done_at: float | None = None
    status: list[int] = field(default_factory=list)  # per chunk: 0 pending, 1 claimed, 2 settled
    sent_at: list[float] = field(default_factory=list)  # per chunk: when its message was (last) sent


class Sim:
    def __init__(self, p: Params, contracts: list[int], rule: str):
        self.p, self.rule = p, rule
        self.rng = random.Random(p.seed)
        self.jobs = [Job(n, status=[0] * n, sent_at=[0.0] * n) for n in contracts]
        self.queue: deque[tuple[int, int, float]] = deque()  # (job, chunk, sent_at)
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.idle = p.workers
        self.quota_free_at = 0.0
        self.stalls: list[tuple[float, int]] = []
        self.stats: Counter[str] = Counter()
        self.waits: list[float] = []
        self.results_sends: Counter[int] = Counter()  # results FIFO SendMessage per second
        self.group_sends: Counter[tuple[int, int]] = Counter()  # per (second, job): one message group per job
        self.recovered_at: list[float] = []

    # ---------------------------------------------------------------- plumbing
    def at(self, t: float, kind: str, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def send(self, t: float, j: int, c: int, *, resend: bool = False) -> None:
        self.jobs[j].sent_at[c] = t
        if not resend and self.p.loss_rate and self.rng.random() < self.p.loss_rate:
            self.stats["lost"] += 1  # the record says sent; no message
            return
        self.queue.append((j, c, t))
        self.stats["messages"] += 1

    def fan_out(self, t: float, j: int) -> None:
        job = self.jobs[j]
        remaining = job.chunks - job.fanned_out
        room = self.p.window - (job.fanned_out - job.settled)
        n = min(room, remaining)
        if n <= 0 or (n < self.p.page and n < remaining):
            return
        for c in range(job.fanned_out, job.fanned_out + n):
            self.send(t, j, c)
        job.fanned_out += n
        job.updated_at = t

    def announce(self, t: float, j: int) -> None:
        self.results_sends[int(t)] += 1
        self.group_sends[(int(t), j)] += 1

    # ---------------------------------------------------------------- workers
    def dispatch(self, t: float) -> None:
        while self.idle and self.queue:
            self.idle -= 1
            self.take(t)

    def take(self, t: float) -> None:
        """A worker free at `t` takes the next message: a chunk to run, or a run of duplicates (each costs it
        `duplicate_s`; at most a second's worth before it is free again, so the fleet shares them)."""
        start = t
        while self.queue:
            if t - start >= DUPLICATE_RUN_S:
                self.at(t, "idle")
                return
            j, c, sent = self.queue.popleft()
            self.stats["oldest_age_s"] = max(self.stats["oldest_age_s"], int(t - sent))
            job = self.jobs[j]
            if job.status[c] != 0:  # claimed or settled already: a duplicate
                self.stats["duplicate_receives"] += 1
                if job.status[c] == 2:
                    self.announce(t, j)
                t += self.p.duplicate_s
                continue
            job.status[c] = 1
            self.waits.append(t - sent)
            quota_start = max(t, self.quota_free_at)
            self.quota_free_at = quota_start + self.p.tokens_per_chunk / self.p.quota_tokens_per_s
            self.at(max(t + self.p.chunk_s, self.quota_free_at), "settle", j, c)
            return
        self.at(t, "idle")

    def settle(self, t: float, j: int, c: int) -> None:
        job = self.jobs[j]
        job.status[c] = 2
        job.settled += 1
        job.updated_at = t
        self.announce(t, j)
        if job.settled == job.chunks:
            job.done_at = t
        else:
            self.fan_out(t, j)
            heapq.heappush(self.stalls, (t + self.p.stall_s, j))
        self.take(t)
        self.dispatch(t)  # a refill's messages wake idle workers

    # ---------------------------------------------------------------- the sweeper
    def lost(self, now: float, sent: float, queued: int, oldest_sent: float | None) -> bool:
        if self.rule == "old":
            return True
        if now - sent < self.p.stall_s:
            return False
        if now - sent >= self.p.retention_s - self.p.stall_s or queued == 0:
            return True
        # "new+age": the queue's oldest message (CloudWatch ApproximateAgeOfOldestMessage) is younger than this
        # chunk's by more than a stall period, so its message is no longer there (never received: nothing is)
        return self.rule == "new+age" and oldest_sent is not None and sent + self.p.stall_s < oldest_sent

    def sweep(self, now: float) -> None:
        queued = len(self.queue) + (self.p.workers - self.idle)  # visible + in flight, before anything is sent
        oldest_sent = self.queue[0][2] if self.queue else None  # the head of a first-in, first-out queue
        while self.stalls and self.stalls[0][0] <= now:
            _, j = heapq.heappop(self.stalls)
            job = self.jobs[j]
            if job.done_at is not None or now - job.updated_at < self.p.stall_s:
                continue  # progressed since: a later entry stands for it
            self.stats["stalled_job_sightings"] += 1
            for c in range(job.fanned_out):
                if job.status[c] == 0 and self.lost(now, job.sent_at[c], queued, oldest_sent):
                    self.send(now, j, c, resend=True)
                    self.stats["resent"] += 1
                    if self.rule != "old":
                        self.recovered_at.append(now)
            job.updated_at = now  # touched: the next reconcile waits another stall period
            heapq.heappush(self.stalls, (now + self.p.stall_s, j))
        self.dispatch(now)

    # ---------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        for j in range(len(self.jobs)):
            self.fan_out(0.0, j)
            heapq.heappush(self.stalls, (self.p.stall_s, j))
        self.dispatch(0.0)
        self.at(self.p.sweep_s, "sweep")
        while self.events:
            t, _, kind, a, b = heapq.heappop(self.events)
            if kind == "settle":
                self.settle(t, a, b)
            elif kind == "idle":
                self.idle += 1
                self.dispatch(t)
            elif kind == "sweep":
                # every job ended and every message taken (the duplicates left are received too: they cost)
                if (all(job.done_at is not None for job in self.jobs) and not self.queue
                        and self.idle == self.p.workers) or t > HORIZON_S:
                    break
                self.sweep(t)
                self.at(t + self.p.sweep_s, "sweep")
        return self.summary(time.perf_counter() - started)

    def summary(self, cpu_s: float) -> dict[str, Any]:
        done = sorted(job.done_at for job in self.jobs if job.done_at is not None)
        waits = sorted(self.waits)
        makespan = done[-1] if done else math.inf
        busiest_group = max(self.group_sends.values(), default=0)
        return {
            "rule": self.rule,
            "jobs_completed": len(done), "chunks": sum(job.chunks for job in self.jobs),
            "makespan_h": round(makespan / 3600, 2), "makespan_s": round(makespan, 1),
            "job_end_h": {"p50": round(done[len(done) // 2] / 3600, 2), "p95": round(done[int(len(done) * .95)] / 3600, 2)},
            "queue_age_h": {"max": round(self.stats["oldest_age_s"] / 3600, 2),
                            "p50_wait": round(waits[len(waits) // 2] / 3600, 2)},
            "max_age_vs_retention": {"14_days": round(self.stats["oldest_age_s"] / (14 * DAY), 3),
                                     "4_days": round(self.stats["oldest_age_s"] / (4 * DAY), 3)},
            "duplicate_messages": self.stats["resent"],
            "duplicates_per_chunk": round(self.stats["resent"] / max(1, sum(job.chunks for job in self.jobs)), 2),
            "duplicate_receives": self.stats["duplicate_receives"],
            "duplicate_aws_requests": self.stats["duplicate_receives"] * self.p.duplicate_requests,
            "worker_hours_on_duplicates": round(self.stats["duplicate_receives"] * self.p.duplicate_s / 3600, 2),
            "stalled_job_sightings": self.stats["stalled_job_sightings"],
            "lost_messages": self.stats["lost"],
            "lost_recovered_after_h": round(max(self.recovered_at) / 3600, 2) if self.recovered_at else None,
            "results_fifo": {"peak_sends_per_s": max(self.results_sends.values(), default=0),
                             "mean_sends_per_s": round(sum(self.results_sends.values()) / max(1.0, makespan), 3),
                             "peak_sends_per_s_one_group": busiest_group,
                             "limit_per_s": FIFO_SEND_LIMIT_PER_S},
            "sim_cpu_s": round(cpu_s, 1),
        }


def burst(n: int, chunk_counts: list[int], seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(chunk_counts) for _ in range(n)]


def table(rows: list[dict[str, Any]]) -> str:
    head = ("rule", "makespan h", "p95 job h", "max queue age h", "duplicate msgs", "per chunk", "dup receives",
            "results sends/s peak", "lost", "lost recovered h")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(v) for v in (
            r["rule"], r["makespan_h"], r["job_end_h"]["p95"], r["queue_age_h"]["max"], r["duplicate_messages"],
            r["duplicates_per_chunk"], r["duplicate_receives"], r["results_fifo"]["peak_sends_per_s"],
            r["lost_messages"], r["lost_recovered_after_h"])))
    return "\n".join(lines)


def local_params() -> tuple[Params, list[int]]:
    """The local flood of bench/burst_calibrate.py: its measured chunk time, one worker, the local profile."""
    cal = json.loads((ROOT / "bench" / "results" / "burst_calibration.json").read_text())
    local = get_profile("local")
    p = Params(tpm=1e12, call_latency_s=0.0, chunk_overhead_s=cal["chunk_s"]["mean"], workers=cal["workers"],
               window=local.fanout.fanout_window, page=local.fanout.fanout_page,
               stall_s=local.recovery.stall_after_s, sweep_s=local.recovery.sweep_interval_s)
    per = cal["chunks"] // cal["contracts"]
    extra = cal["chunks"] - per * cal["contracts"]
    return p, [per + (1 if i < extra else 0) for i in range(cal["contracts"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", default="1000,10000", help="contracts submitted at once, comma-separated")
    ap.add_argument("--workers", default=f"{Params.workers},sized",
                    help="fleet sizes, comma-separated; `sized`: config/fleet.py for the quota")
    ap.add_argument("--tpm", type=float, default=Params.tpm)
    ap.add_argument("--loss-rate", type=float, default=0.0001,
                    help="share of messages lost between record and send, in a third run of each burst (0: none)")
    ap.add_argument("--seed", type=int, default=Params.seed)
    ap.add_argument("--local", action="store_true", help="replay the local calibration flood only")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    results: dict[str, Any] = {"command": " ".join(["bench/burst_sim.py", *sys.argv[1:]]), "scenarios": []}
    if a.local:
        p, contracts = local_params()
        results["calibration"] = json.loads((ROOT / "bench" / "results" / "burst_calibration.json").read_text())
        runs = [Sim(p, contracts, rule).run() for rule in ("old", "new")]
        print(f"local flood: {len(contracts)} contracts, {sum(contracts)} chunks, 1 worker, chunk "
              f"{p.chunk_s:.2f} s\n{table(runs)}\n" + "\n".join(
                  f"{r['rule']}: makespan {r['makespan_s']} s, {r['duplicate_messages']} duplicate messages" for r in runs)
              + f"\nmeasured (new rule): makespan {results['calibration']['makespan_s']} s, "
                f"{results['calibration']['chunks_resent']['events']} chunk messages re-sent")
        results["scenarios"].append({"name": "local", "params": p.__dict__, "runs": runs})
        out = a.out.with_name("burst_sim_local.json") if a.out == OUT else a.out
        out.write_text(json.dumps(results, indent=1) + "\n")
        return
    source, counts = corpus()
    results["corpus"] = {"source": source, "contracts": len(counts), "chunks": counts,
                         "mean_chunks": round(sum(counts) / len(counts), 2)}
    print(f"corpus: {len(counts)} {source} contracts, {sum(counts) / len(counts):.1f} chunks each on average")
    for n in (int(x) for x in a.bursts.split(",")):
        contracts = burst(n, counts, a.seed)
        for w in a.workers.split(","):
            workers = fleet_for_quota(a.tpm).workers if w == "sized" else int(w)
            p = Params(tpm=a.tpm, workers=workers, window=2 * workers, seed=a.seed)
            runs = [Sim(p, contracts, "old").run(), Sim(p, contracts, "new").run()]
            if a.loss_rate:
                lossy = Params(**{**p.__dict__, "loss_rate": a.loss_rate})
                runs += [dict(Sim(lossy, contracts, rule).run(), rule=f"{rule}, {a.loss_rate:g} lost")
                         for rule in ("old", "new", "new+age")]
            quota_chunks_s = p.quota_tokens_per_s / p.tokens_per_chunk
            fleet_chunks_s = workers / p.chunk_s
            name = f"{n} contracts, {workers} workers, {a.tpm:,.0f} tokens/min"
            print(f"{name}: {sum(contracts)} chunks; the quota allows {quota_chunks_s:.2f} chunks/s, the fleet "
                  f"{fleet_chunks_s:.2f} ({'quota' if quota_chunks_s < fleet_chunks_s else 'fleet'}-bound)\n"
                  f"{table(runs)}\n")
            results["scenarios"].append({"name": name, "contracts": n, "workers": workers, "chunks": sum(contracts),
                                         "bound": "quota" if quota_chunks_s < fleet_chunks_s else "fleet",
                                         "chunks_per_s": round(min(quota_chunks_s, fleet_chunks_s), 3),
                                         "params": p.__dict__, "runs": runs})
    a.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written: {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}")


if __name__ == "__main__":
    main()
