"""SQuAD scores as decodebench's tasks compute them: the nugget paper's normalized accuracy (appendix E: the
normalized answer contained as whole words in the normalized generation) and the official v1.1 script's exact match
and F1, each the best over a question's gold answers, averaged over predictions, as fractions (the official script
prints percentages)."""

import evaluate

from decodebench.metrics import squad_exact_match, squad_f1, squad_normalized_accuracy
from decodebench.metrics.evaluate_modules import TEXT_AND_ANSWERS, metric_info

_KWARGS = """
predictions: the model's answers (strings).
references: each prediction's gold answers (a list of strings).
Returns: normalized_accuracy, exact_match, f1 (means over predictions, in [0, 1]).
"""


class SquadNormalizedAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(
            __doc__,
            "Qin et al., Dynamic contextual compression for decoder-only LMs (appendix E); Rajpurkar et al., "
            "SQuAD (v1.1 evaluation script)",
            _KWARGS,
            TEXT_AND_ANSWERS,
        )

    def _compute(self, predictions, references):
        scores = {"normalized_accuracy": squad_normalized_accuracy, "exact_match": squad_exact_match, "f1": squad_f1}
        n = len(predictions)
        return {
            name: sum(score(p, list(r)) for p, r in zip(predictions, references, strict=True)) / n if n else None
            for name, score in scores.items()
        }
