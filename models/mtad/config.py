"""Arguments of ``--model mtad``: the one place their types, defaults, help and checks are written."""

from __future__ import annotations

from dataclasses import dataclass

from decodebench.models.config import MethodConfig, at_least, between, option

# The decoding modes (models/mtad/modes.py): the paper's method, decodebench's earlier greedy
# variant of it, and the baselines it is compared with.
MODES = ("mtad", "mtad-joint-greedy", "speculative", "target", "assisted", "block")


@dataclass(frozen=True)
class MTADConfig(MethodConfig):
    mode: str = option(
        "mtad",
        "the paper's Algorithm 1 (mtad), decodebench's earlier greedy variant of it (mtad-joint-greedy: untempered p "
        "against q), speculative decoding, the target alone, transformers' assisted generation, or block verification "
        "(block: Sun et al.'s Algorithm 2, MTAD's lossless peer, on vLLM)",
        choices=MODES,
    )
    draft: str = option(
        "self:10",
        "self:<k> (the target's first k layers), context (prompt lookup), "
        "infinigram[:<index>], or a causal LM id/path with the target's vocabulary",
    )
    gamma: int = option(4, "draft tokens per iteration", check=at_least(1))
    beams: int | None = option(
        None, "beam width of MTAD's draft (8, the paper's, on transformers; vLLM drafts one chain)", check=at_least(1)
    )
    tau: float = option(0.1, "MTAD's acceptance threshold on min(1, p/q)", check=between(0, 1, high_open=True))
    seed: int = option(1234, "random seed of sampled drafts and tokens", check=at_least(0))

    @property
    def beam_width(self) -> int:
        """The beams of a transformers draft: as given, else the paper's 8."""
        return self.beams if self.beams is not None else 8

    def validated(self) -> MTADConfig:
        if self.draft.startswith("self:") and not self.draft.removeprefix("self:").isdigit():
            raise ValueError(f"draft={self.draft!r}: write self:<k> with an integer k (layers to keep)")
        if self.mode == "assisted" and self.draft.startswith("infinigram"):
            raise ValueError("mode=assisted runs transformers' assisted generation, which has no infini-gram draft")
        return self
