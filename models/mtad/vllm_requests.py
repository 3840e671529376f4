"""What a request asks of decodebench's verification rules in vLLM (MTAD, block verification), and why an engine
may refuse it: read by the admission check (vllm_plugin.py) and by the V1 model runner's rules (vllm_v1_rules.py)
alike, so that neither imports the other's machinery. No V1 machinery is imported here (vLLM's frontend reads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodebench.models.model_runners import RUNNER_ENV

if TYPE_CHECKING:
    from vllm import SamplingParams

MTAD_ARG = "mtad_tau"
BLOCK_ARG = "block_verify"
# set on each vLLM function decodebench wraps, so that a second install wraps nothing twice
PATCHED = "_decodebench_verification"


@dataclass(frozen=True)
class Rule:
    """How a request's drafts are verified: ``mtad`` (with its ``tau``) or ``block``."""

    name: str
    tau: float | None = None


def version_refusal() -> str | None:
    """Why this vLLM cannot run the rules (a release outside those they were validated against, or one that changed a
    function they wrap: models/vllm_releases.py), or None."""
    from decodebench.models.vllm_releases import verification_refusal

    return verification_refusal()


def wrap_once(owner, name: str, wrapper) -> None:
    """``owner.name = wrapper(owner.name)``, marked with PATCHED, unless decodebench has wrapped it already."""
    current = getattr(owner, name)
    if not getattr(current, PATCHED, False):
        wrapped = wrapper(current)
        setattr(wrapped, PATCHED, True)
        setattr(owner, name, wrapped)


def requested_rule(params: SamplingParams) -> Rule | None:
    """The verification rule a request asks for, or None; a bad argument is a ValueError naming it and what is
    allowed."""
    extra = params.extra_args or {}
    # a misspelt setting (mtad_tauu) would otherwise leave the request on vLLM's own rule without a word
    unknown = sorted(key for key in extra if key.startswith(("mtad", "block")) and key not in (MTAD_ARG, BLOCK_ARG))
    if unknown:
        raise ValueError(f"unknown verification settings {unknown}; allowed: {[MTAD_ARG, BLOCK_ARG]}")
    tau, block = extra.get(MTAD_ARG), extra.get(BLOCK_ARG)
    if tau is None and block is None:
        return None
    if refusal := version_refusal():
        raise ValueError(refusal)
    if block is not None and str(block).lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"{BLOCK_ARG}={block!r}: must be true or false")
    block = str(block).lower() in ("true", "1")
    if tau is None:
        return Rule("block") if block else None
    if block:
        raise ValueError(f"{MTAD_ARG} and {BLOCK_ARG} both given: a request is verified by one rule")
    try:
        value = float(tau)
    except (TypeError, ValueError):
        raise ValueError(f"{MTAD_ARG}={tau!r}: must be a number in [0, 1)") from None
    if not (math.isfinite(value) and 0 <= value < 1):
        raise ValueError(f"{MTAD_ARG}={tau!r}: must be a number in [0, 1) (the paper's: 0.1)")
    return Rule("mtad", value)


def engine_refusal(vllm_config=None) -> str | None:
    """Why requests that ask for MTAD or block verification cannot be verified by them in this engine (another vLLM
    release, or the V2 model runner), or None."""
    if refusal := version_refusal():
        return refusal
    if vllm_config is not None and vllm_config.use_v2_model_runner:
        return (
            "this engine runs vLLM's V2 model runner, whose sampler decodebench's verification rules (MTAD, block) do "
            f"not wrap; start it with {RUNNER_ENV}=0 (decodebench's own engines do: model_runner=auto), or, for block "
            "verification alone, use vLLM's own on this runner (speculative_config rejection_sample_method=block)"
        )
    return None
