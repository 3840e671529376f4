"""The LZ penalty's vLLM logits processor without an engine: random add/remove/move/swap
sequences from vLLM's own BatchUpdateBuilder, each batch row checked against its own request."""

from __future__ import annotations

import importlib.util
import math
import os
import random

import pytest
import torch
from lz_reference import authors_codelengths, codelengths

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

V = 11


class PersistentBatch:
    """What vLLM's input batch does between steps: finished requests leave, new ones take the
    lowest free rows, the last rows move down into the holes, and rows are sometimes swapped."""

    def __init__(self, rng: random.Random):
        from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder

        self.rng = rng
        self.rows: list[dict | None] = []
        self.builder = BatchUpdateBuilder()
        self.serial = 0

    def step(self):
        from vllm import SamplingParams
        from vllm.v1.sample.logits_processor.interface import MoveDirectionality

        from decodebench.models.lz import LZConfig
        from decodebench.models.lz.vllm_processor import lz_extra_args

        rng = self.rng
        for index, request in enumerate(self.rows):
            if request is not None and rng.random() < 0.2:
                self.rows[index] = None
                self.builder.removed_append(index)
        for _ in range(rng.randint(0, 3)):
            index = self.builder.pop_removed()
            if index is None:
                index = len(self.rows)
                self.rows.append(None)
            config = None
            if rng.random() < 0.7:  # some requests ask for the penalty, others do not
                config = LZConfig(
                    strength=rng.choice([0.15, 1.0, 3.0]),
                    window=rng.choice([6, 12]),
                    buffer=rng.choice([2, 3]),
                    include_prompt=rng.random() < 0.5,
                    codelength=rng.choice(["authors", "propositions"]),
                )
            request = {
                "id": self.serial,
                "prompt": [rng.randrange(V) for _ in range(rng.randint(0, 8))],
                "output": [],
                "config": config,
            }
            self.serial += 1
            self.rows[index] = request
            params = SamplingParams(extra_args=lz_extra_args(config) if config else None)
            self.builder.added.append((index, params, request["prompt"], request["output"]))
        while self.builder.has_removed():  # condense: the last occupied row fills the lowest hole
            hole = self.builder.peek_removed()
            last = max((i for i, r in enumerate(self.rows) if r is not None), default=-1)
            if hole >= last:  # only empty rows above: they stay in `removed`
                break
            self.builder.pop_removed()
            self.rows[hole], self.rows[last] = self.rows[last], None
            self.builder.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        while self.rows and self.rows[-1] is None:
            self.rows.pop()
        if len(self.rows) >= 2 and rng.random() < 0.3:
            a, b = rng.sample(range(len(self.rows)), 2)
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
            self.builder.moved.append((a, b, MoveDirectionality.SWAP))
        return self.builder.get_and_reset(len(self.rows))


def expected_row(request: dict, logits: torch.Tensor) -> torch.Tensor:
    """The penalty for one request alone, from the plain references of each codelength's definition."""
    config = request["config"]
    if config is None or config.strength == 0:
        return logits
    history = (request["prompt"] if config.include_prompt else []) + request["output"]
    history = history[-config.window :]
    if not history:
        return logits
    reference = authors_codelengths if config.codelength == "authors" else codelengths
    costs = torch.tensor(reference(history, V, config.window, config.buffer))
    present = torch.zeros(V, dtype=torch.bool)
    present[history] = True
    # absent tokens all cost log2 V: the processor leaves them alone (a constant shift per row)
    delta = torch.where(present, costs - math.log2(V), torch.zeros(V))
    return logits + config.strength * delta


@pytest.mark.parametrize("seed", range(5))
def test_processor_follows_batch_updates_and_matches_each_request_alone(seed):
    from decodebench.models.lz.vllm_processor import LZPenaltyV1LogitsProcessor

    rng = random.Random(seed)
    processor = LZPenaltyV1LogitsProcessor(None, torch.device("cpu"), False)
    batch = PersistentBatch(rng)
    checked = 0
    for _ in range(60):
        processor.update_state(batch.step())
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), V, generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        got = processor.apply(logits.clone())
        for row, request in enumerate(batch.rows):
            assert torch.allclose(got[row], expected_row(request, logits[row]), atol=1e-5), (row, request)
            checked += 1
        for row, request in enumerate(batch.rows):  # vLLM appends each sampled token to the live output list
            request["output"].append(int(got[row].argmax()) if rng.random() < 0.5 else rng.randrange(V))
    assert checked > 100


def test_bad_per_request_settings_are_refused_with_the_allowed_ones():
    from vllm import SamplingParams

    from decodebench.models.lz.vllm_processor import LZPenaltyV1LogitsProcessor

    def check(**extra):
        LZPenaltyV1LogitsProcessor.validate_params(SamplingParams(extra_args=extra))

    with pytest.raises(ValueError, match=r"unknown LZ penalty settings \['lz_alpha'\]"):
        check(lz_penalty=0.15, lz_alpha=1)
    with pytest.raises(ValueError, match=r"strength=-1\.0: must be >= 0"):
        check(lz_penalty=-1.0)
    with pytest.raises(ValueError, match="without lz_penalty"):
        check(lz_window=64)
    with pytest.raises(ValueError, match="codelength='paper' is not allowed"):
        check(lz_penalty=0.15, lz_codelength="paper")
    check(other_processor_setting=1)  # keys of other processors are none of ours
    check(lz_penalty=0.15, lz_window=64, lz_include_prompt="true")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_model_len": "abc"}, "max_model_len='abc': vLLM's engine argument max_model_len takes an integer"),
        ({"gpu_memory_utilization": "nan"}, "gpu_memory_utilization='nan': vLLM's engine argument"),
        ({"dtype": "fp64"}, r"dtype='fp64': vLLM's engine argument dtype takes one of \['auto'"),
        ({"enforce_eager": "maybe"}, "enforce_eager='maybe': vLLM's engine argument enforce_eager takes true or false"),
    ],
)
def test_engine_arguments_of_the_wrong_kind_are_named_before_the_engine_starts(args, message):
    from decodebench.models.baseline import Baseline

    with pytest.raises(ValueError, match=message):
        Baseline.check_args({"backend": "vllm", **args})
    Baseline.check_args({"backend": "vllm", "max_model_len": 2048.0, "enforce_eager": True, "dtype": "float32"})
