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

Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025, Algorithm 2)
also judges the draft block jointly, but losslessly: it keeps the longest prefix a running, capped likelihood ratio
allows, given how much probability the target could still make up after it, and draws the next token from the
matching residual. It is MTAD's natural peer (``block_verify``).

All functions are batched over rows, work in log space where products of probabilities are
involved, and are identical on CPU and CUDA tensors. The ``..._`` variants use their target tensor as scratch
space, so that a caller holding a [B, gamma, V] copy (vLLM's plugin) makes no second one.
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


def mtad_accept_(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_joint_logprobs: torch.Tensor,
    num_drafts: torch.Tensor,
    tau: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1, lines 6-13 on a batch of drafts of varying lengths, using ``target_logits`` as scratch space.

    Args:
        target_logits: [B, gamma, V] the target's (warped) logits or log-probabilities at each draft position;
            overwritten (it holds unnormalized probabilities afterwards): no other [B, gamma, V] tensor is made.
        draft_tokens: [B, gamma] the drafts, padded past ``num_drafts``; a negative token is no token (vLLM marks
            draft positions a grammar refused with -1): no prefix that reaches it is accepted.
        draft_joint_logprobs: [B, gamma] ``log q(x_1..i)`` (0 for a fixed draft: q one-hot).
        num_drafts: [B] how many draft positions each row has (0..gamma).
        tau: the acceptance threshold, or one per row [B].
    Returns:
        (kept [B]: the accepted prefix length, next_probs [B, V]: the target's distribution at position ``kept``,
        unnormalized, from which line 14 draws the token that follows unless every draft token was kept).
    """
    batch, gamma, _ = target_logits.shape
    rows = torch.arange(batch, device=target_logits.device)
    real = (torch.arange(gamma, device=draft_tokens.device)[None] < num_drafts[:, None]) & (draft_tokens >= 0)
    token_logit = target_logits.gather(-1, draft_tokens.clamp(min=0).long().unsqueeze(-1)).squeeze(-1)
    top = target_logits.amax(dim=-1, keepdim=True)
    target_logits.sub_(top).exp_()
    token_logp = (token_logit - top.squeeze(-1)).float() - target_logits.sum(dim=-1).float().log()
    token_logp = torch.where(real, token_logp, torch.full_like(token_logp, float("-inf")))
    kept = mtad_accept_length(token_logp, draft_joint_logprobs.float(), tau)
    return kept, target_logits[rows, kept.clamp(max=gamma - 1)]


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
        target_logprobs: [B, gamma, V] the target's (warped) log-probabilities at each draft position (not changed).
        draft_tokens, draft_joint_logprobs, num_drafts, tau: as ``mtad_accept_``.
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
    kept, next_probs = mtad_accept_(target_logprobs.clone(), draft_tokens, draft_joint_logprobs, num_drafts, tau)
    return kept, following_token(kept, num_drafts, next_probs, uniforms, after_all)


def following_token(kept, num_drafts, next_probs, uniforms, after_all) -> torch.Tensor:
    """[B] the token after the kept prefix: drawn from ``next_probs`` [B, V] (unnormalized) with ``uniforms`` [B]
    where the prefix is short of ``num_drafts``, ``after_all`` [B] where every draft position was kept."""
    drawn = sample_with_uniforms(next_probs, uniforms)
    return torch.where(kept < num_drafts, drawn, after_all.to(drawn.dtype))


def block_verify_(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    eta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025, Algorithm 2)
    on a batch of drafts of varying lengths, using ``target_logits`` as scratch space.

    With ``M_b`` the target and ``M_s`` the draft, ``X^i`` the first i draft tokens, ``p_0 = 1`` and
    ``eta_1..eta_gamma`` uniform, for i = 1..gamma::

        p_i = min(p_{i-1} M_b(x_i | X^{i-1}) / M_s(x_i | X^{i-1}), 1)
        h_i = R_i / (R_i + 1 - p_i),  R_i = sum_x max(p_i M_b(x | X^i) - M_s(x | X^i), 0)    (i < gamma)
        h_gamma = p_gamma
        tau = the largest i with eta_i <= h_i (0 if none)

    then ``X^tau`` is kept and one token Y follows: from ``M_b(. | X^gamma)`` when tau = gamma, else from
    ``max(p_tau M_b(. | X^tau) - M_s(. | X^tau), 0)`` normalized. The output is distributed as the target's
    (lossless), and in expectation keeps at least as many tokens as token-by-token verification. A ``h_i`` whose
    denominator is 0 (``p_i = 1`` and no residual) is 1, a residual of no mass is ``M_b`` itself (both happen only
    where ``M_b = M_s``), and a block cut short by a negative draft token (vLLM's -1: a position a grammar refused)
    ends there: it is verified as the block before it, and Y comes from ``M_b`` at the cut, as vLLM's own block
    verifier does.

    Args:
        target_logits: [B, gamma, V] the target's (warped) logits ``M_b(. | X^j)`` at draft positions j = 0..gamma-1;
            overwritten with its probabilities.
        draft_probs: [B, gamma, V] the draft distributions ``M_s(. | X^j)`` the draft tokens were drawn from, or None
            for a fixed draft (n-gram lookup: ``M_s`` one-hot at the draft token).
        draft_tokens: [B, gamma] padded past ``num_drafts``.
        num_drafts: [B] how many draft positions each row has (0..gamma).
        eta: [B, gamma] uniform numbers in [0, 1).
    Returns:
        (kept [B]: tau, next_probs [B, V]: the distribution Y is drawn from, unnormalized, for rows with
        tau < num_drafts; rows that kept every draft position take Y = ``M_b(. | X^gamma)`` from whoever holds it).
    """
    batch, gamma, _ = target_logits.shape
    device = target_logits.device
    rows = torch.arange(batch, device=device)
    positions = torch.arange(1, gamma + 1, device=device)
    valid = (positions[None] <= num_drafts[:, None]) & (draft_tokens >= 0)
    block = valid.long().cumprod(dim=-1).sum(dim=-1)  # the block ends at the first missing draft token
    tokens = draft_tokens.clamp(min=0).long()
    target = target_logits
    target.sub_(target.amax(dim=-1, keepdim=True)).exp_()
    target.div_(target.sum(dim=-1, keepdim=True))

    def draft_at(position: torch.Tensor) -> torch.Tensor:  # [B, V]: M_s(. | X^j) at each row's position j
        if draft_probs is not None:
            return draft_probs[rows, position].to(target.dtype)
        return torch.zeros_like(target[:, 0]).scatter_(1, tokens[rows, position, None], 1.0)

    target_at_token = target.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    draft_at_token = (
        draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).to(target.dtype)
        if (draft_probs is not None)
        else torch.ones_like(target_at_token)
    )
    ratio_log = torch.where(
        target_at_token > 0, target_at_token.log() - draft_at_token.clamp_min(1e-30).log(), float("-inf")
    )
    log_p, joint = torch.zeros(batch, dtype=target.dtype, device=device), []
    for j in range(gamma):  # p_i is a running minimum: sequential over the (few) positions, batched over rows
        log_p = (log_p + ratio_log[:, j]).clamp(max=0.0)
        joint.append(log_p)
    p = torch.stack(joint, dim=-1).exp() if gamma else torch.zeros(batch, 0, dtype=target.dtype, device=device)
    h = torch.zeros_like(p)
    for j in range(gamma - 1):  # h_i for i = j + 1 < gamma: the residual mass at the next position
        following = torch.full_like(rows, j + 1)
        residual = (p[:, j, None] * target[:, j + 1] - draft_at(following)).clamp_min(0).sum(dim=-1)
        denominator = residual + 1 - p[:, j]
        h[:, j] = torch.where(denominator > 0, residual / denominator.clamp_min(1e-30), torch.ones_like(residual))
    ends = positions[None] == block[:, None]
    h = torch.where(ends, p, h)  # h_gamma = p_gamma, and a block cut short ends the same way
    accepted = (eta.to(h.dtype) <= h) & (positions[None] <= block[:, None])
    kept = torch.where(accepted, positions[None], torch.zeros_like(positions[None])).amax(dim=-1)
    at = kept.clamp(max=max(gamma - 1, 0))
    p_kept = torch.where(kept > 0, p[rows, (kept - 1).clamp(min=0)], torch.ones_like(kept, dtype=p.dtype))
    target_kept = target[rows, at]
    residual = (p_kept[:, None] * target_kept - draft_at(at)).clamp_min(0)
    next_probs = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, target_kept)
    cut = (kept == block)[:, None]  # kept up to a cut: the target itself at the cut
    return kept, torch.where(cut, target_kept, next_probs)


def block_verify(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    eta: torch.Tensor,
    uniforms: torch.Tensor,
    after_all: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (``block_verify_``) and the token that follows: (kept [B], following [B]); ``uniforms``
    [B] draw it, ``after_all`` [B] is the target's token after a fully kept draft. ``target_logits`` is not changed."""
    batch, gamma = draft_tokens.shape
    if gamma == 0:
        return torch.zeros(batch, dtype=torch.long, device=draft_tokens.device), after_all
    kept, next_probs = block_verify_(target_logits.clone(), draft_probs, draft_tokens, num_drafts, eta)
    return kept, following_token(kept, num_drafts, next_probs, uniforms, after_all)


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
