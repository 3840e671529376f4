"""A new method is one module plus one registry line: defined here, registered through the
``decodebench.methods`` entry point of a throw-away distribution, and run by the real ``lm_eval``."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import console_script, decodebench_in_process, explain, read_results, read_samples, run_command

pytestmark = [pytest.mark.model, pytest.mark.slow]

# The whole method, as a newcomer would write it (docs/extending.md, "Adding a method").
METHOD = """
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from decodebench.models.method import Method
from decodebench.models.config import MethodConfig, at_least, option


@dataclass(frozen=True)
class EndAfterConfig(MethodConfig):
    tokens: int = option(3, "new tokens before the answer is ended with EOS", check=at_least(1))


class EndAfterProcessor(LogitsProcessor):
    def __init__(self, prompt_width: int, tokens: int, eos: int):
        self.prompt_width, self.tokens, self.eos = prompt_width, tokens, eos

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] - self.prompt_width >= self.tokens:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.eos] = 0.0
        return scores


class EndAfter(Method):
    name = "endafter"
    label = "greedy decoding cut after a fixed number of tokens"
    Config = EndAfterConfig

    def hf_generate_kwargs(self, lm, input_ids, attention_mask, kwargs):
        processor = EndAfterProcessor(input_ids.shape[1], self.config.tokens, lm.eot_token_id)
        return {**kwargs, "logits_processor": [*kwargs.get("logits_processor", []), processor]}
"""


@pytest.fixture
def toy_distribution(tmp_path):
    site = tmp_path / "site"
    info = site / "toy_method-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "toy_method.py").write_text(METHOD)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[decodebench.methods]\nendafter = toy_method:EndAfter\n")
    return site


def test_a_new_method_in_one_module_runs_through_lm_eval(toy_distribution, tiny_checkpoint, tmp_path, monkeypatch):
    # `decodebench methods` in this process (a new Python costs ~8 s of imports): the entry point is read from
    # sys.path when asked for, so the listing sees the distribution added here
    monkeypatch.syspath_prepend(str(toy_distribution))
    listing = decodebench_in_process("methods", cwd=tmp_path)
    assert listing.returncode == 0, explain(listing)
    assert "--model endafter: greedy decoding cut after a fixed number of tokens" in listing.stdout
    sys.modules.pop("toy_method")  # the toy stays this test's: sys.path loses its folder after the test

    env = {"PYTHONPATH": str(toy_distribution)}

    out = tmp_path / "out"
    # the console script: a new distribution on PYTHONPATH is found by a Python that starts after it is there
    proc = run_command(
        [
            *(console_script("lm_eval"), "--model", "endafter"),
            *("--model_args", f"pretrained={tiny_checkpoint},tokens=2"),
            *("--tasks", "squad_mini", "--gen_kwargs", "max_gen_toks=12", "--limit", "3"),
            *("--output_path", str(out), "--log_samples"),
        ],
        cwd=tmp_path,
        **env,
    )
    assert proc.returncode == 0, explain(proc)
    info = read_results(out)["config"]["decodebench"]
    assert info["method"] == "endafter" and info["method_args"] == {"tokens": 2}
    records = [record for sample in read_samples(out, "squad_mini") for record in sample["decodebench"]]
    assert len(records) == 3
    assert all(r["new_tokens"] <= 3 for r in records), json.dumps(records)  # 2 tokens, then EOS
    assert any(r["finish_reason"] == "eos" for r in records)
