"""Verification kernels of multi-token assisted decoding and of speculative sampling.

MTAD (Qin et al., "Optimized multi-token joint decoding with auxiliary model", section 3.2 and
Algorithm 1) verifies a *joint* likelihood: the auxiliary model drafts ``x_1..x_gamma`` by beam
sampling (section 2.2; deterministic beam search when decoding greedily), the target scores every
draft prefix in one forward pass, and the longest prefix ``j`` with
``min(1, p(x_1..j) / q(x_1..j)) > tau`` is accepted (not per token, and not stopping at the first
prefix that fails: Algorithm 1, lines 6-13). One more token then comes from the target.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) accepts draft token ``i`` with
probability ``min(1, p_i / q_i)`` until the first rejection, then samples from
``norm(max(0, p - q))``; with every draft token accepted, a bonus token comes from ``p``. Its
output follows the target distribution exactly, which tests/test_mtad_kernels.py checks.

All functions are batched over rows, work in log space where products of probabilities are
involved, and are identical on CPU and CUDA tensors.
"""

from __future__ import annotations

import math

import torch


def mtad_accept_length(
    target_logprobs: torch.Tensor, draft_joint_logprobs: torch.Tensor, tau: float | torch.Tensor
) -> torch.Tensor:
    """Algorithm 1, lines 6-13: the longest accepted draft prefix of each row.

    Args:
        target_logprobs: [B, gamma] ``log p(x_i | x_<i)`` of each draft token under the target.
        draft_joint_logprobs: [B, gamma] ``log q(x_1..i)``, the draft's joint log-likelihood of
            each prefix (the beam score along the best beam).
        tau: acceptance threshold in [0, 1), or one per row [B].

    Returns:
        [B] the largest ``j`` (0..gamma) with ``log p(x_1..j) - log q(x_1..j) > log tau``; 0 when
        no prefix passes. ``min(1, r) > tau`` equals ``r > tau`` because ``tau < 1``.
    """
    joint_p = torch.cumsum(target_logprobs, dim=-1)
    if isinstance(tau, torch.Tensor):
        log_tau = torch.log(tau.to(joint_p.dtype)).reshape(-1, 1)  # log 0 = -inf: every prefix passes
    else:
        log_tau = math.log(tau) if tau > 0 else float("-inf")
    passes = (joint_p - draft_joint_logprobs) > log_tau
    lengths = torch.arange(1, passes.shape[-1] + 1, device=passes.device)
    return torch.where(passes, lengths, torch.zeros_like(lengths)).amax(dim=-1)


def sample_with_uniforms(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B] tokens drawn from the distributions ``probs`` [B, V] by inverting their CDF at ``uniforms`` [B] in
    [0, 1): the same uniforms give the same tokens, wherever the distributions are computed."""
    cumulative = probs.float().cumsum(dim=-1)
    threshold = (uniforms.float() * cumulative[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def mtad_verify(
    target_logprobs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_joint_logprobs: torch.Tensor,
    num_drafts: torch.Tensor,
    tau: float | torch.Tensor,
    uniforms: torch.Tensor,
    after_all: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MTAD verification of a batch of drafts of varying lengths: Algorithm 1, lines 6-14.

    Args:
        target_logprobs: [B, gamma, V] the target's (warped) log-probabilities at each draft position.
        draft_tokens: [B, gamma] the drafts, padded past ``num_drafts``.
        draft_joint_logprobs: [B, gamma] ``log q(x_1..i)`` (0 for a fixed draft: q one-hot).
        num_drafts: [B] how many draft tokens each row has (0..gamma).
        tau: the acceptance threshold, or one per row [B].
        uniforms: [B] uniform numbers in [0, 1) that sample the token after an accepted prefix that is short.
        after_all: [B] the token that follows when every draft token is accepted (sampled from the target at the
            position after the last one, by whoever holds it).
    Returns:
        (kept [B]: the accepted prefix length, following [B]: the one token the target adds after it, from
        ``p`` at position ``kept``; Algorithm 1 line 14).
    """
    batch, gamma = draft_tokens.shape
    if gamma == 0:
        return torch.zeros(batch, dtype=torch.long, device=draft_tokens.device), after_all
    token_logp = target_logprobs.gather(-1, draft_tokens.unsqueeze(-1).long()).squeeze(-1).float()
    real = torch.arange(gamma, device=draft_tokens.device)[None] < num_drafts[:, None]
    token_logp = torch.where(real, token_logp, torch.full_like(token_logp, float("-inf")))
    kept = mtad_accept_length(token_logp, draft_joint_logprobs.float(), tau)
    rows = torch.arange(batch, device=draft_tokens.device)
    at = kept.clamp(max=gamma - 1)
    drawn = sample_with_uniforms(target_logprobs[rows, at].float().exp(), uniforms)
    following = torch.where(kept < num_drafts, drawn, after_all.to(drawn.dtype))
    return kept, following


def beam_step(beam_scores: torch.Tensor, logprobs: torch.Tensor, width: int):
    """One step of beam search: the ``width`` best (beam, token) extensions by joint log-likelihood.

    Args:
        beam_scores: [W] joint log-likelihood of each live beam.
        logprobs: [W, V] next-token log-probabilities of each beam.
    Returns:
        (scores [w], parent beam [w], token [w]) of the new beams, best first (w <= width).
    """
    joint = (beam_scores[:, None] + logprobs).reshape(-1)
    width = min(width, int(torch.isfinite(joint).sum().item()) or 1)
    scores, flat = torch.topk(joint, width)
    vocab = logprobs.shape[-1]
    return scores, torch.div(flat, vocab, rounding_mode="floor"), flat % vocab


def beam_sample_step(beam_scores: torch.Tensor, logprobs: torch.Tensor, width: int, generator=None):
    """One step of beam *sampling* (section 2.2): ``width`` (beam, token) extensions drawn without
    replacement from ``p_beam(x_1..t) ∝ p(x_1..t-1) p(x_t | x_1..t-1)``, the joint over all beams.

    Args:
        beam_scores: [W] joint log-likelihood of each live beam.
        logprobs: [W, V] (warped) next-token log-probabilities of each beam.
    Returns:
        (scores [w], parent beam [w], token [w]) of the drawn beams, highest joint first
        (w = ``width``, or fewer when fewer extensions have a non-zero probability).
    """
    joint = (beam_scores[:, None] + logprobs).reshape(-1)
    finite = torch.isfinite(joint)
    width = min(width, int(finite.sum().item()) or 1)
    weights = torch.where(finite, (joint - joint[finite].max()).exp(), torch.zeros_like(joint))
    drawn = torch.multinomial(weights, width, replacement=False, generator=generator)
    scores, order = joint[drawn].sort(descending=True)
    flat = drawn[order]
    vocab = logprobs.shape[-1]
    return scores, torch.div(flat, vocab, rounding_mode="floor"), flat % vocab


def speculative_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling's acceptance rule for a batch of drafts.

    Args:
        draft_tokens: [B, gamma] tokens sampled from the draft distributions.
        draft_probs: [B, gamma, V] the draft distributions ``q_i`` they were sampled from.
        target_probs: [B, gamma + 1, V] the target distributions ``p_i`` at the same positions,
            plus the one after the last draft token.
    Returns:
        (accepted [B]: number of leading draft tokens kept, next_token [B]: the token sampled
        after them, from ``norm(max(0, p - q))`` at a rejection or from ``p`` after a full accept).
    """
    batch, gamma = draft_tokens.shape
    index = draft_tokens.unsqueeze(-1)
    p = target_probs[:, :gamma].gather(-1, index).squeeze(-1)
    q = draft_probs.gather(-1, index).squeeze(-1)
    uniform = torch.rand((batch, gamma), generator=generator, device=draft_tokens.device)
    rejected = uniform >= torch.clamp(p / q.clamp_min(1e-20), max=1.0)
    first_reject = rejected.int().argmax(-1)  # argmax returns the first maximal index
    accepted = torch.where(rejected.any(-1), first_reject, torch.full_like(first_reject, gamma)).to(torch.long)
    rows = torch.arange(batch, device=draft_tokens.device)
    at = accepted.clamp(max=gamma - 1)
    residual = (target_probs[rows, at] - draft_probs[rows, at]).clamp_min(0)
    residual_mass = residual.sum(-1, keepdim=True)
    # a zero residual can only happen when p == q there; then sampling p is the same thing
    residual = torch.where(residual_mass > 0, residual / residual_mass.clamp_min(1e-20), target_probs[rows, at])
    next_dist = torch.where((accepted == gamma)[:, None], target_probs[:, gamma], residual)
    next_token = torch.multinomial(next_dist, 1, generator=generator).squeeze(-1)
    return accepted, next_token
