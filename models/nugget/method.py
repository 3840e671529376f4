"""``lm_eval --model nugget``: answer from a context kept as nuggets (Qin et al., compressor mode).

For each request the prompt is split into the *document* (everything before the last
occurrence of ``split``, a blank line in decodebench's squad and cnndm tasks) and the *tail*
(the instruction or question, and the chat template's closing tokens). Then:

1. a selector (models/nugget/selectors.py) scores the document's tokens, and
   ``kernels.nugget.select_topk`` keeps ``ceil(n / ratio)`` of them (the last one always);
2. the document is encoded alone (with a trained checkpoint: by its encoder adapter), so nothing
   downstream ever sees its dropped tokens, and every layer's cache keeps only the kept positions
   (models/nugget/compressor.py); keys were cached after the rotary embedding, so the nuggets
   keep their original positions;
3. the tail is fed uncompressed at positions ``n, n+1, ...`` (with a trained checkpoint: after
   its soft token, by its decoder adapter, as in training), and decoding goes on from there,
   greedy or sampled as the task says.

A document shorter than ``ratio`` tokens, or a prompt without ``split``, is left uncompressed
(a documented no-op; the statistics show a ratio of 1). Rows are decoded one at a time.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from decodebench.kernels.nugget import nuggets_for
from decodebench.models.nugget.compressor import cache_bytes, encode_nuggets, feed_after_nuggets, reading
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

    @classmethod
    def demo_model_args(cls) -> dict[str, Any]:
        """The paper's method when a trained compressor for the embedded model is at its default place
        (``decodebench train-nugget``), else the training-free stand-in; results name the selector."""
        from decodebench.models.nugget.training import default_checkpoint

        ratio = cls.Config.defaults().ratio
        trained = default_checkpoint("embedded", ratio)
        return {"ratio": ratio, **({"selector": str(trained)} if trained.is_file() else {})}

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
        stats: dict[str, Any] = {
            "document_tokens": n if compress else 0,
            "tail_tokens": len(tail if compress else prompt),
        }
        adapters = self.selector.adapters if compress else None
        if compress:
            ids = torch.tensor([document], device=device)
            scores = self.selector.scores(lm, ids, tail).to(device)
            nuggets = encode_nuggets(model, ids, scores, ratio, encoder=adapters is not None)
            cache, kept = nuggets.cache, nuggets.indices.shape[1]
            stats.update(
                nuggets=kept,
                achieved_ratio=n / kept,
                document_kv_bytes_full=nuggets.full_kv_bytes,
                document_kv_bytes_kept=cache_bytes(cache),
            )
        else:
            cache, tail, n = DynamicCache(config=model.config), prompt, 0
        with reading(model, adapters):  # an uncompressed row is the plain model's
            return self._decode(model, device, cache, tail, n, adapters, stop, sampler, stats)

    @staticmethod
    def _decode(model, device, cache, tail, n, adapters, stop, sampler, stats):
        soft_token = adapters.soft_token if adapters is not None else None

        def step(tokens: list[int], start: int, soft: torch.Tensor | None = None) -> torch.Tensor:
            ids = torch.tensor([tokens], device=device)
            return feed_after_nuggets(model, cache, ids, start, soft)[0, -1].float()

        logits = step(tail, n, soft_token)
        stats["kv_bytes_at_decode_start"] = cache_bytes(cache)
        generated = [choose(logits, sampler)]
        first_token_at = time.perf_counter()
        offset = n + len(tail) + (soft_token is not None)
        while not stop.finished(generated):
            generated.append(choose(step(generated[-1:], offset + len(generated) - 1), sampler))
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
