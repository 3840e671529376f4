"""MTAD and block verification inside vLLM's V1 engine (run with `tox -e vllm`): the plugin's rows against the kernels
(kernels/mtad.py), vLLM's own rule untouched for every other row, what the plugin must never do on a GPU (read device
values on the host, warp in half precision, index with a grammar's -1), refusals on vLLM's V2 runner, and lm_eval on
the engine."""

from __future__ import annotations

import functools
import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import VLLM_TASKS, read_results, read_samples
from host_syncs import HostSyncs

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

V = 12  # a small vocabulary: distributions that random cases can tell apart


@pytest.fixture(scope="module")
def sampler():
    """vLLM's rejection_sample with decodebench's rules installed (as vLLM's general plugins do), and the original."""
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample import rejection_sampler

    current_platform.register_triton_kernel_overrides()  # as vLLM's worker does: the CPU build's kernels
    load_general_plugins()  # as every vLLM process does: decodebench's rules and its CPU fix
    assert getattr(rejection_sampler.rejection_sample, "_decodebench_verification", False)
    return rejection_sampler.rejection_sample, rejection_sampler.rejection_sample.__wrapped__


@pytest.fixture
def drawn(monkeypatch):
    """Every set of uniform numbers a rule drew, as (batch rows, numbers): what the kernels are given to compare."""
    from decodebench.models.mtad import vllm_v1_rules

    record = []
    real = vllm_v1_rules.uniforms

    def spy(rows, generators, count, device):
        numbers = real(rows, generators, count, device)
        record.append((rows.tolist(), numbers.clone()))
        return numbers

    monkeypatch.setattr(vllm_v1_rules, "uniforms", spy)
    return record


def uniforms_of(record, row: int) -> torch.Tensor:
    for rows, numbers in record:
        if row in rows:
            return numbers[rows.index(row)]
    raise AssertionError(f"no uniforms were drawn for row {row}")


def tracker(requests: dict, vllm_config=None):
    """The V1 runner's tracker, built through the entry point as vLLM builds it, after a batch update that adds
    ``requests`` ({row: extra_args or None, or a SamplingParams})."""
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor import BatchUpdate

    from decodebench.models.mtad.vllm_plugin import VerificationRequests

    built = VerificationRequests(vllm_config or VllmConfig(), torch.device("cpu"), False)
    added = [
        (row, extra if isinstance(extra, SamplingParams) else SamplingParams(temperature=1.0, extra_args=extra), [], [])
        for row, extra in requests.items()
    ]
    built.update_state(BatchUpdate(max(requests, default=-1) + 1, [], added, []))
    return built


def metadata(temperatures: list[float], seeds: dict[int, int], rules: dict | None = None, config=None, **extra):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperatures)
    processors = [tracker(rules, config)] if rules else []
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32),
        all_greedy=all(t == 0 for t in temperatures),
        all_random=all(t > 0 for t in temperatures),
        top_p=extra.get("top_p"),
        top_k=extra.get("top_k"),
        generators={row: torch.Generator().manual_seed(seed) for row, seed in seeds.items()},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(processors),
    )


def random_batch(rng: torch.Generator, batch: int, max_spec: int, with_draft_probs: bool, first: int | None = None):
    """A batch of drafts in vLLM's flattened layout; ``first``: the first row's draft count (else random)."""
    counts = torch.randint(0, max_spec + 1, (batch,), generator=rng).tolist()
    if first is not None:
        counts[0] = first
    total = sum(counts)
    target_logits = torch.randn(total, V, generator=rng) * 2
    draft_probs = torch.softmax(torch.randn(total, V, generator=rng) * 2, -1) if with_draft_probs else None
    if draft_probs is not None and total:
        drafts = torch.multinomial(draft_probs, 1, generator=rng).squeeze(-1)
    else:
        drafts = torch.randint(0, V, (total,), generator=rng)
    bonus = torch.randint(0, V, (batch, 1), generator=rng)
    return counts, drafts, draft_probs, target_logits, bonus


def call(function, counts, drafts, draft_probs, target_logits, bonus, meta, max_spec):
    cumulative = torch.tensor(counts).cumsum(0) if counts else torch.zeros(0, dtype=torch.long)
    return function(drafts.contiguous(), counts, max_spec, cumulative, draft_probs, target_logits.clone(), bonus, meta)


def expected_mtad(row, counts, drafts, draft_probs, target_logits, bonus, tau, numbers, max_spec):
    """kernels/mtad.py's mtad_verify on one row alone, in vLLM's output format."""
    from decodebench.kernels.mtad import mtad_verify

    start, g = sum(counts[:row]), counts[row]
    row_drafts = drafts[start : start + g]
    logp = torch.log_softmax(target_logits[start : start + g].float(), -1)
    if draft_probs is None:
        joint_logq = torch.zeros(g)
    else:
        joint_logq = draft_probs[start : start + g].gather(-1, row_drafts.clamp(min=0)[:, None]).squeeze(-1)
        joint_logq = joint_logq.clamp_min(1e-30).log().cumsum(0)
    kept, following = mtad_verify(
        logp[None], row_drafts[None], joint_logq[None], torch.tensor([g]), torch.tensor([tau]), numbers[:1], bonus[row]
    )
    out = [*row_drafts[: int(kept)].tolist(), int(following)]
    return out + [-1] * (max_spec + 1 - len(out))


def expected_block(row, counts, drafts, draft_probs, target_logits, bonus, numbers, max_spec):
    """kernels/mtad.py's block_verify on one row alone, in vLLM's output format."""
    from decodebench.kernels.mtad import block_verify

    start, g = sum(counts[:row]), counts[row]
    q = draft_probs[start : start + g][None] if draft_probs is not None else None
    kept, following = block_verify(
        target_logits[start : start + g][None].float(),
        q,
        drafts[start : start + g][None],
        torch.tensor([g]),
        numbers[None, :g],  # one per draft position, then (last) the one that draws the token that follows
        numbers[-1:],
        bonus[row],
    )
    out = [*drafts[start : start + int(kept)].tolist(), int(following)]
    return out + [-1] * (max_spec + 1 - len(out))


def test_mtad_rows_keep_and_emit_what_the_kernel_does_on_10000_random_cases(sampler, drawn):
    """Each MTAD row of vLLM's flattened batch, verified by the wrapper, against mtad_verify on that row alone."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(0)
    cases = 0
    for round_ in range(206):  # rounds 0, 50, ..., 200: a batch in which nothing was drafted
        batch, max_spec = (50, int(torch.randint(1, 6, (1,), generator=rng))) if round_ % 50 else (3, 1)
        if round_ % 50 == 0:
            counts = [0] * batch
            _, drafts, draft_probs, target_logits, bonus = random_batch(rng, batch, 0, True)
        else:
            counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, batch, max_spec, round_ % 2 == 0)
        taus = {row: float(torch.rand((), generator=rng)) * 0.5 for row in range(batch)}
        seeds = {row: round_ * 1000 + row for row in range(0, batch, 2)}  # seeded and unseeded rows
        drawn.clear()
        meta = metadata([1.0] * batch, seeds, {row: {"mtad_tau": tau} for row, tau in taus.items()})
        got = call(patched, counts, drafts, draft_probs, target_logits, bonus, meta, max_spec)
        for row in range(batch):
            if counts[row] == 0:  # nothing drafted: the target's own token, from vLLM's rule
                assert got[row].tolist() == [int(bonus[row, 0])] + [-1] * max_spec
            else:
                numbers = uniforms_of(drawn, row)
                batch_args = (counts, drafts, draft_probs, target_logits, bonus)
                assert got[row].tolist() == expected_mtad(row, *batch_args, taus[row], numbers, max_spec), row
            cases += 1
    assert cases >= 10_000


def test_block_rows_keep_and_emit_what_the_kernel_does(sampler, drawn):
    """Block verification's rows, with the draft model's q and with a fixed draft's (n-gram: q one-hot)."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(5)
    cases = 0
    for round_ in range(40):
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 50, 4, round_ % 2 == 0)
        drawn.clear()
        meta = metadata(
            [1.0] * 50, {row: row for row in range(0, 50, 3)}, {key: {"block_verify": 1} for key in range(50)}
        )
        got = call(patched, counts, drafts, draft_probs, target_logits, bonus, meta, 4)
        for row in range(50):
            if counts[row]:
                numbers = uniforms_of(drawn, row)
                want = expected_block(row, counts, drafts, draft_probs, target_logits, bonus, numbers, 4)
                assert got[row].tolist() == want, row
                cases += 1
    assert cases > 1500


def test_in_a_mixed_batch_standard_rows_are_vllms_bit_for_bit_and_the_others_their_rules(sampler, drawn):
    """MTAD, block and standard rows together, every request seeded: the standard rows equal vLLM's unpatched rule
    on the same batch, and the MTAD and block rows equal their kernels."""
    patched, original = sampler
    rng = torch.Generator().manual_seed(1)
    for _ in range(20):
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 9, 4, True)
        seeds = {row: 100 + row for row in range(9)}
        rules = {1: {"mtad_tau": 0.1}, 4: {"mtad_tau": 0.3}, 2: {"block_verify": True}, 7: {"block_verify": "true"}}
        batch = (counts, drafts, draft_probs, target_logits, bonus)
        drawn.clear()
        mixed = call(patched, *batch, metadata([1.0] * 7 + [0.0] * 2, seeds, rules), 4)
        plain = call(original, *batch, metadata([1.0] * 7 + [0.0] * 2, seeds), 4)
        standard = [row for row in range(9) if row not in rules]
        assert torch.equal(mixed[standard], plain[standard])
        for row, rule in rules.items():
            if counts[row]:
                numbers = uniforms_of(drawn, row)
                want = (
                    expected_mtad(row, *batch, rule["mtad_tau"], numbers, 4)
                    if "mtad_tau" in rule
                    else expected_block(row, *batch, numbers, 4)
                )
                assert mixed[row].tolist() == want, (row, rule)


def test_block_verification_is_not_vllms_standard_rule(sampler):
    """A case where they differ by far: the first draft token is unlikely under the target (p/q = 0.01), the second
    makes up for it (p/q = 100). Standard rejection keeps the first token 1% of the time; block verification keeps
    both, always (p_2 = min(0.01 * 100, 1) = 1 = h_2)."""
    patched, original = sampler
    rows = 200
    q = torch.tensor([[0.99, 0.01], [0.0099, 0.9901]]).repeat(rows, 1)
    p_logits = torch.tensor([[0.0099, 0.9901], [0.99, 0.01]]).log().repeat(rows, 1)
    drafts = torch.tensor([0, 0]).repeat(rows)
    bonus = torch.ones(rows, 1, dtype=torch.long)
    kept = {}
    for name, function, rules in (
        ("standard", original, None),
        ("block", patched, {key: {"block_verify": True} for key in range(rows)}),
    ):
        out = call(function, [2] * rows, drafts, q.contiguous(), p_logits, bonus, metadata([1.0] * rows, {}, rules), 2)
        kept[name] = ((out[:, 0] == 0) & (out[:, 1] == 0)).sum().item()
    assert kept["block"] == rows and kept["standard"] < 0.1 * rows, kept


def test_an_engine_asking_for_block_verification_gets_it_on_the_v1_runner(sampler):
    """vLLM's V1 runner ignores speculative_config's rejection_sample_method="block"; with the plugin every sampled
    request of such an engine is a block row (the same case as above), and an MTAD request stays MTAD."""
    from vllm.config import VllmConfig

    config = VllmConfig()
    config.speculative_config = SimpleNamespace(rejection_sample_method="block")
    built = tracker({0: None, 1: {"mtad_tau": 0.1}, 2: None}, config)
    assert {row: rule.name for row, rule in built.rules.items()} == {0: "block", 1: "mtad", 2: "block"}


@pytest.mark.parametrize("seed", range(3))
def test_the_tracker_follows_vllms_batch_updates(seed):
    """Random add/remove/move/swap sequences from vLLM's own BatchUpdateBuilder: after every step the tracker's rows
    are exactly the sampled requests that asked for a rule, with their rule, and what rows() hands the verifier."""
    import random

    from persistent_batch import PersistentBatch
    from vllm import SamplingParams
    from vllm.config import VllmConfig

    from decodebench.models.mtad.vllm_plugin import VerificationRequests
    from decodebench.models.mtad.vllm_requests import Rule

    def new_request(rng):
        temperature = rng.choice([0.0, 0.8, 1.0])
        extra = rng.choice([None, {"mtad_tau": rng.choice([0.05, 0.1])}, {"block_verify": True}])
        params = SamplingParams(temperature=temperature, extra_args=extra)
        rule = None
        if temperature > 0 and extra:
            rule = Rule("mtad", extra["mtad_tau"]) if "mtad_tau" in extra else Rule("block")
        return params, rule

    rng = random.Random(seed)
    built = VerificationRequests(VllmConfig(), torch.device("cpu"), False)
    batch = PersistentBatch(rng, new_request, V)
    for _ in range(80):
        built.update_state(batch.step())
        expected = {row: r["config"] for row, r in enumerate(batch.rows) if r is not None and r["config"] is not None}
        assert built.rules == expected
        for name in ("mtad", "block"):
            rows = built.rows(name, len(batch.rows))
            chosen = sorted(row for row, rule in expected.items() if rule.name == name)
            assert (rows.host.tolist() if rows else []) == chosen
            if rows and name == "mtad":
                assert rows.taus.tolist() == pytest.approx([expected[row].tau for row in chosen])


def test_through_vllms_sampler_mtad_rows_are_verified_on_the_logits_vllm_was_given(sampler):
    """The wrapper end to end: with tau = 0 and p > 0 everywhere, MTAD accepts every draft token and adds the bonus
    token."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(4)
    for with_draft_probs in (True, False):
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 8, 4, with_draft_probs)
        batch = (counts, drafts, draft_probs, target_logits, bonus)
        out = call(patched, *batch, metadata([1.0] * 8, {}, {row: {"mtad_tau": 0.0} for row in range(0, 8, 2)}), 4)
        starts = [sum(counts[:row]) for row in range(8)]
        for row in range(0, 8, 2):
            kept = drafts[starts[row] : starts[row] + counts[row]].tolist()
            expected = [*kept, int(bonus[row, 0])] + [-1] * (4 - counts[row])
            assert out[row].tolist() == expected, (row, counts[row])


def test_draft_positions_a_grammar_refused_are_never_kept(sampler):
    """Structured outputs mark a draft token the grammar refuses with -1. With tau = 0 MTAD would keep any real
    token, and with q = p block verification keeps every one: both stop before the -1, and emit a real token there."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(6)
    target_logits = torch.randn(8, V, generator=rng)
    probs = torch.softmax(target_logits, -1)
    drafts = torch.tensor([3, -1, 5, 7, 2, 4, -1, 1])  # row 0: [3, -1, 5, 7]; row 1: [2, 4, -1, 1]
    bonus = torch.tensor([[9], [9]])
    for rule in ({"mtad_tau": 0.0}, {"block_verify": True}):
        out = call(
            patched, [4, 4], drafts, probs, target_logits, bonus, metadata([1.0, 1.0], {}, {0: rule, 1: rule}), 4
        )
        assert out[0, 0] == 3 and 0 <= out[0, 1] < V and (out[0, 2:] == -1).all(), (rule, out)
        assert out[1, :2].tolist() == [2, 4] and 0 <= out[1, 2] < V and (out[1, 3:] == -1).all(), (rule, out)


def test_greedy_requests_match_vllms_greedy_rule_whatever_they_ask(sampler):
    """vLLM's own greedy cases: every draft token right gives drafts + bonus, the first wrong one ends the run."""
    from vllm import SamplingParams

    patched, _ = sampler
    logits = torch.full((3, V), -10.0)
    logits[0, 5], logits[1, 7], logits[2, 2] = 0.0, 0.0, 0.0  # the target's argmax: 5, 7, 2
    bonus = torch.tensor([[9], [9]])
    drafts = torch.tensor([5, 7, 5])  # row 0 drafts [5, 7] (positions 0, 1), row 1 drafts [5] (position 2)
    counts = [2, 1]
    for rules in ({}, {0: {"mtad_tau": 0.1}, 1: {"block_verify": True}}):
        params = {row: SamplingParams(temperature=0.0, extra_args=extra) for row, extra in rules.items()}
        out = call(patched, counts, drafts, None, logits, bonus, metadata([0.0, 0.0], {}, params or None), 2)
        assert out[0].tolist() == [5, 7, 9]  # both right, then the bonus token
        assert out[1].tolist() == [2, -1, -1]  # wrong at once: the target's own token instead


def test_standard_requests_still_follow_the_target_distribution(sampler):
    """vLLM's speculative sampling, plugin loaded: with one draft token from q, the first emitted token is
    distributed as p (total variation over 20,000 draws)."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(3)
    p_logits = torch.randn(V, generator=rng)
    q = torch.softmax(torch.randn(V, generator=rng), -1)
    draws = 20_000
    drafts = torch.multinomial(q.expand(draws, V), 1, replacement=True, generator=rng).squeeze(-1)
    bonus = torch.multinomial(torch.softmax(p_logits, -1).expand(draws, V), 1, generator=rng)
    out = call(
        patched,
        [1] * draws,
        drafts,
        q.expand(draws, V).contiguous(),
        p_logits.expand(draws, V).contiguous(),
        bonus,
        metadata([1.0] * draws, {}),
        1,
    )
    empirical = torch.bincount(out[:, 0].long(), minlength=V).float() / draws
    assert (empirical - torch.softmax(p_logits, -1)).abs().sum() / 2 < 0.02


# -- what a GPU needs of the plugin -----------------------------------------------------------------------------------
def test_the_host_sync_counter_sees_what_would_stall_a_gpu():
    values, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    for stall in (
        lambda: values[2].item(),
        lambda: values.tolist(),
        lambda: bool(values[1] > 0),
        lambda: values[mask],
        lambda: torch.nonzero(mask),
        lambda: torch.tensor([1, 2], device=torch.device("cpu")),
        lambda: int(values.max()),
    ):
        with HostSyncs() as counter:
            stall()
        assert counter.calls, stall
    with HostSyncs() as counter:
        torch.nonzero_static(mask, size=3)
        values.index_select(0, torch.tensor([1, 2]))
    assert counter.calls == []


def test_one_plugin_step_makes_no_host_synchronization(sampler):
    """A batch update, a draft warp and a verification step of a batch holding MTAD, block and standard rows, and a
    V2 LZ step: nothing in decodebench's code reads a device value on the host (vLLM's own rule is not counted)."""
    from vllm.config import VllmConfig
    from vllm.v1.spec_decode import llm_base_proposer

    from decodebench.models.mtad.vllm_v1_rules import with_rules, with_warped_drafts

    rng = torch.Generator().manual_seed(8)
    counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 8, 4, True, first=4)
    drafts = torch.cat([drafts[:1] * 0 - 1, drafts[1:]])  # a position a grammar refused, too
    rules = {0: {"mtad_tau": 0.1}, 3: {"mtad_tau": 0.2}, 5: {"block_verify": True}}
    config = VllmConfig()
    with HostSyncs() as counter:
        top = {"top_k": torch.full((8,), 5), "top_p": torch.full((8,), 0.9)}
        meta = metadata([1.0] * 8, {0: 1, 5: 2}, rules, config, **top)

        @functools.wraps(sampler[1])  # the wrapper binds its arguments by vLLM's signature
        def vllm_rule(*args, **kwargs):
            with counter.paused():
                return sampler[1](*args, **kwargs)

        def vllm_draft_sampling(logits, metadata, *args, **kwargs):
            with counter.paused():
                return llm_base_proposer.compute_probs_and_sample_next_token.__wrapped__(logits, metadata)

        with_warped_drafts(vllm_draft_sampling)(torch.randn(8, V, generator=rng), meta)
        out = call(with_rules(vllm_rule), counts, drafts, draft_probs, target_logits, bonus, meta, 4)
    assert (out[0] >= 0).any()
    assert counter.calls == [], counter.calls


def test_drafts_are_warped_in_float32_whatever_the_models_dtype(sampler, monkeypatch):
    """vLLM's CUDA top-k/top-p kernel asserts float32 logits; a bfloat16 draft model's logits reach it as float32,
    and the warp lands in the draft's logits (outside the top 3 of each MTAD row: -inf)."""
    from vllm.v1.sample.ops import topk_topp_sampler
    from vllm.v1.spec_decode import llm_base_proposer

    seen = []
    real = topk_topp_sampler.apply_top_k_top_p

    def recording(logits, k, p):
        seen.append(logits.dtype)
        return real(logits, k, p)

    monkeypatch.setattr(topk_topp_sampler, "apply_top_k_top_p", recording)
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    meta = metadata([0.7] * 4, {}, {1: {"mtad_tau": 0.1}, 2: {"mtad_tau": 0.1}}, top_k=torch.full((4,), 3))
    before = logits.clone()
    warped = llm_base_proposer.compute_probs_and_sample_next_token
    assert getattr(warped, "_decodebench_verification", False)
    _, probs = warped(logits, meta)
    assert seen == [torch.float32]
    assert ((probs[1:3] > 0).sum(-1) == 3).all() and ((probs[[0, 3]] > 0).sum(-1) == V).all()
    assert before.dtype == torch.bfloat16


def test_drafts_without_probabilities_are_said_to_be_one_hot(sampler, caplog, monkeypatch):
    from decodebench.models.mtad import vllm_v1_rules

    monkeypatch.setattr(vllm_v1_rules, "_warned_one_hot", set())  # said once per process: whatever ran before
    patched, _ = sampler
    rng = torch.Generator().manual_seed(10)
    counts, drafts, _, target_logits, bonus = random_batch(rng, 4, 3, False, first=3)
    with caplog.at_level("WARNING", logger=vllm_v1_rules.__name__):
        call(patched, counts, drafts, None, target_logits, bonus, metadata([1.0] * 4, {}, {0: {"mtad_tau": 0.1}}), 3)
    assert "q is one-hot at the drafted token" in caplog.text


def test_bad_verification_arguments_are_refused_with_what_is_allowed():
    from vllm import SamplingParams

    from decodebench.models.mtad.vllm_plugin import VerificationRequests

    def check(**extra):
        VerificationRequests.validate_params(SamplingParams(extra_args=extra))

    for value in (1.5, -0.1, "often", float("nan")):
        with pytest.raises(ValueError, match=r"mtad_tau=.*must be a number in \[0, 1\)"):
            check(mtad_tau=value)
    with pytest.raises(ValueError, match="block_verify='maybe': must be true or false"):
        check(block_verify="maybe")
    with pytest.raises(ValueError, match="mtad_tau and block_verify both given"):
        check(mtad_tau=0.1, block_verify=True)
    for misspelt in ({"mtad_tauu": 0.1}, {"block_verification": True}, {"mtad_tau": 0.1, "mtad_gamma": 4}):
        with pytest.raises(
            ValueError, match=r"unknown verification settings \[.*\]; allowed: \['mtad_tau', 'block_verify'\]"
        ):
            check(**misspelt)
    check(lz_penalty=0.15)  # another plugin's setting is its business
    check(mtad_tau=0.1)
    check(block_verify=True)
    VerificationRequests.validate_params(SamplingParams())


def test_on_vllms_v2_runner_requests_for_rules_it_cannot_run_are_refused_at_admission(sampler):
    """The V2 runner (vLLM's default on CUDA) samples without the V1 rejection sampler the rules wrap: MTAD is refused
    there, saying what to do; block verification passes only where the engine's own rule is vLLM's block
    verification; everything else passes."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    def frontend(rejection_sample_method=None):
        spec = SimpleNamespace(rejection_sample_method=rejection_sample_method) if rejection_sample_method else None
        config = SimpleNamespace(use_v2_model_runner=True, speculative_config=spec)
        return SimpleNamespace(
            vllm_config=config, model_config=SimpleNamespace(logits_processors=None, runner_type="x")
        )

    validate = InputProcessor._build_logits_processors_params_validator(frontend())
    with pytest.raises(VLLMValidationError, match=r"V2 model runner.*VLLM_USE_V2_MODEL_RUNNER=0"):
        validate(SamplingParams(temperature=1.0, extra_args={"mtad_tau": 0.1}))
    with pytest.raises(VLLMValidationError, match="block verification was asked"):
        validate(SamplingParams(temperature=1.0, extra_args={"block_verify": True}))
    validate(SamplingParams(temperature=1.0, extra_args={"lz_penalty": 0.1}))
    blocks = InputProcessor._build_logits_processors_params_validator(frontend("block"))
    blocks(SamplingParams(temperature=1.0, extra_args={"block_verify": True}))
    with pytest.raises(VLLMValidationError, match="mtad verification was asked"):
        blocks(SamplingParams(temperature=1.0, extra_args={"mtad_tau": 0.1}))


def test_what_mtad_cannot_do_on_vllm_is_refused_before_the_engine_starts():
    from decodebench.models.mtad import MTAD

    for args, message in (
        ({"mode": "assisted"}, "mode=assisted exists on transformers only"),
        ({"draft": "infinigram"}, "draft=infinigram exists on transformers only"),
        ({"beams": 8}, "beams=8: vLLM drafts one chain"),
        ({"mode": "mtad", "model_runner": "v2"}, "model_runner=v2: MTAD's acceptance rule"),
    ):
        with pytest.raises(ValueError, match=message):
            MTAD.check_args({"backend": "vllm", "pretrained": "embedded", **args})
    with pytest.raises(ValueError, match="mode=block exists on vLLM only"):
        MTAD.check_args({"pretrained": "embedded", "mode": "block"})


def test_the_tracker_is_built_into_engines_that_speculate_where_vllm_builds_no_custom_processor(sampler):
    from vllm.config import VllmConfig
    from vllm.v1.worker import gpu_model_runner

    from decodebench.models.mtad.vllm_v1_rules import VerificationRequestsV1

    build = gpu_model_runner.build_logitsprocs
    assert getattr(build, "_decodebench_verification", False)
    config = VllmConfig()
    config.speculative_config = SimpleNamespace(rejection_sample_method="standard")
    speculating = build(config, torch.device("cpu"), False, False)
    assert [type(p) for p in speculating.all if isinstance(p, VerificationRequestsV1)] == [VerificationRequestsV1]
    assert not list(build(config, torch.device("cpu"), False, True).all)  # a pooling model: none


def test_on_the_cpu_build_each_requests_temperature_reaches_its_draft_positions():
    """vLLM 0.32.0's CPU fallback leaves a float expansion uninitialized (models/backends/vllm_cpu_fix.py); fixed, the
    temperatures and top-p values of a batch land on their requests' draft positions, greedy ones replaced by 1."""
    from vllm.v1.sample import rejection_sampler

    from decodebench.models.backends import vllm_cpu_fix

    vllm_cpu_fix.register()
    assert rejection_sampler.expand_batch_to_tokens is vllm_cpu_fix.expand_batch_to_tokens
    temperature = torch.tensor([0.5, 0.0, 2.0])
    expanded = rejection_sampler.expand_batch_to_tokens(temperature, torch.tensor([2, 5, 6]), 6, 0, 1)
    assert expanded.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 2.0]
    top_k = rejection_sampler.expand_batch_to_tokens(torch.tensor([20, 5]), torch.tensor([0, 3]), 3)
    assert top_k.tolist() == [5, 5, 5]


def test_on_the_cpu_build_the_kernel_scan_reads_past_numba():
    """vLLM 0.32.0's CPU start-up scan of every loaded module for kernel references failed on llvmlite's ``ffi.lib``
    (numba's), so no engine started in a process that had imported numba, as vLLM's n-gram drafter does
    (models/backends/vllm_cpu_fix.py); fixed, the scan reads past it."""
    pytest.importorskip("numba")
    import llvmlite.binding  # noqa: F401 (loads llvmlite.binding.ffi, whose lib broke the scan)
    from vllm.triton_utils import dispatcher

    from decodebench.models.backends import vllm_cpu_fix

    vllm_cpu_fix.register()
    dispatcher._rebind_kernels([])  # the scan itself, over every loaded module, with nothing to rebind


# -- on the engine -------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.model
def test_greedy_mtad_on_vllm_answers_as_the_baseline_and_reports_the_engines_counts(vllm_run):
    """The issue's command, batched: greedy MTAD is greedy speculative decoding, so its answers are the baseline's,
    text for text; its statistics come from the engine's counters; each engine records the model runner it ran.
    (MTAD's rule under sampling inside a real server, with a draft model's q: tests/test_served.py.)"""
    runs = {"mtad": vllm_run("mtad", ",mode=mtad,draft=context"), "baseline": vllm_run("baseline")}
    for task in VLLM_TASKS:
        texts = {name: {s["doc_id"]: s["resps"][0][0] for s in read_samples(out, task)} for name, out in runs.items()}
        assert texts["mtad"] == texts["baseline"] and any(t.strip() for t in texts["mtad"].values())
    info = read_results(runs["mtad"])["config"]["decodebench"]
    assert info["model_runner"] == "v1" and read_results(runs["baseline"])["config"]["decodebench"]["model_runner"]
    stats = info["tasks"]["squad_mini"]
    method = stats["method"]
    assert method["iterations"] > 0 and method["block_efficiency"] >= 1 and method["acceptance_histogram"]
    assert sum(method["acceptance_histogram"].values()) == method["iterations"]
    assert method["iterations"] == stats["engine"]["vllm:spec_decode_num_drafts_total"]
    assert len(method["acceptance_per_position"]) == 4 and method["acceptance_per_position"][0] > 0
