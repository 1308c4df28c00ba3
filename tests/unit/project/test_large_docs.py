"""The large-contract builder the integration tests, the soak and bench/large.py share (tests/large_docs.py)."""

from __future__ import annotations

import pytest

from contract_review.domain.messages import MAX_DOCUMENT_BYTES
from contract_review.review.chunking import document_hash, split_into_chunks

from ...large_docs import large_contract, write_large_contract


@pytest.mark.parametrize("n_bytes", [5_000, 230_000, 1_200_000, MAX_DOCUMENT_BYTES])
def test_a_large_contract_is_at_most_its_size_and_close_to_it(n_bytes: int):
    text = large_contract(n_bytes)
    size = len(text.encode("utf-8"))
    assert size <= n_bytes
    assert n_bytes < 100_000 or size > n_bytes * 0.95  # cut at a paragraph end
    assert text.endswith("\n") and "PART 0-1." in text


def test_the_same_arguments_give_the_same_text_and_variants_differ():
    a, b, other = large_contract(50_000, 3), large_contract(50_000, 3), large_contract(50_000, 4)
    assert a == b
    assert document_hash(a) != document_hash(other)
    assert abs(len(split_into_chunks(a)) - len(split_into_chunks(other))) <= 1


def test_samples_only_and_written_to_a_file(tmp_path):
    text = large_contract(20_000, samples_only=True)
    path = write_large_contract(tmp_path / "big.txt", 20_000, samples_only=True)
    assert path.read_text(encoding="utf-8") == text
