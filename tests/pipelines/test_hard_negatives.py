"""Hard negatives mined by a model: the selection rules on hand-made vectors (fast), and a real build of the beer
dump mined by the shipped MiniLM on a local Ray (slow)."""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from inference.miner import ModelMiner, miner_of
from pipelines.hard_negatives import (
    EMBEDDED,
    MinerSpec,
    merged_quantiles,
    mine_block,
    select_hard_negatives,
    sketch,
)
from pipelines.negatives import NEGATIVES, negatives_wanted


def _unit(*rows) -> np.ndarray:
    v = np.asarray(rows, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_own_answers_are_never_taken_even_when_they_rank_first():
    questions = _unit([1, 0, 0])
    # answers 0-1 are the question's own (0 a positive, 1 below min_score), both closest to it
    answers = _unit([1, 0, 0], [0.99, 0.1, 0], [0.9, 0.4, 0], [0.5, 0.8, 0], [0, 0, 1])
    mined = select_hard_negatives(
        questions,
        answers,
        ["q", "q", "x", "y", "z"],
        np.array([True, False, False, False, False]),
        ["q"],
        np.array([2]),
        max_similarity=1.01,
    )
    assert mined.picks[0].tolist() == [2, 3]  # the best two of the others, best first
    assert np.allclose(mined.scores[0], answers[[2, 3]] @ questions[0])
    assert mined.positive_scores == pytest.approx([1.0])
    assert mined.candidate_means[0] == pytest.approx(float((answers[2:] @ questions[0]).mean()))


def test_the_guard_passes_over_near_duplicates_of_a_positive_and_counts_them():
    questions = _unit([1, 0, 0])
    # answer 1 paraphrases the positive (cosine ~1 with it) and so ranks first for the question among the others
    answers = _unit([0.9, 0.3, 0.1], [0.9, 0.31, 0.1], [0.8, 0.2, 0.5], [0.7, 0, 0.7], [0, 0, 1])
    args = (questions, answers, ["q", "a", "b", "c", "d"], np.array([True, False, False, False, False]), ["q"])
    strict = select_hard_negatives(*args, np.array([2]), max_similarity=0.95)
    loose = select_hard_negatives(*args, np.array([2]), max_similarity=1.01)
    assert strict.picks[0].tolist() == [2, 3] and strict.near_duplicates == 1
    assert loose.picks[0].tolist() == [1, 2] and loose.near_duplicates == 0


def test_a_group_too_small_gives_what_it_has_and_ties_go_to_the_smaller_id():
    questions = _unit([1, 0])
    answers = _unit([1, 0], [0, 1], [0, 1], [1, 0.2])
    mined = select_hard_negatives(
        questions, answers, ["q", "a", "b", "c"], np.array([True, False, False, False]), ["q"], np.array([5]), 0.99
    )
    assert mined.picks[0].tolist() == [3, 1, 2]
    mined = select_hard_negatives(
        questions, answers, ["q", "a", "b", "c"], np.array([True, False, False, False]), ["q"], np.array([1]), 0.99
    )
    assert mined.picks[0].tolist() == [3]


def test_a_long_group_is_searched_past_the_head_when_the_guard_empties_it():
    rng = np.random.default_rng(0)
    positive = _unit([1, 1, 0, 0])[0]
    close = positive + 0.01 * rng.standard_normal((60, 4))  # 60 near-copies of the positive rank first
    far = rng.standard_normal((40, 4)) * [0.2, 0.2, 1, 1]
    answers = _unit(positive, *close, *far)
    qids = ["q"] + [f"a{i}" for i in range(100)]
    is_positive = np.zeros(101, bool)
    is_positive[0] = True
    mined = select_hard_negatives(_unit([1, 1, 0, 0]), answers, qids, is_positive, ["q"], np.array([3]), 0.95)
    assert mined.near_duplicates == 60 and all(p > 60 for p in mined.picks[0])
    scores = answers[61:] @ _unit([1, 1, 0, 0])[0]
    assert mined.picks[0].tolist() == (61 + np.argsort(-scores, kind="stable")[:3]).tolist()


def test_a_rescorer_reorders_the_retrievers_shortlist():
    questions = _unit([1, 0])
    answers = _unit([1, 0.1], [1, 0.2], [1, 0.3], [1, 0.4], [0, 1])
    qids = ["q", "a", "b", "c", "d"]
    positive = np.array([True, False, False, False, False])
    reverse = {1: 0.0, 2: 1.0, 3: 2.0, 4: 3.0, 0: 9.0}  # the checkpoint prefers what the retriever ranks low
    mined = select_hard_negatives(
        questions,
        answers,
        qids,
        positive,
        ["q"],
        np.array([2]),
        1.01,
        shortlist=3,
        rescore=lambda i, c: np.array([reverse[j] for j in c.tolist()]),
    )
    assert mined.picks[0].tolist() == [3, 2]  # the shortlist is 1, 2, 3; 4 ranks fourth by cosine
    assert mined.scores[0].tolist() == [2.0, 1.0] and mined.positive_scores == [9.0] and mined.reranked


def _embedded(rows: list[tuple]) -> pa.Table:
    """EMBEDDED rows from (kind, group, qid, aid, positive, wanted, vector)."""
    columns = list(zip(*rows))
    n = len(rows)
    return pa.table(
        {
            "kind": columns[0],
            "group": columns[1],
            "qid": columns[2],
            "aid": columns[3],
            "text": [f"text of {a or q}" for q, a in zip(columns[2], columns[3])],
            "score": [3] * n,
            "positive": columns[4],
            "wanted": columns[5],
            "site": ["s"] * n,
            "split": ["train"] * n,
            "vector": [list(v) for v in columns[6]],
        }
    ).cast(EMBEDDED)


def test_a_partition_gives_the_same_negatives_whole_or_cut_by_group_and_reports_its_shortfall():
    v = _unit([1, 0], [0.9, 0.1], [0.5, 0.5], [0, 1])
    block = _embedded(
        [
            ("question", "g1", "q1", "", False, 2, v[0]),
            ("answer", "g1", "q1", "a1", True, 0, v[1]),
            ("answer", "g1", "q2", "a2", True, 0, v[2]),
            ("answer", "g1", "q3", "a3", False, 0, v[3]),
            ("question", "g2", "q4", "", False, 3, v[3]),
            ("answer", "g2", "q4", "a4", True, 0, v[3]),
            ("answer", "g2", "q5", "a5", True, 0, v[0]),
            ("question", "", "q6", "", False, 1, v[0]),  # no group to draw from
        ]
    )
    miner = ModelMiner(MinerSpec())  # the rows come embedded: nothing is loaded
    whole, summary = mine_block(block, miner)
    assert whole.schema == NEGATIVES
    drawn = whole.filter(pa.compute.equal(whole["short"], 0)).to_pylist()
    assert [(r["qid"], r["aid"]) for r in drawn] == [("q1", "a2"), ("q1", "a3"), ("q4", "a5")]
    assert all(r["question"] == "" and r["answer"] == f"text of {r['aid']}" for r in drawn)
    short = {r["qid"]: r["short"] for r in whole.to_pylist() if r["short"]}
    assert short == {"q4": 2, "q6": 1}
    assert summary["rows"] == 3 and summary["short"] == 3 and summary["questions"] == 2
    cut = [mine_block(block.filter(pa.compute.equal(block["group"], g)), miner)[0] for g in ("g2", "", "g1")]
    assert sorted(pa.concat_tables(cut).to_pylist(), key=str) == sorted(whole.to_pylist(), key=str)


def test_quantiles_merged_from_sketches_are_exact_when_small_and_close_when_not():
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=n) for n in (7, 300, 40)]
    merged = merged_quantiles([sketch(p) for p in parts])
    everything = np.concatenate(parts)
    assert merged["count"] == len(everything)
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert merged[f"p{round(q * 100)}"] == pytest.approx(np.quantile(everything, q), abs=1e-4)
    big = [rng.normal(size=20_000), rng.normal(loc=1.0, size=5_000)]
    merged = merged_quantiles([sketch(p) for p in big])
    everything = np.concatenate(big)
    for q in (0.1, 0.5, 0.9):
        assert merged[f"p{round(q * 100)}"] == pytest.approx(np.quantile(everything, q), abs=0.02)
    assert merged_quantiles([sketch([])]) == {"count": 0}


def test_a_question_wants_what_its_positives_would_ask_the_random_sampler_for():
    """mining_candidates on thread rows: the answers of every pool status, positives marked; each kept question
    in its group, wanting the sum of its positives' random-sampler counts."""
    from pipelines.stackexchangeqa.funnel import mining_candidates

    threads = pa.table(
        {
            "status": [
                "question",
                "positive",
                "positive",
                "answer_below_min_score",
                "question",
                "positive",
                "question_not_english",
            ],
            "qid": ["s:1", "s:1", "s:1", "s:1", "s:2", "s:2", "s:3"],
            "aid": ["", "s:11", "s:12", "s:13", "", "s:21", ""],
            "question": ["one?", "one?", "one?", "one?", "two?", "two?", "drei?"],
            "answer": ["", "a", "b", "c", "", "d", ""],
            "score": [5, 4, 2, 0, 1, 3, 0],
            "site": ["s"] * 7,
            "split": ["train"] * 7,
            "tags": [["x", "y"]] * 4 + [["y"]] * 2 + [[]],
        }
    )
    sizes = {"train|s": 4, "train|s|x": 3, "train|s|y": 4}
    rows = mining_candidates(threads, k=2.5, seed=7, mode="site", sizes_ref=[sizes])
    answers = rows.filter(pa.compute.equal(rows["kind"], "answer")).to_pylist()
    assert [(r["aid"], r["qid"], r["positive"]) for r in answers] == [
        ("s:11", "s:1", True),
        ("s:12", "s:1", True),
        ("s:13", "s:1", False),
        ("s:21", "s:2", True),
    ]
    questions = {r["qid"]: r for r in rows.to_pylist() if r["kind"] == "question"}
    assert set(questions) == {"s:1", "s:2"}
    assert questions["s:1"]["wanted"] == negatives_wanted(2.5, 7, "s:11") + negatives_wanted(2.5, 7, "s:12")
    assert questions["s:2"]["wanted"] == negatives_wanted(2.5, 7, "s:21")
    assert questions["s:1"]["group"] == "train|s" and questions["s:1"]["text"] == "one?"
    tagged = mining_candidates(threads, k=2.5, seed=7, mode="tag", sizes_ref=[sizes])
    groups = {r["qid"]: r["group"] for r in tagged.to_pylist() if r["kind"] == "question"}
    assert groups["s:1"] in ("train|s|x", "train|s|y") and groups["s:2"] == "train|s|y"
    assert sum(r["kind"] == "answer" for r in tagged.to_pylist()) == 3 * 2 + 1  # an answer row per tag


def test_an_output_that_holds_the_miner_is_refused(tmp_path):
    from pipelines.atomic import check_output
    from pipelines.stackexchangeqa import JOB, BuildConfig, earlier_build
    from runtime.checks import UsageError

    run = tmp_path / "out" / "runs" / "pretrain"
    run.mkdir(parents=True)
    cfg = BuildConfig(dumps=["Posts.xml"], output=str(tmp_path / "out"), hard_negatives=str(run))
    with pytest.raises(UsageError, match="holds the input"):
        check_output(cfg.output, JOB, cfg.input_paths(), earlier_build)
    with pytest.raises(UsageError, match="--mine-max-similarity must be in"):
        BuildConfig(dumps=["x"], hard_negatives="minilm", mine_max_similarity=1.5)


def test_a_build_is_given_its_miner_exactly_where_its_configuration_names_one(tmp_path):
    """write() with --hard-negatives set and no miner (or a miner and none set) is refused before anything is
    made: mined negatives never fall back to random ones."""
    from pipelines.stackexchangeqa import BuildConfig, write

    mined = BuildConfig(dumps=["Posts.xml"], output=str(tmp_path / "mined"), hard_negatives="minilm")
    with pytest.raises(ValueError, match="hard_negatives is 'minilm' but the miner given is None"):
        write(mined)
    with pytest.raises(ValueError, match="hard_negatives is None but the miner given is ModelMiner"):
        write(BuildConfig(dumps=["Posts.xml"], output=str(tmp_path / "random")), miner_of(mined))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_build_with_mined_negatives_keeps_the_builds_invariants(beer_dump, ray_local, tmp_path):
    """The beer dump built with negatives mined by the shipped MiniLM: no question gets one of its own answers of
    any score, each gets as many negatives as the random build gives it, the mined ones score above a random
    candidate, and the card says how they were drawn."""
    from crawl.dump import iter_posts
    from pipelines.schemas import QA_PAIRS, read_table
    from pipelines.stackexchangeqa import BuildConfig, write

    common = {"dumps": [beer_dump], "negatives": 2, "seed": 5, "dedup": "exact"}
    mined_cfg = BuildConfig(output=str(tmp_path / "mined"), hard_negatives="minilm", mine_max_len=64, **common)
    mined_stats = write(mined_cfg, miner_of(mined_cfg))
    random_stats = write(BuildConfig(output=str(tmp_path / "random"), **common))
    parent = {f"beer.stackexchange.com:{p['id']}": p["parent_id"] for p in iter_posts(beer_dump) if p["post_type"] == 2}
    for split in ("train", "dev", "test"):
        mined = read_table(str(tmp_path / "mined" / split), QA_PAIRS).to_pylist()
        sampled = read_table(str(tmp_path / "random" / split), QA_PAIRS).to_pylist()
        assert [r for r in mined if r["label"] == 1] == [r for r in sampled if r["label"] == 1]
        for r in mined:
            own = f"beer.stackexchange.com:{parent[r['aid']]}" == r["qid"]
            assert own == (r["label"] == 1), r
        pairs = [(r["qid"], r["aid"]) for r in mined]
        assert len(pairs) == len(set(pairs))

        def per_question(rows):
            counts: dict[str, int] = {}
            for r in rows:
                counts[r["qid"]] = counts.get(r["qid"], 0) + (r["label"] == 0)
            return counts

        assert per_question(mined) == per_question(sampled)
    assert mined_stats["pairs"] == random_stats["pairs"]
    negatives = mined_stats["negatives"]
    assert negatives["drawn"] == "mined" and random_stats["negatives"]["drawn"] == "random"
    scores = negatives["scores"]
    assert scores["negative"]["count"] == mined_stats["pairs"]["negative"]
    assert scores["negative"]["mean"] > scores["candidate_mean"]["mean"] + 0.1
    card = json.loads((tmp_path / "mined" / "data_card.json").read_text())
    assert card["negatives"]["drawn"] == "mined" and "mined by a model" in card["recipe"]
    assert "Mined by a model" in (tmp_path / "mined" / "DATA_CARD.md").read_text()
    assert not [f for f in os.listdir(tmp_path) if ".partial-" in f]
