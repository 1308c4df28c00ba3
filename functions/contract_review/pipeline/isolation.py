"""One item of a scheduled pass (the recovery sweep, the batch collector's run) never blocks the others."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from contract_review.domain import log_fields

log = logging.getLogger(__name__)


@contextmanager
def isolated(failures: list[str], lane: str, step: str, item: str) -> Iterator[None]:
    """Run one item of `lane`'s pass: an exception is logged ("<lane> item failed") and counted in `failures` as
    "step:item" (the pass's item-failure metric and its alarm), never stops the pass. An item that is a job
    (`job-...`) or a chunk (`job-.../chunk`) names it on the item's log lines."""
    job_id, _, chunk_id = item.partition("/") if item.startswith("job-") else ("", "", "")
    with log_fields.bound(log_fields.job_fields(job_id=job_id or None, chunk_id=chunk_id or None,
                                                step=f"{lane}.{step}")):
        try:
            yield
        except Exception:  # one bad item (a missing document, a throttled write) must not block the rest
            log.warning(f"{lane} item failed", exc_info=True, extra={"item": item})
            failures.append(f"{step}:{item}")
