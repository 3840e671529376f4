"""``decodebench sweep``: a method and the baseline through one server at several loads.

Served decoding is judged at the load it will carry: this command runs ``--model M`` and ``--model baseline``
with ``backend=served`` against the same ``base_url`` at each load, numbers of requests in flight
(``--concurrency``, closed loop) or request rates (``--request-rates``, open loop: models/backends/served_load.py, with
GuideLLM's two ends by name: ``synchronous``, one request at a time, and ``throughput``, every request at once), in
rounds whose order alternates (the levels forwards, then backwards; within a level, baseline and method
alternating), through the real ``lm_eval``, after one untimed pass of every prompt (so that the server's prefix
cache holds them for every timed run alike). Per level it reports each side's throughput (tokens/s over the task's
wall time) and requests answered per second, the method's throughput over the baseline's paired per round with its
95% interval over rounds (Student's t on the rounds' log ratios), TTFT, TPOT and ITL percentiles, the server's
counters, and quality from the same generations with its paired test. With ``--slo``, each side's SLO attainment
(Wilson interval, n) and goodput per level, and, over request rates, the heaviest load at which each side kept
``--attainment`` of its requests within the objectives. ``decodebench report OUT`` draws
throughput against latency across the levels.

    decodebench sweep --model lz --base-url http://127.0.0.1:8000/v1 --concurrency 1,4,16 --tasks squad_mini
    decodebench sweep --model mtad --base-url ... --request-rates synchronous,0.5,1,2,throughput \\
        --slo 'ttft:2000;tpot:200' --tasks squad_mini
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from decodebench.commands.runs import LmEvalRun
from decodebench.commands.sides import SIDES, UsageError, checked_sides, exit_codes
from decodebench.reports.reader import results_files

# GuideLLM's two ends of a rate sweep, asked for by name in --request-rates: one request at a time, and every
# request at once (vllm bench serve's default rate, inf, kept finite: the highest rate the open loop takes)
SYNCHRONOUS, THROUGHPUT = "synchronous", "throughput"


@dataclass(frozen=True)
class Level:
    """One load of a sweep: ``value`` requests in flight (closed loop) or requests per second (open loop); or a
    sweep's ends, ``synchronous`` (one request in flight, the next sent as it finishes) and ``throughput`` (every
    request sent at once), which have no value."""

    kind: str  # "concurrency", "rate", SYNCHRONOUS or THROUGHPUT
    value: float | None = None
    load_args: tuple[tuple[str, str], ...] = ()  # burstiness, slo: the same at every level

    @property
    def name(self) -> str:
        if self.value is None:
            return self.kind
        return f"{self.value:g} in flight" if self.kind == "concurrency" else f"{self.value:g} req/s"

    @property
    def folder(self) -> str:
        return self.kind if self.value is None else f"{self.kind}-{self.value:g}"

    @property
    def order(self) -> tuple[int, float]:
        """Lightest load first: synchronous, then the values, then throughput."""
        return ({SYNCHRONOUS: 0, THROUGHPUT: 2}.get(self.kind, 1), self.value or 0)

    def args(self) -> dict[str, str]:
        from decodebench.models.backends.served_load import MAX_REQUEST_RATE

        shared = dict(self.load_args)
        if self.kind == SYNCHRONOUS:  # a closed loop: the open loop's arrival shape does not apply
            return {"num_concurrent": "1", **{k: v for k, v in shared.items() if k != "burstiness"}}
        if self.kind == THROUGHPUT:
            return {"request_rate": f"{MAX_REQUEST_RATE:g}", **shared}
        key = "num_concurrent" if self.kind == "concurrency" else "request_rate"
        return {key: f"{self.value:g}", **shared}

    @classmethod
    def from_folder(cls, name: str) -> Level:
        if name in (SYNCHRONOUS, THROUGHPUT):
            return cls(name)
        kind, _, value = name.partition("-")
        return cls(kind, float(value) if kind == "rate" else int(value))


def read_levels(folder: Path) -> dict[Level, list[dict[str, Path]]]:
    """A sweep's runs as ``summarize`` takes them, from its output folder (round-N/<level>/<side>/), the loads in
    increasing order."""
    produced: dict[Level, list[dict[str, Path]]] = {}
    for round_folder in sorted(folder.glob("round-*"), key=lambda p: int(p.name.split("-")[1])):
        for level_folder in round_folder.iterdir():
            files = {side.name: results_files(side)[0] for side in level_folder.iterdir()}
            produced.setdefault(Level.from_folder(level_folder.name), []).append(files)
    return dict(sorted(produced.items(), key=lambda item: item[0].order))


def level_args(args: dict[str, str], base_url: str, level: Level) -> dict[str, str]:
    return {**args, "backend": "served", "base_url": base_url, **level.args()}


def parse_levels(
    concurrency: str | None, request_rates: str | None, burstiness: str | None, slo: str | None
) -> list[Level]:
    """The sweep's loads, or a UsageError naming what is wrong and what is allowed."""
    import math

    from decodebench.models.backends.served_load import parse_slo

    if concurrency and request_rates:
        raise UsageError("give --concurrency (closed loop) or --request-rates (open loop), not both")
    if burstiness is not None and not request_rates:
        raise UsageError("--burstiness shapes an open loop's arrivals: give --request-rates with it")
    if slo is not None:
        try:
            parse_slo(slo)
        except ValueError as exc:
            raise UsageError(f"--slo: {exc}") from None
    extra = tuple((k, v) for k, v in (("burstiness", burstiness), ("slo", slo)) if v is not None)
    kind, text = ("rate", request_rates) if request_rates else ("concurrency", concurrency or "1,4,16")
    words = (SYNCHRONOUS, THROUGHPUT) if kind == "rate" else ()
    parts = [part.strip() for part in text.split(",")]
    try:
        values = [float(part) for part in parts if part not in words]
    except ValueError:
        values = [math.nan]  # not a number: refused below

    def allowed(value: float) -> bool:  # a rate is any finite number > 0, a concurrency a whole one >= 1
        return math.isfinite(value) and value > 0 and (kind == "rate" or (value == int(value) and value >= 1))

    from decodebench.models.backends.served_load import MAX_REQUEST_RATE

    named = [part for part in parts if part in words]
    if (not values and not named) or not all(allowed(value) for value in values) or len(set(named)) < len(named):
        if kind == "rate":
            raise UsageError(
                f"--request-rates {text!r}: comma-separated numbers > 0 (requests/s), and {SYNCHRONOUS!r} (one "
                f"request at a time) or {THROUGHPUT!r} (all at once) once each, e.g. {SYNCHRONOUS},0.5,1,2,{THROUGHPUT}"
            )
        raise UsageError(f"--concurrency {text!r}: comma-separated whole numbers >= 1, e.g. 1,4,16")
    if kind == "rate" and max(values, default=0) > MAX_REQUEST_RATE:
        raise UsageError(f"--request-rates {text!r}: at most {MAX_REQUEST_RATE:g} requests/s; {THROUGHPUT!r} sends all")
    levels = [Level(kind, value if kind == "rate" else int(value), extra) for value in values]
    levels += [Level(word, None, extra) for word in named]
    return sorted(levels, key=lambda level: level.order)


def warm_up(base_url: str, args: dict[str, str], tasks: list[str], limit: int | None, level: Level) -> None:
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
    levels: list[Level],
    tasks: list[str],
    out: Path,
    rounds: int,
    limit: int | None,
    gen_kwargs: str | None,
) -> dict[Level, list[dict[str, Path]]]:
    """{level: [{"baseline": results, "method": results} per round]}, taken in alternating orders after one
    untimed warm-up pass (``warm_up``)."""
    produced: dict[Level, list[dict[str, Path]]] = {level: [] for level in levels}
    # the warm-up at the sweep's heaviest load, as fast as the server takes it: its timing is not kept
    warm_up(base_url, baseline_args, tasks, limit, max(levels, key=lambda level: level.order))
    for number in range(rounds):
        order = levels if number % 2 == 0 else levels[::-1]
        for position, level in enumerate(order):
            files = {}
            for side in SIDES if (number + position) % 2 == 0 else SIDES[::-1]:
                run = LmEvalRun(
                    model="baseline" if side == "baseline" else model,
                    model_args=level_args(baseline_args if side == "baseline" else method_args, base_url, level),
                    tasks=tasks,
                    output_path=out / f"round-{number + 1}" / level.folder / side,
                    limit=limit,
                    gen_kwargs=gen_kwargs,
                )
                files[side] = run.run_or_raise(f"[round {number + 1}/{rounds}, {level.name}] {side}")
            produced[level].append(files)
    return produced


def summarize(produced: dict[Level, list[dict[str, Path]]]) -> dict[str, dict[str, dict]]:
    """Per level and task: throughput of each side, the paired ratio with its interval, latency percentiles,
    server counters, and quality from the first round."""
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import metric_cells
    from decodebench.stats import round_ratio_interval, speed_ratio_interval

    summary: dict[str, dict[str, dict]] = {}
    for level, rounds in produced.items():
        runs = [{side: read_run(path) for side, path in files.items()} for files in rounds]
        summary[level.name] = {}
        for task, method_task in runs[0]["method"].tasks.items():
            measured = [{side: run[side].tasks[task].measurement or {} for side in SIDES} for run in runs]
            tokens = {side: [m[side].get("new_tokens") or 0 for m in measured] for side in SIDES}
            seconds = {side: [m[side].get("generate_seconds") or 0.0 for m in measured] for side in SIDES}
            ratio, _ = speed_ratio_interval(
                tokens["method"], seconds["method"], tokens["baseline"], seconds["baseline"]
            )
            per_round = [
                (tokens["method"][i] / seconds["method"][i]) / (tokens["baseline"][i] / seconds["baseline"][i])
                for i in range(len(runs))
            ]
            baseline_task = runs[0]["baseline"].tasks.get(task)
            cells, notes = metric_cells(method_task, baseline_task)
            base_cells, _ = metric_cells(baseline_task, None) if baseline_task else ({}, [])
            requests = {side: [m[side].get("requests") or 0 for m in measured] for side in SIDES}
            summary[level.name][task] = {
                "load": {"kind": level.kind, "value": level.value},
                "throughput": {side: sum(tokens[side]) / sum(seconds[side]) for side in SIDES},
                # requests answered per second over the task's wall time: what a synchronous or throughput level
                # offered the server, which it does not fix in advance
                "requests_per_s": {side: sum(requests[side]) / sum(seconds[side]) for side in SIDES},
                # each side's SLO attainment over every round's requests (None without --slo)
                "slo": {side: pooled_slo([m[side].get("slo") for m in measured]) for side in SIDES},
                "throughput_ratio": ratio,
                # over rounds, the unit the load is paired on: t on the rounds' log ratios (few rounds)
                "throughput_ratio_interval": round_ratio_interval(per_round).as_list() if len(runs) > 1 else None,
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


def pooled_slo(per_round: list[dict | None]) -> dict | None:
    """One side's SLO attainment at one level, pooled over its rounds: met of n, the Wilson interval, goodput."""
    from decodebench.stats import wilson_interval

    rounds = [r for r in per_round if r]
    if not rounds:
        return None
    met, n = sum(r["met"] for r in rounds), sum(r["n"] for r in rounds)
    goodputs = [r["goodput_rps"] for r in rounds if r.get("goodput_rps") is not None]
    return {
        "objectives_s": rounds[0]["objectives_s"],
        "met": met,
        "n": n,
        "attainment": met / n if n else None,
        "attainment_interval": wilson_interval(met, n).as_list() if n else None,
        "goodput_rps": sum(goodputs) / len(goodputs) if goodputs else None,
    }


def highest_rate_kept(summary: dict[str, dict[str, dict]], attainment: float) -> dict[str, dict[str, dict]]:
    """Per task and side: the heaviest load of a rate sweep (synchronous, the rates, throughput) at which the side
    met the objectives for at least ``attainment`` of its requests: the level, its offered ``rate`` (None for the
    named ends), the requests/s it answered, and that level's attainment and interval (absent where none did)."""
    found: dict[str, dict[str, dict]] = {}
    for name, tasks in summary.items():
        for task, row in tasks.items():
            load = Level(row["load"]["kind"], row["load"]["value"])
            if load.kind == "concurrency":
                continue
            for side, slo in row["slo"].items():
                if not slo or slo["attainment"] is None or slo["attainment"] < attainment:
                    continue
                best = found.setdefault(task, {}).get(side)
                if best is None or load.order > Level(best["kind"], best["rate"]).order:
                    answered = (row.get("requests_per_s") or {}).get(side)
                    found[task][side] = {
                        "level": name, "kind": load.kind, "rate": load.value, "requests_per_s": answered, **slo
                    }  # fmt: skip
    return found


def markdown(summary: dict[str, dict[str, dict]], model: str, rounds: int, attainment: float = 0.9) -> str:
    from decodebench.reports.tables import bound_text, p_text

    def ms(values: dict | None) -> str:
        if not values:
            return "-"
        return "/".join(f"{1000 * values[p]:.0f}" for p in ("p50", "p90", "p99") if values.get(p) is not None)

    lines = [
        f"# {model} against the baseline through one server, {rounds} round(s) in alternating order",
        "",
        "Throughput: output tokens over the task's wall time; the ratio is paired per round. Requests answered per "
        "second over the same time, TTFT, TPOT: p50/p90/p99 in ms (baseline | method).",
        "",
        "| load | task | req/s answered | baseline tokens/s | method tokens/s | ratio [95% CI] | TTFT (ms) | TPOT (ms) "
        "| quality: method vs baseline [95% interval], p | SLO met, n [95% CI]; goodput req/s (baseline \\| method) |",
        "|---|---|---|---:|---:|---|---|---|---|---|",
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
            slo = " \\| ".join(slo_text(row["slo"][side]) for side in SIDES)
            answered = row.get("requests_per_s") or {}
            answered = " \\| ".join(f"{answered[side]:.2f}" if answered.get(side) else "-" for side in SIDES)
            lines.append(
                f"| {level} | {task} | {answered} | {row['throughput']['baseline']:.1f} "
                f"| {row['throughput']['method']:.1f} "
                f"| {ratio} | {ttft} | {tpot} | {'; '.join(quality) or '-'} | {slo} |"
            )
    kept = highest_rate_kept(summary, attainment)
    if kept:
        lines += [
            "",
            f"Heaviest load swept (synchronous, the rates, throughput) at which at least {attainment:.0%} of requests "
            "met every objective:",
            "",
        ]
        for task, sides in kept.items():
            for side in SIDES:
                best = sides.get(side)
                text = f"{kept_text(best)} ({slo_text(best)})" if best else "none of the loads swept"
                lines.append(f"- {task}, {side}: {text}")
    return "\n".join(lines) + "\n"


def kept_text(best: dict) -> str:
    """``2 req/s``, or a named end with what it answered: ``synchronous (0.93 req/s answered)``."""
    if best["rate"] is not None:
        return f"{best['rate']:g} req/s"
    answered = f" ({best['requests_per_s']:.2f} req/s answered)" if best.get("requests_per_s") else ""
    return f"{best['level']}{answered}"


def slo_text(slo: dict | None) -> str:
    if not slo or slo["attainment"] is None:
        return "-"
    low, high = slo["attainment_interval"]
    goodput = f"; {slo['goodput_rps']:.2f}" if slo.get("goodput_rps") is not None else ""
    return f"{slo['attainment']:.0%} of {slo['n']} [{low:.0%}, {high:.0%}]{goodput}"


@exit_codes
def run_sweep(
    model: str,
    model_args: str | None,
    baseline_args: str | None,
    base_url: str,
    concurrency: str | None,
    tasks: str,
    out: str,
    rounds: int,
    limit: int | None,
    gen_kwargs: str | None,
    request_rates: str | None = None,
    burstiness: str | None = None,
    slo: str | None = None,
    attainment: float = 0.9,
) -> int:
    levels = parse_levels(concurrency, request_rates, burstiness, slo)
    if not 0 < attainment <= 1:
        raise UsageError(f"--attainment {attainment}: a share in (0, 1], e.g. 0.9")
    as_run = functools.partial(level_args, base_url=base_url, level=levels[0])
    method_args, base_args = checked_sides(model, model_args, baseline_args, rounds, as_run)
    out_dir = Path(out).resolve()
    produced = run_levels(
        model, method_args, base_args, base_url, levels, tasks.split(","), out_dir, rounds, limit, gen_kwargs
    )
    summary = summarize(produced)
    from decodebench.reports.tables import finite

    text = markdown(summary, model, rounds, attainment)
    (out_dir / "sweep.md").write_text(text)
    kept = highest_rate_kept(summary, attainment)
    document = {"levels": summary, "highest_rate_kept": kept, "attainment": attainment}
    (out_dir / "sweep.json").write_text(json.dumps(finite(document), indent=2, allow_nan=False) + "\n")
    print("\n" + text)
    print(f"written to {out_dir / 'sweep.md'}; `decodebench report {out_dir}` draws throughput against latency")
    return 0
