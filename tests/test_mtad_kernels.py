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


# -- block verification (Sun et al., ICLR 2025, Algorithm 2) ---------------------------------------------------------
def algorithm_2(big: list[list[float]], small: list[list[float]], draft: list[int], eta: list[float], u: float):
    """Block verification as the paper prints it, one row at a time in plain floats: big = M_b(. | X^i) for
    i = 0..gamma, small = M_s(. | X^i) for i = 0..gamma-1. Y is drawn by inverting the CDF at ``u``."""
    gamma = len(draft)
    p, tau = [1.0], 0
    for i in range(1, gamma + 1):
        p.append(min(p[i - 1] * big[i - 1][draft[i - 1]] / small[i - 1][draft[i - 1]], 1.0))
        if i < gamma:
            residual = sum(max(p[i] * b - s, 0.0) for b, s in zip(big[i], small[i], strict=True))
            h = residual / (residual + 1 - p[i]) if residual + 1 - p[i] > 0 else 1.0
        else:
            h = p[i]
        if eta[i - 1] <= h:
            tau = i
    if tau == gamma:
        distribution = big[gamma]
    else:
        distribution = [max(p[tau] * b - s, 0.0) for b, s in zip(big[tau], small[tau], strict=True)]
        if sum(distribution) == 0:
            distribution = big[tau]
    total, running = sum(distribution), 0.0
    for token, weight in enumerate(distribution):
        running += weight
        if running > u * total:
            return tau, token
    return tau, len(distribution) - 1


def test_block_verification_equals_the_papers_algorithm_on_10000_random_cases():
    """kernels/mtad.py's batched block_verify against a literal transcription of Algorithm 2, row by row (float64),
    drafts of 1-5 tokens from the draft distribution, a draft of another shape now and then (q far from p). A block
    cut by a -1 draft token is verified as the block before the cut, with Y from M_b at the cut."""
    from decodebench.kernels.mtad import block_verify, sample_with_uniforms

    generator = torch.Generator().manual_seed(11)
    vocab, cases, cut_cases = 6, 0, 0
    for batch in range(100):
        rows, gamma = 100, int(torch.randint(1, 6, (1,), generator=generator))
        scale = 4.0 if batch % 3 == 0 else 1.5
        big_logits = torch.randn(rows, gamma + 1, vocab, generator=generator, dtype=torch.float64) * scale
        big = torch.softmax(big_logits, -1)
        small = torch.softmax(torch.randn(rows, gamma, vocab, generator=generator, dtype=torch.float64) * scale, -1)
        draft = torch.multinomial(small.reshape(-1, vocab), 1, generator=generator).view(rows, gamma)
        counts = torch.randint(1, gamma + 1, (rows,), generator=generator)
        cut = torch.where(torch.rand(rows, generator=generator) < 0.2, torch.randint(0, gamma, (rows,)), gamma)
        draft = torch.where(torch.arange(gamma)[None] == cut[:, None], -1, draft)
        eta = torch.rand(rows, gamma, generator=generator, dtype=torch.float64)
        uniforms = torch.rand(rows, generator=generator, dtype=torch.float64)
        after = sample_with_uniforms(big[torch.arange(rows), counts], uniforms)  # Y after a fully kept draft
        kept, following = block_verify(big_logits[:, :gamma], small, draft, counts, eta, uniforms, after)
        for row in range(rows):
            n = int(min(counts[row], cut[row]))  # the block: the draft positions before the cut
            big_row, small_row = big[row, : n + 1].tolist(), small[row, :n].tolist()
            expected = algorithm_2(
                big_row, small_row, draft[row, :n].tolist(), eta[row, :n].tolist(), float(uniforms[row])
            )
            assert (int(kept[row]), int(following[row])) == expected, (batch, row, n)
            cases += 1
            cut_cases += n < counts[row]
    assert cases >= 10_000 and cut_cases > 500


def markov_sampling(rule, rows: int, generator: torch.Generator):
    """Two tokens generated from a small Markov target M_b (the next token's distribution depends on the previous
    token) with drafts of 3 from a Markov M_s, one verification rule per call, as many iterations as it takes:
    [rows, 2] tokens, and the target's joint distribution of the pair."""
    vocab, gamma = 5, 3
    target = torch.softmax(torch.randn(vocab + 1, vocab, generator=generator, dtype=torch.float64) * 1.5, -1)
    draft_model = torch.softmax(torch.randn(vocab + 1, vocab, generator=generator, dtype=torch.float64) * 1.5, -1)
    start = torch.full((rows,), vocab)  # the context: a token outside the vocabulary
    out = torch.full((rows, 2), -1)
    filled = torch.zeros(rows, dtype=torch.long)
    last = start.clone()
    while (filled < 2).any():
        drafts, previous = [], last
        for _ in range(gamma):
            previous = torch.multinomial(draft_model[previous], 1, generator=generator).squeeze(-1)
            drafts.append(previous)
        draft = torch.stack(drafts, -1)
        context = torch.cat([last[:, None], draft], -1)  # the token before each position
        big, small = target[context], draft_model[context[:, :gamma]]
        uniforms = torch.rand(rows, gamma + 1, generator=generator, dtype=torch.float64)
        after = torch.multinomial(big[:, gamma], 1, generator=generator).squeeze(-1)
        kept, following = rule(big, small, draft, uniforms, after)
        emitted = torch.cat([draft, torch.zeros(rows, 1, dtype=torch.long)], -1)
        emitted[torch.arange(rows), kept] = following
        for row in range(rows):
            for token in emitted[row, : int(kept[row]) + 1].tolist():
                if filled[row] < 2:
                    out[row, filled[row]] = token
                    filled[row] += 1
            last[row] = emitted[row, kept[row]]
    joint = target[vocab][:, None] * target[:vocab]
    return out, joint


def total_variation(tokens: torch.Tensor, joint: torch.Tensor) -> float:
    vocab = joint.shape[0]
    counts = torch.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab * vocab).double()
    return float((counts / counts.sum() - joint.reshape(-1)).abs().sum() / 2)


def test_block_verification_is_lossless_and_a_lossy_rule_fails_the_same_check():
    """The paper's guarantee: the tokens come out distributed as the target's. Two tokens from a Markov target over
    40,000 seeded rows: total variation from the target's joint within sampling noise (about 0.02 here); MTAD's rule
    with tau = 0.1, which accepts more than the target allows, is far outside it on the same check."""
    from decodebench.kernels.mtad import block_verify, mtad_verify

    def block(big, small, draft, uniforms, after):
        rows, gamma = draft.shape
        return block_verify(
            big[:, :gamma].log(),
            small,
            draft,
            torch.full((rows,), gamma),
            uniforms[:, :gamma],
            uniforms[:, gamma],
            after,
        )

    def mtad(big, small, draft, uniforms, after):
        rows, gamma = draft.shape
        joint_q = small.gather(-1, draft[..., None]).squeeze(-1).log().cumsum(-1)
        return mtad_verify(big[:, :gamma].log(), draft, joint_q, torch.full((rows,), gamma), 0.1, uniforms[:, 0], after)

    lossless, joint = markov_sampling(block, 40_000, torch.Generator().manual_seed(12))
    lossy, same_joint = markov_sampling(mtad, 40_000, torch.Generator().manual_seed(12))
    assert torch.equal(joint, same_joint)
    assert total_variation(lossless, joint) < 0.035
    assert total_variation(lossy, joint) > 0.07


def test_block_verification_keeps_what_the_papers_example_says():
    """Section 1's example: context-free M_b = (1/3, 2/3), M_s = (2/3, 1/3) over {a, b}, blocks of 2. Token-by-token
    verification keeps 10/9 draft tokens per block in expectation, block verification 11/9."""
    from decodebench.kernels.mtad import block_verify, sample_with_uniforms

    n, generator = 400_000, torch.Generator().manual_seed(13)
    big, small = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    draft = torch.multinomial(small.expand(n, 2), 2, replacement=True, generator=generator)
    eta = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    uniforms = torch.rand(n, generator=generator, dtype=torch.float64)
    after = sample_with_uniforms(big.expand(n, 2), uniforms)
    kept, _ = block_verify(
        big.log().expand(n, 2, 2), small.expand(n, 2, 2), draft, torch.full((n,), 2), eta, uniforms, after
    )
    standard, _ = speculative_accept(draft, small.expand(n, 2, 2), big.expand(n, 3, 2), generator=generator)
    assert abs(kept.double().mean() - 11 / 9) < 0.006
    assert abs(standard.double().mean() - 10 / 9) < 0.006
