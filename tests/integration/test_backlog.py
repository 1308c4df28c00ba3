"""A backlog is never mistaken for loss: a burst of small contracts floods a local fleet of
one worker, so most chunk messages wait in the analysis queue longer than the stall period, and the
sweeper (a real process, sweeping every second) re-sends none of them while every job completes.

Under the old rule (a pending chunk nobody holds and not released within the stall period is re-sent)
such a burst was re-sent about three times over: 286 messages for 95 chunks, as measured on this
stack with 30 contracts. The count comes from what the sweeper did (its `job.reconciled` events and its
`sweep` log lines), never from an expected number."""

from __future__ import annotations

import json
from pathlib import Path

from contract_review.config.profile import get_profile
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.review.chunking import chunk_document

from .conftest import wait_jobs
from .test_recovery import _doc

LOCAL = get_profile("local")
STALL = LOCAL.recovery.stall_after_s  # 15 s


def _sweeps(log_dir: Path) -> list[dict]:
    """The sweeper's `sweep` log lines (one per sweep: what it found and did)."""
    lines = [json.loads(line) for f in sorted(log_dir.glob("sweeper-*.log"))
             for line in f.read_text(errors="replace").splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("message") == "sweep"]


def test_a_flooded_fleet_resends_no_chunk_message(make_stack, tmp_path):
    # GIVEN a local fleet with one worker, and a burst of small contracts submitted at once: their
    # chunks wait behind each other for longer than the stall period
    # (every model call answers in 500 ms: a chunk's three rounds of calls take 1.5 s at least, so eight contracts
    # (16 chunks) are a backlog of 24 s at least, whatever the machine's speed)
    stack = make_stack(FaultSpec(latency_ms=500), concurrency={"worker": 1})
    deps = stack.deps()
    base = _doc(2, 3)
    docs = [f"Contract {i}.\n\n{base}" for i in range(8)]
    chunks = sum(len(chunk_document(t, LOCAL.review)) for t in docs)
    jobs = [submission.submit(deps, None, SubmitRequest.inline(t, document_id=f"burst-{i}")).job_id for i, t in enumerate(docs)]
    # WHEN the fleet works through it
    ended = wait_jobs(deps, jobs, timeout=120)
    # THEN every job completed
    assert {j.state for j in ended.values()} == {"completed"}
    # AND the backlog did outlast the stall period: the sweeper found stalled jobs, which the old rule re-sent
    sweeps = _sweeps(tmp_path / "stack0" / "logs")
    assert sweeps, "the sweeper logged no sweep"
    assert sum(s["stalled_jobs"] for s in sweeps) > 0, f"no job waited {STALL}s: the burst is too small to test"
    # AND no chunk message was sent again: none by the reconciler (events and the sweeper's own reports)
    reconciled = [e.detail for j in jobs for e in deps.jobs.events(j) if e.type == "job.reconciled"]
    assert sum(d.get("chunks_requeued", 0) for d in reconciled) == 0, reconciled
    assert sum(s["chunks_resent"] for s in sweeps) == 0
    # AND each chunk was claimed by the worker once (one message each; no duplicate came back to it)
    receives = [c.receives for j in jobs for c in deps.claims.for_job(j)]
    assert len(receives) == chunks and set(receives) == {1}, receives
