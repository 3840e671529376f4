"""The main job (README line 1): every method through the real ``lm_eval`` command, offline.

Each run is one ``lm_eval`` subprocess on the embedded model and the bundled mini tasks,
written to ``OUT/<run>/`` with lm-eval's own output in ``OUT/<run>/lm_eval.log`` (the terminal shows one progress
bar per run); afterwards a short table of quality, tokens/s and J/token is printed with the path of every results
file, and the leaderboard of the runs is written to ``OUT/leaderboard/``.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodebench.runs import LmEvalRun


@dataclass(frozen=True)
class Run:
    name: str
    model: str
    model_args: dict[str, object] = field(default_factory=dict)
    batch_size: int = 1


def registered_runs() -> list[Run]:
    """One run per registered method (``decodebench methods``), with the ``--model_args`` it says the main
    job should use (``Method.demo_model_args``; its defaults unless it says otherwise).

    Every run is measured the same way, on the same tasks, limits and batch size (1, the papers' setting
    for row-by-row methods), so that every speed ratio compares like with like.
    """
    from decodebench.models.registry import load_method, methods

    return [Run(name, name, load_method(target).demo_model_args()) for name, target in methods().items()]


MINI_TASKS = ["decodebench_mini"]
WIDTH = 120  # the notes under the table; the last screen fits 160 columns
# With the CLI's default --limit 2, every method on every mini task in under five minutes on two CPU cores,
# installs included (README): the embedded model decodes ~15 tokens/s there at batch 1.
MAX_GEN_TOKS = 64
DEFAULT_LIMIT = 2


def lm_eval_run(run: Run, tasks: list[str], out: Path, limit: int | None) -> LmEvalRun:
    return LmEvalRun(
        model=run.model,
        model_args={"pretrained": "embedded", **run.model_args},
        tasks=tasks,
        output_path=out / run.name,
        batch_size=run.batch_size,
        limit=limit,
        gen_kwargs=f"max_gen_toks={MAX_GEN_TOKS}",
    )


def run_demo(
    out: str | Path = "results", limit: int | None = None, methods: str | None = None, tasks: str | None = None
) -> int:
    from decodebench.embedded import EmbeddedModelError, ensure_embedded_model

    out = Path(out).resolve()
    task_list = tasks.split(",") if tasks else MINI_TASKS
    runs = registered_runs()
    if methods:
        wanted = methods.split(",")
        unknown = sorted(set(wanted) - {run.name for run in runs})
        if unknown:
            print(f"error: unknown run(s) {unknown}; known: {[run.name for run in runs]}", file=sys.stderr)
            return 2
        runs = [run for run in runs if run.name in wanted]

    # Ctrl-C reports the runs that finished even where SIGINT came in ignored (started by a script without job
    # control); its lm_eval runs then get the default back too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    try:
        checkpoint = ensure_embedded_model(log=lambda msg: print(msg, flush=True))
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"embedded model: {checkpoint}", flush=True)

    produced: dict[str, Path | None] = {}
    interrupted = False
    try:
        print(f"lm_eval's own output goes to {out}/<run>/lm_eval.log; each log starts with its command", flush=True)
        for number, run in enumerate(runs, 1):
            invocation = lm_eval_run(run, task_list, out, limit)
            produced[run.name] = invocation.run_logged(
                out / run.name / "lm_eval.log", f"[{number}/{len(runs)}] {run.name}"
            )
            if produced[run.name] is None:
                print(f"[{number}/{len(runs)}] {run.name} FAILED", flush=True)
    except KeyboardInterrupt:  # Ctrl-C: lm_eval got it too; keep what finished
        interrupted = True
        produced = {name: path for name, path in produced.items() if path is not None}
        print(f"\ninterrupted: {len(produced)} of {len(runs)} runs finished; reporting those", flush=True)
    if not produced:
        return 130 if interrupted else 1

    print(summary_table(produced))
    from decodebench.reports.leaderboard import write_report

    written, problems = write_report([path for path in produced.values() if path], out / "leaderboard")
    for problem in problems:
        print(f"note: {problem}")
    print(f"\nfinished in {time.time() - started:.0f} s; results under {out}")
    if written:
        print(f"leaderboard: {out / 'leaderboard' / 'leaderboard.html'} (also .md, .csv, .json)")
    if interrupted:
        return 130
    return 0 if all(produced.values()) else 1


def summary_table(produced: dict[str, Path | None]) -> str:
    """Per task and run: the task's main metric with its interval and its paired difference from the baseline,
    tokens/s and its ratio to the baseline's, peak memory and J/token (the leaderboard's own cells), in at most 160
    columns: what the leaderboard says in a cell (small n, runs not interleaved) is said once below the table."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import (
        APPROXIMATE_BELOW,
        NOT_INTERLEAVED,
        SMALL_N,
        build_rows,
        comparison_text,
        energy_text,
        interval_text,
        memory_text,
        speed_text,
    )

    runs = [read_run(path) for path in produced.values() if path is not None]
    order = {name: number for number, name in enumerate(produced)}
    lines = [
        "",
        "| task: metric | run | n | quality [95% interval] | vs baseline [95% interval], p | tokens/s "
        "| x baseline | peak memory | J/token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reasons, approximate, small, ratios = set(), False, False, False
    for task, rows in build_rows(runs).items():
        for row in sorted(rows, key=lambda r: order.get(r.run.method, len(order))):
            metric = row.task.primary_metric
            cell = row.metrics.get(metric) if metric else None
            if row.joules_per_token is None and row.energy_note:
                reasons.add(row.energy_note)
            approximate, small = approximate or row.approximate, small or row.small_n
            ratio = (row.speed_note or "-") if row.speed_ratio is None else f"{row.speed_ratio:.2f}x*"
            ratios = ratios or row.speed_ratio is not None
            lines.append(
                f"| {task}: {metric or '-'} | {row.run.method} | {row.n if row.n is not None else '-'} "
                f"| {interval_text(cell) if cell else '-'} | {comparison_text(cell) if cell else '-'} "
                f"| {speed_text(row)} | {ratio} | {memory_text(row)} | {energy_text(row)} |"
            )
    notes = []
    if ratios:
        notes.append(
            f"* {NOT_INTERLEAVED}: these runs were taken one after another; for a speed claim, `decodebench compare` "
            "runs a method and the baseline in interleaved rounds and pairs them per document."
        )
    if approximate:
        notes.append(f"n below {APPROXIMATE_BELOW}: the intervals' coverage is only approximate.")
    elif small:
        notes.append(f"n below {SMALL_N}: the intervals are wide.")
    notes += [f"J/token unavailable: {reason}" for reason in sorted(reasons)]
    lines += ["", *(textwrap.fill(note, WIDTH) for note in notes), ""]
    for run in runs:
        lines += [f"{run.method}: {run.method_label or '?'}", f"    {run.path}"]
    lines += [f"{name}: FAILED, no results" for name, path in produced.items() if path is None]
    return "\n".join(lines)
