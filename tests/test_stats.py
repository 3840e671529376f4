"""The statistics against textbook cases and hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from stats_reference import mcnemar_exact

from decodebench.stats import (
    Interval,
    bootstrap_interval,
    paired_comparison,
    percentiles,
    quality_interval,
    ratio_interval,
    round_ratio_interval,
    speed_ratio_interval,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high", "continuity"),
    [  # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, methods 3 and 4
        (81, 263, 0.2553, 0.3662, False),
        (15, 148, 0.0624, 0.1605, False),
        (0, 20, 0.0000, 0.1611, False),
        (1, 29, 0.0061, 0.1718, False),
        (81, 263, 0.2535, 0.3682, True),
        (15, 148, 0.0598, 0.1644, True),
        (0, 20, 0.0000, 0.2005, True),
        (1, 29, 0.0018, 0.1963, True),
    ],
)
def test_wilson_interval_matches_newcombes_table(successes, n, low, high, continuity):
    interval = wilson_interval(successes, n, continuity=continuity)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


def test_mcnemar_exact_equals_the_binomial_test_of_the_discordant_pairs():
    # by hand: b=1, c=9, n=10: 2 * P(X <= 1) = 2 * (1 + 10) / 1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0


def test_a_ratio_over_few_rounds_gets_students_t_on_its_logs():
    """Two rounds at 1.0x and 1.2x: mean log 0.0912, sd 0.1289, t(0.975, 1 df) = 12.706, so the interval is
    exp(0.0912 -/+ 1.1583) = [0.344, 3.489] (a bootstrap over the two rounds could only return [1.0, 1.2])."""
    interval = round_ratio_interval([1.0, 1.2])
    assert (interval.low, interval.high) == pytest.approx((0.344, 3.489), abs=1e-3)
    agreeing = round_ratio_interval([1.11, 1.11])
    assert agreeing.low == agreeing.high == pytest.approx(1.11)


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


def test_the_kind_of_interval_comes_from_the_metric_not_the_values():
    interval, method = quality_interval([1, 0, 1, 1], binary=True)
    assert method == "wilson-cc" and interval == wilson_interval(3, 4)
    zeros, method = quality_interval([0.0, 0.0, 0.0, 0.0], binary=False)  # an all-zero ROUGE-2 column
    assert method == "t" and zeros == Interval(0.0, 0.0)
    interval, method = quality_interval([0.2, 0.4, 0.6], binary=False)
    half = stats.t.ppf(0.975, 2) * 0.2 / math.sqrt(3)  # Student's t by hand: sd 0.2, n 3
    assert method == "t" and interval.low == pytest.approx(0.4 - half) and interval.high == pytest.approx(0.4 + half)
    with pytest.raises(ValueError, match="other than 0 and 1"):
        quality_interval([1, 0.5], binary=True)
    from decodebench.metrics.kinds import is_binary_metric

    assert is_binary_metric("exact_match") and is_binary_metric("execution_accuracy")
    assert not is_binary_metric("rouge2") and not is_binary_metric("f1")


def test_paired_0_1_metrics_use_mcnemar_and_its_own_interval():
    method = [1] * 15 + [0] * 5
    baseline = [1] * 5 + [0] * 15  # 10 discordant pairs, all for the method
    comparison = paired_comparison(method, baseline, binary=True)
    assert comparison.test == "mcnemar-exact" and comparison.difference == pytest.approx(0.5)
    assert comparison.p_value == pytest.approx(stats.binomtest(10, 10).pvalue) and comparison.p_value < 0.05
    # Clopper-Pearson for 10 of 10 is [0.6915, 1]: the difference is (2 pi - 1) * 10 / 20
    assert comparison.interval.low == pytest.approx((2 * 0.69150289 - 1) * 0.5, abs=1e-6)
    assert comparison.interval.high == pytest.approx(0.5)
    same = paired_comparison([1, 0, 1], [1, 0, 1], binary=True)
    assert same.p_value == 1.0 and same.interval == Interval(0.0, 0.0)


def test_the_sign_flip_test_is_scipys_permutation_test_and_never_zero():
    rng = np.random.default_rng(1)
    for n in (2, 5, 9, 14):  # scipy needs two observations
        diffs = rng.normal(0.3, 1, n)
        ours = paired_comparison(list(diffs), [0.0] * n, binary=False)
        theirs = stats.permutation_test(
            (diffs,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
        )
        assert ours.test == "sign-flip-exact" and ours.p_value == pytest.approx(theirs.pvalue)
    constant = paired_comparison([0.5] * 5, [0.0] * 5, binary=False)
    assert constant.p_value == pytest.approx(0.0625)  # 2 / 2^5: no paired test on 5 pairs goes lower
    assert math.isinf(constant.interval.low) and math.isinf(constant.interval.high)
    bounded = paired_comparison([0.5] * 5, [0.0] * 5, binary=False, bounds=(0.0, 1.0))  # e.g. ROUGE
    assert bounded.interval == Interval(-1.0, 1.0) and bounded.p_value == constant.p_value
    two = quality_interval([0.1, 0.5], binary=False, bounds=(0.0, 1.0))[0]  # t at n = 2 reaches below 0
    assert two.low == 0.0 and two.high == 1.0
    assert paired_comparison([0.5], [0.0], binary=False).p_value == 1.0
    big = paired_comparison(list(rng.normal(1, 0.1, 200)), [0.0] * 200, binary=False)
    assert big.test == "sign-flip-random" and big.p_value == pytest.approx(1 / 20000) == big.resolution


def test_a_continuous_paired_interval_agrees_with_its_test():
    rng = np.random.default_rng(2)
    base = rng.random(200)
    better = paired_comparison(list(base + 0.2 + rng.normal(0, 0.05, 200)), list(base), binary=False)
    assert better.p_value < 0.01 and better.interval.low > 0.15
    noise = paired_comparison(list(base + rng.normal(0, 0.05, 200)), list(base), binary=False)
    assert noise.p_value > 0.05 and noise.interval.low < 0 < noise.interval.high
    for _ in range(30):
        n = int(rng.integers(6, 30))
        diffs = rng.normal(rng.normal(0, 0.5), 1, n)
        found = paired_comparison(list(diffs), [0.0] * n, binary=False)
        excludes_zero = found.interval.low > 0 or found.interval.high < 0
        assert excludes_zero == (found.p_value < 0.05), (n, found)


def test_with_many_differences_exactly_zero_the_interval_still_agrees_with_its_test():
    """Two selectors that give the same summary on most documents (docs/nugget-study-question-r10.md, cnndm_mini:
    16 of 20 ROUGE differences exactly 0): p(0) = 2/16, and the bisection stopped a hair below 0, an interval that
    looked as if it excluded 0."""
    found = paired_comparison([-0.0556, -0.0557, -0.1151, -0.0501] + [0.0] * 16, [0.0] * 20, binary=False)
    assert found.p_value == pytest.approx(0.125, abs=0.01) and found.interval.low < 0 <= found.interval.high
    rng = np.random.default_rng(4)
    for _ in range(40):
        n = int(rng.integers(6, 30))
        diffs = rng.normal(rng.normal(0, 0.5), 1, n) * (rng.random(n) < rng.uniform(0.1, 0.6))
        found = paired_comparison(list(diffs), [0.0] * n, binary=False)
        excludes_zero = found.interval.low > 0 or found.interval.high < 0
        assert excludes_zero == (found.p_value < 0.05), (n, found)


def test_a_0_1_interval_excludes_zero_exactly_when_p_is_below_005():
    rng = np.random.default_rng(3)
    for _ in range(1000):
        n = int(rng.integers(2, 60))
        method = rng.random(n) < rng.random()
        baseline = rng.random(n) < rng.random()
        found = paired_comparison(list(method.astype(float)), list(baseline.astype(float)), binary=True)
        excludes_zero = found.interval.low > 0 or found.interval.high < 0
        assert excludes_zero == (found.p_value < 0.05), (n, found)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 5, 10, 30])
def test_under_no_difference_the_paired_tests_reject_at_most_5_percent(n):
    """Simulated nulls: continuous (normal differences) and 0/1 (two independent Bernoulli(0.3) columns)."""
    rng = np.random.default_rng(n)
    trials = 2000
    noise = 3 * math.sqrt(0.05 * 0.95 / trials)  # three Monte Carlo standard errors
    continuous = sum(
        paired_comparison(list(rng.normal(0, 1, n)), [0.0] * n, binary=False).p_value < 0.05 for _ in range(trials)
    )
    binary = sum(
        paired_comparison(list((rng.random(n) < 0.3) * 1.0), list((rng.random(n) < 0.3) * 1.0), True).p_value < 0.05
        for _ in range(trials)
    )
    assert continuous / trials <= 0.05 + noise and binary / trials <= 0.05 + noise


@pytest.mark.slow
def test_every_interval_covers_at_least_93_percent_at_n_10():
    rng = np.random.default_rng(10)
    trials, n = 2000, 10
    mean_covered = sum(
        (found := quality_interval(list(rng.normal(0.5, 0.2, n)), binary=False)[0]).low <= 0.5 <= found.high
        for _ in range(trials)
    )
    proportion_covered = sum(
        (found := quality_interval(list((rng.random(n) < 0.3) * 1.0), binary=True)[0]).low <= 0.3 <= found.high
        for _ in range(trials)
    )
    difference_covered = 0
    for _ in range(trials):
        found = paired_comparison(list(rng.normal(0.2, 1, n)), [0.0] * n, binary=False)
        difference_covered += found.interval.low <= 0.2 <= found.interval.high
    paired_covered = 0
    for _ in range(trials):
        found = paired_comparison(list((rng.random(n) < 0.3) * 1.0), list((rng.random(n) < 0.3) * 1.0), True)
        paired_covered += found.interval.low <= 0.0 <= found.interval.high
    for covered in (mean_covered, proportion_covered, difference_covered, paired_covered):
        assert covered / trials >= 0.93


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
