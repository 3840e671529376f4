"""What the nuggets carry: the training objective on held-out text, for every selector.

``tox -e nugget-objective`` (``python studies/nugget_objective.py``) takes the held-out windows
of a ``decodebench train-nugget`` checkpoint (the documents its training never saw, cut as
training cuts them: a part to compress, up to 256 tokens, and a 64-token continuation) and scores
the continuation given the compressed part kept by each selector at each ratio:

- ``last token only``: the document reduced to its last token (what every selector keeps), the
  floor; ``full context``: the whole document, the ceiling; both on the frozen model;
- ``truncation``, ``streaming`` (4 sinks), ``delimiter`` and ``scorer only`` (the trained scorer's
  choice, frozen model) at the ratio;
- ``trained``: the paper's method, the checkpoint's encoder adapter builds the nuggets, its
  decoder adapter and soft token read them (what the checkpoint was trained to minimise).

Every selector is scored on the same tokens (continuation tokens 2 to 64: the first is predicted
from the soft token in training and from the last document token otherwise), in float32. The
table gives the mean loss with a bootstrap interval, the paired difference against streaming, and
the share of the document's value kept: ``(L_last - L) / (L_last - L_full)``, 0 for nothing kept,
1 for all of it. Unlike the SQuAD study this needs no generation, so it separates the selectors
on a few hundred windows within minutes.

A second table asks the same of squad_mini's real SQuAD documents, where a question needs a span
from anywhere in the document rather than what comes next: for each selector, how often the
tokens it keeps include a token of a gold answer span (the document as ``--model nugget`` splits
the chat-formatted prompt). It writes docs/nugget-objective.md.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from common import doc_parser, task_docs, write_doc


def target_loss(model, window, scores, ratio, adapters) -> float:
    """Mean loss of the window's target tokens after the first, given its uncompressed prompt and the
    ``ceil(n / ratio)`` tokens of its compressed part that ``scores`` keeps, read by the checkpoint's adapters when
    ``adapters`` is given, else by the frozen model."""
    from decodebench.models.nugget.compressor import encode_nuggets, feed_after_nuggets, reading

    n, target = len(window.compressed), window.target
    nuggets = encode_nuggets(model, torch.tensor([window.compressed]), scores, ratio, encoder=adapters is not None)
    with reading(model, adapters):  # [nuggets; soft token; prompt; target] with the adapters, as in training
        soft_token = adapters.soft_token if adapters is not None else None
        fed = torch.tensor([window.prompt + target[:-1]])
        logits = feed_after_nuggets(model, nuggets.cache, fed, n, soft_token)[0]
    if adapters is not None:
        logits = logits[1:]  # drop the soft token's prediction
    first = len(window.prompt)  # logits[first + t - 1] predicts target[t]
    predicted = logits[first : first + len(target) - 1]
    return float(torch.nn.functional.cross_entropy(predicted.float(), torch.tensor(target[1:])))


def kept_positions(scores: torch.Tensor, n: int, ratio: float) -> set[int]:
    from decodebench.kernels.nugget import select_topk

    return set(select_topk(scores[None], torch.tensor([n]), ratio)[0][0].tolist())


def checkpoint_held_out_windows(tokenizer, training: dict, count: int):
    """The checkpoint's held-out windows, drawn as training drew them (the first ones are its own)."""
    from decodebench.models.nugget.training import held_out_windows, read_documents, split_corpus
    from decodebench.models.nugget.training_settings import TrainingSettings

    settings = TrainingSettings(**training["settings"])
    corpus = training["corpus"]  # a path, or the description of the default corpus
    documents, _ = read_documents(corpus if Path(corpus).exists() else None)
    _, held, _ = split_corpus(documents)
    return held_out_windows(tokenizer, held, settings, count), settings


@dataclass
class Measured:
    losses: dict[tuple[str, float | None], list[float]]  # per held-out window
    where: dict[tuple[str, float], list[tuple[float, float, bool]]]  # (same as streaming, mean position, sink kept)
    coverage: dict[tuple[str, float], list[bool]]  # per squad_mini question: an answer token kept
    training: dict
    lengths: dict


@torch.inference_mode()
def measure(checkpoint_path: Path, ratios: list[float], count: int, questions: int | None, log=print) -> Measured:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.data.embedded import ensure_embedded_model
    from decodebench.kernels.nugget import delimiter_scores, position_scores
    from decodebench.models.nugget.checkpoint import read_checkpoint
    from decodebench.models.nugget.config import NuggetConfig

    checkpoint = read_checkpoint(checkpoint_path)
    model_path = str(ensure_embedded_model(log=log))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    checkpoint.check_model(model, tokenizer)
    scorer = checkpoint.scorer()
    adapters = checkpoint.attach_adapters(model)
    windows, settings = checkpoint_held_out_windows(tokenizer, checkpoint.training, count)
    sinks = NuggetConfig.defaults().sinks

    losses: dict[tuple[str, float | None], list[float]] = {}
    where: dict[tuple[str, float], list[tuple[float, float, bool]]] = {}  # what each selector kept
    for window in tqdm(windows, desc="held-out windows"):
        context = window.compressed
        n = len(context)
        trained_scores = scorer.score(model, torch.tensor([context]))
        recent = position_scores(n)
        rows = {("last token only", None): (recent, n, None), ("full context", None): (recent, 1, None)}
        for ratio in ratios:
            rows[("truncation", ratio)] = (recent, ratio, None)
            rows[("streaming", ratio)] = (position_scores(n, sinks=sinks), ratio, None)
            rows[("delimiter", ratio)] = (delimiter_scores([tokenizer.decode([t]) for t in context]), ratio, None)
            rows[("scorer only", ratio)] = (trained_scores, ratio, None)
            rows[("trained", ratio)] = (trained_scores, ratio, adapters)
        for key, (scores, ratio, reader) in rows.items():
            losses.setdefault(key, []).append(target_loss(model, window, scores, ratio, reader))
            if key[1] is not None:
                kept, streamed = (kept_positions(s, n, ratio) for s in (scores, rows[("streaming", ratio)][0]))
                where.setdefault(key, []).append(
                    (len(kept & streamed) / len(kept), statistics.mean(kept) / (n - 1), 0 in kept)
                )
    lengths = {"context": [len(w.compressed) for w in windows], "continuation": settings.continuation}
    coverage = answer_coverage(model, tokenizer, scorer, ratios, sinks, questions)
    return Measured(losses, where, coverage, checkpoint.training, lengths)


def squad_documents(tokenizer, split: str, limit: int | None):
    """(document token ids, gold answer token positions) for each squad_mini question, the document
    being the chat-formatted prompt before its last ``split``, as ``--model nugget`` cuts it."""
    task, docs = task_docs("squad_mini", limit)
    for doc in docs:
        user = task.doc_to_text(doc)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        offset, end = prompt.index(doc["context"]), prompt.rindex(split)
        encoded = tokenizer(prompt[:end], add_special_tokens=False, return_offsets_mapping=True)
        spans = [
            (offset + start, offset + start + len(text))
            for text, start in zip(doc["answers"]["text"], doc["answers"]["answer_start"], strict=True)
        ]
        answer = {
            i
            for i, (a, b) in enumerate(encoded.offset_mapping)
            if any(a < span_end and b > span_start for span_start, span_end in spans)
        }
        yield encoded.input_ids, answer


def answer_coverage(model, tokenizer, scorer, ratios, sinks, questions: int | None) -> dict[tuple, list[bool]]:
    """For each selector and ratio, per squad_mini question: is a gold answer token among the kept ones?"""
    from decodebench.kernels.nugget import delimiter_scores, position_scores
    from decodebench.models.nugget.config import NuggetConfig

    generator = torch.Generator().manual_seed(0)
    covered: dict[tuple[str, float], list[bool]] = {}
    for ids, answer in squad_documents(tokenizer, NuggetConfig.defaults().split, questions):
        n = len(ids)
        selectors = {
            "truncation": position_scores(n),
            "streaming": position_scores(n, sinks=sinks),
            "delimiter": delimiter_scores([tokenizer.decode([t]) for t in ids]),
            "trained (its scorer)": scorer.score(model, torch.tensor([ids])),
            "random": torch.rand(n, generator=generator),
        }
        for ratio in ratios:
            for name, scores in selectors.items():
                covered.setdefault((name, ratio), []).append(bool(kept_positions(scores, n, ratio) & answer))
    return covered


def report(measured: Measured, checkpoint: Path, seconds: float) -> str:
    from decodebench.measure.machine import describe, short_name
    from decodebench.stats import bootstrap_interval, paired_comparison, quality_interval

    losses, where, coverage, training = measured.losses, measured.where, measured.coverage, measured.training
    lengths = measured.lengths
    floor, ceiling = losses[("last token only", None)], losses[("full context", None)]
    value = statistics.mean(floor) - statistics.mean(ceiling)
    count = len(floor)
    settings = training.get("settings", {})
    lines = [
        "# What the nuggets carry: the training objective on held-out text",
        "",
        f"Written by `python studies/nugget_objective.py{''.join(' ' + a for a in sys.argv[1:])}` "
        f"(`tox -e nugget-objective`) on {datetime.now(UTC):%Y-%m-%d} in {seconds / 60:.0f} min, "
        f"{short_name(describe())}.",
        "",
        f"- checkpoint `{checkpoint.name}`: {training.get('steps_done', '?')} steps at ratio "
        f"{settings.get('ratio', '?')} on {training.get('corpus', '?')}; the embedded SmolLM2-135M-Instruct, float32",
        f"- n = {count} held-out windows (documents training never saw): compressed part "
        f"{min(lengths['context'])}-{max(lengths['context'])} tokens (mean {statistics.mean(lengths['context']):.0f}), "
        f"continuation {lengths['continuation']} tokens; every row scores the same continuation tokens 2-"
        f"{lengths['continuation']}",
        "- loss: mean cross-entropy per token (nats) [95% bootstrap interval over windows]; vs streaming: paired "
        "difference at the same ratio [95% paired bootstrap], p; value kept: share of the document's value, "
        "(L_last - L) / (L_last - L_full); what was kept: mean share of the kept tokens that streaming keeps too, "
        "mean position of the kept tokens (0: the document's start, 1: its end), and how often the first token "
        "(the attention sink) is kept",
        "",
        "| selector | ratio | loss [95% CI] | perplexity | vs streaming [95% CI], p | value kept | same as streaming "
        "| mean position | first token kept |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, ratio), values in losses.items():
        mean = statistics.mean(values)
        interval = bootstrap_interval(values, np.mean)
        streaming = losses.get(("streaming", ratio))
        if streaming is None or name == "streaming":
            versus = "-"
        else:
            paired = paired_comparison(values, streaming)
            versus = (
                f"{paired.difference:+.3f} [{paired.interval.low:+.3f}, {paired.interval.high:+.3f}], "
                f"p = {paired.p_value:.3g}"
            )
        kept = (statistics.mean(floor) - mean) / value if value > 0 else float("nan")
        chosen = where.get((name, ratio))
        chose = "- | - | -"
        if chosen:
            same, position, sink = (statistics.mean(column) for column in zip(*chosen, strict=True))
            chose = f"{same:.0%} | {position:.2f} | {sink:.0%}"
        lines.append(
            f"| {name} | {f'{ratio:g}' if ratio else '-'} | {mean:.3f} [{interval.low:.3f}, {interval.high:.3f}] "
            f"| {math.exp(mean):.1f} | {versus} | {kept:.0%} | {chose} |"
        )
    lines += [
        "",
        f"## squad_mini: is the answer among the kept tokens? (n = {len(next(iter(coverage.values())))})",
        "",
        "Share of questions whose kept document tokens include a token of a gold answer span, with its 95% Wilson "
        "interval, and the paired difference against streaming (McNemar exact). The trained row is the checkpoint's "
        "scorer choosing positions; with the adapters the kept states also carry what the encoder put into them.",
        "",
        "| selector | ratio | answer token kept [95% CI] | vs streaming [95% CI], p |",
        "|---|---:|---:|---:|",
    ]
    for (name, ratio), values in coverage.items():
        interval, _ = quality_interval([float(v) for v in values])
        versus = "-"
        if name != "streaming":
            paired = paired_comparison([float(v) for v in values], [float(v) for v in coverage[("streaming", ratio)]])
            versus = (
                f"{paired.difference:+.3f} [{paired.interval.low:+.3f}, {paired.interval.high:+.3f}], "
                f"p = {paired.p_value:.3g}"
            )
        lines.append(
            f"| {name} | {ratio:g} | {statistics.mean(values):.3f} [{interval.low:.3f}, {interval.high:.3f}] "
            f"| {versus} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from decodebench.models.nugget.training import default_checkpoint

    parser = doc_parser(__doc__, "docs/nugget-objective.md")
    parser.add_argument("--checkpoint", default=None, help="a train-nugget checkpoint (default: the default one)")
    parser.add_argument("--ratios", default="5,10", help="compression ratios, comma-separated (default 5,10)")
    parser.add_argument("--windows", type=int, default=100, help="held-out windows to score (default 100)")
    parser.add_argument("--questions", type=int, default=None, help="squad_mini questions (default: all 500)")
    args = parser.parse_args(argv)
    checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint("embedded", 10)
    if not checkpoint.is_file():
        parser.error(f"no checkpoint at {checkpoint}; train one with `decodebench train-nugget` or pass --checkpoint")
    if args.windows < 2:
        parser.error("--windows must be at least 2")
    started = time.time()
    measured = measure(checkpoint, [float(r) for r in args.ratios.split(",")], args.windows, args.questions)
    return write_doc(args.doc, report(measured, checkpoint, time.time() - started))


if __name__ == "__main__":
    sys.exit(main())
