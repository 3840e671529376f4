"""``lm_eval --model lz``: decoding with a repetition penalty, the LZ penalty first among them.

The LZ penalty (Ginart et al.) is ``logits += strength * LZSS codelength`` (kernels/lz.py) over a
sliding window of the generated tokens (``include_prompt=true`` adds the prompt: the reference
implementation leaves it out, since extractive tasks copy from the prompt on purpose). The
industry-standard penalties it is compared with run through the same model, measured the same
way, each with its backend's own implementation: transformers' ``repetition_penalty`` and vLLM's
``repetition_penalty``/``frequency_penalty``; transformers has no frequency penalty, so the
transformers backend uses ``FrequencyPenaltyLogitsProcessor`` (vLLM's definition).

    lm_eval --model lz --tasks ...                                     # alpha 0.15, window 512, buffer 32
    lm_eval --model lz --model_args penalty=frequency,strength=0.3 ...
    lm_eval --model lz --model_args backend=vllm,penalty=repetition,strength=1.2 ...
"""

from __future__ import annotations

import logging
from typing import Any

from decodebench.measure.vllm_counters import DRAFTS
from decodebench.models.lz.config import LZConfig
from decodebench.models.method import Method

log = logging.getLogger(__name__)


# vLLM's V1 model runner builds no custom logits processor into an engine that speculates
# (vllm/v1/sample/logits_processor); its V2 runner keeps them active there
SPECULATION_NEEDS_V2 = (
    "the LZ penalty is a vLLM logits processor, and with speculative decoding only vLLM's V2 model runner applies "
    "one (its V1 runner applies none in an engine that speculates)"
)


class LZ(Method):
    name = "lz"
    label = "repetition penalty: LZ penalty (Ginart et al.) or a standard one"
    Config = LZConfig
    backends = ("hf", "vllm", "served")
    config: LZConfig

    # -- transformers ---------------------------------------------------------------------------
    def hf_generate_kwargs(self, lm, input_ids, attention_mask, kwargs: dict[str, Any]) -> dict[str, Any]:
        from decodebench.models.lz.processors import FrequencyPenaltyLogitsProcessor, LZPenaltyLogitsProcessor

        config = self.config
        processors = list(kwargs.pop("logits_processor", None) or [])
        prompt_width = input_ids.shape[1]
        if config.penalty == "lz":
            prompt_lengths = attention_mask.sum(dim=1) if config.include_prompt else None
            processors.append(LZPenaltyLogitsProcessor(config, prompt_width, prompt_lengths=prompt_lengths))
        elif config.penalty == "frequency":
            processors.append(FrequencyPenaltyLogitsProcessor(config.strength, prompt_width))
        elif config.penalty == "repetition":
            kwargs["repetition_penalty"] = config.strength
        if processors:
            kwargs["logits_processor"] = processors
        return kwargs

    # -- vLLM -----------------------------------------------------------------------------------
    def vllm_engine_args(self, args: dict[str, Any], pretrained: str) -> dict[str, Any]:
        from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor

        # installed, decodebench registers the processor with vLLM, which loads it into every engine
        if self.config.penalty == "lz" and not loaded_by_vllm(LZPenaltyLogitsProcessor):
            raise RuntimeError(
                "decodebench's LZ processor is not registered with vLLM (its vllm.logits_processors entry point is "
                "missing): reinstall decodebench in this environment"
            )
        return args

    def vllm_model_runner(self, engine_args: dict[str, Any]):
        from decodebench.models.model_runners import RunnerNeed

        if self.config.penalty == "lz" and engine_args.get("speculative_config"):
            return RunnerNeed("v2", SPECULATION_NEEDS_V2)
        return None

    def vllm_sampling_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        config = self.config
        if config.penalty == "lz":
            from decodebench.models.lz.request_args import lz_extra_args

            kwargs["extra_args"] = {**(kwargs.get("extra_args") or {}), **lz_extra_args(config)}
        elif config.penalty == "frequency":
            kwargs["frequency_penalty"] = config.strength
        elif config.penalty == "repetition":
            kwargs["repetition_penalty"] = config.strength
        return kwargs

    def summarize(self, records, engine=None) -> dict[str, Any]:
        summary = super().summarize(records, engine)
        if self.config.penalty == "lz" and (engine or {}).get(DRAFTS):
            # a served engine that speculates applies the penalty only on vLLM's V2 runner, which the client cannot see
            summary["applied_if"] = "the server speculates: " + SPECULATION_NEEDS_V2
            log.warning("LZ through a server that speculates: %s", summary["applied_if"])
        return summary


def loaded_by_vllm(processor: type) -> bool:
    """True when vLLM loads this V1 logits processor class by itself: decodebench is installed, and registers it
    under vLLM's ``vllm.logits_processors`` entry point (pyproject.toml), so every engine and ``vllm serve`` has it."""
    from importlib.metadata import entry_points

    target = f"{processor.__module__}:{processor.__name__}"
    return any(entry.value == target for entry in entry_points(group="vllm.logits_processors"))
