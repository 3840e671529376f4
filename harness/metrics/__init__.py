"""Metrics of the papers decodebench reproduces (public API: import from ``decodebench.metrics``)."""

from decodebench.metrics.squad import (
    normalize_answer,
    nugget_normalize,
    squad_exact_match,
    squad_f1,
    squad_normalized_accuracy,
)

__all__ = [
    "normalize_answer",
    "nugget_normalize",
    "squad_exact_match",
    "squad_f1",
    "squad_normalized_accuracy",
]
