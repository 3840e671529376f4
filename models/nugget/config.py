"""Arguments of ``--model nugget``: the one place their types, defaults, help and checks are written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from decodebench.kernels.nugget import check_ratio
from decodebench.models.config import MethodConfig, at_least, option

# The built-in selectors (models/nugget/selectors.py); any other value is a trained selector file.
SELECTOR_NAMES = ("delimiter", "attention", "streaming", "truncation", "full")


@dataclass(frozen=True)
class NuggetConfig(MethodConfig):
    ratio: float = option(10.0, "compression ratio r: the document keeps ceil(n / r) of its n tokens")
    selector: str = option(
        "delimiter",
        f"{', '.join(SELECTOR_NAMES)}, or the path of a selector trained with `decodebench train-nugget`",
    )
    split: str = option("\n\n", "the document is the prompt before the last occurrence of this marker")
    sinks: int = option(4, "first tokens the streaming selector always keeps", check=at_least(0))

    def validated(self) -> NuggetConfig:
        check_ratio(self.ratio)
        # `split=\n\n` on a command line arrives as backslashes
        split = self.split.encode().decode("unicode_escape") if "\\" in self.split else self.split
        return dataclasses.replace(self, split=split)
