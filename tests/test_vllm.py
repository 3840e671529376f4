"""The vLLM backend, for real, on vLLM's CPU build (run with `tox -e vllm`)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import STRONG_LZ, VLLM_LIMIT, VLLM_TASKS, lm_eval_with_vllm_engine, read_results, read_samples

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

# Small engine footprint: several engines may share this machine's memory, and the CPU build zeroes its whole KV cache
# as it starts (256 MiB: 5 sequences of 1024 tokens of the embedded model; gpu_memory_utilization=0.3 reserved 30% of
# the node's memory, 7 GiB here); eager mode skips
# the ~45 s torch.compile warm-up, which these tests do not measure; float32, as the shared engines (conftest): the CPU
# build's default, bfloat16, is emulated on a CPU without bfloat16 instructions (several times slower).
ENGINE_ARGS = "kv_cache_memory_bytes=268435456,max_model_len=1024,enforce_eager=True,dtype=float32"


def test_lm_evals_own_vllm_model_still_works_on_the_cpu_build(embedded_checkpoint, tmp_path):
    out = tmp_path / "out"
    lm_eval_with_vllm_engine(
        *("--model", "vllm", "--model_args", f"pretrained={embedded_checkpoint},{ENGINE_ARGS}"),
        *("--tasks", "squad_mini", "--limit", "2", "--gen_kwargs", "max_gen_toks=16", "--output_path", str(out)),
        cwd=tmp_path,
    )
    assert "decodebench" not in read_results(out)["config"]


def test_lz_model_runs_through_lm_eval_on_vllm_and_is_measured(vllm_run):
    out = vllm_run("lz", STRONG_LZ)
    info = read_results(out)["config"]["decodebench"]
    assert info["backend"] == "vllm" and info["method"] == "lz"
    assert info["method_args"]["strength"] == 3.0 and info["method_args"]["codelength"] == "propositions"
    for task in VLLM_TASKS:
        stats = info["tasks"][task]
        assert stats["requests"] == VLLM_LIMIT and stats["new_tokens"] > 0 and stats["tokens_per_second"] > 0
        assert stats["decoding"] == [{"do_sample": False}]
        samples = read_samples(out, task)
        assert all(s["decodebench"][0]["new_tokens"] >= 1 for s in samples)
        assert sum(bool(s["resps"][0][0].strip()) for s in samples) >= VLLM_LIMIT - 1, "vLLM should answer"
