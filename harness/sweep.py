"""``decodebench sweep``: a method and the baseline through one server at several numbers of requests in flight.

Served decoding is judged at the load it will carry: this command runs ``--model M`` and ``--model baseline``
with ``backend=served`` against the same ``base_url`` at each ``--concurrency`` level, in rounds whose order
alternates (the levels forwards, then backwards; within a level, baseline and method alternating), through the
real ``lm_eval``, after one untimed pass of every prompt (so that the server's prefix cache holds them for every
timed run alike). Per level it reports each side's throughput (tokens/s over the task's wall time), the method's
over the baseline's paired per round with its 95% bootstrap interval over rounds, TTFT, TPOT and ITL
percentiles, the server's counters, and quality from the same generations with its paired test.
``decodebench report OUT`` draws throughput against latency across the levels.

    decodebench sweep --model lz --base-url http://127.0.0.1:8000/v1 --concurrency 1,4,16 --tasks squad_mini
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from decodebench.compare import SIDES, UsageError, checked_sides, exit_codes
from decodebench.runs import LmEvalRun


def level_args(args: dict[str, str], base_url: str, level: int) -> dict[str, str]:
    return {**args, "backend": "served", "base_url": base_url, "num_concurrent": str(level)}


def warm_up(base_url: str, args: dict[str, str], tasks: list[str], limit: int | None, level: int) -> None:
    """Every prompt through the server once, one new token each, before any timed run; its results are discarded.

    vLLM caches prompt prefixes by default, so without this the first timed run to meet a prompt pays its prefill
    alone and every later run, of either side, finds it cached: the first side of round 1 would look slower."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="decodebench-warm-up-") as scratch:
        LmEvalRun(
            model="baseline",
            model_args=level_args(args, base_url, level),
            tasks=tasks,
            output_path=Path(scratch),
            limit=limit,
            gen_kwargs="max_gen_toks=1",
        ).run_or_raise("warm-up: every prompt once, untimed, so that no timed run fills the prefix cache alone")


def run_levels(
    model: str,
    method_args: dict[str, str],
    baseline_args: dict[str, str],
    base_url: str,
    levels: list[int],
    tasks: list[str],
    out: Path,
    rounds: int,
    limit: int | None,
    gen_kwargs: str | None,
) -> dict[int, list[dict[str, Path]]]:
    """{level: [{"baseline": results, "method": results} per round]}, taken in alternating orders after one
    untimed warm-up pass (``warm_up``)."""
    produced: dict[int, list[dict[str, Path]]] = {level: [] for level in levels}
    warm_up(base_url, baseline_args, tasks, limit, max(levels))
    for number in range(rounds):
        order = levels if number % 2 == 0 else levels[::-1]
        for position, level in enumerate(order):
            files = {}
            for side in SIDES if (number + position) % 2 == 0 else SIDES[::-1]:
                run = LmEvalRun(
                    model="baseline" if side == "baseline" else model,
                    model_args=level_args(baseline_args if side == "baseline" else method_args, base_url, level),
                    tasks=tasks,
                    output_path=out / f"round-{number + 1}" / f"concurrency-{level}" / side,
                    limit=limit,
                    gen_kwargs=gen_kwargs,
                )
                files[side] = run.run_or_raise(f"[round {number + 1}/{rounds}, {level} in flight] {side}")
            produced[level].append(files)
    return produced


def summarize(produced: dict[int, list[dict[str, Path]]]) -> dict[int, dict[str, dict]]:
    """Per level and task: throughput of each side, the paired ratio with its interval, latency percentiles,
    server counters, and quality from the first round."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import metric_cells
    from decodebench.stats import speed_ratio_interval

    summary: dict[int, dict[str, dict]] = {}
    for level, rounds in produced.items():
        runs = [{side: read_run(path) for side, path in files.items()} for files in rounds]
        summary[level] = {}
        for task, method_task in runs[0]["method"].tasks.items():
            measured = [{side: run[side].tasks[task].measurement or {} for side in SIDES} for run in runs]
            tokens = {side: [m[side].get("new_tokens") or 0 for m in measured] for side in SIDES}
            seconds = {side: [m[side].get("generate_seconds") or 0.0 for m in measured] for side in SIDES}
            ratio, interval = speed_ratio_interval(
                tokens["method"], seconds["method"], tokens["baseline"], seconds["baseline"]
            )
            baseline_task = runs[0]["baseline"].tasks.get(task)
            cells, notes = metric_cells(method_task, baseline_task)
            base_cells, _ = metric_cells(baseline_task, None) if baseline_task else ({}, [])
            summary[level][task] = {
                "throughput": {side: sum(tokens[side]) / sum(seconds[side]) for side in SIDES},
                "throughput_ratio": ratio,
                "throughput_ratio_interval": interval.as_list() if len(runs) > 1 else None,
                "rounds": len(runs),
                "latency": {
                    side: {key: measured[0][side].get(key) for key in ("ttft_s", "tpot_s", "itl_s", "latency_s")}
                    for side in SIDES
                },
                "engine": {side: measured[0][side].get("engine") for side in SIDES},
                "quality": {
                    name: {"value": cell.value, "interval": cell.interval, "vs_baseline": cell.comparison}
                    for name, cell in cells.items()
                },
                "baseline_quality": {n: {"value": c.value, "interval": c.interval} for n, c in base_cells.items()},
                "n": method_task.n,
                "notes": notes,
            }
    return summary


def markdown(summary: dict[int, dict[str, dict]], model: str, rounds: int) -> str:
    from decodebench.reports.tables import bound_text, p_text

    def ms(values: dict | None) -> str:
        if not values:
            return "-"
        return "/".join(f"{1000 * values[p]:.0f}" for p in ("p50", "p90", "p99") if values.get(p) is not None)

    lines = [
        f"# {model} against the baseline through one server, {rounds} round(s) in alternating order",
        "",
        "Throughput: output tokens over the task's wall time; the ratio is paired per round. TTFT, TPOT: "
        "p50/p90/p99 in ms (baseline | method).",
        "",
        "| in flight | task | baseline tokens/s | method tokens/s | ratio [95% CI] | TTFT (ms) | TPOT (ms) "
        "| quality: method vs baseline [95% interval], p |",
        "|---:|---|---:|---:|---|---|---|---|",
    ]
    for level, tasks in summary.items():
        for task, row in tasks.items():
            interval = row["throughput_ratio_interval"]
            ratio = f"{row['throughput_ratio']:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
            latency = row["latency"]
            ttft = f"{ms(latency['baseline']['ttft_s'])} \\| {ms(latency['method']['ttft_s'])}"
            tpot = f"{ms(latency['baseline']['tpot_s'])} \\| {ms(latency['method']['tpot_s'])}"
            quality = []
            for metric, cell in row["quality"].items():
                comparison = cell["vs_baseline"]
                if cell["value"] is None or not comparison:
                    continue
                low, high = comparison["interval"]
                quality.append(
                    f"{metric} {cell['value']:.3f}, {comparison['difference']:+.3f} [{bound_text(low)}, "
                    f"{bound_text(high)}] {p_text(comparison)}"
                )
                break  # the task's first metric: its primary one for decodebench's tasks
            lines.append(
                f"| {level} | {task} | {row['throughput']['baseline']:.1f} | {row['throughput']['method']:.1f} "
                f"| {ratio} | {ttft} | {tpot} | {'; '.join(quality) or '-'} |"
            )
    return "\n".join(lines) + "\n"


@exit_codes
def run_sweep(
    model: str,
    model_args: str | None,
    baseline_args: str | None,
    base_url: str,
    concurrency: str,
    tasks: str,
    out: str,
    rounds: int,
    limit: int | None,
    gen_kwargs: str | None,
) -> int:
    try:
        levels = [int(level) for level in concurrency.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise UsageError(f"--concurrency {concurrency!r}: comma-separated whole numbers >= 1, e.g. 1,4,16")
    as_run = functools.partial(level_args, base_url=base_url, level=levels[0])
    method_args, base_args = checked_sides(model, model_args, baseline_args, rounds, as_run)
    out_dir = Path(out).resolve()
    produced = run_levels(
        model, method_args, base_args, base_url, levels, tasks.split(","), out_dir, rounds, limit, gen_kwargs
    )
    summary = summarize(produced)
    from decodebench.reports.tables import finite

    (out_dir / "sweep.md").write_text(markdown(summary, model, rounds))
    (out_dir / "sweep.json").write_text(json.dumps(finite(summary), indent=2, allow_nan=False) + "\n")
    print("\n" + markdown(summary, model, rounds))
    print(f"written to {out_dir / 'sweep.md'}; `decodebench report {out_dir}` draws throughput against latency")
    return 0
