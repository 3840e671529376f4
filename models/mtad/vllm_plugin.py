"""MTAD's acceptance rule and block verification inside vLLM's engine, for the requests that ask for them.

vLLM has no plugin point for its acceptance rule: ``vllm/v1/sample/rejection_sampler.py`` chooses between its own
variants inside ``rejection_sample()``. Installing decodebench registers ``register`` under vLLM's
``vllm.general_plugins`` entry point, which every vLLM process runs before its engine starts; on vLLM's V1 model
runner it wraps that function (models/mtad/vllm_v1_rules.py) so that the sampled requests that ask are verified by:

- MTAD (``SamplingParams.extra_args`` ``{"mtad_tau": 0.1}``, ``vllm_xargs`` through ``vllm serve``): Algorithm 1
  (kernels/mtad.py: the longest draft prefix whose joint ratio ``min(1, p / q)`` passes ``tau``, then one token
  from the target), with Appendix F's warping of both p and q (the request's temperature, top-k and top-p; vLLM's
  draft sampling applies the temperature alone, so for MTAD requests the draft is drawn from q warped like p);
- block verification (``{"block_verify": true}``, or every sampled request of an engine whose speculative config
  says ``rejection_sample_method="block"``, which vLLM's V1 runner otherwise ignores): Sun et al.'s Algorithm 2
  (kernels/mtad.py's ``block_verify``), lossless like vLLM's rule;

every other request in the batch keeps vLLM's own rule, untouched. Greedy requests need nothing: with p one-hot,
both rules are greedy speculative decoding, which vLLM's greedy rule already is.

``VerificationRequests``, registered under ``vllm.logits_processors``, checks a request's arguments at admission
(a bad ``tau`` is refused with its value and range) and, on the V1 runner, tracks which batch rows asked for which
rule; it changes no logits. Both rules live in the V1 runner's rejection sampler. vLLM's V2 model runner (its
default on CUDA) samples elsewhere, so there the plugin refuses such requests at admission with what to do instead
(start the engine with ``VLLM_USE_V2_MODEL_RUNNER=0``; block verification is vLLM's own there, engine-wide, with
``rejection_sample_method="block"``), and loads nothing into the engine. The rules run on the vLLM releases they
were validated against (models/vllm_releases.py: 0.32.x and 0.33.x, each wrapped function's signature checked as the
plugin loads): with another release, or one that changed a wrapped function, no wrapper is installed and every such
request is refused, naming the release or the function. This module imports no V1 machinery (vLLM's frontend loads
it to check requests).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import torch
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

from decodebench.models.model_runners import BothRunners
from decodebench.models.mtad.vllm_requests import engine_refusal, requested_rule, version_refusal, wrap_once

if TYPE_CHECKING:
    from vllm import SamplingParams

log = logging.getLogger(__name__)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the rules and the admission check, once per process."""
    if refusal := version_refusal():
        log.warning(refusal)
        return
    from vllm.v1.engine import input_processor

    from decodebench.models.mtad import vllm_v1_rules

    vllm_v1_rules.install()
    wrap_once(input_processor.InputProcessor, "_build_logits_processors_params_validator", with_runner_check)


def plugin_refusal(vllm_config=None) -> str | None:
    """Why requests that ask for MTAD or block verification cannot be verified by them in this engine (another vLLM
    release, or the V2 model runner), or None; installs the rules first."""
    register()
    return engine_refusal(vllm_config)


def with_runner_check(build_validator):
    """vLLM's per-request argument check, refusing on the V2 runner what only the V1 runner can do: a request that
    asks for MTAD, or for block verification in an engine whose own rule is not block verification."""

    @functools.wraps(build_validator)
    def wrapped(self):
        validate = build_validator(self)
        config = self.vllm_config
        if not config.use_v2_model_runner:
            return validate
        spec = config.speculative_config
        engine_blocks = spec is not None and spec.rejection_sample_method == "block"

        def validate_on_v2(params):
            validate(params)
            rule = requested_rule(params) if hasattr(params, "extra_args") else None
            if rule is not None and not (rule.name == "block" and engine_blocks):
                from vllm.exceptions import VLLMValidationError

                raise VLLMValidationError(f"{rule.name} verification was asked: {plugin_refusal(config)}")

        return validate_on_v2

    return wrapped


class VerificationRequests(BothRunners, LogitsProcessor):
    """Checks each request's verification arguments at admission. On vLLM's V2 runner it changes nothing; on the V1
    runner it is ``VerificationRequestsV1`` (vllm_v1_rules.py), which tracks the rows that asked."""

    v1_twin = "decodebench.models.mtad.vllm_v1_rules:VerificationRequestsV1"

    def __init__(self, vllm_config, req_states):
        pass

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        requested_rule(sampling_params)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return False

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        return logits
