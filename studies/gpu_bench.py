"""Every CUDA path decodebench has, run on the embedded model by one command (tox -e gpu): docs/benchmarks/gpu.md.

``python studies/gpu_bench.py`` (on a GPU machine without a network: the recipe in studies/gpu_wheelhouse.py) runs:

1. each method against the baseline through the real ``lm_eval``, on CUDA when there is one (lm-eval's default
   device), in rounds whose order alternates (``decodebench compare``'s rounds): the LZ penalty's transformers
   processor, MTAD's row loop (``draft=context``, greedy), nugget's default compressor batched (``--batch_size 8``,
   against the baseline at batch 8): each method's speed over the baseline's paired per document with its 95%
   bootstrap interval, quality's paired difference, and joules per token on both sides (NVML's counter);
2. the kernels under ``torch.cuda.set_sync_debug_mode("error")``: the LZ penalty, MTAD's verification and block
   verification, on CUDA tensors, each step of them must make no host-device synchronization;
3. where ``vllm`` imports, decodebench's vLLM tests (the plugins' rules, both runners' processors); where it does
   not, the page says so (they run on vLLM's CPU build in ``tox -e vllm``, with vLLM's own sampler tests).

It keeps what its figures come from in docs/data/benchmarks/gpu/ (each round's lm_eval results and scored samples
logs, the kernels' and vLLM's outcomes, the machine) and renders the page from that folder alone. ``--dry-run``
runs the same on this machine's CPU with one document, one round and a few new tokens, into ``--doc`` (tested in
tests/test_gpu_bench.py); its figures are no GPU's.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, RUN_FILE, doc_parser, keep_lm_eval_run, kept_results, load_json, page, record_run, save_json

DOC = "docs/benchmarks/gpu.md"
TITLE = "Every CUDA path on one GPU: methods against the baseline, kernels' host synchronizations, vLLM's checks"
TASKS = ("squad_mini", "cnndm_mini")
# nugget decodes its compressed contexts batched: it and its baseline run at this batch size, the others at 1
BATCH_SIZES = {"nugget": 8}
# (tests/test_vllm_upstream.py fetches vLLM's own suite from PyPI: a GPU machine without a network cannot)
VLLM_TESTS = ("tests/test_mtad_vllm.py", "tests/test_vllm_processor.py")


def methods(names: str | None = None) -> list:
    """The registered methods (``decodebench methods``) with the arguments the main job runs them with, or those
    named (comma-separated)."""
    from decodebench.commands.demo import registered_runs

    runs = [run for run in registered_runs() if run.name != "baseline"]
    if names:
        wanted = names.split(",")
        unknown = sorted(set(wanted) - {run.name for run in runs})
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; registered: {[run.name for run in runs]}")
        runs = [run for run in runs if run.name in wanted]
    return runs


def collect(
    folder: Path,
    argv: list[str],
    limit: int,
    rounds: int,
    max_gen_toks: int,
    out: str,
    dry_run: bool,
    names: str | None = None,
):
    import torch

    from decodebench.commands.compare import run_rounds

    started = time.time()
    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    if device == "cpu" and not dry_run:
        raise SystemExit("no CUDA device here: this study measures a GPU (--dry-run runs it on the CPU)")
    for run in methods(names):
        batch = BATCH_SIZES.get(run.name, 1)
        produced = run_rounds(
            run.model,
            {"pretrained": "embedded", **run.model_args},
            {"pretrained": "embedded"},
            list(TASKS),
            Path(out).resolve() / run.name,
            rounds,
            limit,
            batch,
            f"max_gen_toks={max_gen_toks}",
        )
        for number, sides in enumerate(produced, 1):
            for side, results in sides.items():
                keep_lm_eval_run(results, folder / run.name / f"round-{number}" / side)
    save_json(folder, "kernels.json", kernel_synchronizations(device))
    save_json(folder, "vllm.json", vllm_checks())
    record_run(
        folder,
        __file__,
        argv,
        started,
        device=device,
        dry_run=dry_run,
        limit=limit,
        rounds=rounds,
        max_gen_toks=max_gen_toks,
        torch=torch.__version__,
        cuda=torch.version.cuda,
    )


def kernel_cases(device: str) -> dict:
    """One decode step's work of each kernel at the sizes a GPU serves (64 rows, SmolLM2's vocabulary, the LZ
    penalty's window 512 and buffer 32, drafts of 4)."""
    import torch

    from decodebench.kernels.lz import apply_lz_penalty_
    from decodebench.kernels.mtad import block_verify_, mtad_accept_

    rows, vocab, gamma = 64, 49152, 4
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device)

    history = torch.randint(0, vocab, (rows, 544), generator=generator, device=device)
    lengths = torch.full((rows,), 544, device=device)
    tokens = torch.randint(0, vocab, (rows, gamma), generator=generator, device=device)
    counts = torch.full((rows,), gamma, device=device)
    taus = torch.full((rows,), 0.1, device=device)
    joint_q = torch.full((rows, gamma), -1.0, device=device).cumsum(-1)
    draft_probs = torch.softmax(randn(rows, gamma, vocab), -1)
    eta = torch.rand(rows, gamma, generator=generator, device=device)
    return {
        "LZ penalty (authors' codelength)": lambda: apply_lz_penalty_(
            randn(rows, vocab), history, lengths, 0.15, 512, 32, "authors"
        ),
        "MTAD verification": lambda: mtad_accept_(randn(rows, gamma, vocab), tokens, joint_q, counts, taus),
        "block verification": lambda: block_verify_(randn(rows, gamma, vocab), draft_probs, tokens, counts, eta),
    }


def kernel_synchronizations(device: str) -> dict:
    """Each kernel's step under CUDA's sync debug mode: 'none' or the error it raised at the first synchronization."""
    import torch

    if device != "cuda":
        return {"ran": False, "reason": "no CUDA device (torch.cuda.set_sync_debug_mode needs one)"}
    outcomes = {}
    for name, step in kernel_cases(device).items():
        step()  # allocations and lazy initialization first
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            outcomes[name] = "none"
        except RuntimeError as error:
            outcomes[name] = f"synchronizes: {str(error).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return {"ran": True, "outcomes": outcomes}


def vllm_checks() -> dict:
    if importlib.util.find_spec("vllm") is None:
        return {"ran": False, "reason": "vLLM is not installed here"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *VLLM_TESTS],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or ["no output"]
    return {"ran": True, "passed": proc.returncode == 0, "summary": last[0]}


# -- the page --------------------------------------------------------------------------------------------------------
WAITING = [
    "**No GPU has run this yet: every figure of this page waits for one.** Until one does, the CUDA paths are checked "
    "as far as a CPU can check them (`tox -e py,vllm`: the kernels, the plugins against vLLM's GPU-side Python and "
    "its own tests, this command's dry run), and docs/benchmarks/h100.md records the main job on an H100 "
    "(sequential runs, no interleaved ratio). On a machine with a CUDA GPU and PyPI:",
    "",
    "```",
    "pip install tox && tox -e gpu                        # writes this page; tox -e gpu -- --help for its options",
    "```",
    "",
    "On one without a network (CPython 3.12 with torch, transformers, peft, accelerate and nvidia-ml-py, as this "
    "project's lent GPU machines and many clusters' nodes have), build the wheelhouse where PyPI is reachable, carry "
    "its parts over one at a time (at most 60 MiB each; `--part-mib` for less), and run the command there:",
    "",
    "```",
    "python studies/gpu_wheelhouse.py --out wheelhouse    # here: decodebench, lm-eval, the image's gaps, the model",
    "python3 wheelhouse/part-1/unpack.py wheelhouse       # there: joins, checks every sha256, installs offline",
    "python3 studies/gpu_bench.py",
    "```",
]


def render(folder: Path) -> str:
    lines = [f"# {TITLE}", ""]
    if not (Path(folder) / RUN_FILE).is_file():
        return "\n".join([*lines, *WAITING, "", *what_runs(), ""])
    run = load_json(folder, RUN_FILE)
    from decodebench.measure.machine import short_name

    minutes = f", {run['seconds'] / 60:.0f} min" if run.get("seconds", 0) >= 60 else ""
    lines += [
        f"Written by `{run['command']}` (`tox -e gpu`) on {run['date']}{minutes}, machine: "
        f"{short_name(run['machine'])} (torch {run['torch']}, CUDA {run['cuda'] or 'none'}).",
        "",
    ]
    if run.get("dry_run"):
        lines += ["**A dry run on a CPU:** it shows that the command works end to end; no figure here is a GPU's.", ""]
    lines += [*what_runs(), "", *method_tables(folder, run), *kernel_lines(folder), *vllm_lines(folder)]
    return "\n".join(lines) + "\n"


def what_runs() -> list[str]:
    return [
        "What runs: each method against the baseline through `lm_eval` on the mini tasks "
        f"({', '.join(TASKS)}), in rounds whose order alternates, greedy, batch 1 (nugget and its baseline at batch "
        f"{BATCH_SIZES['nugget']}); speed: the method's tokens/s over the baseline's, paired per document (tokens "
        "and seconds summed over the rounds), with its 95% bootstrap interval; quality: the paired difference from "
        "the baseline with its interval and p (McNemar exact for 0/1 metrics, a sign-flip permutation test "
        "otherwise); J/token: NVML's energy counter over each task's windows, per output token, the mean over "
        "rounds. Then the kernels under CUDA's sync debug mode, and decodebench's vLLM tests where vLLM imports.",
    ]


def method_tables(folder: Path, run: dict) -> list[str]:
    from decodebench.commands.compare import summarize
    from decodebench.reports.reader import printable, read_run
    from decodebench.reports.tables import bound_text, p_text

    lines = [
        "| method | task | n | speed vs baseline [95% CI] | quality metric | paired difference [95% CI], p | "
        "J/token: method / baseline |",
        "|---|---|---:|---|---|---|---|",
    ]
    ran = []  # what each method ran as, from its results: a default (nugget's selector) may change between runs
    for method_folder in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
        rounds = [
            {side: kept_results(round_folder / side) for side in ("baseline", "method")}
            for round_folder in sorted(method_folder.glob("round-*"), key=lambda p: int(p.name.split("-")[1]))
        ]
        summary = summarize(rounds)
        energy = {side: [read_run(r[side]) for r in rounds] for side in ("method", "baseline")}
        method = energy["method"][0]
        arguments = ", ".join(f"{key}={printable(value)}" for key, value in method.method_args.items())
        ran.append(f"- {method_folder.name} ({arguments}): {method.method_label}")
        for task, row in summary.items():
            ratio = "not measured"
            if row["speed_ratio"] is not None:
                low, high = row["speed_ratio_interval"]
                ratio = f"{row['speed_ratio']:.2f}x [{low:.2f}, {high:.2f}]"
            metric = energy["method"][0].tasks[task].primary_metric or next(iter(row["quality"]), "-")
            comparison = row["quality"].get(metric, {}).get("vs_baseline")
            difference = (
                f"{comparison['difference']:+.3f} [{bound_text(comparison['interval'][0])}, "
                f"{bound_text(comparison['interval'][1])}], {p_text(comparison)}"
                if comparison
                else "-"
            )
            sides = [joules_per_token(runs, task) for runs in energy.values()]
            joules = sides[0] if sides[0] == sides[1] and sides[0].startswith("unavailable") else " / ".join(sides)
            lines.append(
                f"| {method_folder.name} | {task} | {row['n']} | {ratio} | {metric} | {difference} | {joules} |"
            )
    return [*lines, "", "What each method ran (its arguments and label, from its results):", "", *ran, ""]


def joules_per_token(runs: list, task: str) -> str:
    values = [(r.tasks[task].measurement or {}).get("joules_per_token") for r in runs if task in r.tasks]
    values = [v for v in values if v is not None]
    if not values:
        reasons = {(r.energy or {}).get("unavailable_reason") for r in runs} - {None}
        return f"unavailable ({'; '.join(sorted(reasons)) or 'not metered'})"
    return f"{sum(values) / len(values):.3f}"


def kernel_lines(folder: Path) -> list[str]:
    kernels = load_json(folder, "kernels.json")
    if not kernels["ran"]:
        return [f"Kernels' host synchronizations: not checked ({kernels['reason']}).", ""]
    recheck = kernels.get("recheck")
    if not recheck:
        lines = ["| kernel (one step, 64 rows, V = 49152) | host synchronizations |", "|---|---|"]
        lines += [f"| {name} | {outcome} |" for name, outcome in kernels["outcomes"].items()]
        return [*lines, ""]
    # a kernel fixed after the run, checked again on a GPU by the same function: both outcomes, and why
    lines = [
        "| kernel (one step, 64 rows, V = 49152) | host synchronizations (this run) | "
        f"rechecked {recheck['date']} on {recheck['machine']} |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {outcome} | {recheck['outcomes'].get(name, 'not rechecked')} |"
        for name, outcome in kernels["outcomes"].items()
    ]
    return [*lines, "", f"Rechecked because {recheck['why']}: `{recheck['command']}`.", ""]


def vllm_lines(folder: Path) -> list[str]:
    checks = load_json(folder, "vllm.json")
    if not checks["ran"]:
        return [
            f"vLLM's checks: not run ({checks['reason']}); they run on vLLM's CPU build in `tox -e vllm`, against "
            "vLLM's GPU-side Python where it imports there.",
        ]
    outcome = "passed" if checks["passed"] else "FAILED"
    return [f"vLLM's checks (`{' '.join(VLLM_TESTS)}`, not slow): {outcome}: {checks['summary']}."]


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--limit", type=int, default=5, help="documents per task (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order alternating (default 2)")
    parser.add_argument("--max-gen-toks", type=int, default=64, help="new tokens at most (default 64)")
    parser.add_argument("--out", default="results/gpu-bench", help="lm_eval output folder")
    parser.add_argument("--methods", default=None, help="only these methods, comma-separated (default: every one)")
    parser.add_argument(
        "--dry-run", action="store_true", help="run it on this machine's CPU: 1 document, 1 round, 8 new tokens"
    )
    args = parser.parse_args(argv)
    methods(args.methods)  # an unknown name fails before anything runs
    limit, rounds, max_gen_toks = (1, 1, 8) if args.dry_run else (args.limit, args.rounds, args.max_gen_toks)
    options = (limit, rounds, max_gen_toks, args.out, args.dry_run, args.methods)
    return page(args, argv, lambda folder, command: collect(folder, command, *options), render)


if __name__ == "__main__":
    raise SystemExit(main())
