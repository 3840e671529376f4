"""The share of generations that loop, as every decodebench task reports it: a unit repeated back to back at least
20 times (numbers counting as equal), or a drifting chain of such loops."""

import evaluate

from decodebench.metrics import degenerate_repetition
from decodebench.metrics.evaluate_modules import TEXTS, metric_info

_KWARGS = """
predictions: the model's generations (strings).
min_copies: how many back-to-back copies make a loop (default 20).
Returns: degenerate_repetition (the share of predictions that loop, in [0, 1]).
"""


class DegenerateRepetition(evaluate.Metric):
    def _info(self):
        return metric_info(
            __doc__, "Ginart et al., LZ Penalty (degenerate repetition in reasoning models)", _KWARGS, TEXTS
        )

    def _compute(self, predictions, min_copies=20):
        loops = [degenerate_repetition(p, min_copies=min_copies) for p in predictions]
        return {"degenerate_repetition": sum(loops) / len(loops) if loops else None}
