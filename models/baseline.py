"""``lm_eval --model baseline``: plain decoding, measured exactly like every method.

Greedy or sampled as the task's ``gen_kwargs`` say (``do_sample``, ``temperature``, ``top_p``,
...), with the backend's own sampler: ``model.generate`` on transformers, the engine's sampler
on vLLM. Every speed ratio in a decodebench report is taken against this model on the same
backend, pretrained model, task configuration and machine.
"""

from __future__ import annotations

from decodebench.models.method import Method


class Baseline(Method):
    name = "baseline"
    label = "plain decoding (reference for speed ratios)"
    backends = ("hf", "vllm", "served")
