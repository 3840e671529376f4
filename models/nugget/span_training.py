"""``decodebench train-nugget --recipe answer-spans``: a scorer that keeps what questions ask for (issue 35; ours,
not the paper's method).

The paper's scorer learns, through the straight-through estimator, which tokens help the decoder continue the text;
at 135M parameters it learns delimiters and function words (84% of what it keeps at ratio 10 is ten token types),
and keeps the whole answer of 2% of squad_mini's questions at ratio 5 (docs/nugget-kept.md). This scorer is
trained instead with a dense loss toward the spans a question would ask for, marked in prose that no task
evaluates on:

- the terms the dictionaries' authors marked as having entries of their own (FOLDOC's and the Jargon File's
  ``{cross-references}``: ``read_dictd_terms``), the dictionary's own mark of what a reader would look up;
- names (a capitalised word that does not open a sentence, or one with two capitals or more) and numbers (a word
  with a digit): the kinds of answer reading-comprehension questions ask for most.

Each window is one dictionary entry laid out as ``--model nugget`` meets a document: the chat template's opening
(kept whole at test time, not scored), the entry (at most ``context`` tokens), then the blank line that ends a
document; each document token's target is 1 where it overlaps a marked span. The scorer is the paper's (a
feed-forward net over one layer of the frozen model, through its final norm as in the authors' library), reading
layer 12 by the recipe, not the paper's 3 (whether a word is what a question asks for depends on its context; at
layer 12 the held-out loss fell to 0.148 against 0.176 at layer 3); the loss is binary cross-entropy per document
token; AdamW with weight decay, warm-up then cosine, ``accumulate`` entries a step in one padded forward pass. The
checkpoint holds the scorer alone: its nuggets are the frozen model's own key/value states (no adapters), its
selection whole predicted spans, each text once (``span_scores``), and one scorer serves every ratio
(``selector=answer-spans``).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from decodebench.models.nugget.training_settings import TrainingSettings

OBJECTIVE = "answer-spans"  # the training record's "objective": how build_selector knows a span scorer's file
SEPARATOR = "\n\n"  # what ends a document in every task's prompt (``--model nugget``'s split)
# a word: letters and digits, with inner apostrophes, hyphens and dots ("O'Reilly", "X-Window", "4.4.7")
WORD = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9'.\-]*[A-Za-z0-9])?")
OPENS_SENTENCE = '.!?:"“(\n'
# the TrainingSettings this trainer reads (``accumulate``: entries a step); the rest (adapters, ratio, continuation)
# belong to the paper's trainer and are neither used nor recorded here
USED_SETTINGS = (
    "steps",
    "accumulate",
    "context",
    "lr",
    "warmup",
    "weight_decay",
    "layer",
    "feature_norm",
    "seed",
    "held_out_windows",
    "eval_every",
    "save_every",
)
# entries shorter than this (a cross-reference alone, "See {foo}.") teach little about a document's context
MIN_CHARACTERS = 200


def name_and_number_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of ``text``'s names and numbers: a word with a digit, a word with two capitals or more,
    and a capitalised word that does not open a sentence (the first word, or one after ``OPENS_SENTENCE``)."""
    spans = []
    for match in WORD.finditer(text):
        word, before = match.group(0), text[: match.start()].rstrip()
        opens = not before or before[-1] in OPENS_SENTENCE
        capitals = sum(ch.isupper() for ch in word)
        if any(ch.isdigit() for ch in word) or capitals > 1 or (word[0].isupper() and not opens):
            spans.append(match.span())
    return spans


def answer_worthy_spans(text: str, terms: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans of ``text`` the scorer learns to keep: its marked ``terms`` and its names and numbers, in order."""
    return sorted({*terms, *name_and_number_spans(text)})


@dataclass(frozen=True)
class SpanWindow:
    ids: list[int]  # the chat template's opening, the entry, the separator
    targets: list[float]  # one per token: 1 for a token overlapping an answer-worthy span
    document: int  # where the entry starts (the opening before it is not scored)


def span_window(tokenizer, opening: str, text: str, spans: list[tuple[int, int]], context: int) -> SpanWindow:
    """One entry laid out as a document of ``--model nugget``'s prompts, its first ``context`` tokens kept."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"][:context], encoded["offset_mapping"][:context]
    targets = [float(any(first < end and last > begin for begin, end in spans)) for first, last in offsets]
    head = tokenizer(opening, add_special_tokens=False)["input_ids"] if opening else []
    tail = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    return SpanWindow([*head, *ids, *tail], [*targets, *[0.0] * len(tail)], len(head))


def entries_with_spans(corpus: str | None) -> tuple[list[tuple[str, list[tuple[int, int]]]], str]:
    """(text, answer-worthy spans) of every entry of ``MIN_CHARACTERS`` or more of the default corpus (the three
    dictionaries, their cross-references marked) or of ``corpus`` (any corpus train-nugget reads: names and numbers
    only)."""
    from decodebench.data.corpus import PROSE_CORPUS, PROSE_DICTIONARIES, prose_corpus, read_corpus, read_dictd_terms

    if corpus is None or corpus == PROSE_CORPUS:
        prose_corpus()  # says which Debian packages to install when one is missing
        marked = [entry for index in PROSE_DICTIONARIES for entry in read_dictd_terms(Path(index))]
        name = PROSE_CORPUS
    else:
        marked, name = [(text, []) for text in read_corpus(Path(corpus))], str(corpus)
    entries = [(text, answer_worthy_spans(text, terms)) for text, terms in marked if len(text) >= MIN_CHARACTERS]
    if not entries:
        raise ValueError(f"corpus {name}: no document of {MIN_CHARACTERS} characters or more")
    return entries, name


def span_losses(model, scorer, windows: list[SpanWindow], device) -> torch.Tensor:
    """Binary cross-entropy of ``scorer`` on each window's document tokens [B] (one padded forward pass)."""
    from decodebench.models.nugget.training import right_padded

    ids, lengths = right_padded([w.ids for w in windows], device)
    mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    logits = scorer.score_batch(model, ids, mask).float()
    losses = []
    for row, window in enumerate(windows):
        scored = slice(window.document, len(window.ids))
        targets = torch.tensor(window.targets, device=device)
        losses.append(torch.nn.functional.binary_cross_entropy_with_logits(logits[row, scored], targets))
    return torch.stack(losses)


def train_span_scorer(
    model_path: str,
    out: str | Path,
    settings: TrainingSettings,
    corpus: str | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
    command: str = "decodebench train-nugget --recipe answer-spans (from Python)",
    device: str | None = None,
) -> Path:
    """Train (or resume) the answer-span scorer and save it at ``out`` with its manifest (as ``train`` does); of
    ``settings`` it uses (and records) only ``USED_SETTINGS``."""
    from tqdm import tqdm

    from decodebench.models.nugget.checkpoint import model_identity, save_checkpoint
    from decodebench.models.nugget.compressor import chat_template_parts
    from decodebench.models.nugget.shipped import git_revision, write_manifest
    from decodebench.models.nugget.training import (
        _learning_rate,
        corpus_record,
        frozen_model_and_scorer,
        in_batches,
        load_resume,
        save_resume,
        split_corpus,
        training_device,
    )

    revision = git_revision()
    settings.check()
    device = training_device(device)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    resume_path = out.with_name(out.name + ".resume.pt")
    entries, corpus_name = entries_with_spans(corpus)
    spans_of = dict(entries)
    training_docs, held_docs, dropped = split_corpus([text for text, _ in entries])
    log(
        f"corpus: {corpus_name}: {len(entries)} documents, {dropped} dropped for sharing text with the evaluation "
        f"samples, {len(held_docs)} held out; {sum(map(len, spans_of.values()))} answer-worthy spans"
    )
    torch.manual_seed(settings.seed)
    tokenizer, model, scorer = frozen_model_and_scorer(model_path, settings, device)
    optimizer = torch.optim.AdamW(
        scorer.parameters(), lr=settings.lr, betas=(0.9, 0.95), eps=1e-5, weight_decay=settings.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate(step, settings))
    template = chat_template_parts(tokenizer)
    opening = template[0] if template else (tokenizer.bos_token or "")

    def window(text: str) -> SpanWindow:
        return span_window(tokenizer, opening, text, spans_of[text], settings.context)

    held_windows = [window(text) for text in held_docs[: settings.held_out_windows]]

    def held_out() -> float:
        with torch.no_grad():
            losses = [span_losses(model, scorer, batch, device) for batch in in_batches(held_windows, 16)]
        return float(torch.cat(losses).mean())

    rng = random.Random(settings.seed)
    used = {key: value for key, value in asdict(settings).items() if key in USED_SETTINGS}
    record = {"settings": used, "objective": OBJECTIVE, "corpus": corpus_name, "losses": [], "held_out": []}
    start = 0
    parts = {"scorer": scorer, "optimizer": optimizer, "schedule": schedule}
    if resume_path.is_file():
        start = load_resume(resume_path, parts, rng, record)
        log(f"resuming from step {start} ({resume_path})")
    else:
        record["held_out"].append([0, held_out()])
        log(f"held-out loss before training: {record['held_out'][0][1]:.4f}")
    bar = tqdm(total=settings.steps, initial=start, desc="train-nugget answer-spans", disable=not progress)
    started = time.perf_counter()
    for step in range(start, settings.steps):
        windows = [window(rng.choice(training_docs)) for _ in range(settings.accumulate)]
        loss = span_losses(model, scorer, windows, device).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(scorer.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        record["losses"].append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{sum(record['losses'][-20:]) / len(record['losses'][-20:]):.4f}")
        done = step + 1
        if done % settings.eval_every == 0 or done == settings.steps:
            record["held_out"].append([done, held_out()])
            log(f"step {done}: held-out loss {record['held_out'][-1][1]:.4f}")
        if done % settings.save_every == 0 or done == settings.steps:
            save_resume(resume_path, done, parts, rng, record)
    bar.close()
    record["seconds_this_run"] = time.perf_counter() - started
    training = {key: record[key] for key in ("settings", "objective", "corpus", "held_out", "seconds_this_run")}
    training["steps_done"] = settings.steps
    # one scorer serves every ratio: the file's ratio is 1 (it was trained at none)
    path = save_checkpoint(out, scorer, None, model_identity(model, tokenizer), 1.0, training)
    out.with_name(out.name + ".log.json").write_text(json.dumps(record, indent=1))
    corpus_split = corpus_record([text for text, _ in entries], training_docs, held_docs, dropped)
    write_manifest(path, command, corpus_split, torch.get_num_threads(), revision, device=str(device))
    first, last = record["held_out"][0][1], record["held_out"][-1][1]
    log(f"saved {path}: held-out loss {first:.4f} -> {last:.4f} (binary cross-entropy per document token)")
    return path
