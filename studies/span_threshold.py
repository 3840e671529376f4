"""How ``selector=answer-spans`` reads its scorer: the span threshold and the repeat rule, chosen on SQuAD dev
questions that squad_mini does not hold (the evaluation's 500 are left out, so the choice does not see them).

    python studies/span_threshold.py --data ../shared/data

Draws ``--questions`` of SQuAD v1.1 dev's 10,570 questions outside squad_mini (seeded; the data pack's
``squad/validation.jsonl``), splits each as ``--model nugget`` does (studies/nugget_kept.py), scores its document
once with the answer-span scorer (the shipped one, or ``--scorer PATH``), and prints, for every threshold and with
and without the repeat rule (``kernels.nugget.span_scores``), the share of questions whose whole first reference
answer is kept at ratios 5 and 10 (only the document compressed, the opening kept whole), with 95% Wilson
intervals. A threshold of +inf joins no words into spans (single whole words, numbers whole).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from build_samples import TASKS, read_jsonl
from nugget_kept import RATIOS, split_question

SEED = 7
THRESHOLDS = (math.inf, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0)


def draw(data: Path, questions: int, seed: int) -> list[dict]:
    """``questions`` SQuAD dev questions outside squad_mini, in a seeded random order."""
    evaluated = {row["id"] for row in read_jsonl(TASKS / "squad" / "squad_mini.jsonl")}
    rows = [row for row in read_jsonl(data / "squad" / "validation.jsonl") if row["id"] not in evaluated]
    random.Random(seed).shuffle(rows)
    return rows[:questions]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the data pack (its squad/validation.jsonl)")
    parser.add_argument("--questions", type=int, default=500, help="questions drawn (default 500)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the draw's seed (default {SEED})")
    parser.add_argument(
        "--scorer",
        default="answer-spans",
        help="the answer-span scorer: a checkpoint of train-nugget --recipe answer-spans (default: the shipped one)",
    )
    args = parser.parse_args(argv)

    import common
    import torch
    from lm_eval.api.registry import get_model
    from tqdm import tqdm

    from decodebench.kernels.nugget import SPAN_LOGIT, select_topk, span_scores
    from decodebench.stats import wilson_interval

    task, _ = common.task_docs("squad_mini", 1)  # its prompt (doc_to_text) is every SQuAD task's
    lm = get_model("nugget").create_from_arg_string(f"pretrained=embedded,selector={args.scorer},device=cpu")
    scorer = lm.method.selector.scorer
    questions = []
    with torch.inference_mode():
        for doc in tqdm(draw(args.data, args.questions, args.seed), desc="scoring"):
            ids, n, opening, answer = split_question(lm, task, doc, doc["id"])
            logits = scorer.score(lm.model, torch.tensor([ids[:n]])).float().cpu()
            questions.append(([lm.tokenizer.decode([t]) for t in ids[:n]], logits, n, opening, answer))

    def kept(threshold: float, repeats_last: bool, ratio: float) -> str:
        hits = 0
        for texts, logits, n, opening, answer in questions:
            scores = span_scores(texts, logits, threshold, repeats_last)
            indices, _ = select_topk(scores[None], torch.tensor([n]), ratio, kept_whole=torch.tensor([opening]))
            hits += set(answer) <= set(indices[0].tolist())
        interval = wilson_interval(hits, len(questions))
        return f"{hits / len(questions):.3f} [{interval.low:.3f}, {interval.high:.3f}]"

    print(f"\nwhole answer kept, n = {len(questions)} SQuAD dev questions outside squad_mini (seed {args.seed})")
    print("| span threshold (logit) | repeats last | " + " | ".join(f"ratio {r:g}" for r in RATIOS) + " |")
    print("|---|---|" + "---:|" * len(RATIOS))
    for threshold in (*THRESHOLDS, SPAN_LOGIT):
        shipped = " (shipped: p = 0.05)" if threshold == SPAN_LOGIT else ""
        for repeats_last in (False, True):
            cells = " | ".join(kept(threshold, repeats_last, ratio) for ratio in RATIOS)
            print(f"| {threshold:g}{shipped} | {'yes' if repeats_last else 'no'} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
