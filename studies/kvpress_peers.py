"""kvpress's presses at the nugget study's ratios, scored like decodebench's tasks, and what each costs.

Runs in its own environment (kvpress 0.5.5 needs transformers<5.3; ``tox -e kvpress``), called
by studies/nugget_study.py with the documents it prepared from the tasks' own prompts::

    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out peers.json
    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out cost.json --cost

Each item holds a task name, the prompt's document (compressed by the press) and its question
or instruction (kept uncompressed), the task's generation length and stop, and the references:
the same split as ``--model nugget``. kvpress's text-generation pipeline applies the chat
template and answers greedily (the question comes after compression, so no press sees it).
``--batch-size 1`` is the pipeline call itself; with more (16 by default), each document is still
compressed alone as the pipeline does it (its preprocessing, the press around the context's
prefill, the question's prefill at the positions after the uncompressed context: ``Compressed``),
and then that many documents are decoded together by the pipeline's greedy rule
(``decode_together``): the same answers, but where batched arithmetic breaks a near tie another
way, at a fraction of the time (a 135M model's step at batch 1 is bound by reading its weights).
--out is written after each batch, and a run started again goes on from there.

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
import functools
import itertools
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


def fitted_to(press, ratio: float, item: dict):
    """``press`` set for ``item``'s document (``fit``)."""
    return fit(press, item["opening"], item["document_tokens"], ratio)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--ratio", type=float, required=True)
    parser.add_argument("--items", required=True, help="JSON list written by nugget_study.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", help="torch device for the pipeline (default cpu)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="documents decoded together after each is compressed alone (default 16; 1: kvpress's own pipeline "
        "call, one document at a time)",
    )
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
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
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
    results: dict[str, dict] = {"machine": describe(args.device), "ratio": args.ratio, "batch_size": args.batch_size}
    left_out = refused(items, chosen, args.skip_refused)
    results["left_out"] = {name: reason for name, (reason, _) in left_out.items()}
    if args.cost:
        results["cost"] = measure_cost(pipe, items, presses, left_out, args)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    out = Path(args.out)
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    if earlier and earlier.get("ratio") != args.ratio:
        raise SystemExit(f"{out} holds ratio {earlier.get('ratio')}, not {args.ratio:g}: name another --out")
    # a run stopped midway goes on from its last written batch: the answers already there are kept
    results["finished"] = earlier.get("finished", [])
    for name, press in presses.items():
        skipped = left_out.get(name, ("", set()))[1]
        per_task: dict[str, dict] = earlier.get(name, {})
        for task in {task for task, _ in skipped}:
            per_task.setdefault(task, {"scores": {}})["left_out"] = sorted(doc for t, doc in skipped if t == task)
        results[name] = per_task
        todo = [
            item
            for item in items
            if (item["task"], item["doc_id"]) not in skipped
            and str(item["doc_id"]) not in per_task.get(item["task"], {}).get("scores", {})
        ]
        # one length limit a batch (a task's), documents of like length together (less padding)
        todo.sort(key=lambda item: (item["task"], item["document_tokens"]))
        batches = []
        for _, grouped in itertools.groupby(todo, key=lambda item: item["task"]):
            task_items = list(grouped)
            batches += [task_items[at : at + args.batch_size] for at in range(0, len(task_items), args.batch_size)]
        with tqdm(total=len(todo), desc=f"{name} @ {args.ratio:g}") as progress:
            for batch in batches:
                answers = answer_compressed(
                    pipe, batch, functools.partial(fitted_to, press, args.ratio), args.batch_size
                )
                for item, (answer, kv_bytes) in zip(batch, answers, strict=True):
                    entry = per_task.setdefault(item["task"], {"scores": {}})
                    entry["scores"][str(item["doc_id"])] = score(item["task"], answer, item["references"])
                    kept_bytes = kv_bytes - item["opening"] * bytes_per_token(pipe)
                    entry.setdefault("document_kv_bytes", []).append(kept_bytes)
                    entry.setdefault("document_tokens", []).append(item["document_tokens"])
                out.write_text(json.dumps(results, indent=2) + "\n")
                progress.update(len(batch))
        for entry in per_task.values():
            if entry["scores"]:
                kept = sum(entry["document_kv_bytes"]) / bytes_per_token(pipe)
                entry["achieved_ratio"] = sum(entry["document_tokens"]) / kept
        means = {task: sum(v["scores"].values()) / len(v["scores"]) for task, v in per_task.items() if v["scores"]}
        print(f"   {means}", flush=True)
        # each finished press is named as such, even if a later one fails
        results["finished"] = sorted({*results["finished"], name})
        out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


class Compressed:
    """One document compressed by a press and its question prefilled, as kvpress's pipeline does at batch 1 (its
    ``_forward`` and the first step of its ``generate_answer``): the cache, KVzip's masked pairs (which kvpress's
    attention patch nulls at every later step), where decoding continues, and the first answer token."""

    def __init__(self, pipe, item: dict, press):
        import torch
        from transformers import DynamicCache

        from decodebench.models.nugget.compressor import cache_bytes

        model = pipe.model
        inputs = pipe.preprocess(item["document"], [item["question"]], "", max_context_length=2**31)
        context, question = inputs["context_ids"].to(model.device), inputs["questions_ids"][0].to(model.device)
        self.cache = DynamicCache()
        with torch.inference_mode():
            with press(model):
                model.model(input_ids=context, past_key_values=self.cache)
            # the compressed context's key/value bytes (for KVzip, the share it keeps unmasked)
            self.kv_bytes = round(cache_bytes(self.cache) * getattr(press, "kept_share", 1.0))
            # positions continue from the uncompressed context, as in kvpress's pipeline
            positions = torch.arange(context.shape[1], context.shape[1] + question.shape[1], device=model.device)
            positions = positions.unsqueeze(0)
            logits = model(
                input_ids=question, past_key_values=self.cache, position_ids=positions, logits_to_keep=1
            ).logits
        self.first = int(logits[0, -1].argmax())
        self.next_position = context.shape[1] + question.shape[1]
        self.masked = [getattr(layer.self_attn, "masked_key_indices", None) for layer in model.model.layers]


def decode_together(pipe, rows: list[Compressed], max_new: int) -> list[str]:
    """Greedy answers of several compressed documents decoded as one batch: each row's cache left-padded to the
    longest with masked zeros, its own positions, KVzip's masked pairs moved to its row and padding. The rule is
    kvpress's ``generate_answer``: the first token from the question's prefill, then up to ``max_new - 1`` steps,
    a row ending at the model's end-of-sequence token (not checked on the first token, as there)."""
    import torch
    from transformers import DynamicCache

    model = pipe.model
    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    longest = max(row.cache.get_seq_length() for row in rows)
    pads = [longest - row.cache.get_seq_length() for row in rows]
    cache = DynamicCache()
    for index, layers in enumerate(zip(*(row.cache.layers for row in rows), strict=True)):
        padded = [
            [torch.nn.functional.pad(tensor, (0, 0, pad, 0)) for tensor in (layer.keys, layer.values)]
            for layer, pad in zip(layers, pads, strict=True)
        ]
        cache.update(torch.cat([k for k, _ in padded]), torch.cat([v for _, v in padded]), index)
    for index, layer in enumerate(model.model.layers):
        # (batch, head, position) of each row's masked pairs, moved to its row and past its padding
        moved = [
            (torch.full_like(found[0], number), found[1], found[2] + pad)
            for number, (row, pad) in enumerate(zip(rows, pads, strict=True))
            if (found := row.masked[index]) is not None
        ]
        layer.self_attn.masked_key_indices = tuple(map(torch.cat, zip(*moved, strict=True))) if moved else None
    device = model.device
    mask = torch.ones(len(rows), longest, dtype=torch.long, device=device)
    for number, pad in enumerate(pads):
        mask[number, :pad] = 0
    generated = [[row.first] for row in rows]
    done = [False] * len(rows)
    tokens = torch.tensor([[row.first] for row in rows], device=device)
    positions = torch.tensor([[row.next_position] for row in rows], device=device)
    try:
        with torch.inference_mode():
            for _ in range(max_new - 1):
                mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long, device=device)], dim=1)
                logits = model(
                    input_ids=tokens,
                    past_key_values=cache,
                    attention_mask=mask,
                    position_ids=positions,
                    logits_to_keep=1,
                ).logits
                tokens = logits[:, -1].argmax(dim=-1, keepdim=True)
                positions = positions + 1
                for number, token in enumerate(tokens[:, 0].tolist()):
                    if not done[number]:
                        generated[number].append(token)
                        done[number] = token in stops
                if all(done):
                    break
    finally:
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
    return [pipe.tokenizer.decode(ids, skip_special_tokens=True) for ids in generated]


def answer_compressed(pipe, items: list[dict], press_for, batch: int = 1) -> list[tuple[str, int]]:
    """Greedy answers (cut at each task's stops) and each compressed context's key/value bytes. ``batch`` 1 is
    kvpress's own pipeline call, one document at a time; a larger batch compresses each document alone the same
    way and decodes up to ``batch`` documents of the same length limit together (``decode_together``): the same
    answers but where batched arithmetic breaks a near tie (tests/kvpress_check.py counts them)."""
    from transformers import DynamicCache

    from decodebench.models.nugget.compressor import cache_bytes

    def cut(item, text):
        for stop in item["stop"]:
            text = text.split(stop)[0]
        return text

    if batch == 1:
        found = []
        for item in items:
            press = press_for(item)
            cache = DynamicCache()
            answer = pipe(
                item["document"], question=item["question"], press=press, max_new_tokens=item["max_new"], cache=cache
            )["answer"]
            found.append((cut(item, answer), round(cache_bytes(cache) * getattr(press, "kept_share", 1.0))))
        return found
    assert len({item["max_new"] for item in items}) == 1, "a batch decodes to one length limit"
    rows = [Compressed(pipe, item, press_for(item)) for item in items]
    answers = decode_together(pipe, rows, items[0]["max_new"])
    return [(cut(item, answer), row.kv_bytes) for item, answer, row in zip(items, answers, rows, strict=True)]


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
