"""``lm_eval --model nugget``: answer from a context kept as nuggets (Qin et al., compressor mode).

For each request the prompt is split into the *document* (everything before the last
occurrence of ``split``, a blank line in decodebench's squad and cnndm tasks) and the *tail*
(the instruction or question, and the chat template's closing tokens). Then:

1. the document is encoded alone, so nothing downstream ever sees its dropped tokens;
2. a selector (models/nugget/selectors.py) scores its tokens and ``kernels.nugget.select_topk``
   keeps ``ceil(n / ratio)`` of them (the last one always);
3. every layer's cache keeps only those positions (``gather_kv``); keys were cached after the
   rotary embedding, so the nuggets keep their original positions;
4. the tail is fed uncompressed at positions ``n, n+1, ...`` (the true ones), and decoding goes
   on from there, greedy or sampled as the task says.

A document shorter than ``ratio`` tokens, or a prompt without ``split``, is left uncompressed
(a documented no-op; the statistics show a ratio of 1). Rows are decoded one at a time.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from decodebench.kernels.nugget import gather_kv, nuggets_for, select_topk
from decodebench.models.nugget.config import NuggetConfig
from decodebench.models.nugget.selectors import build_selector
from decodebench.models.rows import RowDecodingMethod, RowStop, Sampler, choose


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

    def setup(self, lm) -> None:
        self.selector.setup(lm)
        self.generator = torch.Generator(device=lm.device).manual_seed(1234)  # on the sampling device

    def split_point(self, lm, prompt: list[int]) -> int:
        """Number of leading tokens that form the document (0: no split marker)."""
        marker = self.config.split
        texts = [lm.tokenizer.decode([token]) for token in prompt]
        at = "".join(texts).rfind(marker)
        if at < 0:
            return 0
        end, position = at + len(marker), 0
        for index, text in enumerate(texts):  # the first token that starts at or after the marker's end
            if position >= end:
                return index
            position += len(text)
        return len(prompt)

    @torch.inference_mode()
    def decode_row(self, lm, prompt: list[int], stop: RowStop, sampler: Sampler | None):
        from transformers import DynamicCache

        model, device, ratio = lm.model, lm.device, self.config.ratio
        n = self.split_point(lm, prompt)
        document, tail = prompt[:n], prompt[n:]
        compress = self.selector.compresses and n >= ratio and nuggets_for(n, ratio) < n and tail
        if not compress:
            document, tail, n = [], prompt, 0
        cache = DynamicCache(config=model.config)
        stats: dict[str, Any] = {"document_tokens": len(document), "tail_tokens": len(tail)}
        if compress:
            layer = self.selector.hidden_layer
            encoded = model(
                input_ids=torch.tensor([document], device=device),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=layer is not None,
            )
            hidden = encoded.hidden_states[layer][0] if layer is not None else None
            full_bytes = _cache_bytes(cache)
            scores = self.selector.scores(lm, document, tail, hidden)
            indices, _ = select_topk(scores[None].to(device), torch.tensor([n], device=device), ratio)
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

        def step(tokens: list[int], start: int) -> torch.Tensor:
            positions = torch.arange(start, start + len(tokens), device=device)[None]
            ids = torch.tensor([tokens], device=device)
            return model(input_ids=ids, past_key_values=cache, use_cache=True, position_ids=positions).logits[0, -1]

        logits = step(tail, n).float()
        stats["kv_bytes_at_decode_start"] = _cache_bytes(cache)
        generated = [choose(logits, sampler)]
        first_token_at = time.perf_counter()
        while not stop.finished(generated):
            generated.append(choose(step(generated[-1:], n + len(tail) + len(generated) - 1).float(), sampler))
        return generated[: stop.max_new], stats, first_token_at

    def summarize(self, records) -> dict[str, Any]:
        compressed = [rec.method_stats for rec in records if "nuggets" in rec.method_stats]
        after_prefill = [rec.method_stats["kv_bytes_at_decode_start"] for rec in records]
        summary: dict[str, Any] = {
            "selector": self.description,
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


def _cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
