"""pytest-benchmark regression benchmarks; check_regression.py runs them against this tree and a baseline revision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decodebench.kernels.lz import apply_lz_penalty_
from decodebench.kernels.mtad import mtad_accept_length, speculative_accept
from decodebench.kernels.nugget import gather_kv, select_topk
from decodebench.metrics.loops import detect
from decodebench.models.lz import LZConfig

torch.manual_seed(0)


@pytest.mark.parametrize("batch", [1, 16])
def test_lz_penalty_decode_step(benchmark, batch):
    lz = LZConfig.defaults()
    history = torch.randint(0, 49152, (batch, lz.window + lz.buffer))
    lengths = torch.full((batch,), lz.window + lz.buffer)
    logits = torch.randn(batch, 49152)
    benchmark(apply_lz_penalty_, logits, history, lengths, lz.strength, lz.window, lz.buffer, lz.codelength)


def test_mtad_verification(benchmark):
    target = torch.log_softmax(torch.randn(64, 4), dim=-1)
    draft = torch.cumsum(torch.log_softmax(torch.randn(64, 4), dim=-1), dim=-1)
    probs = torch.softmax(torch.randn(64, 5, 1000), dim=-1)
    tokens = torch.multinomial(probs[:, :4].reshape(-1, 1000), 1).reshape(64, 4)

    def verify():
        mtad_accept_length(target, draft, 0.1)
        speculative_accept(tokens, probs[:, :4], probs)

    benchmark(verify)


def test_nugget_select_and_gather(benchmark):
    layers = [(torch.randn(1, 3, 512, 64), torch.randn(1, 3, 512, 64)) for _ in range(30)]
    scores = torch.randn(1, 512)

    def compress():
        indices, _ = select_topk(scores, torch.tensor([512]), 10)
        return [gather_kv(k, v, indices) for k, v in layers]

    benchmark(compress)


def test_repetition_detector_32k_tokens(benchmark):
    seq = np.random.default_rng(0).integers(0, 49152, 32768)
    benchmark(detect, seq)


@pytest.fixture(scope="module")
def embedded_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.data.embedded import ensure_embedded_model

    path = ensure_embedded_model()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_decode_32_tokens_embedded_model(benchmark, embedded_model):
    model, tokenizer = embedded_model
    ids = tokenizer("The old stone bridge over the river reopened after the flood because", return_tensors="pt")

    def decode():
        with torch.inference_mode():
            model.generate(
                **ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id
            )

    benchmark.pedantic(decode, rounds=3, warmup_rounds=1)
