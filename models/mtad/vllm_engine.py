"""``--model mtad`` on vLLM: the engine's speculative decoding, configured per mode and draft, and its counters read
back as MTAD's statistics.

Modes on vLLM: ``target`` (no speculation), ``speculative`` (vLLM's standard rejection sampling), ``block``
(block verification, Sun et al., MTAD's lossless peer, which decodebench's vLLM plugin applies: vLLM's V1 runner
has none of its own) and ``mtad`` (vLLM's speculation with the paper's acceptance rule, which decodebench's vLLM
plugin applies to the requests that carry ``mtad_tau``: models/mtad/vllm_plugin.py). Every mode runs on vLLM's V1
model runner unless ``model_runner`` says otherwise, where the plugin's rules live and where the modes' speeds
compare on one runner; ``mtad`` and ``block`` need it. Drafts:
``context`` is vLLM's n-gram proposer (prompt lookup, q one-hot); a model id or path is a ``draft_model`` with
probabilistic draft sampling (q from the draft); ``self:<k>`` is a standalone checkpoint of the target's first k
layers, final norm and LM head, materialized once under ``$DECODEBENCH_HOME/drafts/`` and served as a
``draft_model``. vLLM drafts one chain (``beams`` 1); the infini-gram draft exists on transformers only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from decodebench.models.mtad.config import MTADConfig

VLLM_MODES = ("target", "speculative", "mtad", "block")
# vLLM's n-gram proposer: the longest and shortest n-gram it looks up in the prompt and output
NGRAM = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}


def check_vllm_config(config: MTADConfig) -> None:
    """What ``--model mtad`` cannot do on vLLM, refused before the engine starts."""
    if config.mode not in VLLM_MODES:
        raise ValueError(f"mode={config.mode} exists on transformers only; on vLLM: one of {list(VLLM_MODES)}")
    if config.draft.startswith("infinigram"):
        raise ValueError("draft=infinigram exists on transformers only; on vLLM: context, self:<k> or a draft model")
    if config.beams not in (None, 1):
        raise ValueError(
            f"beams={config.beams}: vLLM drafts one chain, so MTAD's beam drafts do not exist there; leave beams out "
            "(or 1) on vLLM, or run backend=hf for the paper's beam drafts"
        )


def self_draft_checkpoint(pretrained: str, k: int) -> Path:
    """A checkpoint of the target's first ``k`` layers + final norm + LM head (models/mtad/drafts.py's
    ``layer_skip_draft``), written once, atomically, beside the other things decodebench builds."""
    import torch
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.data.paths import home
    from decodebench.data.vocabulary import tokenizer_fingerprint
    from decodebench.models.mtad.drafts import layer_skip_draft

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    name = f"{Path(str(pretrained).rstrip('/')).name}-{tokenizer_fingerprint(tokenizer)}-first-{k}"
    target = home() / "drafts" / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{name}.lock"):
        if (target / "config.json").is_file():
            return target
        model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32)
        draft = layer_skip_draft(model, k)
        partial = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=target.parent))
        try:
            draft.save_pretrained(partial, safe_serialization=True)
            tokenizer.save_pretrained(partial)
            os.rename(partial, target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target


def speculative_config(config: MTADConfig, pretrained: str) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for the mode and draft (None: target-only decoding)."""
    if config.mode == "target":
        return None
    spec: dict[str, Any] = {"num_speculative_tokens": config.gamma}
    if config.draft == "context":
        return {**spec, "method": "ngram", **NGRAM}
    draft = config.draft
    if draft.startswith("self:"):
        draft = str(self_draft_checkpoint(pretrained, int(draft.removeprefix("self:"))))
    return {
        **spec,
        "method": "draft_model",
        "model": draft,
        # the draft's probabilities reach the rejection sampler (q), for speculative sampling and MTAD alike
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block" if config.mode == "block" else "standard",
    }


def engine_args(config: MTADConfig, args: dict[str, Any], pretrained: str) -> dict[str, Any]:
    spec = speculative_config(config, pretrained)
    if spec is None:
        return args
    # the engine's counters (drafts, accepted tokens per position) are what MTAD's statistics come from here
    return {**args, "speculative_config": spec, "disable_log_stats": False}


def runner_need(config: MTADConfig):
    """What a mode needs of vLLM's model runner: the V1 runner, where the plugin's rules wrap the rejection sampler
    (``mtad``, ``block``), or for the other modes the same runner by default, so that all compare on one."""
    from decodebench.models.model_runners import RunnerNeed

    if config.mode == "mtad":
        return RunnerNeed("v1", "MTAD's acceptance rule wraps the rejection sampler of vLLM's V1 model runner")
    if config.mode == "block":
        return RunnerNeed(
            "v1", "decodebench's block verification wraps the rejection sampler of vLLM's V1 model runner"
        )
    return RunnerNeed("v1", "decodebench's MTAD modes share vLLM's V1 model runner, so that they compare on one", False)


def spec_decode_statistics(engine: dict[str, Any] | None, gamma: int) -> dict[str, Any]:
    """MTAD's statistics, under the transformers path's names, from vLLM's speculative-decoding counters of a task:
    iterations (draft-and-verify steps), drafted and accepted tokens, block efficiency (1 + accepted / iterations),
    acceptance rate, acceptance per position and the histogram of accepted lengths."""
    from decodebench.measure.vllm_counters import ACCEPTED, DRAFT_TOKENS, DRAFTS, accepted_at

    if not engine or not engine.get(DRAFTS):
        return {}
    iterations = engine[DRAFTS]
    accepted = engine.get(ACCEPTED, 0)
    drafted = engine.get(DRAFT_TOKENS, 0)
    per_position = [engine.get(accepted_at(i), 0) for i in range(gamma)]
    at_least = [iterations, *per_position]  # iterations that accepted at least 0, 1, ..., gamma tokens
    histogram = {str(k): at_least[k] - (at_least[k + 1] if k < gamma else 0) for k in range(gamma + 1)}
    return {
        "iterations": iterations,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "block_efficiency": 1 + accepted / iterations,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_per_position": [count / iterations for count in per_position],
        "acceptance_histogram": {k: v for k, v in histogram.items() if v},
    }
