"""What decodebench's measurement costs: its baseline against lm-eval's own ``--model hf``.

``tox -e overhead-bench`` (``python studies/overhead_bench.py``) runs the same evaluation as whole
``lm_eval`` processes in rounds whose order alternates (hf then baseline, then baseline then hf,
...), after one untimed run of each: the embedded model, the same task, ``--limit``, generation
length and batch size; ``--model hf`` and ``--model baseline`` get the same checkpoint path. A
profiled baseline process then says where decodebench's own time goes. It keeps each process's wall time in
docs/data/benchmarks/overhead/ and writes docs/benchmarks/overhead.md: the ratio baseline / hf
paired per round, with its 95% bootstrap interval over rounds. Goal: within 1.01x.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from common import doc_parser, load_json, page, record_run, run_header, save_json

from decodebench.commands.runs import LmEvalRun, offline_env

DOC = "docs/benchmarks/overhead.md"
TITLE = "Measurement overhead: decodebench's baseline against lm-eval's `--model hf`"
SIDES = ("hf", "baseline")


def timed(run: LmEvalRun) -> float:
    start = time.perf_counter()
    if subprocess.call(run.command(), env=offline_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        raise RuntimeError(f"failed: {run.shown()}")
    return time.perf_counter() - start


# (what decodebench does, the function whose cumulative time it is, lm-eval's own part inside it to subtract)
HF = "lm_eval/models/huggingface.py"
OWN_WORK = (
    (
        "around generation (windows, records)",
        "decodebench/models/backends/base.py:generate_until",
        f"{HF}:_model_generate",
    ),
    ("model set-up beyond HFLM's (meters, checks)", "decodebench/models/backends/hf.py:__init__", f"{HF}:__init__"),
    ("the results' description of the run", "decodebench/models/backends/hf.py:get_model_info", f"{HF}:get_model_info"),
    ("measurements added to the samples log", "decodebench/measure/recorder.py:annotate_samples", None),
    ("checks of --gen_kwargs", "decodebench/lmeval_plugin.py:simple_evaluate", "lm_eval/evaluator.py:simple_evaluate"),
)


def profile_own_work(run: LmEvalRun) -> dict:
    """One profiled ``lm_eval --model baseline`` process: the seconds of decodebench's own work beside the total."""
    import pstats
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "profile.out"
        command = [run.command()[0], "-m", "cProfile", "-o", str(out), *run.command()[1:]]
        if subprocess.call(command, env=offline_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            raise RuntimeError(f"the profiled run failed: {run.shown()}")
        stats = pstats.Stats(str(out)).stats

    def cumulative(where: str | None) -> float:
        if where is None:
            return 0.0
        file, _, function = where.rpartition(":")
        rows = [row[3] for (path, _, name), row in stats.items() if path.endswith(file) and name == function]
        return max(rows, default=0.0)

    own = {label: max(0.0, cumulative(ours) - cumulative(theirs)) for label, ours, theirs in OWN_WORK}
    return {"total_seconds": max(row[3] for row in stats.values()), "own_seconds": own}


def collect(folder: Path, argv: list[str], rounds: int, task: str, limit: int, max_gen_toks: int, batch: int, out: str):
    from decodebench.data.embedded import ensure_embedded_model

    started = time.time()
    checkpoint = str(ensure_embedded_model(log=print))
    runs = {
        name: LmEvalRun(
            model=name,
            model_args={"pretrained": checkpoint},
            tasks=[task],
            output_path=Path(out).resolve() / name,
            batch_size=batch,
            limit=limit,
            gen_kwargs=f"max_gen_toks={max_gen_toks}",
            log_samples=False,
        )
        for name in SIDES
    }
    for name in SIDES:  # untimed: caches that the first process of a machine fills (lm-eval's task index, pages)
        timed(runs[name])
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for number in range(rounds):
        for name in SIDES if number % 2 == 0 else SIDES[::-1]:
            seconds[name].append(timed(runs[name]))
            print(f"round {number + 1}/{rounds} {name}: {seconds[name][-1]:.1f} s", flush=True)
    save_json(folder, "profile.json", profile_own_work(runs["baseline"]))
    commands = {name: run.shown().replace(checkpoint, "<embedded checkpoint>") for name, run in runs.items()}
    commands = {name: command.replace(str(Path(out).resolve()), out) for name, command in commands.items()}
    save_json(folder, "seconds.json", {"seconds": seconds, "commands": commands})
    record_run(folder, __file__, argv, started, task=task, limit=limit, max_gen_toks=max_gen_toks, batch_size=batch)


def render(folder: Path) -> str:
    from decodebench.stats import speed_ratio_interval

    run, data = load_json(folder, "run.json"), load_json(folder, "seconds.json")
    seconds = data["seconds"]
    ones = [1.0] * len(seconds["hf"])
    # tokens/s with "one unit per process": the ratio of summed times baseline / hf, paired per round
    ratio, interval = speed_ratio_interval(ones, seconds["hf"], ones, seconds["baseline"])
    return "\n".join(
        [
            *run_header(folder, TITLE, "overhead-bench"),
            f"Whole `lm_eval` processes in rounds whose order alternates (hf first in odd rounds, baseline first in "
            f"even ones): the embedded model, `{run['task']}` with `--limit {run['limit']}`, "
            f"`max_gen_toks={run['max_gen_toks']}`, `--batch_size {run['batch_size']}`. The commands:",
            "",
            *(f"- `{data['commands'][name]}`" for name in SIDES),
            "",
            "| round | first | lm-eval `hf` (s) | decodebench `baseline` (s) | baseline / hf |",
            "|---:|---|---:|---:|---:|",
            *(
                f"| {i} | {SIDES[(i - 1) % 2]} | {h:.1f} | {b:.1f} | {b / h:.3f} |"
                for i, (h, b) in enumerate(zip(seconds["hf"], seconds["baseline"], strict=True), 1)
            ),
            "",
            f"Time of baseline / hf, paired per round: **{ratio:.3f}x** [95% CI {interval.low:.3f}, "
            f"{interval.high:.3f}] over {len(ones)} rounds (median of the per-round ratios "
            f"{statistics.median(b / h for b, h in zip(seconds['baseline'], seconds['hf'], strict=True)):.3f}). "
            "Goal: within 1.01x.",
            "",
            *profile_lines(folder),
        ]
    )


def profile_lines(folder: Path) -> list[str]:
    profile = load_json(folder, "profile.json")
    own, total = profile["own_seconds"], profile["total_seconds"]
    return [
        "Where decodebench's own time goes, in one profiled `--model baseline` process of the same command (cProfile's "
        "cumulative time of each function, less lm-eval's own part inside it):",
        "",
        "| decodebench's work | seconds |",
        "|---|---:|",
        *(f"| {label} | {seconds:.3f} |" for label, seconds in own.items()),
        f"| all of it, of {total:.1f} s in the process | {sum(own.values()):.3f} ({sum(own.values()) / total:.2%}) |",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--rounds", type=int, default=10, help="rounds, order alternating (default 10)")
    parser.add_argument("--task", default="squad_mini", help="task (default squad_mini)")
    parser.add_argument("--limit", type=int, default=24, help="documents (default 24)")
    parser.add_argument("--max-gen-toks", type=int, default=32, help="new tokens at most (default 32)")
    parser.add_argument("--batch-size", type=int, default=4, help="batch size of both (default 4)")
    parser.add_argument("--out", default="results/overhead", help="lm_eval output folder")
    args = parser.parse_args(argv)
    options = (args.rounds, args.task, args.limit, args.max_gen_toks, args.batch_size, args.out)
    return page(args, argv, lambda folder, command: collect(folder, command, *options), render)


if __name__ == "__main__":
    raise SystemExit(main())
