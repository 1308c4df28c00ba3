"""Clause-aware chunking with deterministic chunk ids.

Boundaries fall, in order of preference, at section headings and blank lines, then at sentence
ends, then (only for pathological text without either) at a hard character limit. Every chunk
is an exact slice `text[start:end]` of the document, so offsets found inside a chunk map back
to the document by adding `start`.

Size in bytes: a chunk is at most `max_chars` characters, and JSON escapes a character to at most
6 bytes (a control character as `\\u001f`; non-ASCII is sent raw, at most 4 UTF-8 bytes), so an
analysis message carrying a chunk is at most `6 * max_chars` bytes plus its fixed fields. The
profile rule (`config.Profile`) keeps that under SQS's message limit, so no chunk can make a message
SQS refuses; the queue adapter splits batches by their size in bytes.

Linear in the document: a 5 MB document, even one paragraph of sentences, splits in well under a second.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass

from contract_review.config.profile import ReviewConfig

_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(\"'0-9])")


@dataclass(frozen=True)
class Chunk:
    index: int
    chunk_id: str
    start: int
    end: int
    text: str


def document_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _pieces(text: str, lo: int, hi: int, max_chars: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into spans of at most max_chars, preferring sentence ends."""
    if hi - lo <= max_chars:
        return [(lo, hi)]
    cuts = [m.start() for m in _SENTENCE_END.finditer(text, lo, hi)]  # ascending
    spans: list[tuple[int, int]] = []
    start = lo
    while hi - start > max_chars:
        limit = start + max_chars
        last = bisect.bisect_right(cuts, limit) - 1  # the last sentence end within (start, limit]
        cut = cuts[last] if last >= 0 and cuts[last] > start else limit
        spans.append((start, cut))
        start = cut
    spans.append((start, hi))
    return spans


def chunk_id_for(doc_hash: str, index: int, start: int, end: int) -> str:
    """A chunk's id: its index, and a hash binding the document (`document_hash`) and its offsets."""
    cid = hashlib.sha256(f"{doc_hash[:16]}:{start}:{end}".encode()).hexdigest()[:12]
    return f"c{index:05d}-{cid}"


def split_into_chunks(text: str, target_chars: int = 4000, max_chars: int = 6000, min_chars: int = 0) -> list[Chunk]:
    """Paragraphs (cut at sentence ends when longer than `max_chars`) packed up to `target_chars`; a chunk still
    under `min_chars` takes the next paragraphs too, up to `max_chars` (a document's last chunk may stay under)."""
    if target_chars <= 0 or max_chars < target_chars or not 0 <= min_chars <= target_chars:
        raise ValueError("need 0 <= min_chars <= target_chars <= max_chars and 0 < target_chars")
    # 1. paragraph spans (each paragraph keeps its trailing separator so slices tile the text)
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _PARAGRAPH.finditer(text):
        spans.extend(_pieces(text, pos, m.end(), max_chars))
        pos = m.end()
    if pos < len(text):
        spans.extend(_pieces(text, pos, len(text), max_chars))
    # 2. pack consecutive spans up to the target size
    packed: list[tuple[int, int]] = []
    for s, e in spans:
        if packed and (e - packed[-1][0] <= target_chars
                       or (packed[-1][1] - packed[-1][0] < min_chars and e - packed[-1][0] <= max_chars)):
            packed[-1] = (packed[-1][0], e)
        else:
            packed.append((s, e))
    doc = document_hash(text)
    chunks = []
    for i, (s, e) in enumerate(p for p in packed if text[p[0]:p[1]].strip()):
        chunks.append(Chunk(index=i, chunk_id=chunk_id_for(doc, i, s, e), start=s, end=e, text=text[s:e]))
    return chunks


def chunk_document(text: str, review: ReviewConfig) -> list[Chunk]:
    """The document's chunks under a profile's sizes: what intake stores, and what tests and the bench expect."""
    return split_into_chunks(text, review.chunk_target_chars, review.chunk_max_chars, review.chunk_min_chars)
