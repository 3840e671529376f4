"""LZ penalty benchmarks: kernel time per decode step, and end-to-end slowdown against no penalty.

``tox -e lz-bench`` (``python studies/lz_bench.py``) writes docs/benchmarks/lz.md:

1. the kernel (``apply_lz_penalty_``: what a decode step runs) at batch 1, 16 and 64 with
   V = 49152 and V = 131072, window 512, buffer 32, on the CPU and on CUDA when present;
2. end-to-end throughput of the embedded model with the LZ penalty against no penalty, batch 16,
   1024-token contexts, 64 new tokens (EOS ignored, so every run decodes the same number of
   tokens), on vLLM (the LZ logits processor in the engine) and on transformers
   (``model.generate`` with the LogitsProcessor). Settings alternate A/B to spread drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import torch
from common import doc_parser, median_seconds, write_doc

from decodebench.kernels.lz import CODELENGTHS as KERNEL_CODELENGTHS
from decodebench.kernels.lz import apply_lz_penalty_, lz_codelengths
from decodebench.models.lz import LZConfig

LZ = LZConfig.defaults()
WINDOW, BUFFER = LZ.window, LZ.buffer
# the default (the authors' penalizer) first, then the paper's propositions
CODELENGTHS = (LZ.codelength, *(c for c in KERNEL_CODELENGTHS if c != LZ.codelength))


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


def contexts(tokenizer, batch: int, length: int) -> list[list[int]]:
    """Deterministic 1024-token contexts cut from the bundled task texts, one offset per row."""
    from decodebench.paths import TASKS_DIR

    text = " ".join(p.read_text() for p in sorted(TASKS_DIR.glob("*/*.jsonl")))
    ids = tokenizer(text).input_ids
    while len(ids) < length + 97 * batch:
        ids = ids + ids
    return [ids[97 * row : 97 * row + length] for row in range(batch)]


def hf_rows(checkpoint: Path, batch: int, context: int, new_tokens: int, rounds: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    from decodebench.models.lz.processors import LZPenaltyLogitsProcessor

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    input_ids = torch.tensor(contexts(tokenizer, batch, context))
    settings = {
        "none": [],
        "lz": [LZPenaltyLogitsProcessor(LZ, prompt_width=input_ids.shape[1])],
    }
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, processors in settings.items():
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.eos_token_id,
                    logits_processor=LogitsProcessorList(processors),
                )
            seconds[name].append(time.perf_counter() - start)
    return {name: batch * new_tokens / statistics.median(values) for name, values in seconds.items()}


def vllm_worker(checkpoint: str, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    """Tokens/s with and without the LZ penalty on one vLLM engine (run in its own process)."""
    from vllm import LLM, SamplingParams, TokensPrompt

    from decodebench.models.lz.vllm_processor import LZPenaltyV1LogitsProcessor, lz_extra_args

    llm = LLM(
        model=checkpoint,
        gpu_memory_utilization=0.3,
        max_model_len=2048,
        seed=0,
        logits_processors=[LZPenaltyV1LogitsProcessor],
    )
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    settings = {"none": None, "lz": lz_extra_args(LZ)}
    params = {
        name: SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True, extra_args=extra)
        for name, extra in settings.items()
    }
    llm.generate(inputs, params["none"], use_tqdm=False)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name in settings:
            start = time.perf_counter()
            outputs = llm.generate(inputs, params[name], use_tqdm=False)
            seconds[name].append(time.perf_counter() - start)
            assert all(len(o.outputs[0].token_ids) == new_tokens for o in outputs)
    return {name: len(prompts) * new_tokens / statistics.median(values) for name, values in seconds.items()}


def vllm_rows(checkpoint: Path, batch: int, context: int, new_tokens: int, rounds: int) -> dict | str:
    import importlib.util

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


def run(doc: str | Path = "docs/benchmarks/lz.md", rounds: int = 3, quick: bool = False) -> int:
    from decodebench.embedded import ensure_embedded_model
    from decodebench.measure.machine import describe, short_name

    checkpoint = ensure_embedded_model(log=print)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    kernels = [row for device in devices for row in kernel_rows(device, repeats=5 if quick else 30)]
    batch, context, new_tokens = (4, 256, 16) if quick else (16, 1024, 64)
    print("kernels done; transformers end-to-end ...", flush=True)
    hf = hf_rows(checkpoint, batch, context, new_tokens, rounds)
    print("transformers done; vLLM end-to-end ...", flush=True)
    vllm = vllm_rows(checkpoint, batch, context, new_tokens, rounds)
    machine = describe(devices[-1])
    lines = [
        "# LZ penalty benchmarks",
        "",
        f"Written by `python studies/lz_bench.py{' --quick' if quick else ''}` on {datetime.now(UTC):%Y-%m-%d}, "
        f"machine: {short_name(machine)} (torch {machine['versions'].get('torch')}).",
        "",
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
        f"## End-to-end: LZ penalty against no penalty (batch {batch}, {context}-token contexts, "
        f"{new_tokens} new tokens, embedded model)",
        "",
        f"| backend | no penalty (tokens/s) | LZ {LZ.strength:g} (tokens/s) | slowdown |",
        "|---|---:|---:|---:|",
    ]
    for name, result in (("vLLM (LZ logits processor in the engine)", vllm), ("transformers", hf)):
        if isinstance(result, str):
            lines.append(f"| {name} | - | - | not measured: {result} |")
        else:
            slowdown = 1 - result["lz"] / result["none"]
            lines.append(f"| {name} | {result['none']:.1f} | {result['lz']:.1f} | {slowdown:+.2%} |")
    lines += [
        "",
        f"Tokens/s is the median over {rounds} alternating rounds of each setting; a negative slowdown means the "
        "penalized runs happened to be faster (run-to-run noise on a shared machine).",
        "",
    ]
    return write_doc(doc, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/benchmarks/lz.md")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per setting (default 3)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    parser.add_argument("--vllm-worker", help=argparse.SUPPRESS)  # internal: the vLLM measurement's own process
    args = parser.parse_args(argv)
    if args.vllm_worker:
        print("RESULT " + json.dumps(vllm_worker(*json.loads(args.vllm_worker))))
        return 0
    return run(args.doc, args.rounds, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
