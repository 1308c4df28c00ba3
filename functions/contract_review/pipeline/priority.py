"""Interactive before bulk: when both wait, a worker that receives a bulk chunk while interactive work is open sends it
back, delayed (`bulk_defer_s`, doubling at each deferral of the chunk, at most 900 s), and takes the next message;
a bulk chunk is held this way at most `bulk_max_deferrals` times, so bulk work is never starved: each of its chunks
waits at most `starvation_bound_s` (the sum of those delays) for interactive work.

Why this and not a second queue or a shrinking window (docs/runbook.md "Interactive and bulk work"): the analysis
queue is one standard queue, so the chunks a bulk batch already sent (up to `fanout_window` per job: 80 for ten jobs
locally) are ahead of an interactive job's first page whatever its window; shrinking the bulk windows only stops
*new* bulk chunks. A second, interactive queue would need its own event-source mapping on Lambda, where "poll it
first" does not exist (two mappings share the concurrency, they do not order it), plus a DLQ, alarms, grants and
redrive for it. Deferring at receive works the same on Lambda, on Fargate and locally, with no new resource: every
sender (fan-out, requeue, the sweeper's re-send, redrive) keeps sending to the one queue, and the decision is taken
where the job record is read anyway. Its price: one SQS send and receive per deferral, no model call.

"Interactive work is open": a running interactive job with chunks not yet settled (a batch-mode one only once a
worker took one of its chunks on demand: `waits_for_chunks`), read through the sparse
open-jobs index (`JobsRepo.running_brief`: one query, then the running jobs in batched, projected reads: two
requests for up to 100 running jobs), or, while the one found stays open, by reading that job again at most once
per `interactive_check_s` per worker process. Every bulk chunk received while interactive work is open costs a
deferral, so the check is what each deferral must not pay for in full (bench/priority.py: with a read per running
job, every time, and an event per deferral, the deferrals took most of the interactive job's wait)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from contract_review.domain.messages import AnalysisMessage
from contract_review.domain.ports import Deps
from contract_review.domain.records import Inference, Job, JobState, Priority

log = logging.getLogger(__name__)


def waits_for_chunks(job: Job) -> bool:
    """An interactive job someone waits for on the workers: running, chunks not yet settled, not held (`waiting`: its
    chunks wait for the daily quota, giving way to it would serve nobody), and, sent with `inference: batch`, only
    once one of its chunks went on demand (`on_demand_since`): until then its chunks wait in batch jobs for hours, and
    a worker only parks or replays them, no model call a bulk chunk could be in the way of."""
    return job.state is JobState.RUNNING and job.priority is Priority.INTERACTIVE and \
        job.n_settled < job.chunk_count and job.waiting is None and \
        (job.inference is not Inference.BATCH or job.on_demand_since is not None)


def open_interactive_job(deps: Deps) -> str | None:
    """The first running interactive job that waits for chunks (the open-jobs index, batched reads), or None."""
    return next((j.job_id for j in deps.jobs.running_brief() if waits_for_chunks(j)), None)


class PriorityGate:
    """One per worker process: decides whether a bulk chunk gives way to interactive work, asked for each bulk chunk
    received. "Open" is kept for `interactive_check_s`, then confirmed by reading that one interactive job again
    (one GetItem); the index is queried only once it has ended, so a worker sending bulk chunks back pays little
    for the check. "Not open" is not kept: the next bulk chunk asks the index again (a query and a batched read,
    beside the dozens of requests analysing it makes), so a worker that finishes a bulk chunk just after an
    interactive job starts does not take another one."""

    def __init__(self, deps: Deps, probe: Callable[[Deps], str | None] = open_interactive_job):
        self.deps, self.probe = deps, probe
        self._checked_at = float("-inf")
        self._open: str | None = None  # the interactive job seen open at the last check

    def interactive_waiting(self) -> bool:
        now = self.deps.clock()
        if self._open is not None and now - self._checked_at < self.deps.settings.profile.fanout.interactive_check_s:
            return True
        seen = self.deps.jobs.get(self._open) if self._open is not None else None
        was, self._open = self._open, self._open if seen is not None and waits_for_chunks(seen) else \
            self.probe(self.deps)
        self._checked_at = now
        if (was is None) != (self._open is None):  # one line when this process starts or stops giving way
            log.info("interactive work %s", "open: bulk chunks give way" if self._open else "done",
                     extra={"interactive_job_id": self._open or was})
        return self._open is not None

    def defer(self, msg: AnalysisMessage, job: Job) -> int | None:
        """Send a bulk chunk back (delayed) when interactive work is open and its deferrals are not spent: the delay;
        None: analyse it now. Only its last deferral is a job event (`chunk.deferred`, `spent`): an event is a read
        and a transaction, which every deferral would make the interactive job wait behind; each deferral is in
        the worker's log line and the `PriorityDeferrals` metric."""
        f = self.deps.settings.profile.fanout
        if job.priority is not Priority.BULK or msg.deferrals >= f.bulk_max_deferrals or job.state is not \
                JobState.RUNNING or not self.interactive_waiting():
            return None
        delay = deferral_delay_s(f.bulk_defer_s, msg.deferrals)
        self.deps.queues.send_analysis([msg.deferred()], delay_s=delay)
        n = msg.deferrals + 1
        if n == f.bulk_max_deferrals:  # it used all its deferrals: interactive work is heavy enough to reach the bound
            self.deps.jobs.record_event(msg.job_id, "chunk.deferred", chunk_id=msg.chunk_id, deferrals=n,
                                        delay_s=delay, spent=True)
        return delay


def deferral_delay_s(base_s: int, deferrals: int) -> int:
    """The delay of a bulk chunk's next deferral: doubling (base, 2 x base, 4 x base...), at most SQS's 900 s. Doubling
    keeps the workers from spending their time sending the same bulk chunks back while long interactive work runs."""
    return min(900, base_s * 2 ** deferrals)


def starvation_bound_s(base_s: int, max_deferrals: int) -> int:
    """The most a bulk chunk waits for interactive work: the sum of its deferrals' delays."""
    return sum(deferral_delay_s(base_s, k) for k in range(max_deferrals))
