"""Row-by-row decoding on the transformers backend, for methods with their own loop (MTAD, nugget).

``RowDecodingMethod.hf_decode`` strips each row's left padding and calls the method's
``decode_row(lm, prompt, stop, sampler)``, which returns (new tokens, statistics, first-token
timestamp). ``RowStop`` holds HFLM's stopping rules for one row; ``Sampler`` holds the sampling
settings ``model.generate`` would use (``HFBackend.decoding_settings``: the task's, the method's,
the model's and transformers' defaults, in that order), so that a row-decoding method samples
from the distribution its baseline samples from, and warps logits with transformers' own temperature, top-k and top-p
processors (the order of Appendix F: temperature, then top-k, then top-p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from decodebench.models.method import DecodeOutput, Method


@dataclass
class Sampler:
    """Sampling from warped logits; ``None`` in place of a Sampler means greedy decoding."""

    temperature: float
    top_k: int | None
    top_p: float | None
    generator: torch.Generator | None = None

    @classmethod
    def from_decoding(cls, decoding: dict, generator: torch.Generator | None) -> Sampler | None:
        """None for greedy decoding, else the settings of a ``decoding_record`` (the backend's, defaults included)."""
        if not decoding["do_sample"]:
            return None
        return cls(decoding["temperature"], decoding["top_k"], decoding["top_p"], generator)

    def _warpers(self) -> LogitsProcessorList:
        warpers = LogitsProcessorList()
        if self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            warpers.append(TopKLogitsWarper(int(self.top_k)))
        if self.top_p is not None and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(self.top_p)))
        return warpers

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped log-probabilities [..., V], ``-inf`` outside the kept set."""
        flat = logits.reshape(-1, logits.shape[-1]).float()
        return torch.log_softmax(self._warpers()(None, flat), dim=-1).reshape(logits.shape)

    def sample(self, logits: torch.Tensor) -> int:
        return int(torch.multinomial(self.logprobs(logits).exp(), 1, generator=self.generator))


def choose(logits: torch.Tensor, sampler: Sampler | None) -> int:
    """The next token: argmax, or a sample from the warped distribution."""
    return int(logits.argmax()) if sampler is None else sampler.sample(logits)


class RowStop:
    """HFLM's stopping rules for one row: max_gen_toks, an EOS token, or a stop sequence."""

    def __init__(self, lm, stop: list[str], max_new: int):
        self.lm = lm
        self.stops = [s for s in stop if s]
        self.max_new = max_new
        self.eos = lm.eos_ids()

    def eos_position(self, tokens: list[int]) -> int | None:
        return next((i for i, t in enumerate(tokens) if t in self.eos), None)

    def finished(self, generated: list[int]) -> bool:
        if len(generated) >= self.max_new or self.eos_position(generated) is not None:
            return True
        if not self.stops:
            return False
        tail = self.lm.tok_decode(generated[-(max(map(len, self.stops)) + 16) :])
        return any(s in tail for s in self.stops)

    def truncate(self, generated: list[int]) -> list[int]:
        """Cut after the first EOS and at max_new tokens (a draft may overshoot both)."""
        eos = self.eos_position(generated)
        end = min(len(generated), self.max_new, eos + 1 if eos is not None else len(generated))
        return generated[:end]


class RowDecodingMethod(Method):
    """A method that decodes each row of a batch with its own loop (the papers' batch-1 setting)."""

    generator: torch.Generator | None = None

    def decode_row(self, lm, prompt: list[int], stop: RowStop, sampler: Sampler | None):
        raise NotImplementedError

    def hf_decode(self, lm, input_ids, attention_mask, *, stop, max_new_tokens, kwargs) -> DecodeOutput:
        sampler = Sampler.from_decoding(lm.decoding_settings(kwargs, self.sampling_defaults), self.generator)
        rows, stats, first = [], [], None
        for row in range(input_ids.shape[0]):
            prompt = input_ids[row][attention_mask[row].bool()].tolist()
            tokens, row_stats, first_at = self.decode_row(lm, prompt, RowStop(lm, stop, max_new_tokens), sampler)
            rows.append(tokens)
            stats.append(row_stats)
            first = first or first_at
        return DecodeOutput(tokens=rows, first_token_at=first, row_stats=stats)
