"""The batch lane on embedded AWS (pipeline/batch_inference.py): real worker processes, the batch collector on its own schedule
(its own function, as on AWS: handlers/collector.py; the sweeper recovers only), and Bedrock batch inference's HTTP
stand-in (review_local/batch_service.py) reading and writing the moto S3. A job sent
with `inference: batch` ends with the report of a fault-free on-demand run (tests/oracle.py), at the batch price,
with no on-demand model call; a partially completed batch job and failing batch jobs lose nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from contract_review.domain.cost import batch_cost_usd, micro_usd, model_price
from contract_review.domain.records import ChunkStatus, Inference, Job, JobState, Usage
from contract_review.operate import submission
from contract_review.operate.submission import SubmitRequest
from review_local.batch_service import BatchFaults
from review_local.stack import LocalStack
from tests.oracle import check_job

from .conftest import wait_jobs

TEXT = (Path(__file__).resolve().parents[2] / "samples" / "mutual-nda.txt").read_text(encoding="utf-8")


def _types(stack: LocalStack, job_id: str) -> list[str]:
    return [e.type for e in stack.deps().jobs.events(job_id)]


def _ends_as_fault_free(stack: LocalStack, job_id: str, timeout: float = 120) -> Job:
    deps = stack.deps()
    job = wait_jobs(deps, [job_id], timeout=timeout)[job_id]
    assert job.state is JobState.COMPLETED, (job.state, job.error_code)
    assert check_job(deps, job_id, TEXT).problems == []  # the on-demand fault-free report, every chunk once
    records = deps.claims.for_job(job_id)
    assert all(c.status is ChunkStatus.DONE and c.counted for c in records)
    return job


def _collector_runs(stack: LocalStack) -> list[dict[str, object]]:
    """The collector function's own log lines, one per run (handlers/collector.py logs "collect")."""
    assert stack.runtime is not None
    lines = (stack.runtime.log_dir / "collector-0.log").read_text(encoding="utf-8").splitlines()
    return [d for d in (json.loads(line) for line in lines if line.startswith("{")) if d.get("message") == "collect"]


def test_a_batch_mode_job_ends_with_the_fault_free_report_at_the_batch_price(
        make_stack: Callable[..., LocalStack]) -> None:
    stack = make_stack()
    deps = stack.deps()
    # GIVEN the collector and the sweeper each as its own scheduled function, one sandbox each; only the collector is
    # told the batch service role (the sweeper could not submit a batch job if it tried)
    assert stack.runtime is not None
    scheduled = {b.spec.name: b.spec for b in stack.runtime.sandboxes if b.spec.schedule_s}
    assert sorted(b.spec.name for b in stack.runtime.sandboxes if b.spec.schedule_s) == ["collector", "sweeper"]
    assert "BATCH_ROLE_ARN" in scheduled["collector"].env and "BATCH_ROLE_ARN" not in scheduled["sweeper"].env
    # GIVEN the same contract sent on demand and in batch
    on_demand = submission.submit(deps, None, SubmitRequest.inline(TEXT, document_id="nda-on-demand", idempotency_key="nda-on-demand")).job_id
    batched = submission.submit(deps, None, SubmitRequest.inline(TEXT, document_id="nda-batch", idempotency_key="nda-batch", inference=Inference.BATCH)).job_id
    # WHEN both run THEN both end with the fault-free report
    od, b = _ends_as_fault_free(stack, on_demand), _ends_as_fault_free(stack, batched)
    assert b.inference is Inference.BATCH
    # AND the batch job's calls went through batch jobs of the stand-in, none on demand, priced at the batch price
    types = _types(stack, batched)
    assert "batch.submitted" in types and "batch.returned" in types and "batch.on_demand" not in types
    assert stack.batch_service is not None and stack.batch_service.jobs
    # AND the collector function submitted and collected them (its runs' own log: not the sweeper's)
    runs = _collector_runs(stack)
    assert any(r["submitted"] for r in runs) and any(r["collected"] for r in runs)
    assert not [r for r in runs if r["item_failures"]]
    assert (b.cache_read_tokens, b.cache_write_tokens) == (0, 0)  # a batch record reads no prompt cache
    s = deps.settings
    at_batch_price = batch_cost_usd(model_price(s.profile.prices, s.effective_model_id),
                                    Usage(input_tokens=b.input_tokens, output_tokens=b.output_tokens))
    assert at_batch_price is not None
    assert abs(b.model_micro_usd - micro_usd(at_batch_price)) <= b.chunk_count * 4  # rounding per chunk return
    # (cheaper than on demand, though on demand reads the chunk's prefix from the prompt cache: bench/batch.py)
    assert b.model_micro_usd < od.model_micro_usd


def test_a_partially_completed_batch_job_loses_nothing(make_stack: Callable[..., LocalStack]) -> None:
    # GIVEN a stand-in that answers a fifth of the records of each batch job with an error
    stack = make_stack(batch_faults=BatchFaults(fail_rate=0.2, seed=3))
    job_id = submission.submit(stack.deps(), None, SubmitRequest.inline(TEXT, document_id="nda", idempotency_key="nda", inference=Inference.BATCH)).job_id
    # WHEN it runs THEN the job ends with the fault-free report, every chunk done and counted once
    _ends_as_fault_free(stack, job_id, timeout=180)
    # AND the unanswered records were asked again (batch.record_failed)
    returned = [e.detail for e in stack.deps().jobs.events(job_id) if e.type == "batch.returned"]
    assert any(e.get("error_code") == "batch.record_failed" and e["unanswered"] for e in returned)


def test_failed_batch_jobs_send_their_chunks_back_then_on_demand(make_stack: Callable[..., LocalStack]) -> None:
    # GIVEN a stand-in whose every batch job fails while in progress
    stack = make_stack(batch_faults=BatchFaults(fail_job="in_progress"))
    job_id = submission.submit(stack.deps(), None, SubmitRequest.inline(TEXT, document_id="nda", idempotency_key="nda", inference=Inference.BATCH)).job_id
    # WHEN it runs THEN the job ends with the fault-free report, every chunk done and counted once
    _ends_as_fault_free(stack, job_id, timeout=180)
    # AND each failed batch job sent its chunks back to be batched again, then on demand after two failures
    failed = [e.detail for e in stack.deps().jobs.events(job_id) if e.type == "batch.returned"]
    assert failed and all(e.get("error_code") == "batch.job_failed" for e in failed)
    assert any(e.get("on_demand") == "failures" for e in failed)
