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

from typing import Any, ClassVar

import torch

from decodebench.kernels.lz import check_lz_sizes
from decodebench.models.base import Arg, DecodeBenchLM
from decodebench.models.hf import HFBackend
from decodebench.models.processors import FrequencyPenaltyLogitsProcessor, LZPenaltyLogitsProcessor

PENALTIES = ("lz", "frequency", "repetition", "none")
DEFAULT_STRENGTH = {"lz": 0.15, "frequency": 0.3, "repetition": 1.2, "none": 0.0}


def _non_negative(value: float) -> str | None:
    return "must be >= 0" if value < 0 else None


class LZMethod(DecodeBenchLM):
    method = "lz"
    method_label = "repetition penalty: LZ penalty (Ginart et al., eq. 14) or a standard one"
    backends: ClassVar[dict[str, str]] = {
        "hf": "decodebench.models.lz:LZ",
        "vllm": "decodebench.models.vllm:LZVLLM",
    }
    method_args: ClassVar[dict[str, Arg]] = {
        "penalty": Arg(
            str, "lz", "lz (the paper's), frequency, repetition (the backend's own), or none", choices=PENALTIES
        ),
        "strength": Arg(
            float,
            None,
            "alpha for lz (default 0.15), the frequency penalty (0.3), or the repetition penalty factor (1.2; 1 = off)",
            check=_non_negative,
        ),
        "window": Arg(int, 512, "LZ window: how many past tokens the compressor searches"),
        "buffer": Arg(int, 32, "LZ look-ahead buffer: the longest match, in tokens"),
        "include_prompt": Arg(bool, False, "let the LZ window see the prompt, not only generated tokens"),
    }

    @classmethod
    def check_method_args(cls, values: dict[str, Any]) -> dict[str, Any]:
        if values["strength"] is None:
            values["strength"] = DEFAULT_STRENGTH[values["penalty"]]
        if values["penalty"] == "repetition" and values["strength"] < 1:
            raise ValueError(f"strength={values['strength']}: the repetition penalty factor must be >= 1 (1 = off)")
        check_lz_sizes(values["window"], values["buffer"])
        return values


class LZ(LZMethod, HFBackend):
    """``--model lz`` on the transformers backend."""

    def prepare_generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        config = self.method_config
        penalty, strength = config["penalty"], config["strength"]
        processors = list(generation_kwargs.pop("logits_processor", None) or [])
        prompt_width = input_ids.shape[1]
        if penalty == "lz":
            processors.append(
                LZPenaltyLogitsProcessor(
                    strength,
                    config["window"],
                    config["buffer"],
                    prompt_width,
                    prompt_lengths=attention_mask.sum(dim=1) if config["include_prompt"] else None,
                )
            )
        elif penalty == "frequency":
            processors.append(FrequencyPenaltyLogitsProcessor(strength, prompt_width))
        elif penalty == "repetition":
            generation_kwargs["repetition_penalty"] = strength
        if processors:
            generation_kwargs["logits_processor"] = processors
        return generation_kwargs
