"""``lm_eval --model mtad``: multi-token assisted decoding, next to its baselines.

``mode`` chooses what one iteration of a row's decoding loop does (models/mtad/modes.py): the
paper's Algorithm 1, speculative sampling, target-only decoding, or transformers' assisted
generation; all share the same target KV cache logic, the same stop handling and the same
measurement. ``draft`` is ``self:<k>`` (the target's first k layers), ``context`` (prompt
lookup, no model), ``infinigram[:<index>]`` (infinity-gram drafts), or a hub id / local path of a
causal LM with the target's vocabulary (models/mtad/drafts.py). Rows of a batch are decoded one
at a time, as in the paper; use ``--batch_size 1`` so that every request's latency is its own.
Greedy unless the task samples; sampling warps both models with the paper's top-k 20 then top-p
0.9 (appendix F) when the task sets neither.

Per request: target forward passes, drafted and accepted tokens, block efficiency (the paper's
Table 5: tokens per draft-and-verify iteration, ``1 + accepted / iterations`` as the authors'
code counts it; the prefill pass is not an iteration), an acceptance histogram, and the output's
perplexity under the target (exp of the mean negative log-likelihood of its tokens), computed
afterwards in a separate pass outside the timed window; a task's perplexity is the mean over its
requests, as the authors average it (the token-weighted one is reported beside it).

``backend=vllm`` runs the same modes inside vLLM's engine, batched (models/mtad/vllm_engine.py: vLLM's speculative
decoding configured per mode and draft, MTAD's rule applied by decodebench's vLLM plugin), and reads the
acceptance statistics from the engine's counters; ``backend=served`` sends MTAD's ``tau`` with every request to a
``vllm serve`` whose ``--speculative-config`` drafts.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, ClassVar

import torch

from decodebench.models.method import ENGINE_SPECULATES, SERVER_DECODES
from decodebench.models.mtad.config import MTADConfig
from decodebench.models.mtad.drafts import Draft, build_drafter, check_draft
from decodebench.models.mtad.modes import MODES
from decodebench.models.rows import RowDecodingMethod, RowStop, Sampler, choose

# Counters of a request that add up over a task.
COUNTERS = ("target_calls", "iterations", "drafted_tokens", "accepted_tokens", "target_nll", "scored_tokens")


def output_nll(model, prompt: torch.Tensor, tokens: list[int]) -> float:
    """The negative log-likelihood (nats, summed) of ``tokens`` after ``prompt`` [n] under ``model``, in one pass:
    the numerator of the output's perplexity under the target."""
    full = torch.cat([prompt, torch.tensor(tokens, device=prompt.device, dtype=prompt.dtype)])[None]
    logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
    return float(torch.nn.functional.cross_entropy(logits, full[0, len(prompt) :], reduction="sum"))


class MTAD(RowDecodingMethod):
    name = "mtad"
    label = "multi-token assisted decoding (Qin et al., Algorithm 1) and its baselines"
    Config = MTADConfig
    config: MTADConfig
    backends = ("hf", "vllm", "served")
    # Appendix F's warping when a sampling task sets no top-k/top-p of its own
    sampling_defaults: ClassVar[dict[str, Any]] = {"top_k": 20, "top_p": 0.9}
    # its claim: faster at the target's own greedy output; extractive answers copy their context, the prompt-lookup
    # draft's case, and are short enough that the main job's comparison can take ten documents
    demo_compared_on = "squad_mini"

    @classmethod
    def check_args(cls, model_args: dict[str, Any]):
        """Also the draft against the target, before anything loads: ``self:<k>`` needs k below the target's layer
        count (read from its config file alone), an infini-gram index or a draft model path must exist."""
        config, backend_class, rest = super().check_args(model_args)
        if SERVER_DECODES in backend_class.capabilities:
            if config.mode not in ("mtad", "block"):
                raise ValueError(
                    f"mode={config.mode}: on a served model the server's --speculative-config decides the drafts and "
                    "vLLM's rule verifies them (measure that with --model baseline); --model mtad sends the rule with "
                    "each request: mode=mtad (MTAD's tau) or mode=block (block verification)"
                )
            return config, backend_class, rest  # the draft is the server's
        if ENGINE_SPECULATES in backend_class.capabilities:
            from decodebench.models.mtad.vllm_engine import check_vllm_config

            check_vllm_config(config)
        elif config.mode not in MODES:
            raise ValueError(f"mode={config.mode} exists on vLLM only (backend=vllm); on transformers: {list(MODES)}")
        if config.mode != "target":
            check_draft(config.draft, rest.get("pretrained"))
        return config, backend_class, rest

    @classmethod
    def demo_model_args(cls) -> dict[str, Any]:
        # the cheapest draft here (prompt lookup): neural beam drafts cost more than they save on a CPU
        # (docs/benchmarks/mtad.md)
        return {"draft": "context"}

    # -- vLLM: the engine speculates; the plugin applies MTAD's rule to the requests that ask --------------------
    def vllm_engine_args(self, args: dict[str, Any], pretrained: str) -> dict[str, Any]:
        from decodebench.models.mtad.vllm_engine import engine_args

        return engine_args(self.config, args, pretrained)

    def vllm_model_runner(self, engine_args: dict[str, Any]):
        from decodebench.models.mtad.vllm_engine import runner_need

        return runner_need(self.config)

    def vllm_sampling_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        from decodebench.models.mtad.vllm_requests import BLOCK_ARG, MTAD_ARG

        asked = {"mtad": {MTAD_ARG: self.config.tau}, "block": {BLOCK_ARG: True}}.get(self.config.mode)
        if asked:
            kwargs["extra_args"] = {**(kwargs.get("extra_args") or {}), **asked}
        return kwargs

    def setup(self, lm) -> None:
        if SERVER_DECODES in lm.capabilities:
            return  # the server drafts and verifies; its plugin refuses what it cannot do, per request
        if ENGINE_SPECULATES in lm.capabilities:
            if self.config.mode in ("mtad", "block"):
                from decodebench.models.mtad.vllm_plugin import plugin_refusal

                # with data parallel lm-eval keeps no engine here (Ray workers hold them): the environment they
                # start with chose the runner
                engine = getattr(getattr(lm, "model", None), "llm_engine", None)
                if refusal := plugin_refusal(engine.vllm_config if engine is not None else None):
                    raise RuntimeError(refusal)
            return
        self.generator = torch.Generator(device=lm.device).manual_seed(self.config.seed)  # on the sampling device
        self.mode = MODES[self.config.mode](self.config)
        self.drafter = build_drafter(self.config.draft, lm, self.config.beam_width) if self.mode.uses_drafter else None

    # -- decoding ---------------------------------------------------------------------------
    def hf_decode(self, lm, input_ids, attention_mask, *, stop, max_new_tokens, kwargs):
        if self.mode.uses_generate:
            return self.mode.generate(
                lm, self.drafter, input_ids, attention_mask, stop=stop, max_new_tokens=max_new_tokens, kwargs=kwargs
            )
        return super().hf_decode(lm, input_ids, attention_mask, stop=stop, max_new_tokens=max_new_tokens, kwargs=kwargs)

    @torch.inference_mode()
    def decode_row(self, lm, prompt: list[int], stop: RowStop, sampler: Sampler | None):
        from transformers import DynamicCache

        gamma = self.config.gamma
        cache = DynamicCache(config=lm.model.config)

        def target(tokens: list[int]) -> torch.Tensor:
            ids = torch.tensor([tokens], device=lm.device)
            return lm.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0].float()

        generated = [choose(target(prompt)[-1], sampler)]
        first_token_at = time.perf_counter()
        calls, drafted, accepted, histogram = 1, 0, 0, Counter()
        while not stop.finished(generated):
            draft = self.mode.draft(self.drafter, prompt + generated, gamma, sampler) if self.drafter else Draft([], [])
            g = len(draft.tokens)
            logits = target([generated[-1], *draft.tokens])  # [g + 1, V]: one verification pass
            calls += 1
            kept, following = self.mode.accept(logits, draft, sampler) if g else (0, choose(logits[0], sampler))
            if g - kept:
                cache.crop(kept - g)
            drafted += g
            accepted += kept
            histogram[kept] += 1
            generated += [*draft.tokens[:kept], following]
        new_tokens = stop.truncate(generated)
        iterations = calls - 1  # draft-and-verify passes; the prefill is not one
        stats = {
            "target_calls": calls,
            "iterations": iterations,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "block_efficiency": 1 + accepted / iterations if iterations else None,
            "acceptance_histogram": {str(k): v for k, v in sorted(histogram.items())},
        }
        return new_tokens, stats, first_token_at

    # -- quality: perplexity under the target, outside the timed window -------------------
    @torch.inference_mode()
    def hf_score(self, lm, input_ids, attention_mask, rows: list[list[int]]) -> list[dict]:
        scores = []
        for row, tokens in enumerate(rows):
            tokens = RowStop(lm, [], len(tokens)).truncate(list(tokens))
            if not tokens:
                scores.append({"target_nll": 0.0, "scored_tokens": 0})
                continue
            nll = output_nll(lm.model, input_ids[row][attention_mask[row].bool()], tokens)
            scores.append(
                {"target_nll": nll, "scored_tokens": len(tokens), "target_perplexity": math.exp(nll / len(tokens))}
            )
        return scores

    # -- results ------------------------------------------------------------------------------
    def summarize(self, records, engine=None) -> dict[str, Any]:
        from decodebench.models.mtad.vllm_engine import spec_decode_statistics

        on_engine = spec_decode_statistics(engine, self.config.gamma)  # vLLM keeps the counts itself
        if on_engine:
            return on_engine
        totals: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        histogram: Counter = Counter()
        for rec in records:
            for key in COUNTERS:
                totals[key] += rec.method_stats.get(key, 0)
            histogram.update(rec.method_stats.get("acceptance_histogram", {}))
        if totals["iterations"]:
            totals["block_efficiency"] = 1 + totals["accepted_tokens"] / totals["iterations"]
        if totals["drafted_tokens"]:
            totals["acceptance_rate"] = totals["accepted_tokens"] / totals["drafted_tokens"]
        perplexities = [
            rec.method_stats["target_perplexity"] for rec in records if "target_perplexity" in rec.method_stats
        ]
        if perplexities:
            totals["target_perplexity"] = sum(perplexities) / len(perplexities)  # per request, then the mean
            totals["target_perplexity_token_weighted"] = math.exp(totals["target_nll"] / totals["scored_tokens"])
        totals["acceptance_histogram"] = dict(sorted(histogram.items(), key=lambda kv: int(kv[0])))
        return totals

    def summary_columns(self, stats: dict[str, Any]) -> dict[str, float | str]:
        names = {
            "block_efficiency": "block efficiency",
            "acceptance_rate": "acceptance",
            "target_perplexity": "perplexity",
        }
        return {label: stats[key] for key, label in names.items() if key in stats}
