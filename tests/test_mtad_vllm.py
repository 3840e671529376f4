"""MTAD inside vLLM's V1 engine (run with `tox -e vllm`): the plugin's rule against kernels/mtad.py, vLLM's own
rejection sampler's properties for the requests that do not ask for MTAD, and lm_eval on the engine."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from conftest import explain, read_results, read_samples, run_lm_eval

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

V = 12  # a small vocabulary: distributions that random cases can tell apart


@pytest.fixture(scope="module")
def sampler():
    """vLLM's rejection_sample with decodebench's plugin installed, and the tracker class."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from decodebench.models.mtad import vllm_plugin

    current_platform.register_triton_kernel_overrides()  # as vLLM's worker does: the CPU build's kernels
    vllm_plugin.register()
    assert getattr(rejection_sampler.rejection_sample, "_decodebench_mtad", False)
    return rejection_sampler.rejection_sample, rejection_sampler.rejection_sample.__wrapped__


def metadata(temperatures: list[float], seeds: dict[int, int], taus: dict[int, float] | None = None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    from decodebench.models.mtad.vllm_plugin import MTADRequests

    tracker = MTADRequests(None, torch.device("cpu"), False)
    tracker.taus = dict(taus or {})
    batch = len(temperatures)
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32),
        all_greedy=all(t == 0 for t in temperatures),
        all_random=all(t > 0 for t in temperatures),
        top_p=None,
        top_k=None,
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
        logitsprocs=LogitsProcessors([tracker]),
    )


def random_batch(rng: torch.Generator, batch: int, max_spec: int, with_draft_probs: bool):
    counts = torch.randint(0, max_spec + 1, (batch,), generator=rng).tolist()
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


def test_the_plugin_keeps_and_emits_what_the_kernel_does_on_10000_random_cases(sampler):
    """Each MTAD row of vLLM's flattened batch, against kernels/mtad.py's mtad_verify on that row alone."""
    from decodebench.kernels.mtad import mtad_verify
    from decodebench.models.mtad.vllm_plugin import mtad_output

    rng = torch.Generator().manual_seed(0)
    cases = 0
    for round_ in range(206):  # rounds 0, 50, ..., 200: a batch in which nothing was drafted
        batch, max_spec = (50, int(torch.randint(1, 6, (1,), generator=rng))) if round_ % 50 else (3, 0)
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, batch, max_spec, round_ % 2 == 0)
        taus = {row: float(torch.rand((), generator=rng)) * 0.5 for row in range(batch)}
        uniforms = torch.rand(batch, generator=rng)
        output = torch.full((batch, max_spec + 1), -7, dtype=torch.int32)
        cumulative = torch.tensor(counts).cumsum(0)
        got = mtad_output(output, taus, drafts, counts, cumulative, draft_probs, target_logits, bonus, uniforms)
        start = 0
        for row, g in enumerate(counts):
            row_drafts = drafts[start : start + g]
            logp = torch.log_softmax(target_logits[start : start + g].float(), -1)
            if draft_probs is None:
                joint_logq = torch.zeros(g)
            else:
                joint_logq = draft_probs[start : start + g].gather(-1, row_drafts[:, None]).squeeze(-1).log().cumsum(0)
            kept, following = mtad_verify(
                logp.reshape(1, g, V) if g else torch.zeros(1, 1, V),
                row_drafts.reshape(1, g) if g else torch.zeros(1, 1, dtype=torch.long),
                joint_logq.reshape(1, g) if g else torch.zeros(1, 1),
                torch.tensor([g]),
                torch.tensor([taus[row]]),
                uniforms[row : row + 1],
                bonus[row],
            )
            k = int(kept[0])
            expected = [*row_drafts[:k].tolist(), int(following[0])]
            expected += [-1] * (max_spec + 1 - len(expected))
            assert got[row].tolist() == expected, (row, g, k)
            start += g
            cases += 1
    assert cases >= 10_000


def test_requests_that_do_not_ask_keep_vllms_rule_in_a_batch_that_does(sampler):
    patched, original = sampler
    rng = torch.Generator().manual_seed(1)
    for _ in range(20):
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 8, 4, True)
        temperatures = [1.0] * 6 + [0.0] * 2
        seeds = {row: 100 + row for row in range(8)}
        batch = (counts, drafts, draft_probs, target_logits, bonus)
        mixed = call(patched, *batch, metadata(temperatures, seeds, {1: 0.1, 4: 0.2}), 4)
        plain = call(original, *batch, metadata(temperatures, seeds), 4)
        standard = [row for row in range(8) if row not in (1, 4)]
        assert torch.equal(mixed[standard], plain[standard])


def test_through_vllms_sampler_mtad_rows_are_verified_on_the_logits_vllm_was_given(sampler):
    """The wrapper end to end: vLLM's own kernels overwrite target_logits in place, so MTAD's rows must be read
    first. With tau = 0 and p > 0 everywhere, MTAD accepts every draft token and adds the bonus token."""
    patched, _ = sampler
    rng = torch.Generator().manual_seed(4)
    for with_draft_probs in (True, False):
        counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 8, 4, with_draft_probs)
        batch = (counts, drafts, draft_probs, target_logits, bonus)
        out = call(patched, *batch, metadata([1.0] * 8, {}, dict.fromkeys(range(0, 8, 2), 0.0)), 4)
        starts = [sum(counts[:row]) for row in range(8)]
        for row in range(0, 8, 2):
            kept = drafts[starts[row] : starts[row] + counts[row]].tolist()
            expected = [*kept, int(bonus[row, 0])] + [-1] * (4 - counts[row])
            assert out[row].tolist() == expected, (row, counts[row])


def test_greedy_requests_match_vllms_greedy_rule_whatever_they_ask(sampler):
    """vLLM's own greedy cases: every draft token right gives drafts + bonus, the first wrong one ends the run."""
    patched, _ = sampler
    logits = torch.full((3, V), -10.0)
    logits[0, 5], logits[1, 7], logits[2, 2] = 0.0, 0.0, 0.0  # the target's argmax: 5, 7, 2
    bonus = torch.tensor([[9], [9]])
    drafts = torch.tensor([5, 7, 5])  # row 0 drafts [5, 7] (positions 0, 1), row 1 drafts [5] (position 2)
    counts = [2, 1]
    for taus in ({}, {0: 0.1, 1: 0.1}):
        out = call(patched, counts, drafts, None, logits, bonus, metadata([0.0, 0.0], {}, taus), 2)
        assert out[0].tolist() == [5, 7, 9]  # both right, then the bonus token
        assert out[1].tolist() == [2, -1, -1]  # wrong at once: the target's own token instead


def test_seeded_standard_requests_are_deterministic_with_the_plugin_loaded(sampler):
    patched, _ = sampler
    rng = torch.Generator().manual_seed(2)
    counts, drafts, draft_probs, target_logits, bonus = random_batch(rng, 6, 3, True)
    batch = (counts, drafts, draft_probs, target_logits, bonus)
    again = [call(patched, *batch, metadata([1.0] * 6, {r: 7 for r in range(6)}), 3) for _ in range(3)]
    assert torch.equal(again[0], again[1]) and torch.equal(again[1], again[2])


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


def test_a_bad_tau_is_refused_with_its_range():
    from vllm import SamplingParams

    from decodebench.models.mtad.vllm_plugin import MTADRequests

    for value in (1.5, -0.1, "often", float("nan")):
        with pytest.raises(ValueError, match=r"mtad_tau=.*must be a number in \[0, 1\)"):
            MTADRequests.validate_params(SamplingParams(extra_args={"mtad_tau": value}))
    MTADRequests.validate_params(SamplingParams(extra_args={"mtad_tau": 0.1}))
    MTADRequests.validate_params(SamplingParams())


def test_what_mtad_cannot_do_on_vllm_is_refused_before_the_engine_starts():
    from decodebench.models.mtad import MTAD

    for args, message in (
        ({"mode": "assisted"}, "mode=assisted exists on transformers only"),
        ({"draft": "infinigram"}, "draft=infinigram exists on transformers only"),
        ({"beams": 8}, "beams=8: vLLM drafts one chain"),
    ):
        with pytest.raises(ValueError, match=message):
            MTAD.check_args({"backend": "vllm", "pretrained": "embedded", **args})
    with pytest.raises(ValueError, match="mode=block exists on vLLM only"):
        MTAD.check_args({"pretrained": "embedded", "mode": "block"})


def test_the_tracker_is_built_into_engines_that_speculate_where_vllm_builds_no_custom_processor(sampler):
    from types import SimpleNamespace

    from vllm.v1.worker import gpu_model_runner

    from decodebench.models.mtad.vllm_plugin import MTADRequests

    build = gpu_model_runner.build_logitsprocs
    assert getattr(build, "_decodebench_mtad", False)
    config = SimpleNamespace(speculative_config=object(), use_v2_model_runner=False)  # what is read of it
    speculating = build(config, torch.device("cpu"), False, False)
    assert any(isinstance(p, MTADRequests) for p in speculating.all)
    assert not list(build(config, torch.device("cpu"), False, True).all)  # a pooling model: none


def test_lz_refuses_an_engine_that_speculates_before_it_starts():
    from decodebench.models.lz import LZ

    lz = LZ()
    with pytest.raises(ValueError, match="vLLM applies none in an engine that speculates"):
        lz.vllm_engine_args({"speculative_config": {"method": "ngram"}}, "embedded")
    frequency, _ = LZ.Config.parse({"penalty": "frequency"})
    assert LZ(frequency).vllm_engine_args({"speculative_config": {}}, "x") == {"speculative_config": {}}


def test_on_the_cpu_build_each_requests_temperature_reaches_its_draft_positions():
    """vLLM 0.32.0's CPU fallback leaves a float expansion uninitialized (models/vllm_cpu_fix.py); fixed, the
    temperatures and top-p values of a batch land on their requests' draft positions, greedy ones replaced by 1."""
    from vllm.v1.sample import rejection_sampler

    from decodebench.models import vllm_cpu_fix

    vllm_cpu_fix.register()
    assert rejection_sampler.expand_batch_to_tokens is vllm_cpu_fix.expand_batch_to_tokens
    temperature = torch.tensor([0.5, 0.0, 2.0])
    expanded = rejection_sampler.expand_batch_to_tokens(temperature, torch.tensor([2, 5, 6]), 6, 0, 1)
    assert expanded.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 2.0]
    top_k = rejection_sampler.expand_batch_to_tokens(torch.tensor([20, 5]), torch.tensor([0, 3]), 3)
    assert top_k.tolist() == [5, 5, 5]


def test_an_engine_on_vllms_v2_runner_says_mtad_does_not_apply_there():
    from types import SimpleNamespace

    from decodebench.models.mtad.vllm_plugin import V1_RUNNER, plugin_refusal

    message = plugin_refusal(SimpleNamespace(use_v2_model_runner=True))
    assert "V2 model runner" in message and "VLLM_USE_V2_MODEL_RUNNER=0" in message
    assert plugin_refusal(SimpleNamespace(use_v2_model_runner=False)) is None
    assert V1_RUNNER == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


# -- on the engine -------------------------------------------------------------------------------------------------
ENGINE = "max_model_len=1024,enforce_eager=True,seed=0,dtype=float32"
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.mark.slow
@pytest.mark.model
def test_greedy_mtad_on_vllm_answers_as_the_baseline_and_reports_the_engines_counts(embedded_checkpoint, tmp_path):
    """The issue's command, batched: greedy MTAD is greedy speculative decoding, so its answers are the baseline's,
    text for text; its statistics come from the engine's counters. (MTAD's rule under sampling inside a real server,
    with a draft model's q: tests/test_served.py.)"""
    runs = {}
    for model, args in (
        ("mtad", f"backend=vllm,pretrained=embedded,mode=mtad,draft=context,{ENGINE}"),
        ("baseline", f"backend=vllm,pretrained=embedded,{ENGINE}"),
    ):
        proc = run_lm_eval(
            *("--model", model, "--model_args", args, "--tasks", "squad_mini,cnndm_mini", "--limit", "4"),
            *("--batch_size", "8", "--gen_kwargs", "max_gen_toks=48", "--apply_chat_template"),
            *("--output_path", str(tmp_path / model), "--log_samples"),
            cwd=tmp_path,
            **IN_PROCESS,
        )
        assert proc.returncode == 0, explain(proc)
        runs[model] = tmp_path / model
    for task in ("squad_mini", "cnndm_mini"):
        texts = {name: {s["doc_id"]: s["resps"][0][0] for s in read_samples(out, task)} for name, out in runs.items()}
        assert texts["mtad"] == texts["baseline"] and any(t.strip() for t in texts["mtad"].values())
    stats = read_results(runs["mtad"])["config"]["decodebench"]["tasks"]["cnndm_mini"]
    method = stats["method"]
    assert method["iterations"] > 0 and method["block_efficiency"] >= 1 and method["acceptance_histogram"]
    assert sum(method["acceptance_histogram"].values()) == method["iterations"]
    assert method["iterations"] == stats["engine"]["vllm:spec_decode_num_drafts_total"]
    assert len(method["acceptance_per_position"]) == 4 and method["acceptance_per_position"][0] > 0
