"""The baseline on each bundled real sample: what the embedded model scores, with its interval.

``tox -e baselines`` (``python studies/baselines.py``) runs ``lm_eval --model baseline`` on
squad_mini, spider_mini, cnndm_mini, aime_mini and gpqa_mini with the embedded model (chat
template, greedy, each task's own generation length), keeps the results file and the scored
samples in docs/data/baselines/, and writes docs/baselines.md from them: per task its size, its
metrics with their 95% interval over documents (as reports compute it), and the generation's
length and speed. ``--from docs/data/baselines`` renders the page again from the kept run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from common import (
    doc_parser,
    keep_lm_eval_run,
    kept_results,
    load_json,
    page,
    record_run,
    run_header,
)

from decodebench.commands.runs import LmEvalRun

DOC = "docs/baselines.md"
TASKS = ["squad_mini", "spider_mini", "cnndm_mini", "aime_mini", "gpqa_mini"]
SKIP = {"infinigram_agreement_by_n", "infinigram_reference"}


def collect(folder: Path, argv: list[str], out: str, limit: int | None, batch_size: str) -> None:
    started = time.time()
    invocation = LmEvalRun(
        model="baseline",
        model_args={"pretrained": "embedded"},
        tasks=TASKS,
        output_path=Path(out).resolve(),
        batch_size=batch_size,
        limit=limit,
    )
    results = invocation.run_or_raise("the baseline")
    for old in folder.glob("*_*.json*"):  # the previous run's files
        old.unlink()
    keep_lm_eval_run(results, folder)
    shown = invocation.shown().replace(str(Path(out).resolve()), out)
    record_run(folder, __file__, argv, started, lm_eval_command=shown)


def render(folder: Path) -> str:
    from decodebench.metrics.kinds import is_binary_metric, metric_range
    from decodebench.reports.reader import read_run, read_text
    from decodebench.stats import APPROXIMATE_BELOW, quality_interval

    path = kept_results(folder)
    results, run = json.loads(read_text(path)), read_run(path)
    info = results["config"]["decodebench"]
    lines = [
        *run_header(folder, "The baseline on the bundled real samples", "baselines"),
        f"- command: `{load_json(folder, 'run.json')['lm_eval_command']}`",
        "- model: the embedded SmolLM2-135M-Instruct, greedy, chat template, each task's generation length",
        "- interval: 95% over the task's documents (n), from the samples log: Wilson with continuity correction for "
        "0/1 metrics, Student's t otherwise (decodebench.stats); a metric that is not a mean over documents "
        "(infini-gram agreement is token-weighted) has none",
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
                bounds, kind = quality_interval(values, is_binary_metric(metric), metric_range(metric))
                interval = f"[{bounds.low:.3f}, {bounds.high:.3f}] {kind}"
                if n < APPROXIMATE_BELOW:
                    interval += f" (approximate: n below {APPROXIMATE_BELOW})"
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
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--out", default="results/baselines", help="lm_eval output folder")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--batch-size", default="8", help="lm_eval --batch_size (default 8)")
    args = parser.parse_args(argv)
    options = (args.out, args.limit, args.batch_size)
    return page(args, argv, lambda folder, command: collect(folder, command, *options), render)


if __name__ == "__main__":
    raise SystemExit(main())
