"""Metrics that every decodebench generative task reports, and their lm-eval aggregations.

Each task's ``process_results`` adds ``generation_metrics(text)``:

- ``degenerate_repetition``: 1.0 when the generation loops (decodebench.metrics), averaged;
- ``infinigram_agreement``: per sample ``[agreeing, tokens, {effective n: [tokens, agreeing]}]``,
  aggregated over all tokens of the task (``agreement``) and per effective n
  (``agreement_by_effective_n``; the infini-gram paper's figures 4 and 6);
- ``infinigram_reference``: which index produced the agreement (path, tokens, tokenizer, corpus,
  checksum), or why there is none, so that every results file says what its agreement means.

The reference index is the default one (Python's documentation, built on first use, see
decodebench.data.infinigram_index) unless ``DECODEBENCH_INFINIGRAM_INDEX`` names another index
folder, or ``none`` to switch the metric off. Each task opens it when it loads its documents
(``open_reference``), so that a damaged index stops the run before any generation, with a
message that says what is wrong; a failure while scoring one text leaves that text's agreement
null and never loses the run.

Agreement does not condition on the prompt. The infini-gram paper's machine-text protocol
continues a document of the reference corpus, so its prompt is corpus text; here prompts are
benchmark inputs, deliberately absent from the reference, and ``process_results`` sees the
document rather than the prompt the model read (chat templates differ by model). Each generated
token is scored given the generated tokens before it, backing off from at most 512 of them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from decodebench.metrics import degenerate_repetition, infinigram_agreement

INDEX_ENV = "DECODEBENCH_INFINIGRAM_INDEX"
log = logging.getLogger(__name__)


@dataclass
class Reference:
    index: object | None  # decodebench.data.infinigram_index.Index
    description: dict  # what results record: the index, or {"unavailable": reason}


_reference: Reference | None = None


def open_reference() -> Reference:
    """The agreement index of this process, opened once; a damaged index raises here."""
    global _reference
    if _reference is None:
        _reference = _open()
    return _reference


def reset_reference() -> None:
    """Forget the opened index (tests switch ``DECODEBENCH_INFINIGRAM_INDEX``)."""
    global _reference
    _reference = None


def _open() -> Reference:
    from decodebench.metrics.infinigram import resolve_index

    choice = os.environ.get(INDEX_ENV, "default")
    if choice.lower() == "none":
        return Reference(None, {"unavailable": f"switched off ({INDEX_ENV}=none)"})
    if choice == "default":
        try:
            index = resolve_index("default")
        except Exception as exc:  # the default reference needs the embedded model's tokenizer
            reason = f"the default reference index could not be built ({exc}); set {INDEX_ENV} to an index folder"
            log.warning("infini-gram agreement is unavailable: %s", reason)
            return Reference(None, {"unavailable": reason})
    else:
        index = resolve_index(choice)  # an index the user named: damaged or missing stops the run
    return Reference(index, index.info.describe())


def generation_metrics(text: str) -> dict:
    reference = open_reference()
    agreement = None
    if reference.index is not None:
        try:
            agreement = infinigram_agreement(text, reference.index).as_list()
        except Exception as exc:  # keep the run: this text's agreement is missing, and results say why
            log.error("infini-gram agreement failed on one generation: %s", exc)
            reference.description.setdefault("scoring_errors", []).append(str(exc)[:200])
    return {
        "degenerate_repetition": float(degenerate_repetition(text)),
        "infinigram_agreement": agreement,
        "infinigram_agreement_by_n": agreement,  # the same counts, aggregated per effective n
        "infinigram_reference": {**reference.description, "scored_tokens": agreement[1] if agreement else 0},
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


def reference_of(items: list) -> dict:
    """The index every sample of the task was scored against (the same one for all), how many generated tokens
    it scored, and, when that is none, why the task's agreement is null."""
    if not items:
        return {"unavailable": "no samples"}
    described = {k: v for k, v in items[-1].items() if k != "scored_tokens"}
    scored = sum(item.get("scored_tokens", 0) for item in items)
    described["scored_tokens"] = scored
    if scored == 0 and "unavailable" not in described:
        described["agreement"] = "null: the task's generations hold no tokens to score (every one is empty)"
    return described
