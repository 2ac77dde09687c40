"""experiments/significance.py against scipy (the exact paired permutation test, the percentile bootstrap) and
cases worked by hand."""

import numpy as np
import pytest
from scipy import stats

from experiments.significance import (
    Comparison,
    aligned,
    bootstrap_interval,
    line_fit,
    paired_comparison,
    permutation_p,
    verdict,
)


def _scipy_paired_p(a: np.ndarray, b: np.ndarray, resamples=np.inf, seed=0) -> float:
    """scipy's paired permutation test of mean(A - B), two-sided: swapping a question's A and B is flipping the
    sign of its difference."""
    return stats.permutation_test(
        (a, b),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        n_resamples=resamples,
        alternative="two-sided",
        vectorized=True,
        random_state=seed,
    ).pvalue


@pytest.mark.parametrize("n", [2, 5, 12, 16])
def test_the_exact_permutation_p_is_scipys(n):
    rng = np.random.default_rng(n)
    a, b = rng.random(n), rng.random(n)
    assert permutation_p(a - b) == pytest.approx(_scipy_paired_p(a, b), abs=1e-12)


def test_permutation_p_worked_by_hand():
    # three questions all +1: of the 8 sign patterns only all-plus and all-minus reach |mean| 1
    assert permutation_p([1.0, 1.0, 1.0]) == 0.25
    # no difference at all: every pattern ties the observed 0
    assert permutation_p([0.0, 0.0, 0.0, 0.0]) == 1.0
    # +1, -1: patterns (+,-) and (-,+) reach |mean| 1, the other two give 0
    assert permutation_p([1.0, -1.0]) == 1.0
    assert permutation_p([2.0, 1.0]) == 0.5


def test_the_sampled_permutation_p_agrees_with_scipys_and_is_never_zero():
    rng = np.random.default_rng(3)
    a = rng.random(60)
    b = a - 0.03 + rng.normal(0, 0.1, 60)
    ours = permutation_p(a - b, resamples=20_000, seed=1)
    theirs = _scipy_paired_p(a, b, resamples=20_000, seed=1)
    assert 0 < ours < 1 and ours == pytest.approx(theirs, abs=0.015)
    assert permutation_p(np.full(40, 0.5), resamples=999) == pytest.approx(1 / 1000)
    assert permutation_p(a - b, resamples=5000, seed=7) == permutation_p(a - b, resamples=5000, seed=7)


def test_the_bootstrap_interval_is_scipys_percentile_interval():
    rng = np.random.default_rng(5)
    ap = rng.beta(2, 1, 243)  # a WikiQA-sized test set of average precisions
    ours = bootstrap_interval(ap, resamples=20_000, seed=2)
    theirs = stats.bootstrap((ap,), np.mean, method="percentile", n_resamples=20_000, random_state=2)
    assert ours.mean == pytest.approx(ap.mean()) and ours.questions == 243
    assert ours.low == pytest.approx(theirs.confidence_interval.low, abs=0.004)
    assert ours.high == pytest.approx(theirs.confidence_interval.high, abs=0.004)
    assert ours.low < ours.mean < ours.high


def test_the_bootstrap_interval_worked_by_hand():
    # two questions, 0 and 1: a resample's mean is 0, 0.5 or 1 (1/4, 1/2, 1/4), so the 95% interval is [0, 1]
    two = bootstrap_interval([0.0, 1.0], resamples=4000, seed=0)
    assert (two.mean, two.low, two.high) == (0.5, 0.0, 1.0)
    constant = bootstrap_interval(np.full((3, 10), 0.7))
    assert constant.low == pytest.approx(0.7) and constant.high == pytest.approx(0.7)


def test_seeds_are_pooled_per_question():
    rng = np.random.default_rng(8)
    seeds = rng.random((3, 50))
    pooled = bootstrap_interval(seeds, resamples=2000, seed=4)
    assert pooled == bootstrap_interval(seeds.mean(axis=0), resamples=2000, seed=4)
    comparison = paired_comparison(seeds, seeds[:2], resamples=2000, seed=4)  # seed counts may differ
    assert comparison.difference == pytest.approx(seeds.mean() - seeds[:2].mean())


def test_paired_comparison_and_its_words():
    rng = np.random.default_rng(11)
    b = rng.random((3, 12))
    same = paired_comparison(b, b)
    assert (same.difference, same.low, same.high, same.p) == (0.0, 0.0, 0.0, 1.0)
    assert verdict(same, 0.02) == "not shown"
    better = paired_comparison(b + 0.1, b)
    assert better.difference == pytest.approx(0.1) and better.low == pytest.approx(0.1)
    assert better.p == pytest.approx(2 / 2**12)  # 12 questions, all +0.1: only the two uniform patterns
    assert verdict(better, +0.018) == "holds" and verdict(better, -0.018) == "reversed"
    assert verdict(better, None) == "A better" and verdict(paired_comparison(b, b + 0.1), None) == "A worse"
    noisy = Comparison(difference=-0.018, low=-0.04, high=0.004, p=0.1, questions=243)
    assert verdict(noisy, +0.01) == "not shown"  # the GSAMN-vs-plain-encoder case: not "reversed"


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same ones"):
        paired_comparison(np.zeros((2, 5)), np.zeros((2, 6)))
    with pytest.raises(ValueError, match="finite"):
        bootstrap_interval([0.5, float("nan")])
    with pytest.raises(ValueError, match="at least one question"):
        bootstrap_interval(np.zeros((2, 0)))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([0.5], confidence=1.5)


def test_aligned_keeps_the_questions_every_seed_scored():
    questions, matrix = aligned([{"q2": 0.5, "q1": 1.0, "q3": 0.0}, {"q1": 0.25, "q2": 0.75}])
    assert questions == ["q1", "q2"]
    assert matrix.tolist() == [[1.0, 0.5], [0.25, 0.75]]


def test_a_line_through_points_on_the_same_questions_worked_by_hand():
    # B is A plus 0.1 on every question: each resample draws the same questions for both, so every refitted slope
    # is 0.1, and the line's value at each x is that point's own bootstrap interval, draw for draw
    rng = np.random.default_rng(3)
    a = rng.random((3, 40))
    fit = line_fit([0.0, 1.0], [a, a + 0.1], resamples=3000, seed=7)
    assert fit.slope == pytest.approx(0.1) and (fit.slope_low, fit.slope_high) == pytest.approx((0.1, 0.1))
    assert fit.intercept == pytest.approx(a.mean()) and fit.questions == 40
    for x, point in ((0.0, a), (1.0, a + 0.1)):
        ours, alone = fit.at(x), bootstrap_interval(point, resamples=3000, seed=7)
        assert (ours.mean, ours.low, ours.high) == pytest.approx((alone.mean, alone.low, alone.high))


def test_a_line_fit_is_numpys_least_squares_on_every_resample():
    rng = np.random.default_rng(4)
    x = np.log10([14_061, 50_281, 93_792])
    points = [rng.random((3, 60)), rng.random((2, 60)), rng.random((3, 60))]  # seed counts may differ
    fit = line_fit(x, points, resamples=5, seed=9)
    slope, intercept = np.polyfit(x, [p.mean() for p in points], 1)
    assert (fit.slope, fit.intercept) == pytest.approx((slope, intercept))
    draws = np.random.default_rng(9).integers(0, 60, size=(5, 60))
    for drawn, (a, b) in zip(draws, fit.resampled, strict=True):
        expected = np.polyfit(x, [p.mean(axis=0)[drawn].mean() for p in points], 1)
        assert (b, a) == pytest.approx(tuple(expected))
    assert fit.at(7.0).mean == pytest.approx(intercept + slope * 7.0)
    with pytest.raises(ValueError, match="two distinct x"):
        line_fit([1.0, 1.0], points[:2])
    with pytest.raises(ValueError, match="same questions"):
        line_fit([0.0, 1.0], [np.zeros(5), np.zeros(6)])
