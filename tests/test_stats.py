"""The statistics against textbook cases and hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from decodebench.stats import (
    bootstrap_interval,
    mcnemar_exact,
    paired_comparison,
    percentiles,
    quality_interval,
    ratio_interval,
    speed_ratio_interval,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_newcombes_table(successes, n, low, high):
    interval = wilson_interval(successes, n)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


def test_mcnemar_exact_equals_the_binomial_test_of_the_discordant_pairs():
    # by hand: b=1, c=9, n=10: 2 * P(X <= 1) = 2 * (1 + 10) / 1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0
    from scipy.stats import binomtest

    for b, c in [(3, 12), (20, 31), (0, 7)]:
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue)


def test_seeded_bootstrap_equals_the_exact_bootstrap_distribution():
    """For [1, 2, 4] the 27 equally likely resamples give the exact distribution of the mean."""
    data = [1.0, 2.0, 4.0]
    exact = sorted(np.mean(resample) for resample in itertools.product(data, repeat=3))
    # 2.5% and 97.5% quantiles of the exact distribution: P(mean = 1) = 1/27 > 2.5%, and likewise 4
    assert exact[0] == 1.0 and exact[-1] == 4.0
    interval = bootstrap_interval(data, np.mean, samples=20000, seed=3)
    assert (interval.low, interval.high) == (1.0, 4.0)
    again = bootstrap_interval(data, np.mean, samples=20000, seed=3)
    assert again == interval  # seeded: a report is reproducible


def test_quality_intervals_pick_wilson_for_0_1_metrics_and_the_bootstrap_otherwise():
    interval, method = quality_interval([1, 0, 1, 1])
    assert method == "wilson" and interval == wilson_interval(3, 4)
    interval, method = quality_interval([0.2, 0.4, 0.6])
    assert method == "bootstrap" and 0.2 <= interval.low < 0.4 < interval.high <= 0.6


def test_paired_comparison_uses_mcnemar_for_0_1_and_the_paired_bootstrap_otherwise():
    method = [1] * 15 + [0] * 5
    baseline = [1] * 5 + [0] * 15  # 10 discordant pairs, all for the method
    comparison = paired_comparison(method, baseline)
    assert comparison.test == "mcnemar-exact" and comparison.difference == pytest.approx(0.5)
    assert comparison.p_value == pytest.approx(mcnemar_exact(10, 0)) and comparison.p_value < 0.05
    same = paired_comparison([0.3, 0.5, 0.7, 0.2], [0.3, 0.5, 0.7, 0.2])
    assert same.test == "paired-bootstrap" and same.difference == 0 and same.p_value == 1.0
    rng = np.random.default_rng(0)
    base = rng.random(200)
    better = paired_comparison(list(base + 0.2 + rng.normal(0, 0.05, 200)), list(base))
    assert better.p_value < 0.01 and better.interval.low > 0.15
    noise = paired_comparison(list(base + rng.normal(0, 0.05, 200)), list(base))
    assert noise.p_value > 0.05 and noise.interval.low < 0 < noise.interval.high


def test_percentiles_of_a_known_latency_list():
    assert percentiles(list(range(1, 11))) == {"p50": 5.5, "p90": 9.1, "p99": pytest.approx(9.91)}
    assert percentiles([]) == {}


def test_tokens_per_second_interval_is_over_requests():
    tokens, seconds = [10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0]  # every request at 10 tokens/s
    interval = ratio_interval(tokens, seconds)
    assert interval.low == pytest.approx(10) and interval.high == pytest.approx(10)
    assert not math.isnan(ratio_interval([1, 100], [1.0, 1.0]).high)


def test_a_paired_speed_ratio_keeps_the_pairing_of_each_prompt():
    # the machine slows down over the rounds, both sides alike: every prompt runs exactly 2x faster
    base_seconds = [1.0, 4.0, 9.0, 2.0, 7.0]
    tokens = [50, 80, 20, 64, 33]
    ratio, interval = speed_ratio_interval(tokens, [s / 2 for s in base_seconds], tokens, base_seconds)
    assert ratio == pytest.approx(2.0)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)
    # unpaired, the same load swings would look like a wide, uncertain ratio
    unpaired = ratio_interval(tokens, [s / 2 for s in base_seconds])
    assert unpaired.high / unpaired.low > 1.5
