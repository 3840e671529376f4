"""Arguments of ``--model lz``: the one place their types, defaults, help and checks are written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from decodebench.kernels.lz import CODELENGTHS, MAX_BUFFER, MAX_WINDOW, check_lz_sizes
from decodebench.models.config import MethodConfig, at_least, between, option

PENALTIES = ("lz", "frequency", "repetition", "none")
# The strength each penalty gets when none is given: the LZ paper's alpha, the frequency penalty
# the paper compares with, and the usual repetition penalty factor (1 = off).
DEFAULT_STRENGTH = {"lz": 0.15, "frequency": 0.3, "repetition": 1.2, "none": 0.0}


@dataclass(frozen=True)
class LZConfig(MethodConfig):
    penalty: str = option(
        "lz", "the paper's LZ penalty, the backend's own frequency or repetition penalty, or none", choices=PENALTIES
    )
    strength: float | None = option(
        None,
        f"alpha for lz (default {DEFAULT_STRENGTH['lz']}), the frequency penalty ({DEFAULT_STRENGTH['frequency']}), "
        f"or the repetition penalty factor ({DEFAULT_STRENGTH['repetition']}; 1 = off)",
        check=at_least(0),
    )
    window: int = option(512, "LZ window: how many past tokens the compressor searches", check=between(2, MAX_WINDOW))
    buffer: int = option(32, "LZ look-ahead buffer: the longest match, in tokens", check=between(1, MAX_BUFFER))
    include_prompt: bool = option(False, "let the LZ window see the prompt, not only generated tokens")
    codelength: str = option(
        "authors",
        "authors: the authors' released SGLang penalizer (the longest match's distance; it produced the published "
        "results); propositions: the paper's propositions 1-2 and eq. 14 (a match's extension charged by its length)",
        choices=CODELENGTHS,
    )

    def validated(self) -> LZConfig:
        strength = DEFAULT_STRENGTH[self.penalty] if self.strength is None else self.strength
        if self.penalty == "repetition" and strength < 1:
            raise ValueError(f"strength={strength}: the repetition penalty factor must be >= 1 (1 = off)")
        check_lz_sizes(self.window, self.buffer)
        return dataclasses.replace(self, strength=strength)
