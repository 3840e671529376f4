"""Arguments of ``--model nugget``: the one place their types, defaults, help and checks are written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from decodebench.kernels.nugget import check_ratio
from decodebench.models.config import MethodConfig, at_least, option

# The built-in selectors (models/nugget/selectors.py; "answer-spans": the span scorer shipped for the embedded model;
# "trained": the paper's compressor shipped for the run's ratio); any other value is a trained checkpoint file.
SELECTOR_NAMES = (
    "answer-spans",
    "trained",
    "delimiter",
    "salience",
    "question-overlap",
    "query-attention",
    "streaming",
    "truncation",
    "full",
)
RENAMED = {"attention": "query-attention"}


@dataclass(frozen=True)
class NuggetConfig(MethodConfig):
    ratio: float = option(10.0, "compression ratio r: the document keeps ceil(n / r) of its n tokens")
    # the default is the compressor that answers most of squad_mini at ratios 5 and 10 among the query-independent
    # ones (docs/nugget-study-peers.md); the paper's method keeps its name
    selector: str = option(
        "answer-spans",
        "answer-spans (ours, the default: a scorer trained toward the terms, names and numbers questions ask for, "
        "whole predicted spans each once, the frozen model's states, any ratio), trained (the paper's method: the "
        "compressor shipped for the embedded model at this ratio, 5 or 10), the path of a checkpoint from `decodebench "
        "train-nugget` (the paper's method, or with --recipe answer-spans ours, for any model), or a training-free "
        "selector: delimiter (training-free, query-independent stand-in), salience "
        "(training-free peer: names and numbers, then surprisal, whole words), question-overlap (training-free "
        "query-aware peer: the sentences sharing most words with the question first), query-attention (query-aware "
        "peer, SnapKV's kin), streaming, truncation, full",
    )
    adapters: bool = option(
        True,
        "with a checkpoint: build and read the nuggets with its LoRA adapters and soft token (the paper's method); "
        "false: its scorer alone on the frozen model (ablation)",
    )
    split: str = option("\n\n", "the document ends at the last occurrence of this marker (the question follows it)")
    wrapper: str = option(
        "kept",
        "what comes before the document (the chat template's opening: its system turn and the user turn's header; "
        "a plain prompt's BOS): kept (as the authors run it: only the document is compressed, for every selector) "
        "or compressed (with the document, the layout the shipped compressors were trained with and "
        "docs/nugget-study.md ran)",
        choices=("kept", "compressed"),
    )
    sinks: int = option(4, "first tokens the streaming selector always keeps", check=at_least(0))

    def validated(self) -> NuggetConfig:
        check_ratio(self.ratio)
        if self.selector in RENAMED:
            raise ValueError(
                f"selector={self.selector} is now called {RENAMED[self.selector]}: it ranks the document by the "
                "attention the question pays to it (query-aware, SnapKV's kin), which the paper's scorer does not"
            )
        # `split=\n\n` on a command line arrives as backslashes
        split = self.split.encode().decode("unicode_escape") if "\\" in self.split else self.split
        return dataclasses.replace(self, split=split)
