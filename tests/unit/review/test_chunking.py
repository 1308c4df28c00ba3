"""Clause-aware chunking: deterministic ids, exact slices, size bounds, natural boundaries."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract_review.review.chunking import Chunk, document_hash, split_into_chunks

_ID = re.compile(r"^c\d{5}-[0-9a-f]{12}$")


def _paragraph(i: int, sentences: int = 4) -> str:
    body = " ".join(f"Clause {i}.{j} says the Supplier shall deliver item {j} on time." for j in range(sentences))
    return f"{i}. HEADING {i}\n{body}"


def _document(paragraphs: int = 40) -> str:
    return "\n\n".join(_paragraph(i) for i in range(1, paragraphs + 1)) + "\n"


def _check_tiling(text: str, chunks: list[Chunk], max_chars: int) -> None:
    """Slices are exact, ordered, within bounds; what lies between them is whitespace only."""
    pos = 0
    for i, c in enumerate(chunks):
        assert c.index == i
        assert text[c.start:c.end] == c.text
        assert 0 < c.end - c.start <= max_chars
        assert c.start >= pos
        assert text[pos:c.start].strip() == ""
        assert c.text.strip()
        pos = c.end
    assert text[pos:].strip() == ""


def test_chunk_ids_are_deterministic() -> None:
    text = _document()
    a, b = split_into_chunks(text), split_into_chunks(text)
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert a == b
    assert all(_ID.match(c.chunk_id) for c in a)
    assert [int(c.chunk_id[1:6]) for c in a] == list(range(len(a)))
    assert len({c.chunk_id for c in a}) == len(a)


def test_chunk_ids_depend_on_the_document() -> None:
    text = _document()
    changed = text.replace("Clause 40.3", "Clause 40.4")
    ids, other = split_into_chunks(text), split_into_chunks(changed)
    assert document_hash(text) != document_hash(changed)
    # same offsets, different document: every id changes (ids bind content, not just position)
    assert not {c.chunk_id for c in ids} & {c.chunk_id for c in other}


def test_chunks_are_exact_slices_within_bounds() -> None:
    text = _document(120)
    chunks = split_into_chunks(text, target_chars=2000, max_chars=3000)
    assert len(chunks) > 5
    _check_tiling(text, chunks, 3000)
    # packing fills chunks up to the target: all but the last are reasonably full
    assert all(len(c.text) > 1000 for c in chunks[:-1])


def test_boundaries_fall_between_paragraphs() -> None:
    text = _document(60)
    chunks = split_into_chunks(text, target_chars=1500, max_chars=2500)
    assert len(chunks) > 3
    for c in chunks[:-1]:
        # each chunk carries its paragraph's trailing separator; the next starts a paragraph
        assert c.text.endswith("\n\n")
        assert re.match(r"\d+\. HEADING", text[c.end:])


def test_long_paragraph_is_cut_at_sentence_ends() -> None:
    sentences = [f"Sentence number {i} states that the Customer shall pay invoice {i} within thirty days."
                 for i in range(200)]
    text = " ".join(sentences)  # one paragraph, ~17 KB, no blank lines
    chunks = split_into_chunks(text, target_chars=1000, max_chars=1500)
    assert len(chunks) > 10
    _check_tiling(text, chunks, 1500)
    for c in chunks[:-1]:
        assert c.text.rstrip().endswith("days."), c.text[-40:]
    assert chunks[-1].text.endswith("days.")


def test_text_without_boundaries_is_cut_at_the_hard_limit() -> None:
    text = "x" * 10_000
    chunks = split_into_chunks(text, target_chars=1000, max_chars=1500)
    _check_tiling(text, chunks, 1500)
    assert "".join(c.text for c in chunks) == text


def test_small_and_empty_documents() -> None:
    assert split_into_chunks("") == []
    assert split_into_chunks("   \n\n  \n") == []
    one = split_into_chunks("Governing law: Delaware.")
    assert len(one) == 1 and one[0].start == 0 and one[0].text == "Governing law: Delaware."


@pytest.mark.parametrize("target,maximum", [(0, 10), (-5, 10), (100, 50)])
def test_invalid_sizes_are_rejected(target: int, maximum: int) -> None:
    with pytest.raises(ValueError):
        split_into_chunks("text", target_chars=target, max_chars=maximum)


_alphabet = st.sampled_from(list("abcdefghij ABCDEF.;:!?\n\n\t  0123()\"'"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet=_alphabet, max_size=3000),
       target=st.integers(min_value=1, max_value=400),
       extra=st.integers(min_value=0, max_value=400))
def test_chunks_cover_all_content_in_order(text: str, target: int, extra: int) -> None:
    maximum = target + extra
    chunks = split_into_chunks(text, target_chars=target, max_chars=maximum)
    _check_tiling(text, chunks, maximum)
    # the non-whitespace content of the chunks, in order, is exactly that of the document
    squash = re.compile(r"\s+")
    assert squash.sub("", "".join(c.text for c in chunks)) == squash.sub("", text)
    # deterministic
    assert [c.chunk_id for c in split_into_chunks(text, target_chars=target, max_chars=maximum)] == \
        [c.chunk_id for c in chunks]


def test_a_short_chunk_takes_the_next_paragraphs_until_its_minimum() -> None:
    text = _document(60)
    plain = split_into_chunks(text, target_chars=1000, max_chars=1500)
    floored = split_into_chunks(text, target_chars=1000, max_chars=1500, min_chars=900)
    _check_tiling(text, floored, 1500)
    assert any(len(c.text) < 900 for c in plain[:-1])  # the floor has work to do on this text
    assert all(len(c.text) >= 900 for c in floored[:-1])  # only the last chunk may stay under it
    assert len(floored) < len(plain)


def test_the_default_chunks_reach_the_models_cache_minimum_so_their_prefix_is_cached() -> None:
    """Every chunk but a document's last one is long enough for its calls' shared prefix (tool-use prompt, tool,
    instructions, excerpt) to reach the default model's minimum cacheable prefix, with a 5 % margin for the
    4-characters-a-token estimate: so the adapter sends the cache point and the warm-up gate waits for it."""
    from contract_review.config.profile import get_profile
    from contract_review.domain.model import caches, prefix_tokens, traits_for
    from contract_review.review.analysts import analysts_for, build_request
    from contract_review.review.chunking import chunk_document

    from ...large_docs import large_contract

    for name in ("prod", "local"):
        review = get_profile(name).review
        minimum = traits_for(review.model_id).min_cache_tokens
        chunks = chunk_document(large_contract(100_000), review)
        for chunk in chunks[:-1]:
            request = build_request(analysts_for(1)[0], "locate", chunk, None, None)
            assert prefix_tokens(review.model_id, request) >= 1.05 * minimum, (name, chunk.index, len(chunk.text))
            assert caches(review.model_id, request)
