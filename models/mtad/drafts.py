"""Auxiliary (draft) models for MTAD and speculative decoding, behind one small interface.

``draft(sequence, gamma, sampler)`` proposes up to ``gamma`` tokens after ``sequence`` (a list
of token ids: prompt and tokens generated so far) and returns them with their draft
log-probabilities. Each drafter keeps whatever state it can reuse (a KV cache over the longest
prefix it shares with the next sequence), so verification never has to tell it what was accepted.

- ``ModelDrafter``: a causal LM sharing the target's vocabulary. MTAD drafts by beam sampling
  from q warped like p (Appendix F: the task's temperature, top-k, top-p) when the task samples,
  and by deterministic beam search when it decodes greedily, as the authors' code does; speculative
  sampling draws one token at a time (``sample``). ``layer_skip_draft`` builds one from the target
  itself: its first ``k`` decoder layers, final norm and LM head, sharing the target's weights
  (self-speculative drafting, as in the layer-skipping papers of papers/003).
- ``ContextDrafter``: copies what followed an earlier occurrence of the current n-gram in the
  prompt or the output (transformers' prompt-lookup candidate generator); costs no model call.
- ``InfinigramDrafter``: follows the most likely infinity-gram continuation in an infini-gram
  index (the infini-gram paper's proposal of infinity-gram drafts).

The last two are *fixed* drafts, chosen without sampling: their q is one-hot (log q = 0 and
``probs`` None), which is what lets speculative sampling verify them and keep the target's
distribution (a draft token x is kept with probability p(x), else the residual p without x).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from decodebench.kernels.mtad import beam_sample_step, beam_step
from decodebench.models.rows import Sampler


@dataclass
class Draft:
    tokens: list[int]
    joint_logq: list[float]  # log q(x_1..j) for j = 1..len(tokens)
    probs: torch.Tensor | None = None  # [len(tokens), V] distributions sampled from; None: one-hot (fixed)


def _shallow_module_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy whose submodule table can change without touching the original's."""
    new = copy.copy(module)
    new._modules = dict(module._modules)
    new._parameters = dict(module._parameters)
    new._buffers = dict(module._buffers)
    return new


def layer_skip_draft(target: torch.nn.Module, k: int) -> torch.nn.Module:
    """The target's first ``k`` decoder layers + final norm + LM head, sharing its weights."""
    decoder = getattr(target, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"self:<k> drafts need a decoder with a `model.layers` list; {type(target).__name__} has none")
    total = len(layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < total:
        raise ValueError(f"draft=self:{k}: k must be an integer from 1 to {total - 1} (the target has {total} layers)")
    config = copy.copy(target.config)
    config.num_hidden_layers = k
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:k]
    draft_decoder = _shallow_module_copy(decoder)
    draft_decoder.layers = torch.nn.ModuleList(list(layers[:k]))
    draft_decoder.config = config
    draft = _shallow_module_copy(target)
    draft.model = draft_decoder
    draft.config = config
    return draft


def same_vocabulary(target_tokenizer, draft_tokenizer) -> bool:
    return target_tokenizer.get_vocab() == draft_tokenizer.get_vocab()


class ModelDrafter:
    """Drafts with a causal LM and a KV cache kept across calls."""

    def __init__(self, model: torch.nn.Module, beams: int):
        self.model = model
        self.beams = beams
        self.cache = None
        self.cached: list[int] = []  # tokens whose keys and values are in the cache

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
        return self.model(input_ids=tokens, past_key_values=self.cache, use_cache=True).logits[:, -1].float()

    def _sync(self, sequence: list[int]) -> torch.Tensor:
        """Bring the cache to ``sequence`` and return the next-token logits [V]."""
        common = 0
        limit = min(len(self.cached), len(sequence) - 1)  # the last token is always fed
        while common < limit and self.cached[common] == sequence[common]:
            common += 1
        if self.cache is not None and common < len(self.cached):
            self.cache.crop(common - len(self.cached))
        device = next(self.model.parameters()).device
        logits = self._forward(torch.tensor([sequence[common:]], device=device))[0]
        self.cached = list(sequence)
        return logits

    @torch.inference_mode()
    def draft(self, sequence: list[int], gamma: int, sampler: Sampler | None = None, beams: int | None = None) -> Draft:
        """``gamma`` tokens by beam sampling from the warped q (``sampler``), or by deterministic beam
        search without one; ``beams`` wide (default the drafter's). The best beam, with its joint log q
        (the sum of its tokens' log q). One beam without a sampler is plain greedy drafting."""
        beams = beams or self.beams

        def logq(logits: torch.Tensor) -> torch.Tensor:
            return sampler.logprobs(logits) if sampler else torch.log_softmax(logits, dim=-1)

        def step(scores: torch.Tensor, step_logq: torch.Tensor):
            if sampler:
                return beam_sample_step(scores, step_logq, beams, generator=sampler.generator)
            return beam_step(scores, step_logq, beams)

        first = logq(self._sync(sequence))
        device = first.device
        scores, _, tokens = step(torch.zeros(1, device=device), first[None])
        paths = [[int(t)] for t in tokens]
        token_logq = [[float(first[t])] for t in tokens]
        if gamma > 1:
            self.cache.batch_repeat_interleave(len(paths))
        for _ in range(gamma - 1):
            step_logq = logq(self._forward(tokens[:, None]))
            scores, parents, tokens = step(scores, step_logq)
            self.cache.reorder_cache(parents)
            parents_list, tokens_list = parents.tolist(), tokens.tolist()
            paths = [paths[p] + [t] for p, t in zip(parents_list, tokens_list, strict=True)]
            token_logq = [
                token_logq[p] + [float(step_logq[p, t])] for p, t in zip(parents_list, tokens_list, strict=True)
            ]
        if gamma > 1:  # keep the best beam's row: the sequence plus its first gamma - 1 tokens
            self.cache.batch_select_indices(torch.tensor([0], device=device))
            self.cached = list(sequence) + paths[0][:-1]
        joint = torch.tensor(token_logq[0], dtype=torch.float64).cumsum(0).tolist()
        return Draft(paths[0], joint)

    @torch.inference_mode()
    def sample(self, sequence: list[int], gamma: int, sampler: Sampler) -> Draft:
        """Sample ``gamma`` tokens one by one from the warped draft distributions (speculative sampling)."""
        logits = self._sync(sequence)
        tokens, probs, joint = [], [], 0.0
        device = logits.device
        for i in range(gamma):
            logq = sampler.logprobs(logits)
            token = int(torch.multinomial(logq.exp(), 1, generator=sampler.generator))
            tokens.append(token)
            probs.append(logq.exp())
            joint += float(logq[token])
            if i < gamma - 1:
                logits = self._forward(torch.tensor([[token]], device=device))[0]
                self.cached.append(token)
        return Draft(tokens, [joint] * len(tokens), torch.stack(probs))


class ContextDrafter:
    """Prompt lookup: continue an earlier occurrence of the trailing n-gram (q = 1, no model call)."""

    def __init__(self, eos_token_id: int | None, max_ngram: int = 3):
        self.eos = torch.tensor([eos_token_id]) if eos_token_id is not None else None
        self.max_ngram = max_ngram

    def draft(self, sequence: list[int], gamma: int, sampler: Sampler | None = None) -> Draft:
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        lookup = PromptLookupCandidateGenerator(
            eos_token_id=self.eos,
            num_output_tokens=gamma,
            max_matching_ngram_size=self.max_ngram,
            max_length=len(sequence) + gamma + 1,
        )
        candidates, _ = lookup.get_candidates(torch.tensor([sequence]))
        tokens = candidates[0, len(sequence) :].tolist()
        return Draft(tokens, [0.0] * len(tokens))


class InfinigramDrafter:
    """Greedy infinity-gram continuation from an infini-gram index built with the target's tokenizer
    (a fixed draft: q is one-hot)."""

    def __init__(self, index, max_prefix: int = 64):
        self.index = index
        self.max_prefix = max_prefix

    def draft(self, sequence: list[int], gamma: int, sampler: Sampler | None = None) -> Draft:
        tokens = []
        context = list(sequence[-self.max_prefix :])
        for _ in range(gamma):
            result = self.index.engine.infgram_ntd(prompt_ids=context, max_support=50)
            choices = result.get("result_by_token_id") or {}
            if "error" in result or not choices:
                break
            token, info = max(choices.items(), key=lambda item: item[1]["prob"])
            if info["prob"] <= 0:
                break
            tokens.append(int(token))
            context.append(int(token))
        return Draft(tokens, [0.0] * len(tokens))


def check_draft(spec: str, pretrained) -> None:
    """What can be known of ``draft=spec`` before the target loads; raises ValueError naming what is wrong."""
    from pathlib import Path

    if spec.startswith("self:"):
        from transformers import AutoConfig

        from decodebench.data.embedded import resolve_pretrained

        target, _ = resolve_pretrained(pretrained)
        if not isinstance(target, str):
            return
        try:
            layers = AutoConfig.from_pretrained(target).num_hidden_layers
        except (OSError, ValueError, AttributeError):
            return  # the target's own loading says what is wrong with it
        k = int(spec.removeprefix("self:"))
        if not 1 <= k < layers:
            raise ValueError(
                f"draft={spec}: k must be an integer from 1 to {layers - 1} (the target has {layers} layers)"
            )
    elif spec.startswith("infinigram:"):
        location = spec.partition(":")[2]
        if not Path(location).expanduser().is_dir():
            raise ValueError(
                f"draft={spec}: no infini-gram index folder at {location} (`decodebench build-index` makes one)"
            )
    elif spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().exists():
        raise ValueError(
            f"draft={spec}: no such path; a draft is self:<k>, context, infinigram[:<index>], or a model id or path"
        )


def build_drafter(spec: str, lm, beams: int):
    """The drafter that ``draft=spec`` names, for the target model of ``lm``.

    ``self:<k>``: the target's first k layers; ``context``: prompt lookup; ``infinigram[:<index>]``:
    infinity-gram drafts (the reference index by default); anything else: a causal LM hub id or
    path, which must share the target's vocabulary.
    """
    if spec.startswith("self:"):
        return ModelDrafter(layer_skip_draft(lm.model, int(spec.removeprefix("self:"))), beams=beams)
    if spec == "context":
        return ContextDrafter(lm.eot_token_id)
    if spec.startswith("infinigram"):
        from decodebench.data.infinigram_index import Index, ensure_reference_index

        location = spec.partition(":")[2]
        return InfinigramDrafter(
            Index(location or ensure_reference_index(lm.tokenizer, lm.pretrained_name), lm.tokenizer)
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft_tokenizer = AutoTokenizer.from_pretrained(spec)
    if not same_vocabulary(lm.tokenizer, draft_tokenizer):
        raise ValueError(
            f"draft={spec!r} has another vocabulary than the target ({len(draft_tokenizer)} vs "
            f"{len(lm.tokenizer)} tokens, or different ids); MTAD compares token probabilities, so the "
            "draft must share the target's tokenizer"
        )
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=lm.model.dtype).to(lm.device)
    return ModelDrafter(model.eval(), beams=beams)
