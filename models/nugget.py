"""``lm_eval --model nugget``: answer from a context kept as nuggets (Qin et al., compressor mode).

For each request the prompt is split into the *document* (everything before the last
occurrence of ``split``, a blank line in decodebench's squad and cnndm tasks) and the *tail*
(the instruction or question, and the chat template's closing tokens). Then:

1. the document is encoded alone, so nothing downstream ever sees its dropped tokens;
2. a selector scores its tokens and ``kernels.nugget.select_topk`` keeps ``ceil(n / ratio)``
   of them (the last one always);
3. every layer's cache keeps only those positions (``gather_kv``); keys were cached after the
   rotary embedding, so the nuggets keep their original positions;
4. the tail is fed uncompressed at positions ``n, n+1, ...`` (the true ones), and decoding goes
   on from there, greedy or sampled as the task says.

Selectors (``selector=``): ``delimiter`` (training-free: delimiters first, an approximation of
what the paper's section 7.1 finds its learned scorer picks), ``attention`` (training-free: the
attention the document receives from the tail in a full-context scoring pass, an approximation
too), a trained selector file from ``decodebench train-nugget`` (the paper's scorer: an FFN over
a lower layer's hidden states, trained with the straight-through estimator), and the peers at the
same ratio: ``streaming`` (StreamingLLM: ``sinks`` first tokens plus the most recent), ``truncation``
(the most recent tokens) and ``full`` (no compression).

A document shorter than ``ratio`` tokens, or a prompt without ``split``, is left uncompressed
(a documented no-op; the statistics show a ratio of 1). Rows are decoded one at a time.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import torch

from decodebench.kernels.nugget import (
    check_ratio,
    delimiter_scores,
    gather_kv,
    nuggets_for,
    position_scores,
    select_topk,
)
from decodebench.measure import RequestRecord
from decodebench.models.base import Arg, DecodeBenchLM
from decodebench.models.hf import HFBackend, RowDecoding

BUILTIN_SELECTORS = ("delimiter", "attention", "streaming", "truncation", "full")
LABELS = {
    "delimiter": "training-free delimiter selector (approximation of the paper's learned scorer)",
    "attention": "training-free attention selector (approximation of the paper's learned scorer)",
    "streaming": "StreamingLLM peer (attention sinks + most recent tokens)",
    "truncation": "truncation peer (most recent tokens)",
    "full": "full context (no compression)",
    "learned": "learned scorer (the paper's method, trained with decodebench train-nugget)",
}


class NuggetMethod(DecodeBenchLM):
    method = "nugget"
    method_label = "nugget-compressed context (Qin et al.)"
    backends: ClassVar[dict[str, str]] = {"hf": "decodebench.models.nugget:Nugget"}
    method_args: ClassVar[dict[str, Arg]] = {
        "ratio": Arg(
            float,
            10.0,
            "compression ratio r: the document keeps ceil(n / r) of its n tokens",
            check=lambda r: None if r >= 1 else "must be >= 1",
        ),
        "selector": Arg(
            str,
            "delimiter",
            "delimiter, attention, streaming, truncation, full, or the path of a "
            "selector trained with `decodebench train-nugget`",
        ),
        "split": Arg(str, "\n\n", "the document is the prompt before the last occurrence of this marker"),
        "sinks": Arg(int, 4, "first tokens the streaming selector always keeps"),
    }

    @classmethod
    def check_method_args(cls, values: dict[str, Any]) -> dict[str, Any]:
        check_ratio(values["ratio"])
        values["split"] = (
            values["split"].encode().decode("unicode_escape") if "\\" in values["split"] else values["split"]
        )
        return values


class Nugget(NuggetMethod, RowDecoding, HFBackend):
    """``--model nugget`` on the transformers backend."""

    def setup_method(self) -> None:
        selector = self.method_config["selector"]
        self.learned = None
        if selector not in BUILTIN_SELECTORS:
            from decodebench.nugget_training import load_selector

            self.learned = load_selector(selector, self.model, self.tokenizer).to(self.device)
        self.method_label = LABELS["learned" if self.learned is not None else selector]
        self.generator = torch.Generator(device=self.device).manual_seed(1234)  # on the sampling device

    # -- decoding ---------------------------------------------------------------------
    def split_point(self, prompt: list[int]) -> int:
        """Number of leading tokens that form the document (0: no split marker)."""
        marker = self.method_config["split"]
        texts = [self.tokenizer.decode([token]) for token in prompt]
        joined = "".join(texts)
        at = joined.rfind(marker)
        if at < 0:
            return 0
        end, position = at + len(marker), 0
        for index, text in enumerate(texts):  # the first token that starts at or after the marker's end
            if position >= end:
                return index
            position += len(text)
        return len(prompt)

    def scores(self, document: list[int], tail: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        selector, n = self.method_config["selector"], len(document)
        if self.learned is not None:
            return self.learned(hidden).float().cpu()
        if selector == "delimiter":
            return delimiter_scores([self.tokenizer.decode([t]) for t in document])
        if selector == "streaming":
            return position_scores(n, sinks=self.method_config["sinks"])
        if selector == "truncation":
            return position_scores(n)
        # attention: what the tail's tokens attend to in a full-context scoring pass (every layer, head)
        full = torch.tensor([document + tail], device=self.device)
        with _eager_attention(self.model):
            attentions = self.model(input_ids=full, output_attentions=True).attentions
        received = sum(layer[0, :, n:, :n].sum(dim=(0, 1)) for layer in attentions)
        return received.float().cpu()

    @torch.inference_mode()
    def decode_row(self, prompt: list[int], stop: list[str], max_new: int, sampling: dict | None):
        from transformers import DynamicCache

        device = self.device
        ratio, selector = self.method_config["ratio"], self.method_config["selector"]
        n = self.split_point(prompt)
        document, tail = prompt[:n], prompt[n:]
        compress = selector != "full" and n >= ratio and nuggets_for(n, ratio) < n and tail
        if not compress:
            document, tail, n = [], prompt, 0
        cache = DynamicCache(config=self.model.config)
        stats: dict[str, Any] = {"document_tokens": len(document), "tail_tokens": len(tail)}
        if compress:
            encoded = self.model(
                input_ids=torch.tensor([document], device=device),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=self.learned is not None,
            )
            hidden = encoded.hidden_states[self.learned.layer][0] if self.learned is not None else None
            full_bytes = _cache_bytes(cache)
            indices, _ = select_topk(
                self.scores(document, tail, hidden)[None].to(device), torch.tensor([n], device=device), ratio
            )
            cache = DynamicCache(
                ddp_cache_data=[gather_kv(layer.keys, layer.values, indices) for layer in cache.layers]
            )
            kept = indices.shape[1]
            stats.update(
                nuggets=kept,
                achieved_ratio=n / kept,
                document_kv_bytes_full=full_bytes,
                document_kv_bytes_kept=_cache_bytes(cache),
            )
        positions = torch.arange(n, n + len(tail), device=device)[None]
        logits = (
            self.model(
                input_ids=torch.tensor([tail], device=device),
                past_key_values=cache,
                use_cache=True,
                position_ids=positions,
            )
            .logits[0, -1]
            .float()
        )
        stats["kv_bytes_at_decode_start"] = _cache_bytes(cache)
        generated = [self.choose(logits, sampling)]
        first_token_at = time.perf_counter()
        position = n + len(tail)
        while not self.finished(generated, stop, max_new):
            logits = (
                self.model(
                    input_ids=torch.tensor([[generated[-1]]], device=device),
                    past_key_values=cache,
                    use_cache=True,
                    position_ids=torch.tensor([[position]], device=device),
                )
                .logits[0, -1]
                .float()
            )
            position += 1
            generated.append(self.choose(logits, sampling))
        return generated[:max_new], stats, first_token_at

    def summarize_method_stats(self, records: list[RequestRecord]) -> dict[str, Any]:
        compressed = [rec.method_stats for rec in records if "nuggets" in rec.method_stats]
        summary: dict[str, Any] = {
            "selector": self.method_label,
            "compressed_requests": len(compressed),
            "uncompressed_requests": len(records) - len(compressed),
            "kv_bytes_at_decode_start": sum(rec.method_stats.get("kv_bytes_at_decode_start", 0) for rec in records),
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


def _cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


class _eager_attention:
    """Temporarily switch to eager attention, the only kind that returns attention weights."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.previous)
