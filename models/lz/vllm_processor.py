"""vLLM V1 logits processors (``LLM(logits_processors=[...])``, per request via ``extra_args``).

vLLM condenses and reorders its persistent batch every step, so a processor keeps its state per
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

EXTRA_ARGS_KEY = "lz_penalty"
SETTINGS = ("strength", "window", "buffer", "include_prompt")


@dataclass
class _LZRequest:
    alpha: float
    window: int
    buffer: int
    prompt_tail: list[int]  # the prompt's last `window` tokens, or [] (generated tokens only)
    output_ids: list[int]  # live: vLLM appends every new token

    def history(self) -> list[int]:
        tail = self.output_ids[-self.window :]
        if len(tail) < self.window and self.prompt_tail:
            return (self.prompt_tail + tail)[-self.window :]
        return tail


def lz_extra_args(config: LZConfig) -> dict:
    """What a request's ``SamplingParams.extra_args`` carries to switch the LZ penalty on."""
    return {EXTRA_ARGS_KEY: {name: getattr(config, name) for name in SETTINGS}}


def _config(params: SamplingParams) -> LZConfig | None:
    """The request's LZ settings (checked like ``--model_args``), or None when it does not ask for the penalty."""
    settings = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
    if settings is None:
        return None
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"unknown {EXTRA_ARGS_KEY} settings {sorted(unknown)}; allowed: {list(SETTINGS)}")
    config, _ = LZConfig.parse(settings)
    return config


class LZPenaltyLogitsProcessor(LogitsProcessor):
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
        return _LZRequest(config.strength, config.window, config.buffer, prompt_tail, output_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.requests:
            return logits
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for row, request in self.requests.items():
            groups[(request.window, request.buffer)].append(row)
        for (window, buffer), rows in groups.items():
            tokens, lengths = left_pad([self.requests[row].history() for row in rows], self.device)
            alpha = torch.tensor([self.requests[row].alpha for row in rows], device=logits.device)
            index = torch.tensor(rows, device=logits.device)
            penalized = apply_lz_penalty_(logits.index_select(0, index), tokens, lengths, alpha, window, buffer)
            logits.index_copy_(0, index, penalized)
        return logits
