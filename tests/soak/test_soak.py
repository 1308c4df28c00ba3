"""The soak: more than 200 documents through the local stack under every fault at once, each job
checked against a fault-free run of its document (tests/oracle.py). `make soak`; not in `make test`.

Faults: 5 % transient model errors (throttle / 5xx / read timeout), 1 % malformed model output (one
repair, then a coverage gap), 1 % permanent model errors (HTTP 400: the chunk fails and its job ends
`failed` with `job.chunks_missing`: an expected, coded failure), duplicate deliveries (analysis
messages re-sent while in the queue), and, all along, `kill -9` and `SIGSTOP` (longer than a lease)
of worker processes.

Two phases on one stack: (1) a >= 1.2 MB document with a few small ones submitted behind it, with the
transient faults only (at 1 % of calls the permanent faults would fail some of its ~290 chunks of ~22
calls each, and 1 % malformed output would hold about one call malformed twice, a mandatory gap: either
way it could not complete, and it must); (2) 200 documents (CUAD contracts and seeded variants, or variants
of samples/ without ../shared) with all the faults and, on top, the lifecycle chaos of
`tests/soak/lifecycle.py`: random cancels and retries, approvals, rejects and
expiries, retries of failed jobs, DLQ redrives, and ticket-system faults (a timeout before and after
the write, errors, dropped answers, the lookup down) on the local ticket fake.

It prints, and writes to bench/results/soak.json (+ soak.txt): lost chunks, duplicate findings,
silently incomplete jobs and failures without a code (all must be 0), the other differences from the
fault-free run (must be 0), the lifecycle invariants (must be 0: tickets opened = closed + those of
completed jobs, job cost = the sum of its settled chunks, no chunk pending under an ended job, every
written event delivered to a resuming reader), and counts: jobs by state and error code, model calls and their outcomes,
retries, kills, stops, duplicates, wall time.
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contract_review.config.profile import get_profile
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import Job
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from contract_review.review.chunking import chunk_document
from review_local.embedded import synth
from review_local.stack import LocalStack
from review_local.ticket_service import TicketFaults

from ..conftest import ROOT
from ..oracle import JobCheck, check_job
from ..texts import RISKY_CLAUSE
from .documents import LARGE_BYTES, large_document, soak_documents, sources
from .lanes import LaneChaos, lane_invariants, lanes_documents, run_dead_letter_phase, run_lanes
from .lifecycle import Lifecycle, lifecycle_invariants, redrive_compensations

LOCAL = get_profile("local")
RESULTS = ROOT / "bench" / "results"
# A quick look at the soak (not the soak): SOAK_DOCUMENTS=20 SOAK_LARGE_BYTES=100000 make soak
N_DOCUMENTS = int(os.environ.get("SOAK_DOCUMENTS", "200"))  # phase 2
N_BEHIND_LARGE = 10  # phase 1: small documents submitted behind the large one
N_DEAD_LETTERS = int(os.environ.get("SOAK_DEAD_LETTERS", "6"))  # phase 3: jobs whose chunk 1 dead-letters, redriven
N_LANES = int(os.environ.get("SOAK_LANES", "40"))  # phase 4: batch-mode, interactive and bulk jobs at once
SIZE_LARGE = int(os.environ.get("SOAK_LARGE_BYTES", str(LARGE_BYTES)))
WORKERS = LOCAL.functions.worker_max_concurrency  # 4: the local event source mapping's concurrency
PHASE_TIMEOUT_S = 900.0  # a job still open after this is reported (jobs not ended), never waited for longer
# chaos: a kill -9 every KILL_EVERY_S, a SIGSTOP every STOP_EVERY_S held for STOP_FOR_S (longer than a
# lease, so the sweeper takes the chunk over and the resumed process is a zombie), duplicates
KILL_EVERY_S, STOP_EVERY_S, STOP_FOR_S = 9.0, 13.0, LOCAL.recovery.claim_lease_s + 2.0
DUPLICATE_EVERY_S = 2.0
RISKY_SHARE = 0.4  # of the mixed phase's documents, given a clause the rule model scores high risk (a ticket)


@dataclass
class Chaos:
    """Kills, stops and duplicate deliveries while a phase runs (a thread)."""

    stack: LocalStack
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _stopped: dict[int, float] = field(default_factory=dict)  # pid -> when to resume it

    def __enter__(self) -> Chaos:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        for pid in list(self._stopped):
            self._resume(pid)

    def _workers(self) -> list[int]:
        assert self.stack.runtime is not None
        return [p for p in self.stack.runtime.pids("worker") if p not in self._stopped]

    def _signal(self, sig: signal.Signals, label: str) -> int | None:
        pids = self._workers()
        if len(pids) < 2:  # keep one worker running
            return None
        pid = self.rng.choice(pids)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        self.counts[label] += 1
        return pid

    def _resume(self, pid: int) -> None:
        self._stopped.pop(pid, None)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _duplicate(self, sqs: Any, url: str) -> None:
        """Re-send copies of analysis messages that are in the queue (a second delivery of each)."""
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=0).get("Messages", [])
        for m in got:
            sqs.send_message(QueueUrl=url, MessageBody=m["Body"])
            self.counts["duplicate deliveries"] += 1

    def _run(self) -> None:
        sqs = self.stack.aws.client("sqs")
        url = self.stack.outputs["AnalysisQueueUrl"]
        start = time.monotonic()
        due = {"kill": start + KILL_EVERY_S, "stop": start + STOP_EVERY_S / 2, "dup": start + DUPLICATE_EVERY_S}
        while not self._stop.wait(0.2):
            now = time.monotonic()
            for pid, resume_at in list(self._stopped.items()):
                if now >= resume_at:
                    self._resume(pid)
            if now >= due["kill"]:
                self._signal(signal.SIGKILL, "kill -9")
                due["kill"] = now + KILL_EVERY_S * self.rng.uniform(0.5, 1.5)
            if now >= due["stop"]:
                pid = self._signal(signal.SIGSTOP, "SIGSTOP")
                if pid is not None:
                    self._stopped[pid] = now + STOP_FOR_S
                due["stop"] = now + STOP_EVERY_S * self.rng.uniform(0.5, 1.5)
            if now >= due["dup"]:
                try:
                    self._duplicate(sqs, url)
                except Exception as exc:  # the soak goes on; the count says what happened
                    self.counts[f"duplicate failed: {type(exc).__name__}"] += 1
                due["dup"] = now + DUPLICATE_EVERY_S


def _restarts(stack: LocalStack) -> int:
    """Worker sandboxes the runtime started again after they died (a kill -9, as Lambda would)."""
    return sum(b.restarts for b in stack.runtime.sandboxes if b.spec.name == "worker") if stack.runtime else 0


def _wait_ended(deps: Deps, job_ids: list[str], timeout: float) -> dict[str, Job]:
    """Poll until every job is terminal (or the timeout): the jobs as last read. Each poll reads the
    open jobs in submission order up to the first one still open (jobs end roughly in that order), so
    polling costs the moto server a few reads, not one per job."""
    ended: dict[str, Job] = {}
    open_ids = list(job_ids)
    deadline = time.monotonic() + timeout
    while open_ids and time.monotonic() < deadline:
        time.sleep(2.0)
        while open_ids:
            job = deps.jobs.get(open_ids[0])
            if job is None or not job.terminal:
                open_ids.append(open_ids.pop(0))  # look at the others first next time
                break
            ended[open_ids.pop(0)] = job
    return ended


def _ledger(path: Path) -> Counter[str]:
    """Model calls by outcome (a line cut short by a kill -9 is counted as such)."""
    out: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out[json.loads(line)["outcome"]] += 1
            except (ValueError, KeyError):
                out["(line cut by a kill)"] += 1
    return out


def _run_large_phase(stack: LocalStack, deps: Deps, small: list[tuple[str, str]], rng: random.Random
                     ) -> tuple[dict[str, str], dict[str, Any], Counter[str]]:
    """The large document, then small ones behind it; returns (job id -> text, timings, chaos counts)."""
    big = large_document(SIZE_LARGE)
    texts: dict[str, str] = {}
    started = time.monotonic()
    with Chaos(stack, rng) as chaos:
        big_id = submission.submit(deps, None, SubmitRequest.inline(big, document_id="large")).job_id
        texts[big_id] = big
        left_queued = None
        while time.monotonic() - started < 120:
            job = deps.jobs.get(big_id)
            if job is not None and job.state.value != "queued":
                left_queued = round(time.monotonic() - started, 1)
                break
            time.sleep(0.5)
        behind_at = time.monotonic()
        for name, text in small:
            texts[submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"behind:{name}")).job_id] = text
        ended = _wait_ended(deps, list(texts), PHASE_TIMEOUT_S)
    wall = time.monotonic() - started
    small_s = [round(j.ended_at - j.created_at, 1) for jid, j in ended.items()
               if jid != big_id and j.ended_at is not None]
    big_job = ended.get(big_id)
    timing = {"wall_s": round(wall, 1), "large_bytes": len(big.encode()),
              "large_chunks": len(chunk_document(big, LOCAL.review)),
              "large_left_queued_after_s": left_queued, "large_state": big_job.state.value if big_job else None,
              "large_error_code": big_job.error_code if big_job else None,
              "large_mandatory_gaps": [g.model_dump(mode="json") for g in big_job.mandatory_gaps] if big_job else [],
              "large_completed_after_s": round(big_job.ended_at - big_job.created_at, 1)
              if big_job and big_job.ended_at else None,
              "small_behind_large_s": {"max": max(small_s, default=None), "n": len(small_s)},
              "since_small_submitted_s": round(time.monotonic() - behind_at, 1)}
    return texts, timing, chaos.counts


def _run_mixed_phase(stack: LocalStack, deps: Deps, docs: list[tuple[str, str]], rng: random.Random
                     ) -> tuple[dict[str, str], dict[str, Any], Counter[str]]:
    texts: dict[str, str] = {}
    started = time.monotonic()
    assert stack.tickets is not None
    with Chaos(stack, rng) as chaos, Lifecycle(deps, stack.tickets, random.Random(rng.random())) as people:
        for name, text in docs:
            if rng.random() < RISKY_SHARE:  # a high-risk finding: the saga opens a ticket for it
                text += RISKY_CLAUSE
            job_id = submission.submit(deps, None, SubmitRequest.inline(text, document_id=name)).job_id
            texts[job_id] = text
            people.add(job_id)
        _wait_ended(deps, list(texts), PHASE_TIMEOUT_S * 0.8)
    stack.tickets.reset_faults()
    people.settle_waiting()  # what still waits for a person is decided, so every job ends
    _wait_ended(deps, list(texts), PHASE_TIMEOUT_S * 0.2)
    return texts, {"wall_s": round(time.monotonic() - started, 1), "lifecycle": dict(people.counts),
                   "jobs_touched_by_lifecycle": len(people.touched)}, chaos.counts


def _run_lanes_phase(stack: LocalStack, deps: Deps, docs: list[tuple[str, str]], rng: random.Random
                     ) -> tuple[dict[str, str], dict[str, Any], Counter[str]]:
    started = time.monotonic()
    how = lanes_documents(docs, rng)
    with Chaos(stack, rng) as chaos, LaneChaos(stack, deps, random.Random(rng.random())) as lanes:
        texts = run_lanes(deps, how)
        _wait_ended(deps, list(texts), PHASE_TIMEOUT_S)
    return texts, {"wall_s": round(time.monotonic() - started, 1), "jobs": len(texts),
                   "lane_chaos": dict(lanes.counts)}, chaos.counts


def _commit() -> str:
    """The commit the soak ran on (+ "-dirty" when the tree had changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _summarize(checks: list[JobCheck], jobs: dict[str, Job | None]) -> dict[str, Any]:
    states = Counter(c.state for c in checks)
    codes = Counter(f"{c.state}: {c.error_code}" for c in checks if c.error_code)
    root = Counter(j.root_error.error_code for j in jobs.values() if j and j.root_error)
    retries: Counter[str] = Counter()
    calls = repairs = failures = claims = redeliveries = 0
    for j in jobs.values():
        if j and j.reliability:
            retries.update(j.reliability.retries_by_code)
            calls += j.reliability.model_calls
            repairs += j.reliability.repairs
            failures += j.reliability.chunk_failures
            claims += j.reliability.claims
            redeliveries += j.reliability.redeliveries
    must_be_zero = {
        "lost_chunks": sum(len(c.lost_chunks) for c in checks),
        "duplicate_findings": sum(c.duplicate_findings for c in checks),
        "silently_incomplete_jobs": sum(c.silently_incomplete for c in checks),
        "failures_without_a_code": sum(c.uncoded_failure for c in checks),
    }
    also_zero = {
        "jobs_not_ended": sum(c.not_ended for c in checks),
        "missing_findings": sum(c.missing_findings for c in checks),
        "foreign_findings": sum(c.foreign_findings for c in checks),
        "jobs_with_findings_out_of_order": sum(bool(c.order_errors) for c in checks),
        "jobs_not_settled_exactly_once": sum(bool(c.settle_errors) for c in checks),
        "jobs_with_finding_counts_disagreeing": sum(bool(c.count_errors) for c in checks),
        "jobs_mixing_documents": sum(bool(c.mixing_errors) for c in checks),
        "completed_jobs_differing_from_the_fault_free_run": sum(c.state == "completed" and bool(c.problems)
                                                                for c in checks),
    }
    return {
        "must_be_zero": must_be_zero, "also_zero": also_zero,
        "jobs": len(checks), "jobs_by_state": dict(states), "error_codes": dict(codes),
        "root_error_codes": dict(root), "chunks": sum(c.chunks for c in checks),
        "findings_checked": sum(c.findings for c in checks),
        "coverage_gaps_listed": sum(len(c.gaps) for c in checks),
        "missing_chunks_listed_with_a_code": sum(len(c.missing_listed) for c in checks),
        "model_calls_in_ended_jobs": calls, "tier1_retries_by_code": dict(retries), "tier1_retries": sum(retries.values()),
        "repairs": repairs, "tier2_chunk_failures": failures, "claims": claims, "redeliveries": redeliveries,
        "problems": {c.job_id: c.problems for c in checks if c.problems},
    }


def _text_summary(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"soak: {s['jobs']} jobs, {s['chunks']} chunks, {result['wall_s']} s wall + {result['check_s']} s of "
             f"checks ({result['machine']['cpus']} cpus, {WORKERS} workers); documents from "
             f"{result['documents']['source']}"]
    lines += [f"  {k.replace('_', ' ')}: {v}" for k, v in s["must_be_zero"].items()]
    lines.append("  other differences from the fault-free run: "
                 + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["also_zero"].items()))
    lines.append(f"  jobs by state: {s['jobs_by_state']}; error codes: {s['error_codes']}; "
                 f"root causes: {s['root_error_codes']}")
    lines.append(f"  model calls: {result['model_calls']['total']} {result['model_calls']['by_outcome']}; "
                 f"tier-1 retries {s['tier1_retries']} {s['tier1_retries_by_code']}; repairs {s['repairs']}; "
                 f"tier-2 failed attempts {s['tier2_chunk_failures']}; redeliveries {s['redeliveries']}")
    lines.append(f"  chaos: {result['chaos']}; worker restarts {result['worker_restarts']}")
    life, mixed = result["lifecycle"], result["phases"]["mixed"]
    lines.append(f"  lifecycle: {mixed['lifecycle']} on {mixed['jobs_touched_by_lifecycle']} jobs")
    lines += [f"  {k.replace('_', ' ')}: {v}" for k, v in life["must_be_zero"].items()]
    lines.append(f"  tickets: {life['tickets']}; events: {life['events']}; compensation DLQ: "
                 f"{life['compensation_dlq']}")
    lines += [f"  {k.replace('_', ' ')}: {v}" for k, v in result["lanes"]["must_be_zero"].items()]
    dead, lanes = result["phases"]["dead_letters"], result["phases"]["lanes"]
    lines.append(f"  dead letters: {dead['jobs']} jobs {dead['states_before_redrive']} after "
                 f"{dead['dead_lettered_after_s']} s, "
                 f"{dead['analysis_dlq_messages_before_redrive']} in the analysis DLQ, {dead['redriven_messages']} "
                 f"redriven, then {dead['states_after_redrive']}")
    lines.append(f"  new lanes: {lanes['jobs']} jobs {result['lanes']['jobs_by_kind']}; batch events "
                 f"{result['lanes']['batch_events']}; {result['lanes']['bulk_deferrals_logged']} bulk deferrals "
                 f"logged; lane chaos {lanes['lane_chaos']}")
    lines.append(f"  commit: {result['commit']}")
    large = result["phases"]["large"]
    lines.append(f"  large document: {large['large_bytes']:,} bytes, {large['large_chunks']} chunks, left queued after "
                 f"{large['large_left_queued_after_s']} s, {large['large_state']} after "
                 f"{large['large_completed_after_s']} s; {N_BEHIND_LARGE} small ones behind it took at most "
                 f"{large['small_behind_large_s']['max']} s")
    return "\n".join(lines) + "\n"


@pytest.mark.soak
def test_soak_every_job_matches_a_fault_free_run_or_fails_with_a_code(tmp_path):
    rng = random.Random(2024)
    docs = soak_documents(N_DOCUMENTS + N_BEHIND_LARGE + N_LANES + 4 * N_DEAD_LETTERS)
    # phase 3's documents: at least two chunks each (chunk 1 is the one that fails), from the end of the list
    dead_docs = [d for d in docs[N_DOCUMENTS + N_BEHIND_LARGE + N_LANES:]
                 if len(chunk_document(d[1], LOCAL.review)) >= 2][:N_DEAD_LETTERS]
    lanes_docs = docs[N_DOCUMENTS + N_BEHIND_LARGE:N_DOCUMENTS + N_BEHIND_LARGE + N_LANES]
    _, from_cuad = sources()
    if not from_cuad:
        print("\nsoak: ../shared/data/cuad is absent: the documents are variants of samples/ only")
    calls = tmp_path / "calls.jsonl"
    # phase 1: transient faults only. With 1 % malformed output the large document's ~6,000 calls would hold about
    # one call malformed twice (repaired once, then a mandatory gap): a coded failure, but then it cannot complete
    base = FaultSpec(seed=31, transient_rate=0.05, call_log=str(calls))
    stack = LocalStack(faults=base, concurrency={"worker": WORKERS}, template=synth("local"),
                       state_dir=tmp_path / "stack", ticket_faults=TicketFaults(hang_s=3.0))
    started = time.monotonic()
    try:
        stack.start()
        deps = stack.deps()
        texts, large, chaos1 = _run_large_phase(stack, deps, docs[:N_BEHIND_LARGE], rng)
        restarts = _restarts(stack)
        stack.stop_workers()  # phase 2 adds the permanent faults
        stack.faults = base.model_copy(update={"malformed_rate": 0.01, "permanent_rate": 0.01})
        stack.start_workers()
        mixed_texts, mixed, chaos2 = _run_mixed_phase(stack, deps, docs[N_BEHIND_LARGE:N_BEHIND_LARGE + N_DOCUMENTS],
                                                      rng)
        texts.update(mixed_texts)
        restarts += _restarts(stack)
        # phase 3: dead letters, really redriven (chunk 1 of each job fails while the switch exists)
        stack.stop_workers()
        switch = tmp_path / "chunk-1-fails"
        switch.touch()
        stack.faults = FaultSpec(seed=37, always_fail_chunk="1", switch_file=str(switch), call_log=str(calls))
        stack.start_workers()
        with Chaos(stack, rng) as chaos_dlq:
            dead_texts, dead = run_dead_letter_phase(stack, deps, dead_docs, switch, _wait_ended, PHASE_TIMEOUT_S)
        texts.update(dead_texts)
        restarts += _restarts(stack)
        # phase 4: the new lanes (batch-mode, interactive and bulk jobs at once; batch faults; a second collector;
        # quota pause/set/clear), with phase 2's model faults
        stack.stop_workers()
        stack.faults = base.model_copy(update={"malformed_rate": 0.01, "permanent_rate": 0.01})
        stack.start_workers()
        lanes_texts, lanes, chaos4 = _run_lanes_phase(stack, deps, lanes_docs, rng)
        texts.update(lanes_texts)
        wall = time.monotonic() - started
        restarts += _restarts(stack)
        checked_at = time.monotonic()
        checks = [check_job(deps, job_id, text) for job_id, text in texts.items()]
        jobs = {job_id: deps.jobs.get(job_id) for job_id in texts}
        check_s = time.monotonic() - checked_at
        assert stack.tickets is not None
        compensations = redrive_compensations(stack, deps)
        invariants = {**lifecycle_invariants(deps, list(texts), stack.tickets), "compensation_dlq": compensations}
        lane_checks = lane_invariants(deps, list(lanes_texts), stack.state_dir / "logs", list(texts))
        dlq = {q.value: deps.queues.depth(q) for q in (Queue.ANALYSIS_DLQ, Queue.RESULTS_DLQ, Queue.INTAKE_DLQ)}
    finally:
        stack.stop()
    by_outcome = _ledger(calls)
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "profile": "local", "workers": WORKERS, "wall_s": round(wall, 1), "check_s": round(check_s, 1),
        "documents": {"source": "CUAD (../shared/data/cuad) + samples/ and their variants" if from_cuad
                      else "samples/ and their variants (../shared absent)", "count": len(texts),
                      "large_bytes_min": SIZE_LARGE},
        "faults": {"phase_large": base.model_dump(exclude={"call_log"}),
                   "phase_mixed": {"malformed_rate": 0.01, "permanent_rate": 0.01}, "kill_every_s": KILL_EVERY_S,
                   "stop_every_s": STOP_EVERY_S, "stop_for_s": STOP_FOR_S, "duplicate_every_s": DUPLICATE_EVERY_S},
        "commit": _commit(),
        "phases": {"large": large, "mixed": mixed, "dead_letters": dead, "lanes": lanes},
        "chaos": dict(chaos1 + chaos2 + chaos_dlq.counts + chaos4), "worker_restarts": restarts,
        "dlq_depth_at_end": dlq, "lanes": lane_checks,
        "model_calls": {"total": sum(by_outcome.values()), "by_outcome": dict(by_outcome)},
        "summary": _summarize(checks, jobs),
        "lifecycle": invariants,
        "reproduce": "make soak",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    text = _text_summary(result)
    (RESULTS / "soak.txt").write_text(text)
    print("\n" + text)
    summary = result["summary"]
    assert len(texts) >= N_DOCUMENTS
    assert summary["must_be_zero"] == dict.fromkeys(summary["must_be_zero"], 0), summary["problems"]
    assert summary["also_zero"] == dict.fromkeys(summary["also_zero"], 0), summary["problems"]
    assert invariants["must_be_zero"] == dict.fromkeys(invariants["must_be_zero"], 0), invariants["examples"]
    assert invariants["tickets"]["opened_equals_closed_plus_open_of_completed"], invariants["tickets"]
    assert large["large_state"] == "completed", (large["large_error_code"], large["large_mandatory_gaps"])
    assert lane_checks["must_be_zero"] == dict.fromkeys(lane_checks["must_be_zero"], 0), lane_checks["examples"]
    assert dead["states_before_redrive"] == {"dead_lettered": len(dead_texts)}, dead  # the redrive is of their own
    assert dead["redriven_messages"] >= N_DEAD_LETTERS, dead  # real redrives: each job's chunk 1 went to the DLQ
    assert dead["states_after_redrive"] == {"completed": len(dead_texts)}, dead
    assert result["chaos"].get("kill -9", 0) > 0 and result["chaos"].get("SIGSTOP", 0) > 0
