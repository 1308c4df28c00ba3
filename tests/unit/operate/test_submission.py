"""The one submit (`operate/submission.py`): the Job API, `review submit` and the status page reach the same function,
so the same submission meets the same rule (`Job.key_conflict`, which intake applies too) and gets the same answer."""

from __future__ import annotations

from click.testing import CliRunner

from contract_review.domain.ports import Queue
from contract_review.domain.records import job_id_for
from contract_review.operate import submission
from review_local.api_server import local_principal
from review_local.cli import Ctx, cli
from review_local.ui_server import UiServer

from ...texts import LONG_TEXT, TEXT
from ..fakes import FakeWorld
from ..inprocess import InProcess
from ..local.test_ui_server import request
from .test_api import call

ALICE = local_principal("alice")


def test_a_key_that_names_a_job_of_another_document_is_the_same_refusal_through_the_api_and_the_cli(tmp_path):
    # GIVEN key K taken by a job of one document, through the Job API (Alice's) and through `review submit`
    world = FakeWorld()
    assert call(world, "POST", "/jobs", {"document": {"text": LONG_TEXT}}, headers={"Idempotency-Key": "K"}).status \
        == 202
    first, other = tmp_path / "first.txt", tmp_path / "other.txt"
    first.write_text(LONG_TEXT, encoding="utf-8")
    other.write_text(TEXT, encoding="utf-8")
    assert CliRunner().invoke(cli, ["submit", "--idempotency-key", "K", str(first)], obj=Ctx(None, None, deps=world.deps)
                              ).exit_code == 0
    InProcess(world).intake()
    sent = len(world.queues.sent[Queue.INTAKE])
    # WHEN another document is sent under K, each way
    by_api = call(world, "POST", "/jobs", {"document": {"text": TEXT}}, headers={"Idempotency-Key": "K"})
    by_cli = CliRunner().invoke(cli, ["submit", "--idempotency-key", "K", str(other)], obj=Ctx(None, None, deps=world.deps))
    # THEN both refuse it with the one code, nothing is sent, and the rule is intake's (the job's own method)
    assert (by_api.status, by_api.code) == (409, "input.key_conflict")
    assert by_cli.exit_code == 1 and "input.key_conflict" in by_cli.output
    assert len(world.queues.sent[Queue.INTAKE]) == sent
    job = world.jobs.get(job_id_for("K"))
    assert job is not None and job.key_conflict(job.document_sha256, same_sender=True) is None
    assert job.key_conflict("another sha", same_sender=True) == "another document"


def test_the_status_page_submits_through_the_one_submit_as_the_api_and_the_cli_do():
    # GIVEN a document Alice posted to the Job API, and one the operator sent with `review submit`
    world = FakeWorld()
    posted = call(world, "POST", "/jobs", {"document": {"text": LONG_TEXT}})
    assert posted.status == 202
    sent = len(world.queues.sent[Queue.INTAKE])
    # WHEN the page, as Alice, submits the same document: the API's job (her scoped key), a replay of the pending one
    with UiServer(world.deps, principal=ALICE) as as_alice:
        again = request(as_alice, "POST", "/api/submit", {"text": LONG_TEXT})[1]
    assert again == {"jobId": posted.json["jobId"]}
    # AND as the operator: the job id `review submit` computes for that text
    with UiServer(world.deps) as operator:
        mine = request(operator, "POST", "/api/submit", {"text": TEXT})[1]
    assert mine == {"jobId": submission.job_id_of(TEXT)}
    assert len(world.queues.sent[Queue.INTAKE]) == sent + 2  # Alice's pending job is sent again (intake takes it once)
