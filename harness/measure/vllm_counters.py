"""vLLM's engine counters that decodebench reads, named once, and what it derives from them.

Both vLLM backends record these per task: the served one as deltas of the server's ``/metrics``, the in-process one
from ``LLM.get_metrics()`` under the same ``_total`` names; methods read their statistics from them (MTAD's
acceptance, LZ's "does the server speculate").
"""

from __future__ import annotations

SPEC_DECODE = "vllm:spec_decode_"
PREFIX_CACHE = "vllm:prefix_cache"
COUNTER_PREFIXES = (SPEC_DECODE, PREFIX_CACHE)  # what a task records of the engine's counters

DRAFTS = f"{SPEC_DECODE}num_drafts_total"  # draft-and-verify steps
DRAFT_TOKENS = f"{SPEC_DECODE}num_draft_tokens_total"
ACCEPTED = f"{SPEC_DECODE}num_accepted_tokens_total"


def accepted_at(position: int) -> str:
    """The counter of steps that accepted the draft token at ``position`` (0-based)."""
    return f"{SPEC_DECODE}num_accepted_tokens_per_pos_total[{position}]"


def mean_acceptance_length(counters: dict) -> float | None:
    """Tokens emitted per draft-and-verify step, vLLM's own definition: 1 + accepted / drafts (None: no step)."""
    drafts = counters.get(DRAFTS)
    return 1 + counters.get(ACCEPTED, 0.0) / drafts if drafts else None


def engine_counters(llm) -> dict[str, float] | None:
    """An in-process engine's (``vllm.LLM``) counters of ``COUNTER_PREFIXES``, under the ``_total`` names a server's
    /metrics gives them (a per-position vector as ``name[i]``; counters of several engines summed); None where the
    engine keeps none (log stats off)."""
    from vllm.v1.metrics.reader import Counter, Vector

    try:
        metrics = llm.get_metrics()
    except Exception:  # log stats off, or an engine without them
        return None
    counters: dict[str, float] = {}
    for metric in metrics:
        if not metric.name.startswith(COUNTER_PREFIXES):
            continue
        name = metric.name.removesuffix("_total") + "_total"
        if isinstance(metric, Vector):
            for i, value in enumerate(metric.values):
                counters[f"{name}[{i}]"] = counters.get(f"{name}[{i}]", 0.0) + value
        elif isinstance(metric, Counter):
            counters[name] = counters.get(name, 0.0) + metric.value
    return counters or None
