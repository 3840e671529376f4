"""Metrics that every decodebench generative task reports, and their lm-eval aggregations.

Each task's ``process_results`` adds ``generation_metrics(text)``:

- ``degenerate_repetition``: 1.0 when the generation loops (decodebench.metrics), averaged;
- ``infinigram_agreement``: per sample ``[agreeing, tokens, {effective n: [tokens, agreeing]}]``,
  aggregated over all tokens of the task (``agreement``) and per effective n
  (``agreement_by_effective_n``; the infini-gram paper's figures 4 and 6).

The reference index is the default one (built on first use, see decodebench.metrics.infinigram_index) unless
``DECODEBENCH_INFINIGRAM_INDEX`` names another index folder, or ``none`` to skip the metric.
When no index can be opened, the metric is reported as missing (null), not guessed.
"""

from __future__ import annotations

import logging
import os
from functools import cache

from decodebench.metrics import degenerate_repetition, infinigram_agreement

INDEX_ENV = "DECODEBENCH_INFINIGRAM_INDEX"
log = logging.getLogger(__name__)


@cache
def _index():
    from decodebench.metrics.infinigram import resolve_index

    choice = os.environ.get(INDEX_ENV, "default")
    if choice.lower() == "none":
        return None
    try:
        return resolve_index(choice)
    except Exception as exc:  # reported once; the metric is then missing, the run goes on
        log.warning("infini-gram agreement is unavailable (%s=%s): %s", INDEX_ENV, choice, exc)
        return None


def generation_metrics(text: str) -> dict:
    index = _index()
    agreement = infinigram_agreement(text, index).as_list() if index is not None else None
    return {
        "degenerate_repetition": float(degenerate_repetition(text)),
        "infinigram_agreement": agreement,
        "infinigram_agreement_by_n": agreement,  # the same counts, aggregated per effective n
    }


def agreement(items: list) -> float | None:
    """Share of agreeing tokens over all samples of a task (token-weighted)."""
    present = [item for item in items if item is not None]
    tokens = sum(item[1] for item in present)
    return sum(item[0] for item in present) / tokens if tokens else None


def agreement_by_effective_n(items: list) -> dict[str, float] | None:
    """Agreement per effective n over all samples: {"n": share of agreeing tokens}."""
    totals: dict[int, list[int]] = {}
    for item in items:
        if item is None:
            continue
        for n, (tokens, agreeing) in item[2].items():
            bucket = totals.setdefault(int(n), [0, 0])
            bucket[0] += tokens
            bucket[1] += agreeing
    if not totals:
        return None
    return {str(n): round(agreeing / tokens, 4) for n, (tokens, agreeing) in sorted(totals.items())}
