"""The soak's documents: CUAD contracts (../shared/data/cuad, when present) and seeded variants of
them and of our samples/: cut to a window of clauses, shuffled by clause, concatenated. Every text is
distinct (a job is keyed by its text's hash). Also one large document (1.2 MB) made of whole
contracts one after another."""

from __future__ import annotations

import random
from collections.abc import Callable

from contract_review.review.chunking import document_hash

from ..conftest import SAMPLES_DIR, cuad_texts
from ..large_docs import large_contract

LARGE_BYTES = 1_200_000


def _clauses(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def _cut(rng: random.Random, clauses: list[str], max_chars: int) -> str:
    """A window of consecutive clauses, up to max_chars (at least one clause)."""
    start = rng.randrange(len(clauses))
    out: list[str] = []
    size = 0
    for c in clauses[start:]:
        if out and size + len(c) > max_chars:
            break
        out.append(c)
        size += len(c) + 2
    return "\n\n".join(out)


def _shuffled(rng: random.Random, clauses: list[str], max_chars: int) -> str:
    picked = list(clauses)
    rng.shuffle(picked)
    return _cut(random.Random(rng.random()), picked, max_chars)


def sources() -> tuple[list[tuple[str, str]], bool]:
    """(name, text) of the source contracts, and whether CUAD is among them."""
    samples = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(SAMPLES_DIR.glob("*.txt"))]
    cuad = cuad_texts()
    return cuad + samples, bool(cuad)


def soak_documents(n: int, seed: int = 8, max_chars: int = 16_000) -> list[tuple[str, str]]:
    """`n` distinct (name, text): the small sources whole, then seeded variants (cut, shuffled by
    clause, two concatenated) of at most `max_chars`, so most documents are 1 to 4 chunks."""
    rng = random.Random(seed)
    srcs, _ = sources()
    by_clause = [(name, _clauses(text)) for name, text in srcs]
    docs: list[tuple[str, str]] = [(name, text) for name, text in srcs if len(text) <= max_chars]
    seen = {document_hash(t) for _, t in docs}
    makers: list[tuple[str, Callable[[], str]]] = []
    for name, clauses in by_clause:
        makers.append((f"cut:{name}", lambda c=clauses: _cut(rng, c, rng.randrange(1_500, max_chars))))
        makers.append((f"shuffled:{name}", lambda c=clauses: _shuffled(rng, c, rng.randrange(3_000, max_chars))))

    def concatenated() -> str:
        (_, a), (_, b) = rng.sample(by_clause, 2)
        return _cut(rng, a, max_chars // 2) + "\n\n" + _cut(rng, b, max_chars // 2)

    makers += [("concat", concatenated)] * (len(makers) // 6)  # about one document in seven
    attempts = 0
    while len(docs) < n:
        attempts += 1
        assert attempts < 50 * n, "could not make enough distinct documents"
        label, make = rng.choice(makers)
        text = make()
        if not text.strip() or document_hash(text) in seen:
            continue
        seen.add(document_hash(text))
        docs.append((f"{label}-{len(docs)}", text))
    return docs[:n]


def large_document(n_bytes: int = LARGE_BYTES) -> str:
    """A contract of about `n_bytes` (UTF-8): whole contracts one after another under part headings
    (`tests/large_docs.py`, shared with the large-document tests and benchmarks)."""
    return large_contract(n_bytes, variant=8)
