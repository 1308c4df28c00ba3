"""Hypothesis over the boundaries hostile input crosses first (the cases by name: test_hostile_corpus.py).

| property                                   | over                                                         |
|--------------------------------------------|--------------------------------------------------------------|
| intake ends every body in one attempt      | any text (lone surrogates too), any JSON, valid messages with |
| with a code, or a running job              | hostile strings and one field broken: a failed job or an     |
|                                            | intake DLQ message with a registry code, never an exception  |
| the chunker tiles any Unicode text         | combining marks, RTL marks, zero-width, 4-byte, separators,  |
|                                            | CR/LF/NEL/LS/PS, blanks: exact slices, bounded, all content  |
| every chunk message fits one SQS message   | the profile's chunks of any text (6-byte JSON escapes        |
|                                            | included); a body over the limit is refused, nothing sent    |
| every result message fits one SQS message  | any error envelope a chunk can settle with                   |

Bounded: a few hundred examples in all, no deadline (the fakes are in memory; the whole module takes seconds).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract_review.config.constants import SQS_MAX_MESSAGE_BYTES
from contract_review.config.profile import get_profile
from contract_review.domain.errors import REGISTRY, ErrorEnvelope
from contract_review.domain.messages import AnalysisMessage, MessageTooLarge, ResultMessage, body_bytes, size_batches
from contract_review.domain.ports import Queue
from contract_review.domain.records import ChunkStatus, JobState
from contract_review.pipeline.intake import handle_intake
from contract_review.review.analysts import ANALYSTS
from contract_review.review.chunking import chunk_document, split_into_chunks

from ..fakes import FakeWorld

BOUNDED = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

# Characters hostile text is made of: combining marks, bidi controls and RTL letters, zero-width and BOM, 4-byte
# characters, every line break Python knows, blanks of many kinds, controls, and plain clause text.
HOSTILE = ("\u0301\u0303\u0308\u0323\u0351 \u202e\u202c\u200f\u200e\u2067\u2069\u05e9\u0645 \u200b\u200c\u200d"
           "\u2060\ufeff\u00ad \U0001f4dc\U0001d11e\U00020000\U0001f468 \n\r\x85\u2028\u2029\x0b\x0c "
           "\t\u3000\u00a0\u2003 \x00\x01\x1f\x7f .;:!?()\"' A B a b 1 2 Liability. Termination.")
hostile_text = st.text(alphabet=st.sampled_from(list(HOSTILE)), max_size=400)
# any code point, lone surrogates included (what `json.dumps` writes as a \ud800 escape)
any_string = st.text(alphabet=st.characters(codec=None), max_size=40) | st.builds(
    "{}{}{}".format, st.text(max_size=5), st.characters(categories=["Cs"]), st.text(max_size=5))
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_string,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_string, inner, max_size=4),
                           max_leaves=12)


@st.composite
def intake_bodies(draw: st.DrawFn) -> str:
    """A body intake may receive: any text, any JSON, or a message with hostile strings and one field broken."""
    kind = draw(st.sampled_from(["text", "json", "message"]))
    if kind == "text":
        return draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
    if kind == "json":
        return json.dumps(draw(json_values))
    message: dict[str, object] = {"schema_version": 1, "document": {"text": draw(hostile_text | any_string)}}
    for field in draw(st.lists(st.sampled_from(["idempotency_key", "document_id", "metadata", "budget_usd",
                                                "principal", "schema_version", "document"]), max_size=3, unique=True)):
        message[field] = draw(json_values | any_string)
    return json.dumps(message, ensure_ascii=draw(st.booleans()))  # raw or \\u-escaped: what SQS can carry


@BOUNDED
@given(body=intake_bodies())
def test_intake_ends_any_body_in_one_attempt_with_a_code_or_a_running_job(body: str) -> None:
    world = FakeWorld()
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:  # SQS carries Unicode text only: a lone surrogate arrives \u-escaped
        body = json.dumps(json.loads(body))
    # WHEN intake handles it once (no exception: it is the only attempt)
    result = handle_intake(world.deps, body, "m-1")
    jobs = world.jobs.all()
    dlq = world.queues.sent[Queue.INTAKE_DLQ]
    if result.error is None:
        # a running job with every chunk recorded and the first page sent
        (job,) = jobs
        assert job.state is JobState.RUNNING and job.job_id == result.job_id and dlq == []
        records = world.claims.for_job(job.job_id)
        assert len(records) == job.chunk_count > 0 and all(r.status is ChunkStatus.PENDING for r in records)
        assert world.queues.sent[Queue.ANALYSIS]
    else:
        # a registry code, permanent, recorded exactly once: on a failed job, or with the body in the intake DLQ
        code = result.error.error_code
        assert code in REGISTRY and not result.error.retryable and world.queues.sent[Queue.ANALYSIS] == []
        if result.job_id is None:
            assert jobs == [] and [(s.body, s.attributes["error_code"]) for s in dlq] == [(body, code)]
        else:
            (job,) = jobs
            assert (job.state, job.error_code, dlq) == (JobState.FAILED, code, [])
            json.dumps(job.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")  # a store can hold it


# --- the chunker ---------------------------------------------------------------------------------------

@BOUNDED
@given(text=hostile_text, target=st.integers(1, 200), extra=st.integers(0, 200))
def test_the_chunker_tiles_any_unicode_text(text: str, target: int, extra: int) -> None:
    maximum = target + extra
    chunks = split_into_chunks(text, target_chars=target, max_chars=maximum)
    covered = 0
    for i, c in enumerate(chunks):
        assert c.index == i and c.text == text[c.start:c.end] and 0 < len(c.text) <= maximum
        assert c.text.strip() and not text[covered:c.start].strip()  # only blanks between chunks
        covered = c.end
    assert not text[covered:].strip()
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    assert [c.chunk_id for c in split_into_chunks(text, target_chars=target, max_chars=maximum)] == \
        [c.chunk_id for c in chunks]


# --- message sizes -------------------------------------------------------------------------------------

# the worst fields a chunk message can carry besides its text: the longest ids, every analyst to resume after
WORST = {"job_id": "job-" + "f" * 20, "chunk_count": 10**6, "attempt": 99, "max_attempts": 99, "requeues": 10**6,
         "checkpoint_version": "f" * 16, "resume_from": [a.name for a in ANALYSTS], "reason": "runtime.time_exhausted"}


@BOUNDED
@given(piece=st.text(alphabet=st.sampled_from(list(HOSTILE)), min_size=1, max_size=60), repeat=st.integers(1, 400),
       profile=st.sampled_from(["prod", "local"]))
def test_every_chunk_message_the_profile_cuts_fits_one_sqs_message(piece: str, repeat: int, profile: str) -> None:
    text = piece * repeat
    bodies = [AnalysisMessage(chunk_id=c.chunk_id, chunk_index=c.index, start=c.start, end=c.end, text=c.text,
                              **WORST).model_dump_json() for c in chunk_document(text, get_profile(profile).review)]
    assert all(body_bytes(b) <= SQS_MAX_MESSAGE_BYTES for b in bodies)
    batches = size_batches(bodies)
    assert [b for batch in batches for b in batch] == bodies  # every one sent, in order
    assert all(len(batch) <= 10 and sum(map(body_bytes, batch)) <= SQS_MAX_MESSAGE_BYTES for batch in batches)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(extra=st.integers(1, 5000), char=st.sampled_from(["a", "\x1f", "\U0001f4dc"]))
def test_a_body_over_the_limit_is_refused_and_nothing_is_sent(extra: int, char: str) -> None:
    big = AnalysisMessage(chunk_id="c", chunk_index=0, start=0, end=1, text="", **WORST).model_dump_json()
    big = big.replace('"text":""', '"text":"' + json.dumps(char)[1:-1] * (SQS_MAX_MESSAGE_BYTES // len(
        json.dumps(char)[1:-1].encode()) + extra) + '"')
    with pytest.raises(MessageTooLarge):
        size_batches(["{}", big])


@BOUNDED
@given(code=st.sampled_from(sorted(REGISTRY)), message=st.text(alphabet=st.sampled_from(list(HOSTILE)), max_size=2000),
       status=st.sampled_from([ChunkStatus.DONE, ChunkStatus.FAILED, ChunkStatus.DEAD_LETTERED]))
def test_every_result_message_fits_one_sqs_message(code: str, message: str, status: ChunkStatus) -> None:
    env = ErrorEnvelope.of(code, message, step="x" * 100, provider_code="ValidationException", http_status=400)
    result = ResultMessage(job_id="job-" + "f" * 20, chunk_id="c99999-" + "f" * 12, chunk_index=99_999, status=status,
                           fence=10**9, findings_key="findings/" + "f" * 200, error=env)
    assert body_bytes(result.model_dump_json()) <= 8 * 1024  # far under SQS's 256 KiB (the message is cut at 500)
