"""`--model mtad` on a tiny random model: lossless baselines, drafts, statistics and bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import lm_eval_in_process, read_results

from decodebench.models.mtad.drafts import ContextDrafter, ModelDrafter, layer_skip_draft

pytestmark = pytest.mark.model

PROMPTS = [
    "Summarize: The old bridge over the river Alder reopened on Monday after a flood destroyed one of its "
    "arches. The old bridge over the river",
    "Question: What is the capital of France?\nAnswer:",
]


def requests(max_gen_toks=24, **sampling):
    kwargs = {"until": ["\n\n"], "max_gen_toks": max_gen_toks, "do_sample": False, **sampling}
    return [SimpleNamespace(task_name="t", doc_id=i, idx=0, args=(p, dict(kwargs))) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def baseline_outputs(tiny_checkpoint):
    from decodebench.models.baseline import Baseline

    return Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu"}).generate_until(requests())


@pytest.fixture(scope="module")
def tiny_draft(embedded_checkpoint, tmp_path_factory):
    """Another 2-layer random Llama sharing the embedded model's tokenizer, built locally."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-draft")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def foreign_draft(tmp_path_factory):
    """A tiny model whose tokenizer has another vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(
        ["a tiny corpus for a tiny tokenizer"] * 20,
        trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"]),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    path = tmp_path_factory.mktemp("foreign-draft")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def mtad(tiny_checkpoint):
    from decodebench.models.mtad import MTAD

    def build(**args):
        return MTAD.create({"pretrained": str(tiny_checkpoint), "device": "cpu", **args})

    return build


@pytest.mark.parametrize(
    "args",
    [
        {"mode": "target"},
        {"mode": "speculative", "draft": "context"},
        {"mode": "speculative", "draft": "self:1"},
        {"mode": "assisted", "draft": "context"},
    ],
    ids=["target", "speculative-context", "speculative-self", "assisted-context"],
)
def test_lossless_modes_reproduce_greedy_decoding_exactly(args, baseline_outputs, mtad):
    model = mtad(gamma=3, **args)
    assert model.generate_until(requests()) == baseline_outputs
    stats = model.decodebench_recorder.task_summaries()["t"]["method"]
    assert stats["target_perplexity"] > 1


@pytest.mark.parametrize("mode", ["mtad", "speculative"])
def test_statistics_add_up_and_context_drafts_are_accepted_when_the_output_repeats(mode, baseline_outputs, mtad):
    model = mtad(mode=mode, draft="context", gamma=4, tau=0.1)
    model.generate_until(requests(max_gen_toks=32))
    records = model.decodebench_recorder.records
    for rec in records:
        stats = rec.method_stats
        histogram = stats["acceptance_histogram"]
        assert sum(histogram.values()) == stats["target_calls"] - 1  # one prefill, then one pass per iteration
        assert sum(int(k) * v for k, v in histogram.items()) == stats["accepted_tokens"]
        assert stats["accepted_tokens"] <= stats["drafted_tokens"] <= 4 * stats["iterations"]
        # the paper's block efficiency: tokens per draft-and-verify iteration (the prefill is none)
        assert stats["iterations"] == stats["target_calls"] - 1
        assert stats["block_efficiency"] == pytest.approx(1 + stats["accepted_tokens"] / stats["iterations"])
    # greedy MTAD is greedy speculative decoding (one-hot p): the tiny model's output loops, and
    # prompt lookup predicts it exactly
    assert model.decodebench_recorder.task_summaries()["t"]["method"]["block_efficiency"] > 1


def test_greedy_mtad_with_one_hot_p_reproduces_greedy_decoding(baseline_outputs, mtad):
    """At temperature 0 the authors make p one-hot: MTAD then keeps only what greedy decoding would emit."""
    model = mtad(mode="mtad", draft="context", gamma=4)
    assert model.generate_until(requests()) == baseline_outputs
    joint = mtad(mode="mtad-joint-greedy", draft="self:1", gamma=2, beams=2)  # the earlier variant still runs
    assert all(isinstance(text, str) for text in joint.generate_until(requests(max_gen_toks=8)))


@pytest.mark.parametrize("draft", ["context", "infinigram", "self:1"])
def test_sampling_works_with_every_draft_and_records_what_it_did(draft, mtad):
    for mode in ("mtad", "speculative"):
        model = mtad(mode=mode, draft=draft, gamma=3, beams=3, seed=5)
        outputs = model.generate_until(requests(max_gen_toks=10, do_sample=True, temperature=1.0))
        assert all(isinstance(text, str) for text in outputs)
        summary = model.decodebench_recorder.task_summaries()["t"]
        assert summary["method"]["iterations"] >= 1
        # the task set no top-k/top-p: Appendix F's 20 and 0.9, and results say so
        assert summary["decoding"] == [{"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.9}]


def test_mtad_with_a_neural_draft_of_the_same_vocabulary(tiny_draft, mtad):
    model = mtad(mode="mtad", draft=str(tiny_draft), gamma=2, beams=2)
    outputs = model.generate_until(requests(max_gen_toks=8))
    assert all(isinstance(text, str) for text in outputs)
    assert model.decodebench_recorder.task_summaries()["t"]["method"]["drafted_tokens"] > 0


def test_a_draft_with_another_vocabulary_is_refused(foreign_draft, mtad):
    with pytest.raises(ValueError, match="another vocabulary than the target"):
        mtad(draft=str(foreign_draft))


def test_self_draft_shares_weights_and_keeps_the_target_intact(embedded_checkpoint):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(embedded_checkpoint)
    layers = len(target.model.layers)
    draft = layer_skip_draft(target, 5)
    assert len(draft.model.layers) == 5 and len(target.model.layers) == layers
    assert draft.model.layers[0] is target.model.layers[0] and draft.lm_head is target.lm_head
    assert target.config.num_hidden_layers == layers
    with pytest.raises(ValueError, match=f"k must be an integer from 1 to {layers - 1}"):
        layer_skip_draft(target, layers)
    with pytest.raises(ValueError, match="k must be an integer"):
        layer_skip_draft(target, 0)


def test_drafter_caches_follow_rollbacks(tiny_checkpoint):
    """Drafting after a rejected draft must equal drafting from scratch on the same sequence."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    ids = AutoTokenizer.from_pretrained(tiny_checkpoint)("The river Alder flows").input_ids
    reused = ModelDrafter(layer_skip_draft(target, 1), beams=3)
    first = reused.draft(ids, 3)
    rolled_back = [*ids, first.tokens[0], 17]  # keep one drafted token, then diverge
    again = reused.draft(rolled_back, 3)
    fresh = ModelDrafter(layer_skip_draft(target, 1), beams=3).draft(rolled_back, 3)
    assert again.tokens == fresh.tokens
    assert again.joint_logq == pytest.approx(fresh.joint_logq, abs=1e-4)
    assert ContextDrafter(eos_token_id=None).draft([1, 2, 3, 9, 1, 2], 2).tokens == [3, 9]


def test_a_self_draft_deeper_than_the_target_is_refused(mtad):
    with pytest.raises(ValueError, match="k must be an integer from 1 to 1"):
        mtad(draft="self:2")


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ("self:999", r"draft=self:999: k must be an integer from 1 to 1 \(the target has 2 layers\)"),
        ("infinigram:/nonexistent", "draft=infinigram:/nonexistent: no infini-gram index folder at /nonexistent"),
        ("/no/such/draft", "draft=/no/such/draft: no such path"),
    ],
)
def test_a_draft_that_cannot_work_is_refused_before_the_model_loads(tiny_checkpoint, draft, message, monkeypatch):
    from decodebench.models.backends.hf import HFBackend
    from decodebench.models.mtad import MTAD

    monkeypatch.setattr(HFBackend, "__init__", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=message):
        MTAD.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "draft": draft})


@pytest.mark.slow
def test_lm_eval_reports_block_efficiency_and_perplexity(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    lm_eval_in_process(
        "--model",
        "mtad",
        "--model_args",
        f"pretrained={tiny_checkpoint},draft=context,gamma=4",
        "--tasks",
        "cnndm_mini",
        "--limit",
        "2",
        "--gen_kwargs",
        "max_gen_toks=32",
        "--output_path",
        str(out),
        cwd=tmp_path,
    )
    stats = read_results(out)["config"]["decodebench"]["tasks"]["cnndm_mini"]["method"]
    assert stats["block_efficiency"] >= 1 and stats["target_perplexity"] > 1 and stats["target_calls"] > 0


def test_a_self_draft_for_vllm_is_the_targets_first_layers_written_once(tiny_checkpoint, tmp_path, monkeypatch):
    """draft=self:<k> on vLLM: a standalone checkpoint that computes what layer_skip_draft computes, written once
    under DECODEBENCH_HOME and then reused; the engine gets it as a draft_model with its probabilities."""
    from transformers import AutoModelForCausalLM

    from decodebench.models.mtad.config import MTADConfig
    from decodebench.models.mtad.vllm_engine import self_draft_checkpoint, speculative_config

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path))
    path = self_draft_checkpoint(str(tiny_checkpoint), 1)
    assert path.parent == tmp_path / "drafts" and (path / "config.json").is_file()
    written = (path / "config.json").stat().st_mtime_ns
    assert self_draft_checkpoint(str(tiny_checkpoint), 1) == path
    assert (path / "config.json").stat().st_mtime_ns == written  # not written again
    target = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        torch.testing.assert_close(saved(ids).logits, layer_skip_draft(target, 1)(ids).logits)
    spec = speculative_config(MTADConfig(draft="self:1", mode="block"), str(tiny_checkpoint))
    assert spec == {
        "num_speculative_tokens": 4,
        "method": "draft_model",
        "model": str(path),
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
    }
    assert speculative_config(MTADConfig(draft="context"), str(tiny_checkpoint))["method"] == "ngram"
    assert speculative_config(MTADConfig(mode="target"), str(tiny_checkpoint)) is None
