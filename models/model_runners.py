"""vLLM's two model runners: which one an engine runs, and decodebench's processors under both.

vLLM 0.32 has two model runners. The V2 runner ("MRV2") is its default on CUDA with Triton; the V1 runner
(deprecated upstream) runs elsewhere, the CPU build included, and wherever ``VLLM_USE_V2_MODEL_RUNNER=0`` says so.
Their custom logits processors have different interfaces: V1 builds ``cls(vllm_config, device, is_pin_memory)``
(``vllm.v1.sample.logits_processor.LogitsProcessor``, fed the persistent batch's ``BatchUpdate``), V2 builds
``cls(vllm_config, req_states)`` (``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``, per request slot,
one logits row per draft position). Both load every ``vllm.logits_processors`` entry point into every engine, and
V2's loader refuses a class that is not its subclass, so a V1-only class there stops every engine from starting.

Each processor decodebench registers is therefore a V2 class that also answers V1's construction
(``BothRunners``): built with V1's three arguments, it returns its V1 twin instead. Its module imports no V1
machinery, so V2's frontend stays as light as vLLM keeps it.

An engine that decodebench starts chooses its runner (``model_runner``): ``v1`` or ``v2`` as asked, or ``auto``:
the V1 runner where the method's vLLM pieces live only there (MTAD's and block verification's rules wrap V1's
rejection sampler), vLLM's own choice otherwise. The runner that ran is recorded in the results.
"""

from __future__ import annotations

import importlib
import os
from typing import ClassVar, NamedTuple

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
RUNNERS = ("auto", "v1", "v2")
_ENV_VALUE = {"v1": "0", "v2": "1"}


class BothRunners:
    """Mixin for a V2-interface logits processor that also serves vLLM's V1 runner.

    ``v1_twin`` ("module:Class") names the V1 implementation; it is imported only when V1 builds the processor.
    """

    v1_twin: ClassVar[str]

    def __new__(cls, vllm_config, *args, **kwargs):
        if len(args) + len(kwargs) == 2:  # the V1 runner: (vllm_config, device, is_pin_memory)
            module, _, name = cls.v1_twin.partition(":")
            return getattr(importlib.import_module(module), name)(vllm_config, *args, **kwargs)
        return super().__new__(cls)


def runner_of(vllm_config) -> str:
    """``v1`` or ``v2``: the model runner an engine of this configuration runs."""
    return "v2" if vllm_config.use_v2_model_runner else "v1"


class RunnerNeed(NamedTuple):
    """What a method needs of vLLM's model runner for an engine: ``runner`` (``v1`` or ``v2``) and why; a need that
    is not ``required`` is only what ``auto`` picks (an explicit ``model_runner`` may choose the other one)."""

    runner: str
    why: str
    required: bool = True


def runner_environment(asked: str, need: RunnerNeed | None = None) -> dict[str, str]:
    """The environment variable an engine starts with for the runner ``asked`` (one of ``RUNNERS``) and what the
    method needs of it; ``{}`` leaves vLLM's own choice. A contradiction is a ValueError that names both, before
    anything starts."""
    if asked not in RUNNERS:
        raise ValueError(f"model_runner={asked!r}: one of {list(RUNNERS)}")
    if need is not None and asked not in ("auto", need.runner) and need.required:
        raise ValueError(f"model_runner={asked}: {need.why}, so it needs model_runner={need.runner} (or auto)")
    from_env = os.environ.get(RUNNER_ENV)
    if asked == "auto" and (need is None or (not need.required and from_env is not None)):
        return {}  # vLLM's choice, or the user's own where the method only prefers one
    runner = need.runner if asked == "auto" else asked
    if from_env is not None and from_env.strip() != _ENV_VALUE[runner]:  # vLLM reads it as an integer
        why = need.why if need is not None and need.runner == runner else f"model_runner={asked} was asked"
        raise ValueError(f"{RUNNER_ENV}={from_env} is set, but {why}: unset it, or set it to {_ENV_VALUE[runner]}")
    if runner == "v2":
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:
            raise ValueError(f"{why_v2(need)}vLLM's V2 model runner needs Triton (a GPU build of vLLM); not here")
    return {RUNNER_ENV: _ENV_VALUE[runner]}


def why_v2(need: RunnerNeed | None) -> str:
    return (
        f"{need.why}, so the engine needs vLLM's V2 model runner; " if need is not None and need.runner == "v2" else ""
    )


def start_environment(asked: str, need: RunnerNeed | None = None) -> dict[str, str]:
    """Set the runner's variable in this process's environment (the engine's processes inherit it) and return it."""
    chosen = runner_environment(asked, need)
    os.environ.update(chosen)
    return chosen
