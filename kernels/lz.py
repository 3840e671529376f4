"""The LZ penalty (Ginart et al., "LZ Penalty", section 3): batched LZSS codelengths per token.

Each decoding step simulates an LZ77/LZSS compressor whose *window* is the last ``window``
tokens of the history and whose look-ahead *buffer* bounds a match. The penalty is
``logits += alpha * codelength`` (eq. 3): tokens that would be expensive to compress (new ones)
gain, tokens that continue a repetition lose. Two codelengths are implemented, both batched:

``codelength="authors"`` (the default): the authors' released SGLang penalizer
(tginart/sglang, ``penaltylib/lz_penalty.py``), which produced the paper's published results.
A token's match is the longest one it would complete, its length being ``1 + s`` where ``s`` is
the common suffix (at most ``buffer``) of the history before the source and the whole history;
ties go to the nearest source; the cost is the match's distance alone::

    log2 V                               if a completes no match          (no penalty)
    clamp(log2 distance, 0, log2 V)      otherwise (the length only picks the match)

Only the window's positions from ``buffer`` on can be sources (a source needs a full buffer of
history before it), so there is no penalty before more than ``buffer`` tokens were generated.

``codelength="propositions"``: the paper's propositions 1 and 2 and cases I and II (eqs. 6-14),
as derived below. For every vocabulary token ``a`` the codelength of emitting ``a`` next is::

    log2 V                    if a is not in the window                       (lambda = 0)
    log2 delta                if a only starts a new match (a singleton)      (lambda = 1)
    log2(lam / (lam - 1)) - 1 if a extends a match to length lam >= 2         (lambda = l+1)

where ``lam`` is the length of the longest match that ends with ``a`` (at most ``buffer``) and
``delta`` the distance back to the nearest source of such a match. The two differ where a token
extends a match: the propositions charge the length and ignore the distance (any bigram repeated
anywhere in the window gets a near-maximal penalty), the authors charge the distance.

How this follows from the paper: propositions 1 and 2 give LZSS codelengths, ``log L + log D + 1``
bits for a match of length L at distance D and ``log V + 1`` bits for a literal. Cases I and II
(eqs. 6-12) compare, for each ``a``, the code of the buffer with ``a`` appended; constants that do
not depend on ``a`` drop out under softmax's shift invariance. A literal costs ``log V`` and a new
singleton match ``log delta`` (eqs. 8, 12); extending the current match of length ``l`` replaces
its code ``log l + log d`` by ``log(l+1) + log d``: the distance of an LZ77 match does not change
when the match grows, so the extension costs ``log((l+1)/l) - 1`` after the paper's subtraction
of ``log(ld) + 1`` (eq. 12 -> 13). The paper's closed form of this last case, with its relation
``delta = d - 1``, is not usable as printed (it is ``log 0`` for ``l = d = 1`` and does not give
the range it states), so we keep the propositions' codelengths. Matches are LZ77's: a source may
overlap the buffer (distance 1 is the previous token), ties between equally long matches go to
the nearest source (the cheapest code).

Complexity per call: ``O(N * window * buffer)`` comparisons, a sort of ``N * window`` keys,
and ``O(N * V)`` only for the dense codelengths of ``lz_codelengths``; ``apply_lz_penalty_``
touches only the window's tokens. Never ``N * window * V``. Everything is batched tensor code, identical on
CPU and CUDA, with no Python loop over the vocabulary or the window.
"""

from __future__ import annotations

import math

import torch

PAD = -1
CODELENGTHS = ("authors", "propositions")
# Upper bounds on the compressor's sizes: a step costs O(window * buffer) per row, so these cap what any request
# (a served client's included) can make one step cost, at 8x and 8x the authors' window 512 and buffer 32.
MAX_WINDOW = 4096
MAX_BUFFER = 256


def check_lz_sizes(window: int, buffer: int) -> None:
    """The sizes must be integers with ``buffer < window <= MAX_WINDOW`` and ``1 <= buffer <= MAX_BUFFER``."""
    for name, value in (("window", window), ("buffer", buffer)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 1 <= buffer <= MAX_BUFFER:
        raise ValueError(f"buffer={buffer}: must be in [1, {MAX_BUFFER}] (the authors': 32)")
    if not buffer < window <= MAX_WINDOW:
        raise ValueError(
            f"window={window}: must be larger than buffer={buffer} and at most {MAX_WINDOW} (the authors': 512)"
        )


def _matches(history: torch.Tensor, lengths: torch.Tensor, window: int, buffer: int, codelength: str):
    """Longest match ending at each window position (lambda_p) and its distance (delta_p).

    ``history`` [N, L] is left-padded: the most recent token of every row is in the last column.
    Returns ``tokens`` [N, W'] (the window, PAD where empty), ``sources`` [N, W'] (positions that
    can be a match's source), ``lam`` [N, W'] and ``dist`` [N, W'] for the window of
    W' = min(L, window) positions.
    """
    lengths = lengths.clamp(max=window)
    tokens = history[:, -window:]
    n_rows, width = tokens.shape
    positions = torch.arange(width, device=tokens.device)
    first = (width - lengths).unsqueeze(1)  # column of each row's oldest real token
    valid = positions.unsqueeze(0) >= first
    tokens = torch.where(valid, tokens, torch.full_like(tokens, PAD))
    # the authors' sources follow a full buffer of history: their offset in the row is >= buffer
    sources = valid & (positions.unsqueeze(0) >= first + buffer) if codelength == "authors" else valid

    # Common-suffix length s_p between the history ending just before p and the whole history:
    # at most buffer - 1 for the propositions (a match is at most `buffer` long), at most buffer
    # for the authors' (whose buffer is the lookback compared with each window).
    span = buffer if codelength == "authors" else buffer - 1
    if span > 0:
        padded = torch.nn.functional.pad(tokens, (span, 0), value=PAD)
        before = padded.unfold(1, span, 1)[:, :width].flip(-1)  # [N, W', span]: t[p-1], t[p-2], ...
        current = padded[:, -span:].flip(-1)  # t[-1], t[-2], ...: what a match must repeat
        equal = (before == current.unsqueeze(1)) & (current != PAD).unsqueeze(1)
        # run length of leading True values = index of the first False (a False column is appended)
        run = torch.cat([equal, torch.zeros_like(equal[..., :1])], dim=-1)
        suffix = run.to(torch.int8).argmin(dim=-1)
    else:
        suffix = torch.zeros_like(tokens)
    lam = 1 + suffix.to(torch.long)
    dist = width - positions  # the next token sits at position `width`
    return tokens, sources, lam, dist.unsqueeze(0).expand(n_rows, width)


def _best_per_token(tokens, valid, lam, dist, window: int):
    """Per window position: (lambda, delta) of the best match of *that position's token*.

    The best match of a token is its longest one, ties going to the nearest source. Both are
    packed into one score ``lam * (window + 1) - dist``; sorting each row by (token, score)
    puts every token's best score at the end of its group, so the reduction costs
    ``O(N * window * log window)`` whatever the vocabulary size, with no loop over tokens.
    """
    n_rows, width = tokens.shape
    stride = window + 1
    score = lam * stride - dist  # in [1, buffer * stride)
    key = torch.where(valid, tokens, torch.full_like(tokens, -1)) * (stride * stride) + score
    sorted_key, order = key.sort(dim=1)
    group = torch.div(sorted_key, stride * stride, rounding_mode="floor")
    is_last = torch.ones_like(group, dtype=torch.bool)
    is_last[:, :-1] = group[:, 1:] != group[:, :-1]
    # index of the end of each position's group: the smallest group end at or after it
    positions = torch.arange(width, device=tokens.device).expand(n_rows, width)
    ends = torch.where(is_last, positions, torch.full_like(positions, width))
    group_end = ends.flip(1).cummin(dim=1).values.flip(1)
    best_sorted = sorted_key.gather(1, group_end) - group * (stride * stride)
    best = torch.empty_like(best_sorted).scatter_(1, order, best_sorted)
    best_lam = torch.div(best + window, stride, rounding_mode="floor")
    best_dist = best_lam * stride - best
    index = torch.where(valid, tokens, torch.zeros_like(tokens))
    return index, best_lam, best_dist


def _codelength(lam: torch.Tensor, dist: torch.Tensor, codelength: str, vocab_size: int) -> torch.Tensor:
    """The codelength in bits of a token whose best match has length ``lam`` >= 1 at distance ``dist``."""
    distance_bits = torch.log2(dist.to(torch.float32).clamp(min=1))
    if codelength == "authors":
        return distance_bits.clamp(max=math.log2(vocab_size))
    lam_f = lam.to(torch.float32)
    extension = torch.log2(lam_f / (lam_f - 1).clamp(min=1)) - 1  # eq. 14, lambda = l + 1
    return torch.where(lam >= 2, extension, distance_bits)


def check_codelength(codelength: str) -> None:
    if codelength not in CODELENGTHS:
        raise ValueError(f"codelength must be one of {CODELENGTHS}, got {codelength!r}")


def lz_codelengths(
    history: torch.Tensor,
    lengths: torch.Tensor,
    vocab_size: int,
    window: int,
    buffer: int,
    codelength: str,
) -> torch.Tensor:
    """Codelength in bits of every next token for each row: a [N, V] float32 tensor.

    ``history`` [N, L] holds each row's tokens left-padded (any pad value; ``lengths`` [N] says how
    many of the last columns are real). Rows may be empty or shorter than the buffer.
    """
    check_lz_sizes(window, buffer)
    check_codelength(codelength)
    tokens, valid, lam, dist = _matches(history, lengths, window, buffer, codelength)
    index, best_lam, best_dist = _best_per_token(tokens, valid, lam, dist, window)
    costs = _codelength(best_lam, best_dist, codelength, vocab_size)
    out = torch.full((history.shape[0], vocab_size + 1), math.log2(vocab_size), device=history.device)
    # Empty positions write into a spare column that is dropped afterwards.
    out.scatter_(1, torch.where(valid, index, torch.full_like(index, vocab_size)), costs)
    return out[:, :vocab_size]


def apply_lz_penalty_(
    logits: torch.Tensor,
    history: torch.Tensor,
    lengths: torch.Tensor,
    alpha: torch.Tensor | float,
    window: int,
    buffer: int,
    codelength: str,
) -> torch.Tensor:
    """``logits += alpha * lz_codelengths(...)`` in place, up to a constant per row.

    Every token absent from the window gets the same ``alpha * log2 V``; adding the same value
    to all logits of a row changes no softmax, argmax, top-k or top-p, so only the at most
    ``window`` tokens present are touched, by ``alpha * (codelength - log2 V)``. ``alpha`` is a
    float or a per-row tensor [N].
    """
    check_lz_sizes(window, buffer)
    check_codelength(codelength)
    vocab_size = logits.shape[-1]
    history, lengths = history.to(logits.device), lengths.to(logits.device)
    tokens, valid, lam, dist = _matches(history, lengths, window, buffer, codelength)
    index, best_lam, best_dist = _best_per_token(tokens, valid, lam, dist, window)
    delta = _codelength(best_lam, best_dist, codelength, vocab_size) - math.log2(vocab_size)
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.to(logits.device, logits.dtype, non_blocking=True)
        alpha = alpha.reshape(-1, 1) if alpha.ndim else alpha
    # a float stays a kernel argument: made into a device tensor it was a host copy that waits for the GPU at every
    # step (seen on an H200: docs/benchmarks/h200.md)
    delta = delta.to(logits.dtype) * alpha
    # Empty positions rewrite the row's most recent token with its own (identical) new value, so
    # duplicate indices in a scatter always carry the same value.
    last = index[:, -1:].expand_as(index)
    index = torch.where(valid, index, last)
    delta = torch.where(valid, delta, delta[:, -1:].expand_as(delta))
    has_history = valid[:, -1:].expand_as(valid)
    delta = torch.where(has_history, delta, torch.zeros_like(delta))
    logits.scatter_(1, index, logits.gather(1, index) + delta)
    return logits
