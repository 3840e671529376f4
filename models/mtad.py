"""``lm_eval --model mtad``: multi-token assisted decoding, next to its baselines in one class.

``mode`` chooses what one row's decoding loop does (all share the same target KV cache logic,
the same stop handling and the same measurement):

- ``mtad`` (the paper's Algorithm 1): draft ``gamma`` tokens by beam search (``beams`` wide),
  score every prefix with the target in one forward pass, accept the longest prefix whose joint
  likelihood ratio ``min(1, p/q)`` exceeds ``tau`` (kernels/mtad.py), take one more token from
  the target, crop both KV caches back;
- ``speculative``: speculative sampling (per-token ``min(1, p/q)``, residual resampling) when
  sampling, or greedy speculative decoding (keep draft tokens while they equal the target's
  argmax) when decoding greedily;
- ``target``: target-only decoding, one token per forward pass (the reference for speed-ups);
- ``assisted``: transformers' own assisted generation (``model.generate(assistant_model=...)``,
  or prompt lookup for ``draft=context``), measured through the same instrumentation.

``draft`` is ``self:<k>`` (the target's first k layers), ``context`` (prompt lookup, no model),
``infinigram[:<index>]`` (infinity-gram drafts), or a hub id / local path of a causal LM with the
target's vocabulary. Rows of a batch are decoded one at a time, as in the paper; use
``--batch_size 1`` so that every request's latency is its own. Greedy unless the task samples;
sampling warps both models with the paper's top-k 20 then top-p 0.9 (appendix F).

Per request: target forward passes, drafted and accepted tokens, block efficiency (new tokens per
target pass, the paper's Table 5), an acceptance histogram, and the output's perplexity under the
target, computed afterwards in a separate pass outside the timed window.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, ClassVar

import torch

from decodebench.kernels.mtad import check_mtad_args, mtad_accept_length, speculative_accept, warp_logits
from decodebench.measure import RequestRecord
from decodebench.models.base import Arg, DecodeBenchLM
from decodebench.models.drafts import (
    ContextDrafter,
    Draft,
    InfinigramDrafter,
    ModelDrafter,
    layer_skip_draft,
    same_vocabulary,
)
from decodebench.models.hf import DecodeOutput, HFBackend, RowDecoding

MODES = ("mtad", "speculative", "target", "assisted")


class MTADMethod(DecodeBenchLM):
    method = "mtad"
    method_label = "multi-token assisted decoding (Qin et al., Algorithm 1) and its baselines"
    backends: ClassVar[dict[str, str]] = {"hf": "decodebench.models.mtad:MTAD"}
    method_args: ClassVar[dict[str, Arg]] = {
        "mode": Arg(
            str, "mtad", "mtad, speculative (sampling), target (target only) or assisted (transformers')", choices=MODES
        ),
        "draft": Arg(
            str,
            "self:10",
            "self:<k> (the target's first k layers), context (prompt lookup), "
            "infinigram[:<index>], or a causal LM id/path with the target's vocabulary",
        ),
        "gamma": Arg(int, 4, "draft tokens per iteration"),
        "beams": Arg(int, 8, "beam width of MTAD's draft"),
        "tau": Arg(float, 0.1, "MTAD's acceptance threshold on min(1, p/q), in [0, 1)"),
        "seed": Arg(int, 1234, "random seed of sampled drafts and tokens"),
    }

    @classmethod
    def check_method_args(cls, values: dict[str, Any]) -> dict[str, Any]:
        check_mtad_args(values["gamma"], values["beams"], values["tau"])
        draft = values["draft"]
        if draft.startswith("self:"):
            layers = draft.removeprefix("self:")
            if not layers.isdigit():
                raise ValueError(f"draft={draft!r}: write self:<k> with an integer k (layers to keep)")
        if values["mode"] == "assisted" and draft.startswith("infinigram"):
            raise ValueError("mode=assisted runs transformers' assisted generation, which has no infini-gram draft")
        return values


class MTAD(MTADMethod, RowDecoding, HFBackend):
    """``--model mtad`` on the transformers backend (CPU or CUDA)."""

    def setup_method(self) -> None:
        config = self.method_config
        self.generator = torch.Generator(device=self.device).manual_seed(config["seed"])  # on the sampling device
        draft = config["draft"]
        self.draft_model = None
        if config["mode"] == "target":
            self.drafter = None
        elif draft.startswith("self:"):
            self.draft_model = layer_skip_draft(self.model, int(draft.removeprefix("self:")))
            self.drafter = ModelDrafter(self.draft_model, beams=config["beams"])
        elif draft == "context":
            self.drafter = ContextDrafter(self.eot_token_id)
        elif draft.startswith("infinigram"):
            from decodebench.infinigram import Index, ensure_reference_index

            location = draft.partition(":")[2]
            path = location or ensure_reference_index(self.tokenizer, self.pretrained_name)
            self.drafter = InfinigramDrafter(Index(path, self.tokenizer))
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            draft_tokenizer = AutoTokenizer.from_pretrained(draft)
            if not same_vocabulary(self.tokenizer, draft_tokenizer):
                raise ValueError(
                    f"draft={draft!r} has another vocabulary than the target ({len(draft_tokenizer)} vs "
                    f"{len(self.tokenizer)} tokens, or different ids); MTAD compares token probabilities, so the "
                    "draft must share the target's tokenizer"
                )
            self.draft_model = AutoModelForCausalLM.from_pretrained(draft, dtype=self.model.dtype).to(self.device)
            self.drafter = ModelDrafter(self.draft_model.eval(), beams=config["beams"])

    # -- decoding ---------------------------------------------------------------------
    def decode_batch(self, input_ids, attention_mask, *, stop, max_new_tokens, generation_kwargs) -> DecodeOutput:
        if self.method_config["mode"] == "assisted":
            return self._assisted(input_ids, attention_mask, stop, max_new_tokens, generation_kwargs)
        return super().decode_batch(
            input_ids, attention_mask, stop=stop, max_new_tokens=max_new_tokens, generation_kwargs=generation_kwargs
        )

    def sampling(self, kwargs: dict) -> dict | None:
        """None for greedy decoding, else the warping of appendix F (task values win)."""
        if not kwargs.get("do_sample"):
            return None
        return {
            "temperature": float(kwargs.get("temperature") or 1.0),
            "top_k": kwargs.get("top_k", 20),
            "top_p": kwargs.get("top_p", 0.9),
        }

    @torch.inference_mode()
    def decode_row(self, prompt: list[int], stop: list[str], max_new: int, sampling: dict | None):
        import time

        from transformers import DynamicCache

        mode, gamma, tau = self.method_config["mode"], self.method_config["gamma"], self.method_config["tau"]
        device = self.device
        cache = DynamicCache(config=self.model.config)

        def target(tokens: list[int]) -> torch.Tensor:
            return (
                self.model(input_ids=torch.tensor([tokens], device=device), past_key_values=cache, use_cache=True)
                .logits[0]
                .float()
            )

        logits = target(prompt)[-1]
        generated = [self.choose(logits, sampling)]
        first_token_at = time.perf_counter()
        calls, drafted, accepted, histogram = 1, 0, 0, Counter()
        while not self.finished(generated, stop, max_new):
            draft = self._draft(prompt + generated, gamma, sampling) if self.drafter else Draft([], [])
            g = len(draft.tokens)
            logits = target([generated[-1], *draft.tokens])  # [g + 1, V]: one verification pass
            calls += 1
            if g == 0:
                kept, extra = 0, self.choose(logits[0], sampling)
            elif mode == "speculative" and sampling is not None:
                target_probs = warp_logits(logits, **sampling).exp()[None]
                n, nxt = speculative_accept(
                    torch.tensor([draft.tokens], device=device),
                    draft.probs[None].to(device),
                    target_probs,
                    generator=self.generator,
                )
                kept, extra = int(n[0]), int(nxt[0])
            elif mode == "speculative":
                matches = torch.tensor(draft.tokens, device=device) == logits[:g].argmax(-1)
                kept = int(matches.int().cumprod(0).sum())
                extra = int(logits[kept].argmax())
            else:
                logp = warp_logits(logits, **sampling) if sampling else torch.log_softmax(logits, dim=-1)
                token_logp = logp[torch.arange(g, device=device), torch.tensor(draft.tokens, device=device)]
                joint_logq = torch.tensor(draft.joint_logq, device=device)
                kept = int(mtad_accept_length(token_logp[None], joint_logq[None], tau)[0])
                extra = self.choose(logits[kept], sampling)
            if g - kept:
                cache.crop(kept - g)
            drafted += g
            accepted += kept
            histogram[kept] += 1
            generated += [*draft.tokens[:kept], extra]
        new_tokens = self.truncate(generated, max_new)
        stats = {
            "target_calls": calls,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "block_efficiency": len(new_tokens) / calls,
            "acceptance_histogram": {str(k): v for k, v in sorted(histogram.items())},
        }
        return new_tokens, stats, first_token_at

    def _draft(self, sequence: list[int], gamma: int, sampling: dict | None) -> Draft:
        if self.method_config["mode"] != "speculative" or not isinstance(self.drafter, ModelDrafter):
            return self.drafter.draft(sequence, gamma)
        if sampling is None:  # greedy speculative decoding drafts greedily
            return self.drafter.draft(sequence, gamma, beams=1)
        return self.drafter.sample(sequence, gamma, sampling, generator=self.generator)

    def _assisted(self, input_ids, attention_mask, stop, max_new_tokens, kwargs) -> DecodeOutput:
        rows, stats, first = [], [], None
        for row in range(input_ids.shape[0]):
            mask = attention_mask[row].bool()
            extra = (
                {"prompt_lookup_num_tokens": self.method_config["gamma"]}
                if self.draft_model is None
                else {"assistant_model": self.draft_model, "num_assistant_tokens": self.method_config["gamma"]}
            )
            out = HFBackend.decode_batch(  # transformers generate, not the row loop
                self,
                input_ids[row : row + 1, mask],
                attention_mask[row : row + 1, mask],
                stop=stop,
                max_new_tokens=max_new_tokens,
                generation_kwargs={**kwargs, **extra},
            )
            rows.append(out.tokens[0].tolist())
            stats.append({})
            first = first or out.first_token_at
        return DecodeOutput(tokens=rows, first_token_at=first, row_stats=stats)

    # -- quality: perplexity under the target, outside the timed window -------------------
    @torch.inference_mode()
    def score_batch(self, input_ids, attention_mask, rows: list[list[int]]) -> list[dict]:
        scores = []
        for row, tokens in enumerate(rows):
            tokens = self.truncate(list(tokens), len(tokens))
            if not tokens:
                scores.append({"target_nll": 0.0, "scored_tokens": 0})
                continue
            prompt = input_ids[row][attention_mask[row].bool()]
            full = torch.cat([prompt, torch.tensor(tokens, device=prompt.device)])[None]
            logits = self.model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
            nll = torch.nn.functional.cross_entropy(logits, full[0, len(prompt) :], reduction="sum")
            scores.append(
                {
                    "target_nll": float(nll),
                    "scored_tokens": len(tokens),
                    "target_perplexity": math.exp(float(nll) / len(tokens)),
                }
            )
        return scores

    def summarize_method_stats(self, records: list[RequestRecord]) -> dict[str, Any]:
        totals = Counter()
        histogram = Counter()
        for rec in records:
            stats = rec.method_stats
            for key in ("target_calls", "drafted_tokens", "accepted_tokens", "target_nll", "scored_tokens"):
                totals[key] += stats.get(key, 0)
            histogram.update({k: v for k, v in stats.get("acceptance_histogram", {}).items()})
        new_tokens = sum(rec.new_tokens for rec in records)
        summary: dict[str, Any] = dict(totals)
        if totals["target_calls"]:
            summary["block_efficiency"] = new_tokens / totals["target_calls"]
        if totals["drafted_tokens"]:
            summary["acceptance_rate"] = totals["accepted_tokens"] / totals["drafted_tokens"]
        if totals["scored_tokens"]:
            summary["target_perplexity"] = math.exp(totals["target_nll"] / totals["scored_tokens"])
        summary["acceptance_histogram"] = dict(sorted(histogram.items(), key=lambda kv: int(kv[0])))
        return summary
