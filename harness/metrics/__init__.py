"""Metrics of the papers decodebench reproduces (public API: import from ``decodebench.metrics``)."""

from decodebench.metrics.infinigram import Agreement, infinigram_agreement
from decodebench.metrics.repetition import Repetition, degenerate_repetition, find_degenerate_repetition
from decodebench.metrics.rouge import rouge
from decodebench.metrics.spider import SpiderError, extract_sql, spider_execution_accuracy
from decodebench.metrics.squad import (
    normalize_answer,
    nugget_normalize,
    squad_exact_match,
    squad_f1,
    squad_normalized_accuracy,
)

__all__ = [
    "Agreement",
    "Repetition",
    "SpiderError",
    "degenerate_repetition",
    "extract_sql",
    "find_degenerate_repetition",
    "infinigram_agreement",
    "normalize_answer",
    "nugget_normalize",
    "rouge",
    "spider_execution_accuracy",
    "squad_exact_match",
    "squad_f1",
    "squad_normalized_accuracy",
]
