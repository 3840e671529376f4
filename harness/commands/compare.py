"""``decodebench compare``: a method against its baseline, measured so that noise cannot fake a speed-up.

On a shared or noisy machine two runs taken at different times differ by more than most
decoding methods change speed. This command checks both sides' arguments, then runs the baseline
and the method through the real ``lm_eval`` in rounds whose order alternates (baseline then
method, then method then baseline, ...), same model, tasks, limit, generation kwargs and batch
size, and reports per task:

- the speed ratio paired per document: each document's new tokens and seconds summed over the
  rounds on each side (from the samples logs), the method's tokens/s over the baseline's, with the
  95% bootstrap interval over documents (decodebench.stats.speed_ratio_interval); each round's
  own ratio is listed beside it;
- quality from the same generations (the first round's samples logs; greedy generations repeat
  exactly): the paired difference on the documents, the interval that agrees with its test, and p.

    decodebench compare --model lz --tasks squad_mini --limit 30 --rounds 4 --out results/compare
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from decodebench.commands.runs import LmEvalRun
from decodebench.commands.sides import SIDES, checked_sides, exit_codes
from decodebench.reports.reader import read_text


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
    """The result files of each round: {"baseline": ..., "method": ...}, the order alternating by round."""
    done = []
    for number in range(1, rounds + 1):
        produced = {}
        for side in SIDES if number % 2 else SIDES[::-1]:
            run = LmEvalRun(
                model="baseline" if side == "baseline" else model,
                model_args=baseline_args if side == "baseline" else model_args,
                tasks=tasks,
                output_path=out / f"round-{number}" / side,
                batch_size=batch_size,
                limit=limit,
                gen_kwargs=gen_kwargs,
            )
            produced[side] = run.run_or_raise(f"[round {number}/{rounds}] {side}")
        done.append(produced)
    return done


def samples(task):
    """Each document's sample of a run's task, from its samples log, under the first filter it names (the
    generations and decodebench's records are the same under every filter): ``(doc_id, doc_hash), sample``."""
    if task.samples_file is None:
        return
    seen_filter = None
    for line in read_text(task.samples_file).splitlines():
        if not line.strip():
            continue
        sample = json.loads(line)
        seen_filter = seen_filter or sample.get("filter")
        if sample.get("filter") == seen_filter:
            yield (sample.get("doc_id"), sample.get("doc_hash")), sample


def per_document_speed(task) -> dict[tuple, tuple[int, float]]:
    """(new tokens, seconds) of each document of a run's task, from its samples log; a request's seconds are
    its batch window's split evenly over the batch (at batch size 1, its own)."""
    out: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for key, sample in samples(task):
        for record in sample.get("decodebench") or []:
            out[key][0] += record["new_tokens"]
            out[key][1] += record["latency_s"] / max(1, record.get("batch_size") or 1)
    return {key: (tokens, seconds) for key, (tokens, seconds) in out.items()}


def identical_generations(task, base_task) -> tuple[int, int]:
    """(documents whose generations are exactly the baseline's, documents whose generations both runs logged)."""
    method = {key: sample["resps"] for key, sample in samples(task) if sample.get("resps") is not None}
    base = {key: sample["resps"] for key, sample in samples(base_task) if sample.get("resps") is not None}
    both = set(method) & set(base)
    return sum(method[key] == base[key] for key in both), len(both)


def summarize(rounds: list[dict[str, Path]]) -> dict[str, dict]:
    """Per task that every round ran: the speed ratio paired per document over all rounds with its interval, each
    round's ratio, and quality from round 1 with its paired comparison and how many generations are the
    baseline's."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import metric_cells
    from decodebench.stats import speed_ratio_interval

    runs = [{side: read_run(path) for side, path in produced.items()} for produced in rounds]
    first = runs[0]
    summary = {}
    for task, method_task in first["method"].tasks.items():
        if any(task not in produced[side].tasks for produced in runs for side in SIDES):
            continue
        totals = {side: defaultdict(lambda: [0, 0.0]) for side in SIDES}
        round_ratios = []
        for produced in runs:
            speeds = {side: per_document_speed(produced[side].tasks[task]) for side in SIDES}
            for side in SIDES:
                for key, (tokens, seconds) in speeds[side].items():
                    totals[side][key][0] += tokens
                    totals[side][key][1] += seconds
            method_tps = (produced["method"].tasks[task].measurement or {}).get("tokens_per_second")
            base_tps = (produced["baseline"].tasks[task].measurement or {}).get("tokens_per_second")
            round_ratios.append(method_tps / base_tps if method_tps and base_tps else None)
        documents = sorted(set(totals["method"]) & set(totals["baseline"]), key=str)
        documents = [d for d in documents if all(totals[side][d][1] > 0 for side in SIDES)]
        ratio = interval = None
        if documents:
            ratio, found = speed_ratio_interval(
                *([totals[side][d][k] for d in documents] for side in ("method", "baseline") for k in (0, 1))
            )
            interval = found.as_list()
        cells, notes = metric_cells(method_task, first["baseline"].tasks.get(task))
        summary[task] = {
            "speed_ratio": ratio,
            "speed_ratio_interval": interval,
            "speed_ratio_documents": len(documents),
            "round_speed_ratios": round_ratios,
            "quality": {
                name: {"value": cell.value, "interval": cell.interval, "vs_baseline": cell.comparison}
                for name, cell in cells.items()
            },
            "baseline_quality": {
                name: value for name, value in first["baseline"].tasks[task].metrics.items() if value is not None
            },
            "identical_generations": identical_generations(method_task, first["baseline"].tasks[task]),
            "n": method_task.n,
            "notes": notes,
        }
    return summary


def speed_interval_calibrated(row: dict) -> bool:
    """Whether a summarized row's speed-ratio interval may be shown: a bootstrap over fewer than APPROXIMATE_BELOW
    documents is not calibrated (compare.md and the main job's words both follow this)."""
    from decodebench.stats import APPROXIMATE_BELOW

    return row["speed_ratio_interval"] is not None and row["speed_ratio_documents"] >= APPROXIMATE_BELOW


def markdown(summary: dict[str, dict], model: str, model_args: dict, rounds: int) -> str:
    from decodebench.reports.tables import APPROXIMATE_BELOW, bound_text, p_text

    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    lines = [
        f"# {model}{f' ({args})' if args else ''} against the baseline, {rounds} round(s) in alternating order",
        "",
        "Speed ratio: the method's tokens/s over the baseline's, paired per document (each document's tokens and "
        "seconds summed over the rounds on each side), with its 95% bootstrap interval over documents; below "
        f"{APPROXIMATE_BELOW} documents none is shown (no CI: a bootstrap over so few is not calibrated; read the "
        "rounds' ratios, and run more documents to tell a speed difference).",
        "",
        "| task | n | speed ratio [95% CI] | per round | same generations | metric | method [95% interval] "
        "| baseline | paired difference [95% CI] | p |",
        "|---|---:|---|---|---:|---|---|---:|---|---:|",
    ]
    for task, row in summary.items():
        if row["speed_ratio"] is not None:
            if speed_interval_calibrated(row):
                low, high = row["speed_ratio_interval"]
                ratio = f"{row['speed_ratio']:.2f}x [{low:.2f}, {high:.2f}]"
            else:
                ratio = f"{row['speed_ratio']:.2f}x (no CI, n < {APPROXIMATE_BELOW})"
            if row["speed_ratio_documents"] != row["n"]:  # documents with no timed generation are left out
                ratio += f" ({row['speed_ratio_documents']} documents)"
        else:
            ratio = "not measured"
        per_round = ", ".join(f"{r:.2f}x" if r is not None else "-" for r in row["round_speed_ratios"])
        same = "{} of {}".format(*row["identical_generations"])
        for metric, cell in row["quality"].items():
            value = "-" if cell["value"] is None else f"{cell['value']:.3f}"
            if cell["interval"]:
                value += f" [{cell['interval'][0]:.3f}, {cell['interval'][1]:.3f}]"
            base = row["baseline_quality"].get(metric)
            comparison = cell["vs_baseline"]
            difference = (
                f"{comparison['difference']:+.3f} [{bound_text(comparison['interval'][0])}, "
                f"{bound_text(comparison['interval'][1])}]"
                if comparison
                else "-"
            )
            p_value = p_text(comparison) if comparison else "-"
            base_text = f"{base:.3f}" if base is not None else "-"
            lines.append(
                f"| {task} | {row['n']} | {ratio} | {per_round} | {same} | {metric} | {value} | {base_text} "
                f"| {difference} | {p_value} |"
            )
            ratio = per_round = same = ""  # once per task
    return "\n".join(lines) + "\n"


@exit_codes
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
    method_args, base_args = checked_sides(model, model_args, baseline_args, rounds)
    out_dir = Path(out).resolve()
    rounds_done = run_rounds(
        model, method_args, base_args, tasks.split(","), out_dir, rounds, limit, batch_size, gen_kwargs
    )
    summary = summarize(rounds_done)
    text = markdown(summary, model, method_args, rounds)
    (out_dir / "compare.md").write_text(text)
    from decodebench.reports.tables import finite

    (out_dir / "compare.json").write_text(json.dumps(finite(summary), indent=2, allow_nan=False) + "\n")
    print("\n" + text)
    print(f"written to {out_dir / 'compare.md'} and compare.json; `decodebench report {out_dir}` makes a leaderboard")
    return 0
