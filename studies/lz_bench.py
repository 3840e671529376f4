"""LZ penalty benchmarks: kernel time per decode step, the vLLM processor's host work, end-to-end cost.

``tox -e lz-bench`` (``python studies/lz_bench.py``) collects into docs/data/benchmarks/lz/ and
writes docs/benchmarks/lz.md (``--from docs/data/benchmarks/lz`` renders it again from the data):

1. the kernel (``apply_lz_penalty_``: what a decode step runs) at batch 1, 16 and 64 with
   V = 49152 and V = 131072, window 512, buffer 32, on the CPU and on CUDA when present;
2. the vLLM logits processor's whole cost per decode step (``update_state`` + ``apply``) at batch 1
   and 16 with full 512-token windows, this tree's against an earlier revision's (``--before``,
   whose processor rebuilt every row's history from Python lists each step), on identical
   simulated batches, in rounds of alternating order;
3. end-to-end throughput of the embedded model with the LZ penalty against none, batch 16,
   1024-token contexts, 64 new tokens (EOS ignored, so every run decodes the same tokens), on vLLM
   (the processor in the engine) and transformers (the LogitsProcessor), in rounds of alternating
   order (A B, B A, ...).

Every comparison is a ratio paired per round (both settings run back to back in each round), with
the 95% bootstrap interval over rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from common import (
    REPO,
    doc_parser,
    generate_exactly,
    load_json,
    median_seconds,
    page,
    record_run,
    run_header,
    save_json,
)

from decodebench.kernels.lz import CODELENGTHS as KERNEL_CODELENGTHS
from decodebench.kernels.lz import apply_lz_penalty_, lz_codelengths
from decodebench.models.lz import LZConfig

DOC = "docs/benchmarks/lz.md"
LZ = LZConfig.defaults()
WINDOW, BUFFER = LZ.window, LZ.buffer
# the default (the authors' penalizer) first, then the paper's propositions
CODELENGTHS = (LZ.codelength, *(c for c in KERNEL_CODELENGTHS if c != LZ.codelength))
# the last revision whose vLLM processor rebuilt each row's history from Python lists at every step
BEFORE = "f488cde"
PROCESSOR_FILE = "models/lz/vllm_processor.py"  # its path at that revision


# -- 1. the kernel ------------------------------------------------------------------------------
def kernel_rows(device: str, repeats: int = 30) -> list[dict]:
    rows = []
    generator = torch.Generator().manual_seed(0)
    for codelength in CODELENGTHS:
        for vocab in (49152, 131072):
            for batch in (1, 16, 64):
                history = torch.randint(0, vocab, (batch, WINDOW + BUFFER), generator=generator).to(device)
                lengths = torch.full((batch,), WINDOW + BUFFER, device=device)
                logits = torch.randn(batch, vocab, generator=generator).to(device)
                step = partial(apply_lz_penalty_, logits, history, lengths, LZ.strength, WINDOW, BUFFER, codelength)
                dense = partial(lz_codelengths, history, lengths, vocab, WINDOW, BUFFER, codelength)
                sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
                step, dense = median_seconds(step, repeats, sync), median_seconds(dense, repeats, sync)
                rows.append(
                    {
                        **{"device": device, "codelength": codelength, "vocab": vocab, "batch": batch},
                        **{"step_ms": step * 1e3, "dense_ms": dense * 1e3},
                    }
                )
    return rows


# -- 2. the vLLM processor's cost per step, before and after -----------------------------------
def processor_class(revision: str | None):
    """This tree's vLLM processor, or the one of ``revision`` (read with git, loaded from a temporary file)."""
    if revision is None:
        from decodebench.models.lz.vllm_v1_processor import LZPenaltyV1LogitsProcessor

        return LZPenaltyV1LogitsProcessor
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{revision}:{PROCESSOR_FILE}"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"lz_processor_{revision}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.LZPenaltyV1LogitsProcessor


def processor_steps(processor_cls, batch: int, steps: int, vocab: int, seed: int) -> float:
    """Seconds per decode step (update_state + apply) of a fresh processor on ``batch`` LZ requests whose
    windows are already full, vLLM-style: the batch is added once, then each step appends one token per row."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from decodebench.models.lz.request_args import lz_extra_args

    rng = random.Random(seed)
    outputs = [[rng.randrange(vocab) for _ in range(WINDOW + BUFFER)] for _ in range(batch)]
    params = SamplingParams(extra_args=lz_extra_args(LZ))
    processor = processor_cls(None, torch.device("cpu"), False)
    processor.update_state(BatchUpdate(batch, [], [(i, params, [], outputs[i]) for i in range(batch)], []))
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed))
    processor.apply(logits.clone())
    new_tokens = [[rng.randrange(vocab) for _ in range(batch)] for _ in range(steps)]
    started = time.perf_counter()
    for tokens in new_tokens:
        for output, token in zip(outputs, tokens, strict=True):
            output.append(token)  # vLLM extends the live output lists between steps
        processor.update_state(None)
        processor.apply(logits.clone())
    return (time.perf_counter() - started) / steps


def processor_rounds(before: str, rounds: int, steps: int) -> dict:
    classes = {"before": processor_class(before), "after": processor_class(None)}
    out = {"before_revision": before, "steps_per_round": steps, "vocab": 49152, "batches": {}}
    for batch in (1, 16):
        seconds: dict[str, list[float]] = {name: [] for name in classes}
        for number in range(rounds):
            order = list(classes) if number % 2 == 0 else list(classes)[::-1]
            for name in order:
                seconds[name].append(processor_steps(classes[name], batch, steps, 49152, seed=number))
        out["batches"][str(batch)] = seconds
    return out


# -- 3. end to end ---------------------------------------------------------------------------------
def contexts(tokenizer, batch: int, length: int) -> list[list[int]]:
    """Deterministic contexts of ``length`` tokens cut from the bundled task texts, one offset per row."""
    from decodebench.data.paths import TASKS_DIR

    text = " ".join(p.read_text() for p in sorted(TASKS_DIR.glob("*/*.jsonl")))
    ids = tokenizer(text).input_ids
    while len(ids) < length + 97 * batch:
        ids = ids + ids
    return [ids[97 * row : 97 * row + length] for row in range(batch)]


def alternating(rounds: int, settings: dict, run_one) -> dict[str, list[float]]:
    """Seconds of each setting per round, the order alternating (A B, B A, ...)."""
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for number in range(rounds):
        for name in list(settings) if number % 2 == 0 else list(settings)[::-1]:
            start = time.perf_counter()
            run_one(settings[name])
            seconds[name].append(time.perf_counter() - start)
    return seconds


def hf_rounds(checkpoint: Path, batch: int, context: int, new_tokens: int, rounds: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.models.lz.processors import LZPenaltyLogitsProcessor

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    input_ids = torch.tensor(contexts(tokenizer, batch, context))
    settings = {"none": [], "lz": [LZPenaltyLogitsProcessor(LZ, prompt_width=input_ids.shape[1])]}
    return alternating(rounds, settings, partial(generate_exactly, model, tokenizer, input_ids, new_tokens=new_tokens))


def vllm_worker(checkpoint: str, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    """Seconds per round with and without the LZ penalty on one vLLM engine (run in its own process)."""
    from vllm import LLM, SamplingParams, TokensPrompt

    from decodebench.models.lz.request_args import lz_extra_args

    # installed, decodebench registers the processor with vLLM: naming it again would load it twice
    llm = LLM(model=checkpoint, gpu_memory_utilization=0.3, max_model_len=2048, seed=0)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    settings = {
        name: SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True, extra_args=extra)
        for name, extra in {"none": None, "lz": lz_extra_args(LZ)}.items()
    }
    llm.generate(inputs, settings["none"], use_tqdm=False)  # warm-up

    def generate(params):
        outputs = llm.generate(inputs, params, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == new_tokens for o in outputs)

    return alternating(rounds, settings, generate)


def vllm_rounds(checkpoint: Path, batch: int, context: int, new_tokens: int, rounds: int) -> dict | str:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    from transformers import AutoTokenizer

    prompts = contexts(AutoTokenizer.from_pretrained(checkpoint), batch, context)
    worker = [sys.executable, __file__, "--vllm-worker", json.dumps([str(checkpoint), prompts, new_tokens, rounds])]
    proc = subprocess.run(worker, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return f"vLLM run failed: {proc.stderr[-500:]}"
    return json.loads(lines[0].removeprefix("RESULT "))


def collect(folder: Path, argv: list[str], rounds: int, quick: bool, before: str) -> None:
    from decodebench.data.embedded import ensure_embedded_model

    started = time.time()
    checkpoint = ensure_embedded_model(log=print)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    save_json(folder, "kernel.json", [row for d in devices for row in kernel_rows(d, repeats=5 if quick else 30)])
    print("kernels done; the vLLM processor's steps ...", flush=True)
    if importlib.util.find_spec("vllm") is not None:
        save_json(folder, "processor.json", processor_rounds(before, rounds, steps=10 if quick else 50))
    batch, context, new_tokens = (4, 256, 16) if quick else (16, 1024, 64)
    print("processor done; transformers end-to-end ...", flush=True)
    end_to_end = {"batch": batch, "context": context, "new_tokens": new_tokens, "rounds": rounds}
    end_to_end["transformers"] = hf_rounds(checkpoint, batch, context, new_tokens, rounds)
    print("transformers done; vLLM end-to-end ...", flush=True)
    end_to_end["vllm"] = vllm_rounds(checkpoint, batch, context, new_tokens, rounds)
    save_json(folder, "end_to_end.json", end_to_end)
    record_run(folder, __file__, argv, started, devices[-1])


# -- the page ---------------------------------------------------------------------------------------
def paired(base_seconds: list[float], other_seconds: list[float]) -> str:
    """base / other per round (how many times faster ``other`` runs), with its 95% bootstrap interval over rounds."""
    from decodebench.stats import speed_ratio_interval

    ones = [1.0] * len(base_seconds)
    ratio, interval = speed_ratio_interval(ones, other_seconds, ones, base_seconds)
    return f"{ratio:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"


def render(folder: Path) -> str:
    import statistics

    kernels = load_json(folder, "kernel.json")
    lines = [
        *run_header(folder, "LZ penalty benchmarks", "lz-bench"),
        "## Kernel time per decode step",
        "",
        f"`apply_lz_penalty_` (what each decode step runs) and `lz_codelengths` (the dense [N, V] codelengths), "
        f"window {WINDOW}, buffer {BUFFER}, full histories; median of repeated calls.",
        "",
        "| device | codelength | V | batch | per step (ms) | dense codelengths (ms) |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {r['device']} | {r['codelength']} | {r['vocab']} | {r['batch']} | {r['step_ms']:.2f} "
            f"| {r['dense_ms']:.2f} |"
            for r in kernels
        ),
        "",
    ]
    if (folder / "processor.json").is_file():
        processor = load_json(folder, "processor.json")
        lines += [
            "## The vLLM logits processor per decode step: before and after device-resident histories",
            "",
            f"`update_state` + `apply` of `LZPenaltyV1LogitsProcessor` per decode step, every row asking for the "
            f"penalty with a full {WINDOW}-token window, V = {processor['vocab']}, on the CPU. Before: revision "
            f"`{processor['before_revision']}`, which rebuilt an [N, window] history from Python lists and copied it "
            "to the device at every step; after: this tree's, which keeps each row's history as a device tensor and "
            f"appends only the new tokens. {processor['steps_per_round']} steps per round, the two alternating which "
            "runs first; the ratio is paired per round.",
            "",
            "| batch | rounds | before (ms per step) | after (ms per step) | after is faster by [95% CI] |",
            "|---:|---:|---:|---:|---:|",
        ]
        for batch, seconds in processor["batches"].items():
            lines.append(
                f"| {batch} | {len(seconds['after'])} | {statistics.median(seconds['before']) * 1e3:.2f} "
                f"| {statistics.median(seconds['after']) * 1e3:.2f} | {paired(seconds['before'], seconds['after'])} |"
            )
        lines.append("")
    end_to_end = load_json(folder, "end_to_end.json")
    lines += [
        f"## End-to-end: LZ penalty against no penalty (batch {end_to_end['batch']}, {end_to_end['context']}-token "
        f"contexts, {end_to_end['new_tokens']} new tokens, embedded model)",
        "",
        f"Both settings decode the same tokens in each of {end_to_end['rounds']} rounds, the order alternating "
        "(A B, B A, ...); the cost is LZ's time over no penalty's, paired per round, with its 95% bootstrap interval.",
        "",
        f"| backend | no penalty (tokens/s, median) | LZ {LZ.strength:g} (tokens/s, median) "
        "| LZ's time / none's [95% CI] |",
        "|---|---:|---:|---:|",
    ]
    tokens = end_to_end["batch"] * end_to_end["new_tokens"]
    for name, key in (("vLLM (LZ logits processor in the engine)", "vllm"), ("transformers", "transformers")):
        result = end_to_end[key]
        if isinstance(result, str):
            lines.append(f"| {name} | - | - | not measured: {result} |")
            continue
        none, lz = (tokens / statistics.median(result[key]) for key in ("none", "lz"))
        lines.append(f"| {name} | {none:.1f} | {lz:.1f} | {paired(result['lz'], result['none'])} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds per comparison (default 6)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    parser.add_argument(
        "--before", default=BEFORE, help=f"revision whose vLLM processor is the 'before' (default {BEFORE})"
    )
    parser.add_argument("--vllm-worker", help=argparse.SUPPRESS)  # internal: the vLLM measurement's own process
    args = parser.parse_args(argv)
    if args.vllm_worker:
        print("RESULT " + json.dumps(vllm_worker(*json.loads(args.vllm_worker))))
        return 0
    options = (args.rounds, args.quick, args.before)
    return page(args, argv, lambda folder, command: collect(folder, command, *options), render)


if __name__ == "__main__":
    raise SystemExit(main())
