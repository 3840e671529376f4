"""Where the answer goes: how often each nugget selector keeps a SQuAD answer's tokens, and what the nugget
study's answers do when it does not.

``tox -e nugget-kept`` (``python studies/nugget_kept.py``) builds squad_mini's 500 prompts as ``lm_eval
--apply_chat_template`` does, splits each as ``--model nugget`` does (the document before the last blank line),
and asks every selector of the nugget study, at ratios 5 and 10, which of the document's tokens it keeps: the
paper's method as shipped (``selector=trained``: its scorer, the checkpoint for that ratio), the delimiter
stand-in, the salience peer (names and numbers, then surprisal, whole words), truncation, StreamingLLM and query-aware
attention. A question's answer counts as kept when every
document token overlapping its first reference answer is kept.

The page then joins this with the nugget study's per-question scores (docs/data/nugget-study/, the same 500
questions): each selector's accuracy when its kept tokens hold the answer and when they do not, beside full
context's accuracy on the same two groups of questions. The paper's nuggets are meant to carry the text around
them (the encoder adapter builds them, section 3); a trained method whose accuracy falls, where the answer was
dropped, to what truncation manages there is not carrying it.

Per-question data: docs/data/nugget-kept/; ``--from`` renders the page from it and the nugget study's data.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import common
from common import doc_parser, kept_results, load_json, page, record_run, run_header, save_json

SELECTORS = ("trained", "delimiter", "salience", "truncation", "streaming", "query-attention")
RATIOS = (5.0, 10.0)
TASK = "squad_mini"
STUDY_DATA = common.DATA / "nugget-study"


def answer_tokens(offsets: list[tuple[int, int]], prompt: str, context: str, start: int, answer: str) -> list[int]:
    """Indices of the tokens (``offsets``: each token's characters in ``prompt``) overlapping ``answer``, which
    starts at ``start`` in ``context`` inside ``prompt``."""
    at = prompt.find(context)
    if at < 0 or context[start : start + len(answer)] != answer:
        raise ValueError(f"answer {answer!r} not found at {start} in its context within the prompt")
    begin, end = at + start, at + start + len(answer)
    return [index for index, (first, last) in enumerate(offsets) if first < end and last > begin]


def collect(folder: Path, argv: list[str], args) -> None:
    import torch
    from lm_eval.api.registry import get_model
    from tqdm import tqdm

    from decodebench.kernels.nugget import select_topk

    started = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    task, docs = common.task_docs(TASK, args.limit)
    records = [{"doc_id": i, "kept": {}} for i in range(len(docs))]
    for name in SELECTORS:
        for ratio in RATIOS if name == "trained" else RATIOS[:1]:  # only the trained scorer differs by ratio
            lm = get_model("nugget").create_from_arg_string(
                f"pretrained=embedded,selector={name},ratio={ratio:g},device={device}"
            )
            method = lm.method
            for record, doc in zip(records, tqdm(docs, desc=f"{name} @ {ratio:g}"), strict=True):
                prompt = lm.apply_chat_template([{"role": "user", "content": task.doc_to_text(doc)}])
                ids = lm.tok_batch_encode([prompt])[0][0].tolist()
                encoded = lm.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
                if encoded["input_ids"] != ids:
                    raise ValueError(
                        f"question {record['doc_id']}: its offsets are not those of the tokens lm_eval sent"
                    )
                n = method.split_point(lm, ids)
                answer = answer_tokens(
                    encoded["offset_mapping"],
                    prompt,
                    doc["context"],
                    doc["answers"]["answer_start"][0],
                    doc["answers"]["text"][0],
                )
                if not answer or answer[-1] >= n:
                    raise ValueError(f"question {record['doc_id']}: its answer is not inside the document")
                record.update(document_tokens=n, answer_tokens=len(answer))
                with torch.inference_mode():
                    scores = method.selector.scores(lm, torch.tensor([ids[:n]], device=lm.device), ids[n:])
                for kept_ratio in [ratio] if name == "trained" else RATIOS:
                    indices, _ = select_topk(scores.float()[None].cpu(), torch.tensor([n]), kept_ratio)
                    kept = set(indices[0].tolist())
                    record["kept"][f"{name}@{kept_ratio:g}"] = sum(i in kept for i in answer)
            del lm, method
    save_json(folder, "answers_kept.json", records)
    record_run(folder, __file__, argv, started)


def study_scores(name: str, ratio: float | None) -> dict[int, float] | None:
    """The nugget study's per-question accuracy for one row, by doc_id (None: the study has not run it)."""
    from nugget_study import Row, folder_name

    run = STUDY_DATA / "runs" / folder_name(name, ratio) / TASK
    if not run.is_dir():
        return None
    return Row(name, ratio, [kept_results(run)]).scores[TASK]


def accuracy(scores: list[float] | None) -> str:
    from decodebench.stats import wilson_interval

    if scores is None:
        return "not in the nugget study"
    if not scores:
        return "- (n = 0)"
    interval = wilson_interval(int(sum(scores)), len(scores))
    return f"{sum(scores) / len(scores):.3f} [{interval.low:.3f}, {interval.high:.3f}] (n = {len(scores)})"


def render(folder: Path) -> str:
    from decodebench.stats import wilson_interval

    records = load_json(folder, "answers_kept.json")
    full = study_scores("full", None)
    if sorted(full) != [r["doc_id"] for r in records]:
        raise ValueError(f"{STUDY_DATA}: its {TASK} questions are not the {len(records)} this page's data has")
    lines = [
        *run_header(folder, "Where the answer goes: the answer's tokens each nugget selector keeps", "nugget-kept"),
        f"- task: {TASK}, n = {len(records)} real SQuAD v1.1 dev questions; the embedded SmolLM2-135M-Instruct; "
        "prompts as `lm_eval --apply_chat_template` builds them, the document split as `--model nugget` splits it",
        f"- answer tokens: the document tokens overlapping the first reference answer (mean "
        f"{sum(r['answer_tokens'] for r in records) / len(records):.1f}; documents mean "
        f"{sum(r['document_tokens'] for r in records) / len(records):.0f} tokens); kept: all of them are among the "
        "ceil(n / ratio) tokens the selector keeps",
        "- accuracy: the nugget study's per-question scores for that selector and ratio (docs/nugget-study.md, "
        "the same questions), split by whether the selector kept the answer; full context's accuracy on the same "
        "split says how hard each group of questions is; 95% Wilson intervals",
        "",
        "| selector | ratio | answer kept [95% CI] | mean share of answer tokens kept | accuracy, answer kept | "
        "full context there | accuracy, answer dropped | full context there |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ratio in RATIOS:
        for name in SELECTORS:
            key = f"{name}@{ratio:g}"
            scores = study_scores(name, ratio)
            kept = [r["kept"][key] == r["answer_tokens"] for r in records]
            interval = wilson_interval(sum(kept), len(kept))
            share = sum(r["kept"][key] / r["answer_tokens"] for r in records) / len(records)
            groups = {
                was_kept: [r["doc_id"] for r, k in zip(records, kept, strict=True) if k == was_kept]
                for was_kept in (True, False)
            }
            lines.append(
                f"| {name} | {ratio:g} | {sum(kept) / len(kept):.3f} [{interval.low:.3f}, {interval.high:.3f}] | "
                f"{share:.3f} | "
                + " | ".join(
                    f"{accuracy(None if scores is None else [scores[i] for i in groups[g]])} | "
                    f"{accuracy([full[i] for i in groups[g]])}"
                    for g in (True, False)
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/nugget-kept.md")
    parser.add_argument("--limit", type=int, default=None, help=f"{TASK} questions (default: all, as the study)")
    args: argparse.Namespace = parser.parse_args(argv)
    return page(args, argv, lambda folder, command: collect(folder, command, args), render)


if __name__ == "__main__":
    sys.exit(main())
