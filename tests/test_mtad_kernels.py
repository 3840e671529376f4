"""MTAD verification and speculative sampling kernels, against the paper and known semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from decodebench.kernels.mtad import beam_step, mtad_accept_length, speculative_accept
from decodebench.models.rows import Sampler


def logs(*values):
    return torch.log(torch.tensor(values, dtype=torch.float64))


def test_accept_length_uses_the_joint_ratio_and_the_longest_passing_prefix():
    # p per token 0.5, 0.5, 0.9; q joint 0.5, 0.2, 0.2 -> ratios 1.0, 1.25, 1.125: all pass
    target = logs(0.5, 0.5, 0.9)[None]
    joint_q = logs(0.5, 0.2, 0.2)[None]
    assert mtad_accept_length(target, joint_q, 0.1).tolist() == [3]
    # prefix ratios 0.9/0.9 = 1, 0.045/0.81 = 0.056 (fails at tau 0.1), 0.0405/0.081 = 0.5 (passes):
    # Algorithm 1 keeps the longest passing prefix, even past one that fails
    target = logs(0.9, 0.05, 0.9)[None]
    joint_q = logs(0.9, 0.81, 0.081)[None]
    assert mtad_accept_length(target, joint_q, 0.1).tolist() == [3]
    assert mtad_accept_length(target, joint_q, 0.6).tolist() == [1]
    assert mtad_accept_length(logs(0.01, 0.01)[None], logs(0.9, 0.8)[None], 0.1).tolist() == [0]
    assert mtad_accept_length(logs(0.01, 0.01)[None], logs(0.9, 0.8)[None], 0.0).tolist() == [2]


def test_accept_length_is_batched():
    target = torch.stack([logs(0.5, 0.5), logs(0.01, 0.5), logs(0.9, 0.9)])
    joint_q = torch.stack([logs(0.5, 0.25), logs(0.9, 0.5), logs(0.5, 0.25)])
    assert mtad_accept_length(target, joint_q, 0.1).tolist() == [2, 0, 2]


def test_beam_step_matches_brute_force():
    torch.manual_seed(0)
    scores = torch.tensor([-0.5, -1.0, -2.0])
    logprobs = torch.log_softmax(torch.randn(3, 7), dim=-1)
    new_scores, parents, tokens = beam_step(scores, logprobs, 4)
    brute = sorted(((float(scores[b] + logprobs[b, t]), b, t) for b in range(3) for t in range(7)), reverse=True)[:4]
    assert [(b, t) for _, b, t in brute] == list(zip(parents.tolist(), tokens.tolist(), strict=True))
    assert new_scores.tolist() == pytest.approx([s for s, _, _ in brute])


def test_sampler_warps_by_temperature_then_top_k_then_top_p():
    torch.manual_seed(0)
    logits = torch.randn(6, 300) * 3
    warped = Sampler(temperature=0.7, top_k=20, top_p=0.9).logprobs(logits)
    for row in range(6):
        probs = torch.softmax(logits[row] / 0.7, dim=-1)
        top = torch.topk(probs, 20)
        renormalized = top.values / top.values.sum()
        # the nucleus: the fewest of the top-20 tokens whose mass reaches 0.9
        keep = int((renormalized.cumsum(0) < 0.9).sum()) + 1
        expected = set(top.indices[:keep].tolist())
        assert set(torch.nonzero(torch.isfinite(warped[row])).flatten().tolist()) == expected
        kept = top.indices[:keep]
        assert torch.allclose(warped[row, kept].exp(), renormalized[:keep] / renormalized[:keep].sum(), atol=1e-6)


def expected(probs: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
    probs = probs.double()
    return probs / probs.sum() * observed.sum()


def test_speculative_sampling_preserves_the_target_distribution():
    """Leviathan et al.: every emitted token follows p; checked with chi-square tests."""
    generator = torch.Generator().manual_seed(0)
    n, vocab, gamma = 60_000, 5, 2
    p1 = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05])
    q1 = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])  # a poor draft
    p2_given = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 2, dim=-1)  # p(x2 | x1)
    q2_given = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 2, dim=-1)
    p3_given = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 2, dim=-1)
    x1 = torch.multinomial(q1, n, replacement=True, generator=generator)
    x2 = torch.multinomial(q2_given[x1], 1, generator=generator).squeeze(-1)
    draft = torch.stack([x1, x2], dim=1)
    draft_probs = torch.stack([q1.expand(n, vocab), q2_given[x1]], dim=1)
    target_probs = torch.stack([p1.expand(n, vocab), p2_given[x1], p3_given[x2]], dim=1)
    accepted, nxt = speculative_accept(draft, draft_probs, target_probs, generator=generator)
    emitted = torch.cat([draft, nxt[:, None]], dim=1)
    first = torch.where(accepted >= 1, x1, nxt)
    counts = torch.bincount(first, minlength=vocab).double()
    assert chisquare(counts, expected(p1, counts)).pvalue > 1e-3
    # the second emitted token, given the first, follows p(x2 | x1) (only rows that emit two tokens from x1)
    second = torch.where(accepted >= 2, x2, nxt)
    for a in range(vocab):
        rows = (accepted >= 1) & (x1 == a)
        observed = torch.bincount(second[rows], minlength=vocab).double()
        assert chisquare(observed, expected(p2_given[a], observed)).pvalue > 1e-3
    assert 0 < accepted.float().mean() < gamma  # some accepted, some rejected
    assert emitted.shape == (n, 3)


def test_identical_draft_and_target_accept_everything():
    probs = torch.softmax(torch.randn(4, 3, 10), dim=-1)
    draft = torch.multinomial(probs[:, :2].reshape(-1, 10), 1).reshape(4, 2)
    accepted, _ = speculative_accept(draft, probs[:, :2], probs)
    assert accepted.tolist() == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"gamma": 0}, "gamma=0: must be >= 1"),
        ({"beams": -1.0}, r"beams=-1: must be >= 1"),
        ({"tau": 1.0}, r"tau=1.0: must be in \[0, 1\)"),
        ({"tau": -0.1}, r"tau=-0.1: must be in \[0, 1\)"),
        ({"tau": float("nan")}, "must be a finite number"),
        ({"gamma": 2.5}, "gamma must be an integer"),
        ({"seed": -1.0}, "seed=-1: must be >= 0"),
        ({"draft": "self:x"}, "self:<k> with an integer"),
        ({"mode": "assisted", "draft": "infinigram"}, "has no infini-gram draft"),
    ],
)
def test_bad_mtad_arguments(args, message):
    from decodebench.models.mtad import MTADConfig

    with pytest.raises(ValueError, match=message):
        MTADConfig.parse(args)


def test_every_mode_name_has_its_class():
    from decodebench.models.mtad.config import MODES
    from decodebench.models.mtad.modes import MODES as CLASSES
    from decodebench.models.mtad.vllm_engine import VLLM_MODES

    # every mode runs somewhere: a class on transformers, or vLLM's engine (block is vLLM's own verification)
    assert set(MODES) == set(CLASSES) | set(VLLM_MODES)
    assert all(CLASSES[name].name == name for name in CLASSES)


def test_log_space_avoids_underflow():
    target = torch.full((1, 4), math.log(1e-90), dtype=torch.float64)
    joint_q = torch.cumsum(torch.full((1, 4), math.log(1e-90), dtype=torch.float64), dim=-1)
    assert mtad_accept_length(target, joint_q, 0.5).tolist() == [4]  # ratios are 1 even though p, q ~ 1e-360


def warp_by_hand(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> list[float]:
    """Appendix F's warping written out: temperature, keep the top-k, then the smallest set whose mass
    reaches top_p; probabilities of one row, as plain floats."""
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:top_k]
    mass = sum(probs[i] for i in order)
    kept, running = [], 0.0
    for i in order:
        kept.append(i)
        running += probs[i] / mass
        if running >= top_p:
            break
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


def algorithm_1(target_probs: list[list[float]], draft: list[int], draft_joint_q: list[float], tau: float) -> int:
    """Algorithm 1, lines 6-13, as printed: the longest prefix with tau < min(1, p/q)."""
    p, eta = 1.0, 0
    for i, token in enumerate(draft):
        p *= target_probs[i][token]
        if tau < min(1.0, p / draft_joint_q[i]):
            eta = i + 1
    return eta


@pytest.mark.parametrize("greedy", [False, True])
def test_mtad_accepts_the_prefixes_of_a_plain_algorithm_1_loop_with_warped_p_and_q(greedy):
    """p warped like q under sampling (top-k 20, top-p 0.9), one-hot p when decoding greedily."""
    from decodebench.models.mtad.config import MTADConfig
    from decodebench.models.mtad.drafts import Draft
    from decodebench.models.mtad.modes import MTADAcceptance

    generator = torch.Generator().manual_seed(1)
    sampler = None if greedy else Sampler(temperature=1.0, top_k=20, top_p=0.9, generator=generator)
    mode = MTADAcceptance(MTADConfig(tau=0.1))
    agree = 0
    for _ in range(400):
        logits = torch.randn(5, 60, generator=generator) * 3
        target = []
        for row in logits:
            if greedy:
                target.append([float(i == int(row.argmax())) for i in range(60)])
            else:
                target.append(warp_by_hand(row, 1.0, 20, 0.9))
        # a draft that partly follows the target, with a warped draft model's joint q
        draft = [
            max(range(60), key=lambda i: target[i_][i])
            if torch.rand(1, generator=generator) < 0.7
            else int(torch.randint(60, (1,), generator=generator))
            for i_ in range(4)
        ]
        q_tokens = torch.rand(4, generator=generator).clamp(min=0.05).tolist()
        joint_q = list(np.cumprod(q_tokens))
        kept, _ = mode.accept(logits, Draft(draft, [math.log(q) for q in joint_q]), sampler)
        agree += kept == algorithm_1(target, draft, joint_q, 0.1)
    assert agree == 400


def test_speculative_sampling_with_a_fixed_draft_keeps_the_target_distribution():
    """A prompt-lookup or infini-gram draft is chosen, not sampled: its q is one-hot, and every
    emitted token still follows the (warped) target distribution."""
    from decodebench.models.mtad.config import MTADConfig
    from decodebench.models.mtad.drafts import Draft
    from decodebench.models.mtad.modes import SpeculativeSampling

    generator = torch.Generator().manual_seed(2)
    sampler = Sampler(temperature=1.0, top_k=4, top_p=1.0, generator=generator)
    mode = SpeculativeSampling(MTADConfig(mode="speculative"))
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0], [0.0, 1.0, 2.0, 0.5, 0.1, 0.0]])
    first, accepted = [], 0
    for _ in range(4000):
        kept, following = mode.accept(logits, Draft([1], [0.0]), sampler)  # the fixed draft proposes token 1
        first.append(1 if kept else following)
        accepted += kept
    counts = torch.bincount(torch.tensor(first), minlength=6).double()
    p = sampler.logprobs(logits[0]).exp()
    assert counts[4:].sum() == 0  # outside the top-4: never emitted
    assert chisquare(counts[:4], expected(p[:4], counts[:4])).pvalue > 1e-3
    assert abs(accepted / 4000 - float(p[1])) < 0.03  # the draft token is kept with probability p(1)


def test_beam_sampling_draws_from_the_joint_and_returns_the_best_drawn_beam_first():
    from decodebench.kernels.mtad import beam_sample_step

    generator = torch.Generator().manual_seed(3)
    logq = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]))
    draws = torch.stack([beam_sample_step(torch.zeros(1), logq, 1, generator)[2] for _ in range(5000)]).flatten()
    counts = torch.bincount(draws, minlength=4).double()
    assert counts[3] == 0 and chisquare(counts[:3], expected(logq.exp()[0, :3], counts[:3])).pvalue > 1e-3
    scores, parents, tokens = beam_sample_step(
        torch.tensor([-0.1, -2.0]), torch.log_softmax(torch.randn(2, 9), -1), 4, generator
    )
    assert len(set(zip(parents.tolist(), tokens.tolist(), strict=True))) == 4  # without replacement
    assert torch.equal(scores, scores.sort(descending=True).values)
    one, _, _ = beam_sample_step(torch.zeros(1), logq, 8, generator)
    assert len(one) == 3  # only 3 extensions have a non-zero probability
