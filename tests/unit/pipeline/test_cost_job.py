"""Cost per job (cost.py) through the pipeline: an attempt's usage on its record write, a job's usage counted
once per chunk in the update that settles it, and the report's cost."""

from __future__ import annotations

import json
from decimal import Decimal

from contract_review.config.prices import PRICES
from contract_review.domain import cost
from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.messages import ResultMessage
from contract_review.domain.records import AttemptStats, ChunkStatus, Job, JobState, Usage, job_id_for
from contract_review.doubles.bedrock_sim import SimulatedPromptCache
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.worker import attempt_stats
from contract_review.reliability.retry import RetryStats

from ...texts import TEXT
from ..fakes import SETTINGS, FakeWorld
from ..inprocess import FaultyModel, InProcess
from ..scenarios import small_chunk_world


def test_an_attempts_usage_adds_its_requests_the_recording_write_and_its_lambda_time():
    # GIVEN an attempt that made 3 DynamoDB writes and an SQS send, ran 2 s in a 1,024 MB Lambda, used tokens
    counter = cost.RequestCounter()
    for c in (cost.DYNAMODB_WRITE,) * 3 + (cost.SQS_STANDARD,):
        counter.add(c)
    clock = iter([0.0, 2.0])
    meter = cost.AttemptMeter(PRICES, cost.model_price(PRICES, "offline-rules-v1"), counter, lambda_memory_mb=1024,
                              started=next(clock), clock=lambda: next(clock))
    stats = RetryStats(calls=2, meter=meter)
    stats.add_tokens(1000, 100)
    stats.add_tokens(0, 0, cache_read_tokens=500, cache_write_tokens=0)
    # WHEN it becomes the stats its record write carries
    a = attempt_stats(stats)
    # THEN: 4 writes (3 + the recording one), 1 SQS request, 1 Lambda request; 2 GB-s
    assert (a.calls, a.input_tokens, a.output_tokens, a.cache_read_tokens, a.aws_requests) == (2, 1000, 100, 500, 6)
    assert a.model_micro_usd == cost.micro_usd(Decimal("0.003") + Decimal("0.0015") + Decimal("0.00015"))
    assert a.aws_micro_usd == cost.micro_usd(4 * Decimal("0.625") / 10**6 + Decimal("0.40") / 10**6
                                             + Decimal("0.20") / 10**6 + 2 * Decimal("0.0000133334"))


# --- a job's usage --------------------------------------------------------------------------------------------

def _run_job(world: FakeWorld, model: FaultyModel | None = None, **fields: object) -> str:
    p = InProcess(world, model)
    p.send({"text": TEXT}, key="cost-doc", **fields)
    p.run(job_id_for("cost-doc"))
    return job_id_for("cost-doc")


def test_a_jobs_cost_is_the_sum_of_its_chunks_plus_the_aggregators_requests_and_is_in_the_report():
    world = small_chunk_world()
    # a cache minimum the analysts' prefixes reach (by default they do not: Bedrock's is 2,048 tokens), so the
    # sum covers cache reads and writes too
    job_id = _run_job(world, FaultyModel(inner=OfflineRuleModel(SimulatedPromptCache(min_tokens=1))))
    job = world.jobs.get(job_id)
    chunks = world.claims.for_job(job_id)
    assert job is not None and job.state.value == "completed" and len(chunks) >= 2
    total = Usage.of(c.usage() for c in chunks)
    # every model token of every chunk, priced; each chunk's attempts plus the aggregator's write per result
    assert total.input_tokens > 0 and total.cache_read_tokens > 0 and total.cache_write_tokens > 0
    assert (job.input_tokens, job.output_tokens, job.cache_read_tokens, job.model_micro_usd) == (
        total.input_tokens, total.output_tokens, total.cache_read_tokens, total.model_micro_usd)
    assert job.aws_requests > total.aws_requests > 0
    c = json.loads(world.artifacts.get_text(job.report_json_key or ""))["cost"]
    assert Decimal(c["total_usd"]) == cost.usd(job.total_micro_usd) > 0
    assert c["prices_as_of"] == PRICES.as_of and c["priced_as"] == "anthropic.claude-sonnet-4-6"
    assert "## Estimated cost" in world.artifacts.get_text(job.report_md_key or "")  # the offline model


def test_a_result_delivered_twice_is_counted_once():
    world = small_chunk_world()
    job_id = _run_job(world)
    job = world.jobs.get(job_id)
    assert job is not None
    chunk = world.claims.for_job(job_id)[0]
    before = job.usage()
    # WHEN the job is running again (as if) and the first chunk's result arrives a second time
    world.jobs.items[job_id] = job.model_copy(update={"state": JobState.RUNNING})
    msg = ResultMessage(job_id=job_id, chunk_id=chunk.chunk_id, chunk_index=0, status=ChunkStatus.DONE)
    handle_result(world.deps, msg)
    after = world.jobs.get(job_id)
    assert after is not None and after.usage() == before


def test_settle_adds_usage_only_when_the_chunk_enters_the_settled_set():
    world = FakeWorld(settings=SETTINGS)
    world.jobs.create(Job(job_id="j", state=JobState.RUNNING, created_at=0, updated_at=0, idempotency_key="k"))
    world.claims.create(ChunkRecord(job_id="j", chunk_id="c1", chunk_index=0, start=0, end=1))
    u = Usage(input_tokens=10, model_micro_usd=30, aws_requests=2, aws_micro_usd=1)
    world.jobs.settle_chunk("j", "c1", usage=u)
    job = world.jobs.settle_chunk("j", "c1", usage=u)
    assert job.usage() == u and job.settled_count == 1 and world.claims.get("j", "c1").counted  # type: ignore[union-attr]
    job2 = world.jobs.unsettle_chunks("j", {"c1": u})
    assert job2 is not None and job2.usage() == Usage() and job2.settled_count == 0
    assert not world.claims.get("j", "c1").counted  # type: ignore[union-attr]


def test_attempt_stats_without_a_meter_carry_the_tokens_unpriced():
    stats = RetryStats()
    stats.add_tokens(5, 6, 7, 8)
    assert attempt_stats(stats) == AttemptStats(input_tokens=5, output_tokens=6, cache_read_tokens=7,
                                                cache_write_tokens=8)


def test_a_reopened_job_counts_each_chunk_once_with_all_its_attempts():
    # GIVEN a job whose chunk 1 failed for good (a permanent model error), its cost recorded
    from contract_review.pipeline import redrive

    from ..inprocess import Fault, FaultyModel, on
    from ..reliability.test_recoveries import client_error, raises

    world = small_chunk_world()
    model = FaultyModel()
    p = InProcess(world, model)
    p.send({"text": TEXT}, key="cost-doc")
    p.intake()
    job_id = job_id_for("cost-doc")
    ids = [c.chunk_id for c in world.claims.for_job(job_id)]
    model.faults.append(Fault(on(ids[1]), raises(client_error("ValidationException", 400))))
    first = p.run(job_id)
    assert first.state is JobState.FAILED and first.total_micro_usd > 0
    # WHEN the cause is fixed and the job retried to completion
    model.faults.clear()
    assert redrive.retry(world.deps, job_id).retried
    job = p.run(job_id)
    # THEN its model cost is every chunk's, each counted once, the failed chunk's earlier attempt included
    chunks = world.claims.for_job(job_id)
    assert job.state is JobState.COMPLETED
    assert (job.input_tokens, job.model_micro_usd) == (sum(c.input_tokens for c in chunks),
                                                       sum(c.model_micro_usd for c in chunks))
    rerun = world.claims.get(job_id, ids[1])
    assert rerun is not None and rerun.n_calls > 1  # it ran twice
