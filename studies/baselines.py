"""The baseline on each bundled real sample: what the embedded model scores, with its interval.

``tox -e baselines`` (``python studies/baselines.py``) runs ``lm_eval --model baseline`` on the
whole of squad_mini, spider_mini, cnndm_mini, aime_mini and gpqa_mini with the embedded model
(chat template, greedy, each task's own generation length) and writes docs/baselines.md: per task
its size, its metrics with their 95% interval over documents from the samples log (Wilson for 0/1
metrics, the bootstrap otherwise, as reports do), and the generation's length and speed.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, write_doc

from decodebench.measure.machine import short_name
from decodebench.runs import LmEvalRun

TASKS = ["squad_mini", "spider_mini", "cnndm_mini", "aime_mini", "gpqa_mini"]
SKIP = {"infinigram_agreement_by_n", "infinigram_reference"}


def run(doc: str, out: str, limit: int | None, batch_size: str, finished: str | None) -> int:
    started = time.time()
    invocation = LmEvalRun(
        model="baseline",
        model_args={"pretrained": "embedded"},
        tasks=TASKS,
        output_path=Path(out).resolve(),
        batch_size=batch_size,
        limit=limit,
    )
    results = Path(finished) if finished else invocation.run_or_raise("the baseline")
    return write_doc(doc, table(results, invocation, None if finished else time.time() - started))


def table(path: Path, invocation: LmEvalRun, seconds: float | None) -> str:
    from decodebench.reports.reader import read_run
    from decodebench.stats import quality_interval

    results, run = json.loads(path.read_text()), read_run(path)
    info = results["config"]["decodebench"]
    lines = [
        "# The baseline on the bundled real samples",
        "",
        f"Written by `python studies/baselines.py{f' --limit {invocation.limit}' if invocation.limit else ''}` "
        f"(`tox -e baselines`) on {datetime.now(UTC):%Y-%m-%d}"
        + (f" ({seconds / 60:.0f} min)" if seconds else "")
        + f", machine of the run: {short_name(info['machine'])}.",
        "",
        f"- command: `{invocation.shown()}`",
        "- model: the embedded SmolLM2-135M-Instruct, greedy, chat template, each task's generation length",
        "- interval: 95% over the task's documents (n), from the samples log: Wilson for 0/1 metrics, the bootstrap "
        "otherwise; a metric that is not a mean over documents (infini-gram agreement is token-weighted) has none",
        "- agreement: infini-gram agreement with the reference index (Python's documentation, no benchmark text)",
        "",
        "| task | n | metric | value | 95% interval | mean new tokens | tokens/s |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for task in TASKS:
        scores, stats = results["results"][task], info["tasks"][task]
        n = results["n-samples"][task]["effective"]
        per_document = run.tasks[task].per_document
        for key, value in scores.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or "_stderr" in metric or metric in SKIP or not isinstance(value, (int, float)):
                continue
            values = list(per_document.get(metric, {}).values())
            interval = "n/a (not a mean over documents)"
            if values and abs(sum(values) / len(values) - value) < 1e-9:
                bounds, kind = quality_interval(values)
                interval = f"[{bounds.low:.3f}, {bounds.high:.3f}] {kind}"
            lines.append(
                f"| {task} | {n} | {metric} | {value:.3f} | {interval} | {stats['new_tokens'] / stats['requests']:.0f} "
                f"| {stats['tokens_per_second']:.1f} |"
            )
    lines += [
        "",
        "These are samples of the benchmarks (tasks/*/DATA.md), not the benchmarks: compare methods on them only "
        "with a baseline of the same configuration, and quote the interval.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/baselines.md")
    parser.add_argument("--out", default="results/baselines", help="lm_eval output folder")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--batch-size", default="8", help="lm_eval --batch_size (default 8)")
    parser.add_argument("--results", default=None, help="write the document from this finished run's results file")
    args = parser.parse_args(argv)
    return run(args.doc, args.out, args.limit, args.batch_size, args.results)


if __name__ == "__main__":
    raise SystemExit(main())
