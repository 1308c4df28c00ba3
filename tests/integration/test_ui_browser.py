"""The status page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver` from apt, driven
by selenium; nothing is downloaded at run time) against the local stack as `review up` runs it (embedded AWS,
worker processes, the ticket system's fake, the page's server). A contract is submitted from the page, its chunk x
analyst grid fills, a finding is read, a job waiting for approval is approved and another is cancelled, each from
the page's buttons. A screenshot of every step is written to the directory the test prints (pytest shows it on a
failure). `make test` installs chromium where apt-get works; without it this test skips with one line."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract_review.domain.principals import Caller
from contract_review.domain.records import JobState, Priority
from contract_review.doubles.spec import FaultSpec
from contract_review.operate import actions, dead_letters, job_view, submission
from contract_review.operate.submission import SubmitRequest
from review_local.api_server import local_principal
from review_local.ticket_service import TicketFaults
from review_local.ui_server import UiServer

from ..large_docs import large_contract
from ..texts import LONG_TEXT, TEXT
from .conftest import wait_for, wait_jobs
from .test_side_effects import waiting_for_approval

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CALL_MS = 250  # each model call's latency: the grid fills over seconds, and a large job is still running to cancel
STEP_S = 45.0


def _browser_or_skip() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"no {' or '.join(missing)}: `apt-get install -y chromium chromium-driver` (make test does it "
                    "where apt-get works)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1100",
                "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = tmp_path / "screenshots"
    d.mkdir()
    print(f"screenshots of the status page: {d}")
    return d


@pytest.fixture
def browser(shots: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager never fetches a browser or a driver
    driver = _browser_or_skip()
    try:
        yield driver
    finally:
        driver.save_screenshot(str(shots / "last.png"))
        driver.quit()


# the `stack` fixture as `review up` runs it: the ticket fake, whose held answer outlasts the functions' read timeout,
# and the page
pytestmark = pytest.mark.stack(ticket_faults=TicketFaults(hang_s=4.0), faults=FaultSpec(latency_ms=CALL_MS))


class Page:
    def __init__(self, driver: Any, shots: Path):
        from selenium.webdriver.common.by import By

        self.d, self.shots, self.by, self.n = driver, shots, By, 0

    def shot(self, name: str) -> None:
        self.n += 1
        self.d.save_screenshot(str(self.shots / f"{self.n:02d}-{name}.png"))

    def find(self, css: str) -> Any:
        return self.d.find_element(self.by.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        return list(self.d.find_elements(self.by.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def until(self, what: str, predicate: Callable[[], Any], timeout: float = STEP_S) -> Any:
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
            TimeoutException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        def check(_: Any) -> Any:
            try:
                return predicate()
            except (StaleElementReferenceException, NoSuchElementException):  # not (or no longer) drawn: look again
                return False

        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.1).until(check)
        except TimeoutException as exc:
            self.shot("timeout")
            raise AssertionError(f"the page did not show {what} within {timeout:.0f} s (screenshots: {self.shots})") \
                from exc

    def open_job(self, job_id: str) -> None:
        search = self.find("#search")
        search.clear()
        search.send_keys(job_id)
        # the list is redrawn every 2 s: a row found just before may be gone when clicked, so click until it takes
        self.until(f"{job_id} in the jobs list, clicked", lambda: self.find(f'tr[data-job="{job_id}"]').click() or True)
        self.until(f"{job_id}'s panel", lambda: self.text("#job-id") == job_id)

    def cells(self) -> list[str]:
        """The grid's cells as the page shows them now (read in one script: the grid is redrawn on every update)."""
        return list(self.d.execute_script(
            "return [...document.querySelectorAll('#grid td.cell')].map((c) => c.dataset.state)"))


def test_the_status_page_submits_shows_the_grid_filling_and_approves_and_cancels(stack, browser, shots):
    assert stack.ui is not None and stack.tickets is not None
    deps = stack.deps()
    page = Page(browser, shots)
    browser.get(stack.ui.url)
    page.until("the operator view", lambda: "operator view" in page.text("#mode"))

    # --- a contract submitted from the page; its grid fills live; a finding is read
    browser.execute_script("document.getElementById('submit-text').value = arguments[0]", LONG_TEXT)
    page.find("#submit-doc").send_keys("msa-from-the-page")
    page.find("#submit-btn").click()
    job_id = page.until("the submitted job's id", lambda: page.find("#submit-msg").get_attribute("data-job"))
    page.open_job(job_id)
    def filled() -> bool:
        cells = page.cells()
        return bool(cells) and all(c == "ok" for c in cells) and page.text("#job-status") == "completed"

    page.until("every chunk x analyst cell ok and the job completed", filled)
    page.shot("completed")
    job = deps.jobs.get(job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.document_id == "msa-from-the-page"
    assert len(page.cells()) == job.chunk_count * job.analyst_count > 11
    findings = page.all("#findings .finding")
    assert len(findings) == job.n_findings and int(page.text("#findings-count")) == job.n_findings > 0
    report = json.loads(deps.artifacts.get_text(str(job.report_json_key)))["findings"]
    first = findings[0].text  # a finding as the page shows it: score, category title, chunk, analyst, quote, rationale
    top = max(f["score"] for f in report)  # highest risk first, named by its category's title
    assert any(f["score"] == top and actions.category_title(f["category"]) in first and f["quote"][:60] in first
               and f["rationale"] in first for f in report), first
    # one progress number: the pane's line is `review status`'s; the report is one click away, served by the page
    view = job_view.job_view(deps, job_id)
    assert view is not None and page.text("#job-label").startswith(f"progress: {job_view.chunk_counts(view)}")
    md = page.find("#report-md").get_attribute("href")
    with urllib.request.urlopen(md, timeout=10) as r:
        assert r.read().decode() == deps.artifacts.get_text(str(job.report_md_key))
    assert page.all('#timeline li[data-type="job.completed"]')
    page.until("the job's cost as `review status` prints it",
               lambda: page.text("#cost-line") == job_view.job_view(deps, job_id).cost)  # type: ignore[union-attr]
    # the chart of model activity: its call bars add up to the model calls the job's chunk records counted (the only
    # job so far), drawn as the chunks settled
    calls = sum(c.n_calls for c in deps.claims.for_job(job_id))
    charted = "return [...document.querySelectorAll('#activity rect[data-series=calls]')]" \
              ".reduce((n, r) => n + Number(r.dataset.value), 0)"
    page.until(f"{calls} model calls in the activity chart", lambda: browser.execute_script(charted) == calls > 0)
    assert f"{calls} model calls, 0 throttled" in page.text("#activity-summary")

    # --- a job waiting for approval: the page shows the step, evidence and expiry; Approve completes it
    _, waiting = waiting_for_approval(stack, stack.tickets, "risky-from-the-page")
    page.open_job(waiting)
    page.until("the approval panel", lambda: page.find("#approval").is_displayed())
    assert page.text("#approval-step") == "ticket.open" and page.text("#approval-expires")
    assert page.text("#approval-evidence").startswith("{")
    page.shot("waiting-approval")
    page.find("#approve-btn").click()
    page.until("the approved job completed", lambda: page.text("#job-status") == "completed")
    page.shot("approved")
    approved = wait_jobs(deps, [waiting], timeout=30)[waiting]
    assert approved.state is JobState.COMPLETED and approved.approval is not None
    assert (approved.approval.decision, approved.approval.decided_by) == ("approve", "ui")
    assert stack.tickets.stats()["opened"] == 1  # approved: the step retried with the same key, one ticket

    # --- another job cancelled from the page while its chunks run
    browser.execute_script("document.getElementById('submit-text').value = arguments[0]",
                           large_contract(200_000, variant=18))
    doc = page.find("#submit-doc")
    doc.clear()
    doc.send_keys("to-cancel-from-the-page")
    page.find("#submit-btn").click()  # the page shows the job it submitted at once
    running = page.until("the second job's id", lambda: (j := page.find("#submit-msg").get_attribute("data-job")) != job_id
                         and j)
    page.until(f"{running}'s panel", lambda: page.text("#job-id") == running)
    seen: list[int] = []  # done cells, as the grid showed them while it filled

    def filling() -> bool:
        cells = page.cells()
        done = sum(c in ("ok", "done") for c in cells)
        if not seen or done != seen[-1]:
            seen.append(done)
        return len(cells) > 11 and len([d for d in seen if 0 < d < len(cells)]) >= 2  # two partial grids seen

    page.until("its grid filling live", filling)
    page.shot("filling")
    page.find("#cancel-btn").click()
    page.until("the job cancelled", lambda: page.text("#job-status") == "cancelled")
    page.shot("cancelled")
    cancelled = deps.jobs.get(running)
    assert cancelled is not None and cancelled.state is JobState.CANCELLED and cancelled.cancelled_by == "ui"
    assert not all(c == "ok" for c in page.cells())  # stopped before every chunk was analysed
    assert os.listdir(shots)

    # --- a dead letter that can never be fixed (a message naming a document nobody uploaded), discarded from the page
    gone_key = "uploads/never-uploaded.txt"
    # (no idempotency key: intake has no job to record the failure on, so it dead-letters the message)
    deps.queues.send_intake(json.dumps({"schema_version": 1, "document": {"s3_uri": f"s3://{deps.settings.bucket}/"
                                                                                    f"{gone_key}"}}))
    row = page.until("the dead letter listed", lambda: page.find("#dlq tr[data-message]"))
    letter = row.get_attribute("data-message")
    entry = dead_letters.dlq_show(deps, letter)
    assert entry is not None and entry.queue == "intake"
    code, message = dead_letters.dlq_reason(entry)  # the row: its id, its time, its reason
    assert letter in row.text and f"{code}: {message}" in row.text
    row.find_element(page.by.CSS_SELECTOR, "button.show-body").click()
    page.until("the letter's body shown", lambda: gone_key in page.text("#dlq-body"))
    row.find_element(page.by.CSS_SELECTOR, "button.discard").click()
    browser.switch_to.alert.accept()  # asks first, as `review dlq discard` does
    page.until("the dead letter gone from the page", lambda: not page.all("#dlq tr[data-message]"))
    page.until("the discard's message", lambda: f"discarded {letter}" in page.text("#dlq-msg"))
    page.shot("discarded")
    assert dead_letters.dlq_show(deps, letter) is None and dead_letters.dlq_list(deps) == []
    assert entry.job_id is None  # no job to record the discard on (tests/unit/local/test_ui_server.py checks one that has)

    # --- acting as one API principal (`review ui --as local-user`): its jobs only, read from DynamoDB's list
    mine = submission.submit(deps, Caller(local_principal("local-user")),
                             SubmitRequest.inline(TEXT, priority=Priority.INTERACTIVE)).job_id
    wait_for(lambda: deps.jobs.get(mine) is not None, 30, what="intake took the principal's job")
    with UiServer(deps, principal=local_principal("local-user")) as as_user:
        with urllib.request.urlopen(as_user.url + "api/jobs", timeout=10) as r:
            assert [j["jobId"] for j in json.load(r)["jobs"]] == [mine]


def test_review_ui_against_a_stack_by_name_shows_every_job_and_acts_with_the_callers_credentials(aws, tmp_path):
    """`review ui --stack NAME`: the stack found through CloudFormation's outputs with the caller's own credentials
    (moto's account standing in for one), the page on loopback, an operator's view of every job."""
    import signal
    import socket
    import subprocess
    import sys

    from contract_review.pipeline.intake import handle_intake
    from review_local.connect import local_deps

    # GIVEN a stack holding a running job (taken in by intake; no worker runs here)
    deps = local_deps(aws.outputs, aws.region, aws.endpoint)
    body = json.dumps({"schema_version": 1, "document": {"text": TEXT}, "document_id": "by-name"})
    job_id = handle_intake(deps, body, "m-1").job_id
    assert job_id is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "REVIEW_LOCAL_JSON": str(tmp_path / "absent.json"), "AWS_ENDPOINT_URL": aws.endpoint,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    # WHEN an operator serves the page against it by name
    proc = subprocess.Popen([sys.executable, "-m", "review_local.cli", "--stack", aws.stack_name, "--region", aws.region,
                             "ui", "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        def listed() -> Any:
            try:
                with urllib.request.urlopen(base + "api/jobs", timeout=5) as r:
                    return json.load(r)
            except OSError:
                assert proc.poll() is None, proc.communicate()
                return None

        data = wait_for(listed, 60, 0.3, "the page's server")
        # THEN it lists the job as an operator sees it, with its grid, and cancels it with the caller's credentials
        assert data["mode"]["operator"] is True and [j["jobId"] for j in data["jobs"]] == [job_id]
        with urllib.request.urlopen(f"{base}api/jobs/{job_id}", timeout=10) as r:
            detail = json.load(r)
        assert detail["job"]["status"] == "running" and len(detail["grid"]["rows"]) == detail["job"]["progress"][
            "totalSteps"]
        cancel = urllib.request.Request(f"{base}api/jobs/{job_id}/cancel", method="POST", data=b"",
                                        headers={"X-Review-UI": "1"})
        with urllib.request.urlopen(cancel, timeout=10) as r:
            assert json.load(r)["status"] == "cancelling"
        assert deps.jobs.get(job_id).cancelled_by == "ui"  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"status page: {base}" in out and "stack ContractReview" in out
