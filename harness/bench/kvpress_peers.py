"""kvpress's presses at the nugget study's ratio, scored like decodebench's tasks.

Runs in its own environment (kvpress 0.5.5 needs transformers<5.3; ``tox -e kvpress``), called
by ``decodebench nugget-study --kvpress-python ...``:

    python -m decodebench.bench.kvpress_peers --checkpoint CKPT --ratio 10 --out peers.json

kvpress's text-generation pipeline compresses the context (the document, inside the chat
template) with the press, then answers the question uncompressed, greedily: the same split as
``--model nugget`` on squad_mini (the document, then the question) and cnndm_mini (the article,
then the instruction). A press's ``compression_ratio`` is the share it drops, 1 - 1/ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SQUAD_QUESTION = "\n\nBased on the provided document, answer the following question:\n{question}"
CNNDM_INSTRUCTION = "\n\nPlease summarize the above document in one sentence."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--ratio", type=float, default=10.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)

    import torch
    from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
    from transformers import pipeline

    from decodebench.lmeval_plugin import TASKS_DIR
    from decodebench.metrics import rouge, squad_normalized_accuracy
    from decodebench.taskdata import load_jsonl

    dropped = 1 - 1 / args.ratio
    presses = {
        "SnapKV": SnapKVPress(compression_ratio=dropped),
        "observed attention": ObservedAttentionPress(compression_ratio=dropped),
        "StreamingLLM": StreamingLLMPress(compression_ratio=dropped),
    }
    # observed attention needs the attention weights, which only eager attention returns
    pipe = pipeline(
        "kv-press-text-generation",
        model=args.checkpoint,
        device="cpu",
        dtype=torch.float32,
        model_kwargs={"attn_implementation": "eager"},
    )
    squad = load_jsonl(TASKS_DIR / "squad" / "squad_mini.jsonl")[: args.limit]
    cnndm = load_jsonl(TASKS_DIR / "cnndm" / "cnndm_mini.jsonl")[: args.limit]
    results = {}
    for name, press in presses.items():
        print(f"kvpress {name} ...", flush=True)
        accuracy = [
            squad_normalized_accuracy(
                pipe(
                    doc["context"],
                    question=SQUAD_QUESTION.format(question=doc["question"]),
                    press=press,
                    max_new_tokens=64,
                )["answer"],
                doc["answers"]["text"],
            )
            for doc in squad
        ]
        rouge_l = [
            rouge(
                pipe(doc["article"].replace("\n\n", "\n"), question=CNNDM_INSTRUCTION, press=press, max_new_tokens=128)[
                    "answer"
                ].split("\n\n")[0],
                doc["highlights"],
            )["rougeL"]
            for doc in cnndm
        ]
        results[name] = {"squad_mini": sum(accuracy) / len(accuracy), "cnndm_mini": sum(rouge_l) / len(rouge_l)}
        print(f"   {results[name]}", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
