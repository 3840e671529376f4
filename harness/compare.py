"""``decodebench compare``: a method against its baseline, measured so that noise cannot fake a speed-up.

On a shared or noisy machine two runs taken at different times differ by more than most
decoding methods change speed. This command runs the baseline and the method through the real
``lm_eval`` in interleaved rounds (A B A B ...), same model, tasks, limit, generation kwargs and
batch size, and reports per task the speed ratio of each round (method tokens/s over the
baseline's of the same round) as its median and range, next to quality from the same generations:
the paired difference on the documents, its 95% interval and p-value, from the first round's
samples logs (greedy generations repeat exactly; other rounds only add timing).

    decodebench compare --model lz --tasks squad_mini --limit 30 --rounds 3 --out results/compare
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from decodebench.runs import LmEvalRun


def parse_model_args(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    pairs = [pair.split("=", 1) for pair in text.split(",") if pair]
    bad = [pair[0] for pair in pairs if len(pair) != 2]
    if bad:
        raise ValueError(f"model arguments are key=value pairs separated by commas; not understood: {bad}")
    return dict(pairs)


def backend_args(model: str, model_args: dict[str, str]) -> dict[str, str]:
    """The method's arguments that are not its own (pretrained, backend, engine settings): the baseline's."""
    from decodebench.models.registry import load_method, methods

    registered = methods()
    if model not in registered:
        raise ValueError(f"--model {model} is not a decodebench method; known: {', '.join(sorted(registered))}")
    own = {option.name for option in load_method(registered[model]).Config.options()}
    return {key: value for key, value in model_args.items() if key not in own}


def run_rounds(
    model: str,
    model_args: dict[str, str],
    baseline_args: dict[str, str],
    tasks: list[str],
    out: Path,
    rounds: int,
    limit: int | None,
    batch_size: int | str,
    gen_kwargs: str | None,
) -> list[dict[str, Path]]:
    """The result files of each round: {"baseline": ..., "method": ...}, taken A B A B."""
    done = []
    for number in range(1, rounds + 1):
        produced = {}
        for side, name, args in (("baseline", "baseline", baseline_args), ("method", model, model_args)):
            run = LmEvalRun(
                model=name,
                model_args=args,
                tasks=tasks,
                output_path=out / f"round-{number}" / side,
                batch_size=batch_size,
                limit=limit,
                gen_kwargs=gen_kwargs,
            )
            produced[side] = run.run_or_raise(f"[round {number}/{rounds}] {side}")
        done.append(produced)
    return done


def summarize(rounds: list[dict[str, Path]]) -> dict[str, dict]:
    """Per task: the speed ratio of each round, its median and range, and quality from round 1."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import metric_cells

    first = {side: read_run(path) for side, path in rounds[0].items()}
    summary = {}
    for task, method_task in first["method"].tasks.items():
        ratios = []
        for produced in rounds:
            method = read_run(produced["method"]).tasks[task].measurement or {}
            base = read_run(produced["baseline"]).tasks[task].measurement or {}
            if method.get("tokens_per_second") and base.get("tokens_per_second"):
                ratios.append(method["tokens_per_second"] / base["tokens_per_second"])
        cells, notes = metric_cells(method_task, first["baseline"].tasks.get(task))
        summary[task] = {
            "speed_ratios": ratios,
            "speed_ratio_median": statistics.median(ratios) if ratios else None,
            "speed_ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "quality": {
                name: {"value": cell.value, "interval": cell.interval, "vs_baseline": cell.comparison}
                for name, cell in cells.items()
            },
            "baseline_quality": {
                name: value for name, value in first["baseline"].tasks[task].metrics.items() if value is not None
            },
            "n": method_task.n,
            "notes": notes,
        }
    return summary


def markdown(summary: dict[str, dict], model: str, model_args: dict, rounds: int) -> str:
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    lines = [
        f"# {model}{f' ({args})' if args else ''} against the baseline, {rounds} interleaved round(s)",
        "",
        "| task | n | speed ratio: median [range] | metric | method [95% interval] | baseline "
        "| paired difference [95% interval] | p |",
        "|---|---:|---|---|---|---:|---|---:|",
    ]
    for task, row in summary.items():
        ratio = (
            f"{row['speed_ratio_median']:.2f}x [{row['speed_ratio_range'][0]:.2f}, {row['speed_ratio_range'][1]:.2f}]"
            if row["speed_ratios"]
            else "not measured"
        )
        for metric, cell in row["quality"].items():
            value = "-" if cell["value"] is None else f"{cell['value']:.3f}"
            if cell["interval"]:
                value += f" [{cell['interval'][0]:.3f}, {cell['interval'][1]:.3f}]"
            base = row["baseline_quality"].get(metric)
            comparison = cell["vs_baseline"]
            difference = (
                f"{comparison['difference']:+.3f} [{comparison['interval'][0]:+.3f}, {comparison['interval'][1]:+.3f}]"
                if comparison
                else "-"
            )
            p_value = f"{comparison['p_value']:.3g}" if comparison else "-"
            base_text = f"{base:.3f}" if base is not None else "-"
            lines.append(
                f"| {task} | {row['n']} | {ratio} | {metric} | {value} | {base_text} | {difference} | {p_value} |"
            )
            ratio = ""  # the ratio once per task
    return "\n".join(lines) + "\n"


def run_compare(
    model: str,
    model_args: str | None,
    baseline_args: str | None,
    tasks: str,
    out: str,
    rounds: int,
    limit: int | None,
    batch_size: str,
    gen_kwargs: str | None,
) -> int:
    if rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        method_args = parse_model_args(model_args)
        base_args = parse_model_args(baseline_args) or backend_args(model, method_args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(out).resolve()
    try:
        rounds_done = run_rounds(
            model, method_args, base_args, tasks.split(","), out_dir, rounds, limit, batch_size, gen_kwargs
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = summarize(rounds_done)
    text = markdown(summary, model, method_args, rounds)
    (out_dir / "compare.md").write_text(text)
    (out_dir / "compare.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    print("\n" + text)
    print(f"written to {out_dir / 'compare.md'} and compare.json; `decodebench report {out_dir}` makes a leaderboard")
    return 0
