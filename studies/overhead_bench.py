"""What decodebench's measurement costs: its baseline against lm-eval's own ``--model hf``.

``tox -e overhead-bench`` (``python studies/overhead_bench.py``) runs the same evaluation as whole
``lm_eval`` processes, interleaved (hf, baseline, hf, baseline, ...): the embedded model, the same
task, ``--limit``, generation length and batch size; ``--model hf`` gets the checkpoint's path,
``--model baseline`` the same path. It writes docs/benchmarks/overhead.md: the wall time of each
process, and the ratio baseline / hf of each round with its median and range. Goal: within 1.01x.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, write_doc

from decodebench.runs import LmEvalRun, offline_env


def timed(run: LmEvalRun) -> float:
    start = time.perf_counter()
    if subprocess.call(run.command(), env=offline_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        raise RuntimeError(f"failed: {run.shown()}")
    return time.perf_counter() - start


def run(doc: str, rounds: int, task: str, limit: int, max_gen_toks: int, batch_size: int, out: str) -> int:
    from decodebench.embedded import ensure_embedded_model
    from decodebench.measure.machine import describe, short_name

    checkpoint = str(ensure_embedded_model(log=print))
    runs = {
        name: LmEvalRun(
            model=name,
            model_args={"pretrained": checkpoint},
            tasks=[task],
            output_path=Path(out).resolve() / name,
            batch_size=batch_size,
            limit=limit,
            gen_kwargs=f"max_gen_toks={max_gen_toks}",
            log_samples=False,
        )
        for name in ("hf", "baseline")
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for number in range(1, rounds + 1):
        for name, invocation in runs.items():
            seconds[name].append(timed(invocation))
            print(f"round {number}/{rounds} {name}: {seconds[name][-1]:.1f} s", flush=True)
    ratios = [b / h for b, h in zip(seconds["baseline"], seconds["hf"], strict=True)]
    lines = [
        "# Measurement overhead: decodebench's baseline against lm-eval's `--model hf`",
        "",
        f"Written by `python studies/overhead_bench.py --rounds {rounds}` (`tox -e overhead-bench`) on "
        f"{datetime.now(UTC):%Y-%m-%d}, machine: {short_name(describe('cpu'))}.",
        "",
        f"Whole `lm_eval` processes, interleaved: the embedded model, `{task}` with `--limit {limit}`, "
        f"`max_gen_toks={max_gen_toks}`, `--batch_size {batch_size}`. The commands:",
        "",
        *(f"- `{invocation.shown()}`" for invocation in runs.values()),
        "",
        "| round | lm-eval `hf` (s) | decodebench `baseline` (s) | ratio |",
        "|---:|---:|---:|---:|",
        *(
            f"| {i} | {h:.1f} | {b:.1f} | {r:.3f} |"
            for i, (h, b, r) in enumerate(zip(seconds["hf"], seconds["baseline"], ratios, strict=True), 1)
        ),
        "",
        f"Ratio baseline / hf: median **{statistics.median(ratios):.3f}x**, range {min(ratios):.3f} to "
        f"{max(ratios):.3f} over {rounds} rounds. Goal: within 1.01x.",
        "",
    ]
    return write_doc(doc, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/benchmarks/overhead.md")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--task", default="squad_mini", help="task (default squad_mini)")
    parser.add_argument("--limit", type=int, default=24, help="documents (default 24)")
    parser.add_argument("--max-gen-toks", type=int, default=32, help="new tokens at most (default 32)")
    parser.add_argument("--batch-size", type=int, default=4, help="batch size of both (default 4)")
    parser.add_argument("--out", default="results/overhead", help="lm_eval output folder")
    args = parser.parse_args(argv)
    return run(args.doc, args.rounds, args.task, args.limit, args.max_gen_toks, args.batch_size, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
