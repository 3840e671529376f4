"""ROUGE-1/2/L F-measures for summaries (CNN/DailyMail), computed by Google's rouge-score package.

Porter stemming on, as in the usual CNN/DailyMail evaluation and lm-eval's own cnn_dailymail task.
"""

from __future__ import annotations

from functools import cache

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@cache
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """{"rouge1": F, "rouge2": F, "rougeL": F} of ``prediction`` against ``reference`` (0 to 1)."""
    scores = _scorer().score(reference, prediction)
    return {name: scores[name].fmeasure for name in ROUGE_TYPES}
