"""The statistics behind every interval and test decodebench reports (pure functions, no state).

Calibrated at the sample sizes people run (2 to a few hundred documents), and chosen by what a metric
*is* (0/1 or continuous: decodebench.metrics.kinds), never by the values seen:

- ``quality_interval``: a task's mean metric. 0/1 metrics: Wilson's score interval with continuity
  correction (Newcombe 1998, method 4; plain Wilson covers 92.4% at n = 10, p = 0.3); continuous
  metrics: Student's t interval of the mean (in simulation it covers 95% at n = 10 on normal data,
  where BCa and percentile bootstraps cover 91% and 89%);
- ``paired_comparison``: a method against its baseline on the same documents, a test and an interval
  that agree with it. 0/1 metrics: McNemar's exact test (the binomial test of the discordant pairs)
  with the Clopper-Pearson interval of its binomial parameter mapped onto the difference, so the
  interval excludes 0 exactly when p < 0.05. Continuous metrics: the paired sign-flip permutation
  test of the mean difference (every one of the 2^n flips while n <= 16, else 19,999 random flips
  with p = (b + 1) / (m + 1), never 0) and the interval that inverts it: every shift of the
  differences that the same test would not reject at 5%. Below 6 pairs no exact paired test can
  reject at 5% (its smallest p is 2 / 2^n), and the interval is unbounded;
- ``bootstrap_interval``: the percentile bootstrap of any statistic of independent units (speed:
  tokens/s over requests or rounds), seeded so that a report is reproducible;
- ``percentiles``: p50/p90/p99 with linear interpolation (numpy's default);
- ``speed_ratio_interval``: a method's tokens/s over its baseline's on the same units (prompts,
  rounds) measured in interleaved runs, with the interval of the paired bootstrap;
- ``round_ratio_interval``: the interval of a ratio measured once per round, over a few rounds (Student's t on
  the log ratios: a bootstrap over 2-4 rounds can only return the spread of the rounds it has).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 2000
SEED = 0
LEVEL = 0.95
EXACT_FLIPS_UP_TO = 16  # pairs: 2^16 sign flips are enumerated, beyond that they are sampled
RANDOM_FLIPS = 19_999
APPROXIMATE_BELOW = 10  # documents: the table says an interval is approximate below this


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def wilson_interval(successes: int, n: int, continuity: bool = True) -> Interval:
    """Wilson's score interval for ``successes`` out of ``n`` (with continuity correction by default), scipy's."""
    from scipy.stats import binomtest

    if n <= 0:
        raise ValueError("the Wilson interval needs n >= 1")
    found = binomtest(int(successes), int(n)).proportion_ci(LEVEL, "wilsoncc" if continuity else "wilson")
    return Interval(float(found.low), float(found.high))


def t_interval(values: Sequence[float]) -> Interval:
    """Student's t interval of the mean (a single value, or values without spread, give the point itself)."""
    from scipy.stats import t

    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        raise ValueError("an interval needs at least one value")
    mean = float(data.mean())
    if len(data) == 1 or np.all(data == data[0]):
        return Interval(mean, mean)
    half = float(t.ppf(0.5 + LEVEL / 2, len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data)))
    return Interval(mean - half, mean + half)


def round_ratio_interval(per_round: Sequence[float]) -> Interval:
    """The 95% interval of a ratio from its value in each of a few interleaved rounds: Student's t interval of the
    rounds' log ratios, exponentiated (t's quantile at n - 1 degrees of freedom keeps it honest at 2 rounds, where
    it is wide unless the rounds agree)."""
    logs = t_interval([math.log(ratio) for ratio in per_round])
    return Interval(math.exp(logs.low), math.exp(logs.high))


def bootstrap_interval(
    units: Sequence,
    statistic: Callable[[np.ndarray], float],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
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


def check_binary(values: Sequence[float], what: str = "a 0/1 metric") -> None:
    odd = [v for v in values if v not in (0, 1)]
    if odd:
        raise ValueError(f"{what} has values other than 0 and 1 (e.g. {odd[0]!r})")


def within(interval: Interval, bounds: tuple[float, float] | None) -> Interval:
    """``interval`` kept inside the values its quantity can take (clipping never lowers coverage)."""
    if bounds is None:
        return interval
    return Interval(max(interval.low, bounds[0]), min(interval.high, bounds[1]))


def quality_interval(
    values: Sequence[float], binary: bool, bounds: tuple[float, float] | None = None
) -> tuple[Interval, str]:
    """The 95% interval of a task's mean metric and its name: Wilson (continuity-corrected) for a 0/1 metric,
    Student's t otherwise, kept inside ``bounds`` (the metric's range). ``binary`` and ``bounds`` come from the
    metric's definition (decodebench.metrics.kinds)."""
    if binary:
        check_binary(values)
        return wilson_interval(int(sum(values)), len(values)), "wilson-cc"
    return within(t_interval(values), bounds), "t"


@dataclass(frozen=True)
class PairedComparison:
    difference: float  # mean of (method - baseline) over paired documents
    interval: Interval  # agrees with the test: excludes 0 when p < 0.05 (unbounded where no test could reject)
    p_value: float
    test: str  # "mcnemar-exact" or "sign-flip-exact" / "sign-flip-random"
    n: int
    resolution: float | None = None  # the smallest p a sampled test can give, 1 / (m + 1)

    @property
    def approximate(self) -> bool:
        return self.n < APPROXIMATE_BELOW

    def as_dict(self) -> dict:
        return {
            "difference": self.difference,
            "interval": self.interval.as_list(),
            "p_value": self.p_value,
            "test": self.test,
            "n": self.n,
            "resolution": self.resolution,
        }


def paired_comparison(
    method: Sequence[float], baseline: Sequence[float], binary: bool, bounds: tuple[float, float] | None = None
) -> PairedComparison:
    """Method against baseline on the same documents (``method[i]`` and ``baseline[i]`` pair up); with the metric's
    range ``bounds``, the difference's interval stays inside what a difference can be (else it may be unbounded)."""
    if len(method) != len(baseline) or not method:
        raise ValueError("a paired comparison needs the same, non-empty list of documents on both sides")
    if binary:
        check_binary(method, "the method's 0/1 metric")
        check_binary(baseline, "the baseline's 0/1 metric")
        return mcnemar_comparison(method, baseline)
    found = sign_flip_comparison(np.asarray(method, dtype=float) - np.asarray(baseline, dtype=float))
    if bounds is None:
        return found
    span = bounds[1] - bounds[0]
    return dataclasses.replace(found, interval=within(found.interval, (-span, span)))


def mcnemar_comparison(method: Sequence[float], baseline: Sequence[float]) -> PairedComparison:
    """McNemar's exact test, and the interval of the difference it implies.

    Given the m = b + c discordant pairs, b ~ Binomial(m, pi) and the difference of the two proportions
    is (2 pi - 1) m / n; the Clopper-Pearson interval of pi inverts the same two-sided exact binomial test,
    so the interval excludes 0 exactly when p < 0.05.
    """
    diffs = np.asarray(method, dtype=float) - np.asarray(baseline, dtype=float)
    n, b, c = len(diffs), int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    m = b + c
    if m == 0:
        return PairedComparison(0.0, Interval(0.0, 0.0), 1.0, "mcnemar-exact", n)
    low, high, p_value = exact_binomial_test(b, m)
    interval = Interval((2 * low - 1) * m / n, (2 * high - 1) * m / n)
    return PairedComparison(float(diffs.mean()), interval, p_value, "mcnemar-exact", n)


@functools.lru_cache(maxsize=4096)
def exact_binomial_test(successes: int, trials: int) -> tuple[float, float, float]:
    """The Clopper-Pearson interval of a proportion (LEVEL) and the two-sided exact p-value of pi = 0.5 (scipy's
    ``binomtest``); kept, since they depend only on the two counts (a report or a simulation asks for few pairs many
    times, and scipy's root finding takes milliseconds)."""
    from scipy.stats import binomtest

    found = binomtest(successes, trials, 0.5)
    pi = found.proportion_ci(LEVEL, "exact")
    return float(pi.low), float(pi.high), float(found.pvalue)


@functools.lru_cache(maxsize=8)
def sign_flips(n: int, seed: int = SEED) -> tuple[np.ndarray, bool]:
    """The sign patterns of the test: all 2^n (identity included) while n <= 16, else RANDOM_FLIPS random ones
    (seeded: the same n always gets the same flips, so a report is reproducible; kept for the next cell)."""
    if n <= EXACT_FLIPS_UP_TO:
        codes = np.arange(2**n, dtype=np.int64)[:, None]
        return 1 - 2 * ((codes >> np.arange(n)) & 1).astype(np.int8), True
    rng = np.random.default_rng(seed)
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=(RANDOM_FLIPS, n)), False


def sign_flip_comparison(diffs: Sequence[float], seed: int = SEED) -> PairedComparison:
    """The paired sign-flip permutation test of mean(diffs) = 0 and the interval that inverts it.

    Under "no difference" each difference is as likely to have either sign. For a shift delta, the test of
    diffs - delta compares |mean(diffs) - delta| with |mean(s * (diffs - delta))| over the sign patterns s;
    since mean(s * (diffs - delta)) = A_s - delta * B_s with A_s = mean(s * diffs) and B_s = mean(s), every
    shift is tested with the same flips at the cost of two vectors, and the interval is the set of shifts
    whose p-value is at least 0.05 (found by bisection on each side of the mean).
    """
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    signs, exact = sign_flips(n, seed)
    a, b = signs @ d / n, signs.sum(axis=1) / n
    mean = float(d.mean())
    scale = float(np.abs(d).max()) or 1.0
    tolerance = 1e-9 * scale

    def p_value(delta: float) -> float:
        extreme = int(np.sum(np.abs(a - delta * b) >= abs(mean - delta) - tolerance))
        return extreme / len(signs) if exact else (extreme + 1) / (len(signs) + 1)

    alpha = 1 - LEVEL

    def bound(direction: int) -> float:
        inside, step = mean, scale
        outside = mean + direction * step
        while p_value(outside) >= alpha:
            step *= 2
            if step > 1e6 * scale:  # no shift is rejected: fewer than 6 pairs
                return direction * math.inf
            outside = mean + direction * step
        while abs(outside - inside) > 1e-7 * scale:  # 3 decimals shown; 1e-7 of the largest difference is ample
            middle = (inside + outside) / 2
            inside, outside = (middle, outside) if p_value(middle) >= alpha else (inside, middle)
        return inside

    interval, p_zero = Interval(bound(-1), bound(+1)), p_value(0.0)
    if p_zero >= alpha:
        # 0 is not rejected, so it is in the set of shifts the interval stands for: the bisection stops within its
        # resolution of a bound that is 0 itself (ties: many differences exactly 0, one side's p-value jumps at 0)
        interval = Interval(min(interval.low, 0.0), max(interval.high, 0.0))
    resolution = None if exact else 1 / (len(signs) + 1)
    test = "sign-flip-exact" if exact else "sign-flip-random"
    return PairedComparison(mean, interval, min(1.0, p_zero), test, n, resolution)


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
