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
                row = {
                    "qid": qid,
                    "question": f"question {q}",
                    "aid": f"{site}:{q}-{a}",
                    "answer": f"answer {q}-{a}",
                    "score": 3 if a < 2 else 0,
                    "accepted": a == 0,
                    "site": site,
                    "split": split,
                    "tags": tags,
                    "status": "positive" if a < 2 else "answer_below_min_score",
                }
                pool.append(row)
                if a < 2:
                    positives.append(row)
    return positives, pool


def _sample(ray_local, k, mode, bucket_size, partitions, positives, pool):
    import ray.data

    rows = sample_negatives(
        ray.data.from_items(pool, override_num_blocks=3),
        ray.data.from_items(positives, override_num_blocks=2),
        k=k,
        seed=5,
        mode=mode,
        bucket_size=bucket_size,
        partitions=partitions,
    ).take_all()
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
        for aids in per_question.values():
            shared = set.intersection(*[set(by_aid[a]["tags"]) for a in aids])
            assert shared & set(by_aid[aids[0]]["tags"])
    if mode == "any":
        assert any(by_aid[n["aid"]]["site"] != n["site"] for n in negatives)


def test_result_does_not_depend_on_partitioning(ray_local):
    positives, pool = _threads()
    first, _ = _sample(ray_local, 2, "site", bucket_size=8, partitions=2, positives=positives, pool=pool)
    second, _ = _sample(
        ray_local,
        2,
        "site",
        bucket_size=8,
        partitions=5,
        positives=list(reversed(positives)),
        pool=list(reversed(pool)),
    )

    def key(r):
        return (r["qid"], r["aid"])

    assert sorted(map(key, first)) == sorted(map(key, second))


@pytest.mark.parametrize("mode", ["site", "tag"])
def test_positives_marked_in_the_pool_draw_what_a_dataset_of_positives_draws(ray_local, mode):
    """One pass over a pool whose positives are marked (as the build reads its threads) gives the negatives and
    shortfalls of a pool and a separate dataset of positives."""
    import ray.data

    positives, pool = _threads(n_questions=40)
    tiny_positives, tiny_pool = _threads(n_questions=3, answers_per_question=2, sites=("c.com",))  # a shortfall
    positives, pool = positives + tiny_positives, pool + tiny_pool
    separate, separate_short = _sample(ray_local, 3, mode, bucket_size=16, partitions=3, positives=positives, pool=pool)
    marked = [dict(r, asks=r["status"] == "positive") for r in pool]
    rows = sample_negatives(
        ray.data.from_items(marked, override_num_blocks=3), "asks", k=3, seed=5, mode=mode, bucket_size=16, partitions=2
    ).take_all()

    def key(r):
        return (r["qid"], r["aid"], r["split"])

    assert sorted(map(key, (r for r in rows if r["aid"]))) == sorted(map(key, separate)) and separate
    assert sum(r["short"] for r in rows) == separate_short > 0


def test_fractional_k_and_shortfall(ray_local):
    positives, pool = _threads(n_questions=200, answers_per_question=2)
    negatives, short = _sample(ray_local, 2.5, "site", bucket_size=64, partitions=2, positives=positives, pool=pool)
    ratio = len(negatives) / len(positives)
    assert 2.3 < ratio < 2.7 and short == 0
    tiny_positives, tiny_pool = _threads(n_questions=3, answers_per_question=2, sites=("c.com",))
    # question 0 is alone in dev (nothing to draw); 1 and 2 in train can draw only each other's two answers
    negatives, short = _sample(
        ray_local, 5, "site", bucket_size=64, partitions=2, positives=tiny_positives, pool=tiny_pool
    )
    assert len(negatives) == 4 and short == 3 * 2 * 5 - 4


def test_splitmix64_matches_the_reference_stream():
    """Golden values: SplitMix64 (Steele, Lea, Flood 2014) seeded with 0 gives 0xE220A8397B1DCDAF, then
    0x6E789E6AA1B965F4, then 0x06C45D188009454F."""
    import numpy as np

    from pipelines.negatives import _stream, splitmix64

    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert _stream(0, 3) == expected
    assert splitmix64(np.array([0], np.uint64)).tolist() == expected[:1]


def test_draws_without_replacement_are_distinct_and_uniform():
    from pipelines.negatives import _draw_without_replacement

    assert sorted(_draw_without_replacement(7, 10, 10)) == list(range(10))
    firsts = Counter(_draw_without_replacement(base, 5, 3)[0] for base in range(5000))
    assert all(len(set(_draw_without_replacement(b, 50, 20))) == 20 for b in range(200))
    assert set(firsts) == set(range(5)) and all(800 < n < 1200 for n in firsts.values()), firsts


def test_a_bucket_never_gives_a_question_its_own_answers_or_more_than_it_has():
    """`sample_buckets` on one block, without Ray: a question with most of the bucket's answers gets only the
    others, and its shortfall is counted."""
    import pyarrow as pa

    from pipelines.negatives import REQUESTS, sample_buckets

    def row(kind, qid, aid="", wanted=0):
        return {
            "kind": kind,
            "group": "train|s",
            "bucket": 0,
            "qid": qid,
            "aid": aid,
            "question": f"q {qid}",
            "answer": f"a {aid}",
            "score": 1,
            "wanted": wanted,
            "site": "s",
            "split": "train",
        }

    pool = [row("pool", "q1", f"a1-{i}") for i in range(6)] + [row("pool", "q2", "a2-0"), row("pool", "q3", "a3-0")]
    requests = [row("request", "q1", wanted=2), row("request", "q1", wanted=1), row("request", "q2", wanted=3)]
    out = sample_buckets(pa.Table.from_pylist(pool + requests, schema=REQUESTS), seed=3).to_pylist()
    q1 = [r for r in out if r["qid"] == "q1"]
    assert sorted(r["aid"] for r in q1 if r["aid"]) == ["a2-0", "a3-0"] and sum(r["short"] for r in q1) == 1
    q2 = [r["aid"] for r in out if r["qid"] == "q2" and r["aid"]]
    assert len(q2) == 3 == len(set(q2)) and not any(a.startswith("a2-") for a in q2) and q2 == sorted(q2)
    assert out == sample_buckets(pa.Table.from_pylist((pool + requests)[::-1], schema=REQUESTS), seed=3).to_pylist()


def test_a_partitions_count_is_of_negatives_not_of_the_rows_that_carry_a_shortfall(ray_local):
    """The build's progress line sums these counts: it said 110,292 negatives where the shards got 110,268 (24
    rows that only carry a shortfall, on the eleven-site build)."""
    import pyarrow.compute as pc
    import ray
    import ray.data

    from pipelines.blocks import materialised_blocks
    from pipelines.negatives import count_pool_groups, negative_blocks

    positives, pool = _threads(n_questions=3, answers_per_question=2, sites=("c.com",))  # too few for k = 3

    def refs_and_bytes(ds):
        refs, _, sizes = materialised_blocks(ds)
        return refs, sizes

    pool_ds, positives_ds = (ray.data.from_items(r, override_num_blocks=2).materialize() for r in (pool, positives))
    results = negative_blocks(
        refs_and_bytes(pool_ds),
        refs_and_bytes(positives_ds),
        k=3,
        seed=5,
        pool_sizes=count_pool_groups(pool_ds, "site"),
        bucket_size=16,
        partitions=2,
    )
    blocks, counts = ray.get([b for b, _, _ in results]), ray.get([c for _, c, _ in results])
    drawn = sum(int(pc.sum(pc.equal(b["short"], 0)).as_py() or 0) for b in blocks)
    assert sum(b.num_rows for b in blocks) > drawn > 0  # rows that only carry a shortfall are there
    assert sum(c["rows"] for c in counts) == drawn
    assert sum(c["short"] for c in counts) == sum(int(pc.sum(b["short"]).as_py() or 0) for b in blocks) > 0
