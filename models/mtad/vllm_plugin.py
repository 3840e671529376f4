"""MTAD's acceptance rule inside vLLM's V1 engine, for the requests that ask for it.

vLLM has no plugin point for its acceptance rule: ``vllm/v1/sample/rejection_sampler.py`` chooses between its own
variants (standard, synthetic, block) inside ``rejection_sample()``. Installing decodebench registers ``register``
under vLLM's ``vllm.general_plugins`` entry point, which every vLLM process runs before its engine starts; it
wraps that function (and, for the draft model's sampling, ``compute_probs_and_sample_next_token``) so that:

- a request that asks for MTAD (``SamplingParams.extra_args`` ``{"mtad_tau": 0.1}``, ``vllm_xargs`` through
  ``vllm serve``) and samples is verified by Algorithm 1 (kernels/mtad.py's ``mtad_verify``: the longest draft
  prefix whose joint ratio ``min(1, p / q)`` passes ``tau``, then one token from the target), with Appendix F's
  warping of both p and q (the request's temperature, top-k and top-p; vLLM's draft sampling applies the
  temperature alone, so for MTAD requests the draft is drawn from q warped like p);
- every other request in the batch keeps vLLM's own rule, untouched; a greedy MTAD request needs nothing: with
  p one-hot at the target's argmax, MTAD is greedy speculative decoding, which vLLM's greedy rule already is.

``MTADRequests``, a V1 logits processor that leaves the logits alone, tracks which batch rows asked and their
``tau``; registered under ``vllm.logits_processors``, it refuses a bad ``tau`` at admission with its value and
range. vLLM builds no custom logits processor into an engine that speculates, so the plugin also wraps the model
runner's ``build_logitsprocs`` to add the tracker there. vLLM
drafts one chain; MTAD's beam drafts do not exist there (``--model mtad`` refuses ``beams > 1`` on vLLM). The
rule is pinned to the vLLM release it was written against: with another one the wrapper is not installed and
every MTAD request is refused, naming both versions. The rule lives in the V1 model runner's rejection sampler;
vLLM 0.32 picks its V2 runner (its own sampler) on CUDA, so decodebench's engines and ``decodebench serve`` start
with ``VLLM_USE_V2_MODEL_RUNNER=0`` (see ``V1_RUNNER``), and an engine on the V2 runner says MTAD does not apply.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from dataclasses import dataclass

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from decodebench.kernels.mtad import mtad_verify

log = logging.getLogger(__name__)

PINNED_VLLM = "0.32.0"
EXTRA_ARG = "mtad_tau"
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at this position
_PATCHED = "_decodebench_mtad"
_state = {"installed": False, "refusal": None}
# what an engine needs in its environment for the rule to apply (vLLM's V2 model runner samples elsewhere)
V1_RUNNER = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wrap vLLM's acceptance rule, once per process."""
    installed = vllm_version()
    if installed.split("+")[0] != PINNED_VLLM:
        _state["refusal"] = (
            f"decodebench's MTAD plugin was written against vLLM {PINNED_VLLM} and this is vLLM {installed}: MTAD "
            f"requests are refused (install vllm=={PINNED_VLLM}, or a decodebench release made for {installed})"
        )
        log.warning(_state["refusal"])
        return
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    if not getattr(gpu_model_runner.build_logitsprocs, _PATCHED, False):
        gpu_model_runner.build_logitsprocs = _marked(with_tracker(gpu_model_runner.build_logitsprocs))
    if not getattr(rejection_sampler.rejection_sample, _PATCHED, False):
        rejection_sampler.rejection_sample = _marked(with_mtad(rejection_sampler.rejection_sample))
    if not getattr(llm_base_proposer.compute_probs_and_sample_next_token, _PATCHED, False):
        llm_base_proposer.compute_probs_and_sample_next_token = _marked(
            with_warped_drafts(llm_base_proposer.compute_probs_and_sample_next_token)
        )
    _state["installed"] = True


def _marked(function):
    setattr(function, _PATCHED, True)
    return function


def tau_of(params: SamplingParams) -> float | None:
    """The request's MTAD threshold, or None when it does not ask; a bad one is a ValueError naming it."""
    value = (params.extra_args or {}).get(EXTRA_ARG)
    if value is None:
        return None
    if _state["refusal"]:
        raise ValueError(_state["refusal"])
    try:
        tau = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{EXTRA_ARG}={value!r}: must be a number in [0, 1)") from None
    if not (math.isfinite(tau) and 0 <= tau < 1):
        raise ValueError(f"{EXTRA_ARG}={value!r}: must be a number in [0, 1) (the paper's: 0.1)")
    return tau


def plugin_refusal(vllm_config=None) -> str | None:
    """Why MTAD requests cannot be verified by MTAD's rule in this engine (another vLLM release, or the V2 model
    runner), or None; installs the rule first."""
    register()
    if _state["refusal"]:
        return _state["refusal"]
    if vllm_config is not None and vllm_config.use_v2_model_runner:
        return (
            "this engine runs vLLM's V2 model runner, whose rejection sampler MTAD's rule does not wrap: its MTAD "
            "requests would be plain speculative sampling; start it with VLLM_USE_V2_MODEL_RUNNER=0"
        )
    return None


class MTADRequests(LogitsProcessor):
    """Which rows of vLLM's persistent batch asked for MTAD's acceptance, and their tau; the logits are untouched.

    It is built in the process that samples, so it installs the rule there too: whether or not vLLM ran the
    general plugin in that process, a batch that holds MTAD requests is verified by MTAD's rule."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        if refusal := plugin_refusal(vllm_config):  # the engine keeps serving every other request
            log.error(refusal)
        self.taus: dict[int, float] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        tau_of(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return True  # it changes no logits

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.taus, batch_update, lambda params, prompt_ids, output_ids: tau_of(params))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def with_tracker(build_logitsprocs):
    """vLLM's ``build_logitsprocs`` with ``MTADRequests`` in every engine that speculates. vLLM loads no custom
    logits processor there (they would not see the target's logits at every draft position); this one changes no
    logits and only tracks which rows asked for MTAD, which the verifier needs."""

    @functools.wraps(build_logitsprocs)
    def wrapped(vllm_config, device, is_pin_memory, is_pooling_model, *args, **kwargs):
        processors = build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, *args, **kwargs)
        tracked = any(isinstance(p, MTADRequests) for p in processors.all)
        if vllm_config.speculative_config is None or is_pooling_model or tracked:
            return processors
        return LogitsProcessors([*processors.all, MTADRequests(vllm_config, device, is_pin_memory)])

    return wrapped


def mtad_rows(sampling_metadata, batch_size: int) -> dict[int, float]:
    """{row: tau} of the sampled rows of this batch that asked for MTAD (greedy rows need nothing: see above)."""
    tracker = next((p for p in sampling_metadata.logitsprocs.all if isinstance(p, MTADRequests)), None)
    if tracker is None or not tracker.taus or sampling_metadata.all_greedy:
        return {}
    temperature = sampling_metadata.temperature
    return {
        row: tau
        for row, tau in tracker.taus.items()
        if row < batch_size and (temperature is None or float(temperature[row]) > 0)
    }


def with_mtad(rejection_sample):
    """vLLM's ``rejection_sample`` with the rows that asked for MTAD verified by Algorithm 1 instead. Their inputs
    are read before vLLM's rule runs: its kernels overwrite ``target_logits`` in place."""

    signature = inspect.signature(rejection_sample)

    @functools.wraps(rejection_sample)
    def wrapped(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        metadata, target_logits = given["sampling_metadata"], given["target_logits"]
        rows = mtad_rows(metadata, len(given["num_draft_tokens"]))
        drafts = MTADDrafts.of(
            rows,
            given["draft_token_ids"],
            given["num_draft_tokens"],
            given["cu_num_draft_tokens"],
            given["draft_probs"],
            target_logits,
        )
        output = rejection_sample(*args, **kwargs)
        if drafts is None:
            return output
        uniforms = torch.stack(
            [torch.rand((), generator=metadata.generators.get(row), device=target_logits.device) for row in rows]
        )
        return drafts.verify_into(output, given["bonus_token_ids"], uniforms)

    return wrapped


@dataclass
class MTADDrafts:
    """The MTAD rows of one verification step, padded from vLLM's flattened layout into [R, gamma] tensors."""

    chosen: list[int]  # batch rows
    taus: torch.Tensor  # [R]
    counts: torch.Tensor  # [R] draft tokens per row
    tokens: torch.Tensor  # [R, gamma]
    target_logprobs: torch.Tensor  # [R, gamma, V], warped by vLLM for sampled rows
    joint_logq: torch.Tensor  # [R, gamma] log q(x_1..j); 0 for a fixed draft (n-gram lookup: q one-hot)

    @classmethod
    def of(cls, rows, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, draft_probs, target_logits):
        """vLLM lays the drafts of all requests end to end (``cu_num_draft_tokens`` ends each request's); None when
        no row asked or nothing was drafted (each row then emits its bonus token, under either rule)."""
        if not rows or len(draft_token_ids) == 0:
            return None
        device = target_logits.device
        chosen = list(rows)
        counts = torch.tensor([num_draft_tokens[r] for r in chosen], device=device)
        gamma = max(1, int(counts.max()))
        starts = cu_num_draft_tokens[chosen].to(device) - counts
        index = (starts[:, None] + torch.arange(gamma, device=device)[None]).clamp(max=len(draft_token_ids) - 1)
        real = torch.arange(gamma, device=device)[None] < counts[:, None]
        tokens = torch.where(real, draft_token_ids[index], torch.zeros_like(index))
        if draft_probs is None:
            joint_logq = torch.zeros(tokens.shape, device=device)
        else:
            token_q = draft_probs[index].gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float().clamp_min(1e-30)
            joint_logq = torch.where(real, token_q.log(), torch.zeros_like(token_q)).cumsum(dim=-1)
        target_logprobs = torch.log_softmax(target_logits[index].float(), dim=-1)
        taus = torch.tensor([rows[r] for r in chosen], device=device)
        return cls(chosen, taus, counts, tokens, target_logprobs, joint_logq)

    def verify_into(self, output: torch.Tensor, bonus_token_ids: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """``output`` [batch, max_spec_len + 1] with the MTAD rows rewritten by ``mtad_verify``, in vLLM's format:
        the kept draft tokens, the one token that follows, then ``PLACEHOLDER``."""
        kept, following = mtad_verify(
            self.target_logprobs,
            self.tokens,
            self.joint_logq,
            self.counts,
            self.taus,
            uniforms,
            bonus_token_ids[self.chosen, 0],
        )
        rows, gamma = self.tokens.shape
        width = output.shape[1]  # max_spec_len + 1 >= gamma + 1
        padding = torch.zeros(rows, width - gamma, dtype=self.tokens.dtype, device=self.tokens.device)
        padded = torch.cat([self.tokens, padding], dim=1)
        accepted = torch.arange(width, device=padded.device)[None] < kept[:, None]
        rewritten = torch.where(accepted, padded, torch.full_like(padded, PLACEHOLDER))
        rewritten.scatter_(1, kept[:, None], following[:, None].to(rewritten.dtype))
        output[self.chosen] = rewritten.to(output.dtype)
        return output


def mtad_output(
    output: torch.Tensor,
    rows: dict[int, float],
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """``output`` with ``rows`` ({row: tau}) verified by MTAD's rule: what the wrapper does, in one call."""
    drafts = MTADDrafts.of(rows, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, draft_probs, target_logits)
    if drafts is None:
        chosen = list(rows)
        output[chosen] = PLACEHOLDER
        output[chosen, 0] = bonus_token_ids[chosen, 0].to(output.dtype)
        return output
    return drafts.verify_into(output, bonus_token_ids, uniforms)


def with_warped_drafts(compute_probs_and_sample_next_token):
    """The draft model's sampling with the rows that asked for MTAD drawn from q warped as p is (Appendix F: the
    request's top-k and top-p after its temperature); vLLM applies the temperature alone."""

    @functools.wraps(compute_probs_and_sample_next_token)
    def wrapped(logits, sampling_metadata, *args, **kwargs):
        rows = mtad_rows(sampling_metadata, logits.shape[0])
        if rows and logits.shape[0] == len(sampling_metadata.temperature):
            from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

            chosen = torch.tensor(list(rows), device=logits.device)
            top_k = sampling_metadata.top_k[chosen] if sampling_metadata.top_k is not None else None
            top_p = sampling_metadata.top_p[chosen] if sampling_metadata.top_p is not None else None
            if top_k is not None or top_p is not None:
                # temperature first, then top-k and top-p, as for p; scaled back, since vLLM divides next
                temperature = sampling_metadata.temperature[chosen].reshape(-1, 1).to(logits.dtype)
                warped = apply_top_k_top_p(logits[chosen] / temperature, top_k, top_p)
                logits[chosen] = warped * temperature
        return compute_probs_and_sample_next_token(logits, sampling_metadata, *args, **kwargs)

    return wrapped
