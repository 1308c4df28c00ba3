"""The bench's old prompt layout (bench/legacy_layout.py): the same answers, the old requests' cost; the bench
wraps the model through the fault spec's seam (`FaultSpec.model_wrapper`), as the worker's wiring builds it."""

from __future__ import annotations

from bench.legacy_layout import MAX_TOKENS, PerAnalystLayout, legacy_request
from contract_review.config.profile import get_profile
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.doubles.spec import FaultSpec
from contract_review.review.analysts import analysts_for, build_request, run_analyst, step_schemas
from contract_review.review.chunking import chunk_document
from contract_review.wiring import build_model

from ...large_docs import large_contract
from ..fakes import SETTINGS


def test_the_old_layout_gets_the_same_findings_and_caches_nothing_where_todays_caches_its_prefix():
    review = get_profile("local").review
    chunk = chunk_document(large_contract(20_000), review)[0]
    today = OfflineRuleModel(SimulatedPromptCache())
    old = PerAnalystLayout(OfflineRuleModel(SimulatedPromptCache()), step_schemas())
    usage = {"today": [0, 0], "old": [0, 0]}  # [input + cache writes, cache reads]

    def caller(name, model):
        def call(build, parse):
            response = model.invoke(build(None))
            usage[name][0] += response.input_tokens + response.cache_write_tokens
            usage[name][1] += response.cache_read_tokens
            return parse(response), 1
        return call

    for spec in analysts_for(review.analyst_count):
        assert run_analyst(spec, chunk, caller("today", today)).findings == \
            run_analyst(spec, chunk, caller("old", old)).findings
    assert usage["old"][1] == 0 and usage["today"][1] > 0  # the old per-analyst prefix is under the minimum
    assert usage["old"][0] > 3 * usage["today"][0]  # the excerpt paid in full by every call
    request = legacy_request(build_request(analysts_for(1)[0], "locate", chunk, None, None), step_schemas())
    assert request.context == "" and chunk.text in request.prompt and request.max_tokens == MAX_TOKENS



def _chain(model: object) -> list[str]:
    """The model client's decorators, outermost first, down to the model."""
    names = []
    while model is not None:
        names.append(type(model).__name__)
        model = getattr(model, "inner", None)
    return names


def test_the_bench_wraps_the_model_through_the_fault_specs_seam_and_nothing_else_does():
    def built(spec: FaultSpec) -> list[str]:
        settings = SETTINGS.model_copy(update={"model_provider": "offline", "fault_spec": spec.model_dump_json()})
        return _chain(build_model(settings, session=None))

    wrapped = built(FaultSpec(model_wrapper="bench.legacy_layout:old_layout"))
    assert wrapped.index("PerAnalystLayout") < wrapped.index("FaultInjectingModel")  # the double sees the old requests
    assert "PerAnalystLayout" not in built(FaultSpec())
