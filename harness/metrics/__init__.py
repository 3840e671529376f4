"""Metrics of the papers decodebench reproduces (public API: import from ``decodebench.metrics``)."""

from decodebench.metrics.repetition import Repetition, degenerate_repetition, find_degenerate_repetition
from decodebench.metrics.squad import (
    normalize_answer,
    nugget_normalize,
    squad_exact_match,
    squad_f1,
    squad_normalized_accuracy,
)

__all__ = [
    "Repetition",
    "degenerate_repetition",
    "find_degenerate_repetition",
    "normalize_answer",
    "nugget_normalize",
    "squad_exact_match",
    "squad_f1",
    "squad_normalized_accuracy",
]
