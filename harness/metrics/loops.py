"""Degenerate-repetition detection: a unit repeated back to back (LZ penalty paper, section 4).

The paper counts a generation as degenerate when "any substring [is] repeated at least 20
times". Read literally, every long text qualifies (" the " recurs); we read it as a *loop*: the
same unit repeated back to back at least 20 times, which is what a degenerate generation does.

``find_loops(seq)`` finds every maximal run where ``seq`` is periodic with period ``p`` for at
least ``min_count`` whole copies of its unit, in ``O(n log n)`` element operations:

- a run of ``c >= min_count`` copies of period ``p`` makes ``seq[i] == seq[i + p]`` hold on
  ``(c - 1) * p`` consecutive positions, so among the positions that are multiples of ``p`` at
  least ``min_count - 2`` consecutive ones hold it. Checking only those ``n / p`` positions for
  every ``p`` costs ``n * (1 + 1/2 + ... ) = O(n log n)``; periods are processed in blocks
  ``[p0, 2 p0)`` as one 2-D array each, so the number of array operations is ``O(log n)``;
- each candidate is then verified exactly and widened to its maximal run.

Loops can also *drift*: the paper's QwQ excerpt repeats "Non! " about 18 times, then "This! ",
"Third! ", "Tenth! ", ... each just below 20. ``find_drifting_loop`` chains loops of at least
half that many copies and of the same unit length (in tokens) that follow each other within one
unit, and reports the chain when its copies add up to ``min_count``. ``detect`` reports a strict
loop first, else a drifting one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Loop:
    start: int  # index of the first copy
    period: int  # unit length
    count: int  # whole back-to-back copies

    @property
    def end(self) -> int:
        """Index just after the last whole copy."""
        return self.start + self.period * self.count


def find_loops(seq, min_count: int = 20, max_period: int | None = None) -> list[Loop]:
    """Maximal back-to-back repetitions with at least ``min_count`` copies, smallest period first.

    ``seq`` is a 1-D integer array (token ids, or ids of text pieces). A loop whose span lies
    inside a loop of a smaller period that divides its own (e.g. "abab" x 10 inside "ab" x 20)
    is not reported again.
    """
    if min_count < 2:
        raise ValueError(f"min_count must be at least 2, got {min_count}")
    s = np.asarray(seq).ravel()
    n = len(s)
    longest = n // min_count if max_period is None else min(max_period, n // min_count)
    found: list[Loop] = []
    need = max(min_count - 2, 1)  # consecutive sampled matches a loop must produce
    p0 = 1
    while p0 <= longest:
        periods = np.arange(p0, min(2 * p0, longest + 1))
        samples = (n - 1) // p0 + 1
        pos = periods[:, None] * np.arange(samples)[None, :]  # [K, samples]: multiples of p
        inside = pos + periods[:, None] < n
        safe = np.where(inside, pos, 0)
        match = inside & (s[safe] == s[np.where(inside, pos + periods[:, None], 0)])
        # runs of `need` consecutive True: windowed sums through a cumulative sum
        counts = np.cumsum(np.pad(match, ((0, 0), (1, 0))).astype(np.int32), axis=1)
        full = (counts[:, need:] - counts[:, :-need]) == need
        rows, cols = np.nonzero(full)
        for k in np.unique(rows):
            period = int(periods[k])
            hits = cols[rows == k]
            h = 0
            while h < len(hits):  # verify a hit, then jump past the loop it belongs to
                loop = _verify(s, period, int(hits[h]) * period, min_count)
                if loop is not None and not _covered(loop, found):
                    found.append(loop)
                resume = loop.end if loop is not None else int(hits[h]) * period + 1
                h = max(h + 1, int(np.searchsorted(hits, -(-resume // period))))
        p0 *= 2
    found.sort(key=lambda loop: (loop.start, loop.period))
    return found


def _verify(s: np.ndarray, p: int, sampled: int, min_count: int) -> Loop | None:
    """The maximal run of ``s[i] == s[i + p]`` through position ``sampled``, as whole copies."""
    n = len(s)
    left = sampled
    while left > 0 and s[left - 1] == s[left - 1 + p]:
        step = min(left, p)
        block = s[left - step : left] == s[left - step + p : left + p]
        if block.all():
            left -= step
        else:
            left -= int(np.argmin(block[::-1]))
            break
    right = sampled  # run covers [left, right)
    while right + p < n and s[right] == s[right + p]:
        step = min(n - p - right, p)
        block = s[right : right + step] == s[right + p : right + p + step]
        if block.all():
            right += step
        else:
            right += int(np.argmin(block))
            break
    count = (right - left) // p + 1
    return Loop(left, p, count) if count >= min_count else None


def _covered(loop: Loop, found: list[Loop]) -> bool:
    return any(
        loop.period % other.period == 0 and other.start <= loop.start and loop.end <= other.end + other.period
        for other in found
    )


def find_drifting_loop(
    seq, min_count: int = 20, min_run: int | None = None, max_period: int | None = None
) -> Loop | None:
    """Consecutive loops with the same unit length whose copies add up to ``min_count``.

    Loops of at least ``min_run`` copies (default: half of ``min_count``) are chained while the
    next one starts within one unit of the previous one's end. Returns the longest chain as a
    Loop (start, unit length, total copies), or None.
    """
    loops = find_loops(seq, min_count=min_run or max(2, min_count // 2), max_period=max_period)
    best: Loop | None = None
    chain: list[Loop] = []
    for loop in loops:
        if chain and loop.period == chain[-1].period and 0 <= loop.start - chain[-1].end <= loop.period:
            chain.append(loop)
        elif chain and loop.start < chain[-1].end:
            continue  # overlaps the chain with another period: part of the same region
        else:
            chain = [loop]
        total = sum(link.count for link in chain)
        if total >= min_count and (best is None or total > best.count):
            best = Loop(chain[0].start, chain[0].period, total)
    return best


def detect(seq, min_count: int = 20, drift: bool = True, max_period: int | None = None) -> tuple[str, Loop] | None:
    """("loop", Loop) for a strict loop, else ("drift", Loop) for a drifting one, else None.

    The strict loop reported is the one covering the most elements.
    """
    loops = find_loops(seq, min_count=min_count, max_period=max_period)
    if loops:
        return "loop", max(loops, key=lambda loop: (loop.period * loop.count, loop.count))
    if drift:
        drifting = find_drifting_loop(seq, min_count=min_count, max_period=max_period)
        if drifting is not None:
            return "drift", drifting
    return None
