"""Infini-gram agreement (Liu et al., "Infini-gram", section 4).

For every generated token, the infinity-gram probability of that token given all the tokens
before it is computed from a reference corpus: back off to the longest suffix of the prefix that
occurs in the corpus (its length + 1 is the *effective n*) and take the share of its occurrences
that continue with the token. The token *agrees* when that probability exceeds 0.5 (the paper's
criterion, a lower bound on argmax accuracy). Agreement is the share of agreeing tokens, also
reported per effective n. Queries run on the ``infini-gram`` package's C++ engine.

Successive tokens share work: the longest matching suffix can grow by at most one token per
position, so each query is bounded by the previous suffix plus one (the paper's dense evaluation).
Suffixes are capped at MAX_SUFFIX tokens, which makes every position independent of where a scan
starts, so long texts are scored in chunks on all cores (the engine releases the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from decodebench.data.infinigram_index import Index

MAX_SUFFIX = 512  # the longest suffix consulted: effective n is at most 513
CHUNK = 2048  # positions per parallel work item


@dataclass
class Agreement:
    tokens: int = 0
    agreeing: int = 0
    by_effective_n: dict[int, list[int]] = field(default_factory=dict)  # n -> [tokens, agreeing]

    @property
    def agreement(self) -> float | None:
        return self.agreeing / self.tokens if self.tokens else None

    def add(self, other: Agreement) -> None:
        self.tokens += other.tokens
        self.agreeing += other.agreeing
        for n, (tokens, agreeing) in other.by_effective_n.items():
            bucket = self.by_effective_n.setdefault(n, [0, 0])
            bucket[0] += tokens
            bucket[1] += agreeing

    def as_list(self) -> list:
        """A JSON-friendly per-sample value: [agreeing, tokens, {n: [tokens, agreeing]}]."""
        return [self.agreeing, self.tokens, {str(n): v for n, v in sorted(self.by_effective_n.items())}]


@cache
def open_index(path: str) -> Index:
    return Index(path)


@cache
def default_index() -> Index:
    """The reference index for the embedded model's tokenizer, built on first use."""
    from decodebench.data.infinigram_index import ensure_reference_index, load_tokenizer

    tokenizer = load_tokenizer("embedded")
    return Index(ensure_reference_index(tokenizer, "embedded"), tokenizer)


def resolve_index(index: Index | str | Path | None) -> Index:
    if isinstance(index, Index):
        return index
    if index in (None, "", "default"):
        return default_index()
    return open_index(str(Path(index).resolve()))


def infinigram_agreement(
    continuation: str | Sequence[int],
    index: Index | str | Path | None = None,
    context: str | Sequence[int] = (),
    threshold: float = 0.5,
) -> Agreement:
    """Agreement of ``continuation`` with the index's corpus, each token given the (up to MAX_SUFFIX)
    tokens before it.

    Texts are tokenized with the tokenizer the index was built with; token ids are taken as they
    are. ``context`` (e.g. the prompt) conditions the first tokens but is not scored.
    """
    idx = resolve_index(index)
    context_ids = idx.encode(context) if isinstance(context, str) else list(context)
    ids = idx.encode(continuation) if isinstance(continuation, str) else list(continuation)
    sequence = context_ids + ids
    starts = range(len(context_ids), len(sequence), CHUNK)
    spans = [(start, min(start + CHUNK, len(sequence))) for start in starts]
    workers = min(len(spans), len(os.sched_getaffinity(0)))
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(lambda span: _score(idx, sequence, *span, threshold), spans))
    else:
        parts = [_score(idx, sequence, *span, threshold) for span in spans]
    result = Agreement()
    for part in parts:
        result.add(part)
    return result


def _score(idx: Index, sequence: list[int], start: int, stop: int, threshold: float) -> Agreement:
    """Agreement of sequence[start:stop], each token given up to MAX_SUFFIX tokens before it."""
    result = Agreement()
    suffix = MAX_SUFFIX - 1
    for i in range(start, stop):
        prompt = sequence[max(0, i - min(suffix + 1, MAX_SUFFIX)) : i]  # the suffix grows by one at most
        prob, suffix = idx.infgram_prob(prompt, sequence[i])
        agrees = prob > threshold
        bucket = result.by_effective_n.setdefault(suffix + 1, [0, 0])
        bucket[0] += 1
        bucket[1] += agrees
        result.tokens += 1
        result.agreeing += agrees
    return result
