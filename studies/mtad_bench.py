"""MTAD side by side (``tox -e mtad-bench``, ``python studies/mtad_bench.py`` -> docs/benchmarks/mtad.md).

The embedded model, batch 1, up to 128 new tokens, over the bundled summarization articles
(cnndm_mini) and chat questions (squad_mini), through ``--model mtad``'s own measured
``generate_until``: target-only greedy and sampling, speculative sampling, transformers'
assisted generation, and MTAD with each draft. Reported: tokens/s and its ratio to target-only
greedy, block efficiency (new tokens per target forward pass), acceptance rate, and output
perplexity under the target (scored after decoding).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from common import doc_parser, task_docs, write_doc

SETTINGS = [
    ("target-only, greedy", {"mode": "target"}, False),
    ("target-only, sampling", {"mode": "target"}, True),
    ("speculative sampling, self:10", {"mode": "speculative", "draft": "self:10"}, True),
    ("assisted generation (transformers), self:10", {"mode": "assisted", "draft": "self:10"}, False),
    ("assisted generation (transformers), prompt lookup", {"mode": "assisted", "draft": "context"}, False),
    ("MTAD, self:10, 8 beams", {"mode": "mtad", "draft": "self:10"}, False),
    ("MTAD, self:10, 8 beams, sampling", {"mode": "mtad", "draft": "self:10"}, True),
    ("MTAD, context (prompt lookup)", {"mode": "mtad", "draft": "context"}, False),
    ("MTAD, infini-gram (reference index)", {"mode": "mtad", "draft": "infinigram"}, False),
]


def prompts(tokenizer, limit: int) -> list[str]:
    """cnndm_mini's summarization prompts (the task's own) and squad_mini's bare questions, in the chat template."""
    cnndm, articles = task_docs("cnndm_mini", limit)
    _, questions = task_docs("squad_mini", max(1, limit // 2))
    texts = [cnndm.doc_to_text(doc) for doc in articles] + [doc["question"] for doc in questions]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]


def run(doc: str | Path = "docs/benchmarks/mtad.md", limit: int = 3, new_tokens: int = 128) -> int:
    from decodebench.measure.machine import describe, short_name
    from decodebench.models.mtad import MTAD, MTADConfig

    rows = []
    texts = None
    for name, args, sample in SETTINGS:
        print(f"{name} ...", flush=True)
        model = MTAD.create({"pretrained": "embedded", "device": "cpu", "batch_size": 1, **args})
        texts = texts or prompts(model.tokenizer, limit)
        kwargs = {"until": [], "max_gen_toks": new_tokens, "do_sample": sample}
        if sample:
            kwargs["temperature"] = 1.0
        requests = [
            SimpleNamespace(task_name="bench", doc_id=i, idx=0, args=(t, dict(kwargs))) for i, t in enumerate(texts)
        ]
        start = time.perf_counter()
        model.generate_until(requests)
        print(f"   {time.perf_counter() - start:.0f} s", flush=True)
        summary = model.decodebench_recorder.task_summaries()["bench"]
        rows.append((name, summary))
    base = rows[0][1]["tokens_per_second"]
    lines = [
        "# MTAD benchmark: side by side on the embedded model",
        "",
        f"Written by `python studies/mtad_bench.py` on {datetime.now(UTC):%Y-%m-%d}, "
        f"machine: {short_name(describe('cpu'))}.",
        f"{len(texts)} prompts (cnndm_mini articles to summarize, squad_mini questions), chat template, batch 1, "
        f"up to {new_tokens} new tokens each, gamma {MTADConfig.defaults().gamma}. "
        "Perplexity is the target's, on the generated tokens.",
        "",
        "| setting | tokens/s | vs target-only greedy | mean new tokens | block efficiency | acceptance rate "
        "| perplexity |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, summary in rows:
        method = summary["method"]
        block = method.get("block_efficiency")
        accept = method.get("acceptance_rate")
        lines.append(
            f"| {name} | {summary['tokens_per_second']:.2f} | {summary['tokens_per_second'] / base:.2f}x "
            f"| {summary['new_tokens'] / summary['requests']:.0f} "
            f"| {f'{block:.2f}' if block else '-'} | {f'{accept:.2f}' if accept is not None else '-'} "
            f"| {method.get('target_perplexity', float('nan')):.2f} |"
        )
    lines += [
        "",
        "Block efficiency and acceptance come from decodebench's own decoding loop; transformers' assisted generation "
        "does not expose them. J/token: " + (rows[0][1]["energy_unavailable_reason"] or "see the results JSON") + ".",
        "",
        "```json",
        json.dumps({name: summary["method"].get("acceptance_histogram") for name, summary in rows}, indent=1),
        "```",
        "",
    ]
    return write_doc(doc, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/benchmarks/mtad.md")
    parser.add_argument("--limit", type=int, default=3, help="cnndm_mini articles (and half as many questions)")
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt at most")
    args = parser.parse_args(argv)
    return run(args.doc, args.limit, args.new_tokens)


if __name__ == "__main__":
    raise SystemExit(main())
