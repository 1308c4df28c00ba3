"""The consoles every command prints on, and `review status`'s sentences and tables."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from contract_review.domain.records import Inference
from contract_review.operate import job_view as job_views
from contract_review.operate import narration

# emoji=False: an ARN holds `:secret:`, which rich would print as an emoji; soft_wrap: a line is never broken at the
# terminal's width (in a pipe, rich assumes 80 columns), so ids, ARNs and paths stay whole for grep and copy
console = Console(emoji=False, soft_wrap=True)
STDERR = Console(stderr=True, emoji=False, soft_wrap=True)  # progress beside --json output


def say(text: str, style: str = "") -> None:
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def print_status(view: job_views.JobView) -> None:
    """Sentences and tables, each fact once (`--json` has every field)."""
    a = view.answers
    error = f": {view.error_code}" + (f", {view.error.message}" if view.error else "") if view.error_code else ""
    say(f"{view.job_id} is {view.state.value}{error}", style="bold")
    say(f"  {job_views.header_words(view)}")
    say(f"  progress: {job_views.chunk_counts(view)}; latest: {view.progress_label}")
    if view.last_checkpoint_at:
        say(f"  last checkpoint: a chunk settled done at {narration.human_time(view.last_checkpoint_at)}")
    if view.missing_chunks:
        t = Table("missing chunk", "chunk id", "status", "error", title=None)
        for m in view.missing_chunks:
            t.add_row(str(m.chunk_index + 1), m.chunk_id, m.status.value, m.error_code or "")
        console.print(t)
    if gaps := job_views.other_gaps(view):  # a missing chunk's gaps are its row above
        say(f"  mandatory gaps ({len(gaps)} chunk-analyst pairs): " + "; ".join(job_views.gaps_summary(gaps, view.mandatory_analysts)))
    r = view.reliability
    retries = ", ".join(f"{code} {n}" for code, n in sorted(r.retries_by_code.items())) or "none"
    say(f"  model: {r.model_calls} call(s), retries: {retries}; {r.repairs} repair(s), {r.redeliveries} "
         f"redelivery(ies); circuit breaker {view.model_circuit}")
    say(f"  cost: {view.cost}")
    if view.inference is Inference.BATCH:
        say(f"  inference: batch (Bedrock batch inference at the batch price, where its calls stay in the batch lane)"
             f", deadline {narration.human_time(view.deadline_at) if view.deadline_at else 'none'}")
        for b in view.batches:
            say("    " + narration.batch_line(b, view.model_paused))
        if view.batch_note is not None:
            say("    " + view.batch_note)
        if view.batch_off is not None:
            say("    " + narration.batch_off_line(view.batch_off))
    if view.waiting is not None:
        say(f"  waiting: {narration.waiting_line(view.waiting)}")
    if view.model_hold is not None:
        say(f"  held: {view.model_hold}")
    if view.approval is not None:
        ap = view.approval
        say(f"  waits for approval: step {ap.step} (key {ap.key[:12]}): {ap.reason}; expires {narration.human_time(ap.expires_at)}; "
             f"decide with `review approve {view.job_id}` or `review reject {view.job_id}`")
        for k, v in sorted((k, v) for k, v in ap.evidence.items() if v is not None):
            say(f"    evidence {k}: {v if isinstance(v, str | int | float | bool) else json.dumps(v, sort_keys=True)}")
    done = job_views.side_effect_words(view)
    say(f"  side effects done: {'; '.join(done) if done else 'none'}")
    say(f"  a retry would: {a.retry_would}")
    say(f"  if cancelled now: {a.if_cancelled_now}")
    say(f"  if it fails again: {a.if_it_fails_again}")
    if view.recent_events:
        t = Table("at", "event", "what")
        for e in view.recent_events:
            t.add_row(e.at, e.type, narration.event_words(e))
        console.print(t)
