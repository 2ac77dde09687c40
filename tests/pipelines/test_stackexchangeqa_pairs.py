"""Pairs in seeded order and their split slices (pipelines/stackexchangeqa/pairs.py)."""

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.schemas import QA_PAIRS, conform
from pipelines.stackexchangeqa.pairs import questions_in_seeded_order, split_pairs
from pipelines.stackexchangeqa.threads import split_of


def _pairs_block(questions: int = 60, seed: int = 3) -> pa.Table:
    """Whole questions' pairs in union order (positives, then negatives without the question's text), each
    question in a split drawn as the build draws it."""

    rng = random.Random(seed)
    positives, negatives, question_rows = [], [], []
    for q in range(questions):
        qid, split = f"beer:{q}", split_of("beer", q, 0.2, 0.2)
        question_rows.append((qid, f"question {q}", "", -1, split))  # the only row with the question's text
        for a in range(rng.randint(1, 3)):
            positives.append((qid, "", f"beer:{q}-{a}", 1, split))
        for a in range(rng.randint(0, 3)):
            negatives.append((qid, "", f"beer:n{rng.randint(0, 999)}-{q}-{a}", 0, split))
    rows = positives + negatives + question_rows
    n = len(rows)
    return pa.table(
        {
            "qid": [r[0] for r in rows],
            "question": [r[1] for r in rows],
            "aid": [r[2] for r in rows],
            "answer": [f"answer {r[2]}" for r in rows],
            "label": pa.array([r[3] for r in rows], pa.int8()),
            "score": pa.array([2] * n, pa.int64()),
            "accepted": [False] * n,
            "site": ["beer"] * n,
            "split": [r[4] for r in rows],
        }
    )


def test_a_split_of_seeded_order_is_that_splits_rows_in_their_own_seeded_order():
    """The shards take each split as a slice of the block: the same rows, in the same order, as the filter of
    each split ordered alone (the order before splits were put together)."""

    block = _pairs_block()
    ordered = questions_in_seeded_order(block, seed=7)
    assert set(ordered["split"].to_pylist()) == {"train", "dev", "test"}
    for split in ("train", "dev", "test"):
        alone = questions_in_seeded_order(block.filter(pc.equal(block["split"], split)), seed=7)
        sliced = split_pairs(ordered, split)
        assert sliced.schema == QA_PAIRS
        assert sliced.equals(conform(alone.drop_columns(["split"]), QA_PAIRS, "expected")), split
        assert sliced["question"].to_pylist() == [f"question {qid.split(':')[1]}" for qid in sliced["qid"].to_pylist()]
        assert -1 not in sliced["label"].to_pylist()  # the question rows are left out
    assert split_pairs(ordered.filter(pc.not_equal(ordered["split"], "dev")), "dev").num_rows == 0
    without = block.filter(pc.invert(pc.and_(pc.equal(block["qid"], "beer:3"), pc.equal(block["label"], -1))))
    with pytest.raises(ValueError, match="pairs of question beer:3 arrived without their question's row"):
        questions_in_seeded_order(without, seed=7)


def test_split_pairs_refuses_a_block_whose_split_is_not_contiguous():
    block = _pairs_block().slice(0, 6)
    mixed = pa.concat_tables(
        [
            block.slice(0, 3).set_column(8, "split", pa.array(["train"] * 3)),
            block.slice(3, 1).set_column(8, "split", pa.array(["dev"])),
            block.slice(4, 2).set_column(8, "split", pa.array(["train"] * 2)),
        ]
    )
    with pytest.raises(ValueError, match="train rows of a block of pairs are not contiguous"):
        split_pairs(mixed, "train")
