"""Large contracts for tests, the soak and the benchmarks, built from real text.

`large_contract(n_bytes, variant)` joins the CUAD contracts (`../shared/data/cuad`, smallest first)
or, when they are absent, the project's own `samples/`, over and over, each copy under a numbered
part heading that names the variant, and cuts the result at a paragraph end at most `n_bytes` UTF-8
bytes long. The same arguments always give the same text; another variant gives another document
(another SHA-256, so another job id), with the same chunk count give or take one.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .conftest import SAMPLES_DIR, cuad_texts


@functools.cache
def _sources(samples_only: bool) -> tuple[str, ...]:
    cuad = [] if samples_only else [t for _, t in cuad_texts()]
    texts = cuad or [p.read_text(encoding="utf-8") for p in sorted(SAMPLES_DIR.glob("*.txt"))]
    return tuple(t.strip() for t in texts if t.strip())


def source_name(samples_only: bool = False) -> str:
    """Where the text comes from (for reports): "cuad" or "samples"."""
    return "cuad" if cuad_texts(limit=1) and not samples_only else "samples"


def large_contract(n_bytes: int, variant: int = 0, *, samples_only: bool = False) -> str:
    """A contract of at most `n_bytes` UTF-8 bytes (and more than `n_bytes` minus one source paragraph).
    `samples_only`: from samples/ even when the CUAD contracts are there (the same text everywhere)."""
    if n_bytes < 1000:
        raise ValueError("n_bytes must be at least 1000")
    parts: list[str] = []
    size = 0
    part = 0
    sources = _sources(samples_only)
    while size < n_bytes:
        source = sources[part % len(sources)]
        block = f"PART {variant}-{part + 1}. CONSOLIDATED SCHEDULE {part + 1} OF MASTER AGREEMENT {variant}\n\n{source}\n\n"
        parts.append(block)
        size += len(block.encode("utf-8"))
        part += 1
    text = "".join(parts)
    data = text.encode("utf-8")
    if len(data) <= n_bytes:
        return text
    cut = data.rfind(b"\n\n", 0, n_bytes - 1)  # a paragraph end, so the last chunk is a whole paragraph
    if cut <= 0:
        cut = n_bytes
    return data[:cut].decode("utf-8", errors="ignore") + "\n"


def write_large_contract(path: Path, n_bytes: int, variant: int = 0, *, samples_only: bool = False) -> Path:
    """`large_contract` written to `path` (UTF-8), for `review submit` and the soak."""
    path.write_text(large_contract(n_bytes, variant, samples_only=samples_only), encoding="utf-8")
    return path
