"""``lm_eval --model baseline``: plain decoding, measured exactly like every method.

Greedy or sampled as the task's ``gen_kwargs`` say (``do_sample``, ``temperature``, ``top_p``,
...), with the backend's own sampler: ``model.generate`` on transformers, the engine's sampler
on vLLM. Every speed ratio in a decodebench report is taken against this model on the same
backend, pretrained model and machine.
"""

from __future__ import annotations

from typing import ClassVar

from decodebench.models.base import DecodeBenchLM
from decodebench.models.hf import HFBackend


class BaselineMethod(DecodeBenchLM):
    method = "baseline"
    method_label = "plain decoding (reference for speed ratios)"
    backends: ClassVar[dict[str, str]] = {
        "hf": "decodebench.models.baseline:Baseline",
        "vllm": "decodebench.models.vllm:BaselineVLLM",
    }


class Baseline(BaselineMethod, HFBackend):
    """``--model baseline`` on the transformers backend."""
