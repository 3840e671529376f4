"""Which document tokens become nuggets: one small class per selector.

A selector scores the document's ``n`` tokens; ``kernels.nugget.select_topk`` keeps the
``ceil(n / ratio)`` best (the last one always). ``hidden_layer`` asks the encoding pass for that
layer's hidden states (the learned scorer reads layer 3, as the paper's).

- ``LearnedSelector``: the paper's scorer, trained with ``decodebench train-nugget`` (training.py);
- ``DelimiterSelector``: training-free, delimiters first, an approximation of what the paper's
  section 7.1 finds its learned scorer picks;
- ``AttentionSelector``: training-free, the attention the document receives from the tail in a
  full-context scoring pass (query-aware);
- peers at the same ratio: ``StreamingSelector`` (StreamingLLM: ``sinks`` first tokens plus the
  most recent), ``TruncationSelector`` (the most recent tokens) and ``FullContext`` (no compression).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from decodebench.kernels.nugget import delimiter_scores, position_scores
from decodebench.models.nugget.config import NuggetConfig


class Selector:
    name: ClassVar[str]
    label: ClassVar[str]
    compresses: ClassVar[bool] = True
    hidden_layer: int | None = None  # hidden states the scores need from the encoding pass

    def __init__(self, config: NuggetConfig):
        self.config = config

    def setup(self, lm) -> None:
        """Called once the model is loaded."""

    def scores(self, lm, document: list[int], tail: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        """One score per document token [n] (higher is kept first)."""
        raise NotImplementedError


class FullContext(Selector):
    name = "full"
    label = "full context (no compression)"
    compresses = False


class DelimiterSelector(Selector):
    name = "delimiter"
    label = "training-free delimiter selector (approximation of the paper's learned scorer)"

    def scores(self, lm, document, tail, hidden):
        return delimiter_scores([lm.tokenizer.decode([t]) for t in document])


class StreamingSelector(Selector):
    name = "streaming"
    label = "StreamingLLM peer (attention sinks + most recent tokens)"

    def scores(self, lm, document, tail, hidden):
        return position_scores(len(document), sinks=self.config.sinks)


class TruncationSelector(Selector):
    name = "truncation"
    label = "truncation peer (most recent tokens)"

    def scores(self, lm, document, tail, hidden):
        return position_scores(len(document))


class AttentionSelector(Selector):
    name = "attention"
    label = "training-free attention selector (approximation of the paper's learned scorer)"

    def scores(self, lm, document, tail, hidden):
        # what the tail's tokens attend to in a full-context scoring pass (every layer, head)
        full = torch.tensor([document + tail], device=lm.device)
        with _eager_attention(lm.model):
            attentions = lm.model(input_ids=full, output_attentions=True).attentions
        n = len(document)
        received = sum(layer[0, :, n:, :n].sum(dim=(0, 1)) for layer in attentions)
        return received.float().cpu()


class LearnedSelector(Selector):
    name = "learned"
    label = "learned scorer (the paper's method, trained with decodebench train-nugget)"

    def setup(self, lm) -> None:
        from decodebench.models.nugget.training import load_selector

        self.scorer = load_selector(self.config.selector, lm.model, lm.tokenizer).to(lm.device)
        self.hidden_layer = self.scorer.layer

    def scores(self, lm, document, tail, hidden):
        return self.scorer(hidden).float().cpu()


class _eager_attention:
    """Temporarily switch to eager attention, the only kind that returns attention weights."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.previous)


# selector= -> class (the names are NuggetConfig's SELECTOR_NAMES; anything else is a trained file)
SELECTORS = {
    cls.name: cls for cls in (DelimiterSelector, AttentionSelector, StreamingSelector, TruncationSelector, FullContext)
}


def build_selector(config: NuggetConfig) -> Selector:
    return SELECTORS.get(config.selector, LearnedSelector)(config)
