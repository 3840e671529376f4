"""Fixes for vLLM 0.32.0's CPU build (and 0.33.0's Python files, whose fallbacks are the same), whose speculative
decoding runs C++ fallbacks of the rejection sampler's Triton kernels (``vllm/utils/cpu_triton_utils.py``) that
differ from them:

- ``expand_batch_to_tokens`` (each request's temperature and top-p spread over its draft positions) casts the output
  to int64 and writes into that copy: a float tensor is left as allocated, uninitialized. The target's logits are
  then divided by whatever the memory held (measured here: the target's distribution flat or infinite, sampled text
  made of random tokens, any draft accepted about 1% of the time), while greedy decoding, which skips that step, is
  right.
- the acceptance kernels keep a draft position marked -1 (a token a grammar refused, under structured outputs) as if
  it were a token, and emit -1 where a real token belongs (vLLM's own test
  ``test_placeholder_draft_token_rejected_random`` fails on that build); and they assert on synthetic acceptance
  (``rejection_sample_method="synthetic"``), which the Triton kernels implement.

- its start-up scan of every loaded module for references to those kernels (``_rebind_kernels`` in
  ``vllm/triton_utils/dispatcher.py``, run as each worker starts) reads ``vars(value).get("kernel")`` of every module
  attribute, and llvmlite's ``ffi.lib`` (numba's) answers ``__dict__`` with a wrapped C function: no engine starts
  in a process that imported numba first (vLLM's own n-gram drafter imports it: a second engine after one that
  drafted from the context, or a script that imports numba, whose module a spawned worker imports again).

Installed, decodebench registers ``register`` under ``vllm.general_plugins``; on those releases on a CPU without
Triton it replaces the three with the Triton kernels' rules written in plain torch, and gives the scan a ``vars``
that reads such an object as holding no kernel. Every other release and platform is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

log = logging.getLogger(__name__)

# the releases whose CPU fallbacks are wrong as described above (0.33.0's utils/cpu_triton_utils.py is 0.32.0's)
BROKEN_RELEASES = ("0.32.0", "0.33.0")
PLACEHOLDER = -1


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """[batch] -> [num_tokens]: each request's value repeated over its tokens (``cu_num_tokens`` ends each
    request's), ``replace_from`` replaced by ``replace_to``; vLLM's function, in torch."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return values.repeat_interleave(counts.to(values.device), output_size=num_tokens)


def _layout(cu_num_draft_tokens: torch.Tensor, max_spec_len: int, num_tokens: int):
    """vLLM's flattened drafts as [batch, S] (S = max_spec_len, at least 1): (counts [B], flat index [B, S], real
    position [B, S])."""
    ends = cu_num_draft_tokens.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    positions = torch.arange(max(max_spec_len, 1), device=ends.device)
    index = ((ends - counts)[:, None] + positions[None]).clamp(0, max(num_tokens - 1, 0))
    return counts, index, positions[None] < counts[:, None]


def _at(values: torch.Tensor, index: torch.Tensor, *more) -> torch.Tensor:
    """``values[index, *more]``, or -1s when nothing was drafted (empty ``values``)."""
    if values.shape[0] == 0:
        return torch.full(index.shape, PLACEHOLDER, dtype=values.dtype, device=index.device)
    return values[(index, *more)]


def _write(output, rows, counts, accepted, emitted, bonus_token_ids) -> None:
    """The Triton kernels' output for ``rows`` [B] (bool): the emitted tokens up to and including the first position
    not accepted, or every draft token then the bonus token; -1 after."""
    _batch, spec = accepted.shape
    positions = torch.arange(spec, device=accepted.device)[None]
    refused = ~accepted & (positions < counts[:, None])
    first = torch.where(refused.any(dim=-1), refused.int().argmax(dim=-1), counts)
    tokens = torch.where(positions <= first[:, None], emitted, torch.full_like(emitted, PLACEHOLDER))
    tokens = torch.where(positions < counts[:, None], tokens, torch.full_like(tokens, PLACEHOLDER))
    full = torch.nn.functional.pad(tokens, (0, max(output.shape[1] - spec, 0)), value=PLACEHOLDER)[:, : output.shape[1]]
    all_kept = (first == counts)[:, None]
    bonus = torch.zeros_like(full).scatter_(1, counts[:, None], bonus_token_ids.reshape(-1, 1).to(full.dtype))
    at_bonus = torch.arange(full.shape[1], device=full.device)[None] == counts[:, None]
    full = torch.where(all_kept & at_bonus, bonus, full)
    output.copy_(torch.where(rows[:, None], full.to(output.dtype), output))


def rejection_greedy_sample(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    target_argmax,
    bonus_token_ids,
    is_greedy,
    max_spec_len,
    uniform_probs,
    synthetic_conditional_rates,
) -> None:
    """vLLM's ``rejection_greedy_sample_kernel``: greedy rows keep draft tokens while they are the target's argmax
    (or, in synthetic mode, while a uniform falls below the position's rate and the token is real)."""
    counts, index, real = _layout(cu_num_draft_tokens, max_spec_len, len(draft_token_ids))
    drafts, argmax = _at(draft_token_ids.long(), index), _at(target_argmax.long(), index)
    if synthetic_conditional_rates is not None:
        rates = synthetic_conditional_rates.double()[None, : index.shape[1]]
        accepted = (_at(uniform_probs.double(), index) < rates) & (drafts >= 0)
        emitted = torch.where(accepted, drafts, argmax)
    else:
        accepted, emitted = drafts == argmax, argmax
    rows = torch.ones_like(counts, dtype=torch.bool) if is_greedy is None else is_greedy.bool()
    _write(output_token_ids, rows, counts, accepted & real, emitted, bonus_token_ids)


def rejection_random_sample(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    draft_probs,
    target_probs,
    bonus_token_ids,
    recovered_token_ids,
    uniform_probs,
    is_greedy,
    max_spec_len,
    synthetic_conditional_rates,
) -> None:
    """vLLM's ``rejection_random_sample_kernel``: sampled rows keep draft tokens while ``p / q >= u`` (q = 1 without
    draft probabilities; in synthetic mode while ``u`` falls below the position's rate), never a -1 position, and
    emit the recovered token at the first one refused."""
    counts, index, real = _layout(cu_num_draft_tokens, max_spec_len, len(draft_token_ids))
    drafts = _at(draft_token_ids.long(), index)
    token = drafts.clamp(min=0)
    uniform = _at(uniform_probs.double(), index)
    if synthetic_conditional_rates is not None:
        accepted = uniform < synthetic_conditional_rates.double()[None, : index.shape[1]]
    else:
        target = _at(target_probs, index, token)
        draft = _at(draft_probs, index, token) if draft_probs is not None else torch.ones_like(target)
        accepted = (draft > 0) & ((target / draft.clamp_min(1e-30)).double() >= uniform)
    accepted = accepted & (drafts >= 0) & real
    emitted = torch.where(accepted, drafts, _at(recovered_token_ids.long(), index))
    _write(output_token_ids, ~is_greedy.bool(), counts, accepted, emitted, bonus_token_ids)


def attributes(value) -> Mapping:
    """``vars(value)`` for the kernel scan: an object whose ``__dict__`` is not a mapping holds no kernel."""
    found = vars(value)
    return found if isinstance(found, Mapping) else {}


for _kernel in (rejection_greedy_sample, rejection_random_sample):
    _kernel.register_warmup = lambda **_: None  # vLLM's sampler registers Triton warm-ups for its kernels


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the fixes where they apply, once per process."""
    import vllm
    from vllm.platforms import current_platform

    if vllm.__version__.split("+")[0] not in BROKEN_RELEASES or not current_platform.is_cpu():
        return
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # Triton's own kernels run: no fallback, nothing to fix
        return
    from vllm.triton_utils import dispatcher
    from vllm.v1.sample import rejection_sampler

    from decodebench.models.vllm_releases import CPU_FIX_INTERNALS, release_refusal

    if refusal := release_refusal(CPU_FIX_INTERNALS, "decodebench's fixes of vLLM's CPU build"):
        log.warning("%s: left out", refusal)
        return
    dispatcher.vars = attributes  # the name the scan looks up first, before the builtin
    fixes = {
        "expand_batch_to_tokens": expand_batch_to_tokens,
        "_rejection_greedy_sample": rejection_greedy_sample,
        "_rejection_random_sample": rejection_random_sample,
    }
    for name, fix in fixes.items():
        if getattr(rejection_sampler, name) is not fix:
            setattr(rejection_sampler, name, fix)
    log.info("decodebench: vLLM %s's CPU speculative-decoding kernels replaced", vllm.__version__)
