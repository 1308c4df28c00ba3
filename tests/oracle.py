"""The fault-free oracle: what a job must end with, computed in-process, without AWS.

The offline analyst (`OfflineRuleModel`) is deterministic, so whatever faults, crashes, zombies,
redeliveries and redrives a job went through, its report must hold exactly the findings of one
clean run of its document: the text chunked with the job's profile (`chunk_document`), every
analyst run once per chunk, findings in chunk order and, within a chunk, in analyst order (as the
worker writes them).

`check_job` compares a job as the pipeline left it with that run and says what differs, by kind
(the soak counts them); `assert_matches_fault_free` is the one assertion every recovery test makes:
(a) the report's findings equal the fault-free run's, (b) every chunk id is settled exactly once
(one `chunk.settled` event per chunk, the settled set equal to the chunk ids), (c) the finding count
equals the per-chunk sum (job.n_findings == sum of the chunk records' n_findings == len(findings)).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contract_review.config.profile import Profile, ReviewConfig
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import ClaimsRepo, Deps
from contract_review.domain.records import ChunkStatus, Job, JobState
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.review.analysts import Finding, analysts_for, run_analyst
from contract_review.review.chunking import chunk_document, document_hash


@dataclass(frozen=True)
class OracleChunk:
    """One chunk of the fault-free run."""

    chunk_id: str
    chunk_index: int
    findings: tuple[Finding, ...]
    findings_by_analyst: tuple[tuple[str, tuple[Finding, ...]], ...]
    model_calls: int  # the calls a clean run of the chunk needs


@functools.lru_cache(maxsize=64)
def fault_free_run(text: str, review: ReviewConfig, analyst_count: int) -> tuple[OracleChunk, ...]:
    """Every chunk of `text` with the findings one clean run of every analyst gives it."""
    model = OfflineRuleModel()

    def once(build: Any, parse: Any) -> tuple[Any, int]:
        request: ModelRequest = build(None)
        response: ModelResponse = model.invoke(request)
        return parse(response), 1

    out = []
    for chunk in chunk_document(text, review):
        by_analyst = []
        calls = 0
        for spec in analysts_for(analyst_count):
            result = run_analyst(spec, chunk, once)
            by_analyst.append((spec.name, tuple(result.findings)))
            calls += result.model_calls
        out.append(OracleChunk(chunk_id=chunk.chunk_id, chunk_index=chunk.index,
                               findings=tuple(f for _, fs in by_analyst for f in fs),
                               findings_by_analyst=tuple(by_analyst), model_calls=calls))
    return tuple(out)


def oracle_for(text: str, profile: Profile, analyst_count: int | None = None) -> tuple[OracleChunk, ...]:
    return fault_free_run(text, profile.review, analyst_count or profile.review.analyst_count)


def expected_findings(text: str, profile: Profile, analyst_count: int | None = None) -> list[Finding]:
    """The report findings of a fault-free run of `text`, in report order."""
    return [f for c in oracle_for(text, profile, analyst_count) for f in c.findings]


def _key(finding: Finding | dict[str, Any]) -> str:
    data = finding.model_dump(mode="json") if isinstance(finding, Finding) else finding
    return json.dumps(data, sort_keys=True)


@dataclass
class JobCheck:
    """How a job as the pipeline left it differs from the fault-free run (empty lists: it does not).

    For a job that ended with a report (completed, or failed / dead-lettered by finalize), the
    expected findings are those of the fault-free run minus what the report itself lists as missing
    (chunks not done, each with its error code; analysts refused or failed on a chunk, per the
    coverage matrix). A job ended by a job-fatal error has no report: only its code is checked."""

    job_id: str
    state: str
    error_code: str | None
    chunks: int  # of the fault-free run
    findings: int = 0  # in the report
    expected: int = 0  # of the fault-free run, minus what the report lists as missing
    gaps: list[tuple[str, str, str]] = field(default_factory=list)  # (chunk_id, analyst, status), listed
    missing_listed: list[tuple[str, str | None]] = field(default_factory=list)  # (chunk_id, error_code)
    # --- what must all be empty / zero -------------------------------------------------------
    lost_chunks: list[str] = field(default_factory=list)  # neither in the report nor listed missing with a code
    duplicate_findings: int = 0  # report findings beyond their count in the fault-free run
    missing_findings: int = 0  # findings of accounted chunks the report lacks
    foreign_findings: int = 0  # report findings the fault-free run does not have at all
    order_errors: list[str] = field(default_factory=list)  # chunks whose findings are there but out of order
    settle_errors: list[str] = field(default_factory=list)  # (b): not settled exactly once
    count_errors: list[str] = field(default_factory=list)  # (c): finding counts disagree
    mixing_errors: list[str] = field(default_factory=list)  # chunk records or document of another text
    silently_incomplete: bool = False  # ended, a chunk missing, and no error code says why
    uncoded_failure: bool = False  # failed / dead-lettered without an error code
    not_ended: bool = False

    @property
    def problems(self) -> list[str]:
        out = []
        if self.not_ended:
            out.append(f"not ended ({self.state})")
        if self.lost_chunks:
            out.append(f"lost chunks (no finding, no error): {self.lost_chunks}")
        for name in ("duplicate_findings", "missing_findings", "foreign_findings"):
            if getattr(self, name):
                out.append(f"{name.replace('_', ' ')}: {getattr(self, name)}")
        out += [f"order: {e}" for e in self.order_errors]
        out += [f"settled: {e}" for e in self.settle_errors]
        out += [f"counts: {e}" for e in self.count_errors]
        out += [f"mixed: {e}" for e in self.mixing_errors]
        if self.silently_incomplete:
            out.append("silently incomplete: ended with chunks missing and no error code")
        if self.uncoded_failure:
            out.append(f"{self.state} without an error code")
        return out


def _report(deps: Deps, job: Job) -> dict[str, Any] | None:
    if job.report_json_key is None:
        return None
    report: dict[str, Any] = json.loads(deps.artifacts.get_text(job.report_json_key))
    return report


def counted(claims: ClaimsRepo, job: Job | None) -> set[str]:
    """The ids of the job's chunks counted settled (their records' marks, and an older job's set); the job's
    count must agree with them."""
    assert job is not None
    ids = {c.chunk_id for c in claims.for_job(job.job_id) if job.counts(c)}
    assert job.n_settled == len(ids), f"{job.job_id}: settled count {job.n_settled}, counted chunks {sorted(ids)}"
    return ids


def _check_settled(check: JobCheck, deps: Deps, job: Job, records: list[ChunkRecord]) -> None:
    """(b) every chunk id settled exactly once: the aggregator's settled set is the chunk ids, and each
    chunk has one `chunk.settled` event for its final status (an earlier settling counts only when an
    operator redrove the chunk since)."""
    ids = {c.chunk_id for c in records}
    settled = {c.chunk_id for c in records if job.counts(c)}
    if settled != ids or job.n_settled != len(ids):
        check.settle_errors.append(f"counted chunks differ from the chunk ids: extra {sorted(settled - ids)}, "
                                   f"unsettled {sorted(ids - settled)}, count {job.n_settled}")
    events = [e for e in deps.jobs.events(job.job_id) if e.type == "chunk.settled"]
    final: Counter[str] = Counter()
    earlier: Counter[str] = Counter()
    status = {c.chunk_id: c.status.value for c in records}
    for e in events:
        cid = str(e.detail.get("chunk_id"))
        if cid not in status:
            check.settle_errors.append(f"a chunk.settled event for an unknown chunk {cid}")
        elif e.detail.get("status") == status[cid]:
            final[cid] += 1
        else:
            earlier[cid] += 1
    for c in records:
        if not c.settled:
            check.settle_errors.append(f"chunk {c.chunk_index} ({c.chunk_id}) is {c.status.value}")
        elif final[c.chunk_id] != 1:
            check.settle_errors.append(f"chunk {c.chunk_index} ({c.chunk_id}) settled {c.status.value} "
                                       f"{final[c.chunk_id]} times")
        if earlier[c.chunk_id] > c.redriven:
            check.settle_errors.append(f"chunk {c.chunk_index} ({c.chunk_id}) settled {earlier[c.chunk_id]} time(s) "
                                       f"with another status but was redriven {c.redriven} time(s)")


def _compare_chunk(check: JobCheck, oc: OracleChunk, actual: list[dict[str, Any]],
                   skip_analysts: set[str]) -> None:
    expected = [_key(f) for name, fs in oc.findings_by_analyst if name not in skip_analysts for f in fs]
    got = [_key(f) for f in actual]
    check.expected += len(expected)
    if got == expected:
        return
    want, have = Counter(expected), Counter(got)
    all_findings = Counter(_key(f) for f in oc.findings)
    extra = have - want
    check.duplicate_findings += sum(n for k, n in extra.items() if k in all_findings)
    check.foreign_findings += sum(n for k, n in extra.items() if k not in all_findings)
    check.missing_findings += sum((want - have).values())
    if want == have:
        check.order_errors.append(f"chunk {oc.chunk_index} ({oc.chunk_id})")


def _check_findings(check: JobCheck, oracle: tuple[OracleChunk, ...], records: list[ChunkRecord],
                    report: dict[str, Any]) -> None:
    """(a) the report's findings against the fault-free run, chunk by chunk, minus what it lists missing."""
    findings: list[dict[str, Any]] = report["findings"]
    check.findings = len(findings)
    by_chunk: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_chunk.setdefault(f["chunk_id"], []).append(f)
    known = {oc.chunk_id for oc in oracle}
    check.foreign_findings += sum(len(fs) for cid, fs in by_chunk.items() if cid not in known)
    order = [f["chunk_index"] for f in findings]
    if order != sorted(order):
        check.order_errors.append("findings are not in chunk order")
    coverage = report["coverage"]
    missing = {m["chunk_id"]: m for m in coverage["missing_chunks"]}
    check.missing_listed = [(cid, (m.get("error") or {}).get("error_code")) for cid, m in missing.items()]
    status = {c.chunk_id: c.status for c in records}
    for oc in oracle:
        row: dict[str, str] = coverage["matrix"].get(oc.chunk_id, {})
        if status.get(oc.chunk_id) is not ChunkStatus.DONE:
            listed = missing.get(oc.chunk_id)
            if listed is None or not (listed.get("error") or {}).get("error_code"):
                check.lost_chunks.append(oc.chunk_id)
            if by_chunk.get(oc.chunk_id):
                check.foreign_findings += len(by_chunk[oc.chunk_id])
            continue
        skip = {a for a, st in row.items() if st != "ok"}
        check.gaps += [(oc.chunk_id, a, row[a]) for a in sorted(skip)]
        _compare_chunk(check, oc, by_chunk.get(oc.chunk_id, []), skip)


def _check_counts(check: JobCheck, job: Job, records: list[ChunkRecord], report: dict[str, Any]) -> None:
    """(c) job.n_findings == sum of the chunk records' n_findings == len(report findings), per chunk too."""
    per_chunk = Counter(f["chunk_id"] for f in report["findings"])
    total = sum(c.n_findings for c in records if c.status is ChunkStatus.DONE)
    if not job.n_findings == total == len(report["findings"]):
        check.count_errors.append(f"job.n_findings {job.n_findings}, chunk records {total}, "
                                  f"report {len(report['findings'])}")
    for c in records:
        if c.status is ChunkStatus.DONE and c.n_findings != per_chunk[c.chunk_id]:
            check.count_errors.append(f"chunk {c.chunk_index}: record says {c.n_findings}, "
                                      f"report has {per_chunk[c.chunk_id]}")


def check_job(deps: Deps, job_id: str, text: str) -> JobCheck:
    """Compare the job, as the pipeline left it, with a fault-free run of `text`."""
    job = deps.jobs.get(job_id)
    if job is None:
        return JobCheck(job_id=job_id, state="absent", error_code=None, chunks=0, not_ended=True)
    oracle = oracle_for(text, deps.settings.profile, job.analyst_count or None)
    check = JobCheck(job_id=job_id, state=job.state.value, error_code=job.error_code, chunks=len(oracle))
    if not job.terminal:
        check.not_ended = True
        return check
    if job.state in (JobState.FAILED, JobState.DEAD_LETTERED) and not job.error_code:
        check.uncoded_failure = True
    if job.document_sha256 and job.document_sha256 != document_hash(text):  # "": rejected before intake read it
        check.mixing_errors.append("the job's document is not this text")
    records = deps.claims.for_job(job_id)
    ids = [(c.chunk_index, c.chunk_id) for c in records]
    if ids != [(oc.chunk_index, oc.chunk_id) for oc in oracle][:len(ids)]:
        check.mixing_errors.append(f"chunk records ({len(records)}) are not the text's chunks ({len(oracle)}) "
                                   f"(job says {job.chunk_count})")
    report = _report(deps, job)
    if report is None:  # ended by a job-fatal error (or bad input): no report, the code says why
        if not job.error_code:
            check.silently_incomplete = True
        return check
    if len(records) != len(oracle):  # finalized: every chunk has its record (fanned out in full)
        check.mixing_errors.append(f"finalized with {len(records)} chunk records; the text has {len(oracle)} chunks")
    _check_findings(check, oracle, records, report)
    _check_settled(check, deps, job, records)
    _check_counts(check, job, records, report)
    incomplete = check.lost_chunks or any(c.status is not ChunkStatus.DONE for c in records)
    if incomplete and not job.error_code:
        check.silently_incomplete = True
    return check


def assert_matches_fault_free(deps: Deps, job_id: str, text: str, *, gaps: bool = False) -> JobCheck:
    """The recovery tests' assertion: the job completed and its report equals a fault-free run of
    `text` (findings in order), every chunk settled exactly once, and the counts agree. `gaps`:
    optional analysts may be listed as refused/failed (their findings are then not expected)."""
    check = check_job(deps, job_id, text)
    assert check.state == JobState.COMPLETED.value, (check.state, check.error_code, check.problems)
    assert not check.problems, f"{job_id} differs from a fault-free run: {check.problems}"
    assert gaps or not check.gaps, f"coverage gaps: {check.gaps}"
    assert check.findings == check.expected
    return check
