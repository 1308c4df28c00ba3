"""The fault-free oracle (tests/oracle.py) that every recovery test asserts with: it passes on a clean
run through the real worker and aggregator cores, and it catches a lost finding, a doubled chunk, a
chunk settled twice and a job of another text."""

from __future__ import annotations

import json
import random

import pytest

from contract_review.domain.chunk_records import ChunkRecord
from contract_review.domain.messages import AnalysisMessage, ResultMessage
from contract_review.domain.ports import Queue
from contract_review.doubles.offline_model import OfflineRuleModel
from contract_review.pipeline.aggregator import handle_result
from contract_review.pipeline.intake import handle_intake
from contract_review.pipeline.worker import Delivery
from contract_review.review.analysts import ChunkFindings, Finding
from contract_review.wiring import chunk_worker

from ...oracle import assert_matches_fault_free, check_job, expected_findings
from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..scenarios import small_chunk_world


def _work_all(world: FakeWorld, text: str) -> str:
    """Intake `text` and run every chunk through the real worker (offline model); results not yet handled."""
    result = handle_intake(world.deps, json.dumps({"schema_version": 1, "document": {"text": text}}), "m-1")
    assert result.job_id is not None
    worker = chunk_worker(world.deps, OfflineRuleModel(), rng=random.Random(1), sleep=lambda s: None)
    for sent in world.queues.drain(Queue.ANALYSIS):
        msg = AnalysisMessage.model_validate_json(sent.body)
        assert worker.handle(msg, Delivery(sent.message_id, "", 1, 60)).action == "done"
    return result.job_id


def _aggregate(world: FakeWorld) -> list[str]:
    return [handle_result(world.deps, ResultMessage.model_validate_json(s.body))
            for s in world.queues.drain(Queue.RESULTS)]


def _stored(world: FakeWorld, record: ChunkRecord) -> list[Finding]:
    assert record.findings_key is not None
    return ChunkFindings.model_validate_json(world.artifacts.get_text(record.findings_key)).findings


def _rewrite_findings(world: FakeWorld, job_id: str, chunk_index: int, edit) -> None:
    record = world.claims.for_job(job_id)[chunk_index]
    assert record.findings_key is not None
    stored = ChunkFindings(chunk_id=record.chunk_id, chunk_index=record.chunk_index,
                           findings=edit(_stored(world, record)))
    world.artifacts.put_text(record.findings_key, stored.model_dump_json())


def test_a_clean_run_matches_the_oracle_finding_for_finding():
    # GIVEN a four-chunk job run without faults through the real cores
    world = small_chunk_world()
    job_id = _work_all(world, TEXT)
    # WHEN its results are aggregated
    assert _aggregate(world)[-1] == "completed"
    # THEN the report equals the in-process fault-free run
    check = assert_matches_fault_free(world.deps, job_id, TEXT)
    assert (check.chunks, check.findings) == (4, len(expected_findings(TEXT, world.settings.profile)))
    assert check.findings > 0


@pytest.mark.parametrize("edit,kind", [
    (lambda fs: fs[1:], "missing_findings"),
    (lambda fs: fs + fs, "duplicate_findings"),
    (lambda fs: list(reversed(fs)), "order_errors"),
])
def test_a_chunks_findings_changed_after_the_worker_wrote_them_are_caught(edit, kind):
    # GIVEN a job whose richest chunk's findings (>= 2 of them) were changed behind the worker's back
    world = FakeWorld()
    job_id = _work_all(world, LONG_TEXT)
    richest = max(world.claims.for_job(job_id), key=lambda c: c.n_findings)
    assert richest.n_findings >= 2
    _rewrite_findings(world, job_id, richest.chunk_index, edit)
    assert _aggregate(world)[-1] == "completed"
    # WHEN it is checked THEN the difference is named, and the counts no longer agree
    check = check_job(world.deps, job_id, LONG_TEXT)
    assert getattr(check, kind)
    if kind != "order_errors":
        assert check.count_errors
    with pytest.raises(AssertionError):
        assert_matches_fault_free(world.deps, job_id, LONG_TEXT)


def test_a_chunk_settled_twice_is_caught():
    # GIVEN the log says one chunk was settled twice before the job completed
    world = small_chunk_world()
    job_id = _work_all(world, TEXT)
    results = [ResultMessage.model_validate_json(s.body) for s in world.queues.drain(Queue.RESULTS)]
    first = results[0]
    world.jobs.record_event(job_id, "chunk.settled", chunk_id=first.chunk_id, chunk_index=first.chunk_index,
                            status=first.status.value)
    for msg in results:
        handle_result(world.deps, msg)
    # WHEN it is checked THEN the double settling is named (the findings themselves are right)
    check = check_job(world.deps, job_id, TEXT)
    assert check.settle_errors and not check.duplicate_findings and not check.missing_findings


def test_a_job_checked_against_another_text_is_caught():
    world = small_chunk_world()
    job_id = _work_all(world, TEXT)
    _aggregate(world)
    check = check_job(world.deps, job_id, LONG_TEXT)
    assert check.mixing_errors and check.problems
