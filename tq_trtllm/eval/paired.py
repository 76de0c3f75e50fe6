"""Paired comparisons: the mean of per-sample differences (quantized minus FP16) with a 95%
t-interval."""

from __future__ import annotations

import math

from scipy import stats as scipy_stats


def mean_ci95(diffs) -> tuple[float, float, float]:
    """(mean, low, high) of the differences; the interval needs at least two of them (else it is
    the mean alone)."""
    values = [float(d) for d in diffs]
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = scipy_stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def sign_test_p(lost: int, won: int) -> float:
    """Two-sided sign test of paired outcomes that differ: the probability of a split at least as
    uneven as `lost` against `won` if either were equally likely (1 where none differ)."""
    return float(scipy_stats.binomtest(lost, lost + won).pvalue) if lost + won else 1.0
