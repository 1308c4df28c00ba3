"""What a document costs: model calls and tokens per KB of contract text (docs/cost.md, "What a document costs").

    .venv/bin/python bench/cost.py [--input-per-1k 0.003] [--output-per-1k 0.015]

Runs the 11 analysts over samples/*.txt exactly as a worker does (the prod profile's chunking, both
steps, no faults), with the offline rule model answering, and counts per model call the input a
real model would be sent (system prompt + prompt + the tool's JSON schema) and the answer. No AWS.

Tokens are estimated at 4 characters per token (English contract text with Claude-family
tokenizers is 3.5-4.5). The answers are the rule model's: an LLM's rationales are longer, so the
output tokens here are a floor; input, which dominates, is the same for any model. Tier-1 retries
add calls on top (5 % transient faults cost x1.05 calls in bench/run.py). Results:
bench/results/cost.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from contract_review.config.profile import get_profile  # noqa: E402
from contract_review.domain.model import ModelRequest, ModelResponse  # noqa: E402
from contract_review.doubles.offline_model import OfflineRuleModel  # noqa: E402
from contract_review.review.analysts import ANALYSTS, parse_response, run_analyst  # noqa: E402
from contract_review.review.chunking import chunk_document  # noqa: E402

CHARS_PER_TOKEN = 4.0
PROD = get_profile("prod")


class Meter:
    """Counts the calls and the characters in and out of each."""

    def __init__(self) -> None:
        self.model = OfflineRuleModel()
        self.calls = 0
        self.chars_in = 0
        self.chars_out = 0

    def call_step(self, build: Any, parse: Any) -> tuple[Any, int]:
        request: ModelRequest = build(None)
        response: ModelResponse = self.model.invoke(request)
        self.calls += 1
        self.chars_in += len(request.system) + len(request.prompt) + len(json.dumps(request.output_schema))
        self.chars_out += len(response.text)
        return parse(response), 1


def measure(text: str) -> Meter:
    meter = Meter()
    for chunk in chunk_document(text, PROD.review):
        for spec in ANALYSTS[:PROD.review.analyst_count]:
            run_analyst(spec, chunk, meter.call_step)
    return meter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input-per-1k", type=float, default=0.003, help="USD per 1,000 input tokens")
    ap.add_argument("--output-per-1k", type=float, default=0.015, help="USD per 1,000 output tokens")
    args = ap.parse_args()
    assert parse_response  # the same validation a worker applies runs inside run_analyst's parse
    rows = []
    for f in sorted((ROOT / "samples").glob("*.txt")):
        text = f.read_text(encoding="utf-8")
        m = measure(text)
        kb = len(text.encode("utf-8")) / 1024
        tin, tout = m.chars_in / CHARS_PER_TOKEN, m.chars_out / CHARS_PER_TOKEN
        usd = tin / 1000 * args.input_per_1k + tout / 1000 * args.output_per_1k
        rows.append({"sample": f.name, "kb": round(kb, 1), "calls": m.calls, "input_tokens": round(tin),
                     "output_tokens": round(tout), "usd": round(usd, 4)})
    kb = sum(r["kb"] for r in rows)
    total = {k: sum(r[k] for r in rows) for k in ("calls", "input_tokens", "output_tokens", "usd")}
    per_kb = {"calls": total["calls"] / kb, "input_tokens": total["input_tokens"] / kb,
              "output_tokens": total["output_tokens"] / kb, "usd": total["usd"] / kb}
    print(f"{'sample':36} {'KB':>6} {'calls':>6} {'in tok':>8} {'out tok':>8} {'USD':>7}")
    for r in rows:
        print(f"{r['sample']:36} {r['kb']:6.1f} {r['calls']:6d} {r['input_tokens']:8d} {r['output_tokens']:8d} "
              f"{r['usd']:7.3f}")
    print(f"per KB: {per_kb['calls']:.2f} calls, {per_kb['input_tokens']:.0f} input + {per_kb['output_tokens']:.0f} "
          f"output tokens, ${per_kb['usd']:.4f} (at ${args.input_per_1k}/1k input, ${args.output_per_1k}/1k output)")
    out = ROOT / "bench" / "results" / "cost.json"
    out.write_text(json.dumps({"chunk_target_chars": PROD.review.chunk_target_chars, "analysts": PROD.review.analyst_count,
                               "chars_per_token": CHARS_PER_TOKEN, "usd_per_1k": {"input": args.input_per_1k,
                                                                                  "output": args.output_per_1k},
                               "samples": rows, "per_kb": {k: round(v, 4) for k, v in per_kb.items()},
                               "python": platform.python_version()}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
