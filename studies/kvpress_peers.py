"""kvpress's presses at the nugget study's ratio, scored like decodebench's tasks.

Runs in its own environment (kvpress 0.5.5 needs transformers<5.3; ``tox -e kvpress``), called
by studies/nugget_study.py with the documents it prepared from the tasks' own prompts::

    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out peers.json

Each item holds a task name, the prompt's document (compressed by the press) and its question
or instruction (kept uncompressed), the task's generation length and stop, and the references:
the same split as ``--model nugget``. kvpress's text-generation pipeline applies the chat
template and answers greedily. A press's ``compression_ratio`` is the share it drops, 1 - 1/ratio.
SnapKV cannot compress a document no longer than its observation window (kvpress asserts mid-run):
with ``--skip-refused`` it runs on the other documents and --out names those left out and why.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PRESSES = ("SnapKV", "observed attention", "StreamingLLM")


def score(task: str, answer: str, references: list[str]) -> float:
    from decodebench.metrics import rouge, squad_normalized_accuracy

    if task.startswith("squad"):
        return squad_normalized_accuracy(answer, references)
    return rouge(answer, references[0])["rougeLsum"]


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
        "failing (SnapKV cannot compress a document no longer than its window)",
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="add time to first token, document KV bytes and peak memory to the presses already scored in --out",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.presses.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in PRESSES]:
        parser.error(f"unknown press(es) {unknown}; known: {', '.join(PRESSES)}")

    import torch
    from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
    from tqdm import tqdm
    from transformers import pipeline

    from decodebench.measure.machine import describe
    from decodebench.measure.memory import open_memory_meter

    dropped = 1 - 1 / args.ratio
    presses = {
        "SnapKV": SnapKVPress(compression_ratio=dropped),
        "observed attention": ObservedAttentionPress(compression_ratio=dropped),
        "StreamingLLM": StreamingLLMPress(compression_ratio=dropped),
    }
    presses = {name: presses[name] for name in chosen}
    # observed attention needs the attention weights, which only eager attention returns
    pipe = pipeline(
        "kv-press-text-generation",
        model=args.checkpoint,
        device=args.device,
        dtype=torch.float32,
        model_kwargs={"attn_implementation": "eager"},
    )
    items = json.loads(Path(args.items).read_text())
    results: dict[str, dict] = json.loads(Path(args.out).read_text()) if args.measure_only else {}
    left_out: dict[str, set[tuple[str, int]]] = {}  # press -> (task, doc_id) of the items it cannot apply to
    if "SnapKV" in presses and (short := too_short(pipe, items, presses["SnapKV"].window_size)):
        # kvpress asserts this mid-run, after the presses before it have spent their time
        reason = (
            f"kvpress's SnapKV scores a document by the attention of its last {presses['SnapKV'].window_size} "
            "tokens and refuses documents (with the chat template) no longer than that"
        )
        named = "; ".join(
            f"{task} doc_id {', '.join(str(item['doc_id']) for item in group)}" for task, group in short.items()
        )
        if not args.skip_refused:
            raise SystemExit(f"{reason}: {named}. Leave SnapKV out (--presses) or pass --skip-refused.")
        print(f"SnapKV leaves out {named}: {reason}", flush=True)
        results["left_out"] = {"SnapKV": reason}
        left_out["SnapKV"] = {(item["task"], item["doc_id"]) for group in short.values() for item in group}
    meter = open_memory_meter(torch.device(args.device).type, args.device)
    machine = describe(args.device)
    for name, press in presses.items():
        per_task: dict[str, dict] = results.get(name, {}) if args.measure_only else {}
        skipped = left_out.get(name, set())
        for task in {task for task, _ in skipped}:
            per_task.setdefault(task, {"scores": {}})["left_out"] = sorted(doc for t, doc in skipped if t == task)
        measured: dict[str, list[dict]] = {}
        applies = [item for item in items if (item["task"], item["doc_id"]) not in skipped]
        for item in tqdm(applies, desc=f"kvpress {name} @ {args.ratio:g}"):
            measured.setdefault(item["task"], []).append(first_token(pipe, item, press, meter))
            if args.measure_only:
                continue
            answer = pipe(item["document"], question=item["question"], press=press, max_new_tokens=item["max_new"])
            text = answer["answer"]
            for stop in item["stop"]:
                text = text.split(stop)[0]
            task = per_task.setdefault(item["task"], {"scores": {}})
            task["scores"][str(item["doc_id"])] = score(item["task"], text, item["references"])
        for task, records in measured.items():
            entry = per_task.setdefault(task, {"scores": {}})
            entry.update(
                achieved_ratio=sum(r["context_tokens"] for r in records) / sum(r["kept_tokens"] for r in records),
                document_kv_bytes=[r["kv_bytes"] for r in records],
                ttft_s=[r["ttft_s"] for r in records],
                peak_memory_bytes=max((r["peak_bytes"] for r in records if r["peak_bytes"] is not None), default=None),
                memory_source=meter.source,
                machine=machine,
            )
            if window := getattr(press, "window_size", None):
                # SnapKV pads its window's scores above every other score, so a budget within the window keeps
                # only window tokens: the context's last ones
                within = sum(r["kept_tokens"] <= window for r in records)
                entry["note"] = (
                    f"keeps no more tokens than its {window}-token observation window on {within} of {len(records)} "
                    "documents, and ranks that window above every other token: there it keeps only the context's "
                    "last tokens"
                )
        results[name] = per_task
        means = {task: sum(v["scores"].values()) / len(v["scores"]) for task, v in per_task.items() if v["scores"]}
        print(f"   {means}", flush=True)
        # each finished press is kept, even if a later one fails
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def first_token(pipe, item: dict, press, meter) -> dict:
    """One document through the press up to its first answer token (``max_new_tokens=1``): the time to first token
    (tokenizing, prefill and press, the question, one token), the peak memory of that window, and the compressed
    context's key/value bytes, read from the cache once kvpress has removed the answer from it. The scored
    generation runs separately, so that its score is exactly kvpress's own pipeline's."""
    from transformers import DynamicCache

    from decodebench.models.nugget.compressor import cache_bytes

    cache = DynamicCache()
    meter.start()
    started = time.perf_counter()
    pipe(item["document"], question=item["question"], press=press, max_new_tokens=1, cache=cache)
    ttft, peak = time.perf_counter() - started, meter.peak_bytes()
    return {
        "ttft_s": ttft,
        "peak_bytes": peak,
        "kv_bytes": cache_bytes(cache),
        "context_tokens": context_tokens(pipe, item),
        "kept_tokens": cache.get_seq_length(),
    }


def too_short(pipe, items: list[dict], window: int) -> dict[str, list[dict]]:
    """Per task, the items whose document, as kvpress's pipeline tokenizes it, has no more than ``window`` tokens."""
    short: dict[str, list[dict]] = {}
    for item in items:
        if context_tokens(pipe, item) <= window:
            short.setdefault(item["task"], []).append(item)
    return short


def context_tokens(pipe, item: dict) -> int:
    """The length of the context kvpress's pipeline compresses: the document with the chat template's header."""
    return pipe.preprocess(item["document"], [item["question"]], "", max_context_length=2**31)["context_ids"].shape[1]


if __name__ == "__main__":
    raise SystemExit(main())
