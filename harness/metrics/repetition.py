"""``degenerate_repetition(text)``: the LZ paper's degenerate-repetition criterion on text.

Text is cut into pieces (words, runs of punctuation, runs of whitespace) so that "Non! Non! "
is the unit ["Non", "!", " "] and a long rule of "=====" is one piece, then
``decodebench.metrics.loops`` looks for a unit repeated back to back at least 20 times
(strict loop), or for drifting loops (harness/metrics/loops.py explains both).

Numbers count as one and the same piece: a template that only counts up ("45. Now, multiply 1
by 40 to get 41." then "46. Now, ..."), which small models fall into on math problems, is a
loop too. Normal text is not affected: its consecutive sentences differ in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from decodebench.metrics.loops import detect

PIECES = re.compile(r"\w+|[^\w\s]+|\s+")
MIN_COPIES = 20
NUMBER = "<number>"


@dataclass(frozen=True)
class Repetition:
    degenerate: bool
    kind: str | None = None  # "loop" (one unit >= 20 times), "drift" (chained loops) or None
    unit: str | None = None  # the repeated unit (the first one, for a drifting loop)
    count: int = 0  # back-to-back copies (summed over a drifting loop)
    start: int | None = None  # character offset of the first copy

    def as_dict(self) -> dict:
        return {
            "degenerate": self.degenerate,
            "kind": self.kind,
            "unit": self.unit,
            "count": self.count,
            "start": self.start,
        }


def find_degenerate_repetition(text: str, min_copies: int = MIN_COPIES, drift: bool = True) -> Repetition:
    """The worst back-to-back repetition in ``text``, with its unit and number of copies."""
    pieces = PIECES.findall(text)
    if not pieces:
        return Repetition(False)
    ids: dict[str, int] = {NUMBER: 0}
    seq = np.array([ids.setdefault(NUMBER if piece.isdigit() else piece, len(ids)) for piece in pieces], dtype=np.int64)
    found = detect(seq, min_count=min_copies, drift=drift)
    if found is None:
        return Repetition(False)
    kind, loop = found
    unit = "".join(pieces[loop.start : loop.start + loop.period])
    return Repetition(True, kind, unit, loop.count, sum(map(len, pieces[: loop.start])))


def degenerate_repetition(text: str, min_copies: int = MIN_COPIES, drift: bool = True) -> bool:
    """True when ``text`` repeats a unit back to back ``min_copies`` times (or drifts doing so)."""
    return find_degenerate_repetition(text, min_copies, drift).degenerate
