"""Served decoding under load: the baseline and LZ through `vllm serve` at several numbers of requests in flight.

``tox -e served-bench`` (``python studies/served_bench.py``) starts ``decodebench serve`` (vLLM's CPU build here,
the embedded model, vLLM's own defaults otherwise), runs ``decodebench sweep`` for ``--model lz`` at 1, 4 and 16
requests in flight on the bundled squad_mini questions, keeps every run's results and scored samples in
docs/data/benchmarks/served-concurrency/ and writes docs/benchmarks/served-concurrency.md from them: per level,
quality with its interval
and the paired test against the baseline, throughput and the ratio paired per round, and TTFT, TPOT and ITL
percentiles, as ``vllm bench serve`` defines them (docs/served.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import common
from common import keep_sweep_runs, load_json, load_study_main, record_run, run_header, serving

DOC = "docs/benchmarks/served-concurrency.md"
LEVELS = (1, 4, 16)
SERVER_ARGS = ("--max-model-len", "2048", "--seed", "0")


def collect(folder: Path, argv: list[str], limit: int, rounds: int, max_gen_toks: int, out: str) -> None:
    from decodebench.commands.sweep import Level, run_levels

    started = time.time()
    with serving(*SERVER_ARGS) as base_url:
        produced = run_levels(
            "lz",
            {"pretrained": "embedded"},
            {"pretrained": "embedded"},
            base_url,
            [Level("concurrency", level) for level in LEVELS],
            ["squad_mini"],
            Path(out).resolve(),
            rounds,
            limit,
            f"max_gen_toks={max_gen_toks}",
        )
    keep_sweep_runs(produced, folder)
    record_run(
        folder, __file__, argv, started, levels=list(LEVELS), limit=limit, max_gen_toks=max_gen_toks, warm_up=True
    )


LZ_BUFFER = 32  # the LZ penalty's default look-ahead buffer (models/lz/config.py), the run's


def render(folder: Path) -> str:
    from decodebench.commands.sweep import SIDES, read_levels, summarize
    from decodebench.reports.tables import bound_text, p_text

    run = load_json(folder, "run.json")
    summary = summarize(read_levels(folder))

    lines = [
        *run_header(folder, "Served decoding under load: the baseline and LZ through vllm serve", "served-bench"),
        f"`decodebench serve` (vLLM's CPU build, the embedded model, `{' '.join(SERVER_ARGS)}`), then `decodebench "
        f"sweep --model lz` at {', '.join(map(str, run['levels']))} requests in flight on squad_mini (n = "
        f"{run['limit']} real SQuAD questions, greedy, chat template, up to {run['max_gen_toks']} new tokens): the "
        "levels forwards, then backwards, and within a level the baseline and LZ (alpha 0.15, window 512, buffer "
        f"{LZ_BUFFER}) alternating. Every request streamed and measured as `vllm bench serve` defines it; times in "
        "ms as p50/p90/p99; throughput is output tokens over the task's wall time, its ratio paired per round with the "
        "95% interval over rounds (Student's t on the rounds' log ratios); quality: normalized accuracy [95% Wilson "
        "interval] and the paired difference from the baseline [its interval] with McNemar's exact p.",
        "",
        "| in flight | run | quality [95% CI] | vs baseline | tokens/s | LZ / baseline [95% CI] | TTFT (ms) "
        "| TPOT (ms) | ITL (ms) |",
        "|---:|---|---|---|---:|---|---|---|---|",
    ]
    for tasks in summary.values():
        row = tasks["squad_mini"]
        level = f"{row['load']['value']:g}"  # requests in flight
        interval = row["throughput_ratio_interval"]
        ratio = f"{row['throughput_ratio']:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
        for side in SIDES:
            cell = row["quality" if side == "method" else "baseline_quality"]["normalized_accuracy"]
            quality = f"{cell['value']:.3f} [{cell['interval'][0]:.3f}, {cell['interval'][1]:.3f}]"
            versus = "-"
            if side == "method" and (c := cell["vs_baseline"]):
                low, high = bound_text(c["interval"][0]), bound_text(c["interval"][1])
                versus = f"{c['difference']:+.3f} [{low}, {high}] {p_text(c)}"
            latency = row["latency"][side]
            name, shown_ratio = ("LZ", ratio) if side == "method" else ("baseline", "")
            times = " | ".join(common.ms_percentiles(latency[key]) for key in ("ttft_s", "tpot_s", "itl_s"))
            lines.append(
                f"| {level} | {name} | {quality} | {versus} | {row['throughput'][side]:.1f} | {shown_ratio} | {times} |"
            )
    rounds = next(iter(summary.values()))["squad_mini"]["rounds"]
    lines += [
        "",
        f"Throughput ratios over {rounds} rounds. Greedy answers need not be the same at every level: the engine "
        "computes in bfloat16 here, and a batch of another size flips a near-tie of greedy decoding now and then "
        "(the served tests compare answers in float32, where they agree with the in-process engine's). What the load "
        "changes is how the server's batching trades time per token and to the first token for throughput. MTAD "
        "and vLLM's speculative decoding served at the same loads: docs/benchmarks/mtad-vllm.md; in open loop, at "
        "request rates, with goodput under a latency objective: docs/benchmarks/served.md.",
        "",
    ]
    if not run.get("warm_up"):
        lines += [common.COLD_CACHE_NOTE, ""]
    if run["max_gen_toks"] <= LZ_BUFFER:
        lines[-1:-1] = [
            "",
            f"LZ cannot change an answer here: the authors' penalizer charges nothing before more than its buffer "
            f"({LZ_BUFFER} tokens) has been generated, and no answer is longer than {run['max_gen_toks']} tokens. So "
            "the quality columns agree by construction, and the ratio is what the penalty's processor costs the "
            "server under load; what the penalty does to long generations is docs/lz-study.md.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return load_study_main(
        argv, __doc__, DOC, collect, render, limit=32, rounds=4, max_gen_toks=32, out="results/served-bench"
    )


if __name__ == "__main__":
    raise SystemExit(main())
