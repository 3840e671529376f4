"""`--model lz` for real: the processors on a model, and through the lm_eval command."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import lm_eval_in_process, read_results

from decodebench.models.lz import LZ, LZConfig
from decodebench.models.lz.processors import FrequencyPenaltyLogitsProcessor, LZPenaltyLogitsProcessor

pytestmark = pytest.mark.model

PROMPT = "List the days of the week, again and again:"


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    return model, tokenizer


def generate(model, tokenizer, processors, new_tokens=40):
    from transformers import LogitsProcessorList

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out = model.generate(
        ids,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        logits_processor=LogitsProcessorList(processors),
        pad_token_id=tokenizer.eos_token_id,
    )
    return out[0, ids.shape[1] :].tolist(), ids.shape[1]


def lz(strength: float, **args) -> LZConfig:
    return LZConfig.parse({"strength": strength, **args})[0]


def test_strong_lz_penalty_forbids_every_token_already_in_the_window(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    plain, width = generate(model, tokenizer, [])
    assert len(set(plain)) < len(plain), "greedy decoding of this model should repeat itself"
    penalized, _ = generate(model, tokenizer, [LZPenaltyLogitsProcessor(lz(100.0, codelength="propositions"), width)])
    assert len(set(penalized)) == len(penalized)
    # the authors' penalizer: a token can come back only if its earlier copy has no full buffer before it
    authors, _ = generate(model, tokenizer, [LZPenaltyLogitsProcessor(lz(100.0, buffer=4), width)])
    for position, token in enumerate(authors):
        earlier = [p for p in range(position) if authors[p] == token]
        assert all(p < 4 for p in earlier), (position, authors)


def test_zero_strength_changes_nothing_and_default_strength_changes_a_loop(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    plain, width = generate(model, tokenizer, [])
    assert generate(model, tokenizer, [LZPenaltyLogitsProcessor(lz(0.0), width)])[0] == plain
    assert generate(model, tokenizer, [FrequencyPenaltyLogitsProcessor(0.0, width)])[0] == plain
    assert generate(model, tokenizer, [LZPenaltyLogitsProcessor(LZConfig.defaults(), width)])[0] != plain


@pytest.mark.parametrize("include_prompt", [False, True])
def test_lz_processor_step_makes_no_host_synchronization(include_prompt):
    """What a CUDA decode step would wait on, counted on the CPU (an H200 caught the float strength's copy to the
    device at every step: docs/benchmarks/h200.md)."""
    from host_syncs import HostSyncs

    generator = torch.Generator().manual_seed(0)
    input_ids = (torch.arange(80) % torch.tensor([[7], [9], [11]])).long()  # loops, longer than the buffer
    prompt_lengths = torch.tensor([10, 12, 7]) if include_prompt else None
    processor = LZPenaltyLogitsProcessor(
        dataclasses.replace(LZConfig.defaults(), include_prompt=include_prompt), 12, prompt_lengths
    )
    scores = torch.randn(3, 50, generator=generator)
    with HostSyncs() as syncs:
        penalized = processor(input_ids, scores.clone())
    assert syncs.calls == []
    assert not torch.equal(penalized, scores)


def test_frequency_processor_subtracts_counts_of_generated_tokens_only():
    scores = torch.zeros(1, 6)
    input_ids = torch.tensor([[5, 5, 1, 2, 2, 2]])  # prompt [5, 5]; generated 1, 2, 2, 2
    out = FrequencyPenaltyLogitsProcessor(0.5, prompt_width=2)(input_ids, scores)
    assert out.tolist() == [[0.0, -0.5, -1.5, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"window": 32, "buffer": 32}, "window=32: must be larger than buffer=32 and at most 4096"),
        ({"window": 200_000_000}, r"window=200000000: must be in \[2, 4096\]"),
        ({"buffer": 100_000_000}, r"buffer=100000000: must be in \[1, 256\]"),
        ({"strength": -0.1}, "strength=-0.1: must be >= 0"),
        ({"penalty": "repetition", "strength": 0.5}, "the repetition penalty factor must be >= 1"),
        ({"penalty": "presence"}, "choose one of"),
    ],
)
def test_bad_lz_arguments_fail_before_loading(args, message):
    with pytest.raises(ValueError, match=message):
        LZ.create(args)


def test_each_penalty_gets_its_own_default_strength():
    assert [LZConfig.parse({"penalty": p})[0].strength for p in ("lz", "frequency", "repetition", "none")] == [
        0.15,
        0.3,
        1.2,
        0.0,
    ]


@pytest.mark.slow
def test_lm_eval_runs_a_penalty_and_records_its_arguments(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    lm_eval_in_process(
        *("--model", "lz", "--model_args", f"pretrained={tiny_checkpoint},penalty=frequency,strength=0.5"),
        *("--tasks", "squad_mini", "--gen_kwargs", "max_gen_toks=12", "--limit", "2", "--output_path", str(out)),
        cwd=tmp_path,
    )
    info = read_results(out)["config"]["decodebench"]
    assert info["method"] == "lz" and info["method_args"] == {
        "penalty": "frequency",
        "strength": 0.5,
        "window": 512,
        "buffer": 32,
        "include_prompt": False,
        "codelength": "authors",
    }
    assert info["tasks"]["squad_mini"]["requests"] == 2
    assert info["tasks"]["squad_mini"]["decoding"] == [{"do_sample": False}]  # squad_mini decodes greedily
