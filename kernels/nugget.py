"""Nugget selection and KV gathering (Qin et al., "Dynamic contextual compression", section 2).

A context of ``n`` tokens is kept as the key/value states of ``k = ceil(n / ratio)`` selected
tokens, the *nuggets* (eqs. 14-15: ``TopK`` of the scorer's scores, the last token always
selected, footnote of section 2.3). The same positions are kept in every layer, and because
keys are cached after the rotary embedding, each nugget keeps its original position.

- ``select_topk``: the top-k positions of a batch of score rows, last token forced, returned in
  text order (batched, padded rows allowed through ``lengths``; a leading span may be kept whole, outside the
  ratio: the prompt's opening when only the document is compressed);
- ``gather_kv``: the kept positions of one layer's keys and values, for the whole batch;
- ``delimiter_scores`` / ``position_scores``: scores of the training-free selectors (the
  paper's section 7.1 finds that its learned selector mostly picks punctuation and delimiters);
  ``salience_scores``: a training-free peer of ours, names and numbers and then surprise, whole words
  (a word scored as its best token, so that it is kept whole or not at all); ``span_scores``: an answer-span
  scorer's logits read as a tagger's, whole predicted spans kept, each text once;
  ``question_overlap_scores``: a query-aware one, the sentences that share the question's words first;
- ``straight_through_bias``: eq. 18's ``s - StopGrad(s)``, zero in the forward pass, which
  carries the gradient of the attention logits to the scores when training the selector.
"""

from __future__ import annotations

import math
import re

import torch


def check_ratio(ratio: float) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio >= 1:
        raise ValueError(f"ratio must be a number >= 1 (1 keeps every token), got {ratio!r}")


def nuggets_for(length: int, ratio: float) -> int:
    """k = ceil(n / ratio), at least 1 (eq. 15)."""
    return max(1, math.ceil(length / ratio)) if length else 0


def select_topk(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    ratio: float,
    force_last: bool = True,
    kept_whole: torch.Tensor | None = None,
):
    """Positions of the nuggets of each row, in text order.

    Args:
        scores: [B, n] one score per context token (rows right-padded past their length).
        lengths: [B] real context lengths.
        ratio: compression ratio r; row i keeps ``ceil(lengths[i] / r)`` positions.
        kept_whole: [B] leading positions of each row kept whatever their scores and outside the ratio (a prompt's
            opening that is not part of the document: the authors compress only the document); row i then keeps
            those ``w`` and ``ceil((lengths[i] - w) / r)`` of the rest (eq. 15 applied to the document alone).
    Returns:
        (indices [B, k_max], mask [B, k_max]): kept positions sorted ascending, and which of the
        ``k_max`` slots are real for each row (rows keep different numbers of nuggets).
    """
    check_ratio(ratio)
    batch, n = scores.shape
    positions = torch.arange(n, device=scores.device)
    valid = positions[None, :] < lengths[:, None]
    ranked = scores.masked_fill(~valid, float("-inf")).clone()
    whole = torch.zeros_like(lengths) if kept_whole is None else torch.minimum(kept_whole, lengths)
    ranked = ranked.masked_fill(positions[None, :] < whole[:, None], float("inf"))
    if force_last:
        last = (lengths - 1).clamp(min=0)
        ranked[torch.arange(batch, device=scores.device), last] = float("inf")
    keep = torch.tensor(
        [int(w) + nuggets_for(int(length - w), ratio) for length, w in zip(lengths, whole, strict=True)],
        device=scores.device,
    )
    k_max = int(keep.max()) if batch else 0
    top = torch.topk(ranked, k_max, dim=-1).indices if k_max else positions[:0].expand(batch, 0)
    mask = torch.arange(k_max, device=scores.device)[None, :] < keep[:, None]
    # unused slots are pushed to the end, then everything is sorted back into text order
    order_key = torch.where(mask, top, torch.full_like(top, n))
    indices = torch.sort(order_key, dim=-1).values
    return indices.clamp(max=max(n - 1, 0)), mask


def gather_kv(keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor):
    """Keep positions ``indices`` [B, k] of one layer's keys/values [B, heads, n, dim]."""
    index = indices[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
    return keys.gather(2, index), values.gather(2, index)


def delimiter_scores(token_texts: list[str]) -> torch.Tensor:
    """Training-free stand-in for the paper's learned scorer: delimiters first.

    Sentence and line ends score 3, other punctuation 2, everything else 0; a small term that
    grows with the position breaks ties towards later tokens, which have seen more of the text.
    This approximates what section 7.1 reports the trained scorer selects; it is not the paper's
    selector.
    """
    n = len(token_texts)
    base = torch.zeros(n)
    for i, text in enumerate(token_texts):
        stripped = text.strip()
        if "\n" in text or (stripped and stripped[-1] in ".!?"):
            base[i] = 3.0
        elif stripped and all(not ch.isalnum() for ch in stripped):
            base[i] = 2.0
    return base + torch.arange(n) / max(n, 1)


# a name or number outranks any surprisal (a token's -log p stays far below this in nats)
SALIENT_FIRST = 1e4


def _word_starts(token_texts: list[str], whole_numbers: bool = False) -> torch.Tensor:
    """Which tokens [n] start a word: those that start with a space or a non-alphanumeric character, or follow one
    that ended with one; with ``whole_numbers``, a "," or "." between digits and the digits after it do not ("55,000"
    and "3.5" are one word each)."""
    starts = torch.tensor(
        [
            i == 0 or not text[:1].isalnum() or not token_texts[i - 1][-1:].isalnum()
            for i, text in enumerate(token_texts)
        ],
        dtype=torch.long,
    )
    if whole_numbers:
        for i in range(1, len(token_texts) - 1):
            if token_texts[i] in (",", ".") and token_texts[i - 1][-1:].isdigit() and token_texts[i + 1][:1].isdigit():
                starts[i] = starts[i + 1] = 0
    return starts


def _best_per_group(group: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Each group's highest score [groups] (``group`` [n]: each token's word or span, 0, 1, ..., ascending)."""
    return torch.full((int(group[-1]) + 1,), -math.inf).scatter_reduce(0, group, scores.float().cpu(), "amax")


def _best_of_word(word: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Each token's word's highest score [n] (``word``: each token's word, 0, 1, ...)."""
    return _best_per_group(word, scores)[word] if len(word) else scores.float()


# the logit above which an answer-span scorer's word joins its neighbours in a span: probability 0.05 (a word the
# scorer gives even a small chance of belonging to a span; chosen on 500 SQuAD dev questions outside squad_mini,
# where whole-answer-kept was flat from logit -2 to -5)
SPAN_LOGIT = math.log(0.05 / 0.95)
# a span whose text came earlier ranks below every first mention (logits stay far above -this)
REPEATED_LAST = 1e4


def _joined(group: list[int], texts: list[str]) -> list[str]:
    """Each group's text, its members' ``texts`` joined in order (``group``: each member's group, 0, 1, ...)."""
    joined = [""] * (group[-1] + 1 if group else 0)
    for index, text in zip(group, texts, strict=True):
        joined[index] += text
    return joined


def span_scores(
    token_texts: list[str], logits: torch.Tensor, threshold: float = SPAN_LOGIT, repeats_last: bool = True
) -> torch.Tensor:
    """An answer-span scorer's per-token logits [n] (``--recipe answer-spans``) read as the tagger it was trained as
    (ours, not the paper's method): whole predicted spans kept, each text once.

    1. words as ``_word_starts`` finds them, numbers whole ("55,000"), each scored as its best token's logit;
    2. a span: a maximal run of words above ``threshold``, each after a plain space (a line break or punctuation ends
       one; "Kelvin Benjamin", "November 2006"), scored as its best word, so that it is kept whole;
    3. a span (or a word outside any) whose lower-cased text came earlier in the document ranks after every first
       mention (``REPEATED_LAST``): a second "Genghis Khan" adds no answer the first did not hold (``repeats_last``:
       False leaves repeats where their logits put them, for studies/span_threshold.py's ablation).

    Returns [n], every token its span's score (``select_topk`` keeps spans whole but for the last one the budget
    reaches)."""
    word = torch.cumsum(_word_starts(token_texts, whole_numbers=True), 0) - 1
    if not len(word):
        return logits.float()
    word_logit = _best_per_group(word, logits)
    word_text = _joined(word.tolist(), token_texts)
    tagged = (word_logit > threshold).tolist()
    starts = [
        w == 0 or not (tagged[w] and tagged[w - 1] and text[:1] == " " and "\n" not in text)
        for w, text in enumerate(word_text)
    ]
    span = torch.cumsum(torch.tensor(starts, dtype=torch.long), 0) - 1
    score = _best_per_group(span, word_logit)
    seen: set[str] = set()
    for index, text in enumerate(_joined(span.tolist(), word_text)):
        key = text.strip().lower()
        if key in seen and repeats_last:
            score[index] -= REPEATED_LAST
        seen.add(key)
    return score[span[word]]


def salience_scores(token_texts: list[str], surprisal: torch.Tensor) -> torch.Tensor:
    """A training-free peer that keeps what questions tend to ask for (not from the paper): whole words, names and
    numbers first (a word whose first letter or digit is a capital or a digit), then by surprisal, the largest
    ``-log p`` of a word's tokens under the model. Every token of a word gets its word's score, so a
    word is kept whole (but for the last one the budget reaches); ``surprisal`` [n] holds each token's -log p given
    the tokens before it."""
    starts = _word_starts(token_texts)
    word = torch.cumsum(starts, 0) - 1
    firsts = [token_texts[i].lstrip()[:1] for i in torch.nonzero(starts).flatten().tolist()]  # each word's
    salient = torch.tensor([float(ch.isupper() or ch.isdigit()) for ch in firsts])  # first character
    return SALIENT_FIRST * salient[word] + _best_of_word(word, surprisal)


def content_words(text: str) -> set[str]:
    """The words of ``text`` that can tie a sentence to a question: lower-cased runs of letters and digits, longer than
    three characters (short ones are mostly function words: "the", "was", "of") or numbers."""
    return {word for word in re.findall(r"[a-z0-9]+", text.lower()) if len(word) > 3 or word.isdigit()}


def question_overlap_scores(token_texts: list[str], question: set[str], surprisal: torch.Tensor) -> torch.Tensor:
    """A training-free, query-aware peer (not from the paper; the coarse, question-aware step of LongLLMLingua's kind,
    done lexically): sentences first by how many of the ``question``'s content words (``content_words``) they hold,
    and within them, and among sentences that tie, tokens in ``salience_scores``' order. A sentence ends after a token
    that ends in ".", "!" or "?" or holds a line break. Returns integer-valued scores (exact in float32 for documents
    of up to 2**24 / (words of the question + 1) tokens): overlap * n + the token's rank by salience."""
    n = len(token_texts)
    ends = torch.tensor([text.rstrip()[-1:] in (".", "!", "?") or "\n" in text for text in token_texts])
    sentence = torch.cumsum(ends.long(), 0) - ends.long()  # a sentence's last token is still its own
    sentences: list[list[str]] = [[] for _ in range(int(sentence[-1]) + 1 if n else 0)]
    for index, text in zip(sentence.tolist(), token_texts, strict=True):
        sentences[index].append(text)
    shared = torch.tensor([len(content_words("".join(texts)) & question) for texts in sentences], dtype=torch.long)
    overlap = shared[sentence]
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.argsort(salience_scores(token_texts, surprisal), stable=True)] = torch.arange(n)
    return (overlap * n + rank).float()


def position_scores(n: int, sinks: int = 0, recent: bool = True) -> torch.Tensor:
    """Scores that keep the first ``sinks`` tokens and then the most recent ones (StreamingLLM),
    or, with ``recent=False`` and no sinks, the first tokens (truncation that keeps the start)."""
    scores = torch.arange(n, dtype=torch.float32) if recent else -torch.arange(n, dtype=torch.float32)
    scores[:sinks] = float(n + 1)
    return scores


def straight_through_bias(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 18: ``s - StopGrad(s)``; added to the attention logits of the nugget keys."""
    return scores - scores.detach()
