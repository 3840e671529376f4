"""ROUGE for summaries (CNN/DailyMail), computed by Google's rouge-score package.

CNN/DailyMail papers report ROUGE-1.5.5's summary-level ROUGE-L, which is rouge-score's
``rougeLsum`` with one sentence per line: the longest common subsequence is taken between every
reference sentence and the union of the candidate's sentences. ``rouge`` reports it next to
ROUGE-1, ROUGE-2 and the sentence-agnostic ROUGE-L (``rougeL``, kept under its own name; it
reads lower than rougeLsum on multi-sentence summaries). Porter stemming is on, as in the usual
evaluation and lm-eval's own cnn_dailymail task.

Sentences are split where a line ends, and after ``.``, ``!`` or ``?`` followed by white space
(the reference highlights come one sentence per line from the hub, or as PTB-tokenized
sentences ending in " ." in FRANK's cased copy). This stands in for the NLTK sentence splitter of
the usual scripts, which needs a model download; abbreviations such as "U.S. officials" split
where NLTK would not.
"""

from __future__ import annotations

import re
from functools import cache

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@cache
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def sentences_per_line(text: str) -> str:
    """One sentence per line, as ``rougeLsum`` expects."""
    parts = (part.strip() for line in text.splitlines() for part in _SENTENCE_END.split(line))
    return "\n".join(part for part in parts if part)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """{"rouge1", "rouge2", "rougeL", "rougeLsum"}: F-measures of ``prediction`` against ``reference`` (0 to 1)."""
    scores = _scorer().score(sentences_per_line(reference), sentences_per_line(prediction))
    return {name: scores[name].fmeasure for name in ROUGE_TYPES}
