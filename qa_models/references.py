"""What a model must beat on the same questions: a random ranking and a word-overlap ranking.

- Random: the *expected* MAP, MRR and P@1 of a uniformly random order of each question's candidates, exact
  (no sampling). For a question with n candidates of which R are positive:
  P@1 = R/n; RR = sum_k P(first positive at k)/k with P(first at k) = C(n-k, R-1)/C(n, R); and, since a positive
  at rank k has the other R-1 positives spread uniformly over the other n-1 ranks,
  AP = (1/n) sum_k (1 + (k-1)(R-1)/(n-1)) / k.
- Word overlap: the weighted word count of Yang et al. (2015), WikiQA's baseline: a candidate scores the summed
  IDF of the distinct question tokens it contains, IDF over the split's candidate answers; ties broken at random
  (seeded), so a question whose candidates share no word with it scores as a random ranking would.

Both use the evaluation's question policy (qa_models/metrics.py), so they cover exactly the questions a model's
dev figures cover.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from qa_models.metrics import per_question_ranking, summarise_ranking


def expected_random(candidates: int, positives: int) -> dict:
    """Expected AP, RR and P@1 of a uniformly random ranking of `candidates`, `positives` of them positive."""
    n, r = candidates, positives
    if r == 0:
        return {"ap": 0.0, "rr": 0.0, "p@1": 0.0}
    ap = 1.0 if n == 1 else sum((1 + (k - 1) * (r - 1) / (n - 1)) / k for k in range(1, n + 1)) / n
    total = math.comb(n, r)
    rr = sum(math.comb(n - k, r - 1) / total / k for k in range(1, n - r + 2))
    return {"ap": ap, "rr": rr, "p@1": r / n}


def random_ranking(records: list[dict]) -> dict:
    """Expected MAP/MRR/P@1 of a random ranking over the questions `per_question_ranking` kept."""
    expected = [
        dict(r, **expected_random(r["candidates"], r["positives"])) if r["skipped"] is None else r for r in records
    ]
    return summarise_ranking(expected)


def word_overlap_scores(question_ids: Sequence[Sequence[int]], answer_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Each pair's weighted word count: the IDF (over the distinct answers given) of the distinct question tokens
    that the answer contains."""
    answers = [frozenset(a) for a in answer_ids]
    distinct = set(answers)
    df = Counter(token for answer in distinct for token in answer)
    n = len(distinct)
    idf = {token: math.log(n / count) for token, count in df.items()}
    return np.array([sum(idf[t] for t in set(q) if t in a) for q, a in zip(question_ids, answers)], dtype=np.float64)


def reference_rankings(
    qids: Iterable, labels: Iterable, question_ids: Sequence, answer_ids: Sequence, policy: str = "clean", seed: int = 0
) -> dict:
    """{"random": ..., "word_overlap": ...}: each MAP, MRR, P@1 and the questions they cover."""
    qids, labels = list(qids), list(labels)
    overlap = per_question_ranking(
        qids, labels, word_overlap_scores(question_ids, answer_ids), policy, ties="random", seed=seed
    )
    return {"random": random_ranking(overlap), "word_overlap": summarise_ranking(overlap)}
