"""The docs stay true to the code and to themselves: the job-state page is the one rendered from
`lifecycle.TRANSITIONS`, every relative link in README.md, docs/ and bench/README.md resolves (to a file, and to a
heading when it names one), and every file docs/extending.md's "where to change what" table names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract_review.domain.lifecycle import TRANSITIONS, WHY, render_markdown
from contract_review.domain.records import JobState

ROOT = Path(__file__).resolve().parents[3]
STATES_DOC = ROOT / "docs" / "job-states.md"
REGENERATE = "make docs"
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])


# --- the job states, written once ------------------------------------------------------------------

def test_job_states_doc_is_generated_from_the_transition_table():
    # GIVEN the committed docs/job-states.md  THEN it is what TRANSITIONS renders now (never edited by hand)
    assert STATES_DOC.exists(), f"docs/job-states.md is missing; regenerate with: {REGENERATE}"
    assert STATES_DOC.read_text(encoding="utf-8") == render_markdown(), (
        f"docs/job-states.md is stale; regenerate with: {REGENERATE}")


def test_the_models_page_is_generated_from_the_catalogue():
    from contract_review.config import catalogue

    page = ROOT / "docs" / "models.md"
    assert page.exists() and page.read_text(encoding="utf-8") == catalogue.render_markdown(), (
        f"docs/models.md is stale; regenerate with: {REGENERATE}")


def test_every_legal_move_has_its_reason_and_every_state_appears():
    moves = {(frm, to) for frm, tos in TRANSITIONS.items() for to in tos}
    assert set(WHY) == moves
    doc = render_markdown()
    for state in JobState:
        assert f"`{state.value}`" in doc


# --- links ------------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    slugs: set[str] = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = 1
        base = slug
        while slug in slugs:
            slug, n = f"{base}-{n}", n + 1
        slugs.add(slug)
    return slugs


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto: ...: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_sees_links():
    # the check above would pass vacuously if the pattern matched nothing
    assert sum(len(links(p)) for p in PAGES) > 50


# --- docs/extending.md's "where to change what" ------------------------------------------------------

def where_to_change_what() -> list[str]:
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    section = text[text.index("## Where to change what"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| to add")]
    return [p for row in rows for p in re.findall(r"`([\w./-]+/[\w./-]*)`", row)]


def test_every_file_the_where_to_change_what_table_names_exists():
    paths = where_to_change_what()
    assert len(paths) >= 20  # every row names its files
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"


def test_the_where_to_change_what_table_has_a_row_for_each_kind_of_change():
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    for kind in ("an analyst category", "a ticket system", "an error code", "a job state", "a model",
                 "a CLI command", "an alarm"):
        assert f"\n| {kind} |" in text, kind


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_labels_its_text_with_an_issue_number(page: Path):
    # a reader cannot open "issue 17"; the docs say what changed, the commit history says when
    text = page.read_text(encoding="utf-8")
    assert not re.findall(r"(?i)\bissues? ?\d+|\(#\d+\)|\bissue\d+", text)


def test_no_source_file_labels_its_code_with_an_issue_number():
    sources = [p for top in ("functions", "review_local", "infra", "tests", "bench") for p in (ROOT / top).rglob("*.py")
               if p != Path(__file__).resolve()]
    labelled = [f"{p.relative_to(ROOT)}:{n}" for p in sources
                for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                if re.search(r"(?i)\bissues? ?\d+|\(#\d+\)|\bissue\d+", line)]
    assert not labelled, labelled
