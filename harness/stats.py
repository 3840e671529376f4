"""The statistics behind every interval and test decodebench reports (pure functions, no state).

- ``wilson_interval``: the score interval of a binomial proportion (Wilson 1927), for 0/1 metrics
  such as exact match or execution accuracy; unlike the normal approximation it stays inside
  [0, 1] and does not collapse at 0 or 1 correct;
- ``bootstrap_interval``: the percentile bootstrap of any statistic of independent units
  (documents for quality, requests for speed), seeded so that a report is reproducible;
- ``mcnemar_exact``: McNemar's exact test of paired 0/1 outcomes (two-sided binomial test on the
  discordant pairs), for a method against its baseline on the same documents;
- ``paired_bootstrap``: the interval of a mean paired difference and its two-sided p-value, by
  resampling documents with their pairs (for metrics that are not 0/1);
- ``percentiles``: p50/p90/p99 with linear interpolation (numpy's default);
- ``speed_ratio_interval``: a method's tokens/s over its baseline's on the same prompts, with the
  interval of the paired bootstrap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal
BOOTSTRAP_SAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def is_binary(values: Sequence[float]) -> bool:
    return len(values) > 0 and all(v in (0, 1) for v in values)


def wilson_interval(successes: int, n: int, z: float = Z95) -> Interval:
    """Wilson's score interval for ``successes`` out of ``n``."""
    if n <= 0:
        raise ValueError("the Wilson interval needs n >= 1")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(
    units: Sequence,
    statistic: Callable[[np.ndarray], float],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = SEED,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap of ``statistic`` over resampled rows of ``units`` (an array or a list of rows)."""
    data = np.asarray(units, dtype=float)
    if len(data) == 0:
        raise ValueError("the bootstrap needs at least one unit")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(data), size=(samples, len(data)))
    values = np.array([statistic(data[rows]) for rows in draws])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(float(low), float(high))


def quality_interval(values: Sequence[float]) -> tuple[Interval, str]:
    """The 95% interval of a task's mean metric: Wilson for 0/1 values, else the bootstrap over documents."""
    if is_binary(values):
        return wilson_interval(int(sum(values)), len(values)), "wilson"
    return bootstrap_interval(values, np.mean), "bootstrap"


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: ``b`` only the first right, ``c`` only the second."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedComparison:
    difference: float  # mean of (method - baseline) over paired documents
    interval: Interval
    p_value: float
    test: str  # "mcnemar-exact" or "paired-bootstrap"
    n: int

    def as_dict(self) -> dict:
        return {
            "difference": self.difference,
            "interval": self.interval.as_list(),
            "p_value": self.p_value,
            "test": self.test,
            "n": self.n,
        }


def paired_comparison(method: Sequence[float], baseline: Sequence[float]) -> PairedComparison:
    """Method against baseline on the same documents (``method[i]`` and ``baseline[i]`` pair up)."""
    if len(method) != len(baseline) or not method:
        raise ValueError("a paired comparison needs the same, non-empty list of documents on both sides")
    diffs = np.asarray(method, dtype=float) - np.asarray(baseline, dtype=float)
    if is_binary(method) and is_binary(baseline):
        b = int(np.sum(diffs > 0))
        c = int(np.sum(diffs < 0))
        interval = bootstrap_interval(diffs, np.mean)
        return PairedComparison(float(diffs.mean()), interval, mcnemar_exact(b, c), "mcnemar-exact", len(diffs))
    interval, p_value = paired_bootstrap(diffs)
    return PairedComparison(float(diffs.mean()), interval, p_value, "paired-bootstrap", len(diffs))


def paired_bootstrap(diffs: Sequence[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED):
    """(95% interval of the mean paired difference, two-sided p-value of "no difference").

    The p-value resamples the differences centred on zero (the null hypothesis) and counts how often
    a mean at least as far from zero as the observed one appears.
    """
    diffs = np.asarray(diffs, dtype=float)
    interval = bootstrap_interval(diffs, np.mean, samples, seed)
    observed = abs(diffs.mean())
    if np.all(diffs == diffs[0]):  # no spread: the difference is what it is
        return interval, 1.0 if diffs[0] == 0 else 0.0
    rng = np.random.default_rng(seed + 1)
    centred = diffs - diffs.mean()
    means = centred[rng.integers(0, len(diffs), size=(samples, len(diffs)))].mean(axis=1)
    p_value = (np.sum(np.abs(means) >= observed) + 1) / (samples + 1)
    return interval, float(p_value)


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} with linear interpolation between order statistics."""
    if not values:
        return {}
    return {f"p{q:g}": float(v) for q, v in zip(qs, np.percentile(np.asarray(values, dtype=float), qs), strict=True)}


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float]) -> Interval:
    """Bootstrap interval of sum(numerators) / sum(denominators) over units (e.g. tokens/s over requests)."""
    pairs = np.column_stack([numerators, denominators]).astype(float)
    return bootstrap_interval(pairs, lambda rows: rows[:, 0].sum() / rows[:, 1].sum())


def speed_ratio_interval(
    tokens: Sequence[float], seconds: Sequence[float], base_tokens: Sequence[float], base_seconds: Sequence[float]
) -> tuple[float, Interval]:
    """A method's tokens/s over its baseline's, measured on the same units (prompts) in interleaved rounds.

    The ratio is (sum tokens / sum seconds) over (the baseline's, the same way); its 95% interval
    resamples units with both sides together, so the pairing (same prompt, same moment of the
    machine's load) carries into the interval.
    """
    rows = np.column_stack([tokens, seconds, base_tokens, base_seconds]).astype(float)

    def ratio(r: np.ndarray) -> float:
        return (r[:, 0].sum() / r[:, 1].sum()) / (r[:, 2].sum() / r[:, 3].sum())

    return ratio(rows), bootstrap_interval(rows, ratio)
