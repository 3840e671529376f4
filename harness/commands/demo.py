"""The main job (README line 1): every method through the real ``lm_eval`` command, offline.

Each run is one ``lm_eval`` process (decodebench.commands.runs) on the embedded model (or ``--pretrained``) and the
bundled mini tasks, written to ``OUT/<run>/`` with lm-eval's own output in ``OUT/<run>/lm_eval.log`` (the terminal
shows one progress bar per run); afterwards a short table of quality, tokens/s and J/token is printed with the path
of every results file, and the leaderboard of the runs is written to ``OUT/leaderboard/``.

Before the first timed run, the first run (the baseline) runs once untimed on the same tasks and is discarded
(``OUT/warm-up/``): the first ``lm_eval`` process on a machine pays what later ones find done (files read into the
page cache, compiled kernels, the task data's first load), which made the baseline's first task read 4 tokens/s
against 15-23 for every method after it.

Runs taken one after another on a shared machine differ in speed by more than most methods change it, so the
table gives no speed ratio. The one comparison it teaches is interleaved: once every method has run, the compared
method (the first registered one naming ``demo_compared_on``) and the baseline run again on that task, on
``COMPARED_LIMIT`` documents (the fewest at which the speed ratio's interval is calibrated), in two rounds of
alternating order (the baseline first, then the method; then the method first). Both rounds pair per document
(``decodebench compare``'s summary, written to ``OUT/interleaved/``): the speed ratio with its interval, quality
with its paired test, and how many generations are the baseline's.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodebench.commands.runs import LmEvalRun, start_fork_server


@dataclass(frozen=True)
class Run:
    name: str
    model: str
    model_args: dict[str, object] = field(default_factory=dict)
    batch_size: int = 1
    compared_on: str | None = None  # Method.demo_compared_on


def registered_runs() -> list[Run]:
    """One run per registered method (``decodebench methods``), with the ``--model_args`` it says the main
    job should use (``Method.demo_model_args``; its defaults unless it says otherwise).

    Every run is measured the same way, on the same tasks, limits and batch size (1, the papers' setting
    for row-by-row methods), so that every speed ratio compares like with like.
    """
    from decodebench.models.registry import load_method, methods

    runs = []
    for name, target in methods().items():
        method = load_method(target)
        runs.append(Run(name, name, method.demo_model_args(), compared_on=method.demo_compared_on))
    return runs


def compared_run(runs: list[Run]) -> Run | None:
    """The run the main job times against the baseline in interleaved rounds: the first that names a task for it,
    when the baseline runs too."""
    if not any(run.name == BASELINE for run in runs):
        return None
    return next((run for run in runs if run.compared_on and run.name != BASELINE), None)


def in_running_order(runs: list[Run], compared: Run | None) -> list[Run]:
    """The baseline first and the compared run right after it (round 1 of the interleaved comparison), then the
    rest in the registry's order."""
    first = [run for name in (BASELINE, compared.name if compared else None) for run in runs if run.name == name]
    return first + [run for run in runs if run not in first]


BASELINE = "baseline"  # what every comparison is made against
EMBEDDED = "embedded"  # `pretrained=embedded`: the bundled SmolLM2-135M-Instruct
MINI_TASKS = ["decodebench_mini"]
WIDTH = 120  # the notes under the table; the last screen fits 160 columns
# With the CLI's defaults, every method on every mini task and the interleaved comparison in under five minutes on
# two CPU cores, installs included (README): the embedded model decodes ~10-15 tokens/s there at batch 1, and 9 of
# the comparison's 10 squad_mini answers ran to the limit at 24 tokens (2026-11-28), so each token less shortens
# nearly every document. Answers are cut short: a tour, not the benchmark (`lm_eval` without --gen_kwargs uses each
# task's limit).
MAX_GEN_TOKS = 16
DEFAULT_LIMIT = 1
# decodebench.stats.APPROXIMATE_BELOW, the fewest documents at which a speed interval is shown (not imported: the
# CLI reads this module to build its --help, and stats brings numpy)
COMPARED_LIMIT = 10
ROUNDS = (("baseline", "method"), ("method", "baseline"))  # the interleaved comparison's sides, round by round


def lm_eval_run(run: Run, tasks: list[str], out: Path, limit: int | None, pretrained: str = EMBEDDED) -> LmEvalRun:
    return LmEvalRun(
        model=run.model,
        model_args={"pretrained": pretrained, **run.model_args},
        tasks=tasks,
        output_path=out / run.name,
        batch_size=run.batch_size,
        limit=limit,
        gen_kwargs=f"max_gen_toks={MAX_GEN_TOKS}",
    )


def run_demo(
    out: str | Path = "results",
    limit: int | None = None,
    methods: str | None = None,
    tasks: str | None = None,
    compared_limit: int = COMPARED_LIMIT,
    pretrained: str = EMBEDDED,
    warm_up: bool = True,
) -> int:
    from decodebench.data.embedded import EmbeddedModelError, ensure_embedded_model

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
    if pretrained != EMBEDDED and looks_like_a_path(pretrained) and not Path(pretrained).is_dir():
        print(f"error: --pretrained {pretrained}: no such checkpoint folder (or a Hugging Face id)", file=sys.stderr)
        return 2

    # Ctrl-C reports the runs that finished even where SIGINT came in ignored (started by a script without job
    # control); its lm_eval runs then get the default back too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    start_fork_server()  # the runs' imports and task index, while the embedded model is checked (or built)
    if pretrained == EMBEDDED:
        try:
            checkpoint = ensure_embedded_model(log=lambda msg: print(msg, flush=True))
        except EmbeddedModelError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"embedded model: {checkpoint}", flush=True)
    else:
        print(f"model: {pretrained}", flush=True)

    compared = compared_run(runs)
    runs = in_running_order(runs, compared)
    total = len(runs) + (2 * len(ROUNDS) if compared else 0)
    produced: dict[str, Path | None] = {}
    rounds: list[dict[str, Path]] = []
    interrupted = False
    try:
        print(f"lm_eval's own output goes to {out}/<run>/lm_eval.log; each log starts with its command", flush=True)
        if warm_up:
            run_warm_up(runs[0], task_list, out / "warm-up", limit, pretrained)
        for number, run in enumerate(runs, 1):
            invocation = lm_eval_run(run, task_list, out, limit, pretrained)
            produced[run.name] = invocation.run_logged(out / run.name / "lm_eval.log", f"[{number}/{total}] {run.name}")
            if produced[run.name] is None:
                print(f"[{number}/{total}] {run.name} FAILED", flush=True)
        if compared and produced.get(BASELINE) and produced.get(compared.name):
            base = next(run for run in runs if run.name == BASELINE)
            rounds = run_interleaved_rounds(compared, base, produced, out, compared_limit, len(runs), total, pretrained)
    except KeyboardInterrupt:  # Ctrl-C: lm_eval got it too; keep what finished
        interrupted = True
        produced = {name: path for name, path in produced.items() if path is not None}
        print(f"\ninterrupted: {len(produced)} of {len(runs)} runs finished; reporting those", flush=True)
    if not produced:
        return 130 if interrupted else 1

    print(summary_table(produced))
    if len(rounds) == len(ROUNDS):
        print(interleaved_section(compared, rounds, out / "interleaved"))
    from decodebench.reports.leaderboard import write_report

    written, problems = write_report([path for path in produced.values() if path], out / "leaderboard")
    for problem in problems:
        print(f"note: {problem}")
    print(f"\nfinished in {time.time() - started:.0f} s; results under {out}")
    if written:
        print(f"leaderboard: {out / 'leaderboard' / 'leaderboard.html'} (also .md, .csv, .json)")
    if interrupted:
        return 130
    return 0 if all(produced.values()) and (not compared or len(rounds) == len(ROUNDS)) else 1


def run_warm_up(run: Run, tasks: list[str], out: Path, limit: int | None, pretrained: str) -> None:
    """The first run once, untimed: its results stay under ``out`` and enter no table, leaderboard or comparison."""
    label = f"[warm-up] {run.name} (untimed, discarded)"
    if lm_eval_run(run, tasks, out, limit, pretrained).run_logged(out / run.name / "lm_eval.log", label) is None:
        print(f"{label} FAILED (its log says why); the timed runs follow", flush=True)


def looks_like_a_path(pretrained: str) -> bool:
    """A local folder rather than a hub id ("owner/name" has one slash and no leading dot, tilde or slash)."""
    return pretrained.startswith((".", "~", "/")) or pretrained.count("/") > 1 or Path(pretrained).exists()


def run_interleaved_rounds(
    compared: Run,
    base: Run,
    produced: dict[str, Path | None],
    out: Path,
    limit: int,
    done: int,
    total: int,
    pretrained: str = EMBEDDED,
) -> list[dict[str, Path]]:
    """The interleaved comparison's rounds (ROUNDS: the baseline first, then the compared method first) on the
    compared task (the first task the compared run ran when the main job does not run it), ``limit`` documents each;
    [{side: results}] of the rounds that finished."""
    from decodebench.reports.reader import read_run

    ran = list(read_run(produced[compared.name]).tasks)
    if not ran:  # nothing to pair
        return []
    task = compared.compared_on if compared.compared_on in ran else ran[0]
    finished = []
    for round_number, sides in enumerate(ROUNDS, 1):
        results_of = {}
        for side in sides:
            run = compared if side == "method" else base
            done += 1
            folder = out / "interleaved" / f"round-{round_number}" / run.name
            label = f"[{done}/{total}] {run.name}, round {round_number} on {task}"
            invocation = lm_eval_run(run, [task], folder.parent, limit, pretrained)
            results = invocation.run_logged(folder / "lm_eval.log", label)
            if results is None:
                print(f"{label} FAILED", flush=True)
                return finished
            results_of[side] = results
        finished.append(results_of)
    return finished


def interleaved_section(compared: Run, rounds: list[dict[str, Path]], folder: Path) -> str:
    """``decodebench compare``'s table for the two rounds (also written to ``folder``), and what it can and cannot
    tell at this n."""
    import json

    from decodebench.commands.compare import markdown, summarize
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import finite

    summary = summarize(rounds)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.md").write_text(markdown(summary, compared.model, compared.model_args, len(rounds)))
    (folder / "compare.json").write_text(json.dumps(finite(summary), indent=2, allow_nan=False) + "\n")
    tasks = read_run(rounds[0]["method"]).tasks
    shown = {  # on the terminal, the task's main metric (compare.md has them all)
        task: {**row, "quality": {k: v for k, v in row["quality"].items() if k == tasks[task].primary_metric}}
        for task, row in summary.items()
    }
    text = markdown(shown, compared.model, compared.model_args, len(rounds))
    lines = ["", "Interleaved: round 1 ran the baseline, then the method; round 2 the other way round, on one task."]
    for line in text.splitlines():
        lines += [line] if line.startswith("|") else textwrap.wrap(line.lstrip("# "), WIDTH) or [""]
    notes = [note for row in summary.values() for note in what_it_tells(row)]
    lines += ["", *(textwrap.fill(note, WIDTH) for note in notes), f"written to {folder / 'compare.md'}"]
    return "\n".join(lines)


def what_it_tells(row: dict) -> list[str]:
    """What a person can take from one task's interleaved comparison, in words."""
    from decodebench.commands.compare import speed_interval_calibrated
    from decodebench.reports.tables import APPROXIMATE_BELOW

    same, both = row["identical_generations"]
    notes = []
    if both and same == both:
        notes.append(
            f"Its generations are the baseline's on {same} of {both} documents: it changed the speed, not the answers."
        )
    elif both:
        notes.append(f"Its generations differ from the baseline's on {both - same} of {both} documents.")
    low, high = row["speed_ratio_interval"] or (None, None)
    documents = row["speed_ratio_documents"]
    per_round = ", ".join(f"{r:.2f}x" for r in row["round_speed_ratios"] if r is not None)
    if low is not None and not speed_interval_calibrated(row):
        notes.append(
            f"Speed: {row['speed_ratio']:.2f}x over {documents} documents (rounds: {per_round}); below "
            f"{APPROXIMATE_BELOW} documents the bootstrap interval is not calibrated, so this n cannot show a speed "
            "difference (`decodebench demo --compared-limit 10` or more)."
        )
    elif low is not None and (low > 1 or high < 1):
        notes.append(
            f"Speed: {row['speed_ratio']:.2f}x, {'faster' if low > 1 else 'slower'} than the baseline on this machine: "
            f"the 95% interval over {documents} documents excludes 1."
        )
    elif low is not None:
        notes.append(
            f"Speed: {row['speed_ratio']:.2f}x, but the 95% interval over {documents} documents includes 1: no speed "
            "difference can be told at this n."
        )
    tested = [(metric, cell["vs_baseline"]) for metric, cell in row["quality"].items() if cell["vs_baseline"]]
    if tested and same != both:
        metric, comparison = tested[0]
        p_value = comparison.get("p_value")
        if p_value is not None and p_value < 0.05:
            notes.append(f"{metric}: the paired difference is told from noise (p = {p_value:.2g}, n = {row['n']}).")
        elif p_value is not None:
            notes.append(
                f"{metric}: p = {p_value:.2g} at n = {row['n']}: this difference cannot be told from noise (more "
                "documents: `decodebench demo --limit N`, or `decodebench compare`)."
            )
    return notes


def summary_table(produced: dict[str, Path | None]) -> str:
    """Per task and run: the task's main metric with its interval and its paired difference from the baseline,
    tokens/s, peak memory and J/token (the leaderboard's own cells), in at most 160 columns: what the leaderboard
    says in a cell (small n) is said once below the table. No speed ratio: these runs were taken one after another
    (the interleaved comparison below gives one)."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import (
        APPROXIMATE_BELOW,
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
        "| peak memory | J/token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    reasons, approximate, small = set(), False, False
    for task, rows in build_rows(runs).items():
        for row in sorted(rows, key=lambda r: order.get(r.run.method, len(order))):
            metric = row.task.primary_metric
            cell = row.metrics.get(metric) if metric else None
            if row.joules_per_token is None and row.energy_note:
                reasons.add(row.energy_note)
            approximate, small = approximate or row.approximate, small or row.small_n
            lines.append(
                f"| {task}: {metric or '-'} | {row.run.method} | {row.n if row.n is not None else '-'} "
                f"| {interval_text(cell) if cell else '-'} | {comparison_text(cell) if cell else '-'} "
                f"| {speed_text(row)} | {memory_text(row)} | {energy_text(row)} |"
            )
    notes = []
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
