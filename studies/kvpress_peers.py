"""kvpress's presses at the nugget study's ratio, scored like decodebench's tasks.

Runs in its own environment (kvpress 0.5.5 needs transformers<5.3; ``tox -e kvpress``), called
by studies/nugget_study.py with the documents it prepared from the tasks' own prompts::

    python studies/kvpress_peers.py --checkpoint CKPT --ratio 10 --items items.json --out peers.json

Each item holds a task name, the prompt's document (compressed by the press) and its question
or instruction (kept uncompressed), the task's generation length and stop, and the references:
the same split as ``--model nugget``. kvpress's text-generation pipeline applies the chat
template and answers greedily. A press's ``compression_ratio`` is the share it drops, 1 - 1/ratio.
"""

from __future__ import annotations

import argparse
import json
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
        help="leave out a press that cannot apply to these documents (saying why in --out) instead of failing",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.presses.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in PRESSES]:
        parser.error(f"unknown press(es) {unknown}; known: {', '.join(PRESSES)}")

    import torch
    from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
    from tqdm import tqdm
    from transformers import pipeline

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
    results: dict[str, dict] = {}
    if "SnapKV" in presses and (short := too_short(pipe, items, presses["SnapKV"].window_size)):
        # kvpress asserts this mid-run, after the presses before it have spent their time
        reason = (
            f"kvpress's SnapKV scores a document by the attention of its last {presses['SnapKV'].window_size} "
            "tokens and refuses documents (with the chat template) no longer than that: "
            + "; ".join(f"{task} doc_id {', '.join(map(str, ids))}" for task, ids in short.items())
        )
        if not args.skip_refused:
            raise SystemExit(reason + ". Leave SnapKV out (--presses) or pass --skip-refused.")
        print(f"leaving SnapKV out: {reason}", flush=True)
        results["refused"] = {"SnapKV": reason}
        del presses["SnapKV"]
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, press in presses.items():
        per_task: dict[str, dict] = {}
        for item in tqdm(items, desc=f"kvpress {name} @ {args.ratio:g}"):
            answer = pipe(item["document"], question=item["question"], press=press, max_new_tokens=item["max_new"])
            text = answer["answer"]
            for stop in item["stop"]:
                text = text.split(stop)[0]
            task = per_task.setdefault(item["task"], {"scores": {}})  # achieved ratio: not measured here
            task["scores"][str(item["doc_id"])] = score(item["task"], text, item["references"])
        results[name] = per_task
        means = {task: sum(v["scores"].values()) / len(v["scores"]) for task, v in per_task.items()}
        print(f"   {means}", flush=True)
        # each finished press is kept, even if a later one fails
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def too_short(pipe, items: list[dict], window: int) -> dict[str, list[int]]:
    """Documents whose context, as kvpress's pipeline tokenizes it, has no more than ``window`` tokens."""
    short: dict[str, list[int]] = {}
    for item in items:
        ids = pipe.preprocess(item["document"], [item["question"]], "", max_context_length=2**31)["context_ids"]
        if ids.shape[1] <= window:
            short.setdefault(item["task"], []).append(item["doc_id"])
    return short


if __name__ == "__main__":
    raise SystemExit(main())
