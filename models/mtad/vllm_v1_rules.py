"""MTAD's rule and block verification in the rejection sampler of vLLM's V1 model runner (see vllm_plugin.py).

``install`` wraps three functions of vLLM (0.32.x, 0.33.x: models/vllm_releases.py), once per process:

- ``rejection_sample``: after vLLM's own rule has filled the output, the rows that asked for MTAD or block
  verification are verified again by their rule (kernels/mtad.py) and rewritten in vLLM's format (the kept draft
  tokens, the one token that follows, then -1). vLLM's rule and its random draws are untouched, so every other row
  is what vLLM alone gives, bit for bit; a rule's own draws come after vLLM's, from the request's generator when it
  has a seed. A draft position a grammar refused (-1, structured outputs) is never kept.
- ``compute_probs_and_sample_next_token`` (the draft model's sampling): MTAD rows draw their draft from q warped as
  p (Appendix F), in float32 whatever the model's dtype (vLLM's CUDA top-k/top-p kernel takes float32 alone).
- ``build_logitsprocs``: vLLM builds no custom logits processor into an engine that speculates; the tracker, which
  changes no logits, is added there.

Nothing here synchronizes the host with the device: which rows asked, for which rule, and how many draft tokens each
row has are host values (the batch updates, ``num_draft_tokens``); row indices reach the device in pinned,
non-blocking copies. The [rows, gamma, vocab] copies a rule works on are made in chunks of at most
``SCRATCH_BYTES`` (one per chunk for MTAD; block verification also gathers the draft's distributions).
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass

import numpy as np
import torch
from vllm.sampling_params import SamplingType
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, LogitsProcessors
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from decodebench.kernels.mtad import block_verify_, following_token, mtad_accept_
from decodebench.models.mtad.vllm_requests import Rule, engine_refusal, requested_rule, version_refusal, wrap_once

log = logging.getLogger(__name__)

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at this position
SCRATCH_BYTES = 2**28  # the most a rule's [rows, gamma, vocab] copies take at once


def install() -> None:
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    wrap_once(gpu_model_runner, "build_logitsprocs", with_tracker)
    wrap_once(rejection_sampler, "rejection_sample", with_rules)
    wrap_once(llm_base_proposer, "compute_probs_and_sample_next_token", with_warped_drafts)


@dataclass
class RuleRows:
    """The batch rows one rule verifies this step: on the host (numpy) and on the device, with MTAD's taus."""

    host: np.ndarray
    device: torch.Tensor
    taus: torch.Tensor | None


class VerificationRequestsV1(LogitsProcessor):
    """Which rows of vLLM's persistent batch are verified by MTAD's rule or block verification; the logits are
    untouched. Greedy rows need neither (see vllm_plugin.py). In an engine whose speculative config asks for block
    verification, every other sampled row is a block row.

    It is built in the process that samples, so it installs the rules there too: whether or not vLLM ran the general
    plugin in that process, a batch that holds such requests is verified by their rules."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        if version_refusal() is None:
            install()
        spec = getattr(vllm_config, "speculative_config", None)
        self.engine_rule = Rule("block") if spec is not None and spec.rejection_sample_method == "block" else None
        if refusal := engine_refusal(vllm_config):
            if self.engine_rule is not None:  # vLLM's V1 runner would verify every request by its own rule, silently
                raise ValueError(f"this engine asks rejection_sample_method='block' of vLLM's V1 runner: {refusal}")
            log.error(refusal)  # the engine keeps serving every other request
        self.device = torch.device(device)
        self.rules: dict[int, Rule] = {}
        self._cached: dict[tuple[str, int], RuleRows | None] = {}

    @classmethod
    def validate_params(cls, sampling_params):
        requested_rule(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return True  # it changes no logits

    def rule_of(self, params) -> Rule | None:
        if params.sampling_type == SamplingType.GREEDY:
            return None
        return requested_rule(params) or self.engine_rule

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:  # in the order vLLM asks: removed, added, moved
            self.rules.pop(index, None)
        for index, params, _, _ in batch_update.added:
            rule = self.rule_of(params)
            if rule is None:
                self.rules.pop(index, None)
            else:
                self.rules[index] = rule
        for a, b, direction in batch_update.moved:
            rule_a, rule_b = self.rules.pop(a, None), self.rules.pop(b, None)
            if rule_a is not None:
                self.rules[b] = rule_a
            if rule_b is not None and direction == MoveDirectionality.SWAP:
                self.rules[a] = rule_b
        self._cached.clear()

    def rows(self, rule: str, batch_size: int) -> RuleRows | None:
        """The rows below ``batch_size`` verified by ``rule`` (``mtad`` or ``block``), or None; built once per batch
        update."""
        key = (rule, batch_size)
        if key not in self._cached:
            chosen = sorted(row for row, asked in self.rules.items() if asked.name == rule and row < batch_size)
            if not chosen:
                self._cached[key] = None
            else:
                host = np.asarray(chosen, dtype=np.int64)
                taus = [self.rules[row].tau for row in chosen] if rule == "mtad" else None
                self._cached[key] = RuleRows(
                    host,
                    async_tensor_h2d(host, self.device, torch.long),
                    async_tensor_h2d(np.asarray(taus, dtype=np.float32), self.device) if taus else None,
                )
        return self._cached[key]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def tracker_of(sampling_metadata) -> VerificationRequestsV1 | None:
    return next((p for p in sampling_metadata.logitsprocs.all if isinstance(p, VerificationRequestsV1)), None)


def with_tracker(build_logitsprocs):
    """vLLM's ``build_logitsprocs`` with the tracker in every engine that speculates. vLLM loads no custom logits
    processor there (they would not see the target's logits at every draft position); this one changes no logits and
    only tracks which rows asked for which rule, which the verifier needs."""

    @functools.wraps(build_logitsprocs)
    def wrapped(vllm_config, device, is_pin_memory, is_pooling_model, *args, **kwargs):
        processors = build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, *args, **kwargs)
        tracked = any(isinstance(p, VerificationRequestsV1) for p in processors.all)
        if vllm_config.speculative_config is None or is_pooling_model or tracked:
            return processors
        return LogitsProcessors([*processors.all, VerificationRequestsV1(vllm_config, device, is_pin_memory)])

    return wrapped


@dataclass
class DraftRows:
    """The drafts of some batch rows, padded from vLLM's flattened layout into [R, gamma]."""

    rows: torch.Tensor  # [R] batch rows
    flat: torch.Tensor  # [R * gamma] positions in the flattened drafts (clamped for padding)
    tokens: torch.Tensor  # [R, gamma] draft tokens; -1 where a grammar refused one, 0 past a row's count
    counts: torch.Tensor  # [R] draft positions per row
    gamma: int

    @classmethod
    def of(cls, rows: np.ndarray, num_draft_tokens: list[int], draft_token_ids: torch.Tensor) -> DraftRows | None:
        """None when these rows drafted nothing (each then emits the target's token, which vLLM's rule did)."""
        per_row = np.asarray(num_draft_tokens, dtype=np.int64)
        counts = per_row[rows]
        gamma = int(counts.max())
        if gamma == 0:
            return None
        starts = np.cumsum(per_row)[rows] - counts
        flat = np.minimum(starts[:, None] + np.arange(gamma)[None], len(draft_token_ids) - 1)
        device = draft_token_ids.device
        flat_t = async_tensor_h2d(flat.reshape(-1), device, torch.long)
        counts_t = async_tensor_h2d(counts, device, torch.long)
        real = torch.arange(gamma, device=device)[None] < counts_t[:, None]
        tokens = torch.where(real, draft_token_ids[flat_t].view(len(rows), gamma).long(), 0)
        return cls(async_tensor_h2d(rows, device, torch.long), flat_t, tokens, counts_t, gamma)

    def chunks(self, copies: int, vocab: int):
        """Row ranges whose ``copies`` [rows, gamma, vocab] float32 tensors fit in ``SCRATCH_BYTES``."""
        size = max(1, SCRATCH_BYTES // (copies * self.gamma * vocab * 4))
        for start in range(0, len(self.rows), size):
            yield slice(start, start + size)

    def part(self, rows: slice) -> DraftRows:
        gamma = self.gamma
        flat = self.flat.view(-1, gamma)[rows].reshape(-1)
        return DraftRows(self.rows[rows], flat, self.tokens[rows], self.counts[rows], gamma)

    def gathered(self, values: torch.Tensor) -> torch.Tensor:
        """[R, gamma, V] rows of the flattened ``values`` [num drafts, V] at these drafts' positions (a copy)."""
        return values.index_select(0, self.flat).view(len(self.rows), self.gamma, values.shape[-1])

    def write(self, output: torch.Tensor, kept: torch.Tensor, following: torch.Tensor) -> None:
        """Rewrite these rows of ``output`` [batch, max_spec_len + 1] in vLLM's format: the kept draft tokens, the one
        token that follows, then PLACEHOLDER."""
        width = output.shape[1]  # max_spec_len + 1 > gamma
        padded = torch.nn.functional.pad(self.tokens, (0, width - self.gamma))
        keep = torch.arange(width, device=padded.device)[None] < kept[:, None]
        rewritten = torch.where(keep, padded, torch.full_like(padded, PLACEHOLDER))
        rewritten.scatter_(1, kept[:, None], following[:, None].to(rewritten.dtype))
        output[self.rows] = rewritten.to(output.dtype)


def uniforms(rows: np.ndarray, generators: dict, count: int, device) -> torch.Tensor:
    """[R, count] uniform numbers for these rows: from a row's own generator when its request has a seed."""
    drawn = torch.rand((len(rows), count), device=device)
    for i, row in enumerate(rows.tolist()):
        if (generator := generators.get(row)) is not None:
            drawn[i] = torch.rand(count, generator=generator, device=device)
    return drawn


_warned_one_hot: set[str] = set()


def verify_mtad(output, drafts: DraftRows, rows: RuleRows, given, vocab: int) -> None:
    """Algorithm 1 on MTAD's rows: p from vLLM's (warped) target logits, q from the draft's probabilities."""
    draft_probs, target_logits = given["draft_probs"], given["target_logits"]
    generators = given["sampling_metadata"].generators
    if draft_probs is None and "mtad" not in _warned_one_hot:
        _warned_one_hot.add("mtad")
        log.warning(
            "MTAD requests in an engine whose drafts carry no probabilities (n-gram lookup, or a draft model with "
            "draft_sample_method=greedy): q is one-hot at the drafted token, as a fixed draft's is"
        )
    for part in drafts.chunks(1, vocab):
        chunk = drafts.part(part)
        if draft_probs is None:
            joint_logq = torch.zeros(chunk.tokens.shape, device=chunk.tokens.device)
        else:
            token_q = draft_probs[chunk.flat, chunk.tokens.reshape(-1).clamp(min=0)]  # [R * gamma], no [., V] copy
            joint_logq = token_q.view(chunk.tokens.shape).float().clamp_min(1e-30).log().cumsum(dim=-1)
        kept, next_probs = mtad_accept_(
            chunk.gathered(target_logits).float(), chunk.tokens, joint_logq, chunk.counts, rows.taus[part]
        )
        drawn = uniforms(rows.host[part], generators, 1, target_logits.device)
        bonus = given["bonus_token_ids"][chunk.rows, 0]
        chunk.write(output, kept, following_token(kept, chunk.counts, next_probs, drawn[:, 0], bonus))


def verify_block(output, drafts: DraftRows, rows: RuleRows, given, vocab: int) -> None:
    """Block verification on its rows: M_b from vLLM's (warped) target logits, M_s the draft's probabilities."""
    draft_probs, target_logits = given["draft_probs"], given["target_logits"]
    generators = given["sampling_metadata"].generators
    for part in drafts.chunks(1 if draft_probs is None else 2, vocab):
        chunk = drafts.part(part)
        draft = chunk.gathered(draft_probs) if draft_probs is not None else None
        drawn = uniforms(rows.host[part], generators, chunk.gamma + 1, target_logits.device)
        kept, next_probs = block_verify_(
            chunk.gathered(target_logits).float(), draft, chunk.tokens, chunk.counts, drawn[:, : chunk.gamma]
        )
        bonus = given["bonus_token_ids"][chunk.rows, 0]
        chunk.write(output, kept, following_token(kept, chunk.counts, next_probs, drawn[:, chunk.gamma], bonus))


VERIFIERS = {"mtad": verify_mtad, "block": verify_block}


def with_rules(rejection_sample):
    """vLLM's ``rejection_sample`` with the rows that asked for MTAD or block verification verified by their rule
    after vLLM's own (which reads the same inputs and changes none of them)."""
    signature = inspect.signature(rejection_sample)

    @functools.wraps(rejection_sample)
    def wrapped(*args, **kwargs):
        output = rejection_sample(*args, **kwargs)
        given = signature.bind(*args, **kwargs).arguments
        metadata = given["sampling_metadata"]
        tracker = tracker_of(metadata)
        if tracker is None or not tracker.rules or metadata.all_greedy or len(given["draft_token_ids"]) == 0:
            return output
        batch_size = len(given["num_draft_tokens"])
        for rule, verify in VERIFIERS.items():
            rows = tracker.rows(rule, batch_size)
            drafts = DraftRows.of(rows.host, given["num_draft_tokens"], given["draft_token_ids"]) if rows else None
            if drafts is not None:
                verify(output, drafts, rows, given, given["target_logits"].shape[-1])
        return output

    return wrapped


def with_warped_drafts(compute_probs_and_sample_next_token):
    """The draft model's sampling with the rows that asked for MTAD drawn from q warped as p is (Appendix F: the
    request's top-k and top-p after its temperature); vLLM applies the temperature alone. Warped in float32."""

    @functools.wraps(compute_probs_and_sample_next_token)
    def wrapped(logits, sampling_metadata, *args, **kwargs):
        tracker = tracker_of(sampling_metadata)
        top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
        same_rows = sampling_metadata.temperature is not None and logits.shape[0] == len(sampling_metadata.temperature)
        if tracker is not None and same_rows and not sampling_metadata.all_greedy and (top_k, top_p) != (None, None):
            rows = tracker.rows("mtad", logits.shape[0])
            if rows is not None:
                from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

                chosen = rows.device
                # temperature first, then top-k and top-p, as for p; scaled back, since vLLM divides next
                temperature = sampling_metadata.temperature.index_select(0, chosen).float().unsqueeze(-1)
                warped = apply_top_k_top_p(
                    logits.index_select(0, chosen).float() / temperature,
                    top_k.index_select(0, chosen) if top_k is not None else None,
                    top_p.index_select(0, chosen) if top_p is not None else None,
                )
                logits.index_copy_(0, chosen, (warped * temperature).to(logits.dtype))
        return compute_probs_and_sample_next_token(logits, sampling_metadata, *args, **kwargs)

    return wrapped
