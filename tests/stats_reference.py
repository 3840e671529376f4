"""Reference p-values written straight from their definitions, used only by the tests to check decodebench.stats."""

from __future__ import annotations


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: ``b`` only the first right, ``c`` only the second."""
    from scipy.stats import binomtest

    return 1.0 if b + c == 0 else float(binomtest(int(b), int(b + c), 0.5).pvalue)
