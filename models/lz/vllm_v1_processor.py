"""The LZ penalty as a logits processor of vLLM's V1 model runner (the V2 runner's is in ``vllm_processor.py``).

vLLM's V1 runner builds this class through ``LZPenaltyLogitsProcessor``, the one decodebench registers under
``vllm.logits_processors`` (models/model_runners.py). Requests switch it on as described there.

State lives on the device, as vLLM's builtin processors keep theirs: one right-aligned history row
``[width]`` per batch row (the request's last ``window`` tokens, PAD before them) and its length.
vLLM condenses and reorders its persistent batch every step; ``update_state`` follows
``BatchUpdate``'s ``removed``, ``added`` and ``moved`` (in that order, as vLLM asks) by moving
device rows, and appends each request's new tokens (``output_ids`` in ``added`` is a live list
that vLLM extends as the request generates) with one small host-to-device copy per step, pinned and
non-blocking (vLLM's ``async_tensor_h2d``): the host never waits for the device. No step rebuilds a
history from Python lists.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from vllm import SamplingParams
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from decodebench.kernels.lz import PAD, apply_lz_penalty_
from decodebench.models.lz.config import LZConfig
from decodebench.models.lz.request_args import request_config


@dataclass
class _LZRow:
    config: LZConfig
    output_ids: list[int]  # live: vLLM appends every new token
    seen: int = 0  # how many of output_ids are in the device history


class LZPenaltyV1LogitsProcessor(LogitsProcessor):
    """The LZ penalty (kernels/lz.py) for the requests whose ``extra_args`` ask for it (vLLM's V1 interface)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = torch.device(device)
        self.rows: dict[int, _LZRow] = {}  # batch row -> its request, for the rows that asked
        # [batch rows, width] right-aligned token history and [batch rows] lengths; grown on demand
        self.history = torch.full((0, 0), PAD, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)
        self._groups: list[tuple[LZConfig, torch.Tensor | slice, torch.Tensor]] | None = None

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        request_config(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes greedy decoding, so vLLM must not skip it

    # -- state --------------------------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            self._follow(batch_update)
        if self.rows:
            self._append_new_tokens()

    def _follow(self, update: BatchUpdate) -> None:
        for index in update.removed:
            if self.rows.pop(index, None) is not None:
                self._groups = None
        for index, params, prompt_ids, output_ids in update.added:
            self._groups = None
            config = request_config(params)
            if config is None or config.strength == 0:
                self.rows.pop(index, None)
                continue
            self._reserve(index + 1, config.window)
            self.rows[index] = _LZRow(config, output_ids)
            tail = list(prompt_ids or [])[-config.window :] if config.include_prompt else []
            self.history[index] = PAD
            if tail:
                self.history[index, -len(tail) :] = async_tensor_h2d(tail, self.device, torch.long)
            self.lengths[index] = len(tail)
        for a, b, direction in update.moved:
            self._groups = None
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            swap = direction == MoveDirectionality.SWAP
            if swap and row_b is not None:
                self.rows[a] = row_b
            if row_a is not None or (swap and row_b is not None):  # other rows' device state is never read
                self._reserve(max(a, b) + 1, 0)
                target = async_tensor_h2d([b, a] if swap else [b], self.device, torch.long)
                source = async_tensor_h2d([a, b] if swap else [a], self.device, torch.long)
                self.history[target] = self.history[source]
                self.lengths[target] = self.lengths[source]

    def _reserve(self, rows: int, width: int) -> None:
        """Grow the device state to at least ``rows`` x ``width`` (widening keeps histories right-aligned)."""
        old_rows, old_width = self.history.shape
        if rows <= old_rows and width <= old_width:
            return
        new_rows, new_width = max(rows, 2 * old_rows), max(width, old_width)
        history = torch.full((new_rows, new_width), PAD, dtype=torch.long, device=self.device)
        history[:old_rows, new_width - old_width :] = self.history
        lengths = torch.zeros(new_rows, dtype=torch.long, device=self.device)
        lengths[:old_rows] = self.lengths
        self.history, self.lengths = history, lengths

    def _append_new_tokens(self) -> None:
        """Shift each row's history left by its new tokens and write them at its end: one copy per step
        for the rows that gained the same number of tokens (one each, without speculative decoding)."""
        width = self.history.shape[1]
        by_count: dict[int, tuple[list[int], list[list[int]]]] = defaultdict(lambda: ([], []))
        for index, row in self.rows.items():
            new = row.output_ids[row.seen :]
            if new:
                row.seen += len(new)
                rows, tokens = by_count[min(len(new), width)]
                rows.append(index)
                tokens.append(new[-width:])
        for count, (rows, tokens) in by_count.items():
            index = async_tensor_h2d(rows, self.device, torch.long)
            new = async_tensor_h2d(tokens, self.device, torch.long)
            self.history[index] = torch.cat([self.history[index, count:], new], dim=1)
            self.lengths[index] += count

    # -- logits -------------------------------------------------------------------------------
    def _row_groups(self) -> list[tuple[LZConfig, torch.Tensor | slice, torch.Tensor]]:
        """Rows that share window, buffer and codelength (one kernel call each), with their alphas; rows
        0..k-1 in order (every row of a batch whose requests all ask alike) as a slice, read without copies."""
        if self._groups is None:
            grouped: dict[tuple[int, int, str], list[int]] = defaultdict(list)
            for index, row in sorted(self.rows.items()):
                grouped[(row.config.window, row.config.buffer, row.config.codelength)].append(index)
            self._groups = []
            for rows in grouped.values():
                alphas = async_tensor_h2d([self.rows[i].config.strength for i in rows], self.device, torch.float32)
                in_order = rows == list(range(len(rows)))
                where = slice(0, len(rows)) if in_order else async_tensor_h2d(rows, self.device, torch.long)
                self._groups.append((self.rows[rows[0]].config, where, alphas))
        return self._groups

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        for config, rows, alpha in self._row_groups():
            if isinstance(rows, slice):  # views: the kernel adds the penalty to these rows of `logits` in place
                apply_lz_penalty_(
                    logits[rows], self.history[rows, -config.window :], self.lengths[rows], alpha, *_sizes(config)
                )
                continue
            rows = rows.to(logits.device)
            penalized = apply_lz_penalty_(
                logits.index_select(0, rows),
                self.history.index_select(0, rows)[:, -config.window :],
                self.lengths.index_select(0, rows),
                alpha,
                *_sizes(config),
            )
            logits.index_copy_(0, rows, penalized)
        return logits


def _sizes(config: LZConfig) -> tuple[int, int, str]:
    return config.window, config.buffer, config.codelength
