"""kvpress's presses at the nugget study's ratios, scored like decodebench's tasks, and what each costs.

Runs in its own environment (kvpress 0.5.5 needs transformers<5.3; ``tox -e kvpress``), called
by studies/nugget_study.py with the documents it prepared from the tasks' own prompts::

    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out peers.json
    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out cost.json --cost

Each item holds a task name, the prompt's document (compressed by the press) and its question
or instruction (kept uncompressed), the task's generation length and stop, and the references:
the same split as ``--model nugget``. kvpress's text-generation pipeline applies the chat
template and answers greedily (the question comes after compression, so no press sees it).

Each press compresses exactly the document, as ``--model nugget`` does: the chat template's opening
(``P`` tokens) is kept whole and the document's ``D`` tokens keep ``ceil(D / ratio)``. kvpress
compresses the whole context (opening and document) by a share, ``compression_ratio``; here it is
set per document to drop ``D - ceil(D / ratio)`` tokens of the ``P + D``, and the opening is scored
above every document token (StreamingLLM's sinks are the opening; KVzip's never-evicted tokens are).

A press that cannot compress some documents (SnapKV and PyramidKV need a context longer than their
observation window) runs on the others, and --out names those left out and why.

``--cost``: for each document, the prefill of the opening and document without a press and with
each press (compression included), the order rotating from document to document, with each side's
peak memory: what compressing costs, paired per document.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

# name: how the press ranks a document's tokens (kvpress 0.5.5's classes, their defaults otherwise)
PRESSES = {
    "KVzip": "query-agnostic: attention while the model repeats the context (two to three prefills)",
    "Expected Attention": "query-agnostic: attention expected from future queries' statistics",
    "KNorm": "query-agnostic: low key norm first",
    "StreamingLLM": "query-agnostic: the opening as sinks and the document's last tokens",
    "TOVA": "query-aware by design (the last token's attention); here the question comes after compression",
    "SnapKV": "query-aware by design (the last 64 tokens' attention); here that window is the document's end",
    "PyramidKV": "query-aware by design (SnapKV's window, more tokens for lower layers); here as SnapKV",
}
# the presses whose window must fit inside the context (kvpress asserts it mid-run)
WINDOWED = ("SnapKV", "PyramidKV")


def score(task: str, answer: str, references: list[str]) -> float:
    from decodebench.metrics import rouge, squad_normalized_accuracy

    if task.startswith("squad"):
        return squad_normalized_accuracy(answer, references)
    return rouge(answer, references[0])["rougeLsum"]


def make_presses(names: list[str]) -> dict:
    """One press of each named kind; ``fit`` sets its share per document."""
    from dataclasses import dataclass

    from kvpress import (
        ExpectedAttentionPress,
        KnormPress,
        KVzipPress,
        PyramidKVPress,
        SnapKVPress,
        StreamingLLMPress,
        TOVAPress,
    )

    @dataclass
    class KVzipKeepingOpening(KVzipPress):
        """KVzip, its never-evicted tokens the chat template's opening (its replay scores only the document). kvpress
        masks the pairs it evicts instead of removing them (the authors' repository removes them): ``kept_share``
        records the share it keeps, for the KV bytes a real eviction would hold."""

        opening: int = 0
        kept_share: float = 1.0

        def compress_post(self, model):
            if self.compression_ratio > 0:
                self.score_val[..., : self.opening] = self.score_val.amax() + 1
            super().compress_post(model)
            pruned = sum(len(layer.self_attn.masked_key_indices[0]) for layer in model.model.layers)
            self.kept_share = 1 - pruned / self.score_val.numel()

    kinds = {
        "KVzip": KVzipKeepingOpening,
        "Expected Attention": ExpectedAttentionPress,
        "KNorm": KnormPress,
        "StreamingLLM": StreamingLLMPress,
        "TOVA": TOVAPress,
        "SnapKV": SnapKVPress,
        "PyramidKV": PyramidKVPress,
    }
    return {name: kinds[name]() for name in names}


def fit(press, opening: int, document: int, ratio: float):
    """Set ``press`` to keep the ``opening`` tokens whole and ``ceil(document / ratio)`` of the document's: kvpress
    keeps ``int(k_len * (1 - compression_ratio))`` of a context's ``k_len`` (the 0.5 guards that floor against
    rounding), and the opening is ranked above every document token."""
    kept = opening + math.ceil(document / ratio)
    press.compression_ratio = 1 - (kept + 0.5) / (opening + document)
    if hasattr(press, "opening"):  # KVzip
        press.opening = opening
        return press
    if hasattr(press, "n_sink") and type(press).__name__ == "StreamingLLMPress":
        press.n_sink = opening
    score = type(press).score

    def opening_first(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(press, module, hidden_states, keys, values, attentions, kwargs)
        scores[..., :opening] = scores.max() + 1
        return scores

    press.score = opening_first
    return press


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--ratio", type=float, required=True)
    parser.add_argument("--items", required=True, help="JSON list written by nugget_study.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", help="torch device for the pipeline (default cpu)")
    parser.add_argument(
        "--presses", default=",".join(PRESSES), help=f"comma-separated subset of {', '.join(PRESSES)} (default all)"
    )
    parser.add_argument(
        "--skip-refused",
        action="store_true",
        help="run a press only on the documents it can apply to, naming the others and why in --out, instead of "
        "failing (SnapKV and PyramidKV cannot compress a context no longer than their window)",
    )
    parser.add_argument(
        "--cost",
        action="store_true",
        help="time each press's prefill against the plain prefill of the same document (the order rotating), with "
        "peak memory, instead of answering",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.presses.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in PRESSES]:
        parser.error(f"unknown press(es) {unknown}; known: {', '.join(PRESSES)}")
    if not args.ratio > 1:
        parser.error(f"--ratio must be above 1, got {args.ratio:g}")

    import torch
    from tqdm import tqdm
    from transformers import pipeline

    from decodebench.measure.machine import describe

    presses = make_presses(chosen)
    pipe = pipeline("kv-press-text-generation", model=args.checkpoint, device=args.device, dtype=torch.float32)
    items = json.loads(Path(args.items).read_text())
    for item in items:
        item["opening"], item["document_tokens"] = split_context(pipe, item)
    results: dict[str, dict] = {"machine": describe(args.device), "ratio": args.ratio}
    left_out = refused(items, chosen, args.skip_refused)
    results["left_out"] = {name: reason for name, (reason, _) in left_out.items()}
    if args.cost:
        results["cost"] = measure_cost(pipe, items, presses, left_out, args)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    for name, press in presses.items():
        skipped = left_out.get(name, ("", set()))[1]
        per_task: dict[str, dict] = {}
        for task in {task for task, _ in skipped}:
            per_task.setdefault(task, {"scores": {}})["left_out"] = sorted(doc for t, doc in skipped if t == task)
        for item in tqdm(
            [i for i in items if (i["task"], i["doc_id"]) not in skipped], desc=f"{name} @ {args.ratio:g}"
        ):
            answer, kv_bytes = answer_compressed(
                pipe, item, fit(press, item["opening"], item["document_tokens"], args.ratio)
            )
            entry = per_task.setdefault(item["task"], {"scores": {}})
            entry["scores"][str(item["doc_id"])] = score(item["task"], answer, item["references"])
            entry.setdefault("document_kv_bytes", []).append(kv_bytes - item["opening"] * bytes_per_token(pipe))
            entry.setdefault("document_tokens", []).append(item["document_tokens"])
        for entry in per_task.values():
            if entry["scores"]:
                kept = sum(entry["document_kv_bytes"]) / bytes_per_token(pipe)
                entry["achieved_ratio"] = sum(entry["document_tokens"]) / kept
        results[name] = per_task
        means = {task: sum(v["scores"].values()) / len(v["scores"]) for task, v in per_task.items() if v["scores"]}
        print(f"   {means}", flush=True)
        # each finished press is kept, even if a later one fails
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def answer_compressed(pipe, item: dict, press) -> tuple[str, int]:
    """kvpress's pipeline's greedy answer (cut at the task's stops) and the compressed context's key/value bytes, read
    from the cache once the pipeline has removed the answer from it (for KVzip, the share it keeps unmasked)."""
    from transformers import DynamicCache

    from decodebench.models.nugget.compressor import cache_bytes

    cache = DynamicCache()
    answer = pipe(item["document"], question=item["question"], press=press, max_new_tokens=item["max_new"], cache=cache)
    text = answer["answer"]
    for stop in item["stop"]:
        text = text.split(stop)[0]
    return text, round(cache_bytes(cache) * getattr(press, "kept_share", 1.0))


def measure_cost(pipe, items: list[dict], presses: dict, left_out: dict, args) -> dict:
    """Per document, the prefill of its context (opening and document) with no press and with each press that applies,
    the order rotating from document to document: {task: {side: {doc_id: [seconds, peak bytes]}}}. A discarded
    prefill of each side first pays the first-run costs."""
    import contextlib

    import torch
    from tqdm import tqdm
    from transformers import DynamicCache

    from decodebench.measure.memory import open_memory_meter

    meter = open_memory_meter(torch.device(args.device).type, args.device)
    model = pipe.model

    def prefill(item: dict, name: str) -> tuple[float, int | None]:
        context = pipe.preprocess(item["document"], [item["question"]], "", max_context_length=2**31)["context_ids"]
        context = context.to(model.device)
        press = fit(presses[name], item["opening"], item["document_tokens"], args.ratio) if name != "plain" else None
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        meter.start()
        started = time.perf_counter()
        with torch.inference_mode(), press(model) if press else contextlib.nullcontext():
            model.model(input_ids=context, past_key_values=DynamicCache())
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        return time.perf_counter() - started, meter.peak_bytes()

    sides = ["plain", *presses]
    for name in sides:
        prefill(items[0], name)
    cost: dict[str, dict] = {}
    for number, item in enumerate(tqdm(items, desc=f"prefill cost @ {args.ratio:g}")):
        shift = number % len(sides)
        for name in sides[shift:] + sides[:shift]:
            if (item["task"], item["doc_id"]) in left_out.get(name, ("", set()))[1]:
                continue
            seconds, peak = prefill(item, name)
            cost.setdefault(item["task"], {}).setdefault(name, {})[str(item["doc_id"])] = [seconds, peak]
    return {"memory_source": meter.source, "by_task": cost}


def refused(items: list[dict], names: list[str], skip: bool) -> dict[str, tuple[str, set]]:
    """{press: (why, {(task, doc_id)})} of the documents a windowed press cannot compress; without ``skip``, stop
    before any work, naming them."""
    from kvpress import SnapKVPress

    window = SnapKVPress().window_size
    short = {(i["task"], i["doc_id"]) for i in items if i["opening"] + i["document_tokens"] <= window}
    found = {}
    for name in (n for n in names if n in WINDOWED and short):
        reason = (
            f"kvpress's {name} scores a context by the attention of its last {window} tokens and refuses a context "
            "(the chat template's opening and the document) no longer than that"
        )
        if not skip:
            named = ", ".join(f"{task} doc_id {doc}" for task, doc in sorted(short))
            raise SystemExit(f"{reason}: {named}. Leave {name} out (--presses) or pass --skip-refused.")
        found[name] = (reason, short)
    return found


def split_context(pipe, item: dict) -> tuple[int, int]:
    """(opening, document) token counts of the context kvpress's pipeline compresses: the chat template's opening
    (system turn and user header, the same for every document) and the document after it."""
    context = pipe.preprocess(item["document"], [item["question"]], "", max_context_length=2**31)["context_ids"]
    opening = opening_ids(pipe)
    if context[0, : len(opening)].tolist() != opening:
        raise ValueError(
            f"{item['task']} doc_id {item['doc_id']}: its context does not start with the template's opening"
        )
    return len(opening), context.shape[1] - len(opening)


def opening_ids(pipe) -> list[int]:
    marker = "\x00document\x00"
    text = pipe.tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], add_generation_prompt=True, tokenize=False
    )
    return pipe.tokenizer.encode(text.split(marker)[0], add_special_tokens=False)


def bytes_per_token(pipe) -> int:
    """Key and value bytes one token holds across the model's layers."""
    config = pipe.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * pipe.model.dtype.itemsize


if __name__ == "__main__":
    raise SystemExit(main())
