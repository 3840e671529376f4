"""Where the answer goes: how often each nugget selector keeps a SQuAD answer's tokens, and what the nugget
study's answers do when it does not.

``tox -e nugget-kept`` (``python studies/nugget_kept.py``) builds squad_mini's 500 prompts as ``lm_eval
--apply_chat_template`` does, splits each as ``--model nugget`` does (the chat template's opening, the document,
and the question after the last blank line), and asks every selector of the nugget study, at ratios 5 and 10,
which tokens it keeps in both layouts ``--model nugget`` offers (one scoring pass: a selector scores the same
tokens in both): only the document compressed, the opening kept whole (``wrapper=kept``, the authors' layout and
the default), and the opening compressed with the document (``wrapper=compressed``, the nugget study's): the
paper's method as shipped (``selector=trained``: its scorer, the checkpoint for that ratio), the answer-span
scorer (``selector=answer-spans``, ours: trained toward marked terms, names and numbers, whole spans), the delimiter
stand-in, the salience peer (names and numbers, then surprisal, whole words), the question-overlap peer (the sentences
sharing most words with the question first, salience within them), truncation, StreamingLLM and query-aware
attention. A question's answer counts as kept when every
document token overlapping its first reference answer is kept.

The page then joins this with the nugget study's per-question scores (docs/data/nugget-study/, the same 500
questions): each selector's accuracy when its kept tokens hold the answer and when they do not, beside full
context's accuracy on the same two groups of questions. The paper's nuggets are meant to carry the text around
them (the encoder adapter builds them, section 3); a trained method whose accuracy falls, where the answer was
dropped, to what truncation manages there is not carrying it.

Per-question data: docs/data/nugget-kept/; ``--from`` renders the page from it and the nugget study's data.

A checkpoint from ``decodebench train-nugget`` is gated the same way before any generation run (issue 35):
``--checkpoint PATH`` adds it as a selector at the ratio it was trained for, ``--selectors`` picks the built-in ones
beside it, ``--limit`` the questions and ``--doc`` a page of its own, e.g. ``python studies/nugget_kept.py
--checkpoint r5.safetensors --selectors trained,truncation --limit 200 --doc /tmp/gate.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import common
from common import doc_parser, load_json, page, record_run, run_header, save_json
from nugget_study import OURS

# the kept token types listed per selector
TOP_TYPES = 10
# the nugget study's selectors (the scorer-only ablation keeps what the trained method keeps)
SELECTORS = tuple(name for name in OURS if name != "scorer only")
RATIOS = (5.0, 10.0)
TASK = "squad_mini"
STUDY_DATA = common.DATA / "nugget-study"
# the nugget study run in each layout: its page, and its data folder
STUDIES = {
    "compressed": ("docs/nugget-study.md", STUDY_DATA),
    "kept": ("docs/nugget-study-kept.md", common.DATA / "nugget-study-kept"),
}


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
    records = [{"doc_id": i} for i in range(len(docs))]
    kept_types: dict[str, Counter] = {}  # name@ratio -> the document tokens it keeps (wrapper=kept), by text
    for name, selector, ratio, kept_ratios in selector_runs(args.selectors, args.checkpoint):
        lm = get_model("nugget").create_from_arg_string(
            f"pretrained=embedded,selector={selector},ratio={ratio:g},device={device}"
        )
        method = lm.method
        for record, doc in zip(records, tqdm(docs, desc=f"{name} @ {ratio:g}"), strict=True):
            ids, n, opening, answer = split_question(lm, task, doc, record["doc_id"])
            record.update(document_tokens=n, opening_tokens=opening, answer_tokens=len(answer))
            with torch.inference_mode():
                scores = method.selector.scores(lm, torch.tensor([ids[:n]], device=lm.device), ids[n:])
            for kept_ratio in kept_ratios:
                for layout, whole in (("kept", opening), ("compressed", 0)):
                    indices, _ = select_topk(
                        scores.float()[None].cpu(), torch.tensor([n]), kept_ratio, kept_whole=torch.tensor([whole])
                    )
                    kept = set(indices[0].tolist())
                    key = f"{name}@{kept_ratio:g}"
                    record.setdefault(f"wrapper={layout}", {})[key] = sum(i in kept for i in answer)
                    if layout == "kept":
                        kept_types.setdefault(key, Counter()).update(
                            lm.tokenizer.decode([ids[i]]) for i in kept if i >= opening
                        )
        del lm, method
    save_json(folder, "answers_kept.json", records)
    save_json(
        folder,
        "kept_types.json",
        {key: {"kept": sum(c.values()), "top": c.most_common(TOP_TYPES)} for key, c in sorted(kept_types.items())},
    )
    record_run(folder, __file__, argv, started)


def split_question(lm, task, doc: dict, doc_id) -> tuple[list[int], int, int, list[int]]:
    """A SQuAD question's prompt as lm_eval sends it (``--apply_chat_template``) to ``--model nugget`` (``lm``): its
    tokens, where the document ends (``n``), the opening kept whole (``wrapper=kept``, the default), and the indices
    of the document tokens overlapping the first reference answer."""
    from nugget_prefill_bench import prompt_tokens

    prompt, ids, n, opening = prompt_tokens(lm, task, doc)
    encoded = lm.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    if encoded["input_ids"] != ids:
        raise ValueError(f"question {doc_id}: its offsets are not those of the tokens lm_eval sent")
    start, text = doc["answers"]["answer_start"][0], doc["answers"]["text"][0]
    answer = answer_tokens(encoded["offset_mapping"], prompt, doc["context"], start, text)
    if not answer or answer[-1] >= n:
        raise ValueError(f"question {doc_id}: its answer is not inside the document")
    if answer[0] < opening:
        raise ValueError(f"question {doc_id}: its answer starts inside the template's opening")
    return ids, n, opening, answer


def selector_runs(selectors: list[str], checkpoints: list[str]) -> list[tuple[str, str, float, list[float]]]:
    """(name on the page, --model_args selector, the ratio it scores at, the ratios its scores are cut at): a trained
    scorer (the shipped one per ratio, or a checkpoint at its own ratio) differs by ratio, the others do not."""
    from decodebench.models.nugget.checkpoint import read_checkpoint
    from decodebench.models.nugget.span_training import OBJECTIVE

    runs = []
    for name in selectors:
        for ratio in RATIOS if name == "trained" else RATIOS[:1]:
            runs.append((name, name, ratio, [ratio] if name == "trained" else list(RATIOS)))
    for path in checkpoints:
        checkpoint = read_checkpoint(path)  # a file that is not a checkpoint is named before anything loads
        if checkpoint.training.get("objective") == OBJECTIVE:  # an answer-span scorer: one for every ratio
            runs.append((Path(path).stem, str(Path(path).resolve()), RATIOS[0], list(RATIOS)))
        else:
            runs.append((Path(path).stem, str(Path(path).resolve()), checkpoint.ratio, [checkpoint.ratio]))
    return runs


def page_rows(records: list[dict]) -> list[tuple[float, str]]:
    """(ratio, selector) of every column the data holds, by ratio: the built-in selectors in SELECTORS' order, then
    checkpoints by name (the data's keys are stored sorted)."""
    keys = [key.rsplit("@", 1) for key in records[0]["wrapper=kept"]]
    names = {name for name, _ in keys}
    order = [name for name in SELECTORS if name in names] + sorted(names - set(SELECTORS))
    ratios = sorted({float(ratio) for _, ratio in keys})
    present = {(name, float(ratio)) for name, ratio in keys}
    return [(ratio, name) for ratio in ratios for name in order if (name, ratio) in present]


def study_scores(name: str, ratio: float | None, data: Path = STUDY_DATA) -> dict[int, float] | None:
    """The nugget study's per-question accuracy for one row, by doc_id (None: the study has not run it)."""
    from nugget_study import Row, folder_name, kept_runs

    run = kept_runs(data).get(folder_name(name, ratio), {}).get(TASK)
    return None if run is None else Row(name, ratio, [run]).scores[TASK]


def accuracy(scores: list[float] | None) -> str:
    from decodebench.stats import wilson_interval

    if scores is None:
        return "not in the nugget study"
    if not scores:
        return "- (n = 0)"
    interval = wilson_interval(int(sum(scores)), len(scores))
    return f"{sum(scores) / len(scores):.3f} [{interval.low:.3f}, {interval.high:.3f}] (n = {len(scores)})"


def answers_kept(records: list[dict], layout: str, key: str) -> list[bool]:
    """Per question: did the selector (``name@ratio``) keep every token of the answer in that layout."""
    return [r[f"wrapper={layout}"][key] == r["answer_tokens"] for r in records]


def share_text(kept: list[bool]) -> str:
    from decodebench.stats import wilson_interval

    interval = wilson_interval(sum(kept), len(kept))
    return f"{sum(kept) / len(kept):.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def paired_text(kept: list[bool], other: list[bool]) -> str:
    from decodebench.stats import mcnemar_comparison

    found = mcnemar_comparison([float(k) for k in kept], [float(k) for k in other])
    return f"{found.difference:+.3f} [{found.interval.low:+.3f}, {found.interval.high:+.3f}] p={found.p_value:.2g}"


def accuracy_section(records: list[dict], full: dict[int, float], layout: str, study_page: str, data: Path) -> list:
    """The nugget study run with ``wrapper=layout``: each selector's accuracy on the questions whose answer that
    layout kept and on the others, beside full context's on the same two groups."""
    lines = [
        "",
        f"## wrapper={layout}: what the nugget study's answers do when the answer was kept, and when not",
        "",
        f"The nugget study run with `wrapper={layout}` ({study_page}); its answers split by what that layout kept: "
        "each selector's accuracy on the questions whose answer it kept and on the others, beside full context's "
        "accuracy on the same two groups (how hard each group is).",
        "",
        "| selector | ratio | answer kept [95% CI] | mean share of answer tokens kept | accuracy, answer kept | "
        "full context there | accuracy, answer dropped | full context there |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ratio, name in page_rows(records):
        key = f"{name}@{ratio:g}"
        scores = study_scores(name, ratio, data)
        kept = answers_kept(records, layout, key)
        share = sum(r[f"wrapper={layout}"][key] / r["answer_tokens"] for r in records) / len(records)
        groups = {
            was_kept: [r["doc_id"] for r, k in zip(records, kept, strict=True) if k == was_kept]
            for was_kept in (True, False)
        }
        lines.append(
            f"| {name} | {ratio:g} | {share_text(kept)} | {share:.3f} | "
            + " | ".join(
                f"{accuracy(None if scores is None else [scores[i] for i in groups[g]])} | "
                f"{accuracy([full[i] for i in groups[g]])}"
                for g in (True, False)
            )
            + " |"
        )
    return lines


def kept_types_section(folder: Path, records: list[dict]) -> list[str]:
    """What each selector keeps of the documents (wrapper=kept): its most kept token types and their share of all it
    keeps. A scorer that has learned the paper's delimiter pattern shows punctuation and function words here."""
    if not (folder / "kept_types.json").is_file():  # data collected before this section existed
        return []
    types = load_json(folder, "kept_types.json")
    lines = [
        "",
        "## What each selector keeps of the documents (wrapper=kept)",
        "",
        f"The document tokens each selector kept over the {len(records)} questions, and its {TOP_TYPES} most kept "
        "token types (by text) with their share of everything it kept.",
        "",
        f"| selector | ratio | document tokens kept | share of the {TOP_TYPES} most kept types | the most kept types |",
        "|---|---:|---:|---:|---|",
    ]
    for ratio, name in page_rows(records):
        found = types.get(f"{name}@{ratio:g}")
        if found is None:
            continue
        top = sum(count for _, count in found["top"])
        listed = ", ".join(
            # double backticks: a kept backtick stays inside its code span
            f"`` {text!r} ``".replace("|", "\\|") + f" {count / found['kept']:.2f}"
            for text, count in found["top"]
        )
        lines.append(f"| {name} | {ratio:g} | {found['kept']} | {top / found['kept']:.2f} | {listed} |")
    return lines


def render(folder: Path) -> str:
    records = load_json(folder, "answers_kept.json")
    full = study_scores("full", None)
    if not {r["doc_id"] for r in records} <= set(full):
        raise ValueError(f"{STUDY_DATA}: its {TASK} questions do not include the {len(records)} this page's data has")

    def mean(value) -> float:
        return sum(value(r) for r in records) / len(records)

    lines = [
        *run_header(folder, "Where the answer goes: the answer's tokens each nugget selector keeps", "nugget-kept"),
        f"- task: {TASK}, n = {len(records)} real SQuAD v1.1 dev questions; the embedded SmolLM2-135M-Instruct; "
        "prompts as `lm_eval --apply_chat_template` builds them, split as `--model nugget` splits them: the chat "
        f"template's opening (its system turn and the user header, mean {mean(lambda r: r['opening_tokens']):.0f} "
        f"tokens), the document (mean {mean(lambda r: r['document_tokens'] - r['opening_tokens']):.0f} tokens), "
        "then the question after the last blank line, never compressed",
        f"- answer tokens: the document tokens overlapping the first reference answer (mean "
        f"{mean(lambda r: r['answer_tokens']):.1f}); kept: all of them are among the tokens the selector keeps. "
        "`wrapper=kept` (the default, the authors' layout): the opening kept whole and ceil(n / ratio) of the "
        "document's n tokens; `wrapper=compressed` (the nugget study's layout): ceil(n / ratio) of the opening "
        "and document together. Both from one scoring pass: a selector scores the same tokens in both",
        "- intervals: 95% Wilson; paired differences: McNemar exact on the same questions, with the interval it "
        "implies",
        "",
        "## How often the answer is kept",
        "",
        "| selector | ratio | answer kept, wrapper=kept | answer kept, wrapper=compressed | kept - compressed | "
        "wrapper=kept: vs truncation | wrapper=kept: vs streaming |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    columns = set(records[0]["wrapper=kept"])
    for ratio, name in page_rows(records):
        key = f"{name}@{ratio:g}"
        kept, compressed = answers_kept(records, "kept", key), answers_kept(records, "compressed", key)
        peers = [
            "-"
            if peer == name or f"{peer}@{ratio:g}" not in columns
            else paired_text(kept, answers_kept(records, "kept", f"{peer}@{ratio:g}"))
            for peer in ("truncation", "streaming")
        ]
        lines.append(
            f"| {name} | {ratio:g} | {share_text(kept)} | {share_text(compressed)} | "
            f"{paired_text(kept, compressed)} | {' | '.join(peers)} |"
        )
    same = {"streaming@5", "truncation@5"} <= columns and all(
        answers_kept(records, "kept", f"streaming@{r:g}") == answers_kept(records, "kept", f"truncation@{r:g}")
        for r in RATIOS
    )
    if same:
        lines += [
            "",
            "With the opening kept whole, StreamingLLM's sinks (the sequence's first tokens) lie inside it, so it "
            "keeps exactly the document tokens truncation keeps, question by question.",
        ]
    lines += kept_types_section(folder, records)
    for layout, (study_page, data) in STUDIES.items():
        if data.is_dir():
            lines += accuracy_section(records, full, layout, study_page, data)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/nugget-kept.md")
    parser.add_argument("--limit", type=int, default=None, help=f"{TASK} questions (default: all, as the study)")
    parser.add_argument(
        "--selectors",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(SELECTORS),
        help=f"built-in selectors, separated by commas (default: {','.join(SELECTORS)})",
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="PATH",
        help="a checkpoint from decodebench train-nugget, gated beside them at the ratio it was trained for (an "
        "answer-span scorer: at every ratio; repeatable)",
    )
    args: argparse.Namespace = parser.parse_args(argv)
    return page(args, argv, lambda folder, command: collect(folder, command, args), render)


if __name__ == "__main__":
    sys.exit(main())
