"""The decoding modes of ``--model mtad``: one small class per acceptance rule.

Each iteration of the row loop (``MTAD.decode_row``) asks its mode for a draft of up to
``gamma`` tokens and, after one target pass over them, for how many to keep and which token to
add from the target:

- ``MTADAcceptance`` (``mode=mtad``, the paper's Algorithm 1 with Appendix F): beam-sampled drafts
  from q warped like p, and the longest draft prefix whose joint likelihood ratio ``min(1, p/q)``
  exceeds ``tau`` (kernels/mtad.py). Decoding greedily, p is one-hot at the target's argmax, as
  the authors' code makes it at temperature 0 (MTAD is then greedy speculative decoding with beam
  drafts; the authors warn that MTAD gains nothing there);
- ``MTADJointGreedy`` (``mode=mtad-joint-greedy``): decodebench's earlier variant, not the
  paper's: decoding greedily, it compares the untempered p with q instead of a one-hot p;
- ``SpeculativeSampling`` (``mode=speculative``): per-token ``min(1, p/q)`` with residual
  resampling when sampling, or greedy speculative decoding (keep draft tokens while they equal
  the target's argmax) when decoding greedily;
- ``TargetOnly`` (``mode=target``): no draft, one token per target pass (the reference for speed-ups);
- ``AssistedGeneration`` (``mode=assisted``): transformers' own assisted generation decodes the
  whole row (``model.generate(assistant_model=...)``, or prompt lookup for ``draft=context``).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from decodebench.kernels.mtad import mtad_accept_length, mtad_verify, sample_with_uniforms, speculative_accept
from decodebench.models.method import DecodeOutput
from decodebench.models.mtad.config import MTADConfig
from decodebench.models.mtad.drafts import Draft, ModelDrafter
from decodebench.models.rows import Sampler, choose


class Mode:
    name: ClassVar[str]
    uses_drafter: ClassVar[bool] = True
    # True when transformers' generate decodes the batch instead of decodebench's row loop
    uses_generate: ClassVar[bool] = False

    def __init__(self, config: MTADConfig):
        self.config = config

    def draft(self, drafter, sequence: list[int], gamma: int, sampler: Sampler | None) -> Draft:
        return drafter.draft(sequence, gamma, sampler)

    def accept(self, logits: torch.Tensor, draft: Draft, sampler: Sampler | None) -> tuple[int, int]:
        """(draft tokens kept, the token that follows them) from the target's logits [g + 1, V]."""
        raise NotImplementedError


class TargetOnly(Mode):
    name = "target"
    uses_drafter = False

    def accept(self, logits, draft, sampler):
        return 0, choose(logits[0], sampler)


class MTADAcceptance(Mode):
    """Algorithm 1, lines 6-14: the longest prefix whose joint ratio passes ``tau``, then one token from the
    target (kernels/mtad.py's ``mtad_verify``, which the vLLM plugin runs too)."""

    name = "mtad"

    def accept(self, logits, draft, sampler):
        g = len(draft.tokens)
        # decoding greedily, p is one-hot at the target's argmax (the authors' code)
        logp = sampler.logprobs(logits) if sampler is not None else one_hot_logprobs(logits)
        device = logits.device
        if sampler is None:  # one-hot p: any uniform draws the argmax
            uniforms = torch.zeros(2, device=device)
        else:
            uniforms = torch.rand(2, generator=sampler.generator, device=device)
        after_all = sample_with_uniforms(logp[g:].exp(), uniforms[1:])
        kept, following = mtad_verify(
            logp[None, :g],
            torch.tensor([draft.tokens], device=device, dtype=torch.long).reshape(1, g),
            torch.tensor([draft.joint_logq], device=device, dtype=logp.dtype).reshape(1, g),
            torch.tensor([g], device=device),
            self.config.tau,
            uniforms[:1],
            after_all,
        )
        return int(kept[0]), int(following[0])


class MTADJointGreedy(MTADAcceptance):
    """decodebench's earlier greedy rule (not the paper's): the untempered p against q, then the argmax."""

    name = "mtad-joint-greedy"

    def accept(self, logits, draft, sampler):
        if sampler is not None:
            return super().accept(logits, draft, sampler)
        g = len(draft.tokens)
        logp = torch.log_softmax(logits, dim=-1)
        token_logp = logp[torch.arange(g, device=logits.device), torch.tensor(draft.tokens, device=logits.device)]
        joint_logq = torch.tensor(draft.joint_logq, device=logits.device, dtype=token_logp.dtype)
        kept = int(mtad_accept_length(token_logp[None], joint_logq[None], self.config.tau)[0])
        return kept, choose(logits[kept], None)


def one_hot_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log of the one-hot distribution at each row's argmax: 0 there, -inf elsewhere."""
    out = torch.full_like(logits, float("-inf"))
    return out.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)


class SpeculativeSampling(Mode):
    """Speculative sampling (Leviathan et al.), or greedy speculative decoding without sampling."""

    name = "speculative"

    def draft(self, drafter, sequence, gamma, sampler):
        if not isinstance(drafter, ModelDrafter):
            return drafter.draft(sequence, gamma)
        if sampler is None:  # greedy speculative decoding drafts greedily
            return drafter.draft(sequence, gamma, beams=1)
        return drafter.sample(sequence, gamma, sampler)

    def accept(self, logits, draft, sampler):
        g = len(draft.tokens)
        tokens = torch.tensor(draft.tokens, device=logits.device)
        if sampler is None:
            kept = int((tokens == logits[:g].argmax(-1)).int().cumprod(0).sum())
            return kept, int(logits[kept].argmax())
        target_probs = sampler.logprobs(logits).exp()[None]
        draft_probs = draft.probs
        if draft_probs is None:  # a fixed draft (prompt lookup, infini-gram) was chosen, not sampled: q is one-hot
            draft_probs = torch.nn.functional.one_hot(tokens, logits.shape[-1]).to(target_probs.dtype)
        n, following = speculative_accept(
            tokens[None], draft_probs[None].to(logits.device), target_probs, generator=sampler.generator
        )
        return int(n[0]), int(following[0])


class AssistedGeneration(Mode):
    """transformers' assisted generation (a draft model) or prompt lookup (``draft=context``)."""

    name = "assisted"
    uses_generate = True

    def generate(self, lm, drafter, input_ids, attention_mask, *, stop, max_new_tokens, kwargs):
        gamma = self.config.gamma
        if isinstance(drafter, ModelDrafter):
            extra = {"assistant_model": drafter.model, "num_assistant_tokens": gamma}
        else:
            extra = {"prompt_lookup_num_tokens": gamma}
        rows, first = [], None
        for row in range(input_ids.shape[0]):
            mask = attention_mask[row].bool()
            out = lm.generate_batch(
                input_ids[row : row + 1, mask],
                attention_mask[row : row + 1, mask],
                stop=stop,
                max_new_tokens=max_new_tokens,
                kwargs={**kwargs, **extra},
            )
            rows.append(out.tokens[0].tolist())
            first = first or out.first_token_at
        return DecodeOutput(tokens=rows, first_token_at=first, row_stats=[{} for _ in rows])


# mode= -> class, on transformers (MTADConfig's choices but block, which is vLLM's: models/mtad/vllm_engine.py)
MODES = {
    cls.name: cls for cls in (MTADAcceptance, MTADJointGreedy, SpeculativeSampling, TargetOnly, AssistedGeneration)
}
