"""Infini-gram agreement (Liu et al., "Infini-gram", section 4).

For every generated token, the infinity-gram probability of that token given all the tokens
before it is computed from a reference corpus: back off to the longest suffix of the prefix that
occurs in the corpus (its length + 1 is the *effective n*) and take the share of its occurrences
that continue with the token. The token *agrees* when that probability exceeds 0.5 (the paper's
criterion, a lower bound on argmax accuracy). Agreement is the share of agreeing tokens, also
reported per effective n. Queries run on the ``infini-gram`` package's C++ engine.

Successive tokens share work: the longest matching suffix can grow by at most one token per
position, so each query passes only that many tokens of prefix (the paper's dense evaluation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from decodebench.infinigram import Index

FIRST_PREFIX = 512  # tokens of context the first query may use


@dataclass
class Agreement:
    tokens: int = 0
    agreeing: int = 0
    by_effective_n: dict[int, list[int]] = field(default_factory=dict)  # n -> [tokens, agreeing]

    @property
    def agreement(self) -> float | None:
        return self.agreeing / self.tokens if self.tokens else None

    def as_list(self) -> list:
        """A JSON-friendly per-sample value: [agreeing, tokens, {n: [tokens, agreeing]}]."""
        return [self.agreeing, self.tokens, {str(n): v for n, v in sorted(self.by_effective_n.items())}]


@cache
def open_index(path: str) -> Index:
    return Index(path)


@cache
def default_index() -> Index:
    """The reference index for the embedded model's tokenizer, built on first use."""
    from transformers import AutoTokenizer

    from decodebench.embedded import ensure_embedded_model
    from decodebench.infinigram import ensure_reference_index

    checkpoint = str(ensure_embedded_model())
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return Index(ensure_reference_index(tokenizer, checkpoint), tokenizer)


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
    """Agreement of ``continuation`` with the index's corpus, each token given everything before it.

    Texts are tokenized with the tokenizer the index was built with; token ids are taken as they
    are. ``context`` (e.g. the prompt) conditions the first tokens but is not scored.
    """
    idx = resolve_index(index)
    context_ids = idx.encode(context) if isinstance(context, str) else list(context)
    ids = idx.encode(continuation) if isinstance(continuation, str) else list(continuation)
    sequence = context_ids + ids
    result = Agreement()
    suffix = FIRST_PREFIX - 1
    for i in range(len(context_ids), len(sequence)):
        prob, suffix = idx.infgram_prob(sequence[max(0, i - suffix - 1) : i], sequence[i])
        agrees = prob > threshold
        bucket = result.by_effective_n.setdefault(suffix + 1, [0, 0])
        bucket[0] += 1
        bucket[1] += agrees
        result.tokens += 1
        result.agreeing += agrees
    return result
