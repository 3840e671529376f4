"""``lm_eval --model nugget``: answer from a context kept as nuggets (Qin et al., compressor mode).

For each request the prompt is split into the *opening* (the chat template's opening: its system turn and the
user turn's header, or a plain prompt's leading special tokens), the *document* (from there to the last
occurrence of ``split``, a blank line in decodebench's squad and cnndm tasks) and the *tail* (the instruction or
question, and the chat template's closing tokens). As the authors run it, only the document is compressed
(``wrapper=kept``; ``wrapper=compressed`` compresses the opening with it, the layout the shipped compressors were
trained with). Then:

1. a selector (models/nugget/selectors.py) scores the tokens before the tail, and
   ``kernels.nugget.select_topk`` keeps the opening whole and ``ceil(n / ratio)`` of the document's ``n``
   tokens (the last one always);
2. the document is encoded alone (with a trained checkpoint: by its encoder adapter), so nothing
   downstream ever sees its dropped tokens (a scorer of the frozen model's states, when the encoding is the frozen
   model's too, reads its layer from this pass: ``LayerScores``), and every layer's cache keeps only the kept positions
   (models/nugget/compressor.py); keys were cached after the rotary embedding, so the nuggets
   keep their original positions;
3. the tail is fed uncompressed at positions ``n, n+1, ...`` (with a trained checkpoint: after
   its soft token, by its decoder adapter, as in training), and decoding goes on from there,
   greedy or sampled as the task says.

A document shorter than ``ratio`` tokens, or a prompt without ``split``, is left uncompressed
(a documented no-op; the statistics show a ratio of 1). A batch (``--batch_size N``) compresses each row's
document on its own and decodes the rows together: their nuggets left-padded into one cache, each row at its
own positions; greedy answers equal those of batch 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from decodebench.kernels.nugget import nuggets_for
from decodebench.models.method import DecodeOutput
from decodebench.models.nugget.compressor import after_nuggets, cache_bytes, encode_nuggets, reading, stack_nuggets
from decodebench.models.nugget.config import NuggetConfig
from decodebench.models.nugget.selectors import build_selector
from decodebench.models.rows import RowDecodingMethod, RowStop, Sampler, choose


@dataclass
class Compressed:
    """One row ready to decode: its document's nuggets, where the text after them starts, and that text."""

    layers: list[tuple[torch.Tensor, torch.Tensor]] | None  # per layer keys, values [1, heads, k, dim]; None: as is
    start: int  # the position of the first tail token (the opening's and document's length; 0 for a row as it is)
    tail: list[int]
    stats: dict[str, Any]


def decode_together(lm, rows: list[Compressed], adapters, stops: list[RowStop], sampler: Sampler | None):
    """Decode rows as one batch: their nuggets left-padded into one cache, their tails left-padded after them,
    each token at its row's own position, the padding masked out; until every row has stopped.

    Returns each row's new tokens (cut at its own stop) and when the first new tokens existed. Each row's
    ``kv_bytes_at_decode_start`` is what the batch's cache physically holds per row, padding included.
    """
    model, device = lm.model, lm.device
    batch = len(rows)
    cache, nugget_mask = stack_nuggets(model, [row.layers for row in rows], device)
    soft = adapters.soft_token if adapters is not None else None
    inputs, tail_mask, positions = after_nuggets(model, [r.start for r in rows], [r.tail for r in rows], soft, device)
    mask = torch.cat([nugget_mask, tail_mask], dim=1)
    logits = model(
        inputs_embeds=inputs, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits[:, -1]
    held = cache_bytes(cache) // batch
    for row in rows:
        row.stats["kv_bytes_at_decode_start"] = held
    generated = [[choose(logits[i].float(), sampler)] for i in range(batch)]
    first_token_at = time.perf_counter()
    next_position = positions[:, -1] + 1
    while not all(stop.finished(tokens) for stop, tokens in zip(stops, generated, strict=True)):
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], dim=1)
        step = torch.tensor([[tokens[-1]] for tokens in generated], device=device)
        logits = model(
            input_ids=step,
            attention_mask=mask,
            position_ids=next_position[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        next_position = next_position + 1
        for i, tokens in enumerate(generated):
            tokens.append(choose(logits[i].float(), sampler))
    return [stop.truncate(tokens) for stop, tokens in zip(stops, generated, strict=True)], first_token_at


def tokens_before(texts: list[str], end: int) -> int:
    """How many of the tokens whose texts are ``texts`` start before character ``end`` of their joined text."""
    position = 0
    for index, text in enumerate(texts):  # the first token that starts at or after ``end``
        if position >= end:
            return index
        position += len(text)
    return len(texts)


PLACEHOLDER = "\u2063decodebench-document\u2063"


def user_turn_header(tokenizer) -> str:
    """What the chat template writes right before a user's text: from the last special token before it (for
    SmolLM2, ``<|im_start|>user\\n``); "" without a chat template or a special token there."""
    from jinja2 import TemplateError

    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}], tokenize=False)
    except (ValueError, TypeError, AttributeError, TemplateError):  # no chat template, or one that refuses this
        return ""
    before = rendered[: rendered.find(PLACEHOLDER)] if PLACEHOLDER in rendered else ""
    starts = [before.rfind(token) for token in tokenizer.all_special_tokens if token]
    return before[max(starts) :] if starts and max(starts) >= 0 else ""


class Nugget(RowDecodingMethod):
    name = "nugget"
    label = "nugget-compressed context (Qin et al.)"
    Config = NuggetConfig
    config: NuggetConfig

    def __init__(self, config: NuggetConfig | None = None):
        super().__init__(config)
        self.selector = build_selector(self.config)

    @property
    def description(self) -> str:
        return self.selector.label

    @classmethod
    def demo_model_args(cls) -> dict[str, Any]:
        """The default selector (the answer-span scorer shipped for the embedded model) at the default ratio."""
        return {"ratio": cls.Config.defaults().ratio}

    def setup(self, lm) -> None:
        self.selector.setup(lm)
        self.generator = torch.Generator(device=lm.device).manual_seed(1234)  # on the sampling device

    def split_point(self, lm, prompt: list[int]) -> int:
        """Number of leading tokens that come before the tail: the opening and the document (0: no split marker)."""
        texts = [lm.tokenizer.decode([token]) for token in prompt]
        at = "".join(texts).rfind(self.config.split)
        return 0 if at < 0 else tokens_before(texts, at + len(self.config.split))

    def opening_length(self, lm, prompt: list[int], n: int) -> int:
        """Leading tokens of the ``n`` before the tail that are the prompt's opening, not its document (0 with
        ``wrapper=compressed``): up to the end of the last user turn's header the chat template writes (found by
        rendering the template around a placeholder), else the prompt's leading special tokens (a BOS)."""
        if self.config.wrapper == "compressed" or not n:
            return 0
        texts = [lm.tokenizer.decode([token]) for token in prompt[:n]]
        header = user_turn_header(lm.tokenizer)
        at = "".join(texts).rfind(header) if header else -1
        if at >= 0:
            return tokens_before(texts, at + len(header))
        special = set(lm.tokenizer.all_special_ids)
        return next((i for i, token in enumerate(prompt[:n]) if token not in special), n)

    # -- decoding: every row compressed on its own, then the batch decoded together -----------------------------
    def compress(self, lm, prompt: list[int]) -> Compressed:
        """One row's document kept as nuggets (its own selection and encoding), or the row as it is when there is
        nothing to compress (no split marker, a document shorter than the ratio)."""
        model, device, ratio = lm.model, lm.device, self.config.ratio
        n = self.split_point(lm, prompt)
        opening = self.opening_length(lm, prompt, n)
        document, tail = n - opening, prompt[n:]
        if not (self.selector.compresses and document >= ratio and nuggets_for(document, ratio) < document and tail):
            return Compressed(None, 0, prompt, {"document_tokens": 0, "tail_tokens": len(prompt)})
        ids = torch.tensor([prompt[:n]], device=device)
        scores = self.selector.encoding_scores(lm, ids, tail)  # encode_nuggets moves them to the device
        encoder = self.selector.adapters is not None
        nuggets = encode_nuggets(model, ids, scores, ratio, encoder=encoder, kept_whole=opening)
        kept = nuggets.indices.shape[1] - opening
        stats = {
            "opening_tokens": opening,
            "document_tokens": document,
            "tail_tokens": len(tail),
            "nuggets": kept,
            "achieved_ratio": document / kept,
            # every position holds the same bytes: the document's share, the opening left out
            "document_kv_bytes_full": nuggets.full_kv_bytes * document // n,
            "document_kv_bytes_kept": cache_bytes(nuggets.cache) * kept // (kept + opening),
        }
        layers = [(layer.keys, layer.values) for layer in nuggets.cache.layers]
        return Compressed(layers, n, tail, stats)

    @torch.inference_mode()
    def hf_decode(self, lm, input_ids, attention_mask, *, stop, max_new_tokens, kwargs) -> DecodeOutput:
        """Each row compressed independently, then the rows decoded together: the compressed ones through the
        decoder adapter (with a checkpoint), the uncompressed ones as the plain model, each group as one batch."""
        sampler = Sampler.from_decoding(lm.decoding_settings(kwargs, self.sampling_defaults), self.generator)
        prompts = [input_ids[row][attention_mask[row].bool()].tolist() for row in range(input_ids.shape[0])]
        rows = [self.compress(lm, prompt) for prompt in prompts]
        tokens: list[list[int]] = [[] for _ in rows]
        first_token_at = None
        for compressed in (True, False):
            group = [i for i, row in enumerate(rows) if (row.layers is not None) == compressed]
            if not group:
                continue
            adapters = self.selector.adapters if compressed else None
            stops = [RowStop(lm, stop, max_new_tokens) for _ in group]
            with reading(lm.model, adapters):  # an uncompressed row is the plain model's
                decoded, first = decode_together(lm, [rows[i] for i in group], adapters, stops, sampler)
            for i, row_tokens in zip(group, decoded, strict=True):
                tokens[i] = row_tokens
            first_token_at = first_token_at or first
        return DecodeOutput(tokens=tokens, first_token_at=first_token_at, row_stats=[row.stats for row in rows])

    def summarize(self, records, engine=None) -> dict[str, Any]:
        compressed = [rec.method_stats for rec in records if "nuggets" in rec.method_stats]
        after_prefill = [rec.method_stats["kv_bytes_at_decode_start"] for rec in records]
        summary: dict[str, Any] = {
            "selector": self.description,
            **self.selector.record(),
            "compressed_requests": len(compressed),
            "uncompressed_requests": len(records) - len(compressed),
            "kv_bytes_at_decode_start": sum(after_prefill),
            "mean_kv_bytes_after_prefill": sum(after_prefill) / len(after_prefill) if after_prefill else None,
        }
        if compressed:
            document = sum(stats["document_tokens"] for stats in compressed)
            kept = sum(stats["nuggets"] for stats in compressed)
            summary.update(
                document_tokens=document,
                nuggets=kept,
                achieved_ratio=document / kept,
                document_kv_fraction_kept=sum(s["document_kv_bytes_kept"] for s in compressed)
                / sum(s["document_kv_bytes_full"] for s in compressed),
            )
        return summary

    def summary_columns(self, stats: dict[str, Any]) -> dict[str, float | str]:
        columns = {
            label: stats[key]
            for key, label in (("achieved_ratio", "compression"), ("document_kv_fraction_kept", "document KV kept"))
            if key in stats
        }
        if stats.get("mean_kv_bytes_after_prefill") is not None:
            columns["KV after prefill (MiB)"] = stats["mean_kv_bytes_after_prefill"] / 2**20
        return columns
