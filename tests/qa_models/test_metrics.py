"""Ranking and reading-comprehension metrics: hand-worked values, tie and policy conventions, pytrec_eval."""

import csv
import gzip
import os

import numpy as np
import pytest

from qa_models.metrics import (
    average_precision,
    exact_match,
    f1_score,
    ranking_metrics,
    reading_metrics,
    reciprocal_rank,
)


def test_hand_worked_values():
    assert average_precision([0, 1, 0, 1]) == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert reciprocal_rank([0, 0, 1]) == pytest.approx(1 / 3)
    m = ranking_metrics(["a", "a", "a", "b", "b"], [0, 1, 0, 1, 0], [0.9, 0.5, 0.1, 0.2, 0.8])
    assert m["map"] == pytest.approx((0.5 + 0.5) / 2) and m["mrr"] == pytest.approx(0.5) and m["p@1"] == 0.0


def test_question_policies():
    qids = ["none", "none", "all", "all", "mixed", "mixed"]
    labels = [0, 0, 1, 1, 1, 0]
    scores = [0.1, 0.2, 0.3, 0.4, 0.9, 0.1]
    clean = ranking_metrics(qids, labels, scores, policy="clean")
    assert clean["questions"] == 2 and clean["skipped"]["no_positive"] == 1 and clean["map"] == 1.0
    strict = ranking_metrics(qids, labels, scores, policy="strict")
    assert strict["questions"] == 1 and strict["skipped"]["only_positive"] == 1
    raw = ranking_metrics(qids, labels, scores, policy="raw")
    assert raw["questions"] == 3 and raw["map"] == pytest.approx(2 / 3)


def test_ties_never_follow_input_order():
    # The positive is first in the input; a constant score must not give it rank 1.
    m = ranking_metrics(["q"] * 4, [1, 0, 0, 0], [0.0] * 4)
    assert m["mrr"] == pytest.approx(1 / 4)  # pessimistic: a lower bound
    reordered = ranking_metrics(["q"] * 4, [0, 0, 0, 1], [0.0] * 4)
    assert reordered == m


def _wikiqa(shared_data, split):
    path = os.path.join(shared_data, "wikiqa", f"WikiQA-{split}.tsv.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    positive = {r["QuestionID"] for r in rows if r["Label"] == "1"}
    return [(r["QuestionID"], r["SentenceID"], int(r["Label"])) for r in rows if r["QuestionID"] in positive]


def test_constant_model_scores_no_better_than_random_order_on_wikiqa(shared_data):
    rows = _wikiqa(shared_data, "test")
    qids, labels = [r[0] for r in rows], [r[2] for r in rows]
    assert len(set(qids)) == 243 and len(rows) == 2351
    constant = ranking_metrics(qids, labels, [0.0] * len(rows))
    random_order = np.mean(
        [ranking_metrics(qids, labels, [0.0] * len(rows), ties="random", seed=s)["map"] for s in range(20)]
    )
    file_order = ranking_metrics(qids, labels, [-i for i in range(len(rows))])  # what input-order ties would give
    assert constant["map"] <= random_order
    assert 0.35 < random_order < 0.45  # the random-order expectation, about 0.40
    assert file_order["map"] > 0.6  # the flattering number an order-dependent evaluator reports
    assert constant["questions"] == 243


def test_map_mrr_match_pytrec_eval_on_wikiqa(shared_data):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rows = _wikiqa(shared_data, "dev")
    rng = np.random.default_rng(0)
    scores = rng.random(len(rows))  # continuous scores: no ties, so both tools rank identically
    qrels, run = {}, {}
    for (qid, sid, label), score in zip(rows, scores):
        qrels.setdefault(qid, {})[sid] = label
        run.setdefault(qid, {})[sid] = float(score)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"map", "recip_rank"}).evaluate(run)
    ours = ranking_metrics([r[0] for r in rows], [r[2] for r in rows], scores)
    assert ours["questions"] == len(per_query) == 126
    assert ours["map"] == pytest.approx(np.mean([q["map"] for q in per_query.values()]), abs=1e-9)
    assert ours["mrr"] == pytest.approx(np.mean([q["recip_rank"] for q in per_query.values()]), abs=1e-9)


def test_squad_normalisation_em_f1():
    assert exact_match("The Denver Broncos!", ["Denver Broncos"]) == 1.0
    assert f1_score("Denver Broncos won", ["the Denver Broncos"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert f1_score("nothing", ["Denver"]) == 0.0
    m = reading_metrics(["a cat", "dog"], [["cat"], ["a fox", "dog"]])
    assert m == {"em": 1.0, "f1": 1.0, "questions": 2}
