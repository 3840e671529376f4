"""The embedded model on one GPU as a benchmark (tox -e gpu): docs/benchmarks/gpu.md.

``python studies/gpu_bench.py`` (on a GPU machine without a network: the recipe in studies/gpu_wheelhouse.py) runs
four sections (``--sections``, all by default), each into the page's data folder:

1. ``methods``: each method against the baseline through the real ``lm_eval`` (transformers backend, CUDA, bf16 by
   default, greedy, batch 1) on the mini tasks, at least 20 documents a task, in rounds whose order rotates: the
   baseline, the LZ penalty, MTAD (``draft=context``) and MTAD's own loop without drafts (``mode=target``: what
   MTAD's gain is over its loop's), nugget's default compressor. One discarded baseline run warms the machine up,
   and every run decodes each task's first request once untimed first (``warmup=1``). Speed: paired per document
   over the rounds with its bootstrap interval, and each round's ratio with the interval over rounds (which holds
   run-to-run noise); quality's paired difference; time to first token apart from decode tokens/s; tokens per
   target call; J per output and per total token, the board's and above the idle power measured in the same run.
2. ``steps`` (studies/gpu_steps.py): ``generate`` in one process, bf16 and fp32, batch 1 and 64, the baseline
   against the LZ processor in rotating rounds of windows of at least 2 s, J/token in steady state above idle; the
   LZ kernel's microseconds per step; where a step's time goes (torch's profiler: host against device).
3. ``kernels``: the LZ penalty, MTAD's verification and block verification under ``torch.cuda.set_sync_debug_mode``
   ("error"): each step of them must make no host-device synchronization.
4. ``vllm``: where ``vllm`` imports, decodebench's vLLM tests; where it does not, the page says so (vLLM's engine on
   a GPU is its own page).

A call with some sections keeps the others' data from the previous call (each section's command is on the page).
``--dry-run`` runs the same on this machine's CPU at toy sizes, into ``--doc`` (tested in tests/test_gpu_bench.py);
its figures are no GPU's.
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gpu_steps
from common import (
    REPO,
    RUN_FILE,
    doc_parser,
    keep_lm_eval_run,
    kept_results,
    load_json,
    page,
    record_run,
    save_json,
    shown_command,
)

DOC = "docs/benchmarks/gpu.md"
TITLE = (
    "The embedded model on one GPU: methods against the baseline through lm_eval, decode steps in bf16 and fp32 at "
    "batch 1 and 64, host against device, J/token above idle"
)
TASKS = ("squad_mini", "cnndm_mini")
SECTIONS = ("methods", "steps", "kernels", "vllm")
# MTAD's own loop without drafts: what part of MTAD's speed is its loop's rather than its drafts'
TARGET_ONLY = "mtad-target"
# (tests/test_vllm_upstream.py fetches vLLM's own suite from PyPI: a GPU machine without a network cannot)
VLLM_TESTS = ("tests/test_mtad_vllm.py", "tests/test_vllm_processor.py")
DRY_RUN = {
    "limit": 1,
    "rounds": 2,
    "max_gen_toks": 4,
    "steps": gpu_steps.StepSettings(
        batches=(1, 2), rounds=2, new_tokens=4, prompt_tokens=64, min_window_s=0.05, idle_s=0.2, profile_tokens=2
    ),
}


def arms(names: str | None = None) -> dict[str, tuple[str, dict]]:
    """Each arm of the methods section: name -> (lm_eval model, its model_args), from the registered methods
    (``decodebench methods``) with the arguments the main job runs them with; MTAD brings its target-only loop.
    ``names`` (comma-separated) keeps only those methods (the baseline always runs)."""
    from decodebench.commands.demo import registered_runs

    runs = {run.name: (run.model, dict(run.model_args)) for run in registered_runs()}
    if "mtad" in runs:
        runs[TARGET_ONLY] = ("mtad", {**runs["mtad"][1], "mode": "target"})
    if names:
        wanted = names.split(",")
        unknown = sorted(set(wanted) - set(runs) - {"baseline"})
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; registered: {sorted(set(runs) - {'baseline'})}")
        keep = {"baseline", *wanted, *([TARGET_ONLY] if "mtad" in wanted else [])}
        runs = {name: arm for name, arm in runs.items() if name in keep}
    return runs


def references(names) -> dict[str, str]:
    """Which arm each arm is compared with: the baseline, and MTAD also with its target-only loop."""
    pairs = {name: "baseline" for name in names if name != "baseline"}
    return {**pairs, **({"mtad (vs target-only)": TARGET_ONLY} if "mtad" in names and TARGET_ONLY in names else {})}


def collect(folder: Path, argv: list[str], args) -> None:
    import torch

    started = time.time()
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if device == "cpu" and not args.dry_run:
        raise SystemExit("no CUDA device here: this study measures a GPU (--dry-run runs it on the CPU)")
    sections = args.sections.split(",")
    previous = folder.with_name(folder.name + ".previous")
    made = {}
    folder.mkdir(parents=True, exist_ok=True)
    if previous.is_dir() and (previous / RUN_FILE).is_file():  # the sections this call does not run: kept
        made = load_json(previous, RUN_FILE).get("sections", {})
        for name in set(made) - set(sections):
            for path in previous.glob(f"{name}*"):
                (shutil.copytree if path.is_dir() else shutil.copy2)(path, folder / path.name)
        made = {name: made[name] for name in set(made) - set(sections)}
    for name in sections:
        begun = time.time()
        if name == "methods":
            run_methods(folder / "methods", args, device)
        elif name == "steps":
            settings = DRY_RUN["steps"] if args.dry_run else gpu_steps.StepSettings(rounds=args.rounds)
            save_json(folder, "steps.json", gpu_steps.measure(settings, device))
        elif name == "kernels":
            save_json(folder, "kernels.json", kernel_synchronizations(device))
        elif name == "vllm":
            save_json(folder, "vllm.json", vllm_checks())
        made[name] = {
            "command": " ".join(["python studies/gpu_bench.py", *argv]),
            "seconds": round(time.time() - begun),
        }
    record_run(
        folder,
        __file__,
        argv,
        started,
        device=device,
        dry_run=args.dry_run,
        sections=made,
        gpu=gpu_steps.gpu_facts() if device == "cuda" else {},
        torch=torch.__version__,
        cuda=torch.version.cuda,
    )


def run_methods(folder: Path, args, device: str) -> None:
    """Every arm once a round, the order rotating; the machine warmed by one discarded run first."""
    from decodebench.commands.runs import LmEvalRun

    limit, rounds, max_gen_toks = (
        (DRY_RUN["limit"], DRY_RUN["rounds"], DRY_RUN["max_gen_toks"])
        if args.dry_run
        else (args.limit, args.rounds, args.max_gen_toks)
    )
    chosen = arms(args.methods)
    names = list(chosen)
    warm_up_limit = 1 if args.dry_run else 2
    meter = gpu_steps.Device(device)
    idle = [meter.idle_watts(DRY_RUN["steps"].idle_s if args.dry_run else 5.0)]
    out = Path(args.out).resolve()
    orders = []
    for dtype in args.dtypes.split(","):

        def run(name, number, dtype=dtype, run_limit=limit, where=None):
            model, model_args = chosen[name]
            return LmEvalRun(
                model=model,
                model_args={"pretrained": "embedded", "dtype": dtype, "warmup": 1, **model_args},
                tasks=list(TASKS),
                output_path=where or out / dtype / f"round-{number}" / name,
                limit=run_limit,
                gen_kwargs=f"max_gen_toks={max_gen_toks}",
            ).run_or_raise(f"[{dtype} round {number}/{rounds}] {name}")

        run("baseline", 0, run_limit=warm_up_limit, where=out / dtype / "machine-warm-up")  # discarded
        for number in range(1, rounds + 1):
            order = gpu_steps.rotated(names, number)
            orders.append({"dtype": dtype, "round": number, "order": order})
            for name in order:
                keep_lm_eval_run(run(name, number), folder / dtype / f"round-{number}" / name)
    idle.append(meter.idle_watts(DRY_RUN["steps"].idle_s if args.dry_run else 5.0))
    save_json(
        folder,
        "methods.json",
        {
            "arms": {n: {"model": m, "model_args": a} for n, (m, a) in chosen.items()},
            "orders": orders,
            "idle": idle,
            "limit": limit,
            "rounds": rounds,
            "max_gen_toks": max_gen_toks,
            "warmup": 1,
            "machine_warm_up_limit": warm_up_limit,
        },
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
    "**No GPU has run this version of the command yet: every figure of this page waits for one.** The earlier "
    "version ran once, on an H200 (docs/benchmarks/h200.md: 7 documents a task, 2 rounds, no warm-up, fp32 only). "
    "Until a GPU runs this one, the CUDA paths are checked as far as a CPU can check them (`tox -e py,vllm`: the "
    "kernels, the plugins against vLLM's GPU-side Python and its own tests, this command's dry run). On a machine "
    "with a CUDA GPU and PyPI:",
    "",
    "```",
    "pip install tox && tox -e gpu                        # writes this page; tox -e gpu -- --help for its options",
    "```",
    "",
    "On one without a network (CPython 3.12 with torch, transformers, peft, accelerate and nvidia-ml-py, as this "
    "project's lent GPU machines and many clusters' nodes have), build the wheelhouse where PyPI is reachable, carry "
    "its parts over one at a time (each fits beside the tracked tree in 64 MiB; `--part-mib` for less), and run the "
    "command there. Sections can go in separate calls (a call keeps the other sections' data): the methods section "
    "is 15 lm_eval runs of about 40 s at 45 tokens/s a row (the host-bound speed seen on an H200), about 10 minutes; "
    "steps, kernels and vllm together about 2. Where a call may last at most 10 minutes, `--sections methods "
    "--methods mtad` (the baseline, MTAD and its target-only loop: about 6) and `--sections steps,kernels,vllm`:",
    "",
    "```",
    "python studies/gpu_wheelhouse.py --out wheelhouse    # here: decodebench, lm-eval, the image's gaps, the model",
    "python3 wheelhouse/part-1/unpack.py wheelhouse       # there: joins, checks every sha256, installs offline",
    "python3 studies/gpu_bench.py",
    "```",
]


def render(folder: Path) -> str:
    folder = Path(folder)
    lines = [f"# {TITLE}", ""]
    if not (folder / RUN_FILE).is_file():
        return "\n".join([*lines, *WAITING, ""])
    run = load_json(folder, RUN_FILE)
    from decodebench.measure.machine import short_name

    made = run["sections"]
    lines += [
        f"Machine: {short_name(run['machine'])}; torch {run['torch']} (CUDA {run['cuda'] or 'none'}), "
        f"{run['date']}. Each section's command (`tox -e gpu -- ...`) and its duration:",
        "",
    ]
    lines += [
        f"- {name}: `{shown_command(shlex.split(made[name]['command']))}`, {made[name]['seconds']} s"
        for name in SECTIONS
        if name in made
    ]
    lines += ["", *gpu_lines(run.get("gpu") or {}), ""]
    if run.get("dry_run"):
        lines += [
            "**A dry run on a CPU:** it shows that the command works end to end at toy sizes; no figure here "
            "is a GPU's.",
            "",
        ]
    if "methods" in made:
        lines += methods_lines(folder / "methods")
    if "steps" in made:
        lines += steps_lines(load_json(folder, "steps.json"))
    if "kernels" in made:
        lines += kernel_lines(folder)
    if "vllm" in made:
        lines += vllm_lines(folder)
    return "\n".join(lines).rstrip() + "\n"


def gpu_lines(gpu: dict) -> list[str]:
    if not gpu:
        return ["GPU: none (NVML sees no device)."]
    return [
        f"GPU: {gpu['name']}, driver {gpu['driver']} (CUDA driver {gpu['cuda_driver']}), SM clock "
        f"{gpu['sm_clock_mhz']} MHz at the end of the run (at most {gpu['sm_clock_max_mhz']}), memory clock "
        f"{gpu['memory_clock_mhz']} MHz "
        f"(at most {gpu['memory_clock_max_mhz']}), power limit {fmt(gpu['power_limit_w'], '.0f')} W, persistence mode "
        f"{gpu['persistence_mode']}."
    ]


def fmt(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else str(value)


def with_interval(value: float, interval, spec: str = ".3f") -> str:
    if interval is None or interval[0] == interval[1]:
        return format(value, spec)
    return f"{value:{spec}} [{interval[0]:{spec}}, {interval[1]:{spec}}]"


def idle_text(idle: list[dict]) -> tuple[float | None, str]:
    watts = [i["watts"] for i in idle if i["watts"] is not None]
    if not watts:
        return None, f"idle power: not measured ({idle[0]['reason']})"
    shown = " and ".join(f"{w:.1f} W" for w in watts)
    return sum(watts) / len(watts), f"idle power {shown} (before and after, {idle[0]['seconds']:.0f} s each)"


def methods_lines(folder: Path) -> list[str]:
    from decodebench.commands.compare import summarize
    from decodebench.reports.reader import read_run
    from decodebench.reports.tables import bound_text, p_text

    info = load_json(folder, "methods.json")
    names = list(info["arms"])
    idle, idle_words = idle_text(info["idle"])
    lines = [
        "## Methods against the baseline through lm_eval",
        "",
        f"Each arm through `lm_eval` (transformers backend, greedy, batch 1, {info['limit']} documents a task, "
        f"max_gen_toks={info['max_gen_toks']}), {info['rounds']} rounds whose order rotates (round 1: "
        f"{', '.join(info['orders'][0]['order'])}); one discarded baseline run ({info['machine_warm_up_limit']} "
        f"documents) warms the machine first, and each run decodes each task's first request once untimed "
        f"(`warmup={info['warmup']}`). Speed: the arm's tokens/s over its reference's, paired per document (tokens "
        "and seconds summed over the rounds) with its 95% bootstrap interval; then each round's ratio and the "
        "interval over rounds (Student's t on the log ratios: it holds the run-to-run noise that the per-document "
        "interval leaves out). Quality (round 1): the paired difference with its interval and p (McNemar exact for "
        "0/1 metrics, the sign-flip test otherwise).",
        "",
    ]
    for dtype in sorted(p.name for p in folder.iterdir() if p.is_dir()):
        kept = {
            int(r.name.split("-")[1]): {name: kept_results(r / name) for name in names}
            for r in (folder / dtype).glob("round-*")
        }
        numbers = sorted(kept)
        lines += [
            f"### {dtype}",
            "",
            "| arm | against | task | n | speed per document [95% CI] | each round | over rounds [95% CI] | "
            "quality metric | paired difference [95% CI], p |",
            "|---|---|---|---:|---|---|---|---|---|",
        ]
        for label, reference in references(names).items():
            arm = label.split(" ")[0]
            summary = summarize([{"baseline": kept[n][reference], "method": kept[n][arm]} for n in numbers])
            for task, row in summary.items():
                ratio = "not measured"
                if row["speed_ratio"] is not None:
                    ratio = with_interval(row["speed_ratio"], row["speed_ratio_interval"], ".2f") + "x"
                rounds = [r for r in row["round_speed_ratios"] if r]
                each = " / ".join(f"{r:.2f}" for r in rounds)
                over = "-"
                if len(rounds) > 1:
                    over = with_interval(*gpu_steps.over_rounds(rounds), ".2f") + "x"
                metric = read_run(kept[numbers[0]][arm]).tasks[task].primary_metric or next(iter(row["quality"]), "-")
                comparison = row["quality"].get(metric, {}).get("vs_baseline")
                difference = (
                    f"{comparison['difference']:+.3f} [{bound_text(comparison['interval'][0])}, "
                    f"{bound_text(comparison['interval'][1])}], {p_text(comparison)}"
                    if comparison
                    else "-"
                )
                lines.append(
                    f"| {arm} | {reference} | {task} | {row['n']} | {ratio} | {each} | {over} | {metric} | "
                    f"{difference} |"
                )
        lines += ["", *request_lines(kept, numbers, names, idle), ""]
    lines += [
        f"J/token: NVML's total-energy counter over each request's window (batch 1: one request a window), summed "
        f"over the task and its rounds, per output token and per total (prompt + output) token; the board's, and "
        f"above the {idle_words}: the board's joules less idle power times the windows' seconds. A request's "
        "window is often shorter than 20 updates of the counter (its mean is in the table): these are sums of many "
        "short windows; the steady-state figures are the steps section's.",
        "",
        "What each arm ran (its arguments and label, from its results):",
        "",
        *arm_lines(folder, names),
        "",
    ]
    return lines


def request_lines(kept: dict, numbers: list[int], names: list[str], idle: float | None) -> list[str]:
    """Per arm and task: time to first token and decode tokens/s apart, tokens per target call, J/token."""
    from decodebench.commands.compare import samples
    from decodebench.reports.reader import read_run

    lines = [
        "| arm | task | TTFT mean, ms | decode tokens/s (after the first token) | new tokens per target call | "
        "mean window, s | J per output token: board / above idle | J per total token: board / above idle |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name in names:
        runs = [read_run(kept[n][name]) for n in numbers]
        for task in TASKS:
            tasks = [run.tasks[task] for run in runs if task in run.tasks]
            records = [r for t in tasks for _, s in samples(t) for r in s.get("decodebench") or []]
            if not records:
                continue
            ttfts = [r["ttft_s"] for r in records if r.get("ttft_s") is not None]
            decode_tokens = sum(r["new_tokens"] - 1 for r in records if r.get("ttft_s") is not None)
            decode_s = sum(r["latency_s"] - r["ttft_s"] for r in records if r.get("ttft_s") is not None)
            counters = [(t.measurement or {}).get("method") or {} for t in tasks]
            calls = sum(c.get("target_calls", 0) for c in counters)
            new = sum((t.measurement or {}).get("new_tokens", 0) for t in tasks)
            per_call = f"{new / calls:.2f}" if calls else "-"
            seconds = sum((t.measurement or {}).get("generate_seconds", 0) for t in tasks)
            requests = sum((t.measurement or {}).get("requests", 0) for t in tasks)
            energy = [(t.measurement or {}).get("energy_joules") for t in tasks]
            joules = ["unavailable", "unavailable"]
            if all(e is not None for e in energy):
                prompt = sum((t.measurement or {}).get("prompt_tokens", 0) for t in tasks)
                total_j = sum(energy)
                for i, tokens in enumerate((new, new + prompt)):
                    above = f"{(total_j - idle * seconds) / tokens:.4f}" if idle is not None else "-"
                    joules[i] = f"{total_j / tokens:.4f} / {above}"
            lines.append(
                f"| {name} | {task} | {1000 * sum(ttfts) / len(ttfts):.1f} | "
                f"{decode_tokens / decode_s:.1f} | {per_call} | {seconds / max(requests, 1):.2f} | "
                f"{joules[0]} | {joules[1]} |"
                if ttfts and decode_s > 0
                else f"| {name} | {task} | - | - | {per_call} | - | {joules[0]} | {joules[1]} |"
            )
    return lines


def arm_lines(folder: Path, names: list[str]) -> list[str]:
    from decodebench.reports.reader import printable, read_run

    first = sorted(p for p in folder.iterdir() if p.is_dir())[0] / "round-1"
    out = []
    for name in names:
        run = read_run(kept_results(first / name))
        arguments = ", ".join(f"{key}={printable(value)}" for key, value in run.method_args.items())
        out.append(f"- {name} ({arguments}): {run.method_label}")
    return out


def steps_lines(steps: dict) -> list[str]:
    settings = steps["settings"]
    _, idle_words = idle_text(steps["idle"])
    lines = [
        "## Decode steps in one process: bf16 and fp32, batch 1 and a large batch",
        "",
        f"`model.generate`, greedy, exactly {settings['new_tokens']} new tokens a row after cnndm_mini prompts cut to "
        f"their last {settings['prompt_tokens']} tokens (no padding), the baseline against the LZ processor; each arm "
        f"warmed up once (discarded), then {settings['rounds']} windows of at least {settings['min_window_s']:g} s "
        "each, the order rotating by round. Ratio: the arm's tokens/s over the baseline's in the same round; their "
        "geometric mean with the interval over rounds. J: NVML's counter over each window, per output and per total "
        f"token, the board's and above the {idle_words}; the mean over rounds with its t interval.",
        "",
        "| dtype | batch | arm | tokens/s each round | vs baseline each round | over rounds [95% CI] | "
        "J per output token: board / above idle | J per total token: board / above idle | SM clock, MHz |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    rows = gpu_steps.summary(steps)
    for row in rows:
        speeds = " / ".join(f"{s:.0f}" for s in row["tokens_per_s"])
        reference = row["arm"] == "baseline"
        ratios = "-" if reference else " / ".join(f"{r:.3f}" for r in row["ratios"])
        over = "-" if reference else with_interval(row["ratio"], row["ratio_interval"], ".3f") + "x"
        joules = []
        for per in ("output", "total"):
            if f"j_per_{per}" not in row:
                joules.append(f"unavailable ({steps['energy_unavailable']})")
                continue
            board = with_interval(*row[f"j_per_{per}"], ".4f")
            above = with_interval(*row[f"j_per_{per}_above_idle"], ".4f") if f"j_per_{per}_above_idle" in row else "-"
            joules.append(f"{board} / {above}")
        clocks = sorted(c for c in row["sm_clock_mhz"] if c is not None)
        clock = f"{clocks[0]}-{clocks[-1]}" if clocks else "-"
        lines.append(
            f"| {row['dtype']} | {row['batch']} | {row['arm']} | {speeds} | {ratios} | {over} | {joules[0]} | "
            f"{joules[1]} | {clock} |"
        )
    distinct = {(r["batch"], r["distinct_prompts"]) for r in rows}
    repeated = [f"batch {b}: {d} distinct prompts" for b, d in sorted(distinct) if d < b]
    if repeated:
        lines += ["", f"Prompts repeat where cnndm_mini has too few that long ({'; '.join(repeated)})."]
    bandwidth = steps["copy_bandwidth_bytes_per_s"]
    step_floor_us = gpu_steps.SEVEN_B_BF16_BYTES / bandwidth * 1e6
    lines += [
        "",
        "The LZ penalty's kernel alone on one step's logits (fp32, V = 49152, a full window of "
        f"{gpu_steps.LZ_ARGS['window']} tokens; `torch.utils.benchmark`'s median):",
        "",
        "| batch | microseconds a step (median) | IQR | runs |",
        "|---:|---:|---:|---:|",
    ]
    for batch, kernel in steps["lz_kernel"].items():
        lines.append(f"| {batch} | {kernel['median_us']:.1f} | {kernel['iqr_us']:.1f} | {kernel['runs']} |")
    one = steps["lz_kernel"].get("1")
    if one:
        lines += [
            "",
            f"Arithmetic, not a measurement of a 7B model: a 7B model's decode step at batch 1 reads at least its bf16 "
            f"weights (14 GB); at this device's measured copy bandwidth ({bandwidth / 1e9:.0f} GB/s, read + write) "
            f"that takes at least {step_floor_us / 1000:.2f} ms, so the LZ kernel's {one['median_us']:.0f} us would "
            f"be at most {100 * one['median_us'] / (one['median_us'] + step_floor_us):.1f}% of such a step.",
        ]
    lines += [
        "",
        f"Where a step's time goes (torch's profiler over one `generate` of {settings['profile_tokens']} tokens per "
        f"arm and batch, {settings['dtypes'][0]}; device busy: the summed self time of the device's kernels over the "
        "wall time; host: the summed self time of the host's operators):",
        "",
        "| batch | arm | wall, ms a new token (prefill included) | device busy | host self time | "
        "host's top operators | device's top kernels |",
        "|---:|---|---:|---:|---:|---|---|",
    ]
    for item in steps["profile"]:
        busy = (
            f"{100 * item['device_busy_s'] / item['wall_s']:.0f}%" if item["device_busy_s"] is not None else "no device"
        )
        host = f"{100 * item['host_self_s'] / item['wall_s']:.0f}%"
        top_host = ", ".join(f"`{k}` {1000 * s:.1f} ms" for k, s in item["top_host"][:3])
        top_device = ", ".join(f"`{k[:40]}` {1000 * s:.1f} ms" for k, s in item["top_device"][:3]) or "-"
        lines.append(
            f"| {item['batch']} | {item['arm']} | {1000 * item['wall_s'] / item['new_tokens']:.2f} | {busy} | "
            f"{host} | {top_host} | {top_device} |"
        )
    return [*lines, ""]


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
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"which to run (default {','.join(SECTIONS)})")
    parser.add_argument("--limit", type=int, default=20, help="documents per task in the methods section (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the order rotating (default 3)")
    parser.add_argument("--max-gen-toks", type=int, default=64, help="new tokens at most (default 64)")
    parser.add_argument("--dtypes", default="bfloat16", help="the methods section's dtypes (default bfloat16)")
    parser.add_argument("--out", default="results/gpu-bench", help="lm_eval output folder")
    parser.add_argument("--methods", default=None, help="only these methods, comma-separated (default: every one)")
    parser.add_argument("--dry-run", action="store_true", help="run it on this machine's CPU at toy sizes")
    args = parser.parse_args(argv)
    arms(args.methods)  # an unknown name fails before anything runs
    unknown = sorted(set(args.sections.split(",")) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; allowed: {','.join(SECTIONS)}")
    if not args.dry_run and (args.limit < 20 or args.rounds < 3):
        print(f"note: --limit {args.limit} --rounds {args.rounds} is below this benchmark's 20 documents and 3 rounds")
    return page(args, argv, lambda folder, command: collect(folder, command, args), render)


if __name__ == "__main__":
    raise SystemExit(main())
