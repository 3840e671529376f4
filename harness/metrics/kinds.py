"""What each per-document metric is: 0/1 (a verdict) or continuous. Statistics follow from the
definition, never from the values seen (an all-zero ROUGE-2 column is still continuous).

decodebench's own metrics are listed by their definitions in this package; lm-eval's common per-document
verdicts (``acc``, ``exact_match``, ...) are listed too, so that plain lm-eval runs are read the same way.
A metric not listed is treated as continuous: its paired test (sign flips) stays exact for 0/1 values too.
"""

from __future__ import annotations

BINARY = "0/1"
CONTINUOUS = "continuous"

BINARY_METRICS = frozenset(
    {
        # decodebench.metrics: each is a verdict per document
        "normalized_accuracy",  # squad_normalized_accuracy
        "exact_match",  # squad_exact_match, lm-eval's AIME exact match, the GPQA answer letter
        "execution_accuracy",  # spider_execution_accuracy
        "degenerate_repetition",  # degenerate_repetition
        # lm-eval's per-document verdicts
        "acc",
        "acc_norm",
        "acc_mutual_info",
        "em",
        "pass@1",
    }
)


# continuous metrics whose every value lies in [0, 1] by definition (a 0/1 metric does too)
UNIT_INTERVAL_METRICS = frozenset({"f1", "rouge1", "rouge2", "rougeL", "rougeLsum"})


def metric_range(name: str) -> tuple[float, float] | None:
    """The values a metric can take, by its definition, when known: intervals are kept inside them."""
    return (0.0, 1.0) if name in BINARY_METRICS or name in UNIT_INTERVAL_METRICS else None


def metric_kind(name: str) -> str:
    return BINARY if name in BINARY_METRICS else CONTINUOUS


def is_binary_metric(name: str) -> bool:
    return metric_kind(name) == BINARY
