"""The references a model's dev figures are printed beside: the exact expectation of a random ranking (against
every permutation of small questions) and the weighted word count."""

import itertools

import numpy as np
import pytest

from qa_models.metrics import average_precision, per_question_ranking, reciprocal_rank
from qa_models.references import expected_random, random_ranking, reference_rankings, word_overlap_scores


@pytest.mark.parametrize("candidates,positives", [(n, r) for n in range(1, 7) for r in range(n + 1)])
def test_expected_random_equals_the_mean_over_every_permutation(candidates, positives):
    labels = [1] * positives + [0] * (candidates - positives)
    orders = list(itertools.permutations(labels))
    expected = expected_random(candidates, positives)
    assert expected["ap"] == pytest.approx(np.mean([average_precision(o) for o in orders]), abs=1e-12)
    assert expected["rr"] == pytest.approx(np.mean([reciprocal_rank(o) for o in orders]), abs=1e-12)
    assert expected["p@1"] == pytest.approx(np.mean([o[0] for o in orders]), abs=1e-12)


def test_random_ranking_covers_the_questions_the_policy_keeps():
    qids = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    labels = [1, 0, 0, 0, 0] + [0, 0, 0] + [1, 1]
    records = per_question_ranking(qids, labels, np.zeros(len(qids)), policy="strict")
    figures = random_ranking(records)
    assert figures["questions"] == 1 and figures["skipped"] == {"no_positive": 1, "only_positive": 1}
    assert figures["p@1"] == pytest.approx(0.2)
    assert figures["mrr"] == pytest.approx(np.mean([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]))


def test_word_overlap_weights_rare_shared_words():
    # Token 9 is in every answer (IDF 0), token 7 in one: the answer holding the question's rare word wins.
    question = [9, 7, 5]
    answers = [[9, 1], [9, 7, 2], [9, 3], [9, 5, 7]]
    scores = word_overlap_scores([question] * 4, answers)
    assert scores[0] == 0.0 and scores[2] == 0.0
    assert scores[1] == pytest.approx(np.log(4 / 2)) and scores[3] == pytest.approx(np.log(4 / 2) + np.log(4 / 1))
    figures = reference_rankings(["q"] * 4, [0, 0, 0, 1], [question] * 4, answers)
    assert figures["word_overlap"]["map"] == 1.0
    assert figures["random"]["map"] == pytest.approx(expected_random(4, 1)["ap"])
