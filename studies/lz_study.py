"""The LZ penalty study in the paper's setting: repetition and task score across temperatures and seeds.

``tox -e lz-study`` (``python studies/lz_study.py``) runs the real ``lm_eval`` command on vLLM's
CPU build with the embedded model over ``aime_mini`` (real AIME 2024 and 2025 problems, chain of
thought), sampling as the paper does (section 4.1: top-p 0.95, top-k 40, the Qwen team's
settings) over a temperature sweep (0, i.e. greedy, 0.5 and 1.0) and several seeds per sampling
temperature, for: no penalty, the frequency penalty, the repetition penalty, and the LZ penalty
(alpha 0.15, window 512, buffer 32, the paper's) with each codelength: the authors' released
penalizer and the paper's propositions. It writes docs/lz-study.md: per penalty and temperature,
the mean and standard deviation over seeds of the exact-match score, the degenerate-repetition
rate (the paper's: any unit repeated at least 20 times back to back) and the share of
generations that hit the length limit.

The paper averages 5 runs of two 14B-32B reasoning models with up to 24k tokens; what is cut to
fit about an hour on two CPU cores is said in the document (``--limit``, ``--seeds``,
``--max-gen-toks``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, write_doc

from decodebench.commands.runs import LmEvalRun
from decodebench.measure.machine import short_name


@dataclass(frozen=True)
class Setting:
    name: str
    model_args: dict


SETTINGS = [
    Setting("none", {"penalty": "none"}),
    Setting("frequency 0.3", {"penalty": "frequency", "strength": 0.3}),
    Setting("repetition 1.2", {"penalty": "repetition", "strength": 1.2}),
    Setting("LZ 0.15, authors' codelength", {"penalty": "lz", "strength": 0.15, "codelength": "authors"}),
    Setting("LZ 0.15, propositions' codelength", {"penalty": "lz", "strength": 0.15, "codelength": "propositions"}),
]
TEMPERATURES = (0.0, 0.5, 1.0)
TASK = "aime_mini"
# Engine settings for vLLM on a CPU: a small memory share, and eager mode (no ~45 s compile).
VLLM_ARGS = {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "enforce_eager": True}


def gen_kwargs(temperature: float, max_gen_toks: int | None) -> str:
    sampling = (
        "do_sample=false" if temperature == 0 else f"do_sample=true,temperature={temperature},top_p=0.95,top_k=40"
    )
    return sampling + (f",max_gen_toks={max_gen_toks}" if max_gen_toks else "")


def run_study(
    out: str | Path = "results/lz-study",
    doc: str | Path = "docs/lz-study.md",
    limit: int | None = None,
    max_gen_toks: int | None = None,
    seeds: int = 2,
    batch_size: str = "auto",
    temperatures: tuple[float, ...] = TEMPERATURES,
) -> int:
    out = Path(out).resolve()
    started = time.time()
    runs: dict[tuple[str, float], list[Path]] = {}
    plan = [
        (setting, temperature, seed)
        for setting in SETTINGS
        for temperature in temperatures
        for seed in (range(1) if temperature == 0 else range(seeds))  # greedy needs one run
    ]
    for number, (setting, temperature, seed) in enumerate(plan, 1):
        # the folder names everything that changes a run, so that a rerun reuses only identical runs
        name = f"{setting.name}-t{temperature:g}-s{seed}-limit{limit or 'all'}-max{max_gen_toks or 'task'}"
        folder = out / name.replace(" ", "-").replace(",", "").replace("'", "")
        found = sorted(folder.glob("**/results_*.json"))
        if found:  # a rerun reuses finished runs (delete a folder to redo it)
            runs.setdefault((setting.name, temperature), []).append(found[-1])
            continue
        run = LmEvalRun(
            model="lz",
            model_args={
                "backend": "vllm",
                "pretrained": "embedded",
                "seed": 1234 + seed,
                **setting.model_args,
                **VLLM_ARGS,
            },
            tasks=[TASK],
            output_path=folder,
            batch_size=batch_size,
            limit=limit,
            gen_kwargs=gen_kwargs(temperature, max_gen_toks),
        )
        results = run.run_or_raise(f"[{number}/{len(plan)}] {setting.name} at temperature {temperature:g}")
        runs.setdefault((setting.name, temperature), []).append(results)
    text = study_table(runs, limit, max_gen_toks, seeds, temperatures, time.time() - started)
    return write_doc(doc, text)


def _spread(values: list[float], percent: bool = False) -> str:
    scale, unit = (100, "%") if percent else (1, "")
    mean = statistics.mean(values) * scale
    if len(values) < 2:
        return f"{mean:.1f}{unit}" if percent else f"{mean:.3f}"
    std = statistics.stdev(values) * scale
    return f"{mean:.1f} ± {std:.1f}{unit}" if percent else f"{mean:.3f} ± {std:.3f}"


def study_table(runs: dict, limit, max_gen_toks, seeds: int, temperatures, seconds: float) -> str:
    sampled = [f"{t:g}" for t in temperatures if t > 0]
    first = json.loads(next(iter(runs.values()))[0].read_text())
    info = first["config"]["decodebench"]
    n = first["n-samples"][TASK]["effective"]
    lines = [
        "# LZ penalty study: repetition and task score across temperatures, in the paper's sampling setting",
        "",
        "Written by `python studies/lz_study.py"
        + (f" --limit {limit}" if limit else "")
        + (f" --max-gen-toks {max_gen_toks}" if max_gen_toks else "")
        + f" --seeds {seeds}"
        + (f" --temperatures {','.join(f'{t:g}' for t in temperatures)}" if temperatures != TEMPERATURES else "")
        + "` (`tox -e lz-study`)"
        + f" on {datetime.now(UTC):%Y-%m-%d} "
        f"({seconds / 60:.0f} min of new runs).",
        "",
        f"- model: the embedded SmolLM2-135M-Instruct on vLLM's CPU build, chat template; machine: "
        f"{short_name(info['machine'])}",
        f"- task: `{TASK}`, n = {n} real AIME problems per run, up to {max_gen_toks or 1024} new tokens; score = "
        "lm-eval's AIME exact match",
        "- sampling: top-p 0.95 and top-k 40 (the paper's), temperature 0 = greedy (one run), "
        f"{' and '.join(sampled)} with {seeds} seeds each; cells are mean ± standard deviation over seeds",
        "- degenerate = one unit repeated back to back at least 20 times, or a drifting chain of such loops "
        "(decodebench.metrics.degenerate_repetition); hit max length = share of generations cut by the limit",
        "- LZ: alpha 0.15, window 512, buffer 32 (the paper's); `authors' codelength` is the authors' released "
        "SGLang penalizer (the default), `propositions' codelength` the paper's propositions 1-2",
        "- cut to fit about an hour on two CPU cores (the paper: 5 runs, 24k tokens, 14B-32B reasoning models): "
        f"{seeds} seeds, temperatures {', '.join(f'{t:g}' for t in temperatures)}, {n} problems, "
        f"{max_gen_toks or 1024} tokens, one strength per baseline penalty",
        "",
        "| penalty | temperature | exact match | degenerate rate | hit max length | mean new tokens | runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for setting in SETTINGS:
        for temperature in temperatures:
            paths = runs.get((setting.name, temperature), [])
            if not paths:
                continue
            scores, degenerate, length, tokens = [], [], [], []
            for path in paths:
                results = json.loads(path.read_text())
                stats = results["config"]["decodebench"]["tasks"][TASK]
                scores.append(results["results"][TASK]["exact_match,none"])
                degenerate.append(results["results"][TASK]["degenerate_repetition,none"])
                length.append(stats["finish_reasons"]["length"] / stats["requests"])
                tokens.append(stats["new_tokens"] / stats["requests"])
            lines.append(
                f"| {setting.name} | {temperature:g} | {_spread(scores)} | {_spread(degenerate, True)} "
                f"| {_spread(length, True)} | {statistics.mean(tokens):.0f} | {len(paths)} |"
            )
    lines += [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/lz-study.md")
    parser.add_argument("--out", default="results/lz-study", help="lm_eval output folder (finished runs are reused)")
    parser.add_argument("--limit", type=int, default=None, help="problems per run (default: all 60)")
    parser.add_argument("--max-gen-toks", type=int, default=None, help="override the task's 1024 new tokens")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per sampling temperature (default 2)")
    parser.add_argument("--batch-size", default="auto", help="lm_eval --batch_size (default auto)")
    parser.add_argument(
        "--temperatures",
        type=lambda text: tuple(float(t) for t in text.split(",")),
        default=TEMPERATURES,
        help="comma-separated; 0 is greedy (default 0,0.5,1)",
    )
    args = parser.parse_args(argv)
    if any(not 0 <= t <= 2 for t in args.temperatures):
        parser.error(f"temperatures must lie in [0, 2], got {args.temperatures}")
    return run_study(args.out, args.doc, args.limit, args.max_gen_toks, args.seeds, args.batch_size, args.temperatures)


if __name__ == "__main__":
    raise SystemExit(main())
