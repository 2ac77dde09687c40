"""Confidence intervals and paired tests over test questions, as answer-selection and reading-comprehension results
are judged: a figure's 95% interval from a bootstrap over the test questions (Efron & Tibshirani, "An Introduction
to the Bootstrap", 1993, the percentile interval), and a claim "A is better than B" from the per-question
differences of the two on the same questions: their mean, its bootstrap interval and the p-value of a paired
permutation test (each question's pair of scores swapped or not, as in Dror et al., "The Hitchhiker's Guide to
Testing Statistical Significance in Natural Language Processing", ACL 2018).

Scores come as a (seeds, questions) matrix, one row per seed of a row of the report, the questions in the same
order in every row. Seeds are pooled: a resample draws questions, and each drawn question counts with the mean of
its seeds, so the interval covers the question sample (small test sets: WikiQA's 243 questions, TrecQA's 68) and
the seeds' spread together. The resamples are seeded: the same scores give the same interval and p every time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000
EXACT_UP_TO = 2**16  # a permutation test enumerates every swap pattern of up to 16 questions, and samples beyond


@dataclass(frozen=True)
class Interval:
    """A figure (the mean over seeds and questions) and its bootstrap interval."""

    mean: float
    low: float
    high: float
    questions: int


@dataclass(frozen=True)
class Comparison:
    """A's figure minus B's on the same questions, the interval of that difference, and the permutation p."""

    difference: float
    low: float
    high: float
    p: float
    questions: int


def _per_question(scores) -> np.ndarray:
    """A (seeds, questions) matrix, or one seed's (questions,) vector, to each question's mean over the seeds."""
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"scores must be (seeds, questions) with at least one question, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("scores must be finite (a question the metric leaves out is left out of every seed)")
    return matrix.mean(axis=0)


def _question_draws(n: int, resamples: int, seed: int):
    """`resamples` draws of n question indices with replacement, seeded, as (start, stop, draws) with draws of shape
    (stop - start, n): bounded memory, 1,000 resamples at a time."""
    rng = np.random.default_rng(seed)
    for start in range(0, resamples, 1000):
        stop = min(resamples, start + 1000)
        yield start, stop, rng.integers(0, n, size=(stop - start, n))


def _bootstrap_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean of `values` over `resamples` draws of as many questions, with replacement."""
    means = np.empty(resamples)
    for start, stop, draws in _question_draws(len(values), resamples, seed):
        means[start:stop] = values[draws].mean(axis=1)
    return means


def _percentiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(scores, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The mean of `scores` ((seeds, questions), seeds pooled per question) and its percentile bootstrap interval
    over the questions."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = _per_question(scores)
    low, high = _percentiles(_bootstrap_means(values, resamples, seed), confidence)
    return Interval(float(values.mean()), low, high, len(values))


def permutation_p(differences, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided p of a paired permutation test on per-question differences A - B: under "A and B are
    exchangeable", each question's difference keeps or flips its sign with probability 1/2; p is the share of
    sign patterns whose mean difference is at least as far from zero as the one observed. Every pattern is
    enumerated for up to 16 questions (exact); beyond, `resamples` random patterns, counted with the observed one
    so that p is never 0."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError(f"differences must be one number per question, got shape {d.shape}")
    observed = abs(d.mean())
    # a tolerance, so that rounding in the sums never decides whether a pattern ties the observed one
    tolerance = 1e-12 * max(1.0, float(np.abs(d).max()))
    if 2 ** len(d) <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
        means = np.abs(signs @ d / len(d))
        return float((means >= observed - tolerance).mean())
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, resamples, 1000):
        stop = min(resamples, start + 1000)
        signs = rng.choice((1.0, -1.0), size=(stop - start, len(d)))
        extreme += int((np.abs(signs @ d / len(d)) >= observed - tolerance).sum())
    return (extreme + 1) / (resamples + 1)


def paired_comparison(a, b, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """A's scores minus B's over the same questions (each (seeds, questions); the seed counts may differ): the
    mean difference, its percentile bootstrap interval over the questions and the paired permutation p."""
    a_values, b_values = _per_question(a), _per_question(b)
    if a_values.shape != b_values.shape:
        raise ValueError(f"A has {len(a_values)} questions and B {len(b_values)}: a paired test needs the same ones")
    d = a_values - b_values
    low, high = _percentiles(_bootstrap_means(d, resamples, seed), confidence)
    return Comparison(float(d.mean()), low, high, permutation_p(d, resamples, seed), len(d))


@dataclass(frozen=True)
class LineFit:
    """The least-squares line y = intercept + slope x through points whose y are means over the same test
    questions, and its bootstrap: the intercept and slope refitted on each resample of the questions."""

    intercept: float
    slope: float
    slope_low: float
    slope_high: float
    questions: int
    resampled: np.ndarray  # (resamples, 2): each resample's intercept and slope
    confidence: float = CONFIDENCE

    def at(self, x: float) -> Interval:
        """The line's value at `x` and its percentile interval over the resampled lines."""
        low, high = _percentiles(self.resampled[:, 0] + self.resampled[:, 1] * x, self.confidence)
        return Interval(self.intercept + self.slope * x, low, high, self.questions)


def line_fit(x, scores, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> LineFit:
    """The line through (x[i], the mean of scores[i]) by least squares, each scores[i] a (seeds, questions) matrix
    over the same questions in the same order (seeds pooled per question, the seed counts may differ), with the
    percentile interval of its slope from a bootstrap over the questions. Each resample draws one set of questions
    for every point: the points are scored on the same test questions, so their errors move together, and a slope
    read from them is paired as a claim's difference is."""
    xs = np.asarray(x, dtype=np.float64)
    values = [_per_question(s) for s in scores]
    if xs.ndim != 1 or len(xs) != len(values) or len(set(xs.tolist())) < 2:
        raise ValueError(f"a line needs one x per point and two distinct x, got {xs.tolist()} for {len(values)} points")
    if len({len(v) for v in values}) != 1:
        raise ValueError(f"every point must be scored on the same questions, got {[len(v) for v in values]}")
    matrix = np.stack(values)  # (points, questions)
    centred = xs - xs.mean()

    def fit(means: np.ndarray) -> np.ndarray:  # (..., points) -> (..., 2): intercept, slope
        slope = (means - means.mean(axis=-1, keepdims=True)) @ centred / (centred @ centred)
        return np.stack([means.mean(axis=-1) - slope * xs.mean(), slope], axis=-1)

    intercept, slope = fit(matrix.mean(axis=1))
    resampled = np.empty((resamples, 2))
    for start, stop, draws in _question_draws(matrix.shape[1], resamples, seed):
        resampled[start:stop] = fit(matrix[:, draws].mean(axis=2).T)  # (points, k, n) -> (k, points)
    low, high = _percentiles(resampled[:, 1], confidence)
    return LineFit(float(intercept), float(slope), low, high, matrix.shape[1], resampled, confidence)


def verdict(comparison: Comparison, paper_difference: float | None) -> str:
    """The claim's word from the interval of our difference: "holds" when it excludes zero on the paper's side,
    "reversed" only when it excludes zero on the other side, "not shown" when it holds zero. Without a paper
    difference to test against, "A better" or "A worse" where the interval excludes zero."""
    if comparison.low <= 0 <= comparison.high:
        return "not shown"
    ours_positive = comparison.low > 0
    if paper_difference is None or paper_difference == 0:
        return "A better" if ours_positive else "A worse"
    return "holds" if ours_positive == (paper_difference > 0) else "reversed"


def aligned(runs: list[dict[str, float]]) -> tuple[list[str], np.ndarray]:
    """Per-question figures of several runs ({question id: figure}, one dict per seed) as a (seeds, questions)
    matrix over the questions every run scored, in sorted order; a question one seed skipped is left out of all
    (the same questions for every seed)."""
    if not runs:
        raise ValueError("no runs")
    common = sorted(set.intersection(*(set(run) for run in runs)), key=str)
    return common, np.array([[run[q] for q in common] for run in runs], dtype=np.float64)
