"""The LZ penalty as a vLLM logits processor, switched on per request, on either of vLLM's model runners.

Installing decodebench registers ``LZPenaltyLogitsProcessor`` under vLLM's ``vllm.logits_processors`` entry point,
so every vLLM engine loads it, ``vllm serve`` included. It is a processor of vLLM's V2 model runner, the default on
CUDA; vLLM's V1 runner (the CPU build, or ``VLLM_USE_V2_MODEL_RUNNER=0``) gets its twin in ``vllm_v1_processor.py``
(models/model_runners.py). A request asks for the penalty through its ``SamplingParams.extra_args`` (``vllm_xargs``
in an OpenAI-compatible request), with flat keys::

    {"lz_penalty": 0.15}                                   # alpha; the other settings default
    {"lz_penalty": 0.15, "lz_window": 512, "lz_buffer": 32, "lz_codelength": "authors",
     "lz_include_prompt": "false"}

checked like ``--model lz``'s arguments (``LZConfig``, whose bounds cap each request's cost); a request without
``lz_penalty`` costs nothing (the processor leaves the logits alone when no request of the batch asked for it).

On the V2 runner the history is read where vLLM keeps it: a request's committed tokens in ``all_token_ids`` (up to
``total_len``) and, under speculative decoding, the draft tokens before each draft position in the step's
``input_ids`` (a request has one logits row per draft position, and each row is penalized for the history it
continues). The V2 runner keeps custom processors active when the engine speculates, so the penalty also applies
on a server that drafts (the V1 runner builds no custom processor there). Nothing here synchronizes with the host:
which requests asked is known on the host, the rows of a group of requests are selected on the device with a bound
known on the host.

This module imports no V1 machinery: vLLM's frontend loads it to check each request's arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

from decodebench.kernels.lz import CODELENGTHS, PAD, apply_lz_penalty_
from decodebench.models.lz.config import LZConfig
from decodebench.models.lz.request_args import request_config
from decodebench.models.model_runners import BothRunners

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState


def group_key(config: LZConfig) -> int:
    """One integer per (window, buffer, codelength): requests that share it share a kernel call."""
    return (config.window * 1024 + config.buffer) * len(CODELENGTHS) + CODELENGTHS.index(config.codelength)


def group_sizes(key: int) -> tuple[int, int, str]:
    """(window, buffer, codelength) of a ``group_key``."""
    sizes, code = divmod(key, len(CODELENGTHS))
    window, buffer = divmod(sizes, 1024)
    return window, buffer, CODELENGTHS[code]


class LZPenaltyLogitsProcessor(BothRunners, LogitsProcessor):
    """The LZ penalty (kernels/lz.py) for the requests whose ``extra_args`` ask for it (vLLM's V2 interface; vLLM's
    V1 runner builds ``LZPenaltyV1LogitsProcessor`` through this class)."""

    v1_twin = "decodebench.models.lz.vllm_v1_processor:LZPenaltyV1LogitsProcessor"

    def __init__(self, vllm_config, req_states: LogitsProcRequestState):
        from vllm.v1.worker.gpu.buffer_utils import UvaBackedTensor

        self.req_states = req_states
        slots = req_states.max_num_reqs
        # per request slot: .np on the host (which requests asked, and how), .gpu on the device (what the kernel reads)
        self.alpha = UvaBackedTensor(slots, dtype=torch.float32)
        self.keys = UvaBackedTensor(slots, dtype=torch.int64)  # group_key, -1: no penalty
        self.keys.np[:] = -1
        self.prompt_too = UvaBackedTensor(slots, dtype=torch.int32)  # 1: the window also sees the prompt

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        request_config(sampling_params)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        config = request_config(sampling_params)
        asked = config is not None and config.strength != 0
        self.keys.np[req_idx] = group_key(config) if asked else -1
        self.alpha.np[req_idx] = config.strength if asked else 0.0
        self.prompt_too.np[req_idx] = int(asked and config.include_prompt)
        return asked

    def apply_staged_writes(self) -> None:
        self.alpha.copy_to_uva()
        self.keys.copy_to_uva()
        self.prompt_too.copy_to_uva()

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        groups = self.keys.np[ctx.idx_mapping_np]
        present = np.unique(groups[groups >= 0])
        if present.size == 0:
            return logits
        num_rows = logits.shape[0]
        for key in present.tolist():  # host values: no device synchronization
            requests = int((groups == key).sum())
            if requests == len(groups):  # every request of the batch: every row, in place
                rows = torch.arange(num_rows, device=logits.device)
                self._penalize(logits, rows, ctx, key)
                continue
            # every request has at least one row: the group's rows are at most the rest of the batch's rows
            rows = self._rows_of(key, ctx, num_rows - (len(groups) - requests))
            penalized = self._penalize(logits.index_select(0, rows), rows, ctx, key)
            logits.index_copy_(0, rows, penalized)
        return logits

    def _rows_of(self, key: int, ctx: LogitsContext, bound: int) -> torch.Tensor:
        """The logits rows of the requests in group ``key``, ``bound`` of them: the places past the group's rows
        repeat its first row, so that writing every place back writes that row twice with the same values."""
        in_group = self.keys.gpu[ctx.expanded_idx_mapping.long()] == key
        rows = torch.nonzero_static(in_group, size=bound, fill_value=-1).squeeze(-1)
        return torch.where(rows >= 0, rows, rows[:1].clamp(min=0))

    def _penalize(self, logits: torch.Tensor, rows: torch.Tensor, ctx: LogitsContext, key: int) -> torch.Tensor:
        """``logits`` (the ``rows`` of the batch's logits) with each row's penalty added in place."""
        window, buffer, codelength = group_sizes(key)
        slots = ctx.expanded_idx_mapping.long()[rows]
        history, lengths = self._histories(rows, slots, ctx, window)
        # a row outside the group (the repeated first row of a group that has none here) gets alpha 0
        alpha = torch.where(self.keys.gpu[slots] == key, self.alpha.gpu[slots], 0.0)
        return apply_lz_penalty_(logits, history, lengths, alpha, window, buffer, codelength)

    def _histories(self, rows, slots, ctx: LogitsContext, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's last ``window`` tokens, right-aligned ([R, window], PAD before them), and how many are real.

        A row at draft position ``k`` of its request continues the request's committed tokens followed by the
        step's first ``k`` draft tokens; vLLM keeps the former in ``all_token_ids`` and the latter in ``input_ids``
        after the request's first row (whose input is the last committed token)."""
        state = self.req_states
        local = ctx.expanded_local_pos.long()[rows]
        committed = state.total_len.gpu.long()[slots]
        start = torch.where(self.prompt_too.gpu[slots] > 0, 0, state.prompt_len.gpu.long()[slots])
        end = committed + local
        position = end[:, None] - window + torch.arange(window, device=rows.device)[None]  # [R, window]
        stored = state.all_token_ids.gpu
        from_store = stored[slots[:, None], position.clamp(0, stored.shape[1] - 1)].long()
        draft_index = (rows - local)[:, None] + 1 + (position - committed[:, None])
        from_drafts = ctx.input_ids.long()[draft_index.clamp(0, ctx.input_ids.shape[0] - 1)]
        tokens = torch.where(position < committed[:, None], from_store, from_drafts)
        history = torch.where(position >= start[:, None], tokens, torch.full_like(tokens, PAD))
        return history, (end - start).clamp(0, window)
