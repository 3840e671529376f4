"""The LZ penalty as a vLLM V1 logits processor, switched on per request.

Installing decodebench registers it under vLLM's ``vllm.logits_processors`` entry point, so every
vLLM engine loads it, ``vllm serve`` included. A request asks for the penalty through its
``SamplingParams.extra_args`` (``vllm_xargs`` in an OpenAI-compatible request), with flat keys::

    {"lz_penalty": 0.15}                                   # alpha; the other settings default
    {"lz_penalty": 0.15, "lz_window": 512, "lz_buffer": 32, "lz_codelength": "authors",
     "lz_include_prompt": "false"}

checked like ``--model lz``'s arguments (``LZConfig``); a request without ``lz_penalty`` costs
nothing (the processor returns the logits untouched when no row asked for it).

vLLM condenses and reorders its persistent batch every step, so the processor keeps its state per
batch *row* and follows ``BatchUpdate``'s ``added``, ``removed`` and ``moved`` (swaps and
condensing moves) through vLLM's own ``process_dict_updates``; ``output_ids`` in ``added`` is a
live list that vLLM extends as the request generates.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from decodebench.kernels.lz import apply_lz_penalty_, left_pad
from decodebench.models.lz.config import LZConfig

# per-request key -> LZConfig field; `lz_penalty` (the strength) switches the penalty on
EXTRA_ARGS = {
    "lz_penalty": "strength",
    "lz_window": "window",
    "lz_buffer": "buffer",
    "lz_codelength": "codelength",
    "lz_include_prompt": "include_prompt",
}
ENTRY_POINT_GROUP = "vllm.logits_processors"


@dataclass
class _LZRequest:
    alpha: float
    window: int
    buffer: int
    codelength: str
    prompt_tail: list[int]  # the prompt's last `window` tokens, or [] (generated tokens only)
    output_ids: list[int]  # live: vLLM appends every new token

    def history(self) -> list[int]:
        tail = self.output_ids[-self.window :]
        if len(tail) < self.window and self.prompt_tail:
            return (self.prompt_tail + tail)[-self.window :]
        return tail


def lz_extra_args(config: LZConfig) -> dict:
    """What a request's ``SamplingParams.extra_args`` carries to switch the LZ penalty on."""
    return {key: getattr(config, field) for key, field in EXTRA_ARGS.items()}


def _config(params: SamplingParams) -> LZConfig | None:
    """The request's LZ settings (checked like ``--model_args``), or None when it does not ask for the penalty."""
    extra = params.extra_args or {}
    settings = {key: value for key, value in extra.items() if key.startswith("lz_")}
    if not settings:
        return None
    unknown = sorted(set(settings) - set(EXTRA_ARGS))
    if unknown:
        raise ValueError(f"unknown LZ penalty settings {unknown}; allowed: {list(EXTRA_ARGS)}")
    if "lz_penalty" not in settings:
        raise ValueError(f"LZ penalty settings {sorted(settings)} without lz_penalty, which switches it on")
    config, _ = LZConfig.parse({EXTRA_ARGS[key]: value for key, value in settings.items()})
    return config


def loaded_by_vllm() -> bool:
    """True when vLLM loads this processor by itself (decodebench installed with its entry point)."""
    from importlib.metadata import entry_points

    target = f"{__name__}:{LZPenaltyV1LogitsProcessor.__name__}"
    return any(entry.value == target for entry in entry_points(group=ENTRY_POINT_GROUP))


class LZPenaltyV1LogitsProcessor(LogitsProcessor):
    """The LZ penalty (kernels/lz.py) for the requests whose ``extra_args`` ask for it."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        self.requests: dict[int, _LZRequest] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        _config(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes greedy decoding, so vLLM must not skip it

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.requests, batch_update, self._new_request)

    @staticmethod
    def _new_request(params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]):
        config = _config(params)
        if config is None or config.strength == 0:
            return None
        prompt_tail = list(prompt_ids or [])[-config.window :] if config.include_prompt else []
        return _LZRequest(config.strength, config.window, config.buffer, config.codelength, prompt_tail, output_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.requests:
            return logits
        groups: dict[tuple[int, int, str], list[int]] = defaultdict(list)
        for row, request in self.requests.items():
            groups[(request.window, request.buffer, request.codelength)].append(row)
        for (window, buffer, codelength), rows in groups.items():
            tokens, lengths = left_pad([self.requests[row].history() for row in rows], self.device)
            alpha = torch.tensor([self.requests[row].alpha for row in rows], device=logits.device)
            index = torch.tensor(rows, device=logits.device)
            selected = logits.index_select(0, index)
            penalized = apply_lz_penalty_(selected, tokens, lengths, alpha, window, buffer, codelength)
            logits.index_copy_(0, index, penalized)
        return logits
