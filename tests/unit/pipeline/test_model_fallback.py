"""A job's way around a model that disappears (pipeline/fallback.py): a model refused as unavailable moves the job to
the next model of the deploy's chain (`-c model_fallbacks`), keeping what its analysts finished; an operator's
`review model use` moves new jobs and jobs in flight; admission prices a document at the chain's dearest model.
The models are the strict simulated Bedrock (doubles/bedrock_runtime.py) behind the real Bedrock clients."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contract_review.config.catalogue import row_for
from contract_review.domain.errors import ErrorEnvelope, ReviewError
from contract_review.domain.model import ModelRequest, ModelResponse
from contract_review.domain.ports import Deps, Queue
from contract_review.domain.records import JobState, Waiting
from contract_review.doubles.bedrock_runtime import StrictBedrock
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.operate import job_view, model_control
from contract_review.pipeline import admission, fallback
from contract_review.pipeline.intake import handle_intake
from contract_review.review.analysts import analysis_identities, analysts_for
from review_local.ui_server import UiServer

from ...texts import LONG_TEXT
from ..fakes import FakeWorld
from ..local.test_ui_server import request
from .test_pinned_model import _run, redeployed

PRIMARY = "global.anthropic.claude-sonnet-4-6"
FALLBACK = "global.anthropic.claude-haiku-4-5-20251001-v1:0"
DOCUMENT = json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT}})


class RevokedAfter:
    """The offline rule model answering for the strict double, which revokes `model_id` after `after` answers (its
    access withdrawn mid-job)."""

    def __init__(self, strict: StrictBedrock, model_id: str, after: int):
        self.strict, self.revoking, self.after, self.inner = strict, model_id, after, OfflineRuleModel()
        self.model_id = self.inner.model_id

    def invoke(self, request: ModelRequest) -> ModelResponse:
        if self.strict.answered_by.get(self.revoking, 0) >= self.after:
            self.strict.revoked.add(self.revoking)
        return self.inner.invoke(request)


def _deploy(world: FakeWorld, fallbacks: tuple[str, ...] = (FALLBACK,)) -> Deps:
    return dataclasses.replace(world.deps, settings=redeployed(world, PRIMARY, fallbacks))


def _intake(world: FakeWorld, deps: Deps) -> str:
    result = handle_intake(deps, DOCUMENT, "m-1")
    assert result.job_id is not None
    return result.job_id


def _revoked_mid_job(after: int) -> tuple[FakeWorld, str, StrictBedrock]:
    """A job taken in on a deploy of PRIMARY with FALLBACK as its fallback, PRIMARY's access revoked after it answered
    `after` calls, and the deploy's workers working its chunks: the world, the job and the strict double."""
    world = FakeWorld()
    job_id = _intake(world, _deploy(world))
    strict = StrictBedrock(OfflineRuleModel())
    strict.answer = RevokedAfter(strict, PRIMARY, after=after)
    models = {m: strict.client(m) for m in (PRIMARY, FALLBACK)}
    _run(world, models[PRIMARY], models, fallbacks=(FALLBACK,))
    return world, job_id, strict


def _events(world: FakeWorld, job_id: str, kind: str) -> list[dict[str, object]]:
    return [e.detail for e in world.jobs.events(job_id) if e.type == kind]


def test_a_job_whose_model_is_revoked_mid_job_completes_on_the_fallback_keeping_what_its_analysts_finished() -> None:
    # GIVEN a job on PRIMARY, with FALLBACK its fallback, and PRIMARY's access revoked after it answered 5 calls
    # WHEN the deploy's workers work its chunks
    world, job_id, strict = _revoked_mid_job(after=5)
    # THEN the job completed on FALLBACK, having run on PRIMARY first
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED, job
    assert (job.model_id, job.earlier_models) == (FALLBACK, [PRIMARY])
    assert strict.answered_by[PRIMARY] == 5 and strict.answered_by[FALLBACK] > 0
    # AND the switch is one event naming both models, the refusal's code and who switched
    assert _events(world, job_id, "job.model_switched") == [
        {"from_model": PRIMARY, "to_model": FALLBACK, "reason": "model.access_denied", "by": "worker",
         "detail": f"its calls go to {FALLBACK} from now on (model.access_denied); the checkpoints made on {PRIMARY} "
                   "are kept"}]
    # AND no analyst of any chunk finished twice (what PRIMARY answered in full was kept, not run again)
    done = [(e["chunk_id"], a["analyst"]) for e in _events(world, job_id, "analyst.done")
            for a in e["analysts"]]  # type: ignore[attr-defined]  # event details are JSON
    assert len(done) == len(set(done)) == job.chunk_count * job.analyst_count
    # AND each checkpoint is under the identity of the model that answered it, both models among them
    settings = redeployed(world, PRIMARY, (FALLBACK,))
    specs = analysts_for(job.analyst_count)
    by_model = {m: analysis_identities(settings, specs, m) for m in (PRIMARY, FALLBACK)}
    seen = set()
    for record in world.claims.for_job(job_id):
        for name, cp in world.claims.checkpoints(record).items():
            model = next(m for m, ids in by_model.items() if ids[name] == cp.config_hash)
            assert record.models[name] == model
            seen.add(model)
    assert seen == {PRIMARY, FALLBACK}
    # AND the report names each analyst's models
    report = json.loads(world.artifacts.get_text(job.report_json_key or ""))
    assert {m for by in report["coverage"]["models"].values() for m in by} == {PRIMARY, FALLBACK}
    md = world.artifacts.get_text(job.report_md_key or "")
    assert f"it ran on {PRIMARY}, {FALLBACK} (it fell back)" in md
    # AND so does the job's view (`review status`, the status page)
    view = job_view.view_of(world.deps, job)
    assert view.earlier_models == [PRIMARY] and view.analyst_models == report["coverage"]["models"]
    assert job_view.model_words(view).startswith(f"{FALLBACK} (ran on {PRIMARY} then {FALLBACK}; answers by analyst")
    with UiServer(world.deps) as page:  # the status page's job route, as the page reads it
        _, detail, _ = request(page, "GET", f"/api/jobs/{job_id}")
    assert isinstance(detail, dict) and detail["model"] == job_view.model_words(view)


def test_a_revoked_model_with_no_fallback_left_fails_the_job_with_its_code() -> None:
    world = FakeWorld()
    job_id = _intake(world, _deploy(world, fallbacks=()))
    strict = StrictBedrock(OfflineRuleModel(), revoked={PRIMARY})
    _run(world, strict.client(PRIMARY), {})
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.FAILED and job.error_code == "model.access_denied"
    assert not _events(world, job_id, "job.model_switched") and strict.answered == 0


def test_an_operators_switch_moves_new_jobs_and_jobs_in_flight_and_reset_brings_new_jobs_back() -> None:
    # GIVEN a job in flight on PRIMARY
    world = FakeWorld()
    deps = _deploy(world)
    in_flight = _intake(world, deps)
    # WHEN an operator switches the stack to FALLBACK (`review model use`)
    model_control.model_use(deps, "cli", FALLBACK)
    # THEN a job taken in now starts on it, and the job in flight moves to it at its next chunk
    new = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT + " Annex."}}), "m-2")
    strict = StrictBedrock(OfflineRuleModel())
    models = {m: strict.client(m) for m in (PRIMARY, FALLBACK)}
    _run(world, models[PRIMARY], models, fallbacks=(FALLBACK,))
    assert set(strict.answered_by) == {FALLBACK}  # no call went to PRIMARY
    for job_id in (in_flight, new.job_id or ""):
        job = world.jobs.get(job_id)
        assert job is not None and job.state is JobState.COMPLETED and job.model_id == FALLBACK
    assert [(e["from_model"], e["reason"], e["by"]) for e in _events(world, in_flight, "job.model_switched")] == \
        [(PRIMARY, "operator", "operator")]
    assert not _events(world, new.job_id or "", "job.model_switched")  # it started there
    # AND after `review model reset` a new job starts on the deploy's model again
    model_control.model_reset(deps, "cli")
    later = handle_intake(deps, json.dumps({"schema_version": 1, "document": {"text": LONG_TEXT + " B."}}), "m-3")
    job = world.jobs.get(later.job_id or "")
    assert job is not None and job.model_id == PRIMARY


def test_an_operators_switch_leaves_a_job_being_cancelled_alone() -> None:
    world = FakeWorld()
    deps = _deploy(world)
    job = world.jobs.get(_intake(world, deps))
    assert job is not None
    model_control.model_use(deps, "cli", FALLBACK)
    cancelling = job.model_copy(update={"state": JobState.CANCELLING})
    assert fallback.follow_operator(deps, cancelling) is cancelling
    assert world.jobs.get(job.job_id).model_id == PRIMARY  # type: ignore[union-attr]  # the job exists
    assert not _events(world, job.job_id, "job.model_switched")


@pytest.mark.parametrize(("model_id", "code"), [("anthropic.claude-nonesuch-9", "model.not_catalogued"),
                                                ("global.anthropic.claude-opus-4-6-v1", "model.not_granted")])
def test_review_model_use_refuses_an_uncatalogued_or_ungranted_model_writing_nothing(model_id: str, code: str) -> None:
    world = FakeWorld()
    deps = _deploy(world)
    before = world.model_control.get()
    with pytest.raises(ReviewError) as refused:
        model_control.model_use(deps, "cli", model_id)
    assert refused.value.envelope.error_code == code and world.model_control.get() == before


def test_a_hold_by_the_models_own_daily_quota_falls_back_only_after_the_profiles_wait() -> None:
    world = FakeWorld()
    deps = _deploy(world)
    job = world.jobs.get(_intake(world, deps))
    assert job is not None
    after = deps.settings.profile.quota.fallback_after_daily_hold_s
    assert after is not None
    held = ErrorEnvelope.of("model.daily_quota_exhausted", "held")
    waiting = Waiting(condition="daily_token_quota", model_id=PRIMARY, since=world.clock(), detail="waiting")
    job = job.model_copy(update={"waiting": waiting})
    assert fallback.reason_to_leave(deps, job, held) is None  # held, not yet for long
    world.clock.advance(after)
    assert fallback.reason_to_leave(deps, job, held) == "model.daily_quota_exhausted"
    assert fallback.reason_to_leave(deps, job, ErrorEnvelope.of("model.throttled", "busy")) is None


def test_admission_prices_a_document_at_the_dearest_model_of_the_chain() -> None:
    world = FakeWorld()
    cheap, dear = FALLBACK, "global.anthropic.claude-opus-4-6-v1"
    assert row_for(dear).price.input_per_1k > row_for(cheap).price.input_per_1k  # what the test relies on
    chain = redeployed(world, cheap, (dear,))
    assert admission.estimate(chain, LONG_TEXT) == admission.estimate(redeployed(world, dear), LONG_TEXT)
    assert admission.estimate(chain, LONG_TEXT).model_micro_usd > \
        admission.estimate(redeployed(world, cheap), LONG_TEXT).model_micro_usd


def test_the_chain_runs_from_the_jobs_model_and_never_back() -> None:
    world = FakeWorld()
    job = world.jobs.get(_intake(world, _deploy(world)))
    assert job is not None
    chain = (PRIMARY, FALLBACK, "global.anthropic.claude-opus-4-6-v1")
    assert fallback.next_model(chain, job) == FALLBACK
    moved = job.model_copy(update={"model_id": FALLBACK, "earlier_models": [PRIMARY]})
    assert fallback.next_model(chain, moved) == chain[2]
    assert fallback.next_model(chain[:2], moved) is None
    assert world.queues.sent[Queue.ANALYSIS]  # the job was fanned out (its chunks are waiting)


# --- the documented recoveries of the codes this lane adds (reliability/test_recoveries.py runs them) -------------

def _findings(world: FakeWorld, job_id: str) -> list[tuple[object, ...]]:
    job = world.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED, job
    found = json.loads(world.artifacts.get_text(job.report_json_key or ""))["findings"]
    return sorted((f["chunk_index"], f["analyst"], f["category"], f["start"], f["end"], f["score"]) for f in found)


def _fault_free() -> list[tuple[object, ...]]:
    world = FakeWorld()
    job_id = _intake(world, _deploy(world))
    strict = StrictBedrock(OfflineRuleModel())
    _run(world, strict.client(PRIMARY), {}, fallbacks=(FALLBACK,))
    return _findings(world, job_id)


def _switched(code: str) -> None:
    """model.switched: "Nothing": the job's model revoked mid-job, it goes on with the fallback by itself and completes
    with the findings of a run on which nothing was revoked."""
    world, job_id, _ = _revoked_mid_job(after=3)
    assert any(e.detail.get("reason") == fallback.SWITCHED for e in world.jobs.events(job_id)
               if e.type == "chunk.requeued"), code
    assert _findings(world, job_id) == _fault_free()


def _not_catalogued(code: str) -> None:
    """model.not_catalogued: "Use a catalogued id": `review model use` of an uncatalogued id is refused, the same with
    a catalogued one moves the job, which completes with the findings of a run that never switched."""
    world = FakeWorld()
    deps = _deploy(world)
    job_id = _intake(world, deps)
    with pytest.raises(ReviewError) as refused:
        model_control.model_use(deps, "cli", "anthropic.claude-nonesuch-9")
    assert refused.value.envelope.error_code == code
    model_control.model_use(deps, "cli", FALLBACK)
    strict = StrictBedrock(OfflineRuleModel())
    models = {m: strict.client(m) for m in (PRIMARY, FALLBACK)}
    _run(world, models[PRIMARY], models, fallbacks=(FALLBACK,))
    assert set(strict.answered_by) == {FALLBACK}
    assert _findings(world, job_id) == _fault_free()


FALLBACK_RECOVERIES = {"model.switched": _switched, "model.not_catalogued": _not_catalogued}
