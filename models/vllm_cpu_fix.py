"""A fix for vLLM 0.32.0's CPU build: speculative *sampling* there draws from a broken target distribution.

vLLM's rejection sampler spreads each request's temperature (and top-p) over its draft positions with
``expand_batch_to_tokens``. On a CPU without Triton, vLLM 0.32.0 runs a C++ fallback for it
(``vllm/utils/cpu_triton_utils.py``'s ``_expand_kernel_impl``) that casts the output tensor to int64 and writes
into that copy: a float tensor (temperature, top-p) is left as allocated, uninitialized. The target's logits are
then divided by whatever the memory held (measured here: the target's distribution flat or infinite, sampled
text made of random tokens, any draft accepted about 1% of the time), while greedy decoding, which skips that
step, is right. Installed, decodebench registers ``register`` under ``vllm.general_plugins``; on that release on
a CPU it replaces the function with the same expansion in plain torch. Every other release and platform is left
alone.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

BROKEN_RELEASE = "0.32.0"


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """[batch] -> [num_tokens]: each request's value repeated over its tokens (``cu_num_tokens`` ends each
    request's), ``replace_from`` replaced by ``replace_to``; vLLM's function, in torch."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return values.repeat_interleave(counts.to(values.device), output_size=num_tokens)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the fix where it applies, once per process."""
    import vllm
    from vllm.platforms import current_platform

    if vllm.__version__.split("+")[0] != BROKEN_RELEASE or not current_platform.is_cpu():
        return
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # Triton's own kernel runs: no fallback, nothing to fix
        return
    from vllm.v1.sample import rejection_sampler

    if rejection_sampler.expand_batch_to_tokens is not expand_batch_to_tokens:
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
        log.info("decodebench: vLLM %s's CPU expand kernel replaced (speculative sampling)", BROKEN_RELEASE)
