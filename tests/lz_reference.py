"""Plain LZ codelengths written straight from their definitions; used only by the tests.

One token, one candidate at a time, no tensors:
- ``codelength``: the paper's Definition 7 (findLongestMatch), Propositions 1 and 2 (LZSS
  codelengths) and cases I and II (eqs. 6-14), as documented in kernels/lz.py;
- ``authors_codelength``: the authors' released SGLang penalizer as its code computes it, read
  loop by loop: sources after a full buffer, length = common suffix + 1, cost = log2 distance.
"""

from __future__ import annotations

import math


def find_longest_match(y: list[int], z: list[int]) -> tuple[int | None, int]:
    """Definition 7: the j maximising the longest prefix of y found at z[j:], first j on ties."""
    best_j, best_len = None, 0
    for j in range(len(z)):
        k = 0
        while k < len(y) and j + k < len(z) and y[k] == z[j + k]:
            k += 1
        if k > best_len:
            best_j, best_len = j, k
    return best_j, best_len


def match_bits(length: int, distance: int) -> float:
    """Proposition 1: a match of length L at distance D costs log L + log D + 1 bits."""
    return math.log2(length) + math.log2(distance) + 1


def literal_bits(vocab_size: int) -> float:
    """Proposition 2: a literal costs log V + 1 bits."""
    return math.log2(vocab_size) + 1


def codelength(history: list[int], token: int, vocab_size: int, window: int, buffer: int) -> float:
    """Bits to emit `token` after `history` (constants independent of the token removed)."""
    w = history[-window:]
    # Matches ending with the candidate, read backwards: the candidate, then the history from
    # the newest token on, against the window read backwards (z[j] is j+1 tokens back).
    y = ([token, *w[::-1]])[:buffer]
    z = w[::-1]
    j, lam = find_longest_match(y, z)
    if lam == 0:  # case I/II, lambda = 0: a literal
        return literal_bits(vocab_size) - 1
    distance = j + 1
    if lam == 1:  # lambda = 1: a new singleton match
        return match_bits(1, distance) - 1
    # lambda = l + 1: the match of length l at the same LZ77 distance grows by one token
    return match_bits(lam, distance) - match_bits(lam - 1, distance) - 1


def codelengths(history: list[int], vocab_size: int, window: int, buffer: int) -> list[float]:
    return [codelength(history, a, vocab_size, window, buffer) for a in range(vocab_size)]


def authors_codelength(history: list[int], token: int, vocab_size: int, window: int, buffer: int) -> float:
    """Bits to emit ``token`` after ``history`` under the authors' penalizer (log2 V: no penalty)."""
    w = history[-window:]
    no_match = math.log2(vocab_size)
    if len(w) <= buffer:  # no penalty before more than `buffer` tokens
        return no_match
    best = None  # (length, -distance): the longest match, then the nearest
    for p in range(buffer, len(w)):  # a source follows a full buffer of history
        if w[p] != token:
            continue
        suffix = 0
        while suffix < buffer and w[p - 1 - suffix] == w[len(w) - 1 - suffix]:
            suffix += 1
        candidate = (suffix + 1, -(len(w) - p))
        best = candidate if best is None or candidate > best else best
    if best is None:
        return no_match
    return min(max(math.log2(-best[1]), 0.0), no_match)


def authors_codelengths(history: list[int], vocab_size: int, window: int, buffer: int) -> list[float]:
    return [authors_codelength(history, a, vocab_size, window, buffer) for a in range(vocab_size)]
