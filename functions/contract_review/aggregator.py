"""Aggregator: record each settled chunk; when all are settled, write the report and end the job.

Coverage policy (docs/runbook.md):
- every mandatory analyst `ok` on every chunk, optional ones `ok` -> `completed`;
- optional analysts refused/failed somewhere -> `completed`, with `coverage.optional_gaps` listed;
- a mandatory analyst refused/failed on some chunk -> `failed` (`job.chunks_missing`), naming the chunk
  and analyst of each gap on the job (`mandatory_gaps`);
- any chunk dead-lettered (no coverage at all) -> `dead_lettered`, listing the missing chunks and why.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .analysts import CATEGORY_BY_KEY, analysts_for
from .errors import ErrorEnvelope
from .messages import ResultMessage
from .store import SETTLED_CHUNK_STATES, TERMINAL_JOB_STATES, Store


def handle_result(store: Store, msg: ResultMessage) -> str:
    job = store.get_job(msg.job_id)
    if job is None or job.get("state") in TERMINAL_JOB_STATES:
        return "ignored"
    chunk = store.get_chunk(msg.job_id, msg.chunk_id)
    if chunk is None or chunk.get("status") != msg.status:
        return "stale"  # the chunk moved on (redrive, newer owner); its own message will settle it
    job = store.settle_chunk(msg.job_id, msg.chunk_id)
    settled = len(job.get("settled") or ())
    store.event(msg.job_id, "chunk.settled", chunk_id=msg.chunk_id, chunk_index=msg.chunk_index, status=msg.status,
                settled=settled, total=job.get("chunk_count"))
    if settled >= int(job.get("chunk_count") or 0) and job.get("state") == "running":
        return finalize(store, job)
    return "recorded"


def coverage_matrix(job: dict[str, Any], chunks: list[dict[str, Any]]) -> dict[str, Any]:
    specs = analysts_for(int(job.get("analyst_count") or 11))
    matrix: dict[str, dict[str, str]] = {}
    mandatory_gaps, optional_gaps, missing = [], [], []
    for c in chunks:
        row: dict[str, str] = {}
        cov = c.get("coverage") or {}
        for spec in specs:
            st = cov.get(spec.name, "missing") if c.get("status") == "done" else c.get("status", "missing")
            row[spec.name] = st
            if st != "ok":
                gap = {"chunk_id": c["chunk_id"], "chunk_index": c.get("chunk_index"), "analyst": spec.name,
                       "status": st}
                (mandatory_gaps if spec.mandatory else optional_gaps).append(gap)
        matrix[c["chunk_id"]] = row
        if c.get("status") != "done":
            missing.append({"chunk_id": c["chunk_id"], "chunk_index": c.get("chunk_index"),
                            "status": c.get("status"), "error": c.get("last_error"),
                            "failures": c.get("failures", 0)})
    return {"analysts": [s.name for s in specs], "mandatory": [s.name for s in specs if s.mandatory],
            "matrix": matrix, "mandatory_gaps": mandatory_gaps, "optional_gaps": optional_gaps,
            "missing_chunks": missing}


def reliability(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    retries: Counter[str] = Counter()
    for c in chunks:
        retries.update({k: int(v) for k, v in (c.get("retries") or {}).items()})
    return {"model_calls": sum(int(c.get("n_calls", 0)) for c in chunks), "retries_by_code": dict(retries),
            "repairs": sum(int(c.get("repairs", 0)) for c in chunks),
            "redeliveries": sum(int(c.get("redeliveries", 0)) for c in chunks),
            "claims": sum(int(c.get("receives", 0)) for c in chunks),
            "chunk_failures": sum(int(c.get("failures", 0)) for c in chunks)}


def _markdown(job: dict[str, Any], report: dict[str, Any]) -> str:
    lines = [f"# Contract review {job['job_id']}", "",
             f"- state: **{report['state']}**", f"- document: {job.get('document_id') or job.get('document_sha256', '')[:12]}"
             f" ({job.get('document_chars', 0)} chars, {job.get('chunk_count')} chunks)",
             f"- model: {job.get('model_id')} (prompt {job.get('prompt_version')})",
             f"- findings: {len(report['findings'])}", ""]
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        by_cat.setdefault(f["category"], []).append(f)
    lines += ["## Summary by category", "", "| category | findings | max risk |", "|---|---|---|"]
    for key, cat in CATEGORY_BY_KEY.items():
        fs = by_cat.get(key, [])
        lines.append(f"| {cat.title} | {len(fs)} | {max((f['score'] for f in fs), default=0):.2f} |")
    lines += ["", "## Highest-risk clauses", ""]
    for f in sorted(report["findings"], key=lambda f: (-f["score"], f["start"]))[:15]:
        quote = f["quote"] if len(f["quote"]) <= 300 else f["quote"][:297] + "..."
        lines.append(f"- **{CATEGORY_BY_KEY[f['category']].title}** ({f['score']:.2f}, chars {f['start']}-{f['end']}): "
                     f"> {quote}  \n  _{f['rationale']}_")
    cov = report["coverage"]
    if cov["missing_chunks"] or cov["mandatory_gaps"] or cov["optional_gaps"]:
        lines += ["", "## Coverage gaps", ""]
        for m in cov["missing_chunks"]:
            code = (m.get("error") or {}).get("error_code", "unknown")
            lines.append(f"- chunk {m['chunk_index']} ({m['chunk_id']}): {m['status']} — {code}")
        for g in cov["mandatory_gaps"] + cov["optional_gaps"]:
            if g["status"] in ("refused", "failed"):
                lines.append(f"- chunk {g['chunk_index']} analyst {g['analyst']}: {g['status']}")
    return "\n".join(lines) + "\n"


def finalize(store: Store, job: dict[str, Any]) -> str:
    job_id = job["job_id"]
    chunks = store.chunk_records(job_id)
    # The settled set is a counter, the chunk records are the truth: a chunk redriven after its
    # result was counted is not settled any more, and its own result will come.
    unsettled = [c["chunk_id"] for c in chunks if c.get("status") not in SETTLED_CHUNK_STATES]
    if unsettled:
        store.unsettle_chunks(job_id, unsettled)
        return "recorded"
    coverage = coverage_matrix(job, chunks)
    findings: list[dict[str, Any]] = []
    for c in chunks:  # chunk order
        if c.get("status") == "done" and c.get("findings_key"):
            findings.extend(json.loads(store.get_object(c["findings_key"]))["findings"])
    if coverage["missing_chunks"] and any(m["status"] == "dead_lettered" for m in coverage["missing_chunks"]):
        state, code = "dead_lettered", "runtime.dead_lettered"
    elif coverage["missing_chunks"] or coverage["mandatory_gaps"]:
        state, code = "failed", "job.chunks_missing"
    else:
        state, code = "completed", None
    rel = reliability(chunks)
    report = {"job_id": job_id, "state": state, "document_id": job.get("document_id"),
              "document_sha256": job.get("document_sha256"), "model_id": job.get("model_id"),
              "prompt_version": job.get("prompt_version"), "chunk_count": job.get("chunk_count"),
              "findings": findings, "coverage": coverage, "reliability": rel}
    json_key, md_key = f"reports/{job_id}/report.json", f"reports/{job_id}/report.md"
    store.put_object(json_key, json.dumps(report, indent=1))
    store.put_object(md_key, _markdown(job, report), "text/markdown; charset=utf-8")
    fields: dict[str, Any] = {"report_json_key": json_key, "report_md_key": md_key, "ended_at": store.clock(),
                              "n_findings": len(findings), "reliability": rel,
                              "coverage_summary": {"mandatory_gaps": len(coverage["mandatory_gaps"]),
                                                   "optional_gaps": len(coverage["optional_gaps"]),
                                                   "missing_chunks": [m["chunk_id"] for m in coverage["missing_chunks"]]}}
    if code:
        first = next((m.get("error") for m in coverage["missing_chunks"] if m.get("error")), None)
        env = ErrorEnvelope.of(code, f"{len(coverage['missing_chunks'])} chunk(s) missing, "
                                     f"{len(coverage['mandatory_gaps'])} mandatory gap(s)", step="aggregate")
        fields.update({"error": env.model_dump(mode="json"), "error_code": code, "root_error": first,
                       "missing": coverage["missing_chunks"], "mandatory_gaps": coverage["mandatory_gaps"]})
    if store.transition(job_id, ["running"], state, fields):
        store.event(job_id, f"job.{state}", findings=len(findings), error_code=code,
                    missing_chunks=[m["chunk_id"] for m in coverage["missing_chunks"]])
    return state
