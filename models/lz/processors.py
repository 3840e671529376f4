"""transformers LogitsProcessors for the repetition penalties, one small processor per idea.

Both see a left-padded batch whose prompts all end at column ``prompt_width`` (lm-eval's
batches), so the generated tokens of every row are ``input_ids[:, prompt_width:]``. Both are
pure functions of ``input_ids``, so they stay correct when transformers calls them at draft
positions that are later rejected (assisted generation).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from decodebench.kernels.lz import apply_lz_penalty_
from decodebench.models.lz.config import LZConfig


class LZPenaltyLogitsProcessor(LogitsProcessor):
    """The LZ penalty: ``logits += alpha * LZSS codelength`` (kernels/lz.py, paper eq. 3).

    The window holds the generated tokens only, unless ``prompt_lengths`` is given: then the
    prompt's tokens (``prompt_lengths[i]`` real tokens at the end of row i's left-padded prompt)
    come first, as if they had been generated.

    Args:
        config: strength (alpha), window, buffer and codelength (checked by ``LZConfig``).
        prompt_width: columns of ``input_ids`` taken by the (left-padded) prompts.
        prompt_lengths: per-row real prompt lengths [B], to include the prompt in the window.
    """

    def __init__(self, config: LZConfig, prompt_width: int, prompt_lengths: torch.Tensor | None = None):
        self.config = config
        self.prompt_width = prompt_width
        self.prompt_lengths = prompt_lengths

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        config = self.config
        generated = input_ids.shape[1] - self.prompt_width
        if self.prompt_lengths is None:
            history = input_ids[:, self.prompt_width :]
            lengths = torch.full((input_ids.shape[0],), generated, device=input_ids.device)
        else:
            history = input_ids
            lengths = self.prompt_lengths.to(input_ids.device) + generated
        history = history[:, -config.window :]
        return apply_lz_penalty_(
            scores, history, lengths, config.strength, config.window, config.buffer, config.codelength
        )


class FrequencyPenaltyLogitsProcessor(LogitsProcessor):
    """The frequency penalty of OpenAI's and vLLM's samplers, which transformers lacks.

    ``logits[v] -= penalty * (times v was generated so far)``; the prompt does not count.
    """

    def __init__(self, penalty: float, prompt_width: int):
        self.penalty = penalty
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_width :]
        if generated.shape[1] == 0 or self.penalty == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.penalty * counts
