"""Distributed negative sampling: the rules of the paper's construction and independence from partitioning."""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from pipelines.negatives import sample_negatives


def _threads(n_questions=60, answers_per_question=4, sites=("a.com", "b.com")):
    positives, pool = [], []
    for site in sites:
        for q in range(n_questions):
            qid = f"{site}:{q}"
            split = "train" if q % 5 else "dev"
            tags = [f"t{q % 3}", f"t{q % 2 + 10}"]
            for a in range(answers_per_question):
                row = {"qid": qid, "question": f"question {q}", "aid": f"{site}:{q}-{a}", "answer": f"answer {q}-{a}",
                       "score": 3 if a < 2 else 0, "accepted": a == 0, "site": site, "split": split, "tags": tags,
                       "status": "positive" if a < 2 else "answer_below_min_score"}
                pool.append(row)
                if a < 2:
                    positives.append(row)
    return positives, pool


def _sample(ray_local, k, mode, bucket_size, partitions, positives, pool):
    import ray.data

    rows = sample_negatives(ray.data.from_items(pool, override_num_blocks=3),
                            ray.data.from_items(positives, override_num_blocks=2), k=k, seed=5, mode=mode,
                            bucket_size=bucket_size, partitions=partitions).take_all()
    return [r for r in rows if r["aid"]], sum(r["short"] for r in rows)


@pytest.mark.parametrize("mode", ["site", "any", "tag"])
def test_negatives_follow_the_rules(ray_local, mode):
    positives, pool = _threads()
    by_aid = {r["aid"]: r for r in pool}
    negatives, short = _sample(ray_local, 3, mode, bucket_size=16, partitions=3, positives=positives, pool=pool)
    per_question = defaultdict(list)
    for n in negatives:
        per_question[n["qid"]].append(n["aid"])
        source = by_aid[n["aid"]]
        assert source["qid"] != n["qid"]  # never an answer to the same question
        assert source["split"] == n["split"]  # never across splits
        if mode in ("site", "tag"):
            assert source["site"] == n["site"]
    for qid, aids in per_question.items():
        assert len(aids) == len(set(aids)), f"{qid} drew a negative twice"
    positives_per_question = Counter(p["qid"] for p in positives)
    assert short == 0 and all(len(per_question[q]) == 3 * n for q, n in positives_per_question.items())
    if mode == "tag":  # all of a question's negatives share one of its tags
        for qid, aids in per_question.items():
            shared = set.intersection(*[set(by_aid[a]["tags"]) for a in aids])
            assert shared & set(by_aid[aids[0]]["tags"])
    if mode == "any":
        assert any(by_aid[n["aid"]]["site"] != n["site"] for n in negatives)


def test_result_does_not_depend_on_partitioning(ray_local):
    positives, pool = _threads()
    first, _ = _sample(ray_local, 2, "site", bucket_size=8, partitions=2, positives=positives, pool=pool)
    second, _ = _sample(ray_local, 2, "site", bucket_size=8, partitions=5, positives=list(reversed(positives)),
                        pool=list(reversed(pool)))
    key = lambda r: (r["qid"], r["aid"])  # noqa: E731
    assert sorted(map(key, first)) == sorted(map(key, second))


def test_fractional_k_and_shortfall(ray_local):
    positives, pool = _threads(n_questions=200, answers_per_question=2)
    negatives, short = _sample(ray_local, 2.5, "site", bucket_size=64, partitions=2, positives=positives, pool=pool)
    ratio = len(negatives) / len(positives)
    assert 2.3 < ratio < 2.7 and short == 0
    tiny_positives, tiny_pool = _threads(n_questions=3, answers_per_question=2, sites=("c.com",))
    # question 0 is alone in dev (nothing to draw); 1 and 2 in train can draw only each other's two answers
    negatives, short = _sample(ray_local, 5, "site", bucket_size=64, partitions=2, positives=tiny_positives,
                               pool=tiny_pool)
    assert len(negatives) == 4 and short == 3 * 2 * 5 - 4
