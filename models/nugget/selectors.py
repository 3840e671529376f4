"""Which document tokens become nuggets, and how the kept states are read: one small class per selector.

A selector scores the document's ``n`` tokens; ``kernels.nugget.select_topk`` keeps the
``ceil(n / ratio)`` best (the last one always).

- ``TrainedNugget``: the paper's method, a checkpoint of ``decodebench train-nugget`` (``selector=trained``: the
  one shipped for the embedded model at the run's ratio, models/nugget/shipped.py): its scorer
  (layer 3 of the frozen model), and, unless ``adapters=false``, its encoder adapter to build the
  nuggets, its decoder adapter and soft token to read them (``adapters=false`` is the scorer-only
  ablation on the frozen model);
- ``AnswerSpanSelector``: ours, beside the paper's method: a scorer trained toward the spans questions ask for
  (``decodebench train-nugget --recipe answer-spans``, models/nugget/span_training.py; ``selector=answer-spans``:
  the one shipped for the embedded model, any ratio), read as a tagger: whole predicted spans kept, each text once
  (``kernels.nugget.span_scores``), the nuggets the frozen model's own states;
- ``DelimiterSelector``: training-free and query-independent like the paper's scorer: delimiters
  first, what the paper's section 7.1 finds its trained scorer picks; a stand-in, not the method;
- ``SalienceSelector``: training-free and query-independent too, but after what questions ask for: whole words,
  names and numbers first, then the model's surprisal (a peer of ours, not the method);
- ``QuestionOverlapSelector``: training-free and query-aware: the sentences that share most words with the question
  first (the coarse, question-aware step of LongLLMLingua's kind, done lexically), salience within them (ours);
- peers at the same ratio: ``QueryAttentionSelector`` (query-aware, SnapKV's kin: the attention
  the question pays to each document token), ``StreamingSelector`` (StreamingLLM: ``sinks`` first
  tokens plus the most recent), ``TruncationSelector`` (the most recent tokens) and
  ``FullContext`` (no compression).

No selector holds more than one layer's attention weights at a time, so memory grows linearly
with the document (tests/test_nugget.py runs an 8k-token document under a memory cap).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from pathlib import Path
from typing import ClassVar

import torch

from decodebench.kernels.nugget import (
    content_words,
    delimiter_scores,
    position_scores,
    question_overlap_scores,
    salience_scores,
    span_scores,
)
from decodebench.models.nugget.compressor import LayerScores, chat_template_parts, layer_hidden_states
from decodebench.models.nugget.config import NuggetConfig

log = logging.getLogger(__name__)


class Selector:
    name: ClassVar[str]
    label: ClassVar[str]
    compresses: ClassVar[bool] = True
    adapters = None  # a NuggetAdapters when the nuggets are built and read by trained adapters

    def __init__(self, config: NuggetConfig):
        self.config = config

    def setup(self, lm) -> None:
        """Called once the model is loaded."""

    def record(self) -> dict:
        """What a results file says about the selector beyond its label (a checkpoint's identity)."""
        return {}

    def scores(self, lm, document: torch.Tensor, tail: list[int]) -> torch.Tensor:
        """One score per token of ``document`` [1, n] (higher is kept first)."""
        raise NotImplementedError

    def encoding_scores(self, lm, document: torch.Tensor, tail: list[int]) -> torch.Tensor | LayerScores:
        """What the compressor ranks ``document`` by: ``scores``, or where they come from the frozen model's hidden
        states and the encoding is the frozen model's too, their ``LayerScores``, read from the encoding pass."""
        return self.scores(lm, document, tail)

    @staticmethod
    def token_texts(lm, document: torch.Tensor) -> list[str]:
        """Each token's text of ``document`` [1, n], as the text-reading kernels take it (words, names, sentence
        ends, delimiters)."""
        return [lm.tokenizer.decode([t]) for t in document[0].tolist()]


class FullContext(Selector):
    name = "full"
    label = "full context (no compression)"
    compresses = False


class DelimiterSelector(Selector):
    name = "delimiter"
    label = "training-free, query-independent stand-in for the paper's scorer (delimiters first; not the method)"

    def scores(self, lm, document, tail):
        return delimiter_scores(self.token_texts(lm, document))


class StreamingSelector(Selector):
    name = "streaming"
    label = "StreamingLLM peer (attention sinks + most recent tokens)"

    def scores(self, lm, document, tail):
        return position_scores(document.shape[1], sinks=self.config.sinks)


class TruncationSelector(Selector):
    name = "truncation"
    label = "truncation peer (most recent tokens)"

    def scores(self, lm, document, tail):
        return position_scores(document.shape[1])


class QueryAttentionSelector(Selector):
    name = "query-attention"
    label = (
        "query-aware attention peer (SnapKV's kin: the attention the question pays to each document token, "
        "summed over layers and heads; not the paper's query-independent method)"
    )

    def scores(self, lm, document, tail):
        from transformers import DynamicCache

        model, n = lm.model, document.shape[1]
        cache = DynamicCache(config=model.config)
        model(input_ids=document, past_key_values=cache, use_cache=True, logits_to_keep=1)
        received = torch.zeros(n, device=document.device)
        with tally_received_attention(model, received, n):
            model(
                input_ids=torch.tensor([tail], device=document.device),
                past_key_values=cache,
                position_ids=torch.arange(n, n + len(tail), device=document.device)[None],
                logits_to_keep=1,
            )
        return received.float().cpu()


class SalienceSelector(Selector):
    name = "salience"
    label = (
        "training-free salience peer (whole words: names and numbers first, then the model's surprisal; "
        "query-independent; not the paper's method)"
    )
    CHUNK = 256  # positions whose vocabulary-sized logits are held at once

    def surprisal(self, lm, document) -> torch.Tensor:
        """Each token's -log p [n] under the model given the tokens before it (0 for the first)."""
        model, ids = lm.model, document[0]
        hidden = model.get_decoder()(input_ids=document).last_hidden_state[0]  # [n, d]
        head = model.get_output_embeddings()
        surprisal = torch.zeros(len(ids))  # the first token has nothing before it to be predicted from
        for start in range(0, len(ids) - 1, self.CHUNK):
            stop = min(start + self.CHUNK, len(ids) - 1)
            log_probs = torch.log_softmax(head(hidden[start:stop]).float(), dim=-1)
            surprisal[start + 1 : stop + 1] = -log_probs.gather(1, ids[start + 1 : stop + 1, None])[:, 0].cpu()
        return surprisal

    def scores(self, lm, document, tail):
        return salience_scores(self.token_texts(lm, document), self.surprisal(lm, document))


class QuestionOverlapSelector(SalienceSelector):
    name = "question-overlap"
    label = (
        "training-free query-aware peer (the sentences holding most of the question's words first, then names, "
        "numbers and surprisal within them; not the paper's query-independent method)"
    )

    def setup(self, lm) -> None:
        # the words the chat template adds after the user's text ("assistant") are not the question's
        parts = chat_template_parts(lm.tokenizer)
        self.template_words: set[str] = content_words(parts[1]) if parts else set()

    def scores(self, lm, document, tail):
        question = content_words(lm.tokenizer.decode(tail, skip_special_tokens=True)) - self.template_words
        return question_overlap_scores(self.token_texts(lm, document), question, self.surprisal(lm, document))


class CheckpointSelector(Selector):
    """A selector whose scorer is a ``decodebench train-nugget`` file, checked (against its manifest's sha256, then as
    a checkpoint) before the model loads; a shipped one must have its manifest."""

    def __init__(self, config: NuggetConfig, path: Path, shipped: bool):
        from decodebench.data.paths import sha256_file
        from decodebench.models.nugget.checkpoint import read_checkpoint
        from decodebench.models.nugget.shipped import verify

        super().__init__(config)
        self.path = path
        self.manifest = verify(path, required=shipped)
        self.checkpoint = read_checkpoint(path)
        self.sha256 = self.manifest["sha256"] if self.manifest else sha256_file(path)

    def record(self) -> dict:
        return {
            "checkpoint": str(self.path),
            "checkpoint_sha256": self.sha256,
            **({"checkpoint_command": self.manifest["command"]} if self.manifest else {}),
        }

    def scores(self, lm, document, tail):
        return self.from_hidden(lm, document, layer_hidden_states(lm.model, document, self.scorer.layer))

    def encoding_scores(self, lm, document, tail):
        if self.adapters is not None:  # the encoder adapter builds other states than the frozen ones it scores
            return self.scores(lm, document, tail)
        return LayerScores(self.scorer.layer, functools.partial(self.from_hidden, lm, document))

    def from_hidden(self, lm, document: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Scores [n] of ``document`` [1, n] from the frozen model's hidden states [1, n, d] at the scorer's layer."""
        raise NotImplementedError


class TrainedNugget(CheckpointSelector):
    name = "trained"

    def __init__(self, config: NuggetConfig):
        from decodebench.models.nugget.checkpoint import CheckpointError
        from decodebench.models.nugget.shipped import shipped_checkpoint

        shipped = config.selector == self.name
        super().__init__(config, shipped_checkpoint(config.ratio) if shipped else Path(config.selector), shipped)
        if config.adapters and not self.checkpoint.has_adapters:
            raise CheckpointError(f"{self.path} holds a scorer only (no LoRA adapters); run it with adapters=false")
        if config.ratio != self.checkpoint.ratio:
            log.warning(
                "%s was trained at ratio %g and runs at ratio=%g: the paper trains one compressor per ratio, so this "
                "is not its method as trained (train one with `decodebench train-nugget --ratio %g`)",
                self.path,
                self.checkpoint.ratio,
                config.ratio,
                config.ratio,
            )

    @property
    def label(self) -> str:  # type: ignore[override]
        if self.config.adapters:
            return f"the paper's nugget: trained scorer + LoRA encoder/decoder + soft token ({self.path.name})"
        return f"trained scorer only, frozen model (ablation of the paper's nugget; {self.path.name})"

    def record(self) -> dict:
        return {**super().record(), "checkpoint_trained_at_ratio": self.checkpoint.ratio}

    def setup(self, lm) -> None:
        self.checkpoint.check_model(lm.model, lm.tokenizer)
        self.scorer = self.checkpoint.scorer().to(lm.device)
        if self.config.adapters:
            self.adapters = self.checkpoint.attach_adapters(lm.model)
            self.adapters.soft_token.data = self.adapters.soft_token.data.to(lm.device, lm.model.dtype)
            self.adapters.use("decoder")

    def from_hidden(self, lm, document, hidden):
        return self.scorer.score_hidden(lm.model, hidden)[0].float().cpu()


class AnswerSpanSelector(CheckpointSelector):
    name = "answer-spans"

    def __init__(self, config: NuggetConfig, path: Path | None = None):
        from decodebench.models.nugget.checkpoint import CheckpointError
        from decodebench.models.nugget.shipped import shipped_span_scorer

        super().__init__(config, path or shipped_span_scorer(), shipped=path is None)
        if self.checkpoint.has_adapters:
            raise CheckpointError(f"{self.path}: an answer-span scorer holds no adapters, and this file has them")

    @property
    def label(self) -> str:  # type: ignore[override]
        return (
            "answer-span scorer (ours, not the paper's method: trained toward the terms, names and numbers questions "
            f"ask for; whole predicted spans, each text once; the frozen model's states; {self.path.name})"
        )

    def setup(self, lm) -> None:
        self.checkpoint.check_model(lm.model, lm.tokenizer)
        self.scorer = self.checkpoint.scorer().to(lm.device)

    def from_hidden(self, lm, document, hidden):
        return span_scores(self.token_texts(lm, document), self.scorer.score_hidden(lm.model, hidden)[0])


# -- the attention a question pays to the document, one layer at a time -------------------------
_TALLY: contextvars.ContextVar[tuple[torch.Tensor, int] | None] = contextvars.ContextVar("tally", default=None)
_TALLY_ATTENTION = "decodebench_tally"


def _tallying_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """sdpa attention that also adds, to the tally, the attention each of the first ``n`` keys
    receives (summed over heads and queries); only this layer's weights exist at any time."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    tally = _TALLY.get()
    if tally is not None:
        received, n = tally
        keys = repeat_kv(key, query.shape[1] // key.shape[1])
        logits = torch.matmul(query.float(), keys.float().transpose(2, 3)) * (scaling or query.shape[-1] ** -0.5)
        if attention_mask is None:  # causal, the queries being the last positions
            queries, length = query.shape[2], keys.shape[2]
            rows = torch.arange(length - queries, length, device=query.device)[:, None]
            attention_mask = torch.arange(length, device=query.device)[None, :] <= rows
        if attention_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attention_mask[..., : keys.shape[2]], float("-inf"))
        else:
            logits = logits + attention_mask[..., : keys.shape[2]].float()
        received += torch.softmax(logits, dim=-1)[..., :n].sum(dim=(0, 1, 2))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


@contextlib.contextmanager
def tally_received_attention(model, received: torch.Tensor, n: int):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_TALLY_ATTENTION, _tallying_attention)
    AttentionMaskInterface.register(_TALLY_ATTENTION, sdpa_mask)  # the masks sdpa gets
    previous = model.config._attn_implementation
    token = _TALLY.set((received, n))
    model.set_attn_implementation(_TALLY_ATTENTION)
    try:
        yield received
    finally:
        model.set_attn_implementation(previous)
        _TALLY.reset(token)


# selector= -> class (the names are NuggetConfig's SELECTOR_NAMES; anything else is a checkpoint file)
SELECTORS = {
    cls.name: cls
    for cls in (
        TrainedNugget,
        AnswerSpanSelector,
        DelimiterSelector,
        SalienceSelector,
        QuestionOverlapSelector,
        QueryAttentionSelector,
        StreamingSelector,
        TruncationSelector,
        FullContext,
    )
}


def build_selector(config: NuggetConfig) -> Selector:
    if config.selector in SELECTORS:
        return SELECTORS[config.selector](config)
    from decodebench.models.nugget.checkpoint import training_objective
    from decodebench.models.nugget.span_training import OBJECTIVE

    # a checkpoint file: an answer-span scorer (its training record says so) or the paper's compressor, whose
    # selector checks the file (manifest, then contents) and names what is wrong with it
    if training_objective(config.selector) == OBJECTIVE:
        return AnswerSpanSelector(config, Path(config.selector))
    return TrainedNugget(config)
