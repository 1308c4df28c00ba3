"""Jobs and the models they run on, on embedded AWS with real worker processes calling the strict simulated Bedrock
(model provider `simulated`: the real Bedrock clients of catalogued models, answered by the offline rule model; a
model listed in the revoked file answers 403 AccessDeniedException, as a model whose access was withdrawn does):
- a model revoked mid-job: the job completes on the deploy's fallback (`-c model_fallbacks`), its events and report
  name the models, and no analyst that finished on the first model runs again;
- `review model use` / `review model reset` switch new calls with no redeploy, within the control's cache period;
- a job in flight keeps its model when the workers restart with another default."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from contract_review.config.profile import get_profile
from contract_review.domain.ports import Deps
from contract_review.domain.records import Job, JobState
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from review_local.cli import Ctx, cli
from review_local.embedded import synth
from review_local.stack import LocalStack

from ..large_docs import large_contract
from .conftest import ONE_BY_ONE, ledger, wait_for, wait_jobs

PRIMARY = "global.anthropic.claude-sonnet-4-6"
FALLBACK = "global.anthropic.claude-haiku-4-5-20251001-v1:0"
MAX_AGE_S = get_profile("local").quota.model_control_max_age_s
CALL_MS = 100  # with the analysts one by one, a chunk takes about 2 s: a model can be revoked mid-job


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path, Path]]:
    """A local stack deployed with `-c model_provider=simulated -c model_id=PRIMARY -c model_fallbacks=FALLBACK`: its
    stack, its call ledger and its revoked file."""
    state = tmp_path_factory.mktemp("simulated")
    calls, revoked = state / "calls.jsonl", state / "revoked"
    template = synth("local", {"model_provider": "simulated", "model_id": PRIMARY, "model_fallbacks": FALLBACK})
    stack = LocalStack(template=template, state_dir=state / "stack", faults=FaultSpec(
        latency_ms=CALL_MS, call_log=str(calls), revoked_file=str(revoked)),
        extra_env={"worker": {"PROFILE_OVERRIDES": json.dumps(ONE_BY_ONE)}})
    stack.start()
    try:
        yield stack, calls, revoked
    finally:
        stack.stop()


def _submit(deps: Deps, variant: int) -> str:
    text = large_contract(32_000, variant=variant)
    return submission.submit(deps, None, SubmitRequest.inline(text, document_id=f"models-{variant}")).job_id


def _chunks(deps: Deps, job_id: str) -> set[str]:
    return {r.chunk_id for r in deps.claims.for_job(job_id)}


def _calls(log: Path, chunks: set[str]) -> list[dict[str, Any]]:
    return [c for c in ledger(log) if c["chunk_id"] in chunks]


def _report(deps: Deps, job: Job) -> dict[str, Any]:
    return json.loads(deps.artifacts.get_text(job.report_json_key or ""))


def _review(deps: Deps, *args: str) -> str:
    result = CliRunner().invoke(cli, list(args), obj=Ctx(None, None, deps=deps))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_model_revoked_mid_job_hands_the_job_to_the_fallback_which_completes_it(simulated) -> None:
    stack, log, revoked = simulated
    deps = stack.deps()
    job_id = _submit(deps, variant=11)
    # GIVEN the job under way on PRIMARY
    wait_for(lambda: len(_calls(log, _chunks(deps, job_id))) >= 5, 120, 0.05, "calls under way")
    # WHEN PRIMARY's access is revoked
    revoked.write_text(PRIMARY + "\n")
    try:
        job = wait_jobs(deps, [job_id], timeout=300)[job_id]
    finally:
        revoked.write_text("")
    # THEN the job completed on FALLBACK, having started on PRIMARY
    assert job.state is JobState.COMPLETED, (job.state, job.error_code)
    assert (job.model_id, job.earlier_models) == (FALLBACK, [PRIMARY])
    answered = {c["model_id"] for c in _calls(log, _chunks(deps, job_id)) if c["outcome"] == "ok"}
    assert answered == {PRIMARY, FALLBACK}
    # AND one event recorded the switch, with the refusal's code
    switched = [e.detail for e in deps.jobs.events(job_id) if e.type == "job.model_switched"]
    assert [(d["from_model"], d["to_model"], d["reason"]) for d in switched] == \
        [(PRIMARY, FALLBACK, "model.access_denied")]
    # AND no analyst of any chunk finished twice: what PRIMARY answered in full was kept, not billed again
    done = [(e.detail["chunk_id"], a["analyst"]) for e in deps.jobs.events(job_id) if e.type == "analyst.done"
            for a in e.detail["analysts"]]  # type: ignore[union-attr]  # event details are JSON
    assert len(done) == len(set(done)) == job.chunk_count * job.analyst_count
    # AND the report names the models each analyst's answers came from
    models = _report(deps, job)["coverage"]["models"]
    assert {m for by in models.values() for m in by} == {PRIMARY, FALLBACK}
    assert sum(n for by in models.values() for n in by.values()) == job.chunk_count * job.analyst_count
    md = deps.artifacts.get_text(job.report_md_key or "")
    assert f"it ran on {PRIMARY}, {FALLBACK} (it fell back)" in md
    # AND `review status` says which models it ran on, and the switch among its events
    status = _review(deps, "status", job_id)
    assert f"(ran on {PRIMARY} then {FALLBACK}; answers by analyst" in status


def test_review_model_use_and_reset_switch_new_calls_with_no_redeploy(simulated) -> None:
    stack, log, _ = simulated
    deps = stack.deps()
    # WHEN an operator switches the stack's model to FALLBACK
    assert f"model: {FALLBACK} (review model use" in _review(deps, "model", "use", FALLBACK)
    time.sleep(MAX_AGE_S + 0.5)  # the control's cache period (the functions read it at most this old)
    # THEN a job submitted now runs on FALLBACK only
    on_fallback = wait_jobs(deps, [_submit(deps, variant=12)], timeout=300)
    (job,) = on_fallback.values()
    assert job.state is JobState.COMPLETED and job.model_id == FALLBACK and job.earlier_models == []
    assert {c["model_id"] for c in _calls(log, _chunks(deps, job.job_id))} == {FALLBACK}
    # WHEN the operator resets it
    assert f"model: {PRIMARY} (the deploy's)" in _review(deps, "model", "reset")
    time.sleep(MAX_AGE_S + 0.5)
    # THEN the next job runs on the deploy's model
    (job,) = wait_jobs(deps, [_submit(deps, variant=13)], timeout=300).values()
    assert job.state is JobState.COMPLETED and job.model_id == PRIMARY
    assert {c["model_id"] for c in _calls(log, _chunks(deps, job.job_id))} == {PRIMARY}


def test_review_model_use_refuses_a_model_with_no_catalogue_row_in_one_line(simulated) -> None:
    stack, _, _ = simulated
    deps = stack.deps()
    before = deps.model_control.get() if deps.model_control is not None else None
    result = CliRunner().invoke(cli, ["model", "use", "anthropic.claude-nonesuch-9"], obj=Ctx(None, None, deps=deps))
    assert result.exit_code == 1 and result.output.startswith("Error: model.not_catalogued: model id "), result.output
    assert len(result.output.strip().splitlines()) == 1
    ungranted = CliRunner().invoke(cli, ["model", "use", "global.anthropic.claude-opus-4-6-v1"],
                                   obj=Ctx(None, None, deps=deps))
    assert ungranted.exit_code == 1 and "model.not_granted" in ungranted.output
    assert deps.model_control is not None and deps.model_control.get() == before


def test_a_job_in_flight_keeps_its_model_when_the_workers_restart_with_another_default(simulated) -> None:
    stack, log, _ = simulated
    deps = stack.deps()
    job_id = _submit(deps, variant=14)
    wait_for(lambda: len(_calls(log, _chunks(deps, job_id))) >= 10, 120, 0.05, "calls under way")
    # WHEN the workers restart deployed with FALLBACK as their model (PRIMARY kept among the fallbacks)
    stack.stop_workers()
    before = dict(stack.extra_env.get("worker", {}))
    stack.extra_env.setdefault("worker", {}).update(MODEL_ID=FALLBACK, MODEL_FALLBACKS=PRIMARY)
    try:
        stack.start_workers()
        job = wait_jobs(deps, [job_id], timeout=300)[job_id]
    finally:
        stack.stop_workers()
        stack.extra_env["worker"] = before
        stack.start_workers()
    # THEN the job completed on its own model: no call of it went to the new default
    assert job.state is JobState.COMPLETED and job.model_id == PRIMARY and job.earlier_models == []
    assert {c["model_id"] for c in _calls(log, _chunks(deps, job_id))} == {PRIMARY}
    models = _report(deps, job)["coverage"]["models"]
    assert {m for by in models.values() for m in by} == {PRIMARY}
